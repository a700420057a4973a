#!/usr/bin/env python
"""What the OpenAI-compatible route adds to a chat completion, beside ``Memory.context()``.

One user of ``--memories`` memories (``Memory.add_many`` in batches, local embedder, rule
extractor) behind ``create_app`` on a real uvicorn (a thread of this process). The upstream is the
test suite's OpenAI-wire HTTP server on 127.0.0.1 (``tests/openai_wire.py``, a thread too), which
answers at once. For each of ``--requests`` distinct questions, one keep-alive ``httpx.Client``:

- **plain**: the same body sent directly to the upstream, then through the service (the user
  named in ``user``); the added p50 is p50(through the service) - p50(direct). Once with the
  exchange stored (the default: the next request reads a memory just written to), once with
  ``hybridmem: {"store": false}`` (the route's own work only);
- **stream**: the same with ``stream: true``: time to the first content chunk (TTFT), and the
  tail, from the ``[DONE]`` event to the end of the response (the exchange is stored after it);
- **context()**: ``Memory.context(user, question)`` on the same memory, called directly, for
  as many questions never asked before, and at the end for the questions the plain requests
  asked (a repeat may find warmer caches, so both are shown).

Every question is asked once per measurement, and the rows take turns, one question each, so
that each sees the memory as warm as the others. The service's stores of an exchange are waited
for (``drain``) between requests, outside the timed part. The goal it checks: the added p50 is
at most the ``context()`` p50 + 3 ms, and nothing is added after the last chunk.

Usage::

    python bench/proxy.py [--memories 10000] [--requests 100] [--batch 500] [--out PATH] [-q]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))
from _provenance import git_info, machine_info  # noqa: E402  (bench/ is not a package)
from latency import World  # noqa: E402
from openai_wire import OpenAIWireServer  # noqa: E402  (the suite's upstream)
from uvicorn_thread import serve  # noqa: E402

from hybridmem import Memory, Settings  # noqa: E402
from hybridmem.server import create_app  # noqa: E402

DEFAULT_OUT = REPO / "bench" / "results" / "proxy.json"
USER = "bench-user"
MODEL = "gpt-4o-mini"
#: The goal: what the route adds, at most what context() costs plus this.
SLACK_MS = 3.0
WARMUP = 5
PACKAGES = ("hybridmem", "chromadb", "fastapi", "uvicorn", "httpx", "onnxruntime")

log = logging.getLogger("bench.proxy")


def distinct_questions(world: World, n: int, seed: int) -> list[str]:
    """``n`` different questions (a repeat may hit caches), in a fixed order."""
    seen: dict[str, None] = {}
    round_ = 0
    while len(seen) < n:
        for q in world.questions(n, seed=seed + round_):
            seen.setdefault(q, None)
        round_ += 1
    return list(seen)[:n]


def body(question: str, *, stream: bool = False, store: bool = True) -> dict[str, Any]:
    sent: dict[str, Any] = {"model": MODEL, "user": USER, "stream": stream,
                            "messages": [{"role": "user", "content": question}]}
    if not store:
        sent["hybridmem"] = {"store": False}
    return sent


def plain(client: httpx.Client, url: str, question: str, *, store: bool = True) -> float:
    """Seconds for one non-streamed completion."""
    started = time.perf_counter()
    answer = client.post(url, json=body(question, store=store))
    elapsed = time.perf_counter() - started
    answer.raise_for_status()
    assert answer.json()["choices"][0]["message"]["content"], answer.text
    return elapsed


def streamed(client: httpx.Client, url: str, question: str) -> tuple[float, float]:
    """(seconds to the first content chunk, seconds from ``[DONE]`` to the end of the response)."""
    started = time.perf_counter()
    first = done = None
    with client.stream("POST", url, json=body(question, stream=True)) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = time.perf_counter()
            elif first is None and json.loads(data)["choices"][0]["delta"].get("content"):
                first = time.perf_counter()
    ended = time.perf_counter()
    assert first is not None and done is not None, "no content chunk or no [DONE]"
    return first - started, ended - done


def ms(values: Sequence[float]) -> dict[str, float]:
    """p50 / p95 / mean in milliseconds of durations in seconds."""
    arr = sorted(v * 1000 for v in values)
    return {"p50": statistics.median(arr), "p95": arr[max(0, round(len(arr) * 0.95) - 1)],
            "mean": statistics.fmean(arr), "n": len(arr)}


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=10_000, help="memories of the user")
    parser.add_argument("--requests", type=int, default=100,
                        help="distinct questions per measurement")
    parser.add_argument("--batch", type=int, default=500, help="memories per add_many call")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.memories < 1 or args.requests < 1 or args.batch < 1:
        parser.error("--memories, --requests and --batch must be positive")
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "hybridmem"):  # a line per request would cost CPU in the timed part
        logging.getLogger(noisy).setLevel(logging.WARNING)

    provenance = git_info()
    world = World()
    n = args.requests
    pool = distinct_questions(world, WARMUP + 4 * n, seed=7)
    warm, rest = pool[:WARMUP], pool[WARMUP:]
    asked, not_stored, streamed_qs, unasked = (rest[i * n:(i + 1) * n] for i in range(4))

    with tempfile.TemporaryDirectory() as tmp, OpenAIWireServer() as wire:
        settings = Settings(data_dir=Path(tmp) / "hm", extractor="rules", judge=False,
                            episode_turns=0, chroma_url=None, base_url=wire.base_url,
                            api_key="sk-bench-upstream")
        with Memory(settings) as memory:
            texts = world.sentences(args.memories, seed=1)
            started = time.perf_counter()
            for i in range(0, len(texts), args.batch):
                memory.add_many(USER, texts[i:i + args.batch])
            ingest_s = time.perf_counter() - started
            stored = memory.count(USER)
            log.info("ingested %d memories (%d stored) in %.1fs", len(texts), stored, ingest_s)

            app = create_app(memory, api_keys=[])
            proxy = app.state.openai_proxy
            with serve(app) as url, httpx.Client(timeout=60) as client:
                direct, service = wire.base_url + "/chat/completions", url + "/v1/chat/completions"
                for q in warm:  # first uses: connections, the tokenizer, the query path
                    plain(client, direct, q)
                    plain(client, service, q)
                    streamed(client, direct, q)
                    streamed(client, service, q)
                    memory.context(USER, q)
                assert proxy.drain(timeout=120), "stores still pending"

                # One question of each row in turn, so that every row sees the memory as warm as
                # the others (caches fill as questions go by).
                plain_direct, plain_service, nostore_direct, nostore_service = [], [], [], []
                ttft_direct, ttft_service, tail_direct, tail_service = [], [], [], []
                context_new = []
                for q_plain, q_nostore, q_stream, q_context in zip(asked, not_stored,
                                                                   streamed_qs, unasked):
                    plain_direct.append(plain(client, direct, q_plain))
                    plain_service.append(plain(client, service, q_plain))
                    assert proxy.drain(timeout=120), "stores still pending"
                    nostore_direct.append(plain(client, direct, q_nostore))
                    nostore_service.append(plain(client, service, q_nostore, store=False))
                    first, tail = streamed(client, direct, q_stream)
                    ttft_direct.append(first)
                    tail_direct.append(tail)
                    first, tail = streamed(client, service, q_stream)
                    ttft_service.append(first)
                    tail_service.append(tail)
                    assert proxy.drain(timeout=120), "stores still pending"
                    context_new.append(timed(lambda q=q_context: memory.context(USER, q)))
                context_asked = [timed(lambda q=q: memory.context(USER, q)) for q in asked]
                stats = proxy.stats
                exchanges = {"stored": stats.stored, "store_failures": stats.store_failures}

    figures = {
        "plain": {"direct_ms": ms(plain_direct), "service_ms": ms(plain_service),
                  "paired_added_ms": ms([s - d for s, d in zip(plain_service, plain_direct)]),
                  "no_store_direct_ms": ms(nostore_direct),
                  "no_store_service_ms": ms(nostore_service)},
        "stream": {"ttft_direct_ms": ms(ttft_direct), "ttft_service_ms": ms(ttft_service),
                   "tail_direct_ms": ms(tail_direct), "tail_service_ms": ms(tail_service)},
        "context_ms": {"same_questions": ms(context_asked), "new_questions": ms(context_new)},
    }
    added = figures["plain"]["service_ms"]["p50"] - figures["plain"]["direct_ms"]["p50"]
    added_no_store = (figures["plain"]["no_store_service_ms"]["p50"]
                      - figures["plain"]["no_store_direct_ms"]["p50"])
    added_ttft = (figures["stream"]["ttft_service_ms"]["p50"]
                  - figures["stream"]["ttft_direct_ms"]["p50"])
    added_tail = (figures["stream"]["tail_service_ms"]["p50"]
                  - figures["stream"]["tail_direct_ms"]["p50"])
    context_p50 = figures["context_ms"]["new_questions"]["p50"]
    result = {
        "git": provenance,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(PACKAGES),
        "settings": {"memories": args.memories, "stored": stored, "requests": n,
                     "batch": args.batch, "embedder": settings.embedder,
                     "context_max_tokens": settings.context_max_tokens},
        "ingest_s": ingest_s,
        "exchanges": exchanges,
        **figures,
        "added_p50_ms": added,
        "added_no_store_p50_ms": added_no_store,
        "added_ttft_p50_ms": added_ttft,
        "added_tail_p50_ms": added_tail,
        "goal": {"added_p50_le_context_p50_plus_ms": SLACK_MS,
                 "met": added <= context_p50 + SLACK_MS,
                 "met_without_store": added_no_store <= context_p50 + SLACK_MS,
                 "nothing_after_last_chunk_ms": added_tail},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")

    def row(name: str, direct: dict[str, float], through: dict[str, float]) -> str:
        return (f"| {name} | {direct['p50']:.1f} | {through['p50']:.1f} | "
                f"{through['p50'] - direct['p50']:+.1f} | {through['p95']:.1f} |")

    cores = result["machine"]["cpu_count"]
    print(f"\n{stored} memories, {n} distinct questions per row, on {cores} cores\n")
    print("| ms | direct p50 | through the service p50 | added p50 | service p95 |")
    print("|---|---|---|---|---|")
    print(row("completion", figures["plain"]["direct_ms"], figures["plain"]["service_ms"]))
    print(row("completion, store: false", figures["plain"]["no_store_direct_ms"],
              figures["plain"]["no_store_service_ms"]))
    print(row("stream: first chunk", figures["stream"]["ttft_direct_ms"],
              figures["stream"]["ttft_service_ms"]))
    print(row("stream: [DONE] to end", figures["stream"]["tail_direct_ms"],
              figures["stream"]["tail_service_ms"]))
    same, new = figures["context_ms"]["same_questions"], figures["context_ms"]["new_questions"]
    print(f"| Memory.context(), new questions | | {new['p50']:.1f} | | {new['p95']:.1f} |")
    print(f"| Memory.context(), questions asked before | | {same['p50']:.1f} | | "
          f"{same['p95']:.1f} |")
    verdict = "met" if result["goal"]["met"] else "NOT met"
    print(f"\nadded p50 {added:.1f} ms ({added_no_store:.1f} ms with store: false) vs context() "
          f"p50 {context_p50:.1f} ms + {SLACK_MS:.0f} ms: {verdict}; stored {exchanges['stored']} "
          f"exchanges, {exchanges['store_failures']} failures; JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
