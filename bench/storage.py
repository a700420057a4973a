#!/usr/bin/env python
"""Storage benchmark: does a write cost stay flat as a user grows and as users multiply, and does a
crash lose anything?

Prints a markdown table and writes JSON (provenance included) to ``bench/results/``:

- ``add``: median single ``Memory.add`` at a user's size of N memories (N = 100, 1,000, 10,000 by
  default), with the graph's change-log and snapshot sizes at that point; goal: at 10k ≤ 1.5× at 100.
  Beside it, how many records Chroma's log holds that its HNSW index has not persisted yet (for
  ours and for the raw collection): embedded Chroma re-reads all of them on every add (its
  ``LocalCompactionManager`` backfills from the index's last persisted sequence id), so one add's
  cost rises with that count and drops when the index persists (every ``sync_threshold`` = 1,000
  records), whatever the collection's size. Two sizes compare alike only at similar counts.
- ``add_many``: memories per second for batches of 64, beside the raw floor (the same texts
  embedded with the same model and added to a bare Chroma collection), each floor batch timed
  right after ours, so the machine's load changes hit both alike; single adds alternate with the
  raw Chroma add the same way. Beside the floor, timed apart in the same batch, the two Chroma
  calls no memory store can skip: the add with each memory's fields as metadata (the same 16
  keys, built from the items' public fields) and one near-duplicate query of the batch's vectors.
  ``bound`` = floor / (embed + that add + that query): the best ratio such a store can reach.
- ``users``: open file descriptors and RSS (now, and the process's peak) after touching 1,000 and
  3,000 users (one memory each).
  Every figure is also logged as soon as it is known, so a run stopped early keeps what it measured.
- ``topic_ab`` (``--topic-ab N``): single ``add`` at N memories with the default ``graph_topic``
  (node-name vectors embedded and stored by the write) and with ``graph_topic=0``, alternating in
  one process so the load falls on both alike.
- ``crash``: ``--trials`` writer processes killed with SIGKILL at random moments; after each, the
  acknowledged ids that are missing and the stores that disagree (both must be 0).

Offline: local MiniLM embedder (hash embedder for the users and crash parts, which measure storage),
rule extractor.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import _provenance  # noqa: E402  (bench/ is not a package)

log = logging.getLogger("bench.storage")
WORDS = ("laptop monitor keyboard mouse dock cable charger desk chair lamp headset webcam "
         "speaker tablet phone router printer scanner drive adapter").split()


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"Customer note {seed}-{i}: bought a {rng.choice(WORDS)} and a {rng.choice(WORDS)} "
            f"for the {rng.choice(WORDS)} setup, order {rng.randrange(10**6)}" for i in range(n)]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    """Resident set now (the peak above also holds whatever an earlier part of the run used)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def chroma_pending(chroma_dir: Path) -> int:
    """Records in a Chroma directory's log that an HNSW index has not persisted yet: the largest
    count of one collection (a read-only look at Chroma's own ``embeddings_queue``; 0 if none)."""
    import sqlite3

    path = chroma_dir / "chroma.sqlite3"
    if not path.exists():
        return 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT COUNT(*) FROM embeddings_queue GROUP BY topic").fetchall()
    finally:
        db.close()
    return max((int(n) for (n,) in rows), default=0)


