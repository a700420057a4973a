"""The service's metrics, in Prometheus' text format at ``GET /metrics``, and what feeds them.

:class:`Metrics` owns one :class:`prometheus_client.CollectorRegistry` (never the process-wide
default: two apps in one process keep their own counts) and three sources:

- :class:`MetricsMiddleware` (pure ASGI, outermost) counts every request by method, route
  *template* and status, its errors by type (the ``type`` of the error body), and its latency;
- :attr:`Metrics.observer`, a :class:`~hybridmem.observe.Observer` to hand to the Memory
  (``Memory(settings, observer=metrics.observer)``), times the stages of the work: embed,
  vector, lexical, graph, pack and endpoint (failures by error class);
- a collector read at scrape time, from public state only: the admission queue (running,
  waiting, refused), :meth:`Memory.status` (open users, record-cache hits and misses, a pending
  purge, the Memory's own endpoint token usage) and the OpenAI-compatible route's
  :class:`~hybridmem.server.proxy.ProxyStats` (stores, upstream token usage).

Labels are route templates (``/v1/users/{user_id}/memories``), stage names, error class names
and fixed words: never a raw path, a user id, a query or any memory text. A request that matched
no route is labelled ``unmatched``.

==========================================  ==========  =================================
metric                                      type        labels
==========================================  ==========  =================================
``hybridmem_requests_total``                counter     method, route, status
``hybridmem_request_errors_total``          counter     route, type
``hybridmem_request_seconds``               histogram   method, route
``hybridmem_stage_seconds``                 histogram   stage
``hybridmem_stage_errors_total``            counter     stage, type
``hybridmem_inflight_requests``             gauge
``hybridmem_queued_requests``               gauge
``hybridmem_rejected_requests_total``       counter
``hybridmem_open_users``                    gauge
``hybridmem_record_cache_hits_total``       counter
``hybridmem_record_cache_misses_total``     counter
``hybridmem_purge_pending``                 gauge
``hybridmem_upstream_tokens_total``         counter     source (memory, proxy), kind
``hybridmem_proxy_stores_total``            counter     outcome (stored, failed)
``hybridmem_proxy_stores_pending``          gauge
==========================================  ==========  =================================
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
    from starlette.types import ASGIApp, Message, Receive, Scope, Send
except ImportError as exc:  # pragma: no cover
    raise ImportError("the REST service's metrics need: pip install 'hybridmem[server]'") from exc

from hybridmem import ConfigError, HybridMemError, Usage
from hybridmem.observe import STAGES

if TYPE_CHECKING:
    from hybridmem import AsyncMemory
    from hybridmem.server.asgi import Admission
    from hybridmem.server.proxy import ProxyStats

__all__ = ["METRICS_PATH", "Metrics", "MetricsMiddleware", "PrometheusObserver"]

METRICS_PATH = "/metrics"
#: Latency buckets (seconds): stages take from tens of microseconds (a lexical lookup) to
#: seconds (an endpoint call), so the default buckets (from 5 ms) would hide the fast ones.
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
           1.0, 2.5, 5.0, 10.0, 30.0)
#: What an error type label may be: a class name or an OpenAI error code, else ``other``.
_ERROR_TYPE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
#: The most of an error body read to find its type (error bodies are small).
_ERROR_BODY_BYTES = 16_384


def error_type(body: bytes) -> str:
    """The ``error.type`` of an error body, if it is a safe label, else ``other``."""
    try:
        kind = json.loads(body)["error"]["type"]
    except (ValueError, KeyError, TypeError):
        return "other"
    return kind if isinstance(kind, str) and _ERROR_TYPE.fullmatch(kind) else "other"


class _Timed:
    """One run of a stage: its duration into the histogram, its failure into the error count."""

    __slots__ = ("_errors", "_seconds", "_stage", "_started")

    def __init__(self, seconds: Histogram, errors: Counter, stage: str) -> None:
        self._seconds, self._errors, self._stage = seconds, errors, stage
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._seconds.labels(self._stage).observe(time.perf_counter() - self._started)
        if kind is not None:
            self._errors.labels(self._stage, kind.__name__).inc()


class PrometheusObserver:
    """The :class:`~hybridmem.observe.Observer` of :class:`Metrics`: a histogram of each stage's
    seconds and a count of its failures by error class. Token usage is not counted here but at
    scrape time from :meth:`Memory.status`, which sees every model call with or without an
    observer."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._seconds = Histogram("hybridmem_stage_seconds", "Seconds one stage of the work took "
                                  "(embed, vector, lexical, graph, pack, endpoint).", ["stage"],
                                  registry=registry, buckets=BUCKETS)
        self._errors = Counter("hybridmem_stage_errors_total", "Stage runs that raised, by "
                               "error class.", ["stage", "type"], registry=registry)
        for stage in STAGES:  # every stage shows, at zero, before its first run
            self._seconds.labels(stage)

    def stage(self, name: str) -> AbstractContextManager[object]:
        return _Timed(self._seconds, self._errors, name)

    def tokens(self, usage: Usage) -> None:
        return None  # counted from Memory.status() at scrape time (see the class docstring)

    def __repr__(self) -> str:
        return "PrometheusObserver()"


