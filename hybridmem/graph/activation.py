"""Graph retrieval over one user's graph: spreading activation, which search ranks by, and the
hop neighbourhood of entities. Pure: both read a :class:`~hybridmem.graph.state.UserGraph`, never a
file; the store (:mod:`hybridmem.graph.store`) loads and locks the graph and calls them.

- :func:`activate` — memory id -> (graph signal, hops, path) from seed memories and the query's
  entities, a truncated Personalized PageRank in the manner of HippoRAG (Gutiérrez et al. 2024).
- :func:`neighbourhood` — memory id -> (hops, path) for memories within ``hops`` edges of some
  entities, breadth-first and bounded (see its docstring).

Separate from the store because what a walk reaches, and with what weight, is retrieval: the
store only loads, persists and locks.

How :func:`activate` spreads. The graph is bipartite — memories on one side, entities on the other —
plus *episodic* links between memories written one after the other in one batch (a session's turns,
a question and its answer). Activation starts as seed mass ``x(s)`` on memories (a top hit's
pre-graph score divided by the best one's, so the best hit has 1) and on the query's entities (mass
:data:`QUERY_MASS`). One step moves it:

- memory ``s`` -> its episodic neighbours: ``x(s) * EPISODIC`` each;
- memory ``s`` -> the other memories of its conversation (``session``, Settings
  ``graph_session``; step 1 only): the up to :data:`SESSION_SPAN` memories on each side along its
  episodic chain, beyond its two neighbours, share ``x(s) * session`` equally — a conversation
  keeps to its topics, so a strong hit says a little about every turn around it;
- memory ``s`` -> entity ``e`` -> memory ``m``: ``x(s) * (1 - EPISODIC) * spec(e) / n(s) / df(e)``,
  where ``n(s)`` is the number of expandable entities of ``s`` and ``df(e)`` the number of memories
  naming ``e`` (a random walk's split, so a hub passes almost nothing on);
- ``spec(e) = log((N + 1) / df(e)) / log(N + 1)``, an IDF in [0, 1] over the user's ``N``
  memories: an entity most memories name says little about any of them. It stands in for a hard
  hub cut-off (the one :func:`neighbourhood` makes); only entities with ``df(e) > max_fanout`` are
  skipped, to bound the cost (each would pass on less than ``1 / max_fanout`` of its mass anyway).

Dates and amounts are attributes, not bridges: nodes of those types are never expanded. A memory's
graph signal ``g(m)`` is the mass that reached it from *other* memories or the query's entities
(``hops`` steps, each further step damped by :data:`STEP_DAMPING`), so two top hits that share a
specific entity, or a hit and the turn that answers it, lift each other. The path of the largest
contribution is kept for ``why``.

*Query focus* (``focus``, Settings ``graph_focus``): a hit, or a memory the spread reached, that
names entities of the query gets ``focus * (query entities it names) / (query entities known)``
more, whatever their specificity. A multi-hop question asks about one person ("what did Melanie
paint?"), who is the speaker of hundreds of turns — a hub that specificity rightly stops from
spreading, but still the best filter among the hits. Focus never brings a memory in by itself:
only memories among the seeds (every candidate, with mass 0 beyond the best few) or reached by
the spread get it.

*Topic* (``topic``, Settings ``graph_topic``; needs ``similar``, the cosine of the query's
embedding to node names, which the read path computes from the name vectors made when the nodes
were written, see :mod:`hybridmem.graph.name_vectors`): focus lifts
all of a person's turns alike, but a question about one person asks about one topic of theirs
("what activities does Melanie do?" against "Melanie: I signed up for a pottery class"). So a
memory of the pool that gets focus (or any memory of the pool when the query names no known
entity) also gets ``topic * max(0, max_e cos(query, name(e)))`` over its entities and concepts
``e`` other than the query's own (and never dates or amounts): a concept's short name is a
sharper statement of a turn's topic than the whole turn's vector, which the vector signal
already counts. Like focus it never brings a memory in by itself.

*Query linking* (Settings ``graph_link``; needs the read path's name vectors): the query names
its entities by their words only, but a question about "activities" never names "pottery class".
So the nodes whose names are closest to the query's embedding (the :data:`LINK_NODES` best, above
:data:`LINK_FLOOR`, as HippoRAG links a query to graph nodes by embedding) are seeds too, with
mass ``graph_link * cosine``, spread to their memories like the query's own entities (specificity
included). Unlike focus and topic, this can bring memories in.

The result is ordered by signal, ties by memory id, so that a caller that keeps the first ``n``
picks the same memories in an export/import copy of the user.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from hybridmem.graph.state import UserGraph, edge_label

__all__ = [
    "EPISODIC",
    "FOCUS",
    "LINK_FLOOR",
    "LINK_NODES",
    "MAX_FANOUT",
    "QUERY_MASS",
    "SESSION",
    "SESSION_SPAN",
    "STEP_DAMPING",
    "TOPIC",
    "UNEXPANDED_TYPES",
    "activate",
    "neighbourhood",
]

#: Share of a memory's mass that flows to its episodic neighbours (each), the rest to entities.
EPISODIC = 0.5
#: Graph signal a hit gets for naming every entity of the query (see "query focus" above).
FOCUS = 0.4
#: Share of a seed's mass spread over the rest of its conversation (see above).
SESSION = 1.0
#: Memories on each side of a seed, along its episodic chain, that the session share reaches.
SESSION_SPAN = 24
#: Graph signal per unit of cosine between the query and a memory's closest node name (see above).
TOPIC = 0.45
#: Similarity of the query to nodes (their keys and names; one float a node, in order).
Similar = Callable[[Sequence[str], Sequence[str]], Sequence[float]]
#: Nodes linked to a query by the embedding of their names, and the least cosine that links one.
LINK_NODES = 5
LINK_FLOOR = 0.3
#: Seed mass of an entity the query names (the best hit has 1).
QUERY_MASS = 1.0
#: A further step's mass is multiplied by this.
STEP_DAMPING = 0.5
#: Entities named by more memories than this are not expanded (bounds the cost per query).
MAX_FANOUT = 64
#: Entity types that are attributes of a memory, not bridges between memories.
UNEXPANDED_TYPES = frozenset({"date", "amount"})

#: memory id -> (graph signal, hops from the nearest seed, readable path)
Reached = dict[str, tuple[float, int, str]]


def activate(
    st: UserGraph,
    seeds: Sequence[tuple[str, float]],
    query_entities: Sequence[str],
    *,
    hops: int = 1,
    episodic: float = EPISODIC,
    max_fanout: int = MAX_FANOUT,
    focus: float = FOCUS,
    session: float = SESSION,
    session_span: int = SESSION_SPAN,
    topic: float = TOPIC,
    similar: Similar | None = None,
    linked: Sequence[tuple[str, float]] = (),
) -> Reached:
    """memory id -> (graph signal, hops, readable path) from seed memories (id, mass) and the
    keys of the entities the query names. ``hops=0``: only the query's entities spread. Seeds
    of mass 0 do not spread but may get query focus and topic. ``similar`` (names -> cosine to
    the query) enables the topic signal of weight ``topic``. ``linked``: (node key, mass) of
    nodes whose names are close to the query (see "query linking" above).

    How it is fast (a search calls it once; at 10k memories it gives ~1,000 contributions):
    each memory's sum, largest contribution, its path and least hop live in one list, updated
    inline, and a path label is formatted once per node or seed, not per memory it reaches.
    The order of the contributions each memory gets is that of the definition above, so every
    float sum, tie and path is the same as a plain loop's."""
    g = st.graph
    nodes, mem_nodes, prevs, nexts = g.nodes, st.mem_nodes, st.prevs, st.nexts
    total = max(len(mem_nodes), len(prevs) + 1, 2)
    log_n = math.log(total + 1)
    spec_cache: dict[str, float] = {}

    def spec(key: str) -> float:
        """IDF-like specificity; 0 for what is never expanded."""
        found = spec_cache.get(key)
        if found is None:
            attrs = nodes[key]
            df = len(attrs["memory_ids"])
            expandable = attrs["type"] not in UNEXPANDED_TYPES and 0 < df <= max_fanout
            found = spec_cache[key] = (
                max(math.log((total + 1) / df) / log_n, 0.0) if expandable else 0.0
            )
        return found

    #: memory id -> [signal, largest contribution, its path, least hop]
    acc: dict[str, list[Any]] = {}

    def give(targets: Iterable[str], mass: float, label: str, h: int,
             skip: str | None = None) -> None:
        """One contribution of ``mass`` to each of ``targets`` (but ``skip``)."""
        if mass <= 0:
            return
        get = acc.get
        for m in targets:
            if m == skip:
                continue
            a = get(m)
            if a is None:
                acc[m] = [mass, mass, label, h]
            else:
                a[0] += mass
                if mass > a[1]:
                    a[1], a[2] = mass, label
                if h < a[3]:
                    a[3] = h

    own = dict.fromkeys(query_entities)
    starts = [(k, QUERY_MASS, "named in the query") for k in own]
    starts += [(k, mass, "close to the query") for k, mass in linked if k not in own]
    for key, mass, why in starts:
        if key not in g or not spec(key) or mass <= 0:
            continue
        attrs = nodes[key]
        mids = attrs["memory_ids"]
        give(mids, mass * spec(key) / len(mids), f"{attrs['name']} ({why})", 0)

    names = {m: f"hit {i}" for i, (m, _x) in enumerate(seeds, 1)}
    frontier = [(m, x, names[m]) for m, x in seeds if x > 0]
    damping = 1.0
    for step in range(1, hops + 1):
        reached: dict[str, float] | None = {} if step < hops else None  # the next frontier

        def passed(targets: Iterable[str], mass: float, skip: str | None = None) -> None:
            if reached is not None and mass > 0:
                for m in targets:
                    if m != skip:
                        reached[m] = reached.get(m, 0.0) + mass

        for source, mass, label in frontier:
            for near, where in ((prevs.get(source), "before"), (nexts.get(source), "after")):
                if near is not None and near != source:
                    moved = damping * mass * episodic
                    give((near,), moved, f"said just {where} {label}", step)
                    passed((near,), moved)
            if session > 0 and step == 1:
                around: list[str] = []
                for links in (prevs, nexts):
                    cur = links.get(source)
                    cur = links.get(cur) if cur is not None else None  # the neighbour has its share
                    for _ in range(session_span):
                        if cur is None or cur == source:
                            break
                        around.append(cur)
                        cur = links.get(cur)
                if around:
                    give(around, damping * mass * session / len(around),
                         f"said in the same conversation as {label}", step)
            # sorted: a set's order changes with PYTHONHASHSEED, and it decides the order of
            # the float sums and which of two equal contributions names the path
            keys = sorted(k for k in mem_nodes.get(source, ()) if spec(k) > 0)
            for key in keys:
                attrs = nodes[key]
                mids = attrs["memory_ids"]
                if len(mids) < 2:
                    continue
                share = damping * mass * (1.0 - episodic) * spec(key) / len(keys) / len(mids)
                give(mids, share, f"{attrs['name']}, shared with {label}", step, source)
                passed(mids, share, source)
        damping *= STEP_DAMPING
        if reached is not None:  # in id order: reached's order is that of sets (see keys above)
            frontier = [(m, reached[m], acc[m][2]) for m in sorted(reached)]
    named = [k for k in own if k in g and nodes[k]["type"] not in UNEXPANDED_TYPES]
    # Focus and topic go to memories of the pool: the seeds and what the spread reached (and
    # has entities). Each gets at most one contribution of each kind, so their order decides
    # nothing. A named entity's memories of the pool are its memories intersected with the
    # pool, a set operation that walks the smaller side (a person of 100k memories names
    # thousands; the pool is ~1,000 at 10k memories).
    in_seeds = dict.fromkeys(m for m, _x in seeds)
    reach = acc.keys() | in_seeds.keys() if named else set()
    chosen: dict[str, AbstractSet[str]] = {k: nodes[k]["memory_ids"] & reach for k in named}
    if focus > 0:
        for key in named:
            give(chosen[key], focus / len(named), f"{nodes[key]['name']} (named in the query)", 0)
    if topic > 0 and similar is not None:
        if named:  # the memories that name the query's entities
            pool: AbstractSet[str] = set().union(*chosen.values())
        else:
            pool = {m for m in itertools.chain(in_seeds, acc) if m in mem_nodes}
        _topic(st, pool, named, topic, similar, give)
    # strongest first, ties in id order (ids are unique: the lists are never compared)
    order = [(-a[0], m, a) for m, a in acc.items()]
    order.sort()
    return {m: (a[0], a[3], a[2]) for _s, m, a in order}


