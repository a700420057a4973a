#!/usr/bin/env python
"""Chroma server mode against embedded, and a load test of several workers on one Chroma server.

Two questions, each with its floor measured in the same run:

1. **What does server mode cost against embedded, per user?** For each ``--sizes`` (memories of
   one user): ``add_many`` throughput (batches of 500; floor: Chroma's own ``add`` of the same
   vectors), a fresh process's first ``context()`` for the user (the process is warmed on another
   user first, so the figure is the user's load, not the model's; the median of ``--firsts``
   processes, the modes in turn; floor: fetching every document of the user from Chroma), ``context()`` p50 of the 39 that follow at once (while the record
   copy loads: from the second context, in both modes; floor: one Chroma vector query), its p50
   when the refresh interval has passed, so the checks of the caches are due, and the p50 of 40
   more once the copy is loaded (*steady*). Every context asks a question of its own.
   Embedded is ``PersistentClient`` in the process; server is one local ``chroma run``.
2. **Do workers behind a load balancer lose or leak anything when one dies?** ``--workers``
   ``hybridmem serve`` processes against one ``chroma run``, ``--users`` users, ``--clients``
   threads sending adds, contexts and forgets (round robin over the workers) for ``--seconds``;
   one worker is SIGKILLed halfway and restarted a second later. Reported: requests/s, p50/p95 per
   operation (floor: ``GET /health`` round robin, same clients), what the kill cost, losses and
   cross-user leaks (both must be 0), and how long until every worker gives the same answers.
   The harness is tests/scaleout_harness.py, which the suite runs small.

Usage::

    python bench/scaleout.py [--sizes 5000 10000] [--workers 4] [--users 200] [--clients 16]
                             [--seconds 60] [--embedder local] [--firsts 5] [--skip-modes]
                             [--skip-load]

Run it with ``PYTHONPATH`` pointing at the tree to measure. Figures: bench/results/scaleout.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))
from _provenance import git_info, machine_info  # noqa: E402  (bench/ is not a package)
import scaleout_harness as harness  # noqa: E402

DEFAULT_OUT = REPO / "bench" / "results" / "scaleout.json"
USER = "bench-user"

#: Runs in a fresh process: open a Memory, warm it on another user, then time the first
#: context() of USER and the p50 of the next ones, and the floors.
PROBE = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[4])
from latency import World
from scaleout import embedder_of, user_collection, chroma_client
from hybridmem import Memory, Settings
data_dir, url, embedder = sys.argv[1], sys.argv[2] or None, embedder_of(sys.argv[3])
only_first = int(sys.argv[5])  # -1: every measure; n >= 0: the first context only, question n
questions = World().questions(40, 7)
later = [q for q in dict.fromkeys(World().questions(70, 8)) if q not in questions][:45]
others = [q for q in dict.fromkeys(World().questions(90, 9)) if q not in questions + later]
with Memory(Settings(data_dir=data_dir, chroma_url=url, extractor="rules", base_url=None),
            embedder=embedder) as mem:
    mem.add("warm-user", "Warm-up memory about a Dell monitor.")
    mem.context("warm-user", "which monitor?", max_tokens=600)
    t = time.perf_counter()
    mem.context("bench-user", questions[0] if only_first < 0 else others[only_first],
                max_tokens=600)
    first = time.perf_counter() - t
    if only_first >= 0:
        print(json.dumps({"first_context_ms": 1000 * first}))
        sys.exit(0)
    times = []
    for q in questions[1:]:
        t = time.perf_counter()
        mem.context("bench-user", q, max_tokens=600)
        times.append(time.perf_counter() - t)
    idle = []  # each after the refresh interval: the checks are due, and nothing was written
    for q in later[:5]:
        time.sleep(1.05)
        t = time.perf_counter()
        mem.context("bench-user", q, max_tokens=600)
        idle.append(time.perf_counter() - t)
    steady = []  # the record copy loaded by now
    for q in later[5:]:
        t = time.perf_counter()
        mem.context("bench-user", q, max_tokens=600)
        steady.append(time.perf_counter() - t)
    vec = embedder.embed_batch([questions[0]])[0]
    col = user_collection(chroma_client(data_dir, url), "bench-user")
    q_times = []
    for _ in range(20):
        t = time.perf_counter(); col.query(query_embeddings=[vec], n_results=20)
        q_times.append(time.perf_counter() - t)
    t = time.perf_counter()
    for lo in range(0, col.count(), 5000):
        col.get(limit=5000, offset=lo, include=["documents"])
    fetch = time.perf_counter() - t
print(json.dumps({"first_context_ms": 1000 * first,
                  "context_p50_ms": 1000 * statistics.median(times),
                  "context_checked_p50_ms": 1000 * statistics.median(idle),
                  "context_steady_p50_ms": 1000 * statistics.median(steady),
                  "floor_chroma_query_p50_ms": 1000 * statistics.median(q_times),
                  "floor_fetch_all_documents_ms": 1000 * fetch}))
"""


