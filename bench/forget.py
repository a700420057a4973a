#!/usr/bin/env python
"""Forget benchmark: what one ``forget(user, memory_id)`` costs at a user's size, and where.

Copies an ingested data dir (``bench/latency.py --ingest-only`` makes one; the copy is what gets
changed), opens it as every face does (``Memory(Settings(...))``), forgets ``--n`` memories one
at a time and prints the median, min and max, then the profile of those calls restricted to
hybridmem's own functions and the SQLite statements under them (cumulative seconds over all
calls): which parts grow with the user.

    flock /work/bench.lock python bench/forget.py DATA_DIR USER_ID --copy-to /tmp/f --n 8
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("user_id")
    parser.add_argument("--copy-to", type=Path, required=True)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--embedder", default="local")
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
