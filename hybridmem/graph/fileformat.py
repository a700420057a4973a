"""The node-link JSON form of a user's entity graph: reading it back safely, writing it out.

The graph store keeps each user's graph as a ``networkx.DiGraph`` and saves it as node-link JSON
wrapped in ``{"schema": 1, "graph": ...}``. Reading is strict about what the store relies on (every
number a finite confidence, every time ISO 8601, every predicate a short non-empty name), because
the same reader loads our own files and graphs imported from elsewhere: a bad value must fail here,
naming what is wrong, not later inside a search.

In memory, node times are aware UTC datetimes and aliases and memory ids are sets; on disk they
are ISO strings and sorted lists. The graph's own attribute ``next`` ({memory id: memory id})
holds the episodic links (see :class:`hybridmem.graph.state.UserGraph`).
"""

from __future__ import annotations

import gc
import json
import math
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import networkx as nx
import orjson

from hybridmem.models import as_utc

__all__ = [
    "MAX_PREDICATE",
    "SCHEMA",
    "from_json_bytes",
    "gc_paused",
    "graph_from",
    "node_link",
    "refresh_edge",
    "to_json_bytes",
]

SCHEMA = 1
#: Longest predicate a relation may carry (as :class:`~hybridmem.models.Relation` allows).
MAX_PREDICATE = 100
_paused = threading.Lock()


@dataclass
class _Pauses:
    """The process's pauses of the collector (see :func:`gc_paused`; the collector is one per
    process, so this is too): how many are in progress, whether the collector was on when the
    first began, and whether one of them loaded a graph."""

    running: int = 0
    was_on: bool = False
    loaded: bool = False


_pausing = _Pauses()


@contextmanager
def gc_paused(*, load: bool = False) -> Iterator[None]:
    """No cyclic garbage collection inside the block (the process's own setting is restored when
    the last of several concurrent blocks ends). A graph load builds hundreds of thousands of
    containers, none of them garbage, and the collector walked them again and again: a third of
    a 10k-memory load (0.35 -> 0.23 s).

    ``load``: the block builds a graph that stays. When the last block ends, what was built
    meanwhile then goes to the collector's oldest generation at once (see :func:`_promote`),
    so the young collections that follow do not walk the new graph one or two more times (5k
    memories: ~10-20 ms of a first context). Blocks that only serialise a graph leave the
    generations alone."""
    with _paused:
        if not _pausing.running:
            _pausing.was_on = gc.isenabled()
            gc.disable()
        _pausing.running += 1
    try:
        yield
    finally:
        with _paused:
            _pausing.running -= 1
            _pausing.loaded = _pausing.loaded or load
            if not _pausing.running:
                if _pausing.was_on and _pausing.loaded:
                    _promote()
                _pausing.loaded = False
                if _pausing.was_on:
                    gc.enable()