class Metrics:
    """The metrics of one service: a registry of its own, the request counters, the observer to
    hand to the Memory, and (once :func:`~hybridmem.server.create_app` calls :meth:`watch`) the
    gauges read at scrape time. Build it before the Memory, to pass :attr:`observer` in; give it
    to ``create_app(memory, metrics=...)``. One per app."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.observer = PrometheusObserver(self.registry)
        self.requests = Counter("hybridmem_requests", "Requests answered, by method, route "
                                "template and status.", ["method", "route", "status"],
                                registry=self.registry)
        self.errors = Counter("hybridmem_request_errors", "Requests answered with an error "
                              "(status >= 400), by route template and error type.",
                              ["route", "type"], registry=self.registry)
        self.seconds = Histogram("hybridmem_request_seconds", "Seconds from a request's arrival "
                                 "to the end of its response, by method and route template.",
                                 ["method", "route"], registry=self.registry, buckets=BUCKETS)
        self._watched = False

    def watch(self, memory: AsyncMemory, admission: Admission,
              proxy: ProxyStats | None = None) -> None:
        """Read ``memory``'s status, the admission queue and the proxy's counters at every
        scrape (once per Metrics: a registry refuses the same names twice)."""
        if self._watched:
            raise ConfigError("this Metrics already watches an app; build one per app")
        self.registry.register(_Gauges(memory, admission, proxy))
        self._watched = True

    def render(self) -> bytes:
        """The registry in Prometheus' text format."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def __repr__(self) -> str:
        return f"Metrics(watching={self._watched})"


class _Gauges(Collector):
    """What is read at scrape time: counts only, from public state."""

    def __init__(self, memory: AsyncMemory, admission: Admission,
                 proxy: ProxyStats | None) -> None:
        self._memory, self._admission, self._proxy = memory, admission, proxy

    def describe(self) -> Iterable[Metric]:
        return []  # the families depend on what the stores report: not described ahead

    def collect(self) -> Iterator[Metric]:
        q = self._admission
        yield GaugeMetricFamily("hybridmem_inflight_requests", "/v1 requests running now.",
                                value=q.running)
        yield GaugeMetricFamily("hybridmem_queued_requests", "/v1 requests waiting for a slot "
                                "(max_inflight) now.", value=q.waiting)
        yield CounterMetricFamily("hybridmem_rejected_requests", "/v1 requests refused with 503 "
                                  "after queue_timeout without a slot.", value=q.refused)
        tokens = CounterMetricFamily("hybridmem_upstream_tokens", "Tokens the chat endpoint "
                                     "reported: the Memory's own calls (memory) and the "
                                     "OpenAI-compatible route's (proxy).",
                                     labels=["source", "kind"])
        try:
            status = self._memory.memory.status()
        except HybridMemError:  # closed: its gauges are left out, /ready says why
            status = None
        if status is not None:
            if status.open_users is not None:
                yield GaugeMetricFamily("hybridmem_open_users", "Users whose memories the "
                                        "vector store holds open now.", value=status.open_users)
            if status.record_cache_hits is not None:
                yield CounterMetricFamily("hybridmem_record_cache_hits", "Reads the in-memory "
                                          "record copy answered.", value=status.record_cache_hits)
            if status.record_cache_misses is not None:
                yield CounterMetricFamily("hybridmem_record_cache_misses", "Reads that found no "
                                          "record copy (Chroma was read).",
                                          value=status.record_cache_misses)
            yield GaugeMetricFamily("hybridmem_purge_pending", "1 while an erasure awaits its "
                                    "purge.", value=int(status.purge_pending))
            tokens.add_metric(["memory", "prompt"], status.usage.prompt_tokens)
            tokens.add_metric(["memory", "completion"], status.usage.completion_tokens)
        if self._proxy is not None:
            p = self._proxy
            tokens.add_metric(["proxy", "prompt"], p.prompt_tokens)
            tokens.add_metric(["proxy", "completion"], p.completion_tokens)
            stores = CounterMetricFamily("hybridmem_proxy_stores", "Exchanges of the "
                                         "OpenAI-compatible route stored, or failed to store.",
                                         labels=["outcome"])
            stores.add_metric(["stored"], p.stored)
            stores.add_metric(["failed"], p.store_failures)
            yield stores
            yield GaugeMetricFamily("hybridmem_proxy_stores_pending", "Exchanges waiting to be "
                                    "stored.", value=p.pending)
        yield tokens


def _route(scope: Scope, prefix: str) -> str:
    """The route template; never a raw path (a /v1 path carries a user id, and any other would
    let a scanner grow the label set without bound)."""
    path = getattr(scope.get("route"), "path", None)
    if isinstance(path, str):
        return path
    raw = str(scope.get("path", ""))
    return f"{prefix}/*" if raw == prefix or raw.startswith(prefix + "/") else "unmatched"


class MetricsMiddleware:
    """Counts every HTTP request into :class:`Metrics`: method, route template, status, latency,
    and for an error its type, read from the error body (the one shape every error has, see
    :func:`hybridmem.server.asgi.error_body`)."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics, prefix: str) -> None:
        self.app, self.metrics, self.prefix = app, metrics, prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500
        body = bytearray()

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status >= 400 and \
                    len(body) < _ERROR_BODY_BYTES:
                body.extend(message.get("body", b"")[:_ERROR_BODY_BYTES - len(body)])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            m, route, method = self.metrics, _route(scope, self.prefix), scope["method"]
            m.requests.labels(method, route, str(status)).inc()
            m.seconds.labels(method, route).observe(time.perf_counter() - started)
            if status >= 400:
                m.errors.labels(route, error_type(bytes(body))).inc()
