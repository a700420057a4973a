""":class:`AsyncMemory`: the :class:`~hybridmem.Memory` API for asyncio (and trio) applications.

Every method is the ``Memory`` method of the same name and signature, awaitable. The blocking work
(embedding, Chroma, SQLite, the endpoint) runs in worker threads through ``anyio.to_thread`` with a
:class:`anyio.CapacityLimiter` of ``max_threads`` tokens owned by this instance, so one
``AsyncMemory`` never occupies more than ``max_threads`` threads, whatever else the process runs.

Why anyio and not ``asyncio.to_thread`` plus a semaphore: anyio is already underneath every async
face we serve (Starlette/FastAPI and the MCP SDK), it runs on asyncio and trio alike, and its limiter
is a per-instance bound rather than the event loop's shared default executor. A cancelled call
waits for its thread to finish (``abandon_on_cancel=False``), so a cancelled write is never left
running behind the caller's back while the next one starts.

Concurrency: ``Memory`` is thread-safe and serialises writes per user with its own locks. On top of
that, writes of one user pass an async per-user gate of :data:`USER_WRITE_SLOTS` before taking a
thread, so 50 concurrent adds for one user hold at most two worker threads, not all of them, and
other users' calls keep flowing — while a write whose model call hangs (made outside the user's
lock, see :mod:`hybridmem.write.writer`) does not hold up that user's next write. Reads (search, context,
get, list, ...) are not gated: they run in parallel.
"""

from __future__ import annotations

import builtins
import weakref
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence
from datetime import datetime
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, overload

import anyio
import anyio.to_thread

from hybridmem.config import Settings
from hybridmem.errors import ClosedError, InvalidInputError
from hybridmem.memory import Memory
from hybridmem.models import (
    AddRequest,
    ChatReply,
    Context,
    Entity,
    GraphEntity,
    GraphPath,
    GraphRelation,
    HistoryEvent,
    Hit,
    MemoryItem,
    MemoryStatus,
    Relation,
    Usage,
    UserStats,
)
from hybridmem.observe import Observer
from hybridmem.protocols import (
    ChatModel,
    Embedder,
    Extractor,
    GraphStore,
    HistoryLog,
    LexicalIndex,
    TokenCounter,
    VectorStore,
)

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["AsyncMemory"]

T = TypeVar("T")
#: Worker threads one AsyncMemory may occupy at once (anyio's own default limiter has 40).
DEFAULT_MAX_THREADS = 8
#: Writes of one user running at once (in threads); the rest wait in the event loop.
USER_WRITE_SLOTS = 2
_DONE = object()


