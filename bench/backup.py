#!/usr/bin/env python
"""Backup and restore time: ``Memory.backup`` and ``Memory.restore`` on the demo data and on one
user of 10,000 memories, beside the raw floors measured in the same run.

Floors: for a backup, copying the data directory with ``shutil.copytree`` (what a naive file copy
costs — and it may be torn); for a restore, embedding the texts alone with the same embedder (a
restore re-embeds everything, see hybridmem.ops.backup). Offline: local MiniLM embedder (or
``--embedder hash``), rule extractor, embedded Chroma.

Usage::

    python bench/backup.py [--memories 10000] [--embedder local|hash] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from _provenance import git_info  # noqa: E402  (bench/ is not a package)

DEFAULT_OUT = REPO / "bench" / "results" / "backup.json"
REPEATS = 3


def timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def synthetic(n: int) -> list[str]:
    colours = ("red", "blue", "green", "black", "white", "grey", "orange")
    things = ("kettle", "laptop", "bike", "lamp", "chair", "phone", "desk", "monitor", "dock")
    cities = ("Lyon", "Berlin", "Oslo", "Porto", "Leeds", "Austin", "Toronto")
    return [f"Order {i}: a {colours[i % 7]} {things[i // 7 % 9]} shipped to "
            f"{cities[i // 63 % 7]} on day {i % 365}." for i in range(n)]


def measure(name: str, root: Path, embedder: Any, load: Callable[[Any], list[str]],
            repeats: int = REPEATS) -> dict[str, Any]:
    from hybridmem import Memory, Settings

    data = root / f"{name}-data"
    settings = Settings(data_dir=data, extractor="rules")
    with Memory(settings, embedder=embedder) as mem:
        t0 = time.perf_counter()
        texts = load(mem)
        ingest = time.perf_counter() - t0
        backups = [timed(lambda: mem.backup(root / f"{name}-backups")) for _ in range(repeats)]
    copies = []
    for i in range(repeats):
        copies.append(timed(lambda: shutil.copytree(data, root / f"{name}-copy-{i}")))
    restores = []
    for i in range(repeats):
        with Memory(Settings(data_dir=root / f"{name}-restored-{i}", extractor="rules"),
                    embedder=embedder) as fresh:
            restores.append(timed(lambda: fresh.restore(root / f"{name}-backups")))
    embeds = [timed(lambda: [embedder.embed_batch(texts[s:s + 64])
                             for s in range(0, len(texts), 64)]) for _ in range(repeats)]
    snapshot = sorted((root / f"{name}-backups").iterdir())[-1]
    size = sum(p.stat().st_size for p in snapshot.rglob("*") if p.is_file())
    return {"dataset": name, "memories": len(texts), "ingest_s": ingest,
            "backup_s": statistics.median(backups), "copytree_floor_s": statistics.median(copies),
            "restore_s": statistics.median(restores), "embed_floor_s": statistics.median(embeds),
            "snapshot_bytes": size, "runs": repeats}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--embedder", choices=("local", "hash"), default="local")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="runs per figure (median)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    from hybridmem.offline import HashEmbedder, LocalEmbedder

    embedder = LocalEmbedder() if args.embedder == "local" else HashEmbedder()
    rows = [json.loads(line) for line in
            (REPO / "hybridmem" / "demo_data" / "memories.jsonl").read_text(encoding="utf-8").splitlines() if line]

    def demo(mem: Any) -> list[str]:
        for user in dict.fromkeys(r["user_id"] for r in rows):
            mem.add_many(user, [{k: v for k, v in r.items() if k != "user_id"}
                                for r in rows if r["user_id"] == user])
        return [r["text"] for r in rows]

    def big(mem: Any) -> list[str]:
        texts = synthetic(args.memories)
        for start in range(0, len(texts), 500):
            mem.add_many("big-user", texts[start:start + 500])
        return texts

    load_start = os.getloadavg()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hm-backup-bench-") as tmp:
        results = [measure("demo", Path(tmp), embedder, demo, args.repeats),
                   measure(f"user-{args.memories}", Path(tmp), embedder, big, args.repeats)]
    out = {"benchmark": "backup-restore", "git": git_info(), "embedder": embedder.name,
           "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "loadavg_start": list(load_start), "loadavg_end": list(os.getloadavg()),
           "results": results, "elapsed_s": time.perf_counter() - started}
    print("| data | memories | backup s | copytree floor s | restore s | embed floor s | "
          "snapshot MB |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['dataset']} | {r['memories']} | {r['backup_s']:.2f} | "
              f"{r['copytree_floor_s']:.2f} | {r['restore_s']:.2f} | {r['embed_floor_s']:.2f} | "
              f"{r['snapshot_bytes'] / 1e6:.1f} |")
    print(f"\nembedder {embedder.name}; load average {load_start[0]:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end; medians of {args.repeats}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