Give = Callable[[Iterable[str], float, str, int], None]


def _topic(st: UserGraph, pool: AbstractSet[str], named: Sequence[str], topic: float,
           similar: Similar, give: Give) -> None:
    """The topic signal (see the module docstring): each memory of ``pool`` (those of the pool
    that name the query's entities, all of it when it names none) gets ``topic`` times the best
    cosine between the query and the names of its other nodes. One ``similar`` call."""
    nodes, mem_nodes, own = st.graph.nodes, st.mem_nodes, set(named)
    # each distinct node looked up once (many memories share one), in key order
    attrs = {k: a for k in set().union(*(mem_nodes[m] for m in pool)) - own
             if (a := nodes[k])["type"] not in UNEXPANDED_TYPES}
    if not attrs:
        return
    keys = sorted(attrs)
    # only positive cosines count: when a memory's best is one, it is the best of those
    sims = {k: cos for k, cos in zip(keys, similar(keys, [attrs[k]["name"] for k in keys]),
                                     strict=True) if cos > 0}
    for m in pool:
        near = [(cos, k) for k in mem_nodes[m] if (cos := sims.get(k)) is not None]
        if near:
            cos, key = max(near)
            give((m,), topic * cos, f"{attrs[key]['name']} (close to the query's topic)", 0)


