"""The graph in server mode: extraction records in the Chroma server, replayed into a graph in
each process.

Several app processes (on several hosts) can serve the same users through one Chroma server. Local
files with a file lock cannot keep them consistent across hosts, so with ``Settings.chroma_url``
the graph is *derived*: every write of a memory's :class:`~hybridmem.models.Extraction` is one
record in the side collection ``g-<user key>`` (:func:`hybridmem.chroma.client.collection_name`),
and each process replays the records into an in-memory
:class:`~hybridmem.graph.store.NetworkXGraphStore`, so the graph logic exists once. A check of
the server lists record ids only (see :mod:`hybridmem.replica.sync`), so a version must show in
the id: a graph record's id is ``<memory id>~<write token>``.

- :class:`ChromaGraphStore` — the :class:`~hybridmem.protocols.GraphStore` of server mode.

The client, collection names, creating, dropping, and reopening a handle whose collection another
process dropped are :mod:`hybridmem.chroma.client`'s, shared with the vector store.
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from functools import partial
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Literal

from hybridmem.chroma import client as _chroma
from hybridmem.chroma.follow import aged, written_since
from hybridmem.errors import InvalidInputError, StorageError
from hybridmem.graph.activation import FOCUS, SESSION, TOPIC, Similar
from hybridmem.graph.fileformat import gc_paused
from hybridmem.graph.state import Links
from hybridmem.graph.store import NetworkXGraphStore
from hybridmem.models import (
    Entity,
    Extraction,
    GraphEntity,
    GraphPath,
    GraphRelation,
    Relation,
    as_utc,
    utcnow,
)
from hybridmem.protocols import GRAPH_NOTE
from hybridmem.replica import snapshot
from hybridmem.replica.sync import BATCH, REFRESH_INTERVAL, ServerCache, UserSync, chunks

if TYPE_CHECKING:
    import networkx as nx
    from chromadb.api import ClientAPI
    from chromadb.api.types import Metadata, PyEmbedding, Where

__all__ = ["ChromaGraphStore"]

log = logging.getLogger(__name__)
SCHEMA = 1
#: Separates the memory id from the write token in a graph record id (tokens are hex, so the last
#: separator is the right one even if an imported memory id contains it).
SEP = "~"
_UNIT = [1.0]  # Chroma wants a vector per record; side records are never searched by vector
#: The metadata key holding a graph record as JSON: ``{"ts", "prev", "extraction"}``.
RECORD = "record"
#: Record times at or beyond this many epoch seconds (year 9999) are read as unknown.
LAST_TS = 253402300800.0
#: The metadata key of the earlier layout holding the extraction alone (``ts`` and ``prev``
#: beside it).
EXTRACTION = "extraction"
#: Records added or removed past the last snapshot before the writer stores a new one: a first
#: read replays at most about this many (see :func:`hybridmem.replica.snapshot.due`).
SNAPSHOT_TAIL = 256


def _memory_of(record_id: str) -> str:
    return record_id.rpartition(SEP)[0]


def _fields(meta: Mapping[str, Any], doc: str | None) -> tuple[float, str, Any]:
    """(time, previous memory id, extraction: a parsed object, or JSON text to parse) of a graph
    record's metadata and document, whichever layout wrote it (see :class:`ChromaGraphStore`).
    What does not parse comes back as text that fails to validate, so the record is skipped."""
    record = meta.get(RECORD)
    if isinstance(record, str):
        try:
            parsed = json.loads(record)
        except ValueError:
            return 0.0, "", record
        if not isinstance(parsed, dict):
            return 0.0, "", record
        ts, prev, data = parsed.get("ts"), parsed.get("prev"), parsed.get("extraction")
        data = data if isinstance(data, dict) else record
    else:
        ts, prev, data = meta.get("ts"), meta.get("prev"), meta.get(EXTRACTION)
        data = data if isinstance(data, str) and data else doc or ""
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not abs(ts) < LAST_TS:
        ts = 0.0  # (NaN fails the comparison too)
    return float(ts), prev if isinstance(prev, str) else "", data


def _snapshots(user_id: str) -> str:
    return _chroma.collection_name(user_id, "snapshot")


def _of_memories(memory_ids: Sequence[str]) -> Where:
    """Chroma's filter for the graph records of these memories."""
    among: dict[Literal["$in", "$nin"], list[str | int | float | bool]] = {"$in": [*memory_ids]}
    return {"memory_id": among}


