"""An in-memory copy of each open user's vector-store records, so the read path hydrates
candidates, and answers filtered listings, with dict lookups instead of Chroma round trips.

Why: a search gathers candidates from three retrievers; those the vector query did not return
(lexical and graph ones) had to be fetched from Chroma by id (6–9 ms at 10k memories), and every
``list(where=...)`` (key facts, dedup by text hash, summaries) made Chroma scan every record's
metadata (~60 ms at 10k). With the copy both are microseconds.

Coherence: the copy is *exact* only while its store is the only writer of the user's
collections. That holds in embedded mode, where :class:`~hybridmem.runtime.locks.DataDirLock` keeps the
data dir to one process and every write of that process goes through the one
:class:`~hybridmem.chroma.vector.ChromaVectorStore` (which updates the copy after each successful Chroma
write, and drops it when a write fails part way). A Chroma server is shared by processes this one
cannot see: there the copy is caught up with their writes through the users' write leases
(:mod:`hybridmem.chroma.follow`), within the refresh interval.

A user's copy is loaded whole on first use (10k memories: ~0.3 s; the layout is the vector
store's: id -> (document, flat metadata)) and the least recently used users beyond ``max_users``
are dropped (the same bound as open collection handles, ``Settings.max_open_users``). Items are
built from a record once and memoised (:class:`~hybridmem.models.MemoryItem` is frozen).
A few fields are indexed (:data:`INDEXED`), so a filter that pins one of them by equality, as
"current key facts" or "these text hashes" do, looks at the matching records only.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from hybridmem.errors import ClosedError
from hybridmem.filters import AllOf, Condition, Filter
from hybridmem.models import MemoryItem
from hybridmem.protocols import WriteSlot

__all__ = ["INDEXED", "MAX_BLOCKS", "RecordCache", "RecordLoading", "UserRecords"]

log = logging.getLogger(__name__)

#: Section blocks kept per user (one per distinct section filter: a context() uses two).
MAX_BLOCKS = 8
#: Metadata fields indexed by value: those the library's own filters pin by equality.
INDEXED = ("current", "kind", "has_key", "text_hash", "key")


@dataclass
class _Row:
    document: str
    meta: Mapping[str, Any]
    item: MemoryItem | None = None


@dataclass
class UserRecords:
    """One user's records (both of the vector store's collections), safe to share between
    threads: every method takes the copy's own lock."""

    rows: dict[str, _Row] = field(default_factory=dict)
    index: dict[tuple[str, Any], set[str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: ``build(id, document, meta)``: when set, each record's item is built as it is put (in
    #: the background load), so a search never builds one: first builds of candidates were 15 %
    #: of a context() at 10k memories. A record that cannot be built is left to fail when read.
    build: Callable[[str, str, Mapping[str, Any]], MemoryItem] | None = None
    #: Embeddings the read path fetched (id -> unit vector), for the few records a section
    #: ranks here rather than in Chroma (see ChromaVectorStore.query_sections); a record put or
    #: removed loses its vector, so a changed text is fetched again.
    vectors: dict[str, Any] = field(default_factory=dict)
    #: Bumped by every put and remove: a block below is valid while it has not moved.
    version: int = 0
    #: Per section filter: (version, ids, their unit vectors stacked), so a section of 2,000
    #: summaries is one matrix product, not 2,000 dict lookups and a stack, per context.
    blocks: OrderedDict[str, tuple[int, tuple[str, ...], Any]] = field(
        default_factory=OrderedDict)
    #: On a shared Chroma server (see hybridmem.chroma.follow): the user's lease slots as the
    #: copy last caught up with them, and when (monotonic).
    base: dict[int, WriteSlot] | None = None
    checked: float = 0.0
    #: On a shared Chroma server: records this process wrote since the copy was loaded or its
    #: last record snapshot was stored, and whether the server has a record snapshot, as this
    #: process last knew (None: unknown), and the lease it was written under when known (see
    #: hybridmem.chroma.follow.aged); see hybridmem.replica.copies.
    since: int = 0
    snapshot: bool | None = None
    snapshot_at: tuple[int, str, bool] | None = None

    def put(self, rows: Iterable[tuple[str, str, Mapping[str, Any]]]) -> None:
        """Insert or replace records (id, document, metadata)."""
        with self.lock:
            self.version += 1
            for id_, doc, meta in rows:
                self._remove(id_)
                self.rows[id_] = _Row(doc, meta, self._built(id_, doc, meta))
                for name in INDEXED:
                    if name in meta and meta[name] is not None:
                        self.index.setdefault(_key(name, meta[name]), set()).add(id_)

    def _built(self, id_: str, doc: str, meta: Mapping[str, Any]) -> MemoryItem | None:
        if self.build is None:
            return None
        try:
            return self.build(id_, doc, meta)
        except Exception:  # a corrupt record raises when it is read, as without a build
            return None

    def remove(self, ids: Iterable[str]) -> None:
        with self.lock:
            self.version += 1
            for id_ in ids:
                self._remove(id_)

    def _remove(self, id_: str) -> None:
        self.vectors.pop(id_, None)
        old = self.rows.pop(id_, None)
        if old is None:
            return
        for name in INDEXED:
            if name in old.meta and old.meta[name] is not None:
                bucket = self.index.get(_key(name, old.meta[name]))
                if bucket is not None:
                    bucket.discard(id_)

    def rows_now(self) -> dict[str, tuple[str, Mapping[str, Any]]]:
        """Every record (id -> (document, metadata)) as of now."""
        with self.lock:
            return {i: (row.document, row.meta) for i, row in self.rows.items()}

    def row(self, id_: str) -> tuple[str, Mapping[str, Any]] | None:
        with self.lock:
            row = self.rows.get(id_)
            return None if row is None else (row.document, row.meta)

    def item(self, id_: str, build: Any) -> MemoryItem | None:
        """The record as an item (``build(id, document, meta)`` once, then memoised)."""
        with self.lock:
            row = self.rows.get(id_)
        if row is None:
            return None
        if row.item is None:
            row.item = build(id_, row.document, row.meta)
        return row.item

    def known_vectors(self, ids: Iterable[str]) -> dict[str, Any]:
        """The fetched vectors of ``ids`` (those not fetched yet are left out)."""
        with self.lock:
            return {i: v for i in ids if (v := self.vectors.get(i)) is not None}

    def keep_vectors(self, vectors: Mapping[str, Any]) -> None:
        """Keep fetched vectors of records the copy holds (others changed meanwhile)."""
        with self.lock:
            self.vectors.update((i, v) for i, v in vectors.items() if i in self.rows)

    def narrowed(self, where: Filter | None, at_most: int) -> tuple[list[str], bool] | None:
        """The ids that may match ``where`` when its indexed equalities, one of them not on
        ``current`` (a kind, a key), narrow them to at most ``at_most`` — the few records a
        section may rank here — sorted, and whether those equalities are the whole filter (then
        every id matches); else None."""
        pinned = _pinned(where)
        if not any(c.field != "current" for c in pinned):
            return None
        with self.lock:  # smallest bucket first; the big ones (current) are only probed
            buckets: list[set[str]] = []
            for cond in pinned:
                values = cond.value if isinstance(cond.value, tuple) else (cond.value,)
                if len(values) == 1:
                    buckets.append(self.index.get(_key(cond.field, values[0]), set()))
                else:
                    buckets.append(set().union(
                        *(self.index.get(_key(cond.field, v), set()) for v in values)))
            buckets.sort(key=len)
            if len(buckets[0]) > at_most:
                return None
            found = {i for i in buckets[0] if all(i in b for b in buckets[1:])}
        assert where is not None
        if len(found) > at_most:
            return None
        parts = where.parts if isinstance(where, AllOf) else (where,)
        return sorted(found), all(p in pinned for p in parts)

    def block(self, key: str) -> tuple[int, tuple[str, ...], Any] | None:
        """The block kept for ``key`` if no record changed since it was made."""
        with self.lock:
            kept = self.blocks.get(key)
            if kept is None or kept[0] != self.version:
                return None
            self.blocks.move_to_end(key)
            return kept

    def keep_block(self, key: str, block: tuple[int, tuple[str, ...], Any]) -> None:
        """Keep a block made at ``block[0]`` (the version read before making it); the least
        recently used beyond :data:`MAX_BLOCKS` go."""
        with self.lock:
            self.blocks[key] = block
            self.blocks.move_to_end(key)
            while len(self.blocks) > MAX_BLOCKS:
                self.blocks.popitem(last=False)

    def candidates(self, where: Filter | None) -> list[str]:
        """Ids that may match ``where`` (a superset; the caller evaluates the filter): the
        smallest index bucket a top-level equality pins (sorted by id), else every id in insertion
        order; deterministic for one state, so pages of one listing do not overlap."""
        with self.lock:
            best: set[str] | None = None
            for cond in _pinned(where):
                values = cond.value if isinstance(cond.value, tuple) else (cond.value,)
                bucket = (self.index.get(_key(cond.field, values[0]), set())
                          if len(values) == 1 else  # (not copied: ``current`` holds them all)
                          set().union(*(self.index.get(_key(cond.field, v), set())
                                        for v in values)))
                if best is None or len(bucket) < len(best):
                    best = bucket
            return list(self.rows) if best is None else sorted(best)

    def __len__(self) -> int:
        return len(self.rows)


def _key(name: str, value: Any) -> tuple[str, Any]:
    # Chroma's equality: numbers across int and float, booleans and strings only with their own
    return (name, ("b", value) if isinstance(value, bool) else value)


def _pinned(where: Filter | None) -> list[Condition]:
    """Top-level ``$eq`` / ``$in`` conditions on indexed system fields."""
    if where is None:
        return []
    parts = where.parts if isinstance(where, AllOf) else (where,)
    return [p for p in parts if isinstance(p, Condition) and not p.metadata
            and p.field in INDEXED and p.op in ("$eq", "$in")]


class RecordCache:
    """Users' :class:`UserRecords`, least recently used first, at most ``max_users`` of them."""

    def __init__(self, max_users: int) -> None:
        self._users: OrderedDict[str, UserRecords] = OrderedDict()
        self._max = max(1, max_users)
        self._guard = threading.Lock()

    def __repr__(self) -> str:
        return f"RecordCache(users={len(self._users)}, max_users={self._max})"

    def get(self, user_id: str) -> UserRecords | None:
        with self._guard:
            records = self._users.get(user_id)
            if records is not None:
                self._users.move_to_end(user_id)
            return records

    def put(self, user_id: str, records: UserRecords) -> None:
        with self._guard:
            self._users[user_id] = records
            self._users.move_to_end(user_id)
            while len(self._users) > self._max:
                self._users.popitem(last=False)

    def drop(self, user_id: str) -> None:
        with self._guard:
            self._users.pop(user_id, None)

    def clear(self) -> None:
        with self._guard:
            self._users.clear()


class RecordLoading:
    """When a user's records enter the cache: at the user's second miss, in a background thread
    (or at once with ``background=False``), never while another writer shares the files.

    Why the second miss: a one-shot CLI search should not pay for loading every record of the
    user. Reads by id and bounded listings (``load=False``; context()'s section questions are
    such listings) are no misses, so a user's first context() does not share the machine with
    the load either. The load holds the user's write lock (``hold``), so
    writes wait for it and none is missed. ``load(user_id)`` reads the user's records from the
    store; ``exclusive()`` says whether this process still is the only writer (else the cache is
    dropped and the store reads Chroma).
    """

    def __init__(
        self,
        records: RecordCache,
        *,
        load: Callable[[str], UserRecords],
        hold: Callable[[str], AbstractContextManager[object]],
        background: bool = True,
        exclusive: Callable[[], bool] | None = None,
    ) -> None:
        self.records = records
        self._load, self._hold = load, hold
        self._background = background
        self._exclusive = exclusive
        self._misses: dict[str, int] = {}
        #: Reads answered from the copy, and reads that found none (for a service's metrics;
        #: counted without a lock, so concurrent reads may lose an increment, never add one).
        self.hits = self.misses = 0
        #: user -> the thread loading the user's records
        self.loaders: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._closed = False

    def get(self, user_id: str, *, load: bool = True) -> UserRecords | None:
        """The user's records in memory, or None (not loaded yet: read the store)."""
        if self._exclusive is not None and not self._exclusive():
            self.records.clear()
            return None
        records = self.records.get(user_id)
        if records is not None:
            self.hits += 1
        else:
            self.misses += 1
        if records is not None or not self._background:
            return records if records is not None else self._load_now(user_id)
        with self._lock:
            self._misses[user_id] = misses = self._misses.get(user_id, 0) + load
            if misses < 2 or user_id in self.loaders:
                return None
            loader = self.loaders[user_id] = threading.Thread(
                target=self._load_now, args=(user_id,), name="hybridmem-records", daemon=True)
        loader.start()
        return None

    def _load_now(self, user_id: str) -> UserRecords | None:
        try:
            with self._hold(user_id):
                records = self.records.get(user_id)
                if records is None and not self._closed:
                    records = self._load(user_id)
                    self.records.put(user_id, records)
                return records
        except Exception as exc:
            if not self._background:
                raise
            if not isinstance(exc, ClosedError):  # closed meanwhile: nobody waits for them
                log.warning("loading the records of a user failed (%s); reading Chroma", exc)
            return None
        finally:
            with self._lock:
                self.loaders.pop(user_id, None)
                self._misses.pop(user_id, None)

    def close(self) -> None:
        """Let loads in flight finish (they use the store's client), then forget every record."""
        with self._lock:
            self._closed = True
            loaders = list(self.loaders.values())
        for loader in loaders:
            loader.join()
        self.records.clear()
