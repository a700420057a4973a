"""What a :class:`~hybridmem.Memory` is made of, and its lifecycle.

:class:`MemoryBase` builds the seams the settings name (embedder, extractor, token counter,
stores), recovers batches a crash left half-written, and closes what it created. The verbs —
add, search, context, chat, forget — live in :mod:`hybridmem.memory`, on the subclass users see;
the split keeps each file to one concern and within the size the layout test allows.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Sequence
from types import TracebackType
from typing import TypeVar

from hybridmem import backends
from hybridmem.config import Settings
from hybridmem.errors import ClosedError
from hybridmem.models import Usage, validate_user_id
from hybridmem.graph.name_vectors import NamedGraph, NameVectors
from hybridmem.protocols import (
    ChatModel,
    Closeable,
    Embedder,
    Extractor,
    GraphStore,
    HistoryLog,
    LexicalIndex,
    TokenCounter,
    VectorStore,
)
from hybridmem.ops.bundle import recover_imports
from hybridmem.read.retrieval import AccessLog, Extras, Retriever
from hybridmem.write.writer import UsageMeter, Writer

__all__ = ["MemoryBase"]

T = TypeVar("T")
M = TypeVar("M", bound="MemoryBase")


class MemoryBase:
    """The parts of a Memory and their lifecycle (see the module docstring); not used directly."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        embedder: Embedder | None = None,
        extractor: Extractor | None = None,
        chat_model: ChatModel | None = None,
        vector_store: VectorStore | None = None,
        lexical_index: LexicalIndex | None = None,
        graph_store: GraphStore | None = None,
        history_log: HistoryLog | None = None,
        token_counter: TokenCounter | None = None,
    ) -> None:
        self.settings = s = settings if settings is not None else Settings()
        s.data_dir.mkdir(parents=True, exist_ok=True)
        self._owned: builtins.list[Closeable] = []
        self._chat = chat_model
        self._embedder = embedder or self._own(backends.default_embedder(s))
        if extractor is None and backends.wants_llm_extractor(s):
            extractor = backends.default_extractor(s, self.chat_model)
        self._extractor = extractor if extractor is not None else (
            backends.default_extractor(s, None)
        )
        self._rules: Extractor | None = None
        self._counter = token_counter or backends.default_counter(s)
        self._stores = backends.open_stores(
            s, self._embedder, vectors=vector_store, lexical=lexical_index, graph=graph_store,
            history=history_log,
        )
        self._names: NameVectors | None = None
        if s.graph_topic > 0 and s.graph_weight > 0:  # every graph write keeps the name vectors
            self._names = backends.name_vectors(s, self._stores.graph, self._embedder.name,
                                                self._embed)
            graph = NamedGraph(self._stores.graph, self._names)
            self._stores = dataclasses.replace(self._stores, graph=graph)
        self._usage = UsageMeter()
        self._writer = Writer(
            s, self._stores, embed=self._embed, extractor=self._extractor,
            rules=self._rule_extractor, chat=lambda: self.chat_model, usage=self._usage,
            names=self._names,
        )
        self._lock = self._writer.locks  # with a Chroma server: across processes
        self._writer.recover()  # batches a crash left half-written, before anything else
        recover_imports(s.data_dir, self._stores, embed=self._embed)  # and imports
        self._retriever = Retriever(s, self._stores, embed=self._embed, names=self._names)
        self._access = AccessLog(self._stores, self._lock)
        self._extras = Extras(self._stores)
        self._closed = False

    def _own(self, thing: T) -> T:
        if isinstance(thing, Closeable):  # an endpoint client holds a connection pool
            self._owned.append(thing)
        return thing

    # -- what it is made of ------------------------------------------------------------------------
    @property
    def embedder(self) -> Embedder:
        """The embedder (its ``name`` and ``dimension`` are stored with every collection)."""
        return self._embedder

    @property
    def extractor(self) -> Extractor | None:
        """The entity extractor (None when ``extractor="none"``)."""
        return self._extractor

    @property
    def tokens(self) -> TokenCounter:
        """The token counter contexts are measured with."""
        return self._counter

    @property
    def usage(self) -> Usage:
        """Token usage of every model call made so far (extraction, judge, summaries, chat)."""
        return self._usage.total

    @property
    def chat_model(self) -> ChatModel:
        """The chat endpoint, created on first use (offline use never needs one)."""
        if self._chat is None:
            self._chat = self._own(backends.default_chat(self.settings))
        return self._chat

    def _rule_extractor(self) -> Extractor:
        if self._rules is None:
            self._rules = backends.rule_extractor()
        return self._rules

    # -- lifecycle ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Write buffered access counts, close the stores and the clients this Memory created;
        idempotent. A closed Memory refuses use with :class:`ClosedError`."""
        if self._closed:
            return
        try:
            self._retriever.close()
            self._access.close()
        finally:
            self._closed = True
            try:
                self._stores.close()
            finally:
                for thing in self._owned:
                    thing.close()

    def __enter__(self: M) -> M:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = self.settings.chroma_url or str(self.settings.data_dir)
        return f"{type(self).__name__}(store={mode!r}, embedder={self._embedder.name!r})"

    def _check(self, user_id: str) -> str:
        if self._closed:
            raise ClosedError("this Memory is closed; create a new one")
        return validate_user_id(user_id)

    def _embed(self, texts: Sequence[str]) -> builtins.list[builtins.list[float]]:
        return backends.embed_checked(self._embedder, texts)
