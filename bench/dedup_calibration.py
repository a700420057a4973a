#!/usr/bin/env python
"""Near-duplicate threshold calibration: precision and recall of merging on a labelled set.

``bench/dedup_pairs.tsv`` holds pairs written for this (label 1: the same statement in other
words, which should merge; label 0: distinct facts, often on the same topic, which must not). Each
pair is embedded with the local MiniLM embedder and judged by :func:`hybridmem.write.policy.near_duplicate`
(the write path's rule: same numbers, and cosine >= threshold or content-word Jaccard >=
``dedup_jaccard``) at a range of cosine thresholds. Prints a table; writes JSON to
``bench/results/dedup_calibration.json``.

Usage::

    python bench/dedup_calibration.py [--pairs PATH] [--out PATH] [--jaccard 0.6]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from _provenance import git_info, machine_info  # noqa: E402

DEFAULT_PAIRS = REPO / "bench" / "dedup_pairs.tsv"
DEFAULT_OUT = REPO / "bench" / "results" / "dedup_calibration.json"
THRESHOLDS = [round(0.50 + 0.02 * i, 2) for i in range(24)]  # 0.50 ... 0.96


def load_pairs(path: Path) -> list[tuple[int, str, str]]:
    """(label, first, second) rows of a tab-separated file; '#' lines are comments."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 3 or parts[0] not in ("0", "1"):
            raise SystemExit(f"{path}:{number}: expected 'label<TAB>first<TAB>second'")
        rows.append((int(parts[0]), parts[1].strip(), parts[2].strip()))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=Path, default=DEFAULT_PAIRS)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--jaccard", type=float, default=None,
                        help="Jaccard bar (default: Settings.dedup_jaccard)")
    args = parser.parse_args(argv)

    from hybridmem.offline import LocalEmbedder
    from hybridmem.write.policy import jaccard, near_duplicate

    from hybridmem import Settings

    jaccard_min = args.jaccard if args.jaccard is not None else Settings().dedup_jaccard
    started = time.perf_counter()
    pairs = load_pairs(args.pairs)
    embedder = LocalEmbedder()
    vectors = embedder.embed_batch([t for _, a, b in pairs for t in (a, b)])
    cosines = [
        sum(x * y for x, y in zip(vectors[2 * i], vectors[2 * i + 1])) for i in range(len(pairs))
    ]
    positives = sum(label for label, _, _ in pairs)
    rows = []
    for threshold in THRESHOLDS:
        merged = [
            near_duplicate(a, b, cos, jaccard_min=jaccard_min, cosine_min=threshold)
            for (_, a, b), cos in zip(pairs, cosines)
        ]
        tp = sum(m and label == 1 for m, (label, _, _) in zip(merged, pairs))
        fp = sum(m and label == 0 for m, (label, _, _) in zip(merged, pairs))
        precision = tp / (tp + fp) if tp + fp else 1.0
        recall = tp / positives if positives else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        rows.append({"threshold": threshold, "merged": tp + fp, "true": tp, "false": fp,
                     "precision": precision, "recall": recall, "f1": f1})
    pos = sorted(c for c, (label, _, _) in zip(cosines, pairs) if label == 1)
    neg = sorted(c for c, (label, _, _) in zip(cosines, pairs) if label == 0)
    print(f"{len(pairs)} pairs ({positives} same statement, {len(pairs) - positives} distinct); "
          f"jaccard bar {jaccard_min}")
    print(f"cosine of same-statement pairs: min {pos[0]:.2f} median {pos[len(pos) // 2]:.2f} "
          f"max {pos[-1]:.2f}; distinct pairs: min {neg[0]:.2f} median {neg[len(neg) // 2]:.2f} "
          f"max {neg[-1]:.2f}")
    print("\n| cosine >= | merged | right | wrong | precision | recall | F1 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['threshold']:.2f} | {r['merged']} | {r['true']} | {r['false']} | "
              f"{r['precision']:.3f} | {r['recall']:.3f} | {r['f1']:.3f} |")
    wrong = [
        {"label": label, "cosine": round(cos, 3), "jaccard": round(jaccard(a, b), 3)}
        for (label, a, b), cos in zip(pairs, cosines)
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "provenance": git_info(), "machine": machine_info(["onnxruntime"]),
        "pairs_file": str(args.pairs), "jaccard_min": jaccard_min, "rows": rows,
        "pairs": wrong, "seconds": time.perf_counter() - started,
    }, indent=2), encoding="utf-8")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
