"""NetworkXGraphStore: one entity graph per user, so search can reach memories through entities.

A memory that shares no word with the query can still be found when its entities are connected
to the query's ("ROG laptop" <-complements- "Dell 4K monitor"). Each user's graph is a
``networkx.DiGraph`` kept in memory and persisted as a snapshot plus a change log:

- ``users/<hash>/graph.json``: node-link JSON wrapped in ``{"schema": 1, "graph": ...}`` (see
  :mod:`hybridmem.graph.fileformat`), written atomically, readable by ``nx.node_link_graph``;
- ``users/<hash>/graph.log``: one fsync'd JSON line per change since (``add`` with the memories'
  extractions, ``remove`` with their ids), replayed on load. A write costs O(its own entities).
  When the log outgrows the snapshot (and :data:`COMPACT_MIN_BYTES`) it is folded into a new
  snapshot and emptied, so the total rewrite cost stays proportional to what was appended. Both
  steps are crash-safe: replaying a change the snapshot already holds changes nothing, and a line
  torn by a crash is dropped. Removing with ``erase=True`` (a forgotten memory) compacts at once,
  so no line of the log still carries what the memory said. A *load* that had to replay a log
  larger than a quarter of the snapshot folds it too, when the user's file lock is free at once
  (it never waits), so the next process starts from the snapshot alone. A clean
  :meth:`~NetworkXGraphStore.close` folds the log of every user the store wrote to, so after it
  each such user's ``graph.json`` holds the whole graph.

Nodes are keyed by :func:`hybridmem.text.entity_key`, so "ROG laptop", "the rog  Laptop" and
"ROG Laptop." are one node. Node attributes: ``name`` (first surface form), ``type``, ``aliases``
(surface forms), ``first_seen``/``last_seen`` (UTC), ``mentions`` (number of memories mentioning
it) and ``memory_ids``. Edge attributes: ``predicates``, ``evidence`` ({predicate: {memory id:
confidence}}, so forgetting a memory removes exactly the predicates it supported), ``memory_ids``,
``weight`` (number of supporting memories) and ``confidence`` (max).

Stores only store: the extractor decides what the entities are; the walks over a graph
(:mod:`hybridmem.graph.activation`) and ranking decide what hops are worth.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import networkx as nx
from filelock import Timeout

from hybridmem.errors import ClosedError, CorruptStateError, InvalidInputError, StorageError
from hybridmem.graph.activation import (
    EPISODIC,
    FOCUS,
    SESSION,
    TOPIC,
    Similar,
    activate,
    neighbourhood,
)
from hybridmem.graph.fileformat import (
    SCHEMA,
    append_op,
    from_json_bytes,
    gc_paused,
    graph_from,
    node_link,
    read_ops,
    refresh_edge,
    to_json_bytes,
    truncate,
)
from hybridmem.graph.state import LOG_FILE, Links, UserGraph, edge_label, stamp_of
from hybridmem.models import Extraction, GraphEntity, GraphPath, GraphRelation, as_utc, utcnow
from hybridmem.runtime.files import (
    atomic_write_bytes,
    check_users_dir,
    user_dir,
    user_key,
    user_lock,
)
from hybridmem.runtime.locks import UserLocks

__all__ = ["GRAPH_FILE", "LOG_FILE", "SCHEMA", "NetworkXGraphStore", "graph_copy"]

log = logging.getLogger(__name__)

GRAPH_FILE = "graph.json"
#: The change log is folded into the snapshot once it is larger than the snapshot and this.
COMPACT_MIN_BYTES = 256 * 1024
#: A load that replayed at least this much log, and more than a quarter of the snapshot's size,
#: folds the log into a new snapshot (see ``NetworkXGraphStore._fold``).
FOLD_MIN_BYTES = 64 * 1024
_Edge = tuple[str, str]


class NetworkXGraphStore:
    """The default :class:`~hybridmem.protocols.GraphStore`: per-user DiGraphs persisted as JSON.

    Thread-safe (one lock per instance) and multi-process-safe for writes: every write holds the
    user's file lock, re-reads the file if another process changed it, applies the change and saves.
    Reads re-read the file only when its mtime or size changed.

    ``max_nodes``, ``max_memories``, ``hub_degree`` and ``co_mentions`` bound and shape
    :meth:`neighbourhood` (see :func:`hybridmem.graph.activation.neighbourhood`); ``focus`` and
    ``session`` weigh :meth:`activation` (see :func:`hybridmem.graph.activation.activate`).

    ``data_dir=None`` keeps the graphs in memory only (no files, no file locks, ``save`` does
    nothing): for callers that persist extractions elsewhere and replay them into this store, like
    :class:`hybridmem.replica.graph.ChromaGraphStore`, so the graph logic exists once.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None,
        *,
        autosave: bool = True,
        max_nodes: int = 200,
        max_memories: int = 500,
        hub_degree: int = 50,
        co_mentions: bool = True,
        max_open: int = 128,
        exclusive: Callable[[], bool] | None = None,
        focus: float = FOCUS,
        session: float = SESSION,
    ) -> None:
        self.data_dir = None if data_dir is None else Path(data_dir)
        #: Query focus of :meth:`activation` (Settings ``graph_focus``; see
        #: hybridmem.graph.activation).
        self.focus = focus
        #: Share of a hit's activation spread over the rest of its conversation.
        self.session = session
        self.max_open = max(1, max_open)
        self.autosave = autosave
        self.max_nodes = max_nodes
        self.max_memories = max_memories
        self.hub_degree = hub_degree
        self.co_mentions = co_mentions
        #: ``_lock`` guards the tables only, never a load, query or file write; each user's
        #: graph is read and changed under its own lock (``_busy``), so users never wait on each
        #: other.
        self._lock = threading.RLock()
        self._busy = UserLocks()
        #: Loaded graphs, least recently used first; at most ``max_open`` (saved ones are dropped).
        self._users: OrderedDict[str, UserGraph] = OrderedDict()
        self._dirty: set[str] = set()
        #: Users whose log this store appended to and has not folded since: user key -> user id.
        #: :meth:`close` folds their logs into snapshots.
        self._logged: dict[str, str] = {}
        #: True while this store is the data dir's only writer (the data-dir lock says so): a
        #: read then trusts the loaded graph instead of checking the files' stamps (two stat
        #: calls per read, ~1 ms each on a busy disk, 16 % of a context() at 10k memories).
        self._exclusive = exclusive
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"NetworkXGraphStore(data_dir={self.data_dir and str(self.data_dir)!r}, "
            f"users_loaded={len(self._users)})"
        )

    def __enter__(self) -> NetworkXGraphStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- loading and saving

    def _path(self, user_id: str) -> Path | None:
        if self.data_dir is None:
            return None
        return user_dir(self.data_dir, user_id, create=False) / GRAPH_FILE

    def _file_lock(self, user_id: str) -> AbstractContextManager[object]:
        return nullcontext() if self.data_dir is None else user_lock(self.data_dir, user_id)

    def _locked(self, user_id: str) -> AbstractContextManager[None]:
        """The user's own lock: every read and change of one user's graph runs under it."""
        return self._busy.hold(user_key(user_id))

    def _state(self, user_id: str) -> UserGraph:
        """The user's graph, loaded lazily (under :meth:`_locked`, outside the store-wide lock)
        and re-read if another process rewrote the file."""
        self._check_open()
        key = user_key(user_id)
        with self._lock:
            if (st := self._users.get(key)) is not None:
                self._users.move_to_end(key)
            dirty = key in self._dirty
        if st is None:
            st = UserGraph(user_id, self._path(user_id))
            self._load(st)
            with self._lock:
                self._users[key] = st
                # the least recently used go first; never one with unsaved changes or in use,
                # and none in memory only (no file to load it back from)
                idle = [] if self.data_dir is None else [
                    k for k in self._users if k not in self._dirty and not self._busy.busy(k)]
                for old in idle:
                    if len(self._users) <= self.max_open:
                        break
                    del self._users[old]
            return st
        # no re-read: unsaved changes are newer than the files, and the data dir's only writer
        # (the data-dir lock says so) already holds every change
        trusted = dirty or (self._exclusive is not None and self._exclusive())
        if not trusted and st.stamps() != st.stamp:
            self._load(st)
        return st

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the graph store is closed; create a new NetworkXGraphStore")

    def ping(self) -> None:
        """Raise unless the store serves: open, and (with a ``data_dir``) its users' directory
        writable (see :class:`~hybridmem.protocols.Pingable`)."""
        self._check_open()
        if self.data_dir is not None:
            check_users_dir(self.data_dir, "graph store")

    def _load(self, st: UserGraph) -> None:
        """Read the snapshot, then replay the log over it (see :func:`gc_paused` for why the
        collector waits)."""
        with gc_paused(load=True):
            self._read(st)
        if st.log_bytes >= FOLD_MIN_BYTES and st.log_bytes * 4 > st.snapshot_bytes:
            self._fold(st)

    def _read(self, st: UserGraph) -> None:
        st.graph, st.snapshot_bytes, st.log_bytes = nx.DiGraph(), 0, 0
        replayed = True  # whether the indexes must be rebuilt at the end
        if st.path is not None and st.log_path is not None:
            reading = st.path
            try:
                if st.path.exists():
                    raw = st.path.read_bytes()
                    st.graph, st.snapshot_bytes = from_json_bytes(raw), len(raw)
                st.index()
                reading = st.log_path
                ops = read_ops(st.log_path)
                for op in ops:
                    self._replay(st, op)
                replayed = bool(ops)  # a snapshot alone is indexed once (0.45 s at 10k)
            except (OSError, ValueError, KeyError, TypeError) as exc:  # JSON/UTF-8 errors too
                raise CorruptStateError(
                    f"the graph file {reading} cannot be read ({exc}); restore the user from an "
                    "export, or move graph.json and graph.log away to start this graph empty"
                ) from exc
            st.log_bytes = (stamp_of(st.log_path) or (0, 0))[1]
        if replayed:
            st.index()
        st.stamp = st.stamps()
        log.debug("graph %s loaded: %d nodes", st.path, st.graph.number_of_nodes())

    def _fold(self, st: UserGraph) -> None:
        """Fold a replayed log into a new snapshot, so the next process loads it without
        replaying (a cold CLI search at 10k memories spent 60% of its graph load replaying).

        A read may write here, but only what a write's compaction would: the same graph, atomically.
        It never waits: when the user's file lock is taken (a writer, here or in another process)
        or the files changed since they were read, the log stays for a later load to fold."""
        if self.data_dir is None or not self.autosave:
            return
        try:
            lock = user_lock(self.data_dir, st.user_id)
            lock.acquire(blocking=False)
        except Timeout:  # (a TimeoutError, so an OSError: caught first)
            return
        except OSError as exc:
            log.info("graph %s: the log was not folded into the snapshot (%s)", st.path, exc)
            return
        try:
            if st.stamps() == st.stamp:
                self._save(st.user_id, st)
        except (OSError, StorageError) as exc:  # a read-only data dir: loading still works
            log.info("graph %s: the log was not folded into the snapshot (%s)", st.path, exc)
        finally:
            lock.release()

    def _replay(self, st: UserGraph, op: Mapping[str, Any]) -> None:
        if op["op"] == "add":
            items = [(str(m), Extraction.model_validate(e)) for m, e in op["items"]]
            links = op.get("links", True)
            pairs = links if isinstance(links, bool) else [(str(a), str(b)) for a, b in links]
            st.add(items, as_utc(datetime.fromisoformat(op["at"])), pairs)
        else:
            st.remove([str(m) for m in op["ids"]])

    def _record(self, user_id: str, st: UserGraph, op: dict[str, Any]) -> None:
        """Persist one change: append it to the log, or compact when the log outgrew the
        snapshot (``autosave=False`` defers everything to :meth:`save`)."""
        if self.data_dir is None or st.log_path is None:
            return
        if not self.autosave:
            self._dirty.add(user_key(user_id))
            return
        user_dir(self.data_dir, user_id)  # create the directory on first write
        st.log_bytes += append_op(st.log_path, op)
        with self._lock:
            self._logged[user_key(user_id)] = user_id
        if st.log_bytes > max(COMPACT_MIN_BYTES, st.snapshot_bytes):
            self._save(user_id, st)
        else:
            st.stamp = st.stamps()

    def _save(self, user_id: str, st: UserGraph) -> None:
        """Write the whole graph as the new snapshot, then empty the log (compaction)."""
        if self.data_dir is None or st.path is None or st.log_path is None:
            return
        user_dir(self.data_dir, user_id)  # create the directory on first write
        raw = to_json_bytes(st.graph)
        atomic_write_bytes(st.path, raw)
        truncate(st.log_path)
        st.snapshot_bytes, st.log_bytes = len(raw), 0
        st.stamp = st.stamps()
        with self._lock:
            self._dirty.discard(user_key(user_id))
            self._logged.pop(user_key(user_id), None)

    def save(self, user_id: str) -> None:
        """Write the user's graph now (only needed with ``autosave=False``)."""
        with self._locked(user_id), self._file_lock(user_id):
            self._save(user_id, self._state(user_id))

    def refresh(self, user_id: str) -> None:
        """Re-read the user's file if another process rewrote it (every read checks anyway)."""
        with self._locked(user_id):
            self._state(user_id)

    # ---------------------------------------------------------------- writes

    def add_extraction(
        self, user_id: str, memory_id: str, extraction: Extraction, *, at: datetime | None = None
    ) -> None:
        """Add one memory's entities and relations (``at`` stamps first/last seen; default now)."""
        self.add_extractions(user_id, [(memory_id, extraction)], at=at)

    def add_extractions(
        self, user_id: str, items: Sequence[tuple[str, Extraction]], *, at: datetime | None = None,
        links: Links = True,
    ) -> None:
        """Add many memories' extractions and save once. Re-adding a memory is idempotent.
        ``links``: True (the items are one conversation, linked in order), False (none: e.g.
        re-extraction, which redoes memories of many conversations) or (before, after) pairs."""
        if not items:
            return
        seen = as_utc(at or utcnow())
        with self._locked(user_id), self._file_lock(user_id):
            st = self._state(user_id)
            st.add(items, seen, links)
            op: dict[str, Any] = {
                "op": "add",
                "at": seen.isoformat(),
                "items": [[m, e.model_dump(mode="json", exclude={"usage"})] for m, e in items],
            }
            if links is not True:
                op["links"] = links if links is False else [list(pair) for pair in links]
            self._record(user_id, st, op)

    def remove_memory(
        self, user_id: str, memory_ids: Sequence[str], *, erase: bool = False
    ) -> None:
        """Forget memories: drop them from provenance, then edges and nodes nothing supports.

        ``erase=True`` (the memories were deleted, not superseded) rewrites the snapshot at once,
        so the log lines that carried their extractions are gone from disk."""
        with self._locked(user_id), self._file_lock(user_id):
            st = self._state(user_id)
            if st.remove(memory_ids) or erase:
                if erase and self.autosave:
                    self._save(user_id, st)
                else:
                    self._record(user_id, st, {"op": "remove", "ids": list(memory_ids)})

    def import_graph(self, user_id: str, data: Mapping[str, Any]) -> None:
        """Replace the user's graph with an :meth:`export` (or any node-link dict) and save it;
        InvalidInputError (naming the bad value) when it is malformed."""
        try:
            g = graph_from(data)
        except ValueError as exc:
            raise InvalidInputError(f"cannot import graph: {exc}") from exc
        with self._locked(user_id), self._file_lock(user_id):
            st = self._state(user_id)
            st.graph = g
            st.index()
            self._save(user_id, st)

    def snapshot(self, user_id: str) -> bytes:
        """The user's graph as the bytes of a ``graph.json``: for a store that keeps its
        snapshots elsewhere (:mod:`hybridmem.replica.snapshot`) and hands them to :meth:`restore`."""
        with self._locked(user_id):
            return to_json_bytes(self._state(user_id).graph)

    def restore(self, user_id: str, raw: bytes) -> None:
        """Replace the user's graph with :meth:`snapshot` bytes, without saving (an in-memory
        store's load); ValueError when they do not hold a graph."""
        with self._locked(user_id), gc_paused(load=True):
            g = from_json_bytes(raw)
            st = self._state(user_id)
            st.graph = g
            st.index()

    def drop_user(self, user_id: str) -> None:
        """Delete the user's graph file and forget the cached graph."""
        self._check_open()
        with self._locked(user_id), self._file_lock(user_id):
            path = self._path(user_id)
            for file in (path, path.with_name(LOG_FILE)) if path is not None else ():
                try:
                    file.unlink(missing_ok=True)
                except OSError as exc:
                    raise StorageError(f"could not delete {file}: {exc}") from exc
            with self._lock:
                self._users.pop(user_key(user_id), None)
                self._dirty.discard(user_key(user_id))
                self._logged.pop(user_key(user_id), None)

    def close(self) -> None:
        """Save graphs left unsaved (``autosave=False``) and fold the change log of every user
        this store wrote to into a new snapshot, so the files hold a ``graph.json`` that
        ``nx.node_link_graph`` reads whole; forget the caches; idempotent. A user that cannot be
        saved is logged and skipped (its log keeps every change), and the others are still
        saved."""
        with self._lock:
            if self._closed:
                return
            unsaved = [self._users[key] for key in sorted(self._dirty)]
            logged = [self._logged[key] for key in sorted(self._logged)]
        try:
            for st in unsaved:
                with self._locked(st.user_id), self._file_lock(st.user_id):
                    self._save(st.user_id, st)
            for user_id in logged:
                try:
                    self._fold_log(user_id)
                except (OSError, StorageError) as exc:
                    log.warning("graph of a user: the log was not folded at close (%s)", exc)
        finally:
            with self._lock:
                self._closed = True
                self._users.clear()
                self._dirty.clear()
                self._logged.clear()

    def _fold_log(self, user_id: str) -> None:
        """Fold the user's log into a new snapshot under the user's locks: the graph as the
        files hold it now (re-read when another process changed them since, or when the
        graph left the cache), written atomically, then the log emptied (see :meth:`_save`)."""
        with self._locked(user_id), self._file_lock(user_id):
            with self._lock:
                st = self._users.get(user_key(user_id))
            if st is None:
                st = UserGraph(user_id, self._path(user_id))
            if st.stamp is None or st.stamps() != st.stamp:
                with gc_paused(load=True):
                    self._read(st)
            if st.log_bytes:
                self._save(user_id, st)

    # ---------------------------------------------------------------- reads

    def entities_in(self, user_id: str, text: str) -> list[str]:
        """Keys of known entities named in ``text``, longest match first (see
        :meth:`~hybridmem.graph.state.UserGraph.entities_in`)."""
        with self._locked(user_id):
            return self._state(user_id).entities_in(text)

    def neighbourhood(
        self, user_id: str, entities: Sequence[str], *, hops: int
    ) -> dict[str, tuple[int, str]]:
        """memory id -> (hops, readable path) for memories within ``hops`` of the seed entities,
        breadth-first and bounded by this store's limits (see
        :func:`hybridmem.graph.activation.neighbourhood`)."""
        if hops < 0:
            raise InvalidInputError("hops must be >= 0")
        with self._locked(user_id):
            return neighbourhood(
                self._state(user_id), entities, hops=hops, max_nodes=self.max_nodes,
                max_memories=self.max_memories, hub_degree=self.hub_degree,
                co_mentions=self.co_mentions,
            )

    def activation(
        self, user_id: str, seeds: Sequence[tuple[str, float]], query: str, *, hops: int = 1,
        episodic: float = EPISODIC, topic: float = TOPIC, similar: Similar | None = None,
        linked: Sequence[tuple[str, float]] = (),
    ) -> dict[str, tuple[float, int, str]]:
        """memory id -> (graph signal, hops, readable path): activation spread from seed memories
        (id, mass) and the entities ``query`` names, over entities and episodic links (see
        :mod:`hybridmem.graph.activation`); ``similar`` (node names -> cosine to the query) adds the
        topic signal of weight ``topic``. Costs O(seeds x their entities' memories), bounded."""
        if hops < 0:
            raise InvalidInputError("hops must be >= 0")
        with self._locked(user_id):
            st = self._state(user_id)
            return activate(
                st, seeds, st.entities_in(query), hops=hops, episodic=episodic, focus=self.focus,
                session=self.session, topic=topic, similar=similar, linked=linked,
            )

    def entities_of(self, user_id: str, memory_ids: Sequence[str]) -> list[str]:
        """Keys of the entities the given memories mention (sorted)."""
        with self._locked(user_id):
            st = self._state(user_id)
            return sorted({k for m in memory_ids for k in st.mem_nodes.get(m, ())})

    def entity(self, user_id: str, name: str) -> GraphEntity | None:
        """The node a name or alias refers to, or None."""
        with self._locked(user_id):
            st = self._state(user_id)
            key = st.resolve(name)
            return None if key is None else _entity(key, st.graph.nodes[key])

    def entities(self, user_id: str) -> list[GraphEntity]:
        """Every node of the user's graph, sorted by key."""
        with self._locked(user_id):
            g = self._state(user_id).graph
            return [_entity(key, g.nodes[key]) for key in sorted(g)]

    def relations(
        self, user_id: str, memory_ids: Sequence[str] | None = None
    ) -> list[GraphRelation]:
        """One relation per (edge, predicate), with display names, keys, the supporting memory ids
        (sorted) and the highest confidence; only those the given memories support if set.
        Sorted by (subject key, predicate, object key)."""
        with self._locked(user_id):
            st = self._state(user_id)
            g = st.graph
            wanted = None if memory_ids is None else set(memory_ids)
            if wanted is None:
                edges: Iterable[_Edge] = g.edges()
            else:
                edges = {e for m in wanted for e in st.mem_edges.get(m, ()) if g.has_edge(*e)}
            rows = [
                GraphRelation(
                    subject=g.nodes[u]["name"],
                    predicate=pred,
                    object=g.nodes[v]["name"],
                    subject_key=u,
                    object_key=v,
                    memory_ids=sorted(support),
                    confidence=max(support.values()),
                )
                for u, v in edges
                for pred, support in g.edges[u, v]["evidence"].items()
                if wanted is None or wanted & support.keys()
            ]
            rows.sort(key=lambda r: (r.subject_key, r.predicate, r.object_key))
            return rows

    def query_path(self, user_id: str, a: str, b: str, *, max_depth: int = 3) -> list[str]:
        """The shortest relation path between two entities, ignoring direction, as readable edges
        ("Alice -bought-> ROG laptop"); [] when either is unknown or no path is short enough.
        Among equally short paths, the same one whatever the hash seed (see :meth:`query_paths`)."""
        found = self.query_paths(user_id, a, b, k=1, max_depth=max_depth)
        return found[0].edges if found else []

    def query_paths(self, user_id: str, a: str, b: str, *, k: int,
                    max_depth: int = 3) -> list[GraphPath]:
        """At most ``k`` shortest simple paths between two entities, ignoring direction, shortest
        first, each with its hops' predicates; [] when either is unknown or no path has at most
        ``max_depth`` hops.

        Bounded: the paths are searched (:func:`networkx.shortest_simple_paths`) only among the
        nodes within ``max_depth`` hops of both ends together — exactly the nodes such a path can
        pass through — so the cost follows that neighbourhood and ``k``, not the graph's size."""
        with self._locked(user_id):
            st = self._state(user_id)
            g = st.graph
            src, dst = st.resolve(a), st.resolve(b)
            if src is None or dst is None or src == dst:
                return []
            both = g.to_undirected(as_view=True)
            from_a = nx.single_source_shortest_path_length(both, src, cutoff=max_depth)
            if dst not in from_a:
                return []
            from_b = nx.single_source_shortest_path_length(both, dst, cutoff=max_depth)
            near = sorted(n for n, d in from_a.items() if n in from_b and d + from_b[n] <= max_depth)
            # built in key order: networkx's undirected view iterates a set of neighbours, whose
            # order (so the choice among equally short paths) would change with the hash seed
            area: nx.Graph[str] = nx.Graph()
            area.add_nodes_from(near)
            kept = set(near)
            area.add_edges_from((n, m) for n in near for m in sorted(both[n]) if m in kept)
            paths: list[GraphPath] = []
            for nodes in nx.shortest_simple_paths(area, src, dst):
                if len(paths) >= k or len(nodes) - 1 > max_depth:
                    break
                hops = [(u, v) if g.has_edge(u, v) else (v, u) for u, v in pairwise(nodes)]
                paths.append(GraphPath(
                    entities=[g.nodes[n]["name"] for n in nodes],
                    predicates=[list(g.edges[e]["predicates"]) for e in hops],
                    edges=[edge_label(g, *e) for e in hops],
                ))
            return paths

    def export(self, user_id: str) -> dict[str, Any]:
        """The user's graph as JSON-safe ``{"schema": 1, "graph": node-link}``."""
        with self._locked(user_id):
            return node_link(self._state(user_id).graph)

    def graph(self, user_id: str, memory_ids: Sequence[str] | None = None) -> nx.DiGraph[str]:
        """A deep copy of the user's graph, with the attributes the module docstring lists; with
        ``memory_ids``, only what those memories support (see :func:`graph_copy`)."""
        with self._locked(user_id):
            return graph_copy(self._state(user_id).graph, memory_ids)


