"""The observer seam of :mod:`hybridmem.observe` on a real Memory (embedded Chroma, the local
embedder): which stages a context and a chat report, OpenTelemetry spans with a real SDK and an
in-memory exporter, fan-out, failures, and refusal of what is not an observer."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hybridmem import ClosedError, ConfigError, EmbedderError, Memory, Settings, Usage
from hybridmem.observe import STAGES, NullObserver, Observer, Observers, OTelObserver
from hybridmem.offline import HashEmbedder, LocalEmbedder
from openai_wire import OpenAIWireServer, Reply


class Recorder:
    """An observer that keeps what it is told: stage runs, their failures, token usage."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.failures: list[tuple[str, str]] = []
        self.usage = Usage()
        self._lock = threading.Lock()

    @contextmanager
    def _run(self, name: str) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            with self._lock:
                self.failures.append((name, type(exc).__name__))
            raise
        finally:
            with self._lock:
                self.runs[name] += 1

    def stage(self, name: str) -> AbstractContextManager[object]:
        return self._run(name)

    def tokens(self, usage: Usage) -> None:
        with self._lock:
            self.usage = self.usage + usage


class FailingEmbedder(HashEmbedder):
    """Embeds stored texts, then fails (an endpoint that went away)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def embed_batch(self, texts: Sequence[str]) -> list[list[float]]:
        if self.fail:
            raise ConnectionError("the embedding endpoint went away")
        return super().embed_batch(texts)


def _settings(path: Path, **fields: object) -> Settings:
    return Settings(**{"data_dir": path, "extractor": "rules", "base_url": None, **fields})


def test_a_context_reports_every_read_stage_and_packs_once(
    tmp_path: Path, embedder: LocalEmbedder
) -> None:
    seen = Recorder()
    with Memory(_settings(tmp_path / "hm"), embedder=embedder, observer=seen) as mem:
        mem.add("u1", "Bought the ROG laptop in Lyon")
        writes = seen.runs.copy()
        mem.context("u1", "which laptop did I buy?")
    assert writes["embed"] >= 1 and writes["pack"] == 0
    read = seen.runs - writes
    assert set(read) == {"embed", "vector", "lexical", "graph", "pack"}
    assert read["pack"] == 1
    assert seen.failures == [] and seen.usage == Usage()


def test_endpoint_calls_are_a_stage_with_their_token_usage(
    tmp_path: Path, embedder: LocalEmbedder, openai_server: OpenAIWireServer
) -> None:
    seen = Recorder()
    settings = _settings(tmp_path / "hm", base_url=openai_server.base_url, api_key="sk-test",
                         chat_model="test-model", max_retries=0, episode_turns=0,
                         store_chat=False)
    with Memory(settings, embedder=embedder, observer=seen) as mem:
        openai_server.script(Reply.text("The Dell 4K monitor."))
        reply = mem.chat("u1", "Recommend a monitor")
        openai_server.script(Reply.text("Streaming works fine"))
        assert "".join(mem.chat_stream("u1", "Say something")) == "Streaming works fine"
        total = mem.usage
    assert seen.runs["endpoint"] == len(openai_server.requests_to("chat")) == 2
    assert reply.usage.prompt_tokens > 0
    assert seen.usage == total  # every call's usage, the stream's included when reported


def test_a_failing_stage_is_reported_with_its_error_class(tmp_path: Path) -> None:
    seen = Recorder()
    failing = FailingEmbedder()
    with Memory(_settings(tmp_path / "hm"), embedder=failing, observer=seen) as mem:
        mem.add("u1", "Bought the ROG laptop")
        failing.fail = True
        with pytest.raises(EmbedderError):
            mem.search("u1", "a query never embedded before")
    assert seen.failures == [("embed", "EmbedderError")]


def test_otel_spans_nest_under_the_callers_span_in_every_thread(
    tmp_path: Path, embedder: LocalEmbedder
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with Memory(_settings(tmp_path / "hm"), embedder=embedder,
                observer=OTelObserver(tracer)) as mem:
        mem.add("u1", "Bought the ROG laptop in Lyon")
        exporter.clear()
        with tracer.start_as_current_span("request") as request:
            mem.context("u1", "which laptop did I buy?")
    spans = exporter.get_finished_spans()
    names = {s.name for s in spans} - {"request"}
    assert names == {f"hybridmem.{n}" for n in ("embed", "vector", "lexical", "graph", "pack")}
    parent = request.get_span_context().span_id
    # the lexical lookup runs in a reader thread: its span still has the request as parent
    assert all(s.parent is not None and s.parent.span_id == parent
               for s in spans if s.name != "request")


def test_otel_without_an_sdk_records_nothing(tmp_path: Path, embedder: LocalEmbedder) -> None:
    """The API's default tracer (no SDK, no exporter) hands out non-recording spans."""
    observer = OTelObserver()
    with observer.stage("vector") as span:
        assert not span.is_recording()  # type: ignore[attr-defined]
    with Memory(_settings(tmp_path / "hm"), embedder=embedder, observer=observer) as mem:
        mem.add("u1", "Bought the ROG laptop")
        assert mem.context("u1", "laptop").text


def test_observers_fan_out_and_the_default_observes_nothing(
    tmp_path: Path, embedder: LocalEmbedder
) -> None:
    first, second = Recorder(), Recorder()
    with Memory(_settings(tmp_path / "hm"), embedder=embedder,
                observer=Observers([first, second])) as mem:
        mem.add("u1", "Bought the ROG laptop")
        mem.context("u1", "laptop")
    assert first.runs == second.runs and first.runs["pack"] == 1
    assert isinstance(NullObserver(), Observer)
    with NullObserver().stage("embed") as nothing:
        assert nothing is None
    assert set(STAGES) == {"embed", "vector", "lexical", "graph", "pack", "endpoint"}


def test_what_is_not_an_observer_is_refused_before_anything_opens(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not an Observer"):
        Memory(_settings(tmp_path / "hm"), embedder=HashEmbedder(),
               observer=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not an Observer"):
        Observers([Recorder(), "stage"])  # type: ignore[list-item]
    assert not (tmp_path / "hm" / "chroma").exists()


def test_status_and_ping_in_both_chroma_modes(mem: Memory, unique_user: str) -> None:
    """Counts only (the record copy is kept in both modes)."""
    assert mem.status().open_users == 0
    mem.add(unique_user, "Bought the ROG laptop")
    mem.search(unique_user, "laptop")
    status = mem.status()
    assert status.open_users == 1
    assert status.record_cache_hits is not None and status.record_cache_misses is not None
    assert status.usage == Usage() and status.purge_pending in (True, False)
    assert unique_user not in status.model_dump_json()
    mem.ping()
    mem.close()
    with pytest.raises(ClosedError):
        mem.ping()
    with pytest.raises(ClosedError):
        mem.status()
