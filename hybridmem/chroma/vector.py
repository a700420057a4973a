"""ChromaVectorStore: a user's memories in Chroma, embedded or server, with *our* vectors only.

Collections are created with ``embedding_function=None`` and a cosine HNSW index, so Chroma never
attaches (and downloads) its own embedder (:mod:`hybridmem.chroma.client` owns client, names, handles).
Names hash the user id; the raw id, the embedder's name and dimension are kept in each
collection's metadata, and another embedder is refused. The record layout and filters on it are
:mod:`hybridmem.chroma.layout`'s.

**Two collections per user.** Current memories live in the *hot* collection, the only one a
search for current memories queries; the others (superseded, invalidated) in the *archive*. Why:
Chroma answers a ``where`` by scanning every record's metadata (63 ms at 10k memories), so
filtering ``current`` meant over-fetching neighbours and filtering in Python (~20 ms); now the hot
query needs neither. A filter that does not pin ``current`` (``include_superseded``, time travel)
reads both. Expired memories stay hot (they expire with no write); readers drop them.

- Routing: a write sends a record where its ``current`` says; a write that flips it (a
  supersession is a metadata :meth:`~ChromaVectorStore.update`) *moves* it: copied to the other
  collection first, then deleted where it was.
- Crash safety: a crash in between leaves two copies, never none. The intent journal replays an
  interrupted update (:mod:`hybridmem.write.journal`), which finishes the move; any leftover copy is
  resolved when the user's records are next loaded; readers meanwhile prefer the hot copy.
- Migration: a hot collection of schema 1 is migrated when a process first opens it
  (:func:`hybridmem.chroma.client.move_not_current`); an interrupted one finishes at the next open.
- Record cache: with ``cache_records`` reads are served from an in-memory copy
  (:mod:`hybridmem.chroma.record_cache`) that every write updates once Chroma accepted it; the
  vector query asks Chroma for ids and distances only. Embedded, the data-dir lock makes this
  store the one writer. A Chroma server is written by processes this one cannot see: there the
  copy is kept only once :meth:`ChromaVectorStore.follow` gave it the users' write leases, which
  say what other processes wrote (:mod:`hybridmem.chroma.follow`); until then reads go to the
  server.
"""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse

import numpy as np

from hybridmem.chroma import client as _chroma
from hybridmem.chroma import placement as place
from hybridmem.runtime.locks import UserLocks
from hybridmem.runtime.process import scrub_freed_heap
from hybridmem.chroma.layout import rows as _rows
from hybridmem.chroma.layout import (Record, archived, compile_where, matches, parts_of, resolve,
                               residual, stored, to_item, to_record)
from hybridmem.chroma.follow import Follower, aged, noted_memories, written_since
from hybridmem.chroma.purge import MARKER, Compactor, purge_embedded
from hybridmem.chroma.record_cache import RecordCache, RecordLoading, UserRecords
from hybridmem.chroma.reembed import reembed_user
from hybridmem.chroma.repair import Repair, Vetting
from hybridmem.errors import ClosedError, EmbedderMismatchError, InvalidInputError, StorageError
from hybridmem.filters import AllOf, Condition, Filter
from hybridmem.models import MemoryItem
from hybridmem.protocols import (RecordSnapshot, RecordSnapshots, StoreReport,
                                 VectorHit, WriteLog)

if TYPE_CHECKING:
    from chromadb.api import ClientAPI
    from chromadb.api.models.Collection import Collection
    from chromadb.api.types import Embedding, Include

__all__ = ["OVERFETCH", "SCHEMA_VERSION", "ChromaVectorStore", "compile_where", "matches"]

log = logging.getLogger(__name__)
#: 2: memories that are not current live in the archive collection.
SCHEMA_VERSION = 2
T = TypeVar("T")
#: A record snapshot is owed after this many records were written since the last one, and at
#: least an eighth of the user's records (a load fetches that tail by id: ~0.1 ms a record of
#: server time, against ~1 s for a rewrite at 10k memories; see hybridmem.replica.copies).
RECORDS_TAIL = 1024
RECORDS_SHARE = 8
#: No record snapshot is stored for a user of fewer records: reading them all costs less.
RECORDS_MIN = 1024
#: Ids per request when a load fetches what was written since the record snapshot.
TAIL_CHUNK = 2000
#: Collections per open user in the handles server mode's stores share (see
#: ChromaVectorStore.handles): main, archive, graph, snapshot, lease and history, with room.
SHARED_KINDS = 8
#: How many more neighbours a filtered query fetches before filtering them itself.
OVERFETCH = 3
#: A query section whose filter pins a kind (or key) to at most this many records is ranked here,
#: on their vectors, instead of by Chroma (see ChromaVectorStore._nearest_of).
LOCAL_SECTION = 2048
#: (id, document, metadata, similarity) of one neighbour.
_Found = tuple[str, "str | None", "Mapping[str, Any] | None", float]


