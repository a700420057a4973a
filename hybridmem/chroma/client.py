"""Chroma plumbing, written once: clients, collection names, create/open/drop, stale handles.

Every Chroma user goes through it: :mod:`hybridmem.chroma.vector` (a user's memory collections)
and, in server mode, :mod:`hybridmem.replica` (the graph, history and lease side collections,
and :mod:`hybridmem.replica.lexical`'s cache of the memory collection).

- Clients: embedded (``PersistentClient``) or server (``HttpClient``), telemetry off.
- Names: every collection of a user (memories, archive, and in server mode graph records,
  history and lease) is named by :func:`collection_name`, from a hash of the user id (Chroma
  allows only ``[a-zA-Z0-9._-]``, so a raw id never becomes a name).
- Collections are created with ``embedding_function=None`` (Chroma's default embedder downloads a
  model on first use) and a cosine HNSW index that persists every :func:`sync_threshold`
  records (fewer in embedded mode); we always pass our own vectors.
- Not found is recognised by class: ``chromadb.errors.NotFoundError``. Checked with chromadb 1.5.9
  against a real embedded client and a real ``chroma run`` server: a missing collection on
  ``get_collection``/``delete_collection``, and every operation (count, get, query, upsert, update,
  delete) on a handle whose collection another client deleted — even if it was re-created since —
  raise exactly that class in both modes.
- :class:`CollectionHandles` caches handles; when another process drops a collection the cached
  handle goes stale, so it is dropped and the call retried once. Every other Chroma failure becomes
  a :class:`~hybridmem.errors.StorageError` naming the user and the operation.
"""

from __future__ import annotations

import logging
import os

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union
from urllib.parse import urlparse

from hybridmem.runtime import process
from hybridmem.runtime.files import USER_KEY, user_key
from hybridmem.errors import ConfigError, HybridMemError, StorageError

if TYPE_CHECKING:
    from chromadb.api import ClientAPI
    from chromadb.api.models.Collection import Collection
    from chromadb.api.collection_configuration import CreateHNSWConfiguration

__all__ = [
    "CHROMA_FILE_SHARE",
    "FILES_PER_INDEX",
    "EMBEDDED_SYNC_THRESHOLD",
    "HNSW_SYNC_THRESHOLD",
    "CollectionHandles",
    "close_client",
    "COLLECTION_PREFIXES",
    "STAGING",
    "stored_users",
    "is_memories_name",
    "CollectionKind",
    "collection_name",
    "adopt_sync_threshold",
    "create_collection",
    "drop_collection",
    "get_paged",
    "is_internal",
    "is_not_found",
    "make_client",
    "open_collection",
    "sync_threshold",
    "SIDE_SYNC_THRESHOLD",
]

T = TypeVar("T")
log = logging.getLogger(__name__)
#: What a collection's own metadata may hold (Chroma's collection metadata is flat scalars).
CollectionMeta = Mapping[str, Union[str, int, float, bool]]
#: The share of the process's file descriptors embedded Chroma may keep open for its HNSW indexes.
CHROMA_FILE_SHARE = 0.25


#: Open files one HNSW index holds in embedded Chroma's cache (4 data files, 1 metadata file):
#: Chroma caches ``RLIMIT_NOFILE // FILES_PER_INDEX`` indexes, each loaded in RAM.
FILES_PER_INDEX = 5


