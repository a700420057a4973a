"""The service's ``/metrics`` and ``/ready`` over a real uvicorn on 127.0.0.1: real requests, a
real Memory (embedded Chroma, the local embedder), a real OpenAI-wire endpoint, and the scrape
read by Prometheus' own text parser."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hybridmem import Memory, Settings
from hybridmem.observe import STAGES
from hybridmem.offline import LocalEmbedder
from hybridmem.server import Metrics, create_app
from openai_wire import OpenAIWireServer, Reply
from uvicorn_thread import free_port, serve

KEY = "metrics-key-0123"
#: Distinctive strings: none of them may appear anywhere in a scrape.
USER = "tenant-ZQX481-secret"
TEXT = "PLUMGIRAFFE7731 bought the ROG laptop in Lyon"
QUERY = "KIWIQUERY2209 which laptop did I buy"
CHAT = "MANGOCHAT5150 recommend a monitor"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: httpx.Client) -> tuple[str, Samples]:
    """``/metrics`` as text, and every sample parsed by prometheus_client's parser, keyed by
    sample name and labels."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return response.text, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


@dataclass
class Service:
    url: str
    memory: Memory
    metrics: Metrics

    def client(self, key: str | None = KEY) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


def _settings(path: Path, endpoint: OpenAIWireServer, **fields: object) -> Settings:
    return Settings(data_dir=path, server_api_key=KEY, extractor="rules",
                    base_url=endpoint.base_url, api_key="sk-test", chat_model="test-model",
                    max_retries=0, request_timeout=30, episode_turns=0, **fields)


@pytest.fixture()
def service(tmp_path: Path, embedder: LocalEmbedder,
            openai_server: OpenAIWireServer) -> Iterator[Service]:
    """A service whose Memory was built with the app's observer, as ``hybridmem serve`` does."""
    metrics = Metrics()
    settings = _settings(tmp_path / "hm", openai_server)
    with Memory(settings, embedder=embedder, observer=metrics.observer) as memory:
        with serve(create_app(memory, metrics=metrics)) as url:
            yield Service(url, memory, metrics)


MEMORIES = "/v1/users/{user_id}/memories"
CONTEXT = "/v1/users/{user_id}/context"


def test_the_scrape_counts_requests_errors_and_stages_exactly(service: Service) -> None:
    with service.client() as c:
        for n in range(3):
            assert c.post(f"/v1/users/{USER}/memories",
                          json={"text": f"{TEXT}, receipt {n}"}).status_code == 201
        for _ in range(2):
            assert c.post(f"/v1/users/{USER}/context", json={"query": QUERY}).status_code == 200
        bad = c.post(f"/v1/users/{USER}/memories", json={"text": TEXT, "importance": 7})
        assert bad.status_code == 422
        missing = c.get(f"/v1/users/{USER}/memories/m-nope")
        assert missing.status_code == 404
        _, samples = scrape(c)

    requests = "hybridmem_requests_total"
    assert value(samples, requests, method="POST", route=MEMORIES, status="201") == 3
    assert value(samples, requests, method="POST", route=CONTEXT, status="200") == 2
    assert value(samples, requests, method="POST", route=MEMORIES, status="422") == 1
    errors = "hybridmem_request_errors_total"
    assert value(samples, errors, route=MEMORIES, type="RequestValidationError") == 1
    assert value(samples, errors, route=MEMORIES + "/{memory_id}", type="NotFoundError") == 1
    assert value(samples, "hybridmem_request_seconds_count", method="POST", route=CONTEXT) == 2
    # every stage a context touches has samples; one packing per context
    for stage in ("embed", "vector", "lexical", "graph", "pack"):
        assert value(samples, "hybridmem_stage_seconds_count", stage=stage) >= 1, stage
    assert value(samples, "hybridmem_stage_seconds_count", stage="pack") == 2
    assert value(samples, "hybridmem_open_users") == 1
    assert value(samples, "hybridmem_purge_pending") in (0, 1)
    cache = (value(samples, "hybridmem_record_cache_hits_total")
             + value(samples, "hybridmem_record_cache_misses_total"))
    assert cache >= 1
    assert value(samples, "hybridmem_inflight_requests") == 0
    assert value(samples, "hybridmem_queued_requests") == 0
    assert value(samples, "hybridmem_rejected_requests_total") == 0


