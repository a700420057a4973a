"""NetworkXGraphStore: one entity graph per user, so search can reach memories through entities.

A memory that shares no word with the query can still be found when its entities are connected
to the query's ("ROG laptop" <-complements- "Dell 4K monitor"). Each user's graph is a
``networkx.DiGraph`` kept in memory and saved atomically to ``data_dir/users/<hash>/graph.json``
as node-link JSON wrapped in ``{"schema": 1, "graph": ...}`` (see :mod:`hybridmem._graphio`).

Nodes are keyed by :func:`hybridmem.text.entity_key`, so "ROG laptop", "the rog  Laptop" and
"ROG Laptop." are one node. Node attributes: ``name`` (first surface form), ``type``, ``aliases``
(surface forms), ``first_seen``/``last_seen`` (UTC), ``mentions`` (number of memories mentioning
it) and ``memory_ids``. Edge attributes: ``predicates``, ``evidence`` ({predicate: {memory id:
confidence}}, so forgetting a memory removes exactly the predicates it supported), ``memory_ids``,
``weight`` (number of supporting memories) and ``confidence`` (max).

Stores only store: the extractor decides what the entities are; ranking decides what hops are worth.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import networkx as nx

from hybridmem._files import atomic_write_bytes, user_dir, user_key, user_lock
from hybridmem._graphio import (
    MAX_PREDICATE,
    SCHEMA,
    from_json_bytes,
    graph_from,
    node_link,
    refresh_edge,
    to_json_bytes,
)
from hybridmem.errors import ClosedError, CorruptStateError, InvalidInputError, StorageError
from hybridmem.models import Extraction, GraphEntity, GraphRelation, as_utc, utcnow
from hybridmem.text import entity_key, words

__all__ = ["GRAPH_FILE", "MAX_NGRAM", "SCHEMA", "NetworkXGraphStore"]

log = logging.getLogger(__name__)

GRAPH_FILE = "graph.json"
#: Longest entity name (in words) that :meth:`NetworkXGraphStore.entities_in` can recognise.
MAX_NGRAM = 6
_NOT_ENTITIES = frozenset({"i", "me", "my", "you", "it", "we", "us", "he", "she", "they", "this"})
_Edge = tuple[str, str]


@dataclass
class _UserGraph:
    """One user's graph and the indexes derived from it (rebuilt on load, never saved)."""

    user_id: str
    path: Path | None  # None: in-memory store
    graph: nx.DiGraph[str] = field(default_factory=nx.DiGraph)
    stamp: tuple[int, int] | None = None  # (mtime_ns, size) of the file last read or written
    aliases: dict[str, set[str]] = field(default_factory=dict)  # canonical alias -> node keys
    mem_nodes: dict[str, set[str]] = field(default_factory=dict)
    mem_edges: dict[str, set[_Edge]] = field(default_factory=dict)

    def index(self) -> None:
        self.aliases.clear()
        self.mem_nodes.clear()
        self.mem_edges.clear()
        for key, attrs in self.graph.nodes(data=True):
            for alias in {key, *attrs["aliases"]}:
                self.aliases.setdefault(entity_key(alias), set()).add(key)
            for mid in attrs["memory_ids"]:
                self.mem_nodes.setdefault(mid, set()).add(key)
        for u, v, attrs in self.graph.edges(data=True):
            for mid in attrs["memory_ids"]:
                self.mem_edges.setdefault(mid, set()).add((u, v))

    def resolve(self, name: str, key: str | None = None) -> str | None:
        """The existing node a name or alias (or its canonical ``key``) refers to, or None."""
        key = entity_key(name) if key is None else key
        if key in self.graph:
            return key
        found = self.aliases.get(key)
        return min(found) if found else None