class AsyncMemory:
    """Long-term memory for async apps: the :class:`~hybridmem.Memory` API, awaitable.

    ``AsyncMemory(settings, **seams)`` builds and owns a ``Memory`` from the same arguments (and
    closes it in :meth:`aclose`); ``AsyncMemory.from_memory(mem)`` wraps an existing one, which its
    creator keeps and closes. Construction is synchronous (it opens the stores): build it at startup.
    Use one instance per event loop; any number of tasks may share it.
    """

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
        observer: Observer | None = None,
        max_threads: int = DEFAULT_MAX_THREADS,
    ) -> None:
        memory = Memory(
            settings, embedder=embedder, extractor=extractor, chat_model=chat_model,
            vector_store=vector_store, lexical_index=lexical_index, graph_store=graph_store,
            history_log=history_log, token_counter=token_counter, observer=observer,
        )
        try:
            self._setup(memory, owned=True, max_threads=max_threads)
        except BaseException:
            memory.close()
            raise

    @classmethod
    def from_memory(cls, memory: Memory, *, max_threads: int = DEFAULT_MAX_THREADS) -> AsyncMemory:
        """Wrap an existing :class:`Memory`; closing the AsyncMemory leaves ``memory`` open."""
        if not isinstance(memory, Memory):
            raise InvalidInputError(f"from_memory needs a Memory, got {type(memory).__name__}")
        self = cls.__new__(cls)
        self._setup(memory, owned=False, max_threads=max_threads)
        return self

    def _setup(self, memory: Memory, *, owned: bool, max_threads: int) -> None:
        if not isinstance(max_threads, int) or isinstance(max_threads, bool) or max_threads < 1:
            raise InvalidInputError(f"max_threads must be a positive integer, got {max_threads!r}")
        self._memory = memory
        self._owned = owned
        self._limiter = anyio.CapacityLimiter(max_threads)
        self._gates: weakref.WeakValueDictionary[str, anyio.Semaphore] = (
            weakref.WeakValueDictionary())
        self._busy = 0
        self._idle: anyio.Event | None = None
        self._closed = False

    # -- what it is made of ------------------------------------------------------------------------
    @property
    def memory(self) -> Memory:
        """The synchronous :class:`Memory` underneath (for code that runs in its own threads)."""
        return self._memory

    @property
    def settings(self) -> Settings:
        """The settings of the wrapped Memory."""
        return self._memory.settings

    @property
    def embedder(self) -> Embedder:
        """The embedder (its ``name`` and ``dimension`` are stored with every collection)."""
        return self._memory.embedder

    @property
    def extractor(self) -> Extractor | None:
        """The entity extractor (None when ``extractor="none"``)."""
        return self._memory.extractor

    @property
    def tokens(self) -> TokenCounter:
        """The token counter contexts are measured with."""
        return self._memory.tokens

    @property
    def usage(self) -> Usage:
        """Token usage of every model call made so far."""
        return self._memory.usage

    @property
    def chat_model(self) -> ChatModel:
        """The chat endpoint, created on first use (no network until a call)."""
        return self._memory.chat_model

    # -- lifecycle ---------------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Refuse new calls, wait for the calls in flight, then close the Memory if this instance
        created it (writing buffered access counts); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._busy:
            self._idle = anyio.Event()
            await self._idle.wait()
        if self._owned:
            await anyio.to_thread.run_sync(self._memory.close, limiter=self._limiter)

    def close(self) -> None:
        """Synchronous close, for code outside the event loop (e.g. after it ended); it does not
        wait for calls in flight — prefer ``await aclose()`` or ``async with``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owned:
            self._memory.close()

    async def __aenter__(self) -> AsyncMemory:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncMemory({self._memory!r}, max_threads={int(self._limiter.total_tokens)})"

    async def _run(self, call: Callable[[], T]) -> T:
        if self._closed:
            raise ClosedError("this AsyncMemory is closed; create a new one")
        self._busy += 1
        try:
            return await anyio.to_thread.run_sync(call, limiter=self._limiter)
        finally:
            self._busy -= 1
            if not self._busy and self._idle is not None:
                self._idle.set()

    async def _write(self, user_id: str, call: Callable[[], T]) -> T:
        # The gate is keyed by the raw id: Memory validates it (in the thread) and refuses bad ones.
        gate = self._gates.get(user_id) if isinstance(user_id, str) else None
        if gate is None:
            gate = anyio.Semaphore(USER_WRITE_SLOTS)
            if isinstance(user_id, str):
                self._gates[user_id] = gate
        async with gate:
            return await self._run(call)

    # -- writes ------------------------------------------------------------------------------------
    async def add(
        self,
        user_id: str,
        text: str,
        *,
        kind: str = "fact",
        category: str = "general",
        importance: float = 0.5,
        confidence: float = 1.0,
        source: str = "user",
        metadata: Mapping[str, Any] | None = None,
        created_at: datetime | None = None,
        expires_at: datetime | None = None,
        infer: bool = True,
        entities: Sequence[str | Mapping[str, Any] | Entity] | None = None,
        relations: Sequence[Sequence[str] | Mapping[str, Any] | Relation] | None = None,
    ) -> MemoryItem:
        """Store one memory and return it (see :meth:`Memory.add`)."""
        return await self._write(user_id, partial(
            self._memory.add, user_id, text, kind=kind, category=category, importance=importance,
            confidence=confidence, source=source, metadata=metadata, created_at=created_at,
            expires_at=expires_at, infer=infer, entities=entities, relations=relations,
        ))

    async def add_many(
        self,
        user_id: str,
        items: Sequence[str | Mapping[str, Any] | AddRequest],
        *,
        infer: bool = True,
    ) -> builtins.list[MemoryItem]:
        """Store many memories in one batch (see :meth:`Memory.add_many`)."""
        return await self._write(user_id, partial(self._memory.add_many, user_id, items, infer=infer))

    async def add_messages(
        self, user_id: str, messages: Sequence[Mapping[str, str]], *, infer: bool = True
    ) -> builtins.list[MemoryItem]:
        """Store conversation turns (see :meth:`Memory.add_messages`)."""
        return await self._write(
            user_id, partial(self._memory.add_messages, user_id, messages, infer=infer)
        )

    async def summarize(self, user_id: str) -> MemoryItem | None:
        """Store a summary episode of the recent turns (see :meth:`Memory.summarize`)."""
        return await self._write(user_id, partial(self._memory.summarize, user_id))

    async def remember(
        self,
        user_id: str,
        key: str,
        value: str,
        *,
        category: str = "general",
        confidence: float = 1.0,
        importance: float = 0.8,
    ) -> MemoryItem:
        """Upsert a key fact (see :meth:`Memory.remember`)."""
        return await self._write(user_id, partial(
            self._memory.remember, user_id, key, value, category=category, confidence=confidence,
            importance=importance,
        ))

    async def facts(
        self, user_id: str, *, category: str | None = None, as_of: datetime | None = None
    ) -> builtins.list[MemoryItem]:
        """The user's current key facts, by key (see :meth:`Memory.facts`)."""
        return await self._run(partial(self._memory.facts, user_id, category=category,
                                       as_of=as_of))

    async def update(
        self,
        user_id: str,
        memory_id: str,
        *,
        text: str | None = None,
        category: str | None = None,
        importance: float | None = None,
        confidence: float | None = None,
        metadata: Mapping[str, Any] | None = None,
        expires_at: datetime | None = None,
    ) -> MemoryItem:
        """Change a memory (see :meth:`Memory.update`)."""
        return await self._write(user_id, partial(
            self._memory.update, user_id, memory_id, text=text, category=category,
            importance=importance, confidence=confidence, metadata=metadata, expires_at=expires_at,
        ))

    async def forget(self, user_id: str, memory_id: str | None = None) -> int:
        """Delete one memory, or with no id everything of the user (see :meth:`Memory.forget`)."""
        return await self._write(user_id, partial(self._memory.forget, user_id, memory_id))

    async def prune(
        self,
        user_id: str,
        *,
        dry_run: bool = True,
        min_importance: float = 0.1,
        idle_days: float = 120.0,
    ) -> builtins.list[MemoryItem]:
        """Apply the retention policy (see :meth:`Memory.prune`)."""
        return await self._write(user_id, partial(
            self._memory.prune, user_id, dry_run=dry_run, min_importance=min_importance,
            idle_days=idle_days,
        ))

    # -- reads -------------------------------------------------------------------------------------
    async def get(self, user_id: str, memory_id: str) -> MemoryItem:
        """One memory by id (see :meth:`Memory.get`)."""
        return await self._run(partial(self._memory.get, user_id, memory_id))

    async def list(
        self,
        user_id: str,
        *,
        category: str | None = None,
        where: Mapping[str, Any] | None = None,
        limit: int = 100,
        offset: int = 0,
        include_superseded: bool = False,
    ) -> builtins.list[MemoryItem]:
        """The user's memories, oldest first (see :meth:`Memory.list`)."""
        return await self._run(partial(
            self._memory.list, user_id, category=category, where=where, limit=limit, offset=offset,
            include_superseded=include_superseded,
        ))

    async def count(self, user_id: str) -> int:
        """How many memories the user has (see :meth:`Memory.count`)."""
        return await self._run(partial(self._memory.count, user_id))

    async def history(
        self, user_id: str, memory_id: str | None = None
    ) -> builtins.list[HistoryEvent]:
        """What happened to the user's memories (see :meth:`Memory.history`)."""
        return await self._run(partial(self._memory.history, user_id, memory_id))

    async def search(
        self,
        user_id: str,
        query: str,
        *,
        limit: int = 10,
        where: Mapping[str, Any] | None = None,
        category: str | None = None,
        include_superseded: bool = False,
        min_score: float | None = None,
        as_of: datetime | None = None,
    ) -> builtins.list[Hit]:
        """Hybrid search (see :meth:`Memory.search`)."""
        return await self._run(partial(
            self._memory.search, user_id, query, limit=limit, where=where, category=category,
            include_superseded=include_superseded, min_score=min_score, as_of=as_of,
        ))

    async def reextract(self, user_id: str) -> int:
        """Re-extract memories a failing model left marked (see :meth:`Memory.reextract`)."""
        return await self._write(user_id, partial(self._memory.reextract, user_id))

    async def refresh(self, user_id: str) -> None:
        """Catch up with other processes' writes now (see :meth:`Memory.refresh`)."""
        await self._run(partial(self._memory.refresh, user_id))

    async def purge_now(self) -> None:
        """Make every erasure so far physical now (see :meth:`Memory.purge_now`)."""
        await self._run(self._memory.purge_now)

    async def flush_access(self) -> None:
        """Write buffered access counts (see :meth:`Memory.flush_access`)."""
        await self._run(self._memory.flush_access)

    async def context(
        self,
        user_id: str,
        query: str,
        *,
        max_tokens: int | None = None,
        where: Mapping[str, Any] | None = None,
        category: str | None = None,
        limit: int = 30,
        include_superseded: bool = False,
        min_score: float | None = None,
        budgets: Mapping[str, int] | None = None,
        as_of: datetime | None = None,
    ) -> Context:
        """The best memories for ``query`` within ``max_tokens`` (see :meth:`Memory.context`)."""
        return await self._run(partial(
            self._memory.context, user_id, query, max_tokens=max_tokens, where=where,
            category=category, limit=limit, include_superseded=include_superseded,
            min_score=min_score, budgets=budgets, as_of=as_of,
        ))

    # -- the graph ---------------------------------------------------------------------------------
    async def entities(self, user_id: str) -> builtins.list[GraphEntity]:
        """Every entity of the user's graph (see :meth:`Memory.entities`)."""
        return await self._run(partial(self._memory.entities, user_id))

    async def relations(self, user_id: str) -> builtins.list[GraphRelation]:
        """Every relation of the user's graph (see :meth:`Memory.relations`)."""
        return await self._run(partial(self._memory.relations, user_id))

    @overload
    async def query_path(self, user_id: str, a: str, b: str, *, max_depth: int = 3,
                         k: None = None) -> builtins.list[str]: ...
    @overload
    async def query_path(self, user_id: str, a: str, b: str, *, max_depth: int = 3,
                         k: int) -> builtins.list[GraphPath]: ...
    async def query_path(
        self, user_id: str, a: str, b: str, *, max_depth: int = 3, k: int | None = None
    ) -> builtins.list[str] | builtins.list[GraphPath]:
        """How two entities are related; with ``k``, the k shortest paths (see
        :meth:`Memory.query_path`)."""
        if k is None:
            return await self._run(partial(self._memory.query_path, user_id, a, b,
                                           max_depth=max_depth))
        return await self._run(partial(self._memory.query_path, user_id, a, b,
                                       max_depth=max_depth, k=k))

    async def graph(self, user_id: str, *, as_of: datetime | None = None) -> nx.DiGraph[str]:
        """A copy of the user's entity graph (see :meth:`Memory.graph`)."""
        return await self._run(partial(self._memory.graph, user_id, as_of=as_of))

    async def export_graph(
        self, user_id: str, *, format: str = "node-link", as_of: datetime | None = None
    ) -> bytes:
        """The user's entity graph as a file (see :meth:`Memory.export_graph`)."""
        return await self._run(partial(self._memory.export_graph, user_id, format=format,
                                       as_of=as_of))

    async def stats(self, user_id: str) -> UserStats:
        """Counts for one user (see :meth:`Memory.stats`)."""
        return await self._run(partial(self._memory.stats, user_id))

    async def status(self) -> MemoryStatus:
        """Counts of the whole Memory for a service's metrics (see :meth:`Memory.status`)."""
        return await self._run(self._memory.status)

    async def ping(self) -> None:
        """Return when every store can serve, else raise (see :meth:`Memory.ping`)."""
        await self._run(self._memory.ping)

    # -- chat --------------------------------------------------------------------------------------
    async def chat(
        self, user_id: str, message: str, *, max_context_tokens: int | None = None
    ) -> ChatReply:
        """Answer ``message`` with the user's memory as context (see :meth:`Memory.chat`)."""
        return await self._run(partial(
            self._memory.chat, user_id, message, max_context_tokens=max_context_tokens
        ))

    async def chat_stream(
        self, user_id: str, message: str, *, max_context_tokens: int | None = None
    ) -> AsyncIterator[str]:
        """Like :meth:`chat`, yielding the reply as it arrives (see :meth:`Memory.chat_stream`).

        Each chunk is fetched in a worker thread, so a stream holds a thread only while it waits
        for the next chunk; leaving the loop early closes the underlying stream."""
        stream = self._memory.chat_stream(user_id, message, max_context_tokens=max_context_tokens)
        try:
            while True:
                delta = await self._run(partial(_next, stream))
                if delta is _DONE:
                    return
                assert isinstance(delta, str)
                yield delta
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_close, stream, limiter=self._limiter)

    # -- export / import ---------------------------------------------------------------------------
    async def export(self, user_id: str) -> dict[str, Any]:
        """Everything of the user as JSON-ready data (see :meth:`Memory.export`)."""
        return await self._write(user_id, partial(self._memory.export, user_id))

    async def import_(
        self, user_id: str, bundle: Mapping[str, Any], *, overwrite: bool = False
    ) -> int:
        """Load an :meth:`export` bundle into ``user_id`` (see :meth:`Memory.import_`)."""
        return await self._write(
            user_id, partial(self._memory.import_, user_id, bundle, overwrite=overwrite)
        )

    # -- backups and re-embedding ------------------------------------------------------------------
    async def backup(self, dest: str | Path, *, user_id: str | None = None) -> Path:
        """Snapshot every user (or one) into ``dest``, keeping the newest ``backup_keep``
        (see :meth:`Memory.backup`)."""
        return await self._run(partial(self._memory.backup, dest, user_id=user_id))

    async def restore(self, source: str | Path, *, user_id: str | None = None,
                      replace: bool = False) -> int:
        """Bring back the users of a snapshot (see :meth:`Memory.restore`)."""
        return await self._run(partial(self._memory.restore, source, user_id=user_id,
                                       replace=replace))

    async def reembed(self, user_id: str | None = None, *,
                      progress: Callable[[str, int, int], None] | None = None) -> int:
        """Move memories to the configured embedder (see :meth:`Memory.reembed`); ``progress``
        is called from a worker thread."""
        return await self._run(partial(self._memory.reembed, user_id, progress=progress))


def _next(stream: Iterator[str]) -> object:
    return next(stream, _DONE)


def _close(stream: Iterator[str]) -> None:
    if isinstance(stream, Generator):  # Memory.chat_stream is one; closing ends the HTTP stream
        stream.close()