def neighbourhood(
    st: UserGraph, entities: Sequence[str], *, hops: int, max_nodes: int, max_memories: int,
    hub_degree: int, co_mentions: bool,
) -> dict[str, tuple[int, str]]:
    """memory id -> (hops, readable path) for memories within ``hops`` of the seed entities.

    Breadth-first in both edge directions, so the first time a memory is seen is its smallest
    hop count. Hop 0: memories mentioning a seed. Hop h: memories mentioning a node h edges away
    (or supporting the edge that reached it). With ``co_mentions`` two entities of one memory are
    also neighbours ("A -mentioned_with-> B"), which connects what rules cannot relate.

    Bounded: at most ``max_nodes`` nodes are reached and ``max_memories`` memories returned. A
    *hub* (more than ``hub_degree`` edges or memories, or named in over a third of the user's
    memories) is never a seed; reached from a seed it contributes the memories of the edge that
    reached it, but neither its own memories nor its neighbours, so "user -bought-> everything"
    does not pull every memory in at one hop.
    """
    g = st.graph
    seeds = [k for k in dict.fromkeys(st.resolve(e) for e in entities) if k is not None]
    # A hub seed (the speaker of every "I ..." turn) says nothing about the question: starting
    # from it would pull in an arbitrary slice of the user's memories.
    seeds = [k for k in seeds if not _hub(st, k, hub_degree)]
    parent: dict[str, tuple[str, str] | None] = {k: None for k in seeds[:max_nodes]}
    found: dict[str, tuple[int, str]] = {}

    def route(node: str, *extra: str) -> str:
        steps, start = list(extra), node
        while (step := parent[node]) is not None:
            node, label = step
            steps.insert(0, label)
        return ", ".join(steps) or g.nodes[start]["name"]

    def collect(mids: Iterable[str], hop: int, path: str) -> None:
        for mid in sorted(mids):
            if mid not in found and len(found) < max_memories:
                found[mid] = (hop, path)

    frontier = list(parent)
    for key in frontier:
        collect(g.nodes[key]["memory_ids"], 0, route(key))
    for hop in range(1, hops + 1):
        nxt: list[str] = []
        for u in frontier:
            if hop > 1 and _hub(st, u, hub_degree):
                continue  # reached hubs give their edge's memories but are not expanded
            for v, label, mids in _neighbours(st, u, hub_degree, co_mentions):
                collect(mids, hop, route(u, label))
                if v in parent or len(parent) >= max_nodes:
                    continue
                parent[v] = (u, label)
                nxt.append(v)
                if not _hub(st, v, hub_degree):
                    collect(g.nodes[v]["memory_ids"], hop, route(v))
        frontier = nxt
        if not frontier or len(found) >= max_memories:
            break
    return found


