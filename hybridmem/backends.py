"""What a :class:`~hybridmem.Memory` opens when it is not handed a backend: the one place that
maps :class:`~hybridmem.Settings` to concrete embedders, extractors, token counters and stores.

Everything is imported lazily, so choosing the hash embedder never loads ONNX, and an offline
Memory never imports the OpenAI client.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from hybridmem.runtime.process import file_limit
from hybridmem.runtime.locks import DataDirLock
from hybridmem.config import Settings
from hybridmem.errors import ConfigError, EmbedderError, HybridMemError
from hybridmem.models import Usage
from hybridmem.observe import NullObserver, Observer
from hybridmem.stores import Stores
from hybridmem.protocols import (
    ChatMessage,
    ChatModel,
    ChatResult,
    Closeable,
    Embedder,
    Extractor,
    GraphStore,
    HistoryLog,
    LexicalIndex,
    NameSnapshots,
    TokenCounter,
    VectorStore,
)

if TYPE_CHECKING:
    from hybridmem.read.access import AccessLog, Extras
    from hybridmem.read.retrieval import Retriever
    from hybridmem.write.plan import UsageMeter
    from hybridmem.write.writer import Writer
    from hybridmem.replica.lease import ChromaLeases
    from hybridmem.graph.name_vectors import NameVectors

__all__ = [
    "ChatSlot",
    "ObservedChat",
    "Parts",
    "assemble",
    "default_chat",
    "default_counter",
    "default_embedder",
    "default_extractor",
    "embed_checked",
    "open_stores",
    "rule_extractor",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


def open_stores(
    settings: Settings,
    embedder: Embedder,
    *,
    vectors: VectorStore | None = None,
    lexical: LexicalIndex | None = None,
    graph: GraphStore | None = None,
    history: HistoryLog | None = None,
) -> Stores:
    """The given stores, and the defaults for the rest: embedded files under ``data_dir``, or
    with ``chroma_url`` the shared server (graph and lexical index then derived from it)."""
    s = settings
    # embedded: this process's directory until closed (DataDirLockedError if another has it)
    dir_lock = None if s.chroma_url else DataDirLock(s.data_dir)
    try:
        return _open(s, embedder, vectors, lexical, graph, history, dir_lock)
    except BaseException:
        if dir_lock is not None:
            dir_lock.release()
        raise


def _open(
    s: Settings,
    embedder: Embedder,
    vectors: VectorStore | None,
    lexical: LexicalIndex | None,
    graph: GraphStore | None,
    history: HistoryLog | None,
    dir_lock: DataDirLock | None,
) -> Stores:
    client: Any = None  # server mode: one Chroma client for the three stores
    handles: Any = None  # and its collection handles, which they share (see there)
    chroma: Any = None  # the vector store opened here (None: the caller's)
    max_open = _max_open(s)
    if vectors is None:
        from hybridmem.chroma.vector import ChromaVectorStore

        chroma = ChromaVectorStore(
            embedder_name=embedder.name,
            dimension=embedder.dimension,
            path=None if s.chroma_url else s.data_dir / "chroma",
            url=s.chroma_url,
            scrub_heap=s.scrub_heap,
            max_open=max_open,
            # reads are served from memory (see hybridmem.chroma.record_cache): embedded, the
            # data-dir lock makes this store the only writer (while no other Memory of this
            # process opened the dir); a server is shared, so there the copy follows the write
            # leases (see below and hybridmem.chroma.follow)
            cache_records=True,
            exclusive=None if dir_lock is None else dir_lock.sole,
            # a torn index is rebuilt from Chroma's records with the configured embedder
            reembed=lambda texts: embed_checked(embedder, texts),
            purge_delay=s.purge_delay,
        )
        vectors, client, handles = chroma, chroma.client, chroma.handles
    if lexical is None:
        if s.chroma_url:  # shared by every process: a cache of the server's documents
            from hybridmem.replica.lexical import ChromaLexicalIndex

            lexical = ChromaLexicalIndex(client=handles, url=None if handles else s.chroma_url)
        else:
            from hybridmem.sqlite.lexical import SqliteLexicalIndex

            lexical = SqliteLexicalIndex(s.data_dir, max_open=max_open)
    if graph is None:
        if s.chroma_url:  # shared by every process: rebuilt from records in the server
            from hybridmem.replica.graph import ChromaGraphStore

            graph = ChromaGraphStore(client=handles, url=None if handles else s.chroma_url,
                                     focus=s.graph_focus, session=s.graph_session)
        else:
            from hybridmem.graph.store import NetworkXGraphStore

            graph = NetworkXGraphStore(s.data_dir, max_open=max_open, focus=s.graph_focus,
                                       session=s.graph_session,
                                       exclusive=None if dir_lock is None else dir_lock.sole)
    if history is None:
        if s.chroma_url and client is not None:  # shared by every process, like the graph
            from hybridmem.replica.history import ChromaHistoryLog

            history = ChromaHistoryLog(handles)
        else:
            from hybridmem.sqlite.history import HistoryStore

            history = HistoryStore(s.data_dir, max_open=max_open)
    leases = None
    if s.chroma_url and client is not None:  # dedup and supersession across processes
        from hybridmem.replica.lease import ChromaLeases
        from hybridmem.replica.sync import REFRESH_INTERVAL, ServerCache

        leases = ChromaLeases(handles, ttl=s.lease_ttl)
        if chroma is not None:  # the record copy catches up as often as the graph and lexicon
            from hybridmem.replica.copies import ChromaRecordSnapshots

            chroma.follow(leases, interval=REFRESH_INTERVAL,
                          snapshots=ChromaRecordSnapshots(handles))
        for cache in (graph, lexical):  # they follow the leases' notes too
            if isinstance(cache, ServerCache):
                cache.watch(leases)
    shared_names = None
    if leases is not None and client is not None:
        from hybridmem.replica.copies import ChromaNameSnapshots

        shared_names = ChromaNameSnapshots(handles)
    return Stores(vectors=vectors, lexical=lexical, graph=graph, history=history,
                  dir_lock=dir_lock, leases=leases, name_snapshots=shared_names)


def _max_open(s: Settings) -> int:
    """Open users per SQLite store: three files per open user (lexical index, history, name
    vectors) within a quarter of the file limit (embedded Chroma takes at most half, see
    hybridmem.chroma.client.CHROMA_FILE_SHARE)."""
    limit = file_limit()
    return min(s.max_open_users, max(8, limit // 12)) if limit else s.max_open_users


def name_vectors(s: Settings, graph: GraphStore, model: str,
                 embed: Callable[[Sequence[str]], list[list[float]]], *,
                 shared: NameSnapshots | None = None) -> NameVectors:
    """The name vectors of the graph's topic signal (see :mod:`hybridmem.graph.name_vectors`): persisted
    beside the user's other files when embedded; with a Chroma server in memory, and shared
    through ``shared`` snapshots."""
    from hybridmem.graph.name_vectors import NameStore, NameVectors

    store = None if s.chroma_url else NameStore(s.data_dir, max_open=_max_open(s))
    return NameVectors(graph, store, embed=embed, model=model, shared=shared)


def default_embedder(settings: Settings) -> Embedder:
    """``embedder="local"`` (MiniLM, offline), ``"openai"`` (the configured endpoint) or
    ``"hash"`` (deterministic, for tests and tiny machines)."""
    if settings.embedder == "openai":
        from hybridmem.openai_compat import OpenAIEmbedder

        return OpenAIEmbedder(settings)
    if settings.embedder == "hash":
        from hybridmem.offline import HashEmbedder

        return HashEmbedder()
    from hybridmem.offline import LocalEmbedder

    return LocalEmbedder(threads=settings.onnx_threads)


def default_extractor(settings: Settings, chat: ChatModel | None) -> Extractor | None:
    """``extractor="auto"``: the LLM when an endpoint is configured (``chat`` is then the chat
    model to use), else the offline rules; ``"none"``: no graph."""
    choice = settings.extractor
    if choice == "none":
        return None
    if chat is not None and (choice == "llm" or (choice == "auto" and settings.llm_configured)):
        from hybridmem.openai_compat import LLMExtractor

        return LLMExtractor(chat)
    return rule_extractor(settings)


def wants_llm_extractor(settings: Settings) -> bool:
    """Whether :func:`default_extractor` needs a chat model."""
    return settings.extractor == "llm" or (
        settings.extractor == "auto" and settings.llm_configured
    )


def rule_extractor(settings: Settings | None = None) -> Extractor:
    """The offline rule extractor (also the fallback when a model fails)."""
    from hybridmem.extract.rules import RuleExtractor

    return RuleExtractor(speakers=settings is None or settings.graph_speakers)


def default_chat(settings: Settings) -> ChatModel:
    """The chat endpoint of ``base_url`` / ``chat_model``."""
    from hybridmem.openai_compat import OpenAIChat

    return OpenAIChat(settings)


def default_counter(settings: Settings) -> TokenCounter:
    """Exact tiktoken counting with the shipped encoding files."""
    from hybridmem.offline import TiktokenCounter

    return TiktokenCounter(settings.token_encoding)


def embed_checked(embedder: Embedder, texts: Sequence[str]) -> list[list[float]]:
    """``embedder.embed_batch(texts)``, with any failure that is not already one of ours, or a
    wrong number of vectors, raised as :class:`EmbedderError`."""
    try:
        vectors = embedder.embed_batch(list(texts))
    except HybridMemError:
        raise
    except Exception as exc:
        raise EmbedderError(f"the embedder {embedder.name!r} failed: {exc}") from exc
    if len(vectors) != len(texts):
        raise EmbedderError(
            f"the embedder {embedder.name!r} returned {len(vectors)} vectors for {len(texts)} texts"
        )
    return vectors


class ChatSlot:
    """The chat endpoint of a Memory: the one it was given, or the configured one, created on
    first use (an offline Memory never opens a client) and then closed with the Memory."""

    def __init__(self, settings: Settings, given: ChatModel | None,
                 owned: list[Closeable], observer: Observer | None = None) -> None:
        self._settings, self._model, self._owned = settings, given, owned
        self._observer = observer
        self._guard = threading.Lock()

    def get(self) -> ChatModel:
        with self._guard:
            if self._model is None:
                self._model = own(default_chat(self._settings), self._owned)
            if self._observer is not None and not isinstance(self._model, ObservedChat):
                self._model = ObservedChat(self._model, self._observer)
            model: ChatModel = self._model
            return model


class ObservedChat:
    """A :class:`ChatModel` whose calls the observer times (stage ``endpoint``) and whose reported
    token usage it receives: every model call of a Memory (chat, extraction, judge, summaries)
    goes through the one chat slot, so this one wrap sees them all."""

    def __init__(self, model: ChatModel, observer: Observer) -> None:
        self.wrapped, self._observer = model, observer

    @property
    def model(self) -> str:
        return self.wrapped.model

    @model.setter
    def model(self, value: str) -> None:
        self.wrapped.model = value

    @property
    def last_usage(self) -> Usage:
        return self.wrapped.last_usage

    @last_usage.setter
    def last_usage(self, value: Usage) -> None:
        self.wrapped.last_usage = value

    def complete(self, messages: Sequence[ChatMessage], *,
                 json_schema: Mapping[str, Any] | None = None,
                 schema_name: str = "result") -> ChatResult:
        with self._observer.stage("endpoint"):
            result = self.wrapped.complete(messages, json_schema=json_schema,
                                           schema_name=schema_name)
            self._observer.tokens(result.usage)
        return result

    def stream(self, messages: Sequence[ChatMessage]) -> Iterator[str]:
        """The wrapped stream; its stage ends at the first delta (the endpoint's latency: the
        rest is paced by the model and the reader), and is never held open across a ``yield``
        (a trace span would then end in another thread's context)."""
        deltas = iter(self.wrapped.stream(messages))
        with self._observer.stage("endpoint"):
            first = next(deltas, None)
        if first is not None:
            yield first
            yield from deltas
        self._observer.tokens(self.wrapped.last_usage)

    def __repr__(self) -> str:
        return f"ObservedChat({self.wrapped!r})"


@dataclass(frozen=True)
class Parts:
    """What a :class:`~hybridmem.Memory` is made of, built once by :func:`assemble`: the seams the
    settings name, the four stores, and the write and read pipelines over them."""

    settings: Settings
    embedder: Embedder
    extractor: Extractor | None
    counter: TokenCounter
    chat: ChatSlot
    stores: Stores
    names: NameVectors | None
    usage: UsageMeter
    writer: Writer
    retriever: Retriever
    access: AccessLog
    extras: Extras
    #: What assemble created and so must close (endpoint clients hold connection pools).
    owned: list[Closeable]
    #: Times the stages and receives token usage (see hybridmem.observe).
    observer: Observer = dataclasses.field(default_factory=NullObserver)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return embed_checked(self.embedder, texts)

    def close(self) -> None:
        """Write buffered access counts, then close the stores, then the clients created here;
        each step runs even when an earlier one fails."""
        try:
            self.retriever.close()
            self.access.close()
        finally:
            try:
                self.stores.close()
            finally:
                for thing in self.owned:
                    thing.close()


def own(thing: T, owned: list[Closeable]) -> T:
    """``thing``, remembered in ``owned`` when it must be closed."""
    if isinstance(thing, Closeable):
        owned.append(thing)
    return thing


def assemble(
    settings: Settings,
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
) -> Parts:
    """Build a Memory's parts: the given seams, the configured defaults for the rest; then
    recover what a crash left half-written (batches, then imports) before anything else runs.
    ``observer`` (see :mod:`hybridmem.observe`) times the stages; the endpoint is wrapped in an
    :class:`ObservedChat` only when one is given."""
    from hybridmem.graph.name_vectors import NamedGraph
    from hybridmem.ops.bundle import recover_imports
    from hybridmem.read.access import AccessLog, Extras
    from hybridmem.read.retrieval import Retriever
    from hybridmem.write.plan import UsageMeter
    from hybridmem.write.writer import Writer

    if extractor is not None and not isinstance(extractor, Extractor):  # checked before opening
        raise ConfigError(
            f"{type(extractor).__name__} is not an Extractor: it needs name, offline (True when "
            "extract() calls no model) and extract(text, *, speaker=None)")
    if observer is not None and not isinstance(observer, Observer):
        raise ConfigError(f"{type(observer).__name__} is not an Observer: it needs stage(name) "
                          "and tokens(usage) (see hybridmem.observe)")
    watch = observer if observer is not None else NullObserver()
    s = settings
    s.data_dir.mkdir(parents=True, exist_ok=True)
    owned: list[Closeable] = []
    chat = ChatSlot(s, chat_model, owned, observer)
    embedder = embedder or own(default_embedder(s), owned)

    def embed(texts: Sequence[str]) -> list[list[float]]:
        with watch.stage("embed"):
            return embed_checked(embedder, texts)

    if extractor is None:
        extractor = default_extractor(s, chat.get() if wants_llm_extractor(s) else None)
    counter = token_counter or default_counter(s)
    stores = open_stores(s, embedder, vectors=vector_store, lexical=lexical_index,
                         graph=graph_store, history=history_log)
    names = None
    if s.graph_topic > 0 and s.graph_weight > 0:  # every graph write keeps the name vectors
        names = name_vectors(s, stores.graph, embedder.name, embed,
                             shared=stores.name_snapshots)
        stores = dataclasses.replace(stores, graph=NamedGraph(stores.graph, names))
    usage = UsageMeter()
    rules: list[Extractor] = []

    def rule_fallback() -> Extractor:
        if not rules:
            rules.append(rule_extractor())
        return rules[0]

    writer = Writer(s, stores, embed=embed, extractor=extractor, rules=rule_fallback,
                    chat=chat.get, usage=usage, names=names)
    writer.recover()  # batches a crash left half-written, before anything else
    recover_imports(s.data_dir, stores, embed=embed)  # and imports
    return Parts(
        settings=s, embedder=embedder, extractor=extractor, counter=counter, chat=chat,
        stores=stores, names=names, usage=usage, writer=writer,
        retriever=Retriever(s, stores, embed=embed, names=names, observer=watch),
        access=AccessLog(stores, writer.locks), extras=Extras(stores), owned=owned,
        observer=watch,
    )
