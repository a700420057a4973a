#!/usr/bin/env python
"""Writes on a catalogue of one brand: does a single ``add()`` cost the same at 100 products as
at thousands, when every product shares the brand and the product word?

Shapes users bring: a customer who buys many items of one brand ("I bought the Vexo K4711
kettle from Shop11 for $4711.", every product distinct), beside the same number of unrelated
texts (bench/latency.py's generated sentences). For each size:

- the graph step alone — ``NetworkXGraphStore.add_extractions`` of one memory's rule extraction
  into an in-memory graph already holding the catalogue (median over ``--single`` adds), beside
  the rule extraction of the same text (its floor: what any write must do);
- a whole ``Memory.add`` (local embedder, embedded Chroma) at the same size, beside the floor of
  one embedding of the text;
- ``Memory.add_many`` throughput filling the catalogue, and the same for unrelated texts.

Every text added is distinct (a repeat would be merged as a duplicate). Prints a table; writes
JSON to bench/results/.

Usage::

    python bench/catalogue.py [--sizes 100,5000] [--single 50] [--graph-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _provenance import git_info, machine_info  # noqa: E402
from latency import World  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "catalogue.json"
BATCH = 500


def product(n: int) -> str:
    """The n-th purchase of the one-brand catalogue (distinct product, shop and price)."""
    return f"I bought the Vexo K{n} kettle from Shop{n % 97} for ${n}."


def median_ms(values: Sequence[float]) -> float:
    return round(statistics.median(values) * 1000, 3)


def graph_step(size: int, single: int) -> dict[str, float]:
    """Median ms of one memory's graph write and of its rule extraction, at ``size`` products."""
    from hybridmem.extract import RuleExtractor
    from hybridmem.graph import NetworkXGraphStore

    rules, store, user = RuleExtractor(), NetworkXGraphStore(None), "shopper"
    for lo in range(0, size, BATCH):
        store.add_extractions(user, [(f"m{n}", rules.extract(product(n), speaker=user))
                                     for n in range(lo, min(size, lo + BATCH))], links=False)
    extract_s, write_s = [], []
    for n in range(size, size + single):
        t0 = time.perf_counter()
        found = rules.extract(product(n), speaker=user)
        t1 = time.perf_counter()
        store.add_extractions(user, [(f"m{n}", found)], links=False)
        t2 = time.perf_counter()
        extract_s.append(t1 - t0)
        write_s.append(t2 - t1)
    return {"graph_add_ms": median_ms(write_s), "extract_ms": median_ms(extract_s)}


def whole_add(size: int, single: int, texts: Sequence[str], more: Sequence[str]) -> dict[str, float]:
    """add_many throughput over ``texts`` and the median single add of ``more`` after them."""
    from hybridmem import Memory, Settings
    from hybridmem.offline import LocalEmbedder

    embedder = LocalEmbedder()
    with tempfile.TemporaryDirectory(prefix="hm-catalogue-") as tmp:
        with Memory(Settings(data_dir=Path(tmp) / "data"), embedder=embedder) as mem:
            t0 = time.perf_counter()
            for lo in range(0, size, BATCH):
                mem.add_many("shopper", list(texts[lo:lo + BATCH]))
            fill_s = time.perf_counter() - t0
            add_s, floor_s = [], []
            for text in more[:single]:
                t0 = time.perf_counter()
                embedder.embed_batch([text])
                t1 = time.perf_counter()
                mem.add("shopper", text)
                t2 = time.perf_counter()
                floor_s.append(t1 - t0)
                add_s.append(t2 - t1)
    return {"add_many_per_s": round(size / fill_s, 1), "add_ms": median_ms(add_s),
            "embed_floor_ms": median_ms(floor_s)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,5000")
    parser.add_argument("--single", type=int, default=50, help="single adds timed per size")
    parser.add_argument("--graph-only", action="store_true", help="skip the whole-Memory part")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        row: dict[str, object] = {"size": size, **graph_step(size, args.single)}
        if not args.graph_only:
            brand = [product(n) for n in range(size + args.single)]
            row["brand"] = whole_add(size, args.single, brand[:size], brand[size:])
            plain = World().sentences(size + args.single, seed=size)
            row["unrelated"] = whole_add(size, args.single, plain[:size], plain[size:])
        rows.append(row)
        print(json.dumps(row), flush=True)

    print("\n| products | graph add ms | rule extraction ms (floor) | "
          "add() one brand ms | add() unrelated ms | embed floor ms | "
          "add_many/s one brand | add_many/s unrelated |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        b, u = row.get("brand", {}), row.get("unrelated", {})
        assert isinstance(b, dict) and isinstance(u, dict)
        print(f"| {row['size']} | {row['graph_add_ms']} | {row['extract_ms']} | "
              f"{b.get('add_ms', '-')} | {u.get('add_ms', '-')} | {b.get('embed_floor_ms', '-')} | "
              f"{b.get('add_many_per_s', '-')} | {u.get('add_many_per_s', '-')} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"provenance": git_info(), "machine": machine_info(["chromadb", "networkx"]), "rows": rows}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