def make_client(
    *, path: Path | None = None, url: str | None = None, max_indexes: int | None = None
) -> ClientAPI:
    """An embedded (``path``) or server (``url``) Chroma client with telemetry off; an embedded
    one keeps at most ``max_indexes`` HNSW indexes open and loaded (never fewer than 12).

    Exactly one of ``path`` and ``url``. A server is contacted at once, so an unreachable one fails
    here with a :class:`StorageError`."""
    if (path is None) == (url is None):
        raise ConfigError("a Chroma client needs exactly one of path= (embedded) or url= (server)")
    try:
        import chromadb
        from chromadb.config import Settings as ChromaSettings
    except ImportError as exc:  # pragma: no cover - hard dependency
        raise ConfigError("chromadb is not installed: pip install hybridmem") from exc
    chroma_settings = ChromaSettings(anonymized_telemetry=False, allow_reset=False)
    try:
        if url is not None:
            parsed = urlparse(url)
            return chromadb.HttpClient(
                host=parsed.hostname or "127.0.0.1",
                port=parsed.port or (443 if parsed.scheme == "https" else 8000),
                ssl=parsed.scheme == "https",
                settings=chroma_settings,
            )
        if path is not None:
            path.mkdir(parents=True, exist_ok=True)
        cap = None if max_indexes is None else max_indexes * FILES_PER_INDEX
        with process.file_budget(CHROMA_FILE_SHARE, cap):
            return chromadb.PersistentClient(path=str(path), settings=chroma_settings)
    except Exception as exc:
        where = f"the Chroma server at {url}" if url is not None else f"the Chroma store at {path}"
        raise StorageError(f"could not open {where}: {exc}") from exc


def close_client(client: ClientAPI) -> None:
    """Release a client made by :func:`make_client` (embedded clients on one path share a
    reference-counted system, which stops with the last of them); idempotent."""
    from chromadb.api.client import Client

    if isinstance(client, Client):  # what both constructors return; ClientAPI declares no close
        client.close()


#: A user's collections by kind, and the prefix of each name (see :func:`collection_name`).
COLLECTION_PREFIXES: dict[str, str] = {
    "memories": "",  # the memories, their vectors and documents: what every search queries
    "archive": "a-",  # memories no longer current, kept out of the index searches query
    "graph": "g-",  # server mode: one record per extraction, the graph's source of truth
    "history": "h-",  # server mode: the history log
    "lease": "l-",  # server mode: the user's write lease and journal
    "snapshot": "s-",  # server mode: a compacted copy of the graph records (replica.snapshot)
}
#: Prefix of a collection being rebuilt (a torn index repaired, or moved to another embedder);
#: the staging copy of collection ``n`` is ``STAGING + n``.
STAGING = "r-"
CollectionKind = Literal["memories", "archive", "graph", "history", "lease", "snapshot"]


def collection_name(user_id: str, kind: CollectionKind = "memories", *,
                    staging: bool = False) -> str:
    """The name of one of the user's collections — the only place a collection is named.

    Every name derives from a hash of the user id (:func:`~hybridmem.runtime.files.user_key`),
    since Chroma allows only ``[a-zA-Z0-9._-]``; ``staging``: the name of its copy under rebuild.
    """
    name = COLLECTION_PREFIXES[kind] + user_key(user_id)
    return STAGING + name if staging else name


def is_memories_name(name: str) -> bool:
    """Whether ``name`` is a user's memories collection (not an archive, graph, history or
    staging one): the memories prefix, then a user key and nothing else."""
    prefix = COLLECTION_PREFIXES["memories"]
    return name.startswith(prefix) and USER_KEY.fullmatch(name[len(prefix):]) is not None


def stored_users(client: ClientAPI) -> list[str]:
    """Every user with a memory collection in this Chroma (from the collections' metadata),
    sorted; a staging collection of an unfinished re-embedding counts for its user."""
    users: set[str] = set()
    for collection in client.list_collections():
        meta = collection.metadata or {}
        user = meta.get("user_id")
        if isinstance(user, str) and "embedder" in meta and (
                collection.name == collection_name(user)
                or collection.name == collection_name(user, staging=True)):
            users.add(user)
    return sorted(users)


def is_not_found(exc: BaseException) -> bool:
    """Whether Chroma said "this collection does not exist" (by class, never by message)."""
    from chromadb.errors import NotFoundError

    return isinstance(exc, NotFoundError)


