"""The seams of hybridmem: each backend is a small Protocol, so tests swap real backends, never mocks.

Only :mod:`hybridmem.memory` knows every seam. Stores only store: extraction, dedup, contradiction
handling and ranking live above them.
"""

from __future__ import annotations

import builtins

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from hybridmem.models import Extraction, MetadataValue, Usage

__all__ = [
    "ChatMessage",
    "ChatModel",
    "ChatResult",
    "Embedder",
    "Extractor",
    "GraphStore",
    "LexicalIndex",
    "StoredRecord",
    "TokenCounter",
    "VectorHit",
    "VectorStore",
]

ChatMessage = Mapping[str, str]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised vectors. ``name`` and ``dimension`` are stored per collection."""

    name: str
    dimension: int

    def embed_batch(self, texts: Sequence[str]) -> builtins.list[builtins.list[float]]:
        """One vector per text, in order."""
        ...


@runtime_checkable
class Extractor(Protocol):
    """Finds entities and relations in a text. Never touches storage."""

    name: str

    def extract(self, text: str, *, speaker: str | None = None) -> Extraction:
        """Entities and relations of ``text``; ``speaker`` is the subject of first-person statements."""
        ...


@dataclass(frozen=True)
class ChatResult:
    """One chat completion: the text and the token usage the endpoint reported."""

    text: str
    usage: Usage = field(default_factory=Usage)
    model: str = ""


@runtime_checkable
class ChatModel(Protocol):
    """An OpenAI-compatible chat endpoint (or anything that behaves like one)."""

    model: str

    def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        json_schema: Mapping[str, Any] | None = None,
        schema_name: str = "result",
    ) -> ChatResult:
        """One completion; with ``json_schema`` the reply text is JSON that should match it."""
        ...

    def stream(self, messages: Sequence[ChatMessage]) -> Iterator[str]:
        """The reply as text deltas."""
        ...


@runtime_checkable
class TokenCounter(Protocol):
    """Exact token counting for one encoding."""

    encoding: str

    def count(self, text: str) -> int:
        """Number of tokens of ``text``."""
        ...

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of ``text`` that has at most ``max_tokens`` tokens."""
        ...


@dataclass(frozen=True)
class StoredRecord:
    """A memory as a vector store holds it: id, document and flat metadata."""

    id: str
    text: str
    metadata: dict[str, MetadataValue]


@dataclass(frozen=True)
class VectorHit:
    """A vector store result: the record and its cosine similarity to the query."""

    record: StoredRecord
    similarity: float


class VectorStore(Protocol):
    """One collection per user holding our own embeddings (never the store's)."""

    def upsert(
        self,
        user_id: str,
        ids: Sequence[str],
        texts: Sequence[str],
        embeddings: Sequence[Sequence[float]],
        metadatas: Sequence[dict[str, MetadataValue]],
    ) -> None: ...

    def update_metadata(
        self, user_id: str, ids: Sequence[str], metadatas: Sequence[dict[str, MetadataValue]]
    ) -> None: ...

    def get(
        self, user_id: str, ids: Sequence[str], *, where: Mapping[str, Any] | None = None
    ) -> builtins.list[StoredRecord]: ...

    def list(
        self,
        user_id: str,
        *,
        where: Mapping[str, Any] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> builtins.list[StoredRecord]: ...

    def query(
        self,
        user_id: str,
        embedding: Sequence[float],
        *,
        limit: int,
        where: Mapping[str, Any] | None = None,
    ) -> builtins.list[VectorHit]: ...

    def query_batch(
        self,
        user_id: str,
        embeddings: Sequence[Sequence[float]],
        *,
        limit: int,
        where: Mapping[str, Any] | None = None,
    ) -> builtins.list[builtins.list[VectorHit]]: ...

    def get_embeddings(self, user_id: str, ids: Sequence[str]) -> dict[str, builtins.list[float]]: ...

    def delete(self, user_id: str, ids: Sequence[str]) -> None: ...

    def drop_user(self, user_id: str) -> None: ...

    def count(self, user_id: str) -> int: ...

    def close(self) -> None: ...


class LexicalIndex(Protocol):
    """A persistent per-user full-text index ranked by BM25."""

    def add(self, user_id: str, ids: Sequence[str], texts: Sequence[str]) -> None: ...

    def delete(self, user_id: str, ids: Sequence[str]) -> None: ...

    def search(self, user_id: str, query: str, *, limit: int) -> builtins.list[tuple[str, float]]:
        """(memory id, bm25 score) pairs, best first; higher scores are better."""
        ...

    def drop_user(self, user_id: str) -> None: ...

    def close(self) -> None: ...


class GraphStore(Protocol):
    """One directed entity graph per user; edges remember the memory ids that support them."""

    def add_extraction(self, user_id: str, memory_id: str, extraction: Extraction) -> None: ...

    def add_extractions(self, user_id: str, items: Sequence[tuple[str, Extraction]]) -> None: ...

    def remove_memory(self, user_id: str, memory_ids: Sequence[str]) -> None: ...

    def entities_in(self, user_id: str, text: str) -> builtins.list[str]:
        """Canonical keys of known entities mentioned in ``text`` (names and aliases)."""
        ...

    def neighbourhood(
        self, user_id: str, entities: Sequence[str], *, hops: int
    ) -> dict[str, tuple[int, str]]:
        """memory id -> (hops from the nearest seed entity, a readable path) within ``hops``."""
        ...

    def entities_of(self, user_id: str, memory_ids: Sequence[str]) -> builtins.list[str]:
        """Canonical keys of the entities that the given memories mention."""
        ...

    def relations(self, user_id: str, memory_ids: Sequence[str] | None = None) -> builtins.list[dict[str, Any]]:
        """Edges as dicts (subject, predicate, object, memory_ids), optionally only those supported
        by the given memories."""
        ...

    def query_path(self, user_id: str, a: str, b: str, *, max_depth: int = 3) -> builtins.list[str]:
        """A readable shortest path between two entities (names or aliases), [] when none."""
        ...

    def export(self, user_id: str) -> dict[str, Any]: ...

    def drop_user(self, user_id: str) -> None: ...

    def close(self) -> None: ...