def bench_add(sizes: list[int], root: Path, singles: int) -> dict[str, Any]:
    from hybridmem import Memory, Settings
    from hybridmem.offline import LocalEmbedder

    import chromadb
    from chromadb.config import Settings as ChromaSettings

    embedder = LocalEmbedder(threads=2)
    out: dict[str, Any] = {"single": [], "add_many": {}}
    # the raw floor of add_many: the same model, a bare Chroma collection, the same batches,
    # each timed right after ours (interleaved, so a change in the machine's load cannot favour
    # either side, as it could when the floor ran after the whole ingest)
    floor_client = chromadb.PersistentClient(path=str(root / "raw"),
                                             settings=ChromaSettings(anonymized_telemetry=False))
    floor_collection, records_collection = (floor_client.get_or_create_collection(
        name, embedding_function=None, configuration={"hnsw": {"space": "cosine"}})
        for name in ("raw", "raw-records"))
    parts = {"embed": 0.0, "add": 0.0, "add_records": 0.0, "dedup_query": 0.0}
    data_dir = root / "add"
    raw = _RawSingles(root / "raw-single", embedder.dimension)
    with Memory(Settings(data_dir=data_dir, embedder="local", extractor="rules"),
                embedder=embedder) as mem:
        have = 0
        for size in sizes:
            texts = sentences(size - have, seed=size)
            last = size == sizes[-1]
            took = floor = 0.0
            for lo in range(0, len(texts), 64):
                chunk = texts[lo:lo + 64]
                started = time.perf_counter()
                items = mem.add_many("bench", chunk)
                took += time.perf_counter() - started
                if last:  # the floor batch right after ours: load drift hits both alike
                    floor += raw_batch(floor_collection, records_collection, lo, items,
                                       embedder, parts)
            have = mem.count("bench")
            if last:
                out["add_many"]["per_s"] = len(texts) / took
                out["add_many"]["floor_per_s"] = len(texts) / floor
                out["add_many"]["n"] = len(texts)
                out["add_many"]["per_batch_ms"] = {
                    "ours": took * 64_000 / len(texts),
                    **{k: v * 64_000 / len(texts) for k, v in parts.items()}}
            raw.fill(have)
            pending = chroma_pending(data_dir / "chroma"), chroma_pending(raw.path)
            times, raw_times = [], []
            for n, text in enumerate(sentences(singles, seed=10**6 + size)):
                t0 = time.perf_counter()
                mem.add("bench", text)
                times.append((time.perf_counter() - t0) * 1000)
                raw_times.append(raw.time_one(f"raw single {size}-{n}"))  # interleaved too
            have = mem.count("bench")
            raw_ms = statistics.median(raw_times)
            folder = next((data_dir / "users").iterdir())
            sizes_on_disk = {p.name: p.stat().st_size for p in folder.iterdir()}
            out["single"].append({
                "memories": have, "median_ms": statistics.median(times),
                "raw_chroma_add_median_ms": raw_ms, "loadavg": os.getloadavg(),
                "p90_ms": sorted(times)[int(len(times) * 0.9) - 1],
                "graph_json_bytes": sizes_on_disk.get("graph.json", 0),
                "graph_log_bytes": sizes_on_disk.get("graph.log", 0),
                "chroma_log_pending": pending[0], "raw_log_pending": pending[1],
            })
            log.info("add at %d: median %.1f ms (raw Chroma add %.1f ms)", have,
                     out["single"][-1]["median_ms"], raw_ms)
    many = out["add_many"]
    many["ratio"] = many["per_s"] / many["floor_per_s"]
    b = many["per_batch_ms"]
    # the best any store could do that keeps these fields and checks for near-duplicates
    many["bound"] = (b["embed"] + b["add"]) / (b["embed"] + b["add_records"] + b["dedup_query"])
    many["loadavg"] = os.getloadavg()
    log.info("add_many: %.1f/s vs raw floor %.1f/s (%.2fx)", many["per_s"], many["floor_per_s"],
             many["ratio"])
    return out


class _RawSingles:
    """The floor of a single add at a size: one record added to a bare Chroma collection of the
    same size (random unit vectors: Chroma's cost, not the embedder's, is what grows)."""

    def __init__(self, path: Path, dimension: int) -> None:
        import chromadb
        import numpy as np
        from chromadb.config import Settings as ChromaSettings

        self.path = path
        self._np = np
        self._rng = np.random.default_rng(0)
        self._dimension = dimension
        client = chromadb.PersistentClient(path=str(path),
                                           settings=ChromaSettings(anonymized_telemetry=False))
        self._collection = client.get_or_create_collection(
            "raw", embedding_function=None, configuration={"hnsw": {"space": "cosine"}})
        self._n = 0

    def _vectors(self, n: int) -> Any:
        v = self._rng.standard_normal((n, self._dimension)).astype(self._np.float32)
        return v / self._np.linalg.norm(v, axis=1, keepdims=True)

    def _add(self, texts: list[str]) -> None:
        ids = [f"r{self._n + i}" for i in range(len(texts))]
        self._collection.add(ids=ids, documents=texts, embeddings=self._vectors(len(texts)),
                             metadatas=[{"n": self._n + i} for i in range(len(texts))])
        self._n += len(texts)

    def fill(self, size: int) -> None:
        """Grow the collection to ``size`` records (untimed)."""
        while self._n < size:
            self._add(sentences(min(500, size - self._n), seed=self._n))

    def time_one(self, text: str) -> float:
        """Milliseconds to add one record."""
        t0 = time.perf_counter()
        self._add([text])
        return (time.perf_counter() - t0) * 1000


