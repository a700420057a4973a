"""graphrank.activate gives exactly what the plain definition gives: the same memories, in the
same order, with the same float signals, hops and paths. The fast version keeps one accumulator
per memory, formats each path label once and finds focus and topic members from the named
entities' memories; this test holds it to a loop written straight from the module docstring,
over random graphs, seeds, query entities, linked nodes and settings."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridmem.graph.state import UserGraph
from hybridmem.graph.activation import QUERY_MASS, STEP_DAMPING, UNEXPANDED_TYPES, activate
from hybridmem.models import Entity, Extraction

Similar = Callable[[Sequence[str], Sequence[str]], Sequence[float]]


def reference(g0: UserGraph, seeds: Sequence[tuple[str, float]], query_entities: Sequence[str],
              *, hops: int, episodic: float, max_fanout: int, focus: float, session: float,
              session_span: int, topic: float, similar: Similar | None,
              linked: Sequence[tuple[str, float]]) -> dict[str, tuple[float, int, str]]:
    """The definition, one contribution at a time, straight from the module docstring."""
    g = g0.graph
    total = max(len(g0.mem_nodes), len(g0.prevs) + 1, 2)
    log_n = math.log(total + 1)

    def spec(key: str) -> float:
        attrs = g.nodes[key]
        df = len(attrs["memory_ids"])
        if attrs["type"] in UNEXPANDED_TYPES or not 0 < df <= max_fanout:
            return 0.0
        return max(math.log((total + 1) / df) / log_n, 0.0)

    score: dict[str, float] = {}
    best: dict[str, float] = {}
    path: dict[str, str] = {}
    hop: dict[str, int] = {}

    def give(m: str, mass: float, label: str, h: int) -> None:
        if mass <= 0:
            return
        score[m] = score.get(m, 0.0) + mass
        if mass > best.get(m, 0.0):
            best[m], path[m] = mass, label
        hop[m] = min(hop.get(m, h), h)

    own = dict.fromkeys(query_entities)
    starts = [(k, QUERY_MASS, "named in the query") for k in own]
    starts += [(k, mass, "close to the query") for k, mass in linked if k not in own]
    for key, mass, why in starts:
        if key not in g or not spec(key) or mass <= 0:
            continue
        mids = g.nodes[key]["memory_ids"]
        for m in mids:
            give(m, mass * spec(key) / len(mids), f"{g.nodes[key]['name']} ({why})", 0)
    names = {m: f"hit {i}" for i, (m, _x) in enumerate(seeds, 1)}
    frontier = [(m, x, names[m]) for m, x in seeds if x > 0]
    damping = 1.0
    for step in range(1, hops + 1):
        reached: dict[str, float] = {}
        for source, mass, label in frontier:
            for near, where in ((g0.prevs.get(source), "before"), (g0.nexts.get(source), "after")):
                if near is not None and near != source:
                    moved = damping * mass * episodic
                    give(near, moved, f"said just {where} {label}", step)
                    if moved > 0:
                        reached[near] = reached.get(near, 0.0) + moved
            if session > 0 and step == 1:
                around: list[str] = []
                for links in (g0.prevs, g0.nexts):
                    cur = links.get(source)
                    cur = links.get(cur) if cur is not None else None
                    for _ in range(session_span):
                        if cur is None or cur == source:
                            break
                        around.append(cur)
                        cur = links.get(cur)
                for m in around:
                    give(m, damping * mass * session / len(around),
                         f"said in the same conversation as {label}", step)
            keys = sorted(k for k in g0.mem_nodes.get(source, ()) if spec(k) > 0)
            for key in keys:
                mids = g.nodes[key]["memory_ids"]
                if len(mids) < 2:
                    continue
                share = damping * mass * (1.0 - episodic) * spec(key) / len(keys) / len(mids)
                for m in mids:
                    if m != source:
                        give(m, share, f"{g.nodes[key]['name']}, shared with {label}", step)
                        if share > 0:
                            reached[m] = reached.get(m, 0.0) + share
        damping *= STEP_DAMPING
        if step < hops:
            frontier = [(m, reached[m], path[m]) for m in sorted(reached)]
    named = [k for k in dict.fromkeys(query_entities)
             if k in g and g.nodes[k]["type"] not in UNEXPANDED_TYPES]
    pool = [m for m in dict.fromkeys([m for m, _x in seeds] + list(score)) if m in g0.mem_nodes]
    if focus > 0:
        for key in named:
            for m in pool:
                if m in g.nodes[key]["memory_ids"]:
                    give(m, focus / len(named), f"{g.nodes[key]['name']} (named in the query)", 0)
    if topic > 0 and similar is not None:
        ownset = set(named)
        if ownset:
            pool = [m for m in pool if not ownset.isdisjoint(g0.mem_nodes[m])]
        keys = sorted(k for k in {k for m in pool for k in g0.mem_nodes[m]} - ownset
                      if g.nodes[k]["type"] not in UNEXPANDED_TYPES)
        if keys:
            sims = dict(zip(keys, similar(keys, [g.nodes[k]["name"] for k in keys]), strict=True))
            for m in pool:
                close = [(sims[k], k) for k in g0.mem_nodes[m] if k in sims]
                if close:
                    cos, key = max(close)
                    if cos > 0:
                        give(m, topic * cos,
                             f"{g.nodes[key]['name']} (close to the query's topic)", 0)
    order = sorted(score, key=lambda m: (-score[m], m))
    return {m: (score[m], hop[m], path[m]) for m in order}


TYPES = ["person", "place", "thing", "date", "amount"]
NAMES = [f"n{i}" for i in range(14)]


@st.composite
def cases(draw: st.DrawFn) -> tuple[UserGraph, dict[str, object]]:
    n = draw(st.integers(2, 30))
    ids = [f"m{i:02d}" for i in range(n)]
    graph = UserGraph("u", None)
    now = datetime(2024, 1, 1, tzinfo=timezone.utc)
    start = 0
    while start < n:  # batches: each one an episode (or not linked at all)
        size = draw(st.integers(1, 8))
        batch = ids[start:start + size]
        items = []
        for m in batch:
            named = draw(st.lists(st.sampled_from(NAMES), max_size=4, unique=True))
            items.append((m, Extraction(entities=[
                Entity(name=x, type=TYPES[int(x[1:]) % len(TYPES)]) for x in named],
                extractor="test")))
        graph.add(items, now, links=draw(st.booleans()))
        start += size
    keys = sorted(graph.graph.nodes)
    seeds = [(m, draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 0.3])))
             for m in draw(st.lists(st.sampled_from(ids), max_size=12, unique=True))]
    cos = {k: draw(st.sampled_from([-0.2, 0.0, 0.3, 0.5, 0.5, 0.9])) for k in keys}

    def similar(ks: Sequence[str], _names: Sequence[str]) -> list[float]:
        return [cos[k] for k in ks]

    kw: dict[str, object] = {
        "query_entities": draw(st.lists(st.sampled_from(keys + ["unknown"]), max_size=3))
        if keys else [],
        "hops": draw(st.integers(0, 3)),
        "episodic": draw(st.sampled_from([0.0, 0.5, 0.7])),
        "max_fanout": draw(st.sampled_from([3, 64])),
        "focus": draw(st.sampled_from([0.0, 0.4])),
        "session": draw(st.sampled_from([0.0, 1.0])),
        "session_span": draw(st.sampled_from([1, 3, 24])),
        "topic": draw(st.sampled_from([0.0, 0.45])),
        "similar": draw(st.sampled_from([None, similar])),
        "linked": [(k, draw(st.sampled_from([0.0, 0.2, 0.6])))
                   for k in draw(st.lists(st.sampled_from(keys), max_size=3))] if keys else [],
        "seeds": seeds,
    }
    return graph, kw


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_activate_is_the_plain_definition(case: tuple[UserGraph, dict[str, object]]) -> None:
    graph, kw = case
    seeds = kw.pop("seeds")
    entities = kw.pop("query_entities")
    fast = activate(graph, seeds, entities, **kw)  # type: ignore[arg-type]
    plain = reference(graph, seeds, entities, **kw)  # type: ignore[arg-type]
    assert list(fast.items()) == list(plain.items())