def graph_copy(g: nx.DiGraph[str], memory_ids: Iterable[str] | None = None) -> nx.DiGraph[str]:
    """A copy of ``g`` that shares no mutable value with it.

    With ``memory_ids``, only what those memories support: an edge keeps their evidence
    (``predicates``, ``memory_ids``, ``weight`` and ``confidence`` derived again) and goes when
    none is left; a node keeps those of its memories (``mentions`` recounted) and goes when it
    has none and no edge left; the episodic links (graph attribute ``next``) keep the pairs of
    two of them. ``first_seen`` and ``last_seen`` are copied as they are."""
    keep = None if memory_ids is None else set(memory_ids)
    out: nx.DiGraph[str] = nx.DiGraph()
    nexts = g.graph.get("next", {})
    out.graph.update({k: v for k, v in g.graph.items() if k != "next"})
    out.graph["next"] = {a: b for a, b in nexts.items()
                         if keep is None or (a in keep and b in keep)}
    edges: list[tuple[str, str, dict[str, Any]]] = []
    for u, v, attrs in g.edges(data=True):
        evidence = {p: {m: c for m, c in support.items() if keep is None or m in keep}
                    for p, support in attrs["evidence"].items()}
        evidence = {p: support for p, support in evidence.items() if support}
        if evidence:
            copied = {**attrs, "evidence": evidence}
            refresh_edge(copied)
            edges.append((u, v, copied))
    ends = {n for u, v, _ in edges for n in (u, v)}
    for key, attrs in g.nodes(data=True):
        mids = set(attrs["memory_ids"]) if keep is None else attrs["memory_ids"] & keep
        if keep is None or mids or key in ends:
            out.add_node(key, **{**attrs, "aliases": set(attrs["aliases"]), "memory_ids": mids,
                                 "mentions": len(mids)})
    out.add_edges_from(edges)
    return out


def _entity(key: str, attrs: Mapping[str, Any]) -> GraphEntity:
    return GraphEntity(
        key=key,
        name=attrs["name"],
        type=attrs["type"],
        aliases=sorted(attrs["aliases"]),
        memory_ids=sorted(attrs["memory_ids"]),
        mentions=attrs["mentions"],
        first_seen=attrs["first_seen"],
        last_seen=attrs["last_seen"],
    )