def _promote() -> None:
    """Move every object the collector tracks to its oldest generation: ``gc.freeze()`` then
    ``gc.unfreeze()``, which splice lists and walk nothing. Objects another thread made young
    meanwhile go too, and their cyclic garbage waits for the next full collection. Skipped when
    the process froze objects itself (``gc.get_freeze_count()``, as a pre-forking server does to
    keep pages shared): unfreezing would undo that."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


def refresh_edge(attrs: dict[str, Any]) -> None:
    """Derive an edge's ``predicates``, ``memory_ids``, ``weight`` and ``confidence`` from its
    ``evidence`` ({predicate: {memory id: confidence}}), the one attribute that is the truth."""
    evidence: dict[str, dict[str, float]] = attrs["evidence"]
    attrs["predicates"] = list(evidence)
    attrs["memory_ids"] = {m for support in evidence.values() for m in support}
    attrs["weight"] = len(attrs["memory_ids"])
    attrs["confidence"] = max((c for s in evidence.values() for c in s.values()), default=0.0)


def _json_default(value: object) -> object:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def node_link(graph: nx.DiGraph[str]) -> dict[str, Any]:
    """The graph as JSON-safe ``{"schema": 1, "graph": node-link}`` (a deep copy)."""
    data = nx.node_link_data(graph, edges="edges")
    return {"schema": SCHEMA, "graph": json.loads(json.dumps(data, default=_json_default))}


def to_json_bytes(graph: nx.DiGraph[str]) -> bytes:
    """The graph file's bytes: :func:`node_link` as UTF-8 JSON, written by orjson (a dependency
    of Chroma's too), ~3x faster than ``json.dumps`` on a graph (5k memories: 42 -> 14 ms): a
    writer in server mode serialises the whole graph for each snapshot, an embedded one for
    each save. Times and sets go through the same :func:`_json_default` as ``json.dumps``."""
    data = {"schema": SCHEMA, "graph": nx.node_link_data(graph, edges="edges")}
    return orjson.dumps(data, default=_json_default,
                        option=orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS)


def from_json_bytes(raw: bytes) -> nx.DiGraph[str]:
    """The graph a file holds; ValueError (JSON, UTF-8 or shape) if it cannot be read back."""
    return graph_from(json.loads(raw))


def graph_from(data: object) -> nx.DiGraph[str]:
    """A DiGraph from ``{"schema": 1, "graph": node-link}`` or bare node-link; ValueError if bad.

    One pass over the nodes and one over the edges, each checked and normalised as it is read,
    then handed to networkx in bulk (``add_nodes_from`` / ``add_edges_from``): a cold load of a
    10k-memory graph spends its time here, and building the graph with ``node_link_graph`` first
    and fixing every attribute in a second walk cost about a third more."""
    if isinstance(data, Mapping) and "schema" in data:
        if data["schema"] != SCHEMA:
            raise ValueError(f"unsupported graph schema {data['schema']!r} (this version reads 1)")
        data = data.get("graph")
    if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), list):
        raise ValueError("expected a node-link object with 'nodes' and 'edges'")
    edges = data.get("edges")
    if not isinstance(edges, list):
        raise ValueError(f"not a node-link graph: 'edges' is {type(edges).__name__}, not a list")
    meta = data.get("graph") or {}
    if not isinstance(meta, Mapping):
        raise ValueError("the graph's own attributes ('graph') are not an object")
    nodes: dict[str, dict[str, Any]] = {}
    for raw in data["nodes"]:
        if not isinstance(raw, Mapping):
            raise ValueError(f"node {raw!r} is not an object")
        key = _node_key(raw.get("id"))
        attrs = dict(raw)
        del attrs["id"]
        if key in nodes:  # a node listed twice: the later attributes win
            attrs = {**nodes[key], **attrs}
        nodes[key] = _node_attrs(key, attrs)
    links: list[tuple[str, str, dict[str, Any]]] = []
    for raw in edges:
        if not isinstance(raw, Mapping):
            raise ValueError(f"edge {raw!r} is not an object")
        u, v = _node_key(raw.get("source")), _node_key(raw.get("target"))
        attrs = dict(raw)
        del attrs["source"], attrs["target"]
        if not _plain_edge(attrs):
            attrs["evidence"] = _evidence(attrs, f"edge {u!r} -> {v!r}")
            refresh_edge(attrs)
        links.append((u, v, attrs))
        # an edge may name a node the list left out
        if u not in nodes:
            nodes[u] = _node_attrs(u, {})
        if v not in nodes:
            nodes[v] = _node_attrs(v, {})
    nexts = meta.get("next", {})
    if not isinstance(nexts, Mapping) or not all(
        isinstance(a, str) and isinstance(b, str) for a, b in nexts.items()
    ):
        raise ValueError("graph attribute 'next' is not a {memory id: memory id} object")
    g: nx.DiGraph[str] = nx.DiGraph()
    g.graph.update(meta)
    g.graph["next"] = dict(nexts)
    g.add_nodes_from(nodes.items())
    g.add_edges_from(links)
    return g


def _node_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"node id {key!r} is not a non-empty string")
    return key


def _node_attrs(key: str, attrs: dict[str, Any]) -> dict[str, Any]:
    """A node's checked attributes (unknown ones are kept as they are)."""
    attrs["name"] = str(attrs.get("name") or key)
    attrs["type"] = str(attrs.get("type") or "thing")
    attrs["aliases"] = set(_strings(attrs.get("aliases") or [attrs["name"]], f"{key}: aliases"))
    attrs["memory_ids"] = set(_strings(attrs.get("memory_ids") or [], f"{key}: memory_ids"))
    attrs["mentions"] = len(attrs["memory_ids"])
    attrs["first_seen"] = _time(attrs.get("first_seen"), f"{key}: first_seen")
    last = _time(attrs.get("last_seen"), f"{key}: last_seen")
    attrs["last_seen"] = attrs["first_seen"] if last is None else last
    return attrs


