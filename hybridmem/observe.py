"""The observer seam: how a :class:`~hybridmem.Memory` reports the time its stages take and the
tokens its endpoint calls use, to whatever watches it (metrics, traces), without depending on one.

- :class:`Observer` — the seam, two methods: ``stage(name)`` (a context manager timing one stage)
  and ``tokens(usage)`` (the usage one endpoint call reported);
- :data:`STAGES` — the stage names the library reports;
- :class:`NullObserver` — the default: does nothing, at the cost of one method call per stage;
- :class:`OTelObserver` — an OpenTelemetry span per stage (``pip install 'hybridmem[otel]'``);
- :class:`Observers` — several observers as one (metrics and traces together).

Why a seam and not a metrics library here: the library must run without a metrics stack, and
the service chooses its own (:mod:`hybridmem.server.metrics` is the Prometheus one). An observer
is handed in (``Memory(..., observer=...)``): nothing global. It never receives memory text,
queries or user ids, only stage names and token counts, so whatever it exports carries none.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any, Protocol, runtime_checkable

from hybridmem.errors import ConfigError
from hybridmem.models import Usage

__all__ = ["STAGES", "NullObserver", "OTelObserver", "Observer", "Observers"]

#: The stages a Memory times: the query or text embedding, the vector query, the lexical (BM25)
#: lookup, the graph activation, packing a context into its budget, and each call to the chat
#: endpoint (chat, extraction, judge, summaries).
STAGES = ("embed", "vector", "lexical", "graph", "pack", "endpoint")

_NOTHING: AbstractContextManager[None] = nullcontext()


@runtime_checkable
class Observer(Protocol):
    """Watches a Memory's work. Called from several threads at once: implementations must be
    thread-safe, and cheap (``stage`` wraps every store call of a search)."""

    def stage(self, name: str) -> AbstractContextManager[object]:
        """A context manager around one run of the stage ``name`` (one of :data:`STAGES`); it
        sees the stage's exception, if one leaves it."""
        ...

    def tokens(self, usage: Usage) -> None:
        """The token usage one endpoint call reported (zeros when the endpoint reports none)."""
        ...


class NullObserver:
    """Observes nothing: the default, so the read and write paths need no ``if observer``."""

    def stage(self, name: str) -> AbstractContextManager[object]:
        return _NOTHING  # one shared nullcontext: no allocation per stage

    def tokens(self, usage: Usage) -> None:
        return None

    def __repr__(self) -> str:
        return "NullObserver()"


class Observers:
    """Several observers as one: each stage is entered in every observer, in order, and left in
    reverse order; token usage goes to each."""

    def __init__(self, observers: Sequence[Observer]) -> None:
        for observer in observers:
            if not isinstance(observer, Observer):
                raise ConfigError(f"{type(observer).__name__} is not an Observer: it needs "
                                  "stage(name) and tokens(usage)")
        self.observers = tuple(observers)

    @contextmanager
    def _all(self, name: str) -> Iterator[None]:
        with ExitStack() as stack:
            for observer in self.observers:
                stack.enter_context(observer.stage(name))
            yield

    def stage(self, name: str) -> AbstractContextManager[object]:
        return self._all(name)

    def tokens(self, usage: Usage) -> None:
        for observer in self.observers:
            observer.tokens(usage)

    def __repr__(self) -> str:
        return f"Observers({list(self.observers)!r})"


class OTelObserver:
    """An OpenTelemetry span per stage, named ``hybridmem.<stage>``, a child of whatever span is
    current (a request's, when the service is instrumented); token usage is added to the current
    span as ``gen_ai.usage.input_tokens`` / ``output_tokens`` attributes.

    ``tracer`` defaults to ``opentelemetry.trace.get_tracer("hybridmem")``. With no SDK or
    exporter configured, OpenTelemetry's API hands out non-recording spans: nothing is recorded
    and nothing is exported. Needs ``pip install 'hybridmem[otel]'`` (opentelemetry-api)."""

    def __init__(self, tracer: Any = None) -> None:
        try:
            from opentelemetry import trace
        except ImportError as exc:
            raise ConfigError("OTelObserver needs OpenTelemetry: pip install 'hybridmem[otel]'") \
                from exc
        self._trace = trace
        self._tracer = tracer if tracer is not None else trace.get_tracer("hybridmem")

    def stage(self, name: str) -> AbstractContextManager[object]:
        span: AbstractContextManager[object] = self._tracer.start_as_current_span(
            f"hybridmem.{name}")
        return span

    def tokens(self, usage: Usage) -> None:
        span = self._trace.get_current_span()
        if span.is_recording():
            span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)

    def __repr__(self) -> str:
        return "OTelObserver()"