class NetworkXGraphStore:
    """The default :class:`~hybridmem.protocols.GraphStore`: per-user DiGraphs persisted as JSON.

    Thread-safe (one lock per instance) and multi-process-safe for writes: every write holds the
    user's file lock, re-reads the file if another process changed it, applies the change and saves.
    Reads re-read the file only when its mtime or size changed.

    ``neighbourhood`` is bounded: at most ``max_nodes`` nodes are reached and ``max_memories``
    memories returned; a *hub* (more than ``hub_degree`` edges or memories, or named in over a
    third of the user's memories) reached from a seed contributes the memories of the edge that
    reached it, but neither its own memories nor its neighbours, so "user -bought-> everything"
    does not pull every memory in at one hop.

    ``data_dir=None`` keeps the graphs in memory only (no files, no file locks, ``save`` does
    nothing): for callers that persist extractions elsewhere and replay them into this store, like
    :class:`hybridmem.shared.ChromaGraphStore`, so the graph logic exists once.
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
    ) -> None:
        self.data_dir = None if data_dir is None else Path(data_dir)
        self.autosave = autosave
        self.max_nodes = max_nodes
        self.max_memories = max_memories
        self.hub_degree = hub_degree
        self.co_mentions = co_mentions
        self._lock = threading.RLock()
        self._users: dict[str, _UserGraph] = {}
        self._dirty: set[str] = set()
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

    def _state(self, user_id: str) -> _UserGraph:
        """The user's graph, loaded lazily and re-read if another process rewrote the file."""
        self._check_open()
        key = user_key(user_id)
        st = self._users.get(key)
        if st is None:
            st = self._users[key] = _UserGraph(user_id, self._path(user_id))
            self._load(st)
        elif key not in self._dirty and _stamp(st.path) != st.stamp:
            self._load(st)
        return st

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the graph store is closed; create a new NetworkXGraphStore")

    def _load(self, st: _UserGraph) -> None:
        stamp = _stamp(st.path)
        if stamp is None or st.path is None:
            st.graph, st.stamp = nx.DiGraph(), None
        else:
            try:
                st.graph = from_json_bytes(st.path.read_bytes())
            except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeError are ValueErrors
                raise CorruptStateError(
                    f"graph file {st.path} cannot be read ({exc}); restore it from an export or "
                    "move it away to start this user's graph empty"
                ) from exc
            st.stamp = stamp
        st.index()
        log.debug("graph %s loaded: %d nodes", st.path, st.graph.number_of_nodes())

    def _save(self, user_id: str, st: _UserGraph) -> None:
        if self.data_dir is None or st.path is None:
            return
        user_dir(self.data_dir, user_id)  # create the directory on first write
        atomic_write_bytes(st.path, to_json_bytes(st.graph))
        st.stamp = _stamp(st.path)
        self._dirty.discard(user_key(user_id))

    def _written(self, user_id: str, st: _UserGraph) -> None:
        if self.autosave:
            self._save(user_id, st)
        else:
            self._dirty.add(user_key(user_id))

    def save(self, user_id: str) -> None:
        """Write the user's graph now (only needed with ``autosave=False``)."""
        with self._lock, self._file_lock(user_id):
            self._save(user_id, self._state(user_id))

    def refresh(self, user_id: str) -> None:
        """Re-read the user's file if another process rewrote it (every read checks anyway)."""
        with self._lock:
            self._state(user_id)

    # ---------------------------------------------------------------- writes

    def add_extraction(
        self, user_id: str, memory_id: str, extraction: Extraction, *, at: datetime | None = None
    ) -> None:
        """Add one memory's entities and relations (``at`` stamps first/last seen; default now)."""
        self.add_extractions(user_id, [(memory_id, extraction)], at=at)

    def add_extractions(
        self, user_id: str, items: Sequence[tuple[str, Extraction]], *, at: datetime | None = None
    ) -> None:
        """Add many memories' extractions and save once. Re-adding a memory is idempotent."""
        if not items:
            return
        seen = as_utc(at or utcnow())
        with self._lock, self._file_lock(user_id):
            st = self._state(user_id)
            for memory_id, extraction in items:
                names = [e.name for e in extraction.entities]
                names += [n for r in extraction.relations for n in (r.subject, r.object)]
                keys = {n: entity_key(n) for n in dict.fromkeys(names)}
                types = {keys[e.name]: e.type for e in extraction.entities}
                for ent in extraction.entities:
                    self._node(st, ent.name, keys[ent.name], ent.type, memory_id, seen)
                for rel in extraction.relations:
                    u, v = (
                        self._node(st, n, keys[n], types.get(keys[n], "thing"), memory_id, seen)
                        for n in (rel.subject, rel.object)
                    )
                    if u is None or v is None or u == v:
                        continue
                    if not st.graph.has_edge(u, v):
                        st.graph.add_edge(u, v, evidence={})
                    attrs = st.graph.edges[u, v]
                    pred = "_".join(rel.predicate.casefold().split())[:MAX_PREDICATE]
                    pred = pred or "related_to"  # (casefolding can lengthen: "ß" -> "ss")
                    support = attrs["evidence"].setdefault(pred, {})
                    support[memory_id] = max(support.get(memory_id, 0.0), rel.confidence)
                    refresh_edge(attrs)
                    st.mem_edges.setdefault(memory_id, set()).add((u, v))
            self._written(user_id, st)

    @staticmethod
    def _node(
        st: _UserGraph, name: str, canon: str, type_: str, memory_id: str, seen: datetime
    ) -> str | None:
        """Create or update the node for ``name``; the same entity never becomes two nodes."""
        key = st.resolve(name, canon) or canon
        if not key:
            return None
        g = st.graph
        if key not in g:
            g.add_node(
                key,
                name=name.strip(),
                type=type_,
                aliases=set(),
                first_seen=seen,
                last_seen=seen,
                mentions=0,
                memory_ids=set(),
            )
        attrs = g.nodes[key]
        attrs["aliases"].add(" ".join(name.split()))
        st.aliases.setdefault(canon, set()).add(key)
        if attrs["type"] == "thing" and type_ != "thing":
            attrs["type"] = type_  # a more specific type wins over the generic one
        attrs["last_seen"] = max(attrs["last_seen"] or seen, seen)
        attrs["first_seen"] = min(attrs["first_seen"] or seen, seen)
        if memory_id not in attrs["memory_ids"]:
            attrs["memory_ids"].add(memory_id)
            attrs["mentions"] = len(attrs["memory_ids"])
            st.mem_nodes.setdefault(memory_id, set()).add(key)
        return key

    def remove_memory(self, user_id: str, memory_ids: Sequence[str]) -> None:
        """Forget memories: drop them from provenance, then edges and nodes nothing supports."""
        with self._lock, self._file_lock(user_id):
            st = self._state(user_id)
            g, changed = st.graph, False
            touched: set[str] = set()
            for mid in memory_ids:
                for u, v in st.mem_edges.pop(mid, set()):
                    if not g.has_edge(u, v):
                        continue
                    attrs = g.edges[u, v]
                    for pred in list(attrs["evidence"]):
                        attrs["evidence"][pred].pop(mid, None)
                        if not attrs["evidence"][pred]:
                            del attrs["evidence"][pred]
                    refresh_edge(attrs)
                    if not attrs["evidence"]:
                        g.remove_edge(u, v)
                    touched.update((u, v))
                    changed = True
                for key in st.mem_nodes.pop(mid, set()):
                    if key in g:
                        g.nodes[key]["memory_ids"].discard(mid)
                        g.nodes[key]["mentions"] = len(g.nodes[key]["memory_ids"])
                        touched.add(key)
                        changed = True
            for key in touched:
                if key in g and not g.nodes[key]["memory_ids"] and g.degree(key) == 0:
                    g.remove_node(key)
            if changed:
                st.index()
                self._written(user_id, st)

    def import_graph(self, user_id: str, data: Mapping[str, Any]) -> None:
        """Replace the user's graph with an :meth:`export` (or any node-link dict) and save it;
        InvalidInputError (naming the bad value) when it is malformed."""
        try:
            g = graph_from(data)
        except ValueError as exc:
            raise InvalidInputError(f"cannot import graph: {exc}") from exc
        with self._lock, self._file_lock(user_id):
            st = self._state(user_id)
            st.graph = g
            st.index()
            self._save(user_id, st)

    def drop_user(self, user_id: str) -> None:
        """Delete the user's graph file and forget the cached graph."""
        self._check_open()
        with self._lock, self._file_lock(user_id):
            path = self._path(user_id)
            try:
                if path is not None:
                    path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StorageError(f"could not delete {path}: {exc}") from exc
            self._users.pop(user_key(user_id), None)
            self._dirty.discard(user_key(user_id))

    def close(self) -> None:
        """Save graphs left unsaved (``autosave=False``), forget the caches; idempotent."""
        with self._lock:
            if self._closed:
                return
            try:
                for key in sorted(self._dirty):
                    st = self._users[key]
                    with self._file_lock(st.user_id):
                        self._save(st.user_id, st)
            finally:
                self._closed = True
                self._users.clear()
                self._dirty.clear()

    # ---------------------------------------------------------------- reads

    def entities_in(self, user_id: str, text: str) -> list[str]:
        """Keys of known entities named in ``text``, longest match first (word n-grams, n <= 6).

        One dict lookup per n-gram in the alias index, so it costs the same at 10 nodes or 10k.
        Single pronoun-like words ("it", "my") never match.
        """
        with self._lock:
            st = self._state(user_id)
            # A token that is only punctuation (" - ") normalises to no word; it stays as "" so
            # that no n-gram spans it.
            tokens = [w for token in text.split() for w in words(token) or [""]]
            found: dict[str, None] = {}
            i, n = 0, len(tokens)
            while i < n:
                for size in range(min(MAX_NGRAM, n - i), 0, -1):
                    gram = tokens[i : i + size]
                    if not all(gram) or (size == 1 and gram[0] in _NOT_ENTITIES):
                        continue
                    keys = st.aliases.get(" ".join(gram))
                    if keys:
                        found.update(dict.fromkeys(sorted(keys)))
                        i += size
                        break
                else:
                    i += 1
            return list(found)

    def neighbourhood(
        self, user_id: str, entities: Sequence[str], *, hops: int
    ) -> dict[str, tuple[int, str]]:
        """memory id -> (hops, readable path) for memories within ``hops`` of the seed entities.

        Breadth-first in both edge directions, so the first time a memory is seen is its smallest
        hop count. Hub seeds are skipped (see ``_hub``). Hop 0: memories mentioning a seed. Hop h:
        memories mentioning a node h edges away (or supporting the edge that reached it). With
        ``co_mentions`` two entities of one memory are also neighbours ("A -mentioned_with-> B"),
        which connects what rules cannot relate.
        """
        if hops < 0:
            raise InvalidInputError("hops must be >= 0")
        with self._lock:
            st = self._state(user_id)
            g = st.graph
            seeds = [k for k in dict.fromkeys(st.resolve(e) for e in entities) if k is not None]
            # A hub seed (the speaker of every "I ..." turn) says nothing about the question:
            # starting from it would pull in an arbitrary slice of the user's memories.
            seeds = [k for k in seeds if not self._hub(st, k)]
            parent: dict[str, tuple[str, str] | None] = {k: None for k in seeds[: self.max_nodes]}
            found: dict[str, tuple[int, str]] = {}

            def route(node: str, *extra: str) -> str:
                steps, start = list(extra), node
                while (step := parent[node]) is not None:
                    node, label = step
                    steps.insert(0, label)
                return ", ".join(steps) or g.nodes[start]["name"]

            def collect(mids: Iterable[str], hop: int, path: str) -> None:
                for mid in sorted(mids):
                    if mid not in found and len(found) < self.max_memories:
                        found[mid] = (hop, path)

            frontier = list(parent)
            for key in frontier:
                collect(g.nodes[key]["memory_ids"], 0, route(key))
            for hop in range(1, hops + 1):
                nxt: list[str] = []
                for u in frontier:
                    if hop > 1 and self._hub(st, u):
                        continue  # reached hubs give their edge's memories but are not expanded
                    for v, label, mids in self._neighbours(st, u):
                        collect(mids, hop, route(u, label))
                        if v in parent or len(parent) >= self.max_nodes:
                            continue
                        parent[v] = (u, label)
                        nxt.append(v)
                        if not self._hub(st, v):
                            collect(g.nodes[v]["memory_ids"], hop, route(v))
                frontier = nxt
                if not frontier or len(found) >= self.max_memories:
                    break
            return found

    def _hub(self, st: _UserGraph, key: str) -> bool:
        """Too connected to mean anything: many edges or memories, or (IDF-like) mentioned by more
        than a third of the user's memories, like the speaker of every "I ..." statement."""
        mentions = len(st.graph.nodes[key]["memory_ids"])
        if st.graph.degree(key) > self.hub_degree or mentions > self.hub_degree:
            return True
        return mentions >= 4 and mentions * 3 > len(st.mem_nodes)

    def _neighbours(self, st: _UserGraph, u: str) -> list[tuple[str, str, set[str]]]:
        """(node, label, supporting memory ids): relation edges by weight, then co-mentions."""
        g = st.graph
        out = [(v, _label(g, u, v), a["memory_ids"], -a["weight"]) for v, a in g.succ[u].items()]
        out += [(v, _label(g, v, u), a["memory_ids"], -a["weight"]) for v, a in g.pred[u].items()]
        out.sort(key=lambda t: (t[3], t[0]))
        rows = [(v, label, mids) for v, label, mids, _w in out]
        if self.co_mentions and not self._hub(st, u):
            related = set(g.succ[u]) | set(g.pred[u]) | {u}
            others = {v for m in g.nodes[u]["memory_ids"] for v in st.mem_nodes.get(m, ())}
            name = g.nodes[u]["name"]
            rows += [
                (v, f"{name} -mentioned_with-> {g.nodes[v]['name']}", set())
                for v in sorted(others - related)
            ]
        return rows

    def entities_of(self, user_id: str, memory_ids: Sequence[str]) -> list[str]:
        """Keys of the entities the given memories mention (sorted)."""
        with self._lock:
            st = self._state(user_id)
            return sorted({k for m in memory_ids for k in st.mem_nodes.get(m, ())})

    def entity(self, user_id: str, name: str) -> GraphEntity | None:
        """The node a name or alias refers to, or None."""
        with self._lock:
            st = self._state(user_id)
            key = st.resolve(name)
            return None if key is None else _entity(key, st.graph.nodes[key])

    def entities(self, user_id: str) -> list[GraphEntity]:
        """Every node of the user's graph, sorted by key."""
        with self._lock:
            g = self._state(user_id).graph
            return [_entity(key, g.nodes[key]) for key in sorted(g)]

    def relations(
        self, user_id: str, memory_ids: Sequence[str] | None = None
    ) -> list[GraphRelation]:
        """One relation per (edge, predicate), with display names, keys, the supporting memory ids
        (sorted) and the highest confidence; only those the given memories support if set.
        Sorted by (subject key, predicate, object key)."""
        with self._lock:
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
        ("Alice -bought-> ROG laptop"); [] when either is unknown or no path is short enough."""
        with self._lock:
            st = self._state(user_id)
            g = st.graph
            src, dst = st.resolve(a), st.resolve(b)
            if src is None or dst is None or src == dst:
                return []
            paths = nx.single_source_shortest_path(
                g.to_undirected(as_view=True), src, cutoff=max_depth
            )
            nodes = paths.get(dst, [])
            return [
                _label(g, u, v) if g.has_edge(u, v) else _label(g, v, u) for u, v in pairwise(nodes)
            ]

    def export(self, user_id: str) -> dict[str, Any]:
        """The user's graph as JSON-safe ``{"schema": 1, "graph": node-link}``."""
        with self._lock:
            return node_link(self._state(user_id).graph)


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


def _label(g: nx.DiGraph[str], u: str, v: str) -> str:
    """An edge as text in its own direction: "Alice -bought/returned-> ROG laptop"."""
    preds = "/".join(g.edges[u, v]["predicates"])
    return f"{g.nodes[u]['name']} -{preds}-> {g.nodes[v]['name']}"


def _stamp(path: Path | None) -> tuple[int, int] | None:
    if path is None:
        return None
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return (info.st_mtime_ns, info.st_size)
