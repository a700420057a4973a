#!/usr/bin/env python
"""The graph step of a search, alone: ``NetworkXGraphStore.activation`` at 1k / 10k memories.

Builds one in-memory user graph from bench/latency.py's synthetic sentences (rule extractor,
batches of 20 as episodes), then times what ``Retriever.search`` asks of the graph: one
``activation`` from 10 seed memories (the best hits; here memories that mention an entity of the
query, else random ones, masses 1 ... 0.1), the rest of the candidates (:data:`CANDIDATES` in
all, mass 0: query focus may lift them, as ``ranking.graph_seeds`` passes every candidate) and
the query's own entities, with the topic signal (Settings ``graph_topic``; the query's cosine to
node names, by ``hybridmem.graph.name_vectors.NameVectors`` itself: every name embedded and stored once, as the
writes of a Memory do, then read back by a fresh instance as a restarted process would; the
embedding and the one-off load are printed apart) and without it. Beside it, the previous
graph step (``entities_in`` + ``neighbourhood`` of the query and of the seeds' entities), so the
two can be compared in the same run. Prints a table; writes JSON to bench/results/.

Usage::

    python bench/graph_latency.py [--sizes 1000,10000] [--queries 200]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from _provenance import git_info, machine_info  # noqa: E402
from latency import World  # noqa: E402

DEFAULT_OUT = REPO / "bench" / "results" / "graph_latency.json"
SEEDS = 10
#: Candidates a search hands the graph (vector top 50 and lexical top 50, about half shared).
CANDIDATES = 80
BATCH = 20


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    from hybridmem.config import Settings
    from hybridmem.extract import RuleExtractor
    from hybridmem.graph import NetworkXGraphStore
    from hybridmem.graph.name_vectors import NameStore, NameVectors
    from hybridmem.offline import LocalEmbedder

    world, rules, rows = World(), RuleExtractor(), []
    embedder = LocalEmbedder()
    topic = float(Settings.model_fields["graph_topic"].default or 0.45)
    for size in (int(s) for s in args.sizes.split(",")):
        store, user = NetworkXGraphStore(None), "bench"
        texts = world.sentences(size, seed=size)
        ids = [f"m{i}" for i in range(size)]
        t0 = time.perf_counter()
        for lo in range(0, size, BATCH):
            store.add_extractions(user, [(m, rules.extract(t, speaker=user))
                                         for m, t in zip(ids[lo:lo + BATCH], texts[lo:lo + BATCH])])
        build_s = time.perf_counter() - t0
        folder = tempfile.TemporaryDirectory(prefix="hm-names-")
        made = NameVectors(store, NameStore(folder.name), embed=embedder.embed_batch,
                           model=embedder.name)
        t0 = time.perf_counter()
        with made.held.hold(user):
            made.complete(user)  # what the writes do, all at once
        names_s = time.perf_counter() - t0
        made.close()
        names = NameVectors(store, NameStore(folder.name), embed=embedder.embed_batch,
                            model=embedder.name)  # a restarted process: reads them back
        t0 = time.perf_counter()
        names.similar(user, embedder.embed_batch(["warm up"])[0], [], [])
        load_ms = (time.perf_counter() - t0) * 1000
        rng = random.Random(size)
        queries = world.questions(args.queries, seed=size + 1)
        qvecs = embedder.embed_batch(queries)
        new_ms: list[float] = []
        old_ms: list[float] = []
        topic_ms: list[float] = []
        for q in queries:
            named = store.entities_in(user, q)
            near = list(store.neighbourhood(user, named, hops=0)) if named else []
            pool = near[:SEEDS] + rng.sample(ids, SEEDS)
            seeds = [(m, 1.0 - 0.09 * i) for i, m in enumerate(dict.fromkeys(pool[:SEEDS]))]
            chosen = {m for m, _ in seeds}
            seeds += [(m, 0.0) for m in rng.sample(ids, CANDIDATES) if m not in chosen]
            t0 = time.perf_counter()
            store.activation(user, seeds, q, hops=1)
            new_ms.append((time.perf_counter() - t0) * 1000)
            qvec = qvecs[len(topic_ms)]
            t0 = time.perf_counter()
            store.activation(user, seeds, q, hops=1, topic=topic,
                             similar=partial(names.similar, user, qvec))
            topic_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            found = store.entities_in(user, q)
            if found:
                store.neighbourhood(user, found, hops=1)
            ents = store.entities_of(user, [m for m, _ in seeds[:5]])  # the best five
            if ents:
                store.neighbourhood(user, ents, hops=0)
            old_ms.append((time.perf_counter() - t0) * 1000)
        assert names.queued == 0, f"{names.queued} names had no vector"
        names.close()
        folder.cleanup()
        rows.append({
            "memories": size, "nodes": len(store.entities(user)),
            "relations": len(store.relations(user)), "build_s": build_s, "names_s": names_s,
            "names_load_ms": load_ms,
            "activation_p50_ms": statistics.median(new_ms), "activation_p95_ms": p(new_ms, 0.95),
            "topic_p50_ms": statistics.median(topic_ms), "topic_p95_ms": p(topic_ms, 0.95),
            "old_expand_p50_ms": statistics.median(old_ms), "old_expand_p95_ms": p(old_ms, 0.95),
        })
    machine = machine_info(["networkx"])
    print(f"load average {machine['loadavg']}")
    print("\n| memories | nodes | relations | activation p50 / p95 ms | with topic p50 / p95 ms "
          "| names embedded once, s | names loaded, ms | previous expansion p50 / p95 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['memories']:,} | {r['nodes']:,} | {r['relations']:,} | "
              f"{r['activation_p50_ms']:.2f} / {r['activation_p95_ms']:.2f} | "
              f"{r['topic_p50_ms']:.2f} / {r['topic_p95_ms']:.2f} | {r['names_s']:.1f} | "
              f"{r['names_load_ms']:.0f} | "
              f"{r['old_expand_p50_ms']:.2f} / {r['old_expand_p95_ms']:.2f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"provenance": git_info(), "machine": machine, "rows": rows},
                                   indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