class ChromaGraphStore(ServerCache):
    """:class:`~hybridmem.protocols.GraphStore` for server mode: extraction records in Chroma, the
    graph a per-process cache rebuilt from them.

    A record: id ``<memory id>~<token>`` (a fresh uuid per write), no document, and two
    metadata keys: ``memory_id`` (what deletes filter on) and ``record``, one JSON object with
    ``ts`` (epoch seconds: first/last seen, so every process derives the same times), ``prev``
    (see :meth:`add_extractions`) and ``extraction``. Two keys because the server indexes every
    metadata key of every record: a batch of 500 records cost it ~0.1 s with five keys, ~0.06 s
    with two, and the upload overlaps the resolving of the batch only when it is the shorter.
    The extraction is in metadata because Chroma indexes every document for full-text search,
    at about three times the cost of the same bytes as metadata (see
    :mod:`hybridmem.replica.snapshot`). Records of earlier layouts are read too: ``extraction``,
    ``ts`` and ``prev`` as keys of their own, or the extraction JSON as the document. Like
    :class:`~hybridmem.graph.store.NetworkXGraphStore`, adding is additive and removing a memory
    removes all its records. A check lists record ids; new ones are
    fetched and replayed, and a memory that lost records is removed and replayed from what is left.
    Entity display names are the first surface form *this process* replayed, so two processes can
    name a node differently while agreeing on its key, edges and memories.
    """

    def __init__(self, *, client: ClientAPI | _chroma.CollectionHandles | None = None,
                 url: str | None = None,
                 refresh_interval: float = REFRESH_INTERVAL, focus: float = FOCUS,
                 session: float = SESSION) -> None:
        super().__init__(client=client, url=url, refresh_interval=refresh_interval,
                         name_of=partial(_chroma.collection_name, kind="graph"))
        self._cache = NetworkXGraphStore(None, focus=focus, session=session)
        #: uploads of graph records, which overlap with resolving them into the cache
        self._workers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="hybridmem-graph")

    # -- writes ----------------------------------------------------------------------------------
    def add_extraction(self, user_id: str, memory_id: str, extraction: Extraction, *,
                       at: datetime | None = None) -> None:
        """Add one memory's entities and relations."""
        self.add_extractions(user_id, [(memory_id, extraction)], at=at)

    def add_extractions(self, user_id: str, items: Sequence[tuple[str, Extraction]], *,
                        at: datetime | None = None, links: Links = True) -> None:
        """Write one record per item, then apply them to this process's cache. Each record
        names in ``prev`` the memory linked just before it ("" for none), so a process that
        replays the records rebuilds the same episodic links."""
        if not items:
            return
        when = as_utc(at or utcnow())
        if links is True:
            before = {b: a for a, b in pairwise(dict.fromkeys(m for m, _ in items))}
        else:
            before = {} if links is False else {b: a for a, b in links}
        tokens = [uuid.uuid4().hex for _ in items]
        ids = [f"{mid}{SEP}{tok}" for (mid, _), tok in zip(items, tokens)]
        stamp = json.dumps(when.timestamp())
        metas: list[Metadata] = [
            {"memory_id": mid, RECORD: f'{{"ts":{stamp},"prev":{json.dumps(before.get(mid, ""))},'
                                       f'"extraction":{e.model_dump_json()}}}'}
            for mid, e in items
        ]
        units: list[PyEmbedding] = [_UNIT] * len(ids)
        st = self._state(user_id)
        created: _chroma.CollectionMeta = {
            "user_id": user_id, "kind": "hybridmem-graph", "schema": SCHEMA
        }
        def store() -> None:
            for lo in range(0, len(ids), BATCH):
                hi = lo + BATCH
                self._run(user_id, "store the graph", lambda c: c.upsert(
                    ids=ids[lo:hi], embeddings=units[lo:hi], metadatas=metas[lo:hi],
                ), create=created)

        with st.lock:
            self._note(user_id, [GRAPH_NOTE + i for i in ids])  # first: see the vector store's
            # a snapshot due after this write is made while the records travel, from the cache
            # checked before them (under the lease nobody writes in between), and stored once
            # they landed
            compact = snapshot.due(st.since_snap + len(ids), len(st.snap_covers),
                                   minimum=SNAPSHOT_TAIL) and self._checked(user_id)
            # the records travel while this thread resolves them into the cache (a 500-memory
            # batch: ~1 s of each), then the write waits for both
            upload = self._workers.submit(store)
            raw = None
            try:
                self._cache.add_extractions(user_id, items, at=when, links=links)
                if compact:
                    with gc_paused():  # the collector would walk the whole graph, again and again
                        raw = self._cache.snapshot(user_id)
            finally:
                failure = upload.exception()
            if failure is not None:
                self._restart(user_id, st)  # the cache holds what the server may not
                try:  # best effort, so a failed add leaves no half-written batch
                    for part in chunks(ids):
                        self._run(user_id, "undo a graph write", lambda c: c.delete(ids=list(part)))
                except StorageError:
                    log.warning("could not undo a failed graph write; checks replay what landed")
                raise failure
            st.record_ids.update(ids)
            st.since_snap += len(ids)
            if raw is not None:
                self._store_snapshot(user_id, st, raw)

    def remove_memory(
        self, user_id: str, memory_ids: Sequence[str], *, erase: bool = False
    ) -> None:
        """Delete every record of the memories (whoever wrote them) and drop them from the cache
        (records are deleted either way, so ``erase`` changes nothing here)."""
        mids = list(dict.fromkeys(memory_ids))
        if not mids:
            return
        st = self._state(user_id)
        with st.lock:
            gone = set(mids)  # under the lease the cache knows every record (see WriteLocks)
            self._note(user_id, [GRAPH_NOTE + r for r in st.record_ids if _memory_of(r) in gone])
            for part in chunks(mids):
                where = _of_memories(part)
                self._run(user_id, "delete graph records", lambda c: c.delete(where=where))
            self._cache.remove_memory(user_id, mids)
            st.record_ids = {r for r in st.record_ids if _memory_of(r) not in gone}
            st.since_snap += len(mids)
            if erase:  # no snapshot may keep what a forgotten memory said
                self._erase_from_snapshot(user_id, st, gone)
            else:
                self._compact(user_id, st)

    def import_graph(self, user_id: str, data: Mapping[str, Any]) -> None:
        """Replace the user's graph with an export: it is split back into per-memory extractions
        (entities, relations, supporting memories and confidences survive; first/last seen become
        the import time)."""
        scratch = NetworkXGraphStore(None)
        scratch.import_graph(user_id, dict(data))  # validates; InvalidInputError when malformed
        exported = scratch.export(user_id)["graph"]
        items = _extractions_of(exported)
        episodes = sorted(exported["graph"].get("next", {}).items())  # the export's own links
        linked = dict.fromkeys(m for link in episodes for m in link)
        known = {m for m, _ in items}
        items += [(m, Extraction(extractor="import")) for m in linked if m not in known]
        st = self._state(user_id)
        with st.lock:
            listed = self._record_ids(user_id)
            self._note(user_id, [GRAPH_NOTE + r for r in listed])
            # the snapshot describes the graph being replaced: a first look from it (this
            # process's own, below) would not see this lease's deletes, which its release lists
            self._handles.run(_snapshots(user_id), snapshot.drop_graph, user_id=user_id,
                              what="delete the graph snapshot")
            st.snap, st.snap_covers, st.snap_at, st.since_snap = None, frozenset(), None, 0
            for part in chunks(listed):
                self._run(user_id, "replace the graph", lambda c: c.delete(ids=list(part)))
            self._cache.drop_user(user_id)
            st.record_ids.clear()
            st.checked = None  # the next read replays what others wrote meanwhile
            self.add_extractions(user_id, items, links=episodes)

    def drop_user(self, user_id: str) -> None:
        """Delete the user's side collection and cached graph."""
        st = self._state(user_id)
        with st.lock:
            self._handles.drop(self._name_of(user_id), user_id=user_id, what="delete the graph")
            self._handles.drop(_snapshots(user_id), user_id=user_id,
                               what="delete the graph snapshot")
            st.checked = None
            st.record_ids.clear()
            st.snap, st.snap_covers, st.snap_at, st.since_snap = None, frozenset(), None, 0
            self._cache.drop_user(user_id)

    def settle(self, user_id: str) -> None:
        """The user's lease ends. A snapshot this lease stored mid-write, with no graph record
        written after it, is marked as its lease's last graph write (see
        :func:`hybridmem.replica.snapshot.finish`): a first look from it then reads no record of
        that lease (a batch of 500 memories: 500 record ids asked for, one request, on every
        fresh process's first look). Otherwise the snapshot is stored again if the one this
        process knows was written :data:`~hybridmem.protocols.SNAPSHOT_AGE` leases ago (see
        :func:`~hybridmem.chroma.follow.aged`), so its lease slot is never tidied away while it
        is the current one: leases that write no graph record (access counts, field updates)
        make no snapshot due otherwise. A failure is logged, never raised (see
        :class:`~hybridmem.protocols.Settling`)."""
        st = self._state(user_id)
        with st.lock:
            if st.checked is None or st.snap is None or self._log is None:
                return
            held, at = self._log.holding(user_id), st.snap_at
            if held is not None and at is not None and not at[2] and at[:2] == held \
                    and st.since_snap == 0:  # stored in this lease, the last graph write of it
                snap = st.snap
                try:
                    self._handles.run(_snapshots(user_id), lambda c: snapshot.finish(c, snap),
                                      user_id=user_id, what="mark the graph snapshot")
                except StorageError as exc:
                    log.warning("graph snapshot not marked (%s); first looks read more", exc)
                    return
                st.snap_at = (*held, True)
            elif aged(self._log, user_id, at):
                self._compact(user_id, st, force=True)

    def close(self) -> None:
        """Forget the caches; idempotent. The server keeps everything."""
        if self._close():
            self._workers.shutdown(wait=True)
            self._cache.close()

    def _restart(self, user_id: str, st: UserSync) -> None:
        """Drop the user's cache: the next read loads it again from the server."""
        self._cache.drop_user(user_id)
        st.record_ids = set()
        st.checked = st.marker = None
        st.snap, st.snap_covers, st.snap_at, st.since_snap = None, frozenset(), None, 0

    # -- sync ------------------------------------------------------------------------------------
    def refresh(self, user_id: str) -> None:
        """Check the server now, whatever the refresh interval."""
        self._sync(user_id, force=True)

    def _sync(self, user_id: str, *, force: bool = False) -> UserSync:
        """Check the server when due (see the module docstring). A first look at the user
        starts from the snapshot: read on a worker while the lease slots are read, and parsed
        on a worker while the records noted since are asked for, so its round trips overlap."""
        st = self._state(user_id)
        with st.lock:
            if not self._due(st, force):
                return st
            started = time.monotonic()
            first = st.checked is None
            reading = self._workers.submit(contextvars.copy_context().run, self._read_snapshot,
                                           user_id) if first else None
            marker, view = self._look(user_id, fresh=force)
            if not first and marker is not None and marker == st.marker:
                st.checked = started  # nobody took the lease since the last check: no change
                return st
            noted = None if marker is None else self._written(user_id, st, view)
            got = reading.result() if reading is not None else None
            restoring: Future[bool] | None = None
            if got is not None:
                restoring = self._workers.submit(contextvars.copy_context().run,
                                                 self._cache_restore, user_id, got)
                st.record_ids = set(got.covers)
                if got.at is not None and view is not None and self._log is not None:
                    noted = written_since(self._log, user_id, got.at, view)
            listed: list[str] = []
            present: set[str] = set()
            listing: set[str] | None = None
            try:
                if noted is not None:  # the graph records the slots list: O(changes)
                    listed = sorted(i[len(GRAPH_NOTE):] for i in noted
                                    if i.startswith(GRAPH_NOTE))
                    present = {i for part in chunks(listed)
                               for i in self._present(user_id, part)}
                else:
                    listing = set(self._record_ids(user_id))
            except BaseException:  # a half-made first look is not left to a worker: dropped
                if restoring is not None:
                    restoring.exception()  # waits for it
                    self._restart(user_id, st)
                raise
            if restoring is not None and not restoring.result():  # replay every record instead
                st.record_ids, noted = set(), None
                listing = set(self._record_ids(user_id)) if listing is None else listing
            elif got is not None:
                st.snap, st.snap_covers, st.snap_at, st.since_snap = \
                    got.snap, got.covers, got.at, 0
            if listing is None:
                gone = {r for r in listed if r not in present and r in st.record_ids}
                new = present - st.record_ids
                remote = (st.record_ids - gone) | new
            else:
                remote = listing
                gone, new = st.record_ids - remote, remote - st.record_ids
            if gone or new:
                self._apply(user_id, st, remote, gone, new)
            st.checked, st.marker, st.slots = started, marker, view
            return st

    def _present(self, user_id: str, ids: Sequence[str]) -> list[str]:
        """Those of the graph record ``ids`` the server holds."""
        got = self._run(user_id, "read graph records", lambda c: c.get(ids=list(ids), include=[]))
        return got["ids"] if got else []

    # -- snapshots (see hybridmem.replica.snapshot) ----------------------------------------------
    def _read_snapshot(self, user_id: str) -> snapshot.Snapshot | None:
        """The server's snapshot of the user, if there is a usable one (a failure is logged:
        the first look then replays every record). It names the records it covers and the
        lease it was stored under: the check that starts from it replays only what the slots
        noted after that lease, or else what a listing of the records shows it lacks."""
        try:
            return self._handles.run(_snapshots(user_id), snapshot.read, user_id=user_id,
                                     what="read the graph snapshot")
        except StorageError as exc:
            log.warning("graph snapshot of a user not read (%s); replaying its records", exc)
            return None

    def _cache_restore(self, user_id: str, got: snapshot.Snapshot) -> bool:
        """Load snapshot ``got`` into the cache; False (and nothing loaded) when it does not
        parse."""
        try:
            self._cache.restore(user_id, got.graph)
        except ValueError as exc:  # InvalidInputError and JSON errors are ValueErrors
            log.warning("ignoring graph snapshot %s (%s); replaying records", got.snap, exc)
            self._cache.drop_user(user_id)
            return False
        return True

    def _compact(self, user_id: str, st: UserSync, *, force: bool = False) -> None:
        """Store a new snapshot when enough was written since the last (call with ``st.lock``
        and, as every graph write, the user's lease held, so nobody writes meanwhile). The cache
        is checked against the server first, so the snapshot is exactly the replay of the records
        it covers. It is stored before the write returns, so before the lease is released: a
        snapshot stored later could land over a newer one written without a forgotten memory.
        A failure is logged: a snapshot only saves work."""
        if not force and not snapshot.due(st.since_snap, len(st.snap_covers),
                                          minimum=SNAPSHOT_TAIL):
            return
        if not self._checked(user_id):
            return
        with gc_paused():  # the collector would walk the whole graph, again and again
            raw = self._cache.snapshot(user_id)
        self._store_snapshot(user_id, st, raw)

    def _checked(self, user_id: str) -> bool:
        """Check the cache against the server before a snapshot is made of it; False (logged)
        when the server cannot be read: then no snapshot is stored."""
        try:
            self._sync(user_id, force=True)
        except StorageError as exc:
            log.warning("graph snapshot not stored (%s); readers replay more records", exc)
            return False
        return True

    def _store_snapshot(self, user_id: str, st: UserSync, raw: bytes) -> None:
        """Store ``raw``, the cache's snapshot, as covering every record the cache holds (see
        :meth:`_compact`). A failure is logged."""
        covers = sorted(st.record_ids)
        snap = snapshot.new_id()
        held = self._log.holding(user_id) if self._log is not None else None
        at = None if held is None else (*held, False)  # mid-lease: its own notes may follow
        created = snapshot.collection_meta(user_id)
        try:
            self._handles.run(_snapshots(user_id),
                              lambda c: snapshot.write(c, snap, covers, raw, at),
                              user_id=user_id, what="store the graph snapshot", create=created)
        except StorageError as exc:
            log.warning("graph snapshot not stored (%s); readers replay more records", exc)
            return
        st.snap, st.snap_covers, st.snap_at, st.since_snap = snap, frozenset(covers), at, 0

    def _erase_from_snapshot(self, user_id: str, st: UserSync, gone: set[str]) -> None:
        """After forgetting memories: rewrite the snapshot unless this process knows the
        current one and it covers none of them (a forgotten memory's entities must not survive
        in the server)."""
        head = self._handles.run(_snapshots(user_id), lambda c: c.get(
            ids=[snapshot.HEAD], include=["metadatas"]), user_id=user_id,
            what="read the graph snapshot")
        metas = head["metadatas"] or [] if head is not None else []
        current = (metas[0] or {}).get("snap") if metas else None
        if current is None:
            return  # no snapshot: nothing to erase
        known = current == st.snap and not any(_memory_of(r) in gone for r in st.snap_covers)
        if not known:
            self._compact(user_id, st, force=True)

    def _record_ids(self, user_id: str) -> list[str]:
        """The ids of the user's graph records in the server (the cheapest listing there is)."""
        listing = self._run(user_id, "list graph records", lambda c: c.get(include=[]))
        return listing["ids"] if listing else []

    def _apply(
        self, user_id: str, st: UserSync, remote: set[str], gone: set[str], new: set[str]
    ) -> None:
        """Replay new records; memories that lost records are removed and replayed from the rest."""
        rebuild = {_memory_of(r) for r in gone}
        wanted = new | {r for r in remote & st.record_ids if _memory_of(r) in rebuild}
        rows: list[tuple[float, str, Any, str]] = []
        for part in chunks(sorted(wanted)):
            got = self._run(user_id, "read graph records", lambda c: c.get(
                ids=list(part), include=["documents", "metadatas"]
            ))
            if not got:
                continue
            for rid, doc, meta in zip(got["ids"], got["documents"] or [], got["metadatas"] or []):
                rows.append((*_fields(meta or {}, doc), rid))
        if rebuild:
            self._cache.remove_memory(user_id, sorted(rebuild))
            st.record_ids = {r for r in st.record_ids if _memory_of(r) not in rebuild}
        st.since_snap += len(new) + len(rebuild)
        rows.sort(key=lambda row: (row[0], row[3]))  # write order: every process replays alike
        for ts, prev, data, rid in rows:
            try:
                extraction = (Extraction.model_validate(data) if isinstance(data, dict)
                              else Extraction.model_validate_json(data))
            except ValueError:
                log.warning("skipping an unreadable graph record %s", rid)
            else:
                at = datetime.fromtimestamp(ts, tz=timezone.utc) if ts else None
                mid = _memory_of(rid)
                self._cache.add_extractions(user_id, [(mid, extraction)], at=at,
                                            links=[(prev, mid)] if prev else False)
            st.record_ids.add(rid)
        log.debug("graph cache: %d records replayed, %d memories rebuilt", len(rows), len(rebuild))

    # -- reads: the cache, after a check of the server if one is due -------------------------------
    def entities_in(self, user_id: str, text: str) -> list[str]:
        with self._sync(user_id).lock:
            return self._cache.entities_in(user_id, text)

    def neighbourhood(
        self, user_id: str, entities: Sequence[str], *, hops: int
    ) -> dict[str, tuple[int, str]]:
        with self._sync(user_id).lock:
            return self._cache.neighbourhood(user_id, entities, hops=hops)

    def activation(
        self, user_id: str, seeds: Sequence[tuple[str, float]], query: str, *, hops: int = 1,
        episodic: float = 0.5, topic: float = TOPIC, similar: Similar | None = None,
        linked: Sequence[tuple[str, float]] = (),
    ) -> dict[str, tuple[float, int, str]]:
        with self._sync(user_id).lock:
            return self._cache.activation(user_id, seeds, query, hops=hops, episodic=episodic,
                                          topic=topic, similar=similar, linked=linked)

    def entities_of(self, user_id: str, memory_ids: Sequence[str]) -> list[str]:
        with self._sync(user_id).lock:
            return self._cache.entities_of(user_id, memory_ids)

    def entity(self, user_id: str, name: str) -> GraphEntity | None:
        with self._sync(user_id).lock:
            return self._cache.entity(user_id, name)

    def entities(self, user_id: str) -> list[GraphEntity]:
        with self._sync(user_id).lock:
            return self._cache.entities(user_id)

    def relations(
        self, user_id: str, memory_ids: Sequence[str] | None = None
    ) -> list[GraphRelation]:
        with self._sync(user_id).lock:
            return self._cache.relations(user_id, memory_ids)

    def query_path(self, user_id: str, a: str, b: str, *, max_depth: int = 3) -> list[str]:
        with self._sync(user_id).lock:
            return self._cache.query_path(user_id, a, b, max_depth=max_depth)

    def query_paths(self, user_id: str, a: str, b: str, *, k: int,
                    max_depth: int = 3) -> list[GraphPath]:
        with self._sync(user_id).lock:
            return self._cache.query_paths(user_id, a, b, k=k, max_depth=max_depth)

    def export(self, user_id: str) -> dict[str, Any]:
        with self._sync(user_id).lock:
            return self._cache.export(user_id)

    def graph(self, user_id: str, memory_ids: Sequence[str] | None = None) -> nx.DiGraph[str]:
        with self._sync(user_id).lock:
            return self._cache.graph(user_id, memory_ids)


def _extractions_of(graph: dict[str, Any]) -> list[tuple[str, Extraction]]:
    """Split a node-link graph back into the extractions of the memories that support it."""
    names = {n["id"]: n["name"] for n in graph["nodes"]}
    found: dict[str, tuple[list[Entity], list[Relation]]] = {}
    try:
        for node in graph["nodes"]:
            entity = Entity(name=node["name"], type=node["type"])
            for mid in node["memory_ids"]:
                found.setdefault(mid, ([], []))[0].append(entity)
        for edge in graph["edges"]:
            for pred, support in edge["evidence"].items():
                for mid, conf in support.items():
                    found.setdefault(mid, ([], []))[1].append(Relation(
                        subject=names[edge["source"]], predicate=pred,
                        object=names[edge["target"]], confidence=conf,
                    ))
    except ValueError as exc:  # pydantic's ValidationError
        raise InvalidInputError(f"cannot import graph: {exc}") from exc
    return [
        (mid, Extraction(entities=ents, relations=rels, extractor="import"))
        for mid, (ents, rels) in sorted(found.items())
    ]