#: Records between two persists of a collection's HNSW index (Chroma's ``sync_threshold``) in
#: the collections we create on a Chroma *server*: Chroma's own default, set explicitly.
HNSW_SYNC_THRESHOLD = 1000
#: The same in *embedded* collections. Why lower: every add re-reads the log records that wait
#: for the next persist (up to the threshold), so an add costs more the longer since the last
#: persist: with a threshold of 1,000, 16.7 ms at 130 memories and 33.5 ms at 10,030 with 847
#: waiting (2.0x); with 200, 19.7 ms (1.17x), and raw Chroma's single add at 100k memories has
#: median 5.8 / p99 13.3 ms against 7.4 / 15.0 (a persist writes the changed part of the index,
#: not all of it). The price: five times the persists, and so five times the moments in which a
#: kill -9 can tear the index; embedded collections are checked before first use and a torn one
#: is rebuilt with no memory lost (:mod:`hybridmem.chroma.repair`). A server's index files are
#: the server's own, and nothing of ours repairs them: there Chroma's default applies.
EMBEDDED_SYNC_THRESHOLD = 200


#: The same in the collections of few records rewritten again and again (a user's snapshots and
#: lease). Why: Chroma keeps every write in its log until the next persist, and these
#: collections hold too few records to reach a threshold of records for a long time: measured on
#: one ``chroma run``, storing a 1.5 MB snapshot 40 times grew ``chroma.sqlite3`` to 85 MB and
#: each store from 56 to 350 ms (insert + delete), the old snapshots' bytes — texts a user
#: forgot among them — still in the log. Persisting every 2 records keeps both flat (30 + 10
#: ms, 11 MB), and the log holds no superseded snapshot for long.
SIDE_SYNC_THRESHOLD = 2
#: The ``kind`` metadata of the collections of that kind (a user's snapshots, lease).
REWRITTEN = ("hybridmem-graph-snapshot",)


def sync_threshold(client: ClientAPI, metadata: CollectionMeta | None = None) -> int:
    """The ``sync_threshold`` of the collections we create with ``client`` (embedded or server),
    or of one created with ``metadata``: :data:`SIDE_SYNC_THRESHOLD` for a :data:`REWRITTEN`
    kind."""
    if metadata is not None and metadata.get("kind") in REWRITTEN:
        return SIDE_SYNC_THRESHOLD
    return EMBEDDED_SYNC_THRESHOLD if client.get_settings().is_persistent else HNSW_SYNC_THRESHOLD


def create_collection(client: ClientAPI, name: str, metadata: CollectionMeta) -> Collection:
    """Get or create a collection for our own vectors: no embedding function, cosine HNSW that
    syncs every :func:`sync_threshold` records. ``metadata`` and the configuration are only
    written when the collection is created: an existing collection keeps its own (Chroma ignores
    the configuration of ``get_or_create_collection`` then; see :func:`adopt_sync_threshold`;
    a snapshot or lease collection of an earlier release is given :data:`SIDE_SYNC_THRESHOLD`,
    and an operator changes one with
    ``collection.modify(configuration={"hnsw": {"sync_threshold": N}})``, see docs/operations.md)."""
    sync = sync_threshold(client, metadata)
    hnsw: CreateHNSWConfiguration = {"space": "cosine", "sync_threshold": sync}
    if sync < 100:  # Chroma's default batch (100) may not exceed the threshold
        hnsw["batch_size"] = sync
    collection = client.get_or_create_collection(
        name=name, embedding_function=None, configuration={"hnsw": hnsw},
        metadata=dict(metadata))
    had = (collection.configuration_json or {}).get("hnsw") or {}
    if sync == SIDE_SYNC_THRESHOLD and had.get("sync_threshold") != sync:  # made by a release
        collection.modify(configuration={"hnsw": {"sync_threshold": sync, "batch_size": sync}})
    return collection


