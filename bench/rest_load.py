#!/usr/bin/env python
"""Requests per second of the REST service under concurrent clients, on a real uvicorn.

A server process (``uvicorn`` over ``create_app(Memory(...))``, local embedder, rule extractor, no
LLM) holds ``--users`` small users of ``--memories`` memories each. ``--clients`` threads in this
process, each with its own keep-alive ``httpx.Client``, then POST ``.../context`` for
``--seconds`` (client *i* asks for user ``i % users``). The floor is measured the same way in the
same run: ``GET /health`` (HTTP, middlewares and JSON only, no memory work).

Usage::

    python bench/rest_load.py [--clients 8] [--users 8] [--memories 20] [--seconds 10] [--out PATH]

Run it with ``PYTHONPATH`` pointing at the tree to measure (e.g. before/after a change).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from _provenance import git_info  # noqa: E402  (bench/ is not a package)

DEFAULT_OUT = REPO / "bench" / "results" / "rest_load.json"
QUERIES = ["which laptop did I buy?", "where do I live?", "what do I like to eat?",
           "when is my trip?", "what monitor fits my desk?"]
SERVER = """
import sys, uvicorn
from hybridmem import Memory, Settings
from hybridmem.server import create_app
data_dir, port, users, per_user = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
memory = Memory(Settings(data_dir=data_dir, extractor="rules", base_url=None, chroma_url=None))
facts = ["Bought a ROG laptop in March", "Lives in Lyon near the river", "Likes spicy ramen",
         "Flies to Lisbon on 12 May", "Wants a 27 inch 4K monitor", "Works from home on Fridays"]
for u in range(users):
    memory.add_many(f"user{u}", [f"{facts[i % len(facts)]} (note {i})" for i in range(per_user)])
uvicorn.run(create_app(memory, api_keys=[]), host="127.0.0.1", port=port, log_level="warning")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _load(url: str, clients: int, seconds: float, request: Any) -> dict[str, float]:
    """Run ``request(client, i)`` from ``clients`` threads for ``seconds``; rps and latencies."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    # Clients are made first: building one is slow on a loaded machine and is not a request.
    sessions = [httpx.Client(base_url=url, timeout=60) for _ in range(clients)]
    stop = time.monotonic() + seconds

    def worker(i: int) -> None:
        with sessions[i] as client:
            n = 0
            while time.monotonic() < stop:
                started = time.perf_counter()
                try:
                    ok = request(client, i, n).status_code == 200
                except httpx.HTTPError as exc:
                    ok = False
                    print(f"client {i}: {type(exc).__name__}: {exc}", file=sys.stderr)
                latencies[i].append(time.perf_counter() - started)
                errors[i] += not ok
                n += 1

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    flat = sorted(x for per in latencies for x in per)
    return {
        "requests": len(flat), "errors": sum(errors), "rps": len(flat) / elapsed,
        "p50_ms": statistics.median(flat) * 1000 if flat else 0.0,
        "p95_ms": flat[int(len(flat) * 0.95) - 1] * 1000 if flat else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--memories", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "ANONYMIZED_TELEMETRY": "False"}
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(Path(tmp) / "hm"), str(port), str(args.users),
             str(args.memories)], env=env)
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the server did not start")
                time.sleep(0.2)

            def context(client: httpx.Client, i: int, n: int) -> httpx.Response:
                return client.post(f"/v1/users/user{i % args.users}/context",
                                   json={"query": QUERIES[n % len(QUERIES)], "max_tokens": 300})

            def health(client: httpx.Client, i: int, n: int) -> httpx.Response:
                return client.get("/health")

            _load(url, args.clients, 5.0, context)  # warm-up: models, caches, connections
            load_before = os.getloadavg()
            results = {
                "floor_health": _load(url, args.clients, args.seconds, health),
                "context": _load(url, args.clients, args.seconds, context),
            }
            load_after = os.getloadavg()
        finally:
            server.terminate()
            server.wait(timeout=30)

    print(f"{'route':<16}{'requests':>10}{'errors':>8}{'req/s':>10}{'p50 ms':>10}{'p95 ms':>10}")
    for name, r in results.items():
        print(f"{name:<16}{r['requests']:>10}{r['errors']:>8}{r['rps']:>10.1f}"
              f"{r['p50_ms']:>10.1f}{r['p95_ms']:>10.1f}")
    print(f"clients={args.clients} users={args.users} memories/user={args.memories} "
          f"loadavg before={load_before[0]:.2f} after={load_after[0]:.2f} cores={os.cpu_count()}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "params": vars(args) | {"out": str(args.out)}, "results": results,
        "loadavg_before": load_before, "loadavg_after": load_after, "git": git_info(),
        "hybridmem": __import__("hybridmem").__file__,
    }, indent=2, default=str))


if __name__ == "__main__":
    main()