def record_of(item: Any) -> dict[str, Any]:
    """The fields a memory store keeps beside a text, as flat Chroma metadata, from the item's
    public fields: the scalars that are set, times as epoch seconds, and the three derived
    fields a store filters on (current, has_key, the text's hash). The same 16 keys
    hybridmem's records have, so the raw add of them costs what Chroma charges for them."""
    from hybridmem.text import text_hash

    meta: dict[str, Any] = {}
    for name, value in item.model_dump(exclude={"id", "text", "metadata"}).items():
        if isinstance(value, datetime):
            meta[f"{name}_ts"] = value.timestamp()
        elif value is not None:
            meta[name] = value
    meta.update(current=item.is_current, has_key=item.key is not None,
                text_hash=text_hash(item.text))
    return meta


def raw_batch(texts_only: Any, with_records: Any, lo: int, items: list[Any], embedder: Any,
              parts: dict[str, float]) -> float:
    """One batch of the raw floor: embed the texts, add them to a bare collection (the floor),
    and beside it what a memory store cannot skip, timed apart: the same add with the items'
    fields as metadata, and one query of the batch's vectors for near-duplicates (3 each).
    Returns the floor's seconds (embed + bare add)."""
    texts = [i.text for i in items]
    ids = [f"r{lo + n}" for n in range(len(texts))]
    t0 = time.perf_counter()
    vectors = embedder.embed_batch(texts)
    t1 = time.perf_counter()
    texts_only.query(query_embeddings=vectors, n_results=3, include=["distances"])
    t2 = time.perf_counter()
    texts_only.add(ids=ids, documents=texts, embeddings=vectors)
    t3 = time.perf_counter()
    with_records.add(ids=ids, documents=texts, embeddings=vectors,
                     metadatas=[record_of(i) for i in items])
    t4 = time.perf_counter()
    for key, seconds in (("embed", t1 - t0), ("dedup_query", t2 - t1), ("add", t3 - t2),
                         ("add_records", t4 - t3)):
        parts[key] += seconds
    return (t1 - t0) + (t3 - t2)


def bench_topic_ab(size: int, root: Path, singles: int) -> dict[str, Any]:
    """Single ``add`` with the topic signal's name vectors (the default ``graph_topic``) and
    without (``graph_topic=0``: no name is embedded or stored), on two users of ``size``
    memories in one process, alternating, so the machine's load falls on both alike."""
    from hybridmem import Memory, Settings
    from hybridmem.offline import LocalEmbedder

    embedder = LocalEmbedder(threads=2)
    topics = (float(Settings.model_fields["graph_topic"].default or 0.0), 0.0)
    mems = [Memory(Settings(data_dir=root / f"ab-{t}", embedder="local", extractor="rules",
                            graph_topic=t), embedder=embedder) for t in topics]
    try:
        texts = sentences(size, seed=size)
        for mem in mems:
            for lo in range(0, size, 64):
                mem.add_many("bench", texts[lo:lo + 64])
        times: list[list[float]] = [[], []]
        for i, text in enumerate(sentences(singles, seed=10**6 + size)):
            for j in (0, 1) if i % 2 else (1, 0):
                t0 = time.perf_counter()
                mems[j].add("bench", text)
                times[j].append((time.perf_counter() - t0) * 1000)
        out = {"memories": size, "loadavg": os.getloadavg(), "rows": [
            {"graph_topic": t, "median_ms": statistics.median(v),
             "p90_ms": sorted(v)[int(len(v) * 0.9) - 1]} for t, v in zip(topics, times)]}
    finally:
        for mem in mems:
            mem.close()
    log.info("single add at %d: %s", size, out["rows"])
    return out


def bench_users(counts: list[int], root: Path) -> list[dict[str, Any]]:
    from hybridmem import Memory, Settings

    out = []
    with Memory(Settings(data_dir=root / "users", embedder="hash", extractor="rules")) as mem:
        done = 0
        for count in counts:
            for n in range(done, count):
                mem.add(f"user-{n}", f"I bought gadget {n}")
            done = count
            out.append({"users": count, "open_fds": open_fds(), "max_rss_mb": rss_mb(),
                        "rss_mb": current_rss_mb(), "loadavg": os.getloadavg()})
            log.info("%d users: %d fds, RSS %.0f MB (peak %.0f MB)", count, out[-1]["open_fds"],
                     out[-1]["rss_mb"], out[-1]["max_rss_mb"])
    return out