def adopt_sync_threshold(client: ClientAPI, collection: Collection) -> bool:
    """Give an embedded collection that earlier releases created (syncing every
    :data:`HNSW_SYNC_THRESHOLD`) the current :data:`EMBEDDED_SYNC_THRESHOLD`; True if it was
    changed. Any other value is an operator's choice and stays. Chroma applies the change from
    the next process that loads the index on. One metadata write, once per collection."""
    want = sync_threshold(client)
    hnsw = (collection.configuration_json or {}).get("hnsw") or {}
    if want == HNSW_SYNC_THRESHOLD or hnsw.get("sync_threshold") != HNSW_SYNC_THRESHOLD:
        return False
    collection.modify(configuration={"hnsw": {"sync_threshold": want}})
    log.info("the HNSW index of collection %s now persists every %d records", collection.name, want)
    return True


def open_collection(client: ClientAPI, name: str) -> Collection | None:
    """The collection, or None when it does not exist."""
    try:
        return client.get_collection(name=name, embedding_function=None)
    except Exception as exc:
        if is_not_found(exc):
            return None
        raise


def is_internal(exc: BaseException | None) -> bool:
    """Whether Chroma failed inside (``chromadb.errors.InternalError``: a torn index is one)."""
    from chromadb.errors import InternalError

    return isinstance(exc, InternalError)


def drop_collection(client: ClientAPI, name: str) -> None:
    """Delete a collection; one that does not exist is fine."""
    try:
        client.delete_collection(name=name)
    except Exception as exc:
        if not is_not_found(exc):
            raise


#: Records per Chroma request when :func:`move_not_current` moves them.
MOVE_BATCH = 1000


#: Records one :func:`get_paged` call asks Chroma for.
READ_PAGE = 10_000


def get_paged(col: Collection, *, include: list[str], where: Mapping[str, object] | None = None,
              limit: int | None = None, offset: int = 0) -> dict[str, list[Any]]:
    """``col.get`` of ``include`` (ids always) in pages of :data:`READ_PAGE` records: the
    ``ids``, ``documents``, ``metadatas`` lists of every page, concatenated.

    Why: Chroma's ``get`` of documents or metadatas with no ``where`` and no ``limit`` puts one
    SQL variable per record into a query and fails above SQLite's 32,766 ("too many SQL
    variables"): at 100k memories a user's record cache could not load and ``list()`` failed.
    Pages are read by ``offset`` in Chroma's own order, so the caller holds whatever keeps the
    collection still between pages (the user's write lock) when it needs a consistent whole."""
    out: dict[str, list[Any]] = {"ids": [], **{k: [] for k in include}}
    while limit is None or len(out["ids"]) < limit:
        want = READ_PAGE if limit is None else min(READ_PAGE, limit - len(out["ids"]))
        got = col.get(where=where, limit=want, offset=offset or None,  # type: ignore[arg-type]
                      include=include)  # type: ignore[arg-type]
        for key in out:
            out[key].extend(got[key] or [])  # type: ignore[literal-required]
        offset += len(got["ids"])
        if len(got["ids"]) < want:
            break
    return out


def move_not_current(client: ClientAPI, hot: Collection, archive_name: str,
                     meta: CollectionMeta, *, check: Callable[[Collection], None]) -> int:
    """Migrate a user's hot collection of schema 1 (see :mod:`hybridmem.chroma.vector`): copy the records
    that are not current to the archive collection (created with ``meta``, vetted by ``check``),
    delete them from ``hot``, then mark ``hot`` with ``meta``'s schema. Each step repeats
    harmlessly, so an interrupted migration is finished at the next open. Returns how many moved."""
    old = hot.get(where={"current": False}, include=["embeddings", "documents", "metadatas"])
    ids = list(old["ids"])
    if ids:
        archive = create_collection(client, archive_name, meta)
        check(archive)
        embeddings, docs, metas = old["embeddings"], old["documents"], old["metadatas"]
        assert embeddings is not None and docs is not None and metas is not None
        for lo in range(0, len(ids), MOVE_BATCH):
            hi = lo + MOVE_BATCH
            archive.upsert(ids=ids[lo:hi], embeddings=embeddings[lo:hi], documents=docs[lo:hi],
                           metadatas=metas[lo:hi])
        for lo in range(0, len(ids), MOVE_BATCH):
            hot.delete(ids=ids[lo : lo + MOVE_BATCH])
    hot.modify(metadata={**(hot.metadata or {}), "schema": meta["schema"]})
    return len(ids)