class ChromaVectorStore:
    """:class:`~hybridmem.protocols.VectorStore` on Chroma: a hot and an archive collection per
    user (see the module docstring). Thread-safe; handles are cached per user. ``path`` opens an
    embedded store, ``url`` a server (exactly one); ``cache_records`` keeps records in memory
    (only for the one writer: ``exclusive`` says whether this store still is, else the cache is
    dropped). A closed store raises :class:`~hybridmem.errors.ClosedError`.
    """

    def __init__(
        self,
        *,
        embedder_name: str,
        dimension: int,
        path: Path | None = None,
        url: str | None = None,
        scrub_heap: bool = True,
        max_open: int = 128,
        cache_records: bool = False,
        background_load: bool = True,
        exclusive: Callable[[], bool] | None = None,
        reembed: Callable[[Sequence[str]], builtins.list[builtins.list[float]]] | None = None,
        purge_delay: float = 0.0,
    ) -> None:
        if scrub_heap and url is None:
            scrub_freed_heap()
        if path is not None and url is None and (path / MARKER).exists():
            # a crash left erasures unpurged: purge them before Chroma opens its file
            log.warning("purging erased memories a crash left in %s", path)
            purge_embedded(path)
            (path / MARKER).unlink()
        indexes = 2 * max_open  # each open user's main and archive collections
        client = _chroma.make_client(path=path, url=url, max_indexes=indexes)
        hint = "check that the Chroma server at chroma_url is reachable" if url else ""
        # on a server the other stores share these handles (see handles): room for each open
        # user's main, archive, graph, snapshot, lease and history collections
        self._handles = _chroma.CollectionHandles(
            client, hint=hint, max_open=max_open if url is None else SHARED_KINDS * max_open,
            reopen=None if url is not None
            else lambda: _chroma.make_client(path=path, max_indexes=indexes),
        )
        self._path = None if url is not None else path
        #: server mode: what keeps the record copy exact (None: no copy until follow() is called)
        self._follower: Follower | None = None
        self._snapshots: RecordSnapshots | None = None  # server mode: see follow()
        self._shared = url is not None
        self._where = f"url={urlparse(url).netloc.rpartition('@')[2]!r}" if url else f"path={path}"
        self._embedder_name = embedder_name
        self._dimension = dimension
        self._user_lock = UserLocks()  # a user's writes and the loading of its records
        self._records = RecordCache(max_open) if cache_records else None
        #: when a user's records are loaded (``exclusive`` False while another writer shares
        #: the files: no cache)
        self._loading = None if self._records is None else RecordLoading(
            self._records, load=self._load, hold=self._user_lock.hold,
            background=background_load, exclusive=exclusive)
        self._lock = threading.Lock()
        self._closed = False
        #: embedded: the purge of erased text, run in the background (see purge)
        self._compactor = None if path is None or url is not None else Compactor(
            self._purge_files, delay=purge_delay, marker=path / MARKER, defer=exclusive)
        self._vetting = None if path is None else Vetting(  # torn indexes: see _chromarepair
            Repair(path, reembed), self._handles, lock=self._user_lock.hold,
            drop_cached=self._drop_cached, cap=4 * max_open)

    @property
    def client(self) -> ClientAPI:
        """The Chroma client (server mode shares it with the graph and lexical stores, which
        borrow it: this store closes it)."""
        return self._handles.client

    @property
    def handles(self) -> _chroma.CollectionHandles:
        """This store's collection handles, which server mode's other stores share (see
        :func:`~hybridmem.chroma.client.handles_of`): a process opens each of a user's
        collections once, where each store opened its own (a first context opened the
        snapshot collection three times)."""
        return self._handles

    def __repr__(self) -> str:
        return (f"ChromaVectorStore({self._where}, embedder={self._embedder_name!r}, "
                f"dimension={self._dimension})")

    def __enter__(self) -> ChromaVectorStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------------
    def _live(self) -> None:
        if self._closed:
            raise ClosedError("the vector store is closed; create a new ChromaVectorStore")

    def _run(self, user_id: str, what: str, call: Callable[[Collection], T], *,
             create: bool = False, archive: bool = False) -> T | None:
        """``call`` on the user's hot (or ``archive``) collection; None when it does not exist,
        unless ``create``."""
        self._live()
        meta = self._meta(user_id)
        name = _chroma.collection_name(user_id, "archive" if archive else "memories")
        def attempt() -> T | None:
            return self._handles.run(name, call, user_id=user_id, what=what,
                                     create=meta if create else None,
                                     check=lambda c: self._opened(user_id, c, archive))
        return attempt() if self._vetting is None else self._vetting.run(
            user_id, name, meta, attempt)

    def _meta(self, user_id: str) -> dict[str, Any]:  # a new collection's
        return {"user_id": user_id, "embedder": self._embedder_name, "dimension": self._dimension,
                "schema": SCHEMA_VERSION}

    def _both(self, user_id: str, what: str, call: Callable[[Collection], T]) -> builtins.list[T]:
        """``call`` on each of the user's collections that exists (hot first)."""
        return [g for a in (False, True) if (g := self._run(user_id, what, call, archive=a))
                is not None]

    def _opened(self, user_id: str, collection: Collection, archive: bool) -> None:
        """Vet a freshly opened collection: the embedder must match, an embedded one of an earlier
        release adopts today's HNSW sync threshold, and a hot one of an older layout (schema 1:
        superseded memories beside current ones) is migrated now."""
        self._check_identity(user_id, collection)
        _chroma.adopt_sync_threshold(self._handles.client, collection)
        if not archive and (collection.metadata or {}).get("schema", 1) < SCHEMA_VERSION:
            self._migrate(user_id, collection)

    def _migrate(self, user_id: str, hot: Collection) -> None:
        moved = _chroma.move_not_current(
            self._handles.client, hot, _chroma.collection_name(user_id, "archive"),
            self._meta(user_id), check=lambda c: self._check_identity(user_id, c))
        log.info("moved %d memories that are not current to the archive collection", moved)

    def _check_identity(self, user_id: str, collection: Collection) -> None:
        meta = collection.metadata or {}
        if meta.get("embedder") != self._embedder_name or meta.get("dimension") != self._dimension:
            raise EmbedderMismatchError(
                f"the memories of {user_id!r} were embedded with {meta.get('embedder')!r} "
                f"({meta.get('dimension')}-d) but {self._embedder_name!r} "
                f"({self._dimension}-d) is configured; configure the original embedder, or "
                "move the memories to the configured one with Memory.reembed (the command "
                "`hybridmem reembed`)"
            )

    # -- the record cache ------------------------------------------------------------------------
    def follow(self, log: WriteLog, *, interval: float,
               snapshots: RecordSnapshots | None = None) -> None:
        """On a Chroma server, keep the record copy, caught up with other processes' writes
        from ``log`` (the users' write leases) at most every ``interval`` seconds (see
        :mod:`hybridmem.chroma.follow`); this store's writes are noted in ``log``. With
        ``snapshots`` a copy is loaded from the user's record snapshot and what was noted
        since, and writers store one when their lease ends (see
        :mod:`hybridmem.replica.copies`)."""
        self._follower = Follower(log, interval=interval)
        self._snapshots = snapshots

    def settle(self, user_id: str) -> None:
        """The user's lease ends after its last write: store a record snapshot of this process's
        copy if one is owed (see :class:`~hybridmem.protocols.Settling`): when the server has
        none this process knows of, or enough was written since the last, or the last was
        written :data:`~hybridmem.protocols.SNAPSHOT_AGE` leases ago (see
        :func:`~hybridmem.chroma.follow.aged`). A process without the user's copy in memory
        stores none, nor one with fewer than :data:`RECORDS_MIN` records. A failure is logged,
        never raised."""
        follower, snapshots = self._follower, self._snapshots
        if follower is None or snapshots is None or self._records is None:
            return
        records = self._records.get(user_id)
        if records is None or len(records) < RECORDS_MIN or not (
                records.snapshot is False
                or records.since >= max(RECORDS_TAIL, len(records) // RECORDS_SHARE)
                or aged(follower.log, user_id, records.snapshot_at)):
            return
        held = follower.log.holding(user_id)
        since = 0
        try:
            with self._user_lock.hold(user_id):
                if self._catch_up(user_id, records, force=True) is None:
                    return
                rows = records.rows_now()
                since, records.since = records.since, 0
            at = None if held is None else (*held, True)
            snapshots.write(user_id, RecordSnapshot(rows=rows, at=at))
            records.snapshot, records.snapshot_at = True, at
        except StorageError as exc:
            records.since += since
            log.warning("record snapshot not stored (%s); loads read every record", exc)

    def refresh(self, user_id: str) -> None:
        """Catch the user's record copy up with other processes' writes now (server mode; see
        :class:`~hybridmem.protocols.Refreshable`)."""
        if self._follower is not None and self._loading is not None:
            self._live()
            records = self._records.get(user_id) if self._records is not None else None
            if records is not None:
                self._catch_up(user_id, records, force=True)

    def _cached(self, user_id: str, *, load: bool = True) -> UserRecords | None:
        """The user's records in memory, or None (no cache, or not loaded yet: read Chroma);
        see :class:`~hybridmem.chroma.record_cache.RecordLoading` for when they are loaded."""
        if self._loading is None or (self._shared and self._follower is None):
            return None
        self._live()
        records = self._loading.get(user_id, load=load)
        if records is not None and self._follower is not None:
            return self._catch_up(user_id, records, force=False)
        return records

    def _catch_up(self, user_id: str, records: UserRecords, *, force: bool) -> UserRecords | None:
        """``records``, caught up with other processes' writes when a check is due (server
        mode), or None when they cannot be: then they are dropped (reloaded at next misses)."""
        follower = self._follower
        assert follower is not None
        if not force and not follower.due(records):
            return records
        with self._user_lock.hold(user_id):
            if not force and not follower.due(records):  # another thread just checked
                return records
            if follower.check(user_id, records, lambda ids: self._server_rows(user_id, ids),
                              fresh=force):
                return records
            log.info("the record copy of a user cannot follow the server's changes; reloading")
            self._drop_cached(user_id)
            return None

    def _server_rows(self, user_id: str, ids: builtins.list[str],
                     ) -> dict[str, tuple[str, Mapping[str, Any]]]:
        """The server's records of ``ids`` (a copy an interrupted move left twice: the one
        :func:`~hybridmem.chroma.layout.resolve` keeps)."""
        return self._both_rows(user_id, lambda c: c.get(
            ids=ids, include=["documents", "metadatas"]))[0]

    def _noted(self, user_id: str, ids: Sequence[str], *, fields_only: bool = False) -> None:
        """Tell the write log (server mode) which memories this store is about to write
        (``fields_only``: an update, which keeps their texts)."""
        if self._follower is not None:
            self._follower.log.note(user_id, ids, fields_only=fields_only)

    def _load(self, user_id: str) -> UserRecords:
        """Every record of both collections (a copy an interrupted move left twice is resolved
        and the loser deleted, see :func:`hybridmem.chroma.layout.resolve`)."""
        records = UserRecords(build=lambda i, d, m: to_item(user_id, i, d, m))
        if self._follower is not None:  # before reading: writes landing meanwhile are redone
            self._follower.start(user_id, records)
            if self._seeded(user_id, records):
                return records
        found, losers = self._both_rows(user_id, lambda c: _chroma.get_paged(
            c, include=["documents", "metadatas"]))
        for archive, ids in losers.items():
            if ids:
                self._run(user_id, "repair", lambda c: c.delete(ids=ids), archive=archive)
        records.put((i, doc, meta) for i, (doc, meta) in found.items())
        return records

    def _seeded(self, user_id: str, records: UserRecords) -> bool:
        """Fill ``records`` from the user's record snapshot and what the lease slots noted since
        its lease (read by id); False, with ``records`` empty, when there is no snapshot or the
        slots cannot say what it lacks (the caller reads every record)."""
        if self._snapshots is None or self._follower is None:
            return False
        try:
            got = self._snapshots.read(user_id)
        except StorageError as exc:
            log.warning("record snapshot of a user not read (%s); reading every record", exc)
            got = None
        records.snapshot = got is not None
        records.snapshot_at = None if got is None else got.at
        if got is None or got.at is None or records.base is None:
            return False
        noted = written_since(self._follower.log, user_id, got.at, records.base)
        if noted is None:
            return False
        tail = sorted(noted_memories(noted))
        found: dict[str, tuple[str, Mapping[str, Any]]] = {}
        for lo in range(0, len(tail), TAIL_CHUNK):
            found.update(self._server_rows(user_id, tail[lo : lo + TAIL_CHUNK]))
        records.put((i, doc, meta) for i, (doc, meta) in got.rows.items() if i not in found)
        records.put((i, doc, meta) for i, (doc, meta) in found.items())
        records.remove(i for i in tail if i not in found)
        records.since = len(tail)
        log.debug("record copy: %d records from a snapshot, %d fetched", len(got.rows), len(tail))
        return True

    def _unsnapshot(self, user_id: str) -> None:
        """Delete the user's record snapshot before a write deletes or replaces a text it may
        hold (a failure fails the write: no copy of the text may outlive it)."""
        if self._snapshots is None:
            return
        cached = self._records.get(user_id) if self._records is not None else None
        if cached is not None and len(cached) < RECORDS_MIN and not cached.snapshot:
            return  # none is stored below that size, and every deletion since one was dropped it
        self._snapshots.drop(user_id)
        if cached is not None:
            cached.snapshot = False

    def _both_rows(self, user_id: str, read: Callable[[Collection], Any],
                   ) -> tuple[dict[str, tuple[str, Mapping[str, Any]]],
                              dict[bool, builtins.list[str]]]:
        """``read`` (a get of documents and metadatas) on both collections: id -> (document,
        metadata), a copy an interrupted move left twice resolved (see
        :func:`hybridmem.chroma.layout.resolve`), and the losers' ids by collection (archive?)."""
        found: dict[str, tuple[bool, str, Mapping[str, Any]]] = {}
        losers: dict[bool, builtins.list[str]] = {False: [], True: []}
        for archive in (False, True):
            got = self._run(user_id, "read the memories", read, archive=archive)
            for id_, doc, meta in _rows(got["ids"], got["documents"], got["metadatas"]) if got else ():
                row = (archive, doc or "", meta or {})
                if id_ in found:
                    row, loser = resolve(found[id_], row)
                    losers[loser[0]].append(id_)
                found[id_] = row
        return {i: (doc, meta) for i, (_, doc, meta) in found.items()}, losers

    def _drop_cached(self, user_id: str) -> None:  # reloaded when next wanted
        self._records.drop(user_id) if self._records is not None else None

    def _item(self, user_id: str, records: UserRecords, id_: str) -> MemoryItem | None:
        return records.item(id_, lambda i, d, m: to_item(user_id, i, d, m))

    # -- writes ---------------------------------------------------------------------------------
    def upsert(
        self, user_id: str, items: Sequence[MemoryItem], embeddings: Sequence[Sequence[float]]
    ) -> None:
        """Insert or replace memories (text, fields and vector) with our embeddings; each goes
        to the collection its ``current`` names (moved out of the other one if it was there)."""
        self._live()
        if len(items) != len(embeddings):
            raise InvalidInputError(f"{len(items)} memories but {len(embeddings)} embeddings")
        if not items:
            return
        records = self._records_of(user_id, items)
        vectors = self._vectors(embeddings)
        with self._user_lock.hold(user_id), self._coherent(user_id):
            self._noted(user_id, [i.id for i in items])  # first: a write that fails part way is noted too
            placed = self._placed(user_id, [i.id for i in items])
            if any(meta.get("text_hash") != r.get("text_hash")
                   for i, r in zip(items, records) for meta in placed.get(i.id, {}).values()):
                self._unsnapshot(user_id)
            for archive in (False, True):
                picked = [n for n, r in enumerate(records) if archived(r) == archive]
                if not picked:
                    continue
                ids = [items[n].id for n in picked]
                docs = [items[n].text for n in picked]
                vecs = [vectors[n] for n in picked]
                recs = [records[n] for n in picked]
                self._run(user_id, "write the memories", lambda c: place.put(
                    c, archive, placed, ids, recs, documents=docs, embeddings=vecs),
                    create=True, archive=archive)
                moved = place.moved_out(placed, ids, archive)
                if moved:  # after the copy landed: a crash in between leaves two copies
                    self._run(user_id, "move memories", lambda c: c.delete(ids=moved),
                              archive=not archive)
            cached = self._records.get(user_id) if self._records is not None else None
            if cached is not None:
                cached.put((i.id, i.text, stored(r)) for i, r in zip(items, records))
                cached.since += len(items)

    def update(self, user_id: str, items: Sequence[MemoryItem]) -> None:
        """Replace the fields of existing memories whose text did not change (documents and
        vectors stay; unknown ids are ignored). A memory that stops (or starts) being current
        moves to the archive (or back): copied first, then removed from where it was."""
        self._live()
        if not items:
            return
        records = self._records_of(user_id, items)
        with self._user_lock.hold(user_id), self._coherent(user_id):
            self._noted(user_id, [i.id for i in items], fields_only=True)  # first: see upsert
            placed = self._placed(user_id, [i.id for i in items])
            where = {i: self._where_is(placed, i) for i in placed}
            for archive in (False, True):
                stay = [(i.id, r) for i, r in zip(items, records)
                        if where.get(i.id) == archive and archived(r) == archive]
                come = [(i.id, r) for i, r in zip(items, records)
                        if where.get(i.id) == (not archive) and archived(r) == archive]
                if stay:
                    ids, recs = [i for i, _ in stay], [r for _, r in stay]
                    self._run(user_id, "update the memories", lambda c: place.refresh(
                        c, archive, placed, ids, recs), archive=archive)
                if come:
                    self._move(user_id, come, placed, to_archive=archive)
            cached = self._records.get(user_id) if self._records is not None else None
            if cached is not None:
                rows = [(i.id, row[0], stored(r)) for i, r in zip(items, records)
                        if (row := cached.row(i.id)) is not None]
                cached.put(rows)
                cached.since += len(rows)

    def _move(self, user_id: str, moving: builtins.list[tuple[str, Record]],
              placed: place.Placed, *, to_archive: bool) -> None:
        """Copy memories (vector, text, new fields) to the other collection, then delete them
        where they were."""
        ids = [i for i, _ in moving]
        got = self._run(user_id, "read the memories", lambda c: c.get(
            ids=ids, include=["embeddings", "documents"]), archive=not to_archive)
        if got is None or not got["ids"]:
            return
        fields = dict(moving)
        found = builtins.list(got["ids"])
        embeddings, docs = got["embeddings"], got["documents"]
        assert embeddings is not None and docs is not None
        recs = [fields[i] for i in found]
        self._run(user_id, "move memories", lambda c: place.put(
            c, to_archive, placed, found, recs, documents=docs, embeddings=embeddings),
            create=True, archive=to_archive)
        self._run(user_id, "move memories", lambda c: c.delete(ids=found),
                  archive=not to_archive)

    def delete(self, user_id: str, ids: Sequence[str]) -> None:
        """Delete memories by id (unknown ids are ignored); their text is purged from the
        embedded store's files within the purge delay (see :meth:`purge`)."""
        self._live()
        if not ids:
            return
        with self._owed(), self._user_lock.hold(user_id), self._coherent(user_id):
            self._noted(user_id, ids)  # first: a write that fails part way is noted too
            placed = self._placed(user_id, ids)
            if placed:
                self._unsnapshot(user_id)
            for archive in (False, True):
                doomed = [i for i in ids if archive in placed.get(i, {})]
                if doomed:
                    self._run(user_id, "delete memories", lambda c: c.delete(ids=doomed),
                              archive=archive)
            cached = self._records.get(user_id) if self._records is not None else None
            if cached is not None:
                cached.remove(ids)
                cached.since += len(ids)

    def drop_user(self, user_id: str) -> None:
        """Delete both of the user's collections (purged as :meth:`delete` says)."""
        self._live()
        with self._owed(), self._user_lock.hold(user_id):
            self._drop_cached(user_id)
            self._unsnapshot(user_id)
            for kind in ("memories", "archive"):
                self._handles.drop(_chroma.collection_name(user_id, kind), user_id=user_id,
                                   what="delete the memories")

    @contextmanager
    def _coherent(self, user_id: str) -> Iterator[None]:
        """Drop the user's cached records if a write fails part way (they are reloaded)."""
        try:
            yield
        except BaseException:
            self._drop_cached(user_id)
            raise

    def _placed(self, user_id: str, ids: Sequence[str]) -> place.Placed:
        """Where each stored id is, with its stored metadata (exact under the user's write
        lock, see :mod:`hybridmem.chroma.placement`); ids stored nowhere are left out."""
        cached = self._cached(user_id, load=False)
        if cached is not None:
            return place.from_cache(cached, ids)
        wanted = builtins.list(dict.fromkeys(ids))
        return place.from_gets(wanted, lambda archive: self._run(
            user_id, "read the memories", lambda c: c.get(ids=wanted, include=["metadatas"]),
            archive=archive))

    @staticmethod
    def _where_is(placed: place.Placed, id_: str) -> bool:
        """The collection of a stored id (the hot copy wins if a crash left two)."""
        return False if False in placed[id_] else True

    def _records_of(self, user_id: str, items: Sequence[MemoryItem]) -> builtins.list[Record]:
        for bad in (i for i in items if i.user_id != user_id):
            raise InvalidInputError(f"memory {bad.id} belongs to {bad.user_id!r}, not {user_id!r}")
        return [to_record(i) for i in items]

    def _vectors(self, embeddings: Sequence[Sequence[float]]) -> builtins.list[Embedding]:
        """Float32 rows, Chroma's own type (it converts lists row by row itself): one conversion
        instead of a ``float()`` per component, 0.4 against 0.95 ms for 64 vectors of 384."""
        for e in embeddings:
            if len(e) != self._dimension:
                raise InvalidInputError(
                    f"an embedding has {len(e)} dimensions but this store holds "
                    f"{self._dimension}-d vectors of {self._embedder_name!r}")
        return builtins.list(np.asarray(embeddings, dtype=np.float32))

    # -- reads ----------------------------------------------------------------------------------
    def get(
        self, user_id: str, ids: Sequence[str], *, where: Filter | None = None
    ) -> builtins.list[MemoryItem]:
        """Memories by id, in the order of ``ids``; missing ids and non-matching ones skipped.
        On a Chroma server these reads go to the server, so a memory another process just
        changed or forgot is read as it is now (searches may lag, see
        :mod:`hybridmem.chroma.follow`)."""
        if self._follower is not None:
            self._live()
            return self._sections(user_id, ids, [where], None)[0] if ids else []
        return self.get_sections(user_id, ids, [where])[0]

    def get_sections(
        self, user_id: str, ids: Sequence[str], wheres: Sequence[Filter | None]
    ) -> builtins.list[builtins.list[MemoryItem]]:
        """For each filter of ``wheres``, the memories of ``ids`` that match it (in the order of
        ``ids``), from one read: context() hydrates the candidates of all its sections at once."""
        self._live()
        if not ids or not wheres:
            return [[] for _ in wheres]
        cached = self._cached(user_id, load=False)
        if cached is not None and self._follower is not None and any(
                cached.row(i) is None for i in ids):
            self._follower.distrust(cached)  # written by another process since the last check
            cached = None
        return self._sections(user_id, ids, wheres, cached)

    def _sections(
        self, user_id: str, ids: Sequence[str], wheres: Sequence[Filter | None],
        cached: UserRecords | None,
    ) -> builtins.list[builtins.list[MemoryItem]]:
        """:meth:`get_sections` from ``cached`` records, or from Chroma when None."""
        if cached is not None:
            # Section by section, each id's record read once. A filter's top-level equalities
            # on system fields to a string or boolean (kind = summary, current = True) are
            # tested with a lookup first, as matches() tests them: most candidates a summaries
            # section gets are refused there, and a filter made of such equalities alone is
            # decided there.
            records = [(i, row[1]) for i in ids if (row := cached.row(i)) is not None]
            out: builtins.list[builtins.list[MemoryItem]] = []
            for where in wheres:
                parts = where.parts if isinstance(where, AllOf) else (where,)
                pins = [(p.field, p.value) for p in parts if isinstance(p, Condition)
                        and p.op == "$eq" and not p.metadata and isinstance(p.value, (str, bool))]
                kept = records
                for name, value in pins:
                    kind = type(value)
                    kept = [(i, m) for i, m in kept if type(v := m.get(name)) is kind and v == value]
                if where is not None and len(pins) < len(parts):
                    kept = [(i, m) for i, m in kept if matches(where, m)]
                out.append([item for i, _m in kept
                            if (item := self._item(user_id, cached, i)) is not None])
            return out
        wanted = builtins.list(dict.fromkeys(ids))
        rows: dict[str, tuple[str | None, Mapping[str, Any] | None]] = {}
        for archive in sorted({part for where in wheres for part in parts_of(where)}):
            missing = [i for i in wanted if i not in rows]
            if not missing:
                break
            got = self._run(user_id, "read the memories", lambda c: c.get(
                ids=missing, include=["documents", "metadatas"]), archive=archive)
            if got is not None:
                rows.update((i, (d, m)) for i, d, m in
                            _rows(got["ids"], got["documents"], got["metadatas"]))
        # filtered here, not by Chroma: its where on a get by ids scans every record
        return [[to_item(user_id, i, *rows[i]) for i in ids
                 if i in rows and matches(where, rows[i][1])] for where in wheres]

    def list(
        self,
        user_id: str,
        *,
        where: Filter | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> builtins.list[MemoryItem]:
        """Memories matching ``where`` (all when None), in storage order."""
        self._live()
        if offset < 0 or (limit is not None and limit < 0):
            raise InvalidInputError("limit and offset must be >= 0")
        if limit == 0:
            return []
        # a bounded listing is one short read (context() asks whether a user has any summary
        # this way): not a miss that loads every record, as an unbounded one is
        cached = self._cached(user_id, load=limit is None)
        if cached is not None:
            out: builtins.list[MemoryItem] = []
            skip = offset
            for i in cached.candidates(where):
                row = cached.row(i)
                if row is None or not matches(where, row[1]):
                    continue
                if skip:
                    skip -= 1
                    continue
                item = self._item(user_id, cached, i)
                if item is not None:
                    out.append(item)
                if limit is not None and len(out) >= limit:
                    break
            return out
        compiled = compile_where(where)
        parts = parts_of(where)
        if len(parts) == 1:  # one collection: Chroma pages
            got = self._run(user_id, "read the memories", lambda c: _chroma.get_paged(
                c, where=compiled, limit=limit, offset=offset,
                include=["documents", "metadatas"]), archive=parts[0])
            return [] if got is None else [
                to_item(user_id, i, d, m)
                for i, d, m in _rows(got["ids"], got["documents"], got["metadatas"])]
        span = None if limit is None else offset + limit
        found: dict[str, MemoryItem] = {}
        for got in self._both(user_id, "read the memories", lambda c: _chroma.get_paged(
                c, where=compiled, limit=span, include=["documents", "metadatas"])):
            for i, d, m in _rows(got["ids"], got["documents"], got["metadatas"]):
                found.setdefault(i, to_item(user_id, i, d, m))
        every = builtins.list(found.values())
        return every[offset:] if limit is None else every[offset : offset + limit]

    def query(
        self,
        user_id: str,
        embeddings: Sequence[Sequence[float]],
        *,
        limit: int,
        where: Filter | None = None,
    ) -> builtins.list[builtins.list[VectorHit]]:
        """One list of the ``limit`` nearest memories (best first, by cosine similarity) per
        query embedding, in one call to Chroma per collection read."""
        self._live()
        if not embeddings:
            return []
        if limit <= 0:
            return [[] for _ in embeddings]
        vectors = self._vectors(embeddings)
        cached = self._cached(user_id)
        # A filter that only pins ``current`` is answered by the collection it names, with no
        # over-fetch. Chroma pre-filters any other where by scanning all metadata (~50 ms at 10k
        # memories), so first ask without it for more neighbours and filter here; only lists
        # that the filter thinned below ``limit`` (while more neighbours exist) are asked again
        # with Chroma's filter.
        fetch = _fetch(limit, where)
        merged: builtins.list[builtins.list[_Found]] = [[] for _ in vectors]
        for archive in parts_of(where):
            lists = self._query(user_id, vectors, fetch, None, archive, cached)
            for n, (vector, rows) in enumerate(zip(vectors, lists)):
                merged[n].extend(self._kept(user_id, vector, rows, fetch, limit, where, archive,
                                            cached))
        return [self._hits(user_id, rows, limit, cached) for rows in merged]

    def query_sections(
        self,
        user_id: str,
        embedding: Sequence[float],
        sections: Sequence[tuple[int, Filter | None]],
    ) -> builtins.list[builtins.list[VectorHit]]:
        """For one query embedding, the nearest memories of each ``(limit, where)`` section,
        as :meth:`query` would give them one by one, from one Chroma query per collection read.

        Why: a context() reads memories, summaries and procedures for the same question; asked
        apart that is a nearest-neighbour search each (an HTTP round trip each on a Chroma
        server). Asked once, with the largest over-fetch any section needs, every section filters
        the same neighbour list; only a section the list leaves short is asked again with its
        own filter (as :meth:`query` does)."""
        self._live()
        if not sections:
            return []
        vector = self._vectors([embedding])[0]
        cached = self._cached(user_id)
        merged: builtins.list[builtins.list[_Found]] = [[] for _ in sections]
        local: set[int] = set()
        if cached is not None:
            for n, (limit, where) in enumerate(sections):
                found = self._nearest_of(user_id, vector, where, cached, limit)
                if found is not None:
                    merged[n] = found
                    local.add(n)
        for archive in (False, True):
            reading = [n for n, (limit, where) in enumerate(sections)
                       if limit > 0 and archive in parts_of(where) and n not in local]
            if not reading:
                continue
            fetch = max(_fetch(*sections[n]) for n in reading)
            rows = self._query(user_id, [vector], fetch, None, archive, cached)[0]
            for n in reading:
                limit, where = sections[n]
                merged[n].extend(self._kept(user_id, vector, rows, fetch, limit, where, archive,
                                            cached))
        return [self._hits(user_id, rows, limit, cached)
                for rows, (limit, _where) in zip(merged, sections)]

    def _nearest_of(self, user_id: str, vector: Embedding, where: Filter | None,
                    cached: UserRecords, limit: int) -> builtins.list[_Found] | None:
        """The ``limit`` records matching ``where`` most similar to ``vector`` (ties at the
        cut kept), with their cosine similarity, computed here; None when ``where`` does not
        narrow the records to at most :data:`LOCAL_SECTION` by an index (Chroma answers then).

        Why: a section that pins a kind (a context()'s summaries, procedures) matches a few
        records among many. Chroma answers it by scanning every record's metadata (~20 ms at
        3,000 memories, each context), or by ids at nearly that cost; the few vectors, fetched
        by id once and kept beside the records as one matrix per section (remade after a write),
        are compared here in a matrix product, exactly."""
        if limit <= 0:
            return None
        key = repr(where)
        block = cached.block(key)
        if block is None:
            version = cached.version
            few = cached.narrowed(where, LOCAL_SECTION)
            if few is None:
                return None
            ids, exact = few
            rows = [(i, row) for i in ids if (row := cached.row(i)) is not None
                    and (exact or matches(where, row[1]))]
            known = cached.known_vectors(i for i, _ in rows)
            missing = [(i, row) for i, row in rows if i not in known]
            for archive in (False, True):
                wanted = [i for i, row in missing if archived(row[1]) == archive]
                if not wanted:
                    continue
                got = self._run(user_id, "read the memory vectors", lambda c: c.get(
                    ids=wanted, include=["embeddings"]), archive=archive)
                embeddings = None if got is None else got["embeddings"]
                if got is None or embeddings is None:
                    continue
                fetched = {i: _unit(e) for i, e in zip(got["ids"], embeddings)}
                cached.keep_vectors(fetched)
                known.update(fetched)
            kept = tuple(i for i, _ in rows if i in known)
            matrix = (np.stack([known[i] for i in kept]) if kept
                      else np.zeros((0, len(vector)), dtype=np.float32))
            block = (version, kept, matrix)
            cached.keep_block(key, block)
        _, kept, matrix = block
        if not kept:
            return []
        similarity = matrix @ _unit(vector)
        if len(kept) > limit:  # the best ``limit``, and any tied with the last of them
            cut = np.partition(-similarity, limit - 1)[limit - 1]
            chosen = np.flatnonzero(-similarity <= cut)
        else:
            chosen = np.arange(len(kept))
        out: builtins.list[_Found] = []
        for j in chosen:
            row = cached.row(kept[j])
            if row is not None:
                out.append((kept[j], row[0], row[1], float(similarity[j])))
        return out

    def _kept(
        self, user_id: str, vector: Embedding, rows: builtins.list[_Found], fetch: int,
        limit: int, where: Filter | None, archive: bool, cached: UserRecords | None,
    ) -> builtins.list[_Found]:
        """The neighbours in ``rows`` that match ``where``; asked again with Chroma's filter
        when they are fewer than ``limit`` while more neighbours exist."""
        kept = [r for r in rows if matches(where, r[2])]
        if len(kept) < limit and len(rows) == fetch and where is not None:
            kept = self._query(user_id, [vector], limit, where, archive, cached)[0]
        return kept

    def _hits(self, user_id: str, rows: builtins.list[_Found], limit: int,
              cached: UserRecords | None) -> builtins.list[VectorHit]:
        """The ``limit`` best of one list's neighbours (from both collections), as hits."""
        rows.sort(key=lambda r: -r[3])
        seen: set[str] = set()
        hits = []
        for i, d, m, s in rows:
            if i in seen:
                continue
            seen.add(i)
            item = (self._item(user_id, cached, i) if cached is not None and
                    cached.row(i) is not None else to_item(user_id, i, d, m))
            if item is not None:
                hits.append(VectorHit(item, s))
            if len(hits) == limit:
                break
        return hits

    def _query(
        self, user_id: str, vectors: builtins.list[Embedding], limit: int,
        where: Filter | None, archive: bool, cached: UserRecords | None,
    ) -> builtins.list[builtins.list[_Found]]:
        """Chroma's nearest neighbours; with the records in memory only ids and distances are
        asked for (documents and metadata come from the cache)."""
        compiled = compile_where(where)
        include: Include = ["distances"] if cached is not None else [
            "documents", "metadatas", "distances"]
        got = self._run(user_id, "search the memories", lambda c: c.query(
            query_embeddings=vectors, n_results=limit, where=compiled, include=include),
            archive=archive)
        if got is None:
            return [[] for _ in vectors]
        docs, metas, dists = got["documents"], got["metadatas"], got["distances"]
        out: builtins.list[builtins.list[_Found]] = []
        for n, ids in enumerate(got["ids"]):
            rows: builtins.list[_Found] = []
            for (i, d, m), dist in zip(
                    _rows(ids, docs[n] if docs else None, metas[n] if metas else None),
                    dists[n] if dists else []):
                if cached is not None:
                    row = cached.row(i)
                    if row is None and self._follower is not None:
                        # written by another process since the last check: read it from the
                        # server this time, and check at the next read
                        self._follower.distrust(cached)
                        return self._query(user_id, vectors, limit, where, archive, None)
                    if row is None:  # not in the copy: it cannot be trusted any more
                        self._drop_cached(user_id)
                        return self._query(user_id, vectors, limit, where, archive, None)
                    d, m = row
                rows.append((i, d, m, 1.0 - float(dist)))
            out.append(rows)
        return out

    def count(self, user_id: str) -> int:
        """How many memories the user has (current and not)."""
        cached = self._cached(user_id, load=False)  # Chroma counts fast: not a miss to load for
        return len(cached) if cached is not None else sum(self._both(user_id, "count the memories", lambda c: c.count()))

    def users(self) -> builtins.list[str]:
        """Every user with a memory collection in this Chroma, sorted."""
        self._live()
        with self._handles.borrowed() as client:
            return _chroma.stored_users(client)

    def reembed_user(
        self,
        user_id: str,
        *,
        embedder: str,
        dimension: int,
        embed: Callable[[Sequence[str]], builtins.list[builtins.list[float]]],
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Move the user's collections to another embedder (see :mod:`hybridmem.chroma.reembed`);
        the caller holds the user's write lock."""
        self._live()
        with self._handles.borrowed() as client:
            return reembed_user(client, user_id, embedder=embedder, dimension=dimension,
                                embed=embed, progress=progress)

    # -- lifecycle ------------------------------------------------------------------------------
    def purge(self) -> None:
        """Make deletions and replaced texts physical now in embedded mode (what and why:
        :func:`hybridmem.chroma.purge.purge_embedded`); a Chroma server manages its own files, so there
        this does nothing (its operator must compact them). Cost: a rewrite of Chroma's SQLite
        file, ~proportional to its size, every user's memories included (see docs/lifecycle.md).

        Erasures do not wait for it: :meth:`delete` and :meth:`drop_user` (and
        :meth:`request_purge`, for a replaced text) leave it to a background
        :class:`~hybridmem.chroma.purge.Compactor`, within ``purge_delay`` seconds (0: at once),
        once for every erasure of that delay; :meth:`close` runs what is owed, and a crash
        leaves a marker that the next open purges."""
        self._live()
        if self._compactor is not None:
            self._compactor.run()

    def request_purge(self) -> None:
        """Purge within the purge delay the text an upsert just replaced (see :meth:`purge`)."""
        self._live()
        if self._compactor is not None:
            self._compactor.request()

    @property
    def purge_pending(self) -> bool:
        """Whether an erasure awaits its purge (embedded; a Chroma server: never)."""
        return self._compactor is not None and self._compactor.pending

    def ping(self) -> None:
        """Raise unless Chroma answers (a heartbeat: no collection is read or created); see
        :class:`~hybridmem.protocols.Pingable`."""
        self._live()
        try:
            with self._handles.borrowed() as client:
                client.heartbeat()
        except Exception as exc:
            raise StorageError(f"Chroma ({self._where}) does not answer: {exc}") from exc

    def report(self) -> StoreReport:
        """Users whose memories collection is open, and the record copy's hits and misses
        (see :class:`~hybridmem.protocols.Reporting`)."""
        loading = self._loading
        return StoreReport(
            open_users=self._handles.cached(_chroma.is_memories_name),
            cache_hits=None if loading is None else loading.hits,
            cache_misses=None if loading is None else loading.misses,
        )

    def _owed(self) -> AbstractContextManager[None]:
        return self._compactor.owed() if self._compactor is not None else nullcontext()

    def _purge_files(self) -> None:
        """The purge itself, with no call to Chroma in flight (Chroma's SQLite connection and
        ours must not touch the file at once, see CollectionHandles.exclusive)."""
        assert self._path is not None
        with self._lock, self._handles.exclusive():
            purge_embedded(self._path)

    def close(self) -> None:
        """Forget cached handles and release the client, then run a purge still owed;
        idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._loading is not None:  # a load in flight uses the client: let it finish first
            self._loading.close()
        if self._compactor is not None:  # its thread ends (after a purge in progress)
            self._compactor.close()
        with self._lock:
            self._handles.clear()
            _chroma.close_client(self._handles.client)
        if self._compactor is not None and self._compactor.pending:
            self._compactor.run()  # with Chroma closed


def _fetch(limit: int, where: Filter | None) -> int:
    """How many neighbours a query of ``limit`` asks Chroma for: more when part of the filter is
    applied here (see :meth:`ChromaVectorStore.query`)."""
    return limit * OVERFETCH if residual(where) is not None else limit


def _unit(vector: Any) -> Any:
    """``vector`` as a float32 array of length 1 (cosine similarity is then a dot product)."""
    array = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(array))
    return array / norm if norm > 0 else array