def embedder_of(name: str) -> Any:
    from hybridmem.offline import HashEmbedder, LocalEmbedder

    return LocalEmbedder() if name == "local" else HashEmbedder()


def chroma_client(data_dir: str | Path, url: str | None) -> Any:
    """A Chroma client of our own: on the server, or on the embedded store's path."""
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    chroma = ChromaSettings(anonymized_telemetry=False)
    if url:
        host, port = url.removeprefix("http://").split(":")
        return chromadb.HttpClient(host=host, port=int(port), settings=chroma)
    return chromadb.PersistentClient(path=str(Path(data_dir) / "chroma"), settings=chroma)


def user_collection(client: Any, user_id: str) -> Any:
    """The user's memory collection (found by its metadata, as bench/latency.py does)."""
    for col in client.list_collections():
        meta = col.metadata or {}
        if meta.get("user_id") == user_id and "embedder" in meta:
            return client.get_collection(col.name, embedding_function=None)
    raise RuntimeError(f"no Chroma collection for {user_id!r}")


def fill(data_dir: Path, url: str | None, size: int, embedder: str) -> dict[str, float]:
    """add_many of ``size`` memories in batches of 500; and the floor, Chroma's own add."""
    from latency import World

    from hybridmem import Memory, Settings

    texts = World().sentences(size, 1)
    model = embedder_of(embedder)
    with Memory(Settings(data_dir=data_dir, chroma_url=url, extractor="rules", base_url=None),
                embedder=model) as mem:
        started = time.perf_counter()
        for lo in range(0, size, 500):
            mem.add_many(USER, texts[lo : lo + 500])
        spent = time.perf_counter() - started
    vectors = model.embed_batch(texts[:500])
    client = chroma_client(data_dir / "floor", url)
    name = "floor-" + os.urandom(4).hex()
    col = client.create_collection(name, embedding_function=None,
                                   configuration={"hnsw": {"space": "cosine"}})
    started = time.perf_counter()
    col.add(ids=[str(i) for i in range(len(vectors))], embeddings=vectors, documents=texts[:500])
    raw = time.perf_counter() - started
    client.delete_collection(name)
    return {"add_many_per_s": size / spent, "floor_chroma_add_500_per_s": len(vectors) / raw}