def handles_of(source: ClientAPI | CollectionHandles, *, hint: str = "") -> CollectionHandles:
    """``source`` itself when it is handles already (those of the store that made the client,
    shared: a process then opens each of a user's collections once, not once per store), else
    new handles of the client ``source``."""
    return source if isinstance(source, CollectionHandles) else CollectionHandles(source,
                                                                                  hint=hint)


class CollectionHandles:
    """Cached collection handles of one client, by name. Thread-safe.

    A handle goes stale when another process (or another client in this one) deletes its
    collection, even if the collection was re-created since: then :meth:`run` drops it and tries
    once more with a fresh one. ``hint`` is appended to error messages (what to check).
    """

    def __init__(
        self,
        client: ClientAPI,
        *,
        hint: str = "",
        max_open: int = 128,
        reopen: Callable[[], ClientAPI] | None = None,
    ) -> None:
        self.client = client
        self._hint = hint
        #: Least recently used first, at most ``max_open`` handles (a handle is cheap to reopen).
        self._cache: OrderedDict[str, Collection] = OrderedDict()
        self._max_open = max(1, max_open)
        #: Embedded Chroma keeps every index it ever opened open (4 files each) until its client
        #: closes, whatever its cache size says; with ``reopen`` the client is replaced once
        #: ``max_open`` collections were opened and no call is in flight, so files stay bounded.
        self._reopen = reopen
        self._opened = 0
        self._in_flight = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a call in flight ends
        #: name -> the lock of its opening under way (see _handle)
        self._gates: dict[str, threading.Lock] = {}
        #: cached handles a caller's ``check`` accepted (see _vet)
        self._vetted: set[str] = set()

    def __repr__(self) -> str:
        return f"CollectionHandles(cached={len(self._cache)})"

    def cached(self, keep: Callable[[str], bool]) -> int:
        """How many cached handles have a name ``keep`` accepts."""
        with self._lock:
            return sum(1 for name in self._cache if keep(name))

    def run(
        self,
        name: str,
        call: Callable[[Collection], T],
        *,
        user_id: str,
        what: str,
        create: CollectionMeta | None = None,
        check: Callable[[Collection], None] | None = None,
    ) -> T | None:
        """``call(collection)``, or None when the collection does not exist.

        With ``create`` (the new collection's metadata) a missing collection is created first.
        ``check`` vets a freshly opened handle (it may raise a HybridMemError, such as
        :class:`~hybridmem.errors.EmbedderMismatchError`). Hybridmem's own errors pass through;
        any other failure becomes a :class:`StorageError` saying ``could not <what> of <user>``.
        """
        with self._lock:
            self._recycle_if_due()
            self._in_flight += 1
        try:
            for attempt in (0, 1):
                try:
                    collection = self._handle(name, create)
                    if collection is None:
                        return None
                    if check is not None:
                        self._vet(name, collection, check)
                    return call(collection)
                except HybridMemError:
                    raise
                except Exception as exc:
                    if not is_not_found(exc):
                        raise self.error(user_id, what, exc) from exc
                    self.forget(name)
                    if attempt == 1 and create is not None:
                        raise self.error(user_id, what, exc) from exc
            return None  # dropped again right after being reopened: it does not exist now
        finally:
            with self._lock:
                self._in_flight -= 1
                self._idle.notify_all()

    @contextmanager
    def borrowed(self) -> Iterator[ClientAPI]:
        """The client, for work outside :meth:`run` (a repair): not replaced while lent."""
        with self._lock:
            self._recycle_if_due()
            self._in_flight += 1
        try:
            yield self.client
        finally:
            with self._lock:
                self._in_flight -= 1
                self._idle.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """No call to Chroma while inside: waits for the calls in flight to end and holds new
        ones (and :meth:`borrowed`) until it exits. For work on Chroma's files from outside
        Chroma: a second SQLite connection in this process must not touch the file while
        Chroma's own is in a transaction (POSIX locks are per process, so closing one copy of
        the library's connection releases the locks of the other)."""
        with self._idle:
            self._idle.wait_for(lambda: self._in_flight == 0)
            yield

    def _recycle_if_due(self) -> None:
        """Replace the client (call with the lock held) when it opened too many indexes."""
        if self._reopen is None or self._opened <= self._max_open or self._in_flight:
            return
        self._cache.clear()
        self._vetted.clear()
        close_client(self.client)
        process.release_freed_heap()  # the old client's indexes, else kept by glibc (see there)
        self.client = self._reopen()
        self._opened = 0

    def _handle(self, name: str, create: CollectionMeta | None) -> Collection | None:
        """The cached handle of ``name``, or one opened (or created) now. Opening is a round
        trip on a server: it runs under a lock of its own name only, so the stores sharing
        these handles open their collections at once (a first context opens five or six)."""
        with self._lock:
            cached = self._cached(name)
            if cached is not None:
                return cached
            gate = self._gates.setdefault(name, threading.Lock())
        try:
            with gate:  # one opening per name; the others wait for it, then find it cached
                with self._lock:
                    cached = self._cached(name)
                client = self.client
                if cached is not None:
                    return cached
                if create is not None:
                    collection: Collection | None = create_collection(client, name, create)
                else:
                    collection = open_collection(client, name)
                if collection is not None:
                    with self._lock:
                        self._opened += 1
                        self._cache[name] = collection
                        self._vetted.discard(name)
                        while len(self._cache) > self._max_open:
                            self._vetted.discard(self._cache.popitem(last=False)[0])
                return collection
        finally:
            with self._lock:
                if self._gates.get(name) is gate and not gate.locked():
                    del self._gates[name]

    def _vet(self, name: str, collection: Collection, check: Callable[[Collection], None],
             ) -> None:
        """Run ``check`` on a handle the first time a caller that vets asks for it: the stores
        sharing these handles open collections of one another (the lexical cache reads the
        vector store's), and the one that vets may come second. A refused handle is not kept:
        the next call opens the collection again and vets it anew."""
        with self._lock:
            if name in self._vetted and self._cache.get(name) is collection:
                return
        try:
            check(collection)
        except BaseException:
            with self._lock:
                if self._cache.get(name) is collection:
                    del self._cache[name]
            raise
        with self._lock:
            if self._cache.get(name) is collection:
                self._vetted.add(name)

    def _cached(self, name: str) -> Collection | None:
        """The cached handle of ``name`` (call with the lock held)."""
        cached = self._cache.get(name)
        if cached is not None:
            self._cache.move_to_end(name)
        return cached

    def drop(self, name: str, *, user_id: str, what: str) -> None:
        """Forget the handle and delete the collection (a missing one is fine)."""
        with self._lock:
            self._cache.pop(name, None)
            self._vetted.discard(name)
            try:
                drop_collection(self.client, name)
            except Exception as exc:
                raise self.error(user_id, what, exc) from exc

    def forget(self, name: str) -> None:
        """Drop the cached handle (the next call reopens the collection)."""
        with self._lock:
            self._cache.pop(name, None)
            self._vetted.discard(name)

    def clear(self) -> None:
        """Drop every cached handle."""
        with self._lock:
            self._cache.clear()
            self._vetted.clear()

    def error(self, user_id: str, what: str, exc: BaseException) -> StorageError:
        """A :class:`StorageError` naming the operation and the user, with the hint."""
        hint = f"; {self._hint}" if self._hint else ""
        return StorageError(f"could not {what} of {user_id!r}: {exc}{hint}")