def test_endpoint_calls_are_timed_and_their_tokens_counted(
    service: Service, openai_server: OpenAIWireServer
) -> None:
    with service.client() as c:
        c.post(f"/v1/users/{USER}/memories", json={"text": TEXT}).raise_for_status()
        openai_server.script(Reply.text("The Dell 4K monitor."))
        c.post(f"/v1/users/{USER}/chat", json={"message": CHAT}).raise_for_status()
        relayed = c.post("/v1/chat/completions", headers={"X-HybridMem-User": USER},
                         json={"model": "test-model",
                               "messages": [{"role": "user", "content": CHAT}]})
        assert relayed.status_code == 200
        _, samples = scrape(c)
    # every call the Memory made to the endpoint (chat, and the write path's judge), timed once;
    # the relayed completion is the route's own call, counted in tokens below
    made = len(openai_server.requests_to("chat")) - 1
    assert made >= 1
    assert value(samples, "hybridmem_stage_seconds_count", stage="endpoint") == made
    usage = service.memory.usage
    assert usage.prompt_tokens > 0
    tokens = "hybridmem_upstream_tokens_total"
    assert value(samples, tokens, source="memory", kind="prompt") == usage.prompt_tokens
    assert value(samples, tokens, source="memory", kind="completion") == usage.completion_tokens
    upstream = relayed.json()["usage"]
    assert value(samples, tokens, source="proxy", kind="prompt") == upstream["prompt_tokens"]
    assert value(samples, tokens, source="proxy",
                 kind="completion") == upstream["completion_tokens"]


def test_the_scrape_carries_no_memory_text_query_or_user_id(
    service: Service, openai_server: OpenAIWireServer
) -> None:
    with service.client() as c:
        c.post(f"/v1/users/{USER}/memories", json={"text": TEXT}).raise_for_status()
        c.post(f"/v1/users/{USER}/search", json={"query": QUERY}).raise_for_status()
        c.post(f"/v1/users/{USER}/context", json={"query": QUERY}).raise_for_status()
        c.post(f"/v1/users/{USER}/chat", json={"message": CHAT}).raise_for_status()
        c.get(f"/v1/users/{USER}/path", params={"a": TEXT[:20], "b": QUERY[:20]})
        c.post(f"/v1/users/{USER}/memories", json={"text": TEXT, "kind": QUERY})  # a 422
        c.get(f"/v1/users/{USER}/{TEXT.split()[0]}")  # no such route
        c.get(f"/{USER}/{TEXT.split()[0]}")  # not even under /v1
        text, samples = scrape(c)
    for marker in (USER, "ZQX481", TEXT, "PLUMGIRAFFE7731", QUERY, "KIWIQUERY2209",
                   CHAT, "MANGOCHAT5150", "Lyon", "ROG"):
        assert marker not in text, marker
    routes = {dict(labels).get("route") for (_, labels) in samples} - {None}
    assert "unmatched" in routes and "/v1/*" in routes
    assert all(r in ("unmatched", "/v1/*") or "{" in r or not r.startswith("/v1/users")
               for r in routes), routes


def _hold_a_slot(url: str) -> socket.socket:
    """A /v1 request whose body never finishes: it holds its admission slot until closed."""
    address = urlparse(url)
    sock = socket.create_connection((address.hostname, address.port))
    sock.sendall(f"POST /v1/users/{USER}/memories HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
                 "Content-Length: 100\r\n\r\n{\"text\":".encode())
    return sock


def test_the_admission_queue_shows_running_and_refused_requests(
    tmp_path: Path, embedder: LocalEmbedder, openai_server: OpenAIWireServer
) -> None:
    metrics = Metrics()
    with Memory(_settings(tmp_path / "hm", openai_server), embedder=embedder,
                observer=metrics.observer) as memory:
        app = create_app(memory, metrics=metrics, max_inflight=1, queue_timeout=0.2)
        with serve(app) as url, httpx.Client(base_url=url, timeout=60,
                                             headers={"Authorization": f"Bearer {KEY}"}) as c:
            held = _hold_a_slot(url)
            try:
                refused = c.get(f"/v1/users/{USER}/stats")  # waits for the held slot, then 503
                assert refused.status_code == 503
                _, samples = scrape(c)
            finally:
                held.close()
            assert c.get(f"/v1/users/{USER}/stats").status_code == 200
            _, after = scrape(c)
    assert value(samples, "hybridmem_inflight_requests") == 1
    assert value(samples, "hybridmem_queued_requests") == 0
    assert value(samples, "hybridmem_rejected_requests_total") == 1
    assert value(samples, "hybridmem_request_errors_total", route="/v1/*", type="ServerBusy") == 1
    assert value(after, "hybridmem_inflight_requests") == 0
    assert value(after, "hybridmem_rejected_requests_total") == 1


def test_metrics_need_the_key_and_probes_do_not(service: Service) -> None:
    with service.client(key=None) as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/ready").status_code == 200
        assert c.get("/health").status_code == 200
    with service.client(key="wrong") as c:
        assert c.get("/metrics").status_code == 401


