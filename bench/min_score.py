#!/usr/bin/env python
"""Calibrating ``min_score``: at each threshold of the fused score, how much evidence survives and
how many useless lines are dropped.

For every question, ``Memory.search(user, question, limit=30, min_score=0)`` (30: what
``context()`` searches) returns hits with their fused score. A hit is *evidence* when it is one of
the question's evidence turns (LoCoMo dev, categories 1-4) or holds the sample query's ``expect``
phrase (the demo data). At each threshold ``t`` the script reports, over all questions:

- ``evidence kept``: evidence hits with score >= t / evidence hits in the top 30 (at t = 0);
- ``questions kept``: questions with at least one evidence hit left / those with one at t = 0;
- ``noise dropped``: non-evidence hits with score < t / all non-evidence hits;
- ``hits left``: mean hits per question with score >= t.

The raw floor, measured in the same run on the same hits: the same table for a threshold on the
plain cosine similarity (``breakdown.vector``; 0 when the vector search did not find the hit),
which is what the opencode plugin's 0.7 thresholds.

Usage::

    python bench/min_score.py [--data PATH] [--limit-conversations N] [--out results.json]

LoCoMo data (CC BY-NC 4.0) is read where it lies; the JSON written holds aggregates only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from _provenance import git_info  # noqa: E402  (bench/ is not a package)
from locomo import DEFAULT_DATA, Config, ingest, load_locomo, settings_for  # noqa: E402

DEFAULT_OUT = REPO / "bench" / "results" / "min_score.json"
DEMO = REPO / "hybridmem" / "demo_data"
SEARCH_LIMIT = 30
FUSED = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0, 1.2)
COSINE = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)

log = logging.getLogger("bench.min_score")


@dataclass(frozen=True)
class Scored:
    """One hit of one question: its fused score, its cosine and whether it is evidence."""

    question: int
    fused: float
    cosine: float
    evidence: bool


def table(hits: Sequence[Scored], questions: int, thresholds: Sequence[float],
          signal: str) -> list[dict[str, float]]:
    """The rows of one dataset at each threshold of ``signal`` ("fused" or "cosine")."""
    evidence = [h for h in hits if h.evidence]
    noise = [h for h in hits if not h.evidence]
    answered = {h.question for h in evidence}
    rows = []
    for t in thresholds:
        kept = [h for h in hits if getattr(h, signal) >= t]
        rows.append({
            "threshold": t,
            "evidence_kept": sum(h.evidence for h in kept) / max(len(evidence), 1),
            "questions_kept": len({h.question for h in kept if h.evidence}) / max(len(answered), 1),
            "noise_dropped": 1 - sum(not h.evidence for h in kept) / max(len(noise), 1),
            "hits_left": len(kept) / max(questions, 1),
        })
    return rows


def scored(mem: Any, user: str, question: str, index: int, is_evidence: Any) -> list[Scored]:
    hits = mem.search(user, question, limit=SEARCH_LIMIT, min_score=0)
    return [Scored(index, h.score, h.breakdown.vector or 0.0, bool(is_evidence(h))) for h in hits]


def run_locomo(path: Path, limit: int | None, root: Path, embedder: Any) -> tuple[list[Scored], int]:
    from hybridmem import Memory

    convs, _ = load_locomo(path, limit)
    settings, _ = settings_for(Config("min-score", "hybridmem"), root / "locomo")
    out: list[Scored] = []
    index = 0
    with Memory(settings, embedder=embedder) as mem:
        for conv in convs:
            t0 = time.perf_counter()
            ingest(mem, conv)
            log.info("ingested %s in %.0f s", conv.sample_id, time.perf_counter() - t0)
            for qa in conv.qas:
                if qa.category == 5:
                    continue
                wanted = set(qa.evidence)
                out += scored(mem, conv.user, qa.question, index,
                              lambda h, w=wanted: h.item.metadata.get("dia_id") in w)
                index += 1
    return out, index


def run_demo(root: Path, embedder: Any, demo: Path = DEMO) -> tuple[list[Scored], int]:
    from hybridmem import Memory

    rows = [json.loads(line) for line in
            (demo / "memories.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    queries = json.loads((demo / "demo_queries.json").read_text(encoding="utf-8"))
    settings, _ = settings_for(Config("min-score", "hybridmem"), root / "demo")
    out: list[Scored] = []
    with Memory(settings, embedder=embedder) as mem:
        for user in dict.fromkeys(r["user_id"] for r in rows):
            mem.add_many(user, [{k: v for k, v in r.items() if k != "user_id"}
                                for r in rows if r["user_id"] == user])
        for index, q in enumerate(queries):
            out += scored(mem, q["user_id"], q["query"], index,
                          lambda h, e=q["expect"]: e in h.item.text)
    return out, len(queries)


def markdown(name: str, rows: list[dict[str, float]], signal: str) -> str:
    lines = [f"\n{name} — threshold on the {signal} score",
             "| threshold | evidence kept | questions kept | noise dropped | hits left |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['threshold']:.2f} | {r['evidence_kept']:.3f} | "
                     f"{r['questions_kept']:.3f} | {r['noise_dropped']:.3f} | "
                     f"{r['hits_left']:.1f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo-format JSON")
    parser.add_argument("--limit-conversations", type=int, default=5)
    parser.add_argument("--skip-locomo", action="store_true")
    parser.add_argument("--demo", type=Path, default=DEMO, help="folder of the demo data")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    from hybridmem.offline import LocalEmbedder

    started = time.perf_counter()
    provenance = git_info()
    embedder = LocalEmbedder()
    datasets: dict[str, tuple[list[Scored], int]] = {}
    with tempfile.TemporaryDirectory(prefix="hm-minscore-") as tmp:
        datasets["demo"] = run_demo(Path(tmp), embedder, args.demo)
        if not args.skip_locomo:
            datasets["locomo"] = run_locomo(args.data, args.limit_conversations, Path(tmp),
                                            embedder)
    result: dict[str, Any] = {
        "benchmark": "min-score-calibration",
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git": provenance,
        "loadavg": list(os.getloadavg()),
        "search_limit": SEARCH_LIMIT,
        "datasets": {},
    }
    for name, (hits, questions) in datasets.items():
        fused = table(hits, questions, FUSED, "fused")
        cosine = table(hits, questions, COSINE, "cosine")
        result["datasets"][name] = {"questions": questions, "hits": len(hits),
                                    "evidence_hits": sum(h.evidence for h in hits),
                                    "fused": fused, "cosine_floor": cosine}
        print(markdown(f"{name} ({questions} questions, {len(hits)} hits)", fused, "fused"))
        print(markdown(f"{name} (raw floor)", cosine, "cosine"))
    result["elapsed_seconds"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nload average {os.getloadavg()[0]:.2f}; {result['elapsed_seconds']:.0f} s; "
          f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
