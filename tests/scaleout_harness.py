"""The scale-out load test, shared by tests/test_scaleout.py (2 workers, 10 users) and
bench/scaleout.py (4 workers, 200 users): real ``hybridmem serve`` processes against one real
``chroma run``, mixed add/context/forget traffic from concurrent clients, one worker SIGKILLed and
restarted midway; then the checks.

- Each user belongs to one client thread, so the client knows the truth: what it was told is
  stored (201) and what it was told is forgotten (200). Requests go round robin over the workers,
  as behind a load balancer; one that gets no answer (the killed worker) is retried on the next
  worker, and an add retried that way is deduplicated by the server if the first attempt landed.
- Every text names its user (``Customer<u>``), so a response naming another user is a leak.
- After the traffic: every worker must hold every acknowledged memory and none acknowledged as
  forgotten (losses, resurrections), and all workers must give the same answers (graph relations,
  search hits with their lexical and graph signals) within the documented refresh interval.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

CUSTOMER = re.compile(r"Customer(\d+)\b")
PRODUCTS = ["Dell monitor", "ROG laptop", "Logitech mouse", "Sony headphones", "Kindle reader",
            "Canon camera", "Bose speaker", "Asus router"]
CITIES = ["Lyon", "Lisbon", "Porto", "Oslo", "Turin", "Ghent"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[Any], what: str, timeout: float = 120) -> None:
    """Poll ``url`` until it answers; RuntimeError if ``proc`` exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.1)


