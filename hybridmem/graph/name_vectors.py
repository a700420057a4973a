"""Name vectors: the embeddings of graph node names that the graph's topic signal compares the
query with (see :mod:`hybridmem.graph.activation`), made when a write creates the node, never in a search.

Why: the topic signal needs the cosine of the query to the names of its candidates' nodes. Made
lazily in the search, a 10k-memory user's first search embedded 672 names (1.7 s). So:

- **write time**: the writer embeds the names its extractions bring in before it takes the user's
  lock (:meth:`NameVectors.prefetch`), and :class:`NamedGraph` — the graph store every write goes
  through — stores the vectors of the nodes an add created (embedding, in one call, any a caller
  did not prefetch: an import, a re-extraction);
- **persisted** per user in ``users/<hash>/names.sqlite3`` (:class:`NameStore`: key, name, model,
  float16 vector), so a restarted process embeds nothing; with a Chroma server there is no local
  file: each process keeps its own in memory, made by its writes, read from the user's shared
  name snapshot (:mod:`hybridmem.replica.copies`; read by the background filler at the user's
  first use, stored by a writer at its lease's end, :meth:`NameVectors.settle`) and, for nodes
  neither has, by the background filler;
- **never in a search**: a node without a vector (legacy data, another process's node, a crash
  between the graph write and this one) scores 0 and is queued for a background thread that
  embeds and stores it (:meth:`NameVectors.similar`). A vector is a function of the node's name
  and the embedder's name, both stored beside it: one that does not match is treated as missing,
  so a stale vector is never used (after a re-embed with a new model they are all recomputed);
- **erasure**: removing memories deletes, in the same call and before the graph forgets them, the
  rows of the nodes that will disappear, and after it any other that did (``secure_delete`` zeroes
  their pages); dropping a user deletes the file. A crash between leaves a node without a vector
  (refilled), never a vector without a node.

In memory each user's vectors are loaded on first use into one float32 matrix (a search's
cosines are one product with the rows of its pool) and kept in an LRU bounded by
:data:`NAME_VECTORS` matrix rows over all users (~1.5 KB each at 384 dimensions). Rows, not
vectors: a matrix grows by doubling, so it holds more rows than vectors, and counting vectors let
10,000 one-node users hold 64 rows each (RSS 526 MB at 1,000 users, 1,050 MB at 10,000).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import networkx as nx
import numpy as np

from hybridmem.runtime.locks import UserLocks
from hybridmem.sqlite.base import PerUserSqlite
from hybridmem.models import Extraction, GraphEntity, GraphPath, GraphRelation
from hybridmem.errors import StorageError
from hybridmem.protocols import GraphStore, NameSnapshot, NameSnapshots, Pingable, Settling

__all__ = ["FILE_NAME", "FILL_BATCH", "FIRST_ROWS", "NAME_VECTORS", "NameStore", "NameVectors",
           "NamedGraph"]

log = logging.getLogger(__name__)
FILE_NAME = "names.sqlite3"
#: Matrix rows kept in memory over all users (~77 MB at 384 dimensions in float32).
NAME_VECTORS = 50_000
#: Rows a user's matrix starts with (then doubles): most users have a handful of nodes.
FIRST_ROWS = 8
#: Names the background filler embeds in one call.
FILL_BATCH = 256
#: A shared name snapshot is owed after this many vectors were made since the last one, and at
#: least a quarter of the user's (a reader embeds what it lacks; a rewrite at 5k memories is
#: ~2.4 MB of float16).
SHARED_TAIL = 512
SHARED_SHARE = 4
#: No name snapshot is stored for fewer nodes: a reader embeds that many names in ~0.3 s.
SHARED_MIN = 256
#: Prefetched vectors waiting for the write that asked for them (a write that never commits
#: leaves its own; the oldest go first).
MAX_OFFERED = 4096
Embed = Callable[[Sequence[str]], list[list[float]]]
Vec = np.ndarray[Any, np.dtype[np.float16]]
Matrix = np.ndarray[Any, np.dtype[np.float32]]


class _User:
    """One user's vectors in memory: a float32 matrix with a row per node, grown by doubling;
    a removed node's row is zeroed and never reused (rows are few: one per node ever seen).
    Written under NameVectors._guard; read without it (a reader takes ``matrix`` first, and an
    index past its end is a node without a vector)."""

    __slots__ = ("index", "keys", "matrix", "names", "shared", "since", "unread")

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.keys: list[str | None] = []
        self.names: list[str] = []
        self.matrix: Matrix = np.zeros((0, 0), dtype=np.float32)
        #: Server mode: whether the shared snapshot was not read yet, whether the server has
        #: one as this process last knew (None: unknown), and vectors made since the last.
        self.unread = False
        self.shared: bool | None = None
        self.since = 0

    def __len__(self) -> int:
        return len(self.index)

    @property
    def capacity(self) -> int:
        """Rows allocated (what the LRU's budget counts: the RAM, not the vectors)."""
        return int(self.matrix.shape[0])

    def row(self, key: str, name: str) -> int | None:
        """The row of the node's vector, if it has one made from this name."""
        i = self.index.get(key)
        return i if i is not None and self.names[i] == name else None

    def set(self, key: str, name: str, vector: Vec) -> int:
        """Store a vector; returns how many rows the matrix grew by (0 mostly)."""
        before = self.capacity
        i = self.index.get(key)
        if i is None:
            i = len(self.keys)
            if i >= self.matrix.shape[0] or self.matrix.shape[1] != vector.shape[0]:
                grown = np.zeros((max(FIRST_ROWS, 2 * i), vector.shape[0]), dtype=np.float32)
                if self.matrix.shape[1] == vector.shape[0]:
                    grown[:i] = self.matrix[:i]
                self.matrix = grown
            self.keys.append(key)
            self.names.append(name)
        else:
            self.names[i] = name
        self.matrix[i] = vector
        self.index[key] = i  # last: a reader that finds the index finds the row
        return self.capacity - before

    def load(self, keys: list[str], names: list[str], matrix: Matrix) -> None:
        """Fill an empty instance at once (rows in ``keys`` order)."""
        self.keys, self.names, self.matrix = list(keys), names, matrix
        self.index = {k: i for i, k in enumerate(keys)}

    def remove(self, key: str) -> None:
        i = self.index.pop(key, None)
        if i is None:
            return
        self.keys[i], self.names[i] = None, ""
        self.matrix[i] = 0.0


class NameStore(PerUserSqlite):
    """The persisted name vectors: one row per node key, with the name and the embedder's name
    the vector was made from (a vector is only used while both still match)."""

    file_name = FILE_NAME
    what = "name vectors"
    schema = (
        "CREATE TABLE IF NOT EXISTS names (key TEXT PRIMARY KEY, name TEXT NOT NULL, "
        "model TEXT NOT NULL, vec BLOB NOT NULL)",
    )

    def put(self, user_id: str, rows: Sequence[tuple[str, str, str, bytes]]) -> None:
        """Store (key, name, model, float16 bytes) rows, replacing earlier rows of the keys."""
        if rows:
            self._write(user_id, "store name vectors", lambda conn: conn.executemany(
                "INSERT OR REPLACE INTO names(key, name, model, vec) VALUES (?, ?, ?, ?)", rows))

    def delete(self, user_id: str, keys: Sequence[str]) -> None:
        """Delete the rows of node keys (unknown keys are ignored)."""
        if keys:
            def work(conn: sqlite3.Connection) -> None:
                conn.executemany("DELETE FROM names WHERE key = ?", [(k,) for k in keys])

            self._write(user_id, "delete name vectors", work, create=False)

    def rows(self, user_id: str) -> list[tuple[str, str, str, bytes]]:
        """Every (key, name, model, vector bytes) row of the user."""
        return [(str(k), str(n), str(m), bytes(v)) for k, n, m, v in self._read(
            user_id, "read name vectors", "SELECT key, name, model, vec FROM names")]


def _unit(vectors: Sequence[Sequence[float]]) -> np.ndarray[Any, np.dtype[np.float16]]:
    m = np.asarray(vectors, dtype=np.float32)
    m /= np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
    return m.astype(np.float16)


class NameVectors:
    """The name vectors of every user: loaded lazily, written by :class:`NamedGraph`, filled in
    the background when missing (see the module docstring). ``graph`` is the store the nodes
    live in (the inner store, not the :class:`NamedGraph`); ``store`` None keeps them in memory
    only (server mode), shared through ``shared`` snapshots when given."""

    def __init__(self, graph: GraphStore, store: NameStore | None, *, embed: Embed,
                 model: str, budget: int = NAME_VECTORS,
                 shared: NameSnapshots | None = None) -> None:
        self._graph, self._store, self._shared = graph, store, shared
        self._embed, self._model, self._budget = embed, model, max(1, budget)
        self._users: OrderedDict[str, _User] = OrderedDict()  # least recently used first
        self._size = 0
        self._offered: OrderedDict[tuple[str, str], Vec] = OrderedDict()
        self._pending: dict[str, dict[str, str]] = {}  # user -> key -> name, for the filler
        self._guard = threading.Lock()  # a leaf lock: the tables above only, never any I/O
        self.held = UserLocks()  # per user: checking nodes and changing their rows
        self._wake = threading.Condition(self._guard)
        self._worker: threading.Thread | None = None
        self._active = 0  # batches the filler is embedding or storing
        #: Names a search met without a vector (and queued for the filler), since creation.
        self.queued = 0
        self._closed = False

    def __repr__(self) -> str:
        return f"NameVectors(model={self._model!r}, users={len(self._users)}, rows={self._size})"

    # -- reads -------------------------------------------------------------------------------------
    def _rows(self, user_id: str) -> _User:
        """The user's vectors, read from the store on first use (call with no lock held)."""
        with self._guard:
            mine = self._users.get(user_id)
            if mine is not None:
                self._users.move_to_end(user_id)
                return mine
        loaded = _User()
        stale: dict[str, str] = {}  # another model's: missing ones, refilled in the background
        good: list[tuple[str, str, bytes]] = []
        for key, name, model, blob in self._store.rows(user_id) if self._store else ():
            if model == self._model and (not good or len(blob) == len(good[0][2])):
                good.append((key, name, blob))
            else:
                stale[key] = name
        if good:  # one matrix from one buffer: ~10 ms for 4,000 names, not a loop of rows
            width = len(good[0][2]) // 2
            matrix = np.frombuffer(b"".join(b for *_, b in good), dtype=np.float16)
            loaded.load([k for k, _, _ in good], [n for _, n, _ in good],
                        matrix.reshape(len(good), width).astype(np.float32))
        loaded.unread = self._shared is not None
        with self._guard:
            mine = self._users.setdefault(user_id, loaded)
            if mine is loaded:
                self._size += loaded.capacity
                self._evict(user_id)
        if mine is loaded and (stale or loaded.unread):  # the filler reads the snapshot first
            self._queue(user_id, stale)
        return mine

    def _evict(self, keep: str) -> None:
        """Drop the least recently used users beyond the budget (never ``keep``); under _guard."""
        for user in list(self._users):
            if self._size <= self._budget:
                break
            if user != keep:
                self._size -= self._users.pop(user).capacity

    def similar(self, user_id: str, query: Sequence[float], keys: Sequence[str],
                names: Sequence[str]) -> list[float]:
        """The cosine of ``query`` to each node's name vector, in order; 0 for a node without
        one, which is queued for the background filler (a search never embeds)."""
        mine = self._rows(user_id)
        matrix = mine.matrix
        index, made_from, rows = mine.index, mine.names, matrix.shape[0]
        where: list[int] = []
        at: list[int] = []
        missing: dict[str, str] = {}
        for i, (key, name) in enumerate(zip(keys, names, strict=True)):
            r = index.get(key)  # (_User.row, inline: a search asks for ~100 nodes)
            if r is not None and made_from[r] == name and r < rows:
                where.append(i)
                at.append(r)
            else:
                missing[key] = name
        if missing:
            self._queue(user_id, missing)
        out = [0.0] * len(keys)
        if at:
            q = np.asarray(query, dtype=np.float32)
            q /= max(float(np.linalg.norm(q)), 1e-12)
            for i, cos in zip(where, (matrix[at] @ q).tolist(), strict=True):
                out[i] = cos
        return out

    def nearest(self, user_id: str, query: Sequence[float], k: int,
                floor: float) -> list[tuple[str, float]]:
        """The ``k`` nodes whose name vectors are closest to ``query`` (cosine >= ``floor``),
        best first: one product with the user's matrix (a search never embeds)."""
        mine = self._rows(user_id)
        matrix, keys = mine.matrix, list(mine.keys)
        n = min(len(keys), matrix.shape[0])
        if not n:
            return []
        q = np.asarray(query, dtype=np.float32)
        q /= max(float(np.linalg.norm(q)), 1e-12)
        sims = matrix[:n] @ q
        top = np.argpartition(-sims, k)[:k] if n > k else np.arange(n)
        found = [(key, float(sims[i])) for i in top if (key := keys[i]) is not None]
        found.sort(key=lambda t: (-t[1], t[0]))
        return [(key, cos) for key, cos in found if cos >= floor]

    # -- writes ------------------------------------------------------------------------------------
    def prefetch(self, user_id: str, extractions: Iterable[Extraction]) -> None:
        """Embed, in one call, the names of these extractions that would make a node without a
        vector (called by the writer before it takes the user's lock); :meth:`added` uses them."""
        want = self.wanted(user_id, extractions)
        if want:
            self.offer(user_id, want, self._embed(want))

    def wanted(self, user_id: str, extractions: Iterable[Extraction]) -> list[str]:
        """The names of these extractions that would make (or are) a node without a vector and
        were not offered yet: what :meth:`offer` should get."""
        mine = self._rows(user_id)
        want: dict[str, None] = {}
        for name in dict.fromkeys(_names(extractions)):
            node = self._graph.entity(user_id, name)
            if node is not None:
                name = node.name  # an alias of a node: its vector is the node name's
                if mine.row(node.key, name) is not None:
                    continue
            with self._guard:
                if (user_id, name) not in self._offered:
                    want[name] = None
        return list(want)

    def offer(self, user_id: str, names: Sequence[str],
              vectors: Sequence[Sequence[float]]) -> None:
        """Vectors of names (embedded by the writer, e.g. with its texts) for :meth:`added`."""
        if not names:
            return
        with self._guard:
            for name, v in zip(names, _unit(vectors), strict=True):
                self._offered[(user_id, name)] = v
            while len(self._offered) > MAX_OFFERED:
                self._offered.popitem(last=False)

    def added(self, user_id: str, extractions: Iterable[Extraction]) -> None:
        """Store the vectors of the nodes these (just written) extractions created or renamed:
        prefetched ones, and the rest embedded now in one call. Call holding :attr:`held`."""
        mine = self._rows(user_id)
        todo: dict[str, str] = {}
        for name in dict.fromkeys(_names(extractions)):
            node = self._graph.entity(user_id, name)
            if node is not None and node.key not in todo and mine.row(node.key, node.name) is None:
                todo[node.key] = node.name
        self._fill(user_id, todo)

    def _fill(self, user_id: str, todo: Mapping[str, str]) -> None:
        """Embed (what was not prefetched) and store the vectors of ``todo`` (key -> name)."""
        if not todo:
            return
        with self._guard:
            have = {k: self._offered.pop((user_id, n), None) for k, n in todo.items()}
        rest = [k for k, v in have.items() if v is None]
        if rest:
            fresh = _unit(self._embed([todo[k] for k in rest]))
            have.update(zip(rest, fresh, strict=True))
        self._put(user_id, [(k, todo[k], v) for k, v in have.items() if v is not None])

    def _put(self, user_id: str, rows: Sequence[tuple[str, str, Vec]]) -> None:
        if self._store is not None:
            self._store.put(user_id, [(k, n, self._model, v.tobytes()) for k, n, v in rows])
        with self._guard:
            mine = self._users.get(user_id)
            if mine is not None:
                for k, n, v in rows:
                    self._size += mine.set(k, n, v)
                mine.since += len(rows)
                self._evict(user_id)

    # -- server mode: the shared snapshot ----------------------------------------------------------
    def _read_shared(self, user_id: str) -> None:
        """Fill the user's rows from the shared snapshot, once (the background filler, before
        it embeds anything of the user): vectors of the configured model only, and only for
        nodes that have no vector of that name here. Under :attr:`held`, so no removal of a
        node comes between the read and the filling."""
        with self._guard:
            mine = self._users.get(user_id)
        if self._shared is None or mine is None or not mine.unread:
            return
        with self.held.hold(user_id):
            got = self._shared.read(user_id)
            if got is not None and got.model == self._model:
                matrix = np.frombuffer(got.vectors, dtype=np.float16).reshape(
                    len(got.keys), got.width)
            with self._guard:
                mine.unread, mine.shared = False, got is not None
                if got is None or got.model != self._model:
                    return
                for n, (key, name) in enumerate(zip(got.keys, got.names, strict=True)):
                    if mine.row(key, name) is None:
                        self._size += mine.set(key, name, matrix[n])
                self._evict(user_id)

    def settle(self, user_id: str) -> None:
        """The user's lease ends (server mode): store this process's vectors of the user as the
        shared snapshot if one is owed — when the server has none this process knows of, or
        enough were made since the last — and the snapshot was read first (so it never replaces
        a fuller one): the vectors of the graph's current nodes, none for fewer than
        :data:`SHARED_MIN`. A failure is logged, never raised (see
        :class:`~hybridmem.protocols.Settling`)."""
        if self._shared is None:
            return
        with self.held.hold(user_id):
            with self._guard:
                mine = self._users.get(user_id)
                if mine is None or mine.unread or len(mine) < SHARED_MIN or not (
                        mine.shared is False
                        or mine.since >= max(SHARED_TAIL, len(mine) // SHARED_SHARE)):
                    return
                held = [(k, i, mine.names[i]) for k, i in mine.index.items()
                        if i < mine.matrix.shape[0]]
            # only the nodes the graph has now under those names: this process may still hold
            # vectors of nodes another process removed (and whose snapshot it dropped)
            rows = [(k, i) for k, i, name in held
                    if (e := self._graph.entity(user_id, k)) is not None and e.key == k
                    and e.name == name]
            if len(rows) < SHARED_MIN:
                return
            with self._guard:
                made = NameSnapshot(
                    model=self._model, width=int(mine.matrix.shape[1]),
                    keys=[k for k, _ in rows], names=[mine.names[i] for _, i in rows],
                    vectors=mine.matrix[[i for _, i in rows]].astype(np.float16).tobytes())
                since, mine.since = mine.since, 0
            try:
                self._shared.write(user_id, made)
                mine.shared = True
            except StorageError as exc:
                mine.since += since
                log.warning("name snapshot not stored (%s); other processes embed the names",
                            exc)

    def complete(self, user_id: str) -> None:
        """Make the rows match the user's nodes now (after an import replaced the graph, a
        re-embed): rows of keys that are no node go, and nodes without a vector of the current
        model get one (one embedding call). Call holding :attr:`held`."""
        nodes = {e.key: e.name for e in self._graph.entities(user_id)}
        stored = [k for k, *_ in self._store.rows(user_id)] if self._store else []
        self.discard(user_id, [k for k in stored if k not in nodes])
        mine = self._rows(user_id)
        self._fill(user_id, {k: n for k, n in nodes.items() if mine.row(k, n) is None})

    def discard(self, user_id: str, keys: Sequence[str]) -> None:
        """Delete the vectors of nodes that are gone (or about to go)."""
        if not keys:
            return
        if self._store is not None:
            self._store.delete(user_id, keys)
        if self._shared is not None and self._may_share(user_id, len(keys)):
            self._shared.drop(user_id)  # it may hold their names: gone before them
        with self._guard:
            mine = self._users.get(user_id)
            if mine is not None:
                mine.shared = False
            for k in keys:
                if mine is not None:
                    mine.remove(k)  # its row stays allocated (and counted), zeroed
            pending = self._pending.get(user_id, {})
            for k in keys:
                pending.pop(k, None)

    def _may_share(self, user_id: str, going: int) -> bool:
        """Whether the server may hold a name snapshot of the user now that ``going`` nodes are
        being removed: none is stored for fewer than :data:`SHARED_MIN` nodes, and every removal
        since one was stored deleted it, so a graph of fewer nodes (with those counted, in case
        they are gone already) has none. Counted only for a graph that small."""
        with self._guard:
            mine = self._users.get(user_id)
            if mine is not None and len(mine) >= SHARED_MIN:
                return True
        return len(self._graph.entities(user_id)) + going >= SHARED_MIN

    def drop_user(self, user_id: str) -> None:
        """Forget everything of the user (its file included)."""
        with self._guard:
            gone = self._users.pop(user_id, None)
            self._size -= 0 if gone is None else gone.capacity
            self._pending.pop(user_id, None)
            for key in [k for k in self._offered if k[0] == user_id]:
                del self._offered[key]
        if self._store is not None:
            self._store.drop_user(user_id)
        if self._shared is not None:
            self._shared.drop(user_id)

    # -- the background filler ---------------------------------------------------------------------
    def _queue(self, user_id: str, missing: Mapping[str, str]) -> None:
        with self._guard:
            if self._closed:
                return
            self._pending.setdefault(user_id, {}).update(missing)
            self.queued += len(missing)
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="hybridmem-names",
                                                daemon=True)
                self._worker.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._guard:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                user_id, todo = next(iter(self._pending.items()))
                batch = dict(list(todo.items())[:FILL_BATCH])
                for k in batch:
                    del todo[k]
                if not todo:
                    del self._pending[user_id]
                self._active += 1
            try:
                self._read_shared(user_id)
                self._fill_checked(user_id, batch)
            except Exception as exc:  # a hint for ranking: never let it break anything
                log.warning("filling %d name vectors failed (%s); they are retried when a "
                            "search needs them", len(batch), exc)
            finally:
                with self._guard:
                    self._active -= 1

    def _fill_checked(self, user_id: str, batch: Mapping[str, str]) -> None:
        """Embed the batch (what has no vector yet), then store the vectors of the nodes that
        still exist under those names (holding the user's :attr:`held`, so no removal can come
        in between)."""
        with self._guard:
            mine = self._users.get(user_id)
        if mine is not None:
            batch = {k: n for k, n in batch.items() if mine.row(k, n) is None}
        if not batch:
            return
        vectors = dict(zip(batch, _unit(self._embed(list(batch.values()))), strict=True))
        with self.held.hold(user_id):
            with self._guard:
                if self._closed:
                    return
            rows = []
            for key, name in batch.items():
                node = self._graph.entity(user_id, key)
                if node is not None and node.key == key and node.name == name:
                    rows.append((key, name, vectors[key]))
            self._put(user_id, rows)

    def wait(self, timeout: float = 30.0) -> bool:
        """Block until the filler has nothing queued (tests, benchmarks); False on timeout."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._guard:
                if not self._pending and not self._active:
                    return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        """Stop the filler (what is queued is dropped: it is refilled when next needed)."""
        with self._guard:
            self._closed = True
            worker = self._worker
            self._wake.notify_all()
        if worker is not None:
            worker.join()
        if self._store is not None:
            self._store.close()


def _names(extractions: Iterable[Extraction]) -> Iterable[str]:
    for e in extractions:
        yield from (x.name for x in e.entities)
        yield from (n for r in e.relations for n in (r.subject, r.object))


class NamedGraph:
    """A :class:`~hybridmem.protocols.GraphStore` that keeps :class:`NameVectors` in step with
    the nodes of the store it wraps: an add stores the vectors of the nodes it created, a
    removal deletes those of the nodes it removes, an import or a dropped user redoes or drops
    them. Every write of the graph goes through it, so no write path can forget them."""

    def __init__(self, inner: GraphStore, names: NameVectors) -> None:
        self.inner, self.names = inner, names

    def __repr__(self) -> str:
        return f"NamedGraph({self.inner!r}, {self.names!r})"

    def ping(self) -> None:
        """The wrapped store's :meth:`~hybridmem.protocols.Pingable.ping`, if it has one."""
        if isinstance(self.inner, Pingable):
            self.inner.ping()

    def add_extractions(self, user_id: str, items: Sequence[tuple[str, Extraction]], *,
                        links: bool | Sequence[tuple[str, str]] = True) -> None:
        with self.names.held.hold(user_id):
            self.inner.add_extractions(user_id, items, links=links)
            try:
                self.names.added(user_id, [e for _, e in items])
            except Exception as exc:  # the memory is written: its names are refilled later
                log.warning("storing name vectors failed (%s); a search refills them", exc)

    def remove_memory(self, user_id: str, memory_ids: Sequence[str], *,
                      erase: bool = False) -> None:
        """The rows of nodes only these memories support go first (a crash then leaves a node
        without a vector, refilled, never a vector of a forgotten node), then the memories,
        then the rows of any other node that went with them."""
        with self.names.held.hold(user_id):
            keys = self.inner.entities_of(user_id, memory_ids)
            ids = set(memory_ids)
            doomed = [k for k in keys if (e := self.inner.entity(user_id, k)) is None
                      or e.key != k or set(e.memory_ids) <= ids]
            self.names.discard(user_id, doomed)
            self.inner.remove_memory(user_id, memory_ids, erase=erase)
            gone = set(doomed)
            self.names.discard(user_id, [k for k in keys if k not in gone and (
                (e := self.inner.entity(user_id, k)) is None or e.key != k)])

    def settle(self, user_id: str) -> None:
        """The user's lease ends (server mode): the wrapped store and the name vectors store
        what they owe the server (see :meth:`NameVectors.settle`)."""
        if isinstance(self.inner, Settling):
            self.inner.settle(user_id)
        self.names.settle(user_id)

    def import_graph(self, user_id: str, data: Mapping[str, Any]) -> None:
        with self.names.held.hold(user_id):
            self.inner.import_graph(user_id, data)
            self.names.complete(user_id)

    def drop_user(self, user_id: str) -> None:
        with self.names.held.hold(user_id):
            self.inner.drop_user(user_id)
            self.names.drop_user(user_id)

    def close(self) -> None:
        try:
            self.names.close()
        finally:
            self.inner.close()

    # -- reads: the wrapped store's -----------------------------------------------------------------
    def entities_in(self, user_id: str, text: str) -> list[str]:
        return self.inner.entities_in(user_id, text)

    def neighbourhood(self, user_id: str, entities: Sequence[str], *,
                      hops: int) -> dict[str, tuple[int, str]]:
        return self.inner.neighbourhood(user_id, entities, hops=hops)

    def activation(
        self, user_id: str, seeds: Sequence[tuple[str, float]], query: str, *, hops: int = 1,
        episodic: float = 0.5, topic: float = 0.45,
        similar: Callable[[Sequence[str], Sequence[str]], Sequence[float]] | None = None,
        linked: Sequence[tuple[str, float]] = (),
    ) -> dict[str, tuple[float, int, str]]:
        return self.inner.activation(user_id, seeds, query, hops=hops, episodic=episodic,
                                     topic=topic, similar=similar, linked=linked)

    def entities_of(self, user_id: str, memory_ids: Sequence[str]) -> list[str]:
        return self.inner.entities_of(user_id, memory_ids)

    def entity(self, user_id: str, name: str) -> GraphEntity | None:
        return self.inner.entity(user_id, name)

    def entities(self, user_id: str) -> list[GraphEntity]:
        return self.inner.entities(user_id)

    def relations(self, user_id: str,
                  memory_ids: Sequence[str] | None = None) -> list[GraphRelation]:
        return self.inner.relations(user_id, memory_ids)

    def query_path(self, user_id: str, a: str, b: str, *, max_depth: int = 3) -> list[str]:
        return self.inner.query_path(user_id, a, b, max_depth=max_depth)

    def query_paths(self, user_id: str, a: str, b: str, *, k: int,
                    max_depth: int = 3) -> list[GraphPath]:
        return self.inner.query_paths(user_id, a, b, k=k, max_depth=max_depth)

    def export(self, user_id: str) -> dict[str, Any]:
        return self.inner.export(user_id)

    def graph(self, user_id: str, memory_ids: Sequence[str] | None = None) -> nx.DiGraph[str]:
        return self.inner.graph(user_id, memory_ids)

    def refresh(self, user_id: str) -> None:
        self.inner.refresh(user_id)
