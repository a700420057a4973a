"""The seams of hybridmem: each backend is a small Protocol, so tests swap real backends, never mocks.

:mod:`hybridmem.stores` opens the default backends; the write path (:mod:`hybridmem.write.writer`) and
retrieval (:mod:`hybridmem.read.retrieval`) use them only through these Protocols. Stores only store:
extraction, dedup, contradiction handling and ranking live above them. Optional abilities are
declared as their own Protocols (:class:`BatchExtractor`), never probed with ``hasattr``.
"""

from __future__ import annotations

import builtins

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from hybridmem.filters import Filter
from hybridmem.models import (
    Extraction,
    GraphEntity,
    GraphPath,
    GraphRelation,
    HistoryEvent,
    MemoryItem,
    Usage,
)

if TYPE_CHECKING:
    import networkx as nx

__all__ = [
    "ChatMessage",
    "ChatModel",
    "ChatResult",
    "Closeable",
    "Embedder",
    "Extractor",
    "BatchExtractor",
    "GraphStore",
    "HistoryLog",
    "Lease",
    "Leases",
    "NameSnapshot",
    "NameSnapshots",
    "LexicalIndex",
    "Pingable",
    "Preloading",
    "RecordSnapshot",
    "RecordSnapshots",
    "Reembeddable",
    "Refreshable",
    "Reporting",
    "Settling",
    "StoreReport",
    "TokenCounter",
    "FIELDS_NOTE",
    "GRAPH_NOTE",
    "SNAPSHOT_AGE",
    "VectorHit",
    "VectorStore",
    "WriteLog",
    "WriteSlot",
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
    #: True when :meth:`extract` calls no model: free, deterministic, never fails on an endpoint.
    #: The writer then runs it even with ``infer=False`` and never re-extracts what it found.
    offline: bool

    def extract(self, text: str, *, speaker: str | None = None) -> Extraction:
        """Entities and relations of ``text``; ``speaker`` is the subject of first-person statements."""
        ...


@runtime_checkable
class BatchExtractor(Extractor, Protocol):
    """An extractor that can do many texts in one call (an LLM: one request instead of many)."""

    def extract_batch(
        self, texts: Sequence[str], speakers: Sequence[str | None] | None = None
    ) -> builtins.list[Extraction]:
        """One extraction per text, in order."""
        ...


@dataclass(frozen=True)
class ChatResult:
    """One chat completion: the text and the token usage the endpoint reported."""

    text: str
    usage: Usage = field(default_factory=Usage)
    model: str = ""


@runtime_checkable
class Closeable(Protocol):
    """Something that holds a resource (a connection pool, a file) until closed."""

    def close(self) -> None: ...


@runtime_checkable
class ChatModel(Protocol):
    """An OpenAI-compatible chat endpoint (or anything that behaves like one).

    ``last_usage`` is the usage of the last finished :meth:`stream` (zeros when the endpoint
    reported none)."""

    model: str
    last_usage: Usage

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
class VectorHit:
    """A vector store result: the memory and its cosine similarity to the query."""

    item: MemoryItem
    similarity: float


class VectorStore(Protocol):
    """One collection per user holding our own embeddings (never the store's).

    It takes and returns :class:`MemoryItem` values and :data:`~hybridmem.filters.Filter` trees;
    how they are laid out in the backend is the backend's business."""

    def upsert(
        self, user_id: str, items: Sequence[MemoryItem], embeddings: Sequence[Sequence[float]]
    ) -> None:
        """Insert or replace memories with their vectors."""
        ...

    def update(self, user_id: str, items: Sequence[MemoryItem]) -> None:
        """Replace the fields of existing memories whose text did not change (vectors stay)."""
        ...

    def get(
        self, user_id: str, ids: Sequence[str], *, where: Filter | None = None
    ) -> builtins.list[MemoryItem]:
        """Memories by id, in the order of ``ids``; missing ids and non-matching ones skipped."""
        ...

    def get_sections(
        self, user_id: str, ids: Sequence[str], wheres: Sequence[Filter | None]
    ) -> builtins.list[builtins.list[MemoryItem]]:
        """For each filter, the memories of ``ids`` that match it (in the order of ``ids``), in
        one read of the store."""
        ...

    def list(
        self,
        user_id: str,
        *,
        where: Filter | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> builtins.list[MemoryItem]:
        """Memories matching ``where`` (all when None), in storage order."""
        ...

    def query(
        self,
        user_id: str,
        embeddings: Sequence[Sequence[float]],
        *,
        limit: int,
        where: Filter | None = None,
    ) -> builtins.list[builtins.list[VectorHit]]:
        """One nearest-neighbour list (best first) per query embedding."""
        ...

    def query_sections(
        self,
        user_id: str,
        embedding: Sequence[float],
        sections: Sequence[tuple[int, Filter | None]],
    ) -> builtins.list[builtins.list[VectorHit]]:
        """For one query embedding, the nearest-neighbour list of each ``(limit, where)``
        section, equal to :meth:`query`'s for that section, in one nearest-neighbour search
        where the store can (context() reads several sections for one question)."""
        ...

    def delete(self, user_id: str, ids: Sequence[str]) -> None:
        """Delete memories by id (unknown ids are ignored)."""
        ...

    def drop_user(self, user_id: str) -> None:
        """Delete everything of the user."""
        ...

    def count(self, user_id: str) -> int:
        """How many memories the user has."""
        ...

    def users(self) -> builtins.list[str]:
        """Every user with memories in this store, sorted (backups and re-embedding walk them)."""
        ...

    def purge(self) -> None:
        """Make deletions and replaced texts physical now in files this process owns (a no-op
        where the backend manages its own files, such as a Chroma server)."""
        ...

    def request_purge(self) -> None:
        """Make a replaced text physical within the store's purge delay (``delete`` and
        ``drop_user`` ask for their own purge); a store may purge at once."""
        ...

    @property
    def purge_pending(self) -> bool:
        """Whether an erasure awaits its purge."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Refreshable(Protocol):
    """A store that caches a shared server's records and can catch up with other processes'
    writes on demand (Chroma server mode)."""

    def refresh(self, user_id: str) -> None:
        """Catch up with the user's records in the server now."""
        ...


@runtime_checkable
class Settling(Protocol):
    """A store whose state in a shared server is brought up to date once per lease: after the
    lease's last write, before its release (Chroma server mode: the lexical cache's text
    snapshot, stored once per batch rather than once per write of it)."""

    def settle(self, user_id: str) -> None:
        """The user's lease ends: store what is owed (a failure is logged, never raised: what
        it owes saves work only)."""
        ...


@runtime_checkable
class Preloading(Protocol):
    """A store that loads a user's state at its first read, and can start that load ahead of
    the read (Chroma server mode: the lexical cache, from the user's text snapshot)."""

    def preload(self, user_id: str) -> None:
        """Load the user's state now unless it is loaded (a failure is left to the next read,
        which loads it again and raises)."""
        ...


@runtime_checkable
class Pingable(Protocol):
    """A store that can say whether it serves (a service's readiness probe asks it)."""

    def ping(self) -> None:
        """Return when the store can serve; raise :class:`~hybridmem.errors.ClosedError` when it
        is closed, :class:`~hybridmem.errors.StorageError` when it cannot be reached or written.
        Reads and writes no user's data, creates nothing."""
        ...


@dataclass(frozen=True)
class StoreReport:
    """What a store keeps open, for a service's metrics: users whose state (handles, files,
    records) it holds now, and how its in-memory record copy answered reads (None: no copy)."""

    open_users: int
    cache_hits: int | None = None
    cache_misses: int | None = None


@runtime_checkable
class Reporting(Protocol):
    """A store that reports what it keeps open (see :class:`StoreReport`)."""

    def report(self) -> StoreReport:
        """Counts only: never a user id or any stored text."""
        ...


@runtime_checkable
class Reembeddable(Protocol):
    """A vector store that can move a user's memories to another embedder in place."""

    def reembed_user(
        self,
        user_id: str,
        *,
        embedder: str,
        dimension: int,
        embed: Callable[[Sequence[str]], builtins.list[builtins.list[float]]],
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Re-embed the user's memories with ``embed`` and record ``embedder``/``dimension`` as
        the collection's identity; resumable after a crash. Returns the memories embedded."""
        ...


class LexicalIndex(Protocol):
    """A persistent per-user full-text index ranked by BM25."""

    def add(self, user_id: str, ids: Sequence[str], texts: Sequence[str]) -> None: ...

    def delete(self, user_id: str, ids: Sequence[str]) -> None: ...

    def search(self, user_id: str, query: str, *, limit: int) -> builtins.list[tuple[str, float]]:
        """(memory id, bm25 score) pairs, best first; higher scores are better."""
        ...

    def refresh(self, user_id: str) -> None:
        """Catch up with other processes' writes now (a no-op where there is nothing to catch
        up with: an index this process owns)."""
        ...

    def drop_user(self, user_id: str) -> None: ...

    def close(self) -> None: ...


class GraphStore(Protocol):
    """One directed entity graph per user; edges remember the memory ids that support them."""

    def add_extractions(
        self, user_id: str, items: Sequence[tuple[str, Extraction]], *,
        links: bool | Sequence[tuple[str, str]] = True,
    ) -> None:
        """Add memories' entities and relations (re-adding a memory is idempotent). ``links``:
        the episodic links the add declares — True: the items are one conversation, linked in
        order; False: none (re-extraction); or (before, after) pairs."""
        ...

    def remove_memory(
        self, user_id: str, memory_ids: Sequence[str], *, erase: bool = False
    ) -> None:
        """Drop memories from provenance; edges and nodes nothing supports any more go.
        ``erase``: the memories were deleted (not superseded), so nothing they said may stay in
        any file the store writes."""
        ...

    def entities_in(self, user_id: str, text: str) -> builtins.list[str]:
        """Canonical keys of known entities mentioned in ``text`` (names and aliases)."""
        ...

    def neighbourhood(
        self, user_id: str, entities: Sequence[str], *, hops: int
    ) -> dict[str, tuple[int, str]]:
        """memory id -> (hops from the nearest seed entity, a readable path) within ``hops``."""
        ...

    def activation(
        self, user_id: str, seeds: Sequence[tuple[str, float]], query: str, *, hops: int = 1,
        episodic: float = 0.5, topic: float = 0.45,
        similar: Callable[[Sequence[str], Sequence[str]], Sequence[float]] | None = None,
        linked: Sequence[tuple[str, float]] = (),
    ) -> dict[str, tuple[float, int, str]]:
        """memory id -> (graph signal, hops, readable path): activation spread from seed memories
        (id, mass) and the entities ``query`` names (see :mod:`hybridmem.graph.activation`);
        ``similar`` maps nodes (keys, names) to their cosine with the query, for the topic signal of
        weight ``topic`` (a store may ignore both)."""
        ...

    def entities_of(self, user_id: str, memory_ids: Sequence[str]) -> builtins.list[str]:
        """Canonical keys of the entities that the given memories mention."""
        ...

    def entity(self, user_id: str, name: str) -> GraphEntity | None:
        """The node a name or alias refers to, or None."""
        ...

    def entities(self, user_id: str) -> builtins.list[GraphEntity]:
        """Every node of the user's graph, by key."""
        ...

    def relations(
        self, user_id: str, memory_ids: Sequence[str] | None = None
    ) -> builtins.list[GraphRelation]:
        """One relation per (edge, predicate), optionally only those the given memories support."""
        ...

    def query_path(self, user_id: str, a: str, b: str, *, max_depth: int = 3) -> builtins.list[str]:
        """A readable shortest path between two entities (names or aliases), [] when none."""
        ...

    def query_paths(self, user_id: str, a: str, b: str, *, k: int,
                    max_depth: int = 3) -> builtins.list[GraphPath]:
        """At most ``k`` shortest simple paths between two entities (names or aliases),
        shortest first, each with its hops' predicates; [] when none."""
        ...

    def graph(
        self, user_id: str, memory_ids: Sequence[str] | None = None
    ) -> nx.DiGraph[str]:
        """A copy of the user's graph (changing it changes nothing stored); with ``memory_ids``,
        only what those memories support."""
        ...

    def export(self, user_id: str) -> dict[str, Any]:
        """The user's graph as JSON-safe data that :meth:`import_graph` loads back."""
        ...

    def import_graph(self, user_id: str, data: Mapping[str, Any]) -> None:
        """Replace the user's graph with an :meth:`export`; InvalidInputError when malformed."""
        ...

    def refresh(self, user_id: str) -> None:
        """Catch up with other processes' writes now (see :meth:`LexicalIndex.refresh`)."""
        ...

    def drop_user(self, user_id: str) -> None: ...

    def close(self) -> None: ...


class HistoryLog(Protocol):
    """The per-user audit log of changes to memories."""

    def record(self, user_id: str, events: Sequence[HistoryEvent]) -> None:
        """Append events (an event id already present is ignored)."""
        ...

    def list(self, user_id: str, memory_id: str | None = None) -> builtins.list[HistoryEvent]:
        """Events oldest first, all of the user's or one memory's."""
        ...

    def scrub(self, user_id: str, memory_ids: Sequence[str]) -> None:
        """Remove the texts that events of deleted memories carried."""
        ...

    def drop_user(self, user_id: str) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class WriteSlot:
    """One taking of a user's write lease, as a reader of the lease sees it: who took it,
    whether it is still held, and whether the taker was this process's lease store."""

    owner: str
    held: bool
    mine: bool


#: How a graph record's id starts in a lease's note (memory ids, which notes list bare, are hex).
GRAPH_NOTE = "g:"
#: How a lease's note marks a memory whose fields only it changed (:meth:`VectorStore.update`:
#: access counts, supersession, importance), never its text. The memory's bare id is listed
#: too, so a reader that follows records refreshes it as before; one that follows texts (the
#: lexical cache) skips it: a process that answered 90 contexts notes ~2,000 access counts as
#: it closes, which every other process's lexical check compared again, text hash by text hash.
#: The mark starts with a control character, which no memory id may hold; a reader of an
#: earlier release takes it for an id it does not find.
FIELDS_NOTE = "\x1ff:"
#: Leases after which a snapshot is stored again at the next lease end, even if little was
#: written since (server mode: record, graph and text snapshots). A snapshot names the lease it
#: was written under, and a first look from it reads the notes of the lease slots after that
#: one: once that slot is tidied away the look must compare every record instead. Leases that
#: write no text or graph (access counts, field updates) never make a new snapshot due by
#: themselves, so without this a busy user's snapshots would all fall out of the slots. The
#: write log keeps at least twice this many slots (see :mod:`hybridmem.replica.lease`).
SNAPSHOT_AGE = 16


class WriteLog(Protocol):
    """Which of a user's memories other processes changed: what a process's copy of the user's
    records needs to stay exact on a shared Chroma server (see
    :mod:`hybridmem.chroma.follow`). Every write runs under the user's lease, and each lease's
    release says which memory ids its holder wrote."""

    def slots(self, user_id: str, *, fresh: bool = False) -> dict[int, WriteSlot] | None:
        """The user's lease slots by number (one small read, which other checks falling due
        at the same moment may share unless ``fresh``), or None when the user has no lease
        (never written, or erased)."""

    def changed(self, user_id: str, slots: Sequence[int]) -> dict[int, frozenset[str] | None]:
        """The memory ids each released slot's holder wrote; None for a slot that does not say
        (a holder that wrote too many to list, or a slot since removed)."""

    def note(self, user_id: str, ids: Sequence[str], *, fields_only: bool = False) -> None:
        """Remember that this process wrote ``ids`` under the user's lease it holds now:
        memory ids, and graph record ids after :data:`GRAPH_NOTE`. ``fields_only``: the write
        changed no text (the release marks those ids with :data:`FIELDS_NOTE` unless the lease
        also wrote them otherwise)."""

    def holding(self, user_id: str) -> tuple[int, str] | None:
        """(slot number, owner token) of the user's lease this process holds now, else None: a
        snapshot written under it names it, so a reader knows which slots' notes came after."""


@dataclass(frozen=True)
class RecordSnapshot:
    """Every record of a user's vector store as one writer's copy held them (id -> (document,
    stored metadata)), and the lease it was taken under: (slot number, owner token, whether
    after the lease's last write), as :func:`hybridmem.chroma.follow.written_since` reads it."""

    rows: Mapping[str, tuple[str, Mapping[str, Any]]]
    at: tuple[int, str, bool] | None


class RecordSnapshots(Protocol):
    """Where a shared Chroma server keeps each user's :class:`RecordSnapshot`, so a process's
    first load of a user's record copy is one read plus what the lease slots noted since,
    instead of every record's metadata assembled by the server (5k memories: ~0.4 s)."""

    def read(self, user_id: str) -> RecordSnapshot | None:
        """The user's current snapshot; None when there is none or it cannot be trusted."""
        ...

    def write(self, user_id: str, snapshot: RecordSnapshot) -> None:
        """Store ``snapshot`` as the user's current one (replacing the previous)."""
        ...

    def drop(self, user_id: str) -> None:
        """Delete the user's snapshot (it held a text that is being deleted or replaced)."""
        ...


@dataclass(frozen=True)
class NameSnapshot:
    """The name vectors of a user's graph nodes as one process held them: per node key, the
    name the vector was made from, in ``keys`` order; ``vectors`` is their unit vectors of
    ``width`` float16 components, row after row, made by embedder ``model``."""

    model: str
    width: int
    keys: list[str]
    names: list[str]
    vectors: bytes


class NameSnapshots(Protocol):
    """Where a shared Chroma server keeps each user's :class:`NameSnapshot`, so a process does
    not embed again, on its own CPU, every node name another process already embedded (5k
    memories: 3,155 names, ~4 s of CPU with the local model)."""

    def read(self, user_id: str) -> NameSnapshot | None:
        """The user's current snapshot; None when there is none or it cannot be trusted."""
        ...

    def write(self, user_id: str, snapshot: NameSnapshot) -> None:
        """Store ``snapshot`` as the user's current one (replacing the previous)."""
        ...

    def drop(self, user_id: str) -> None:
        """Delete the user's snapshot (a node it may hold a vector of is going)."""
        ...


class Lease(Protocol):
    """A user's write lease, held by this process (Chroma server mode)."""

    @property
    def orphan(self) -> str | None:
        """The intent JSON of a batch a dead holder left unfinished, to finish first."""

    @property
    def foreign(self) -> bool:
        """Whether another process held the lease last (its writes may not be in our caches)."""


class Leases(Protocol):
    """Per-user write leases shared by every process of one Chroma server, carrying the
    server-mode journal (see :mod:`hybridmem.replica.lease`)."""

    def acquire(self, user_id: str) -> Lease:
        """Wait for and take the user's lease."""

    def release(self, lease: Any) -> None:  # Any: each implementation takes its own leases
        """Give the lease back (marks its slot free)."""

    def journal(self, lease: Any, intent_json: str) -> None:
        """Write (or with ``""`` clear) the intent of the batch in progress into the lease."""

    def drop_user(self, user_id: str) -> None: ...

    def close(self) -> None: ...