def _hub(st: UserGraph, key: str, hub_degree: int) -> bool:
    """Too connected to mean anything: many edges or memories, or (IDF-like) mentioned by more
    than a third of the user's memories, like the speaker of every "I ..." statement."""
    mentions = len(st.graph.nodes[key]["memory_ids"])
    if st.graph.degree(key) > hub_degree or mentions > hub_degree:
        return True
    return mentions >= 4 and mentions * 3 > len(st.mem_nodes)


def _neighbours(
    st: UserGraph, u: str, hub_degree: int, co_mentions: bool
) -> list[tuple[str, str, set[str]]]:
    """(node, label, supporting memory ids): relation edges by weight, then co-mentions."""
    g = st.graph
    out = [(v, edge_label(g, u, v), a["memory_ids"], -a["weight"]) for v, a in g.succ[u].items()]
    out += [(v, edge_label(g, v, u), a["memory_ids"], -a["weight"]) for v, a in g.pred[u].items()]
    out.sort(key=lambda t: (t[3], t[0]))
    rows = [(v, label, mids) for v, label, mids, _w in out]
    if co_mentions and not _hub(st, u, hub_degree):
        related = set(g.succ[u]) | set(g.pred[u]) | {u}
        others = {v for m in g.nodes[u]["memory_ids"] for v in st.mem_nodes.get(m, ())}
        name = g.nodes[u]["name"]
        rows += [
            (v, f"{name} -mentioned_with-> {g.nodes[v]['name']}", set())
            for v in sorted(others - related)
        ]
    return rows