def start_chroma(path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A real ``chroma run`` on 127.0.0.1 (telemetry off), as tests/conftest.py starts it."""
    exe = shutil.which("chroma") or str(Path(sys.executable).with_name("chroma"))
    port = free_port()
    env = {**os.environ, "ANONYMIZED_TELEMETRY": "False"}
    proc = subprocess.Popen([exe, "run", "--path", str(path), "--host", "127.0.0.1", "--port",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/api/v2/heartbeat", proc, "chroma run", timeout=60)
    return proc, url


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Worker:
    """One ``hybridmem serve`` process on a fixed port (a restart reuses the port)."""

    port: int
    data_dir: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> float:
        """Start the process; seconds until it answers ``/health``."""
        started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hybridmem.cli", "serve", "--port", str(self.port),
             "--data-dir", str(self.data_dir), "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env)
        wait_http(f"{self.url}/health", self.proc, f"worker on {self.port}")
        return time.monotonic() - started

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


def workers(n: int, root: Path, chroma_url: str, *, embedder: str = "hash",
            pythonpath: str | None = None) -> list[Worker]:
    """``n`` workers (not started) against ``chroma_url``, each with its own data dir. The
    graph's topic signal is off: its node-name vectors are per process (docs/server-mode.md), and
    the convergence check compares answers that depend only on what the server holds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYBRIDMEM_")}
    env.update({"HYBRIDMEM_CHROMA_URL": chroma_url, "HYBRIDMEM_EMBEDDER": embedder,
                "HYBRIDMEM_EXTRACTOR": "rules", "HYBRIDMEM_GRAPH_TOPIC": "0",
                "ANONYMIZED_TELEMETRY": "False"})
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return [Worker(free_port(), root / f"worker{i}", dict(env)) for i in range(n)]


@dataclass
class Truth:
    """What one user's client was told."""

    stored: dict[str, str] = field(default_factory=dict)  # acknowledged id -> text
    forgotten: set[str] = field(default_factory=set)
    live: list[str] = field(default_factory=list)  # stored and not forgotten, in add order


@dataclass
class Report:
    requests: int = 0
    seconds: float = 0.0
    latencies: dict[str, list[float]] = field(default_factory=dict)
    failed: int = 0  # requests that failed on every worker or got an error status
    retried: int = 0  # requests that found no worker on the first try (the killed one)
    leaks: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    restart_seconds: float | None = None
    kill_at: float | None = None
    slow_after_kill: int = 0  # requests that took over 5 s (a dead writer's lease expiring)

    def summary(self) -> dict[str, Any]:
        def ms(values: Sequence[float]) -> dict[str, float]:
            if not values:
                return {"n": 0}
            ordered = sorted(values)
            return {"n": len(values), "p50": 1000 * statistics.median(ordered),
                    "p95": 1000 * ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
                    "max": 1000 * ordered[-1]}
        return {"requests": self.requests, "seconds": round(self.seconds, 2),
                "requests_per_s": round(self.requests / self.seconds, 1) if self.seconds else 0,
                "ms": {op: ms(v) for op, v in sorted(self.latencies.items())},
                "failed": self.failed, "retried_on_another_worker": self.retried,
                "slow_over_5s": self.slow_after_kill, "leaks": len(self.leaks),
                "restart_seconds": self.restart_seconds, "errors": self.errors[:10]}


def text_of(user: int, n: int, rng: random.Random) -> str:
    product, city = rng.choice(PRODUCTS), rng.choice(CITIES)
    return f"Customer{user} bought a {product} number {n} in {city} for project {user}x{n}"


class Load:
    """Clients sending mixed traffic to the workers; see the module docstring."""

    def __init__(self, cluster: list[Worker], users: int, clients: int, *, seed: int = 1,
                 mix: tuple[float, float, float] = (0.45, 0.45, 0.10),
                 prefix: str = "scale-user") -> None:
        self.cluster, self.users, self.clients = cluster, users, clients
        self.prefix = prefix
        self.truth = {u: Truth() for u in range(users)}
        self.report = Report()
        self.mix = mix
        self.seed = seed
        self._lock = threading.Lock()
        self._down: dict[int, float] = {}  # worker index -> monotonic time it failed

    def user_id(self, u: int) -> str:
        return f"{self.prefix}-{u}"

    def _send(self, client: httpx.Client, start: int, method: str, path: str,
              body: Any = None) -> tuple[httpx.Response | None, int]:
        """The request on the first worker (round robin from ``start``) that answers."""
        n = len(self.cluster)
        tried = 0
        for k in range(n * 2):
            i = (start + k) % n
            with self._lock:
                down = self._down.get(i)
            if down is not None and time.monotonic() - down < 0.5 and k < n:
                continue
            tried += 1
            try:
                return client.request(method, self.cluster[i].url + path, json=body), tried
            except httpx.TransportError:
                with self._lock:
                    self._down[i] = time.monotonic()
        return None, tried

    def _client(self, c: int, stop: float, at_least: int = 0) -> None:
        rng = random.Random(self.seed * 1000 + c)
        mine = [u for u in range(self.users) if u % self.clients == c]
        n = made = 0
        with httpx.Client(timeout=120) as client:
            while (time.monotonic() < stop or made < at_least) and mine:
                made += 1
                u = rng.choice(mine)
                truth, uid = self.truth[u], self.user_id(u)
                roll = rng.random()
                op = "add" if roll < self.mix[0] or not truth.live else (
                    "context" if roll < self.mix[0] + self.mix[1] else "forget")
                started = time.perf_counter()
                if op == "add":
                    text = text_of(u, n, rng)
                    n += 1
                    got, tried = self._send(client, n + c, "POST", f"/v1/users/{uid}/memories",
                                            {"text": text})
                    ok = got is not None and got.status_code == 201
                    if ok and got is not None:
                        mid = got.json()["id"]
                        if mid not in truth.stored:
                            truth.live.append(mid)
                        truth.stored[mid] = text
                elif op == "context":
                    query = f"which {rng.choice(PRODUCTS)} did Customer{u} buy in {rng.choice(CITIES)}?"
                    got, tried = self._send(client, n + c, "POST", f"/v1/users/{uid}/context",
                                            {"query": query, "max_tokens": 300})
                    ok = got is not None and got.status_code == 200
                    if ok and got is not None:
                        self._check_leak(u, got.text)
                else:
                    mid = rng.choice(truth.live)
                    got, tried = self._send(client, n + c, "DELETE",
                                            f"/v1/users/{uid}/memories/{mid}")
                    # a retry of a forget that landed finds nothing: that is a success too
                    ok = got is not None and (got.status_code == 200 or (
                        tried > 1 and got.status_code == 404))
                    if ok:
                        truth.forgotten.add(mid)
                        truth.live.remove(mid)
                n += 1
                spent = time.perf_counter() - started
                with self._lock:
                    self.report.requests += 1
                    self.report.latencies.setdefault(op, []).append(spent)
                    self.report.retried += tried > 1
                    self.report.slow_after_kill += spent > 5
                    if not ok:
                        self.report.failed += 1
                        status = "no worker" if got is None else f"{got.status_code} {got.text[:200]}"
                        self.report.errors.append(f"{op} {uid}: {status}")

    def _check_leak(self, u: int, body: str) -> None:
        others = {int(m) for m in CUSTOMER.findall(body)} - {u}
        if others:
            with self._lock:
                self.report.leaks.append(f"user {u} saw customers {sorted(others)}")

    def run(self, seconds: float, *, kill: int | None = 0, kill_at: float = 0.5,
            down_for: float = 1.0, at_least: int = 0) -> Report:
        """Traffic for ``seconds``, and until each client made ``at_least`` requests (so the
        traffic a test checks does not depend on the machine's speed); at ``kill_at`` of the
        seconds worker ``kill`` is SIGKILLed, and restarted ``down_for`` seconds later
        (``kill=None``: no kill)."""
        started = time.monotonic()
        stop = started + seconds
        threads = [threading.Thread(target=self._client, args=(c, stop, at_least), daemon=True)
                   for c in range(self.clients)]
        for t in threads:
            t.start()
        if kill is not None:
            time.sleep(seconds * kill_at)
            self.report.kill_at = time.monotonic() - started
            self.cluster[kill].kill()
            time.sleep(down_for)
            self.report.restart_seconds = self.cluster[kill].start()
        for t in threads:
            t.join()
        self.report.seconds = time.monotonic() - started
        return self.report

    # -- after the traffic ----------------------------------------------------------------------
    def lost(self) -> dict[str, list[str]]:
        """Per worker: acknowledged memories it does not hold, and forgotten ones it does."""
        out: dict[str, list[str]] = {}
        with httpx.Client(timeout=120) as client:
            for w in self.cluster:
                bad: list[str] = []
                for u, truth in self.truth.items():
                    uid = self.user_id(u)
                    got = client.get(f"{w.url}/v1/users/{uid}/memories",
                                     params={"limit": 1000})
                    held = {m["id"]: m for m in got.json()} if got.status_code == 200 else {}
                    bad += [f"lost {uid}/{m}" for m in truth.live if m not in held]
                    bad += [f"resurrected {uid}/{m}" for m in truth.forgotten if m in held]
                    bad += [f"leak {uid}/{m['id']}" for m in held.values()
                            if {int(x) for x in CUSTOMER.findall(m["text"])} - {u}]
                out[w.url] = bad
        return out

    def answers(self, client: httpx.Client, w: Worker, u: int) -> Any:
        """What a worker answers for user ``u`` from what it caches: its graph relations (keys,
        predicate, memories) and a search's hits with their lexical and graph signals."""
        uid = self.user_id(u)
        rels = client.get(f"{w.url}/v1/users/{uid}/relations")
        # min_score 0: every memory the signals find, whatever its score, since a score moves
        # with recency and with access counts, which each search (this one too) adds to
        hits = client.post(f"{w.url}/v1/users/{uid}/search",
                           json={"query": f"Customer{u} bought a Dell monitor in Lyon",
                                 "limit": 50, "min_score": 0.0})
        if rels.status_code != 200 or hits.status_code != 200:
            return ("error", rels.status_code, hits.status_code)
        relations = sorted((r["subject_key"], r["predicate"], r["object_key"],
                            tuple(sorted(r["memory_ids"]))) for r in rels.json())
        found = sorted((h["item"]["id"], round(h["breakdown"]["lexical"] or 0.0, 3),
                        h["breakdown"]["graph_hops"]) for h in hits.json())
        return relations, found

    def disagreements(self) -> list[str]:
        """One pass: the users for whom the workers' answers differ."""
        with httpx.Client(timeout=120) as client:
            return [self.user_id(u) for u in self.truth if not self._agree(client, u)]

    def _agree(self, client: httpx.Client, u: int) -> bool:
        """Whether every worker answered, and alike."""
        seen = {repr(self.answers(client, w, u)) for w in self.cluster}
        return len(seen) == 1 and not next(iter(seen)).startswith("('error'")

    def converge(self, timeout: float = 300.0) -> tuple[float, int] | None:
        """Ask every worker about every user, then again about the users they disagree on, until
        none is left: (seconds from the call until the last user's answers agreed, passes), or
        None when some still disagree after ``timeout``. Each pass takes time itself (a first
        request for a user loads it), so the figure is an upper bound."""
        started = time.monotonic()
        pending = list(self.truth)
        passes = 0
        with httpx.Client(timeout=120) as client:
            while pending and time.monotonic() - started < timeout:
                passes += 1
                pending = [u for u in pending if not self._agree(client, u)]
                if pending:
                    time.sleep(0.2)
        return None if pending else (time.monotonic() - started, passes)
