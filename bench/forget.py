#!/usr/bin/env python
"""Forget benchmark: what one ``forget(user, memory_id)`` costs, and whether other users' data
makes it dearer.

Two modes.

**At a user's size** (``DATA_DIR USER_ID``): copies an ingested data dir (``bench/latency.py
--ingest-only`` makes one; the copy is what gets changed), opens it as every face does
(``Memory(Settings(...))``), forgets ``--n`` memories one at a time and prints the median, min and
max, then the profile of those calls restricted to hybridmem's own functions and the SQLite
statements under them (cumulative seconds over all calls): which parts grow with the user.

    flock /work/bench.lock python bench/forget.py DATA_DIR USER_ID --copy-to /tmp/f --n 8

**Beside other users** (``--others 0,20000``): for each count, a fresh data dir under
``--copy-to`` holds one user of ``--user-size`` memories and that many memories of other users
(``--per-user`` each); ``--n`` forgets of the one user are timed (median), with the default
``purge_delay`` (the compaction of embedded Chroma's shared file runs in the background) and
with ``purge_delay=0`` (it runs inside each forget), beside one ``purge_now()`` (the compaction
alone) and the floor: a bare Chroma ``delete`` of one id in the same file. A 384-d hash
embedder (MiniLM's dimension) keeps the build fast; a forget embeds nothing.

    flock /work/bench.lock python bench/forget.py --others 0,20000,100000 --copy-to /tmp/fo
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
import shutil
import statistics
import time
from pathlib import Path

from hybridmem import Memory, Settings
from hybridmem.offline import HashEmbedder

TARGET = "forget-target"
#: The local MiniLM embedder's dimension, so Chroma's file is as large as with it.
DIMENSION = 384


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path, nargs="?")
    parser.add_argument("user_id", nargs="?")
    parser.add_argument("--copy-to", type=Path, required=True)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--embedder", default="local")
    parser.add_argument("--others", help="comma-separated counts of other users' memories")
    parser.add_argument("--user-size", type=int, default=200)
    parser.add_argument("--per-user", type=int, default=200)
    args = parser.parse_args()
    if args.others is not None:
        for others in (int(x) for x in args.others.split(",")):
            beside_others(args.copy_to / f"others-{others}", others, args)
        return
    if args.data_dir is None or args.user_id is None:
        parser.error("DATA_DIR and USER_ID are needed without --others")
    at_size(args)


def at_size(args: argparse.Namespace) -> None:
    if not args.copy_to.exists():
        shutil.copytree(args.data_dir, args.copy_to, ignore=shutil.ignore_patterns("*.lock"))
    with Memory(Settings(data_dir=args.copy_to, embedder=args.embedder,
                         extractor="rules")) as mem:
        victims = random.Random(3).sample(mem.list(args.user_id, limit=1000), args.n + 1)
        mem.forget(args.user_id, victims[0].id)  # warm: files and caches opened
        profile, times = cProfile.Profile(), []
        for item in victims[1:]:
            start = time.perf_counter()
            profile.enable()
            mem.forget(args.user_id, item.id)
            profile.disable()
            times.append(time.perf_counter() - start)
    print(f"forget at {args.data_dir}: median {statistics.median(times) * 1e3:.1f} ms, min "
          f"{min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f} (n={len(times)}, load "
          f"{os.getloadavg()[0]:.1f})")
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("cumulative").print_stats(r"hybridmem|sqlite3\.Connection|Bindings", 25)
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip()))


def _texts(user: int, count: int) -> list[str]:
    return [f"Customer {user} note {k}: ordered item {user * 7919 + k} and asked about delivery "
            f"slot {k % 13} for the warehouse in zone {user % 17}." for k in range(count)]


def build(data_dir: Path, others: int, args: argparse.Namespace) -> None:
    """One target user and ``others`` memories of other users (kept between runs)."""
    if (data_dir / "built").exists():
        return
    shutil.rmtree(data_dir, ignore_errors=True)
    settings = Settings(data_dir=data_dir, extractor="rules")
    start = time.perf_counter()
    with Memory(settings, embedder=HashEmbedder(DIMENSION)) as mem:
        mem.add_many(TARGET, _texts(0, args.user_size), infer=False)
        for user in range(1, 1 + -(-others // args.per_user)):
            count = min(args.per_user, others - (user - 1) * args.per_user)
            mem.add_many(f"other-{user}", _texts(user, count), infer=False)
    (data_dir / "built").touch()
    print(f"built {data_dir.name} in {time.perf_counter() - start:.0f} s")


def _median_forget(data_dir: Path, n: int, **fields: float) -> tuple[float, float]:
    with Memory(Settings(data_dir=data_dir, extractor="rules", **fields),
                embedder=HashEmbedder(DIMENSION)) as mem:
        victims = random.Random(len(fields)).sample(mem.list(TARGET, limit=1000), n + 1)
        mem.forget(TARGET, victims[0].id)  # warm: files and caches opened
        times = []
        for item in victims[1:]:
            start = time.perf_counter()
            mem.forget(TARGET, item.id)
            times.append(time.perf_counter() - start)
        # the compaction alone, as the background (or close) runs it
        start = time.perf_counter()
        mem.purge_now()
        purge = time.perf_counter() - start
    return statistics.median(times), purge


def _raw_delete(data_dir: Path, n: int) -> float:
    """The floor: a bare Chroma delete of one id at a time in the same file."""
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    client = chromadb.PersistentClient(path=str(data_dir / "chroma"),
                                       settings=ChromaSettings(anonymized_telemetry=False))
    try:
        target = next(c for c in client.list_collections()
                      if (c.metadata or {}).get("user_id") == TARGET and
                      not c.name.startswith("a-"))
        ids = target.get(limit=n)["ids"]
        times = []
        for id_ in ids:
            start = time.perf_counter()
            target.delete(ids=[id_])
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    finally:
        client.close()


def _fresh_copy(data_dir: Path, trial: Path) -> None:
    """A copy to change, written out to disk first (else the copy's writeback lands on the
    fsyncs of the timed forgets)."""
    shutil.rmtree(trial, ignore_errors=True)
    shutil.copytree(data_dir, trial)
    os.sync()


def beside_others(data_dir: Path, others: int, args: argparse.Namespace) -> None:
    build(data_dir, others, args)
    trial = data_dir.with_name(data_dir.name + "-trial")
    results = {}
    for label, fields in (("deferred", {}), ("in-call", {"purge_delay": 0.0})):
        _fresh_copy(data_dir, trial)
        results[label] = _median_forget(trial, args.n, **fields)
    _fresh_copy(data_dir, trial)
    floor = _raw_delete(trial, args.n)
    size = (data_dir / "chroma" / "chroma.sqlite3").stat().st_size / 1e6
    shutil.rmtree(trial, ignore_errors=True)
    (deferred, purge), (in_call, _) = results["deferred"], results["in-call"]
    print(f"others {others:>7} ({size:.0f} MB chroma.sqlite3): forget p50 {deferred * 1e3:.1f} ms "
          f"(purge_delay=0: {in_call * 1e3:.1f} ms), purge_now {purge * 1e3:.0f} ms, "
          f"raw Chroma delete p50 {floor * 1e3:.1f} ms (n={args.n}, load "
          f"{os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