def probe(data_dir: Path, url: str | None, embedder: str, only_first: int = -1,
          ) -> dict[str, float]:
    """A fresh process's measures (see PROBE); with ``only_first`` >= 0, its first context
    only, asking the question of that number."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYBRIDMEM_")}
    env["ANONYMIZED_TELEMETRY"] = "False"
    out = subprocess.run([sys.executable, "-c", PROBE, str(data_dir), url or "", embedder,
                          str(REPO / "bench"), str(only_first)], capture_output=True, text=True,
                         env=env, check=True, timeout=1800)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def modes(sizes: list[int], embedder: str, root: Path, firsts: int) -> list[dict[str, Any]]:
    """Per size, both modes filled, each probed by a fresh process, then ``firsts`` - 1 more
    fresh processes per mode (the modes in turn, each a question of its own) time a first
    context: a single ~0.15 s cold call on a shared machine moves by a third from run to run,
    so the first context reported is the median of ``firsts`` processes."""
    rows = []
    for size in sizes:
        row: dict[str, Any] = {"memories": size}
        proc, url = harness.start_chroma(root / f"chroma-{size}")
        try:
            where = {"embedded": None, "server": url}
            for mode in ("embedded", "server"):
                data_dir = root / f"{mode}-{size}"
                got = fill(data_dir, where[mode], size, embedder)
                got.update(probe(data_dir, where[mode], embedder))
                row[mode] = got
            samples = {m: [row[m]["first_context_ms"]] for m in where}
            for n in range(firsts - 1):
                for mode in where:
                    samples[mode].append(probe(root / f"{mode}-{size}", where[mode], embedder,
                                               only_first=n)["first_context_ms"])
            for mode in where:
                got = row[mode]
                got["first_context_ms"] = statistics.median(samples[mode])
                row[f"{mode}_first_context_samples_ms"] = [round(x, 1) for x in samples[mode]]
                print(f"{size:>6} {mode:<9} " + "  ".join(f"{k}={v:.1f}" for k, v in got.items()),
                      flush=True)
        finally:
            harness.stop(proc)
        e, s = row["embedded"], row["server"]
        row["ratios"] = {
            "add_many_server_over_embedded": s["add_many_per_s"] / e["add_many_per_s"],
            "first_context_server_over_embedded": s["first_context_ms"] / e["first_context_ms"],
            "context_p50_server_over_embedded": s["context_p50_ms"] / e["context_p50_ms"],
            "context_steady_p50_server_over_embedded":
                s["context_steady_p50_ms"] / e["context_steady_p50_ms"],
        }
        print(f"{size:>6} ratios    " + "  ".join(f"{k}={v:.2f}" for k, v in row["ratios"].items()),
              flush=True)
        rows.append(row)
    return rows


def load(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    proc, url = harness.start_chroma(root / "chroma-load")
    cluster = harness.workers(args.workers, root / "load", url, embedder=args.embedder,
                              pythonpath=os.environ.get("PYTHONPATH"))
    try:
        for w in cluster:
            w.start()
        floor = health_floor(cluster, args.clients)
        run = harness.Load(cluster, users=args.users, clients=args.clients)
        report = run.run(args.seconds, kill=0, kill_at=0.5, down_for=1.0)
        time.sleep(1.5)  # the documented refresh interval: listings show every write by then
        lost = run.lost()
        converged = run.converge(timeout=300)
        out = {**report.summary(), "floor_health": floor,
               "losses": sum(len([b for b in bad if not b.startswith("leak")])
                             for bad in lost.values()),
               "stored_leaks": sum(len([b for b in bad if b.startswith("leak")])
                                   for bad in lost.values()),
               "memories_live": sum(len(t.live) for t in run.truth.values()),
               "convergence": None if converged is None else {
                   "all_agree_after_s": converged[0], "passes": converged[1]},
               "workers": args.workers, "users": args.users, "clients": args.clients,
               "lease_ttl_s": 30.0}
    finally:
        for w in cluster:
            w.stop()
        harness.stop(proc)
    return out


def health_floor(cluster: list[harness.Worker], clients: int, seconds: float = 5.0) -> dict[str, float]:
    """GET /health round robin from ``clients`` threads: HTTP and JSON only, no memory work."""
    import threading

    times: list[float] = []
    guard = threading.Lock()
    stop = time.monotonic() + seconds

    def client(c: int) -> None:
        with httpx.Client(timeout=30) as http:
            n = c
            while time.monotonic() < stop:
                t = time.perf_counter()
                http.get(cluster[n % len(cluster)].url + "/health")
                with guard:
                    times.append(time.perf_counter() - t)
                n += 1

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ordered = sorted(times)
    return {"requests_per_s": len(times) / seconds, "p50_ms": 1000 * statistics.median(ordered),
            "p95_ms": 1000 * ordered[int(0.95 * (len(ordered) - 1))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5000, 10000])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--embedder", default="local", choices=["local", "hash"])
    parser.add_argument("--skip-modes", action="store_true")
    parser.add_argument("--skip-load", action="store_true")
    parser.add_argument("--firsts", type=int, default=5,
                        help="fresh processes per mode whose first context is timed (median)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    results: dict[str, Any] = {"git": git_info(), "machine": machine_info(
        ("chromadb", "onnxruntime", "networkx")), "load_before": os.getloadavg(),
        "embedder": args.embedder}
    with tempfile.TemporaryDirectory(prefix="hm-scaleout-") as tmp:
        root = Path(tmp)
        if not args.skip_modes:
            results["modes"] = modes(args.sizes, args.embedder, root, max(1, args.firsts))
        if not args.skip_load:
            results["load"] = load(args, root)
            print(json.dumps(results["load"], indent=1), flush=True)
    results["load_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