def test_ready_answers_503_with_a_typed_error_when_a_store_cannot_serve(
    service: Service
) -> None:
    with service.client(key=None) as c:
        ready = c.get("/ready")
        assert ready.status_code == 200 and ready.json() == {"status": "ready"}
        c.post(f"/v1/users/{USER}/memories", json={"text": TEXT},
               headers={"Authorization": f"Bearer {KEY}"}).raise_for_status()
        users = service.memory.settings.data_dir / "users"
        moved = users.with_name("users-away")
        users.rename(moved)
        users.write_text("not a directory")  # the users' files can no longer be written
        try:
            broken = c.get("/ready")
        finally:
            users.unlink()
            moved.rename(users)
        assert broken.status_code == 503
        assert broken.json()["error"]["type"] == "StorageError"
        assert c.get("/ready").status_code == 200
        service.memory.close()
        closed = c.get("/ready")
        assert closed.status_code == 503
        assert closed.json()["error"]["type"] == "ClosedError"
        assert c.get("/health").status_code == 200  # liveness is not readiness
    with service.client() as c:
        _, samples = scrape(c)  # a closed Memory's gauges are left out; the scrape still works
    assert ("hybridmem_open_users", frozenset()) not in samples
    assert value(samples, "hybridmem_requests_total", method="GET", route="/ready",
                 status="503") == 2


def test_an_app_without_an_observer_still_serves_metrics_and_two_apps_keep_their_own(
    tmp_path: Path, embedder: LocalEmbedder, openai_server: OpenAIWireServer
) -> None:
    """No observer handed to the Memory: requests are counted, stages show zero samples; two
    apps in one process each count only their own requests."""
    settings = _settings(tmp_path / "hm", openai_server)
    with Memory(settings, embedder=embedder) as memory:
        first, second = create_app(memory), create_app(memory)
        with serve(first) as one, serve(second) as two:
            with httpx.Client(base_url=one, headers={"Authorization": f"Bearer {KEY}"}) as c:
                for _ in range(2):
                    c.post(f"/v1/users/{USER}/context", json={"query": QUERY}).raise_for_status()
                _, samples = scrape(c)
            with httpx.Client(base_url=two, headers={"Authorization": f"Bearer {KEY}"}) as c:
                c.post(f"/v1/users/{USER}/context", json={"query": QUERY}).raise_for_status()
                _, other = scrape(c)
    assert value(samples, "hybridmem_requests_total", method="POST", route=CONTEXT,
                 status="200") == 2
    assert value(other, "hybridmem_requests_total", method="POST", route=CONTEXT,
                 status="200") == 1
    for stage in STAGES:
        assert value(samples, "hybridmem_stage_seconds_count", stage=stage) == 0


def test_hybridmem_serve_times_the_stages(tmp_path: Path) -> None:
    """The ``serve`` command builds its Memory with the app's observer: a context it answers
    shows in the stage histograms."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYBRIDMEM_", "OPENAI_"))}
    env["HYBRIDMEM_EMBEDDER"] = "hash"
    server = subprocess.Popen(
        [sys.executable, "-m", "hybridmem.cli", "serve", "--port", str(port),
         "--data-dir", str(tmp_path / "hm"), "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            for _ in range(600):  # until it listens (or dies)
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            c.post(f"/v1/users/{USER}/memories", json={"text": TEXT}).raise_for_status()
            c.post(f"/v1/users/{USER}/context", json={"query": QUERY}).raise_for_status()
            _, samples = scrape(c)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert value(samples, "hybridmem_stage_seconds_count", stage="pack") == 1
    assert value(samples, "hybridmem_stage_seconds_count", stage="embed") >= 1


def test_ready_is_503_when_the_chroma_server_goes_away(
    tmp_path: Path, embedder: LocalEmbedder, openai_server: OpenAIWireServer
) -> None:
    """Server mode: a `chroma run` of this test's own, stopped while the service runs."""
    exe = shutil.which("chroma") or str(Path(sys.executable).with_name("chroma"))
    port = free_port()
    chroma = subprocess.Popen(
        [exe, "run", "--path", str(tmp_path / "chroma"), "--host", "127.0.0.1", "--port",
         str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "ANONYMIZED_TELEMETRY": "False"})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):  # until it answers (or dies)
            assert chroma.poll() is None, "chroma run did not start"
            try:
                if httpx.get(f"{url}/api/v2/heartbeat", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        memory = Memory(_settings(tmp_path / "hm", openai_server, chroma_url=url),
                        embedder=embedder)
        with serve(create_app(memory)) as service, httpx.Client(base_url=service) as c:
            assert c.get("/ready").status_code == 200
            chroma.terminate()
            chroma.wait(timeout=30)
            gone = c.get("/ready")
            assert gone.status_code == 503
            assert gone.json()["error"]["type"] == "StorageError"
            assert c.get("/health").status_code == 200
        memory.close()
    finally:
        chroma.kill()
        chroma.wait(timeout=30)