def bench_crash(trials: int, root: Path) -> dict[str, Any]:
    """The suite's kill -9 harness (tests/crash_harness.py), ``trials`` times."""
    sys.path.insert(0, str(REPO / "tests"))
    import crash_harness

    rng = random.Random(7)
    data_dir = root / "crash"
    ledger = crash_harness.Ledger()
    lost = disagreements = 0
    for n in range(trials):
        missing, agree = crash_harness.trial(data_dir, n, rng, ledger)
        lost += missing
        disagreements += not agree
        if n % 20 == 19:
            log.info("kill -9: %d trials, %d lost, %d disagreements", n + 1, lost, disagreements)
    return {"trials": trials, "acknowledged": len(ledger.acknowledged),
            "lost_acknowledged": lost, "store_disagreements": disagreements}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--singles", type=int, default=30)
    parser.add_argument("--users", default="1000,3000")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--topic-ab", type=int, default=0, metavar="N",
                        help="also: single add with and without graph_topic at N memories")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(message)s")
    provenance = {"git": _provenance.git_info(), "machine": _provenance.machine_info(
        ("chromadb", "onnxruntime", "networkx"))}
    with tempfile.TemporaryDirectory(prefix="hybridmem-bench-") as tmp:
        root = Path(tmp)
        sizes = [int(x) for x in args.sizes.split(",") if x]  # --sizes "" skips a part
        users = [int(x) for x in args.users.split(",") if x]
        result = {"provenance": provenance, "loadavg_start": os.getloadavg(),
                  "add": bench_add(sizes, root, args.singles) if sizes else None,
                  "users": bench_users(users, root) if users else [],
                  "crash": bench_crash(args.trials, root) if args.trials else None,
                  "topic_ab": bench_topic_ab(args.topic_ab, root, args.singles)
                  if args.topic_ab else None}
    if result["add"]:
        single = result["add"]["single"]
        print("| memories | single add median ms | p90 ms | raw Chroma add ms | Chroma log "
              "unpersisted (ours / raw) | graph.json | graph.log | load avg |")
        print("|---|---|---|---|---|---|---|---|")
        for row in single:
            print(f"| {row['memories']} | {row['median_ms']:.1f} | {row['p90_ms']:.1f} | "
                  f"{row['raw_chroma_add_median_ms']:.1f} | {row['chroma_log_pending']} / "
                  f"{row['raw_log_pending']} | {row['graph_json_bytes']:,} | "
                  f"{row['graph_log_bytes']:,} | {row['loadavg'][0]:.1f} |")
        many = result["add"]["add_many"]
        first, last = single[0], single[-1]
        b = many["per_batch_ms"]
        print(f"\nadd_many: {many['per_s']:.0f}/s vs raw floor {many['floor_per_s']:.0f}/s "
              f"(ratio {many['ratio']:.2f}). Per batch of 64, ms: ours {b['ours']:.0f}; floor "
              f"= embed {b['embed']:.0f} + bare add {b['add']:.0f}; beside it, the add with "
              f"the items' fields {b['add_records']:.0f} and the near-duplicate query "
              f"{b['dedup_query']:.0f}: no store keeping those can pass {many['bound']:.2f}x."
              f"\nSingle add at {last['memories']} / at "
              f"{first['memories']}: {last['median_ms'] / first['median_ms']:.2f}x (raw Chroma: "
              f"{last['raw_chroma_add_median_ms'] / first['raw_chroma_add_median_ms']:.2f}x)")
    for row in result["users"]:
        print(f"{row['users']} users: {row['open_fds']} open fds, RSS {row['rss_mb']:.0f} MB "
              f"(peak {row['max_rss_mb']:.0f} MB)")
    print(f"load average at the start: {result['loadavg_start'][0]:.1f}, at the end: "
          f"{os.getloadavg()[0]:.1f}")
    if result["topic_ab"]:
        ab = result["topic_ab"]
        for row in ab["rows"]:
            print(f"single add at {ab['memories']}, graph_topic={row['graph_topic']}: median "
                  f"{row['median_ms']:.1f} ms, p90 {row['p90_ms']:.1f} ms")
    if result["crash"]:
        c = result["crash"]
        print(f"kill -9: {c['trials']} trials, {c['lost_acknowledged']} acknowledged writes lost, "
              f"{c['store_disagreements']} store disagreements")
    out = args.out or REPO / "bench" / "results" / f"storage-{int(time.time())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    print(f"JSON: {out}")


if __name__ == "__main__":
    main()