def _plain_edge(attrs: dict[str, Any]) -> bool:
    """Check and derive an edge whose evidence is already in normal form (what our own files
    hold): {non-empty predicate: {memory id: float confidence in [0, 1]}}. Sets what
    :func:`refresh_edge` would and returns True; returns False, changing nothing, at the first
    value that is not plain, so that :func:`_evidence` normalises it or names what is wrong.

    One pass that checks, copies and derives at once: the separate check, copy and
    :func:`refresh_edge` walks were half of a 100k-memory load (81k edges)."""
    evidence = attrs.get("evidence")
    if type(evidence) is not dict:
        return False
    out: dict[str, dict[str, float]] = {}
    mids: set[str] = set()
    top = -1.0
    for pred, support in evidence.items():
        if (type(pred) is not str or type(support) is not dict
                or not 0 < len(pred) <= MAX_PREDICATE or not pred.strip()):
            return False
        for mid, conf in support.items():
            if type(mid) is not str or type(conf) is not float or not 0.0 <= conf <= 1.0:
                return False
            if conf > top:
                top = conf
        out[pred] = dict(support)
        mids.update(support)
    attrs["evidence"] = out
    attrs["predicates"] = list(out)
    attrs["memory_ids"] = mids
    attrs["weight"] = len(mids)
    attrs["confidence"] = top if top >= 0.0 else 0.0
    return True


def _evidence(attrs: Mapping[str, Any], where: str) -> dict[str, dict[str, float]]:
    """An edge's checked evidence; a graph written by someone else gets it rebuilt from its
    ``predicates``, ``memory_ids`` and ``confidence``."""
    evidence = attrs.get("evidence")
    if not isinstance(evidence, Mapping):
        conf = attrs.get("confidence", 1.0)
        mids = _strings(attrs.get("memory_ids") or [], f"{where}: memory_ids")
        preds = _strings(attrs.get("predicates") or ["related_to"], f"{where}: predicates")
        evidence = {p: dict.fromkeys(mids, conf) for p in preds}
    out: dict[str, dict[str, float]] = {}
    for pred, support in evidence.items():
        if not isinstance(pred, str) or not pred.strip() or len(pred) > MAX_PREDICATE:
            raise ValueError(f"{where}: predicate {pred!r} is not 1-{MAX_PREDICATE} characters")
        if not isinstance(support, Mapping):
            raise ValueError(f"{where}: evidence of {pred!r} is not a {{memory id: confidence}}")
        out[pred] = {str(m): _confidence(c, f"{where}: {pred}") for m, c in support.items()}
    return out


def _strings(values: object, where: str) -> list[str]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{where} is not a list")
    return [str(v) for v in values]


def _confidence(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{where}: confidence {value!r} is not a number")
    try:
        conf = float(value)
    except ValueError as exc:
        raise ValueError(f"{where}: confidence {value!r} is not a number") from exc
    if not (math.isfinite(conf) and 0.0 <= conf <= 1.0):
        raise ValueError(f"{where}: confidence {value!r} is not between 0 and 1")
    return conf


def _time(value: object, where: str) -> datetime | None:
    """An aware UTC datetime from an ISO 8601 string (naive ones are UTC), or None when absent."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return as_utc(value)
    if isinstance(value, str):
        try:
            return as_utc(datetime.fromisoformat(value))
        except ValueError:
            pass
    raise ValueError(f"{where} {value!r} is not an ISO 8601 time")


def append_op(path: Path, op: Mapping[str, Any]) -> int:
    """Append one change to a graph's log as a JSON line, fsync'd; returns the bytes written.

    Appends are the whole cost of a graph write (O(its own entities)); the snapshot is rewritten
    only when the log outgrows it (see ``NetworkXGraphStore``)."""
    line = json.dumps(op, default=_json_default, ensure_ascii=False).encode("utf-8") + b"\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(line)


def read_ops(path: Path) -> list[dict[str, Any]]:
    """The changes in a graph's log, oldest first. A torn last line (the process died while
    appending it) is dropped and cut off the file; a bad line anywhere else is corruption."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    ops: list[dict[str, Any]] = []
    lines = raw.split(b"\n")
    for number, line in enumerate(lines):
        if not line:
            continue
        try:
            op = json.loads(line)
            if not isinstance(op, dict) or op.get("op") not in ("add", "remove"):
                raise ValueError("not a graph change")
        except ValueError:
            if number == len(lines) - 1:  # unterminated: an append cut short by a crash
                with open(path, "r+b") as handle:
                    handle.truncate(sum(len(x) + 1 for x in lines[:number]))
                    handle.flush()
                    os.fsync(handle.fileno())
                break
            raise ValueError(f"line {number + 1} of {path} is not a graph change") from None
        ops.append(op)
    return ops


def truncate(path: Path) -> None:
    """Empty a graph's log after its changes were folded into the snapshot (durably)."""
    try:
        with open(path, "r+b") as handle:
            handle.truncate(0)
            handle.flush()
            os.fsync(handle.fileno())
    except FileNotFoundError:
        pass
