"""OpenTelemetry traces of jobs: the request, the publish, the message, the claim, the batch's
forward pass and the store.

On when OTEL_EXPORTER_OTLP_ENDPOINT is set (spans go there over OTLP/HTTP, batched) or
RENQ_TRACING=1 (RENQ_TRACE_FILE=<path>: each span as a JSON line in that file, for tests and
diagnostics). Then Django, Celery, psycopg2, Redis and requests are instrumented, and a dispatch
message carries its publish span's context (W3C `traceparent`) in its headers. Off, no tracer
provider is set and every function here returns at its first line.

A batch's spans (claim, forward pass, store) have the first job's trace as their parent and
link to every job's: a job alone in its batch has one trace from request to store.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Tracer

_tracer: Tracer | None = None  # None: tracing is off
_instrumentors: list = []


def configure() -> bool:
    """Turn tracing on in this process if the environment asks for it (once; at the web
    server's and the Celery worker's start). True if it is on."""
    if _tracer is not None:
        return True
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    trace_file = os.environ.get("RENQ_TRACE_FILE")
    if not endpoint and os.environ.get("RENQ_TRACING") != "1":
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    resource = Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME", "renq")})
    provider = TracerProvider(resource=resource)
    if endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if trace_file:
        # Written as each span ends: a test reads them while the process runs.
        out = open(trace_file, "a", buffering=1)  # noqa: SIM115 - open as long as the process
        exporter = ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(None) + "\n")
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    enable(provider)
    return True


def enable(provider: trace.TracerProvider) -> None:
    """Trace into `provider`: instrument the libraries and start renq's own spans."""
    global _tracer
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg2 import Psycopg2Instrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.instrumentation.requests import RequestsInstrumentor

    for instrumentor in (
        DjangoInstrumentor(),
        CeleryInstrumentor(),
        Psycopg2Instrumentor(),
        RedisInstrumentor(),
        RequestsInstrumentor(),
    ):
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=provider)
            _instrumentors.append(instrumentor)
    _tracer = provider.get_tracer("renq")


def disable() -> None:
    """Tracing off again (tests): the libraries uninstrumented, renq's spans no-ops."""
    global _tracer
    while _instrumentors:
        _instrumentors.pop().uninstrument()
    _tracer = None


def enabled() -> bool:
    return _tracer is not None


def asgi_app(app: Callable) -> Callable:
    """`app` with a server span per request (an ASGI handler Django's middleware never sees)."""
    if _tracer is None:
        return app
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    # One span per request: a span per ASGI message (each streamed chunk) would cost more
    # than the request's own work.
    return OpenTelemetryMiddleware(app, exclude_spans=["receive", "send"])


def inject(headers: dict) -> None:
    """The current span's context into a message's headers (`traceparent`, `tracestate`)."""
    if _tracer is not None:
        propagate.inject(headers)


def message_context(headers: Mapping | None) -> SpanContext | None:
    """The context a message's headers carry (its publish span's), if any."""
    if _tracer is None or not headers:
        return None
    context = trace.get_current_span(propagate.extract(headers)).get_span_context()
    return context if context.is_valid else None


def current_context() -> SpanContext | None:
    """The running span's context (in a task: the span Celery's instrumentation opened from
    the message's `traceparent`)."""
    if _tracer is None:
        return None
    context = trace.get_current_span().get_span_context()
    return context if context.is_valid else None


@contextmanager
def span(name: str, kind: SpanKind = SpanKind.INTERNAL, **attributes: Any) -> Iterator[None]:
    """A span of the current trace around the block (`renq.<key>` attributes)."""
    if _tracer is None:
        yield
        return
    with _tracer.start_as_current_span(name, kind=kind, attributes=_attributes(attributes)):
        yield


def start_batch_span(
    name: str,
    contexts: Iterable[SpanContext | None],
    *,
    start_time_ns: int | None = None,
    **attributes: Any,
) -> Span | None:
    """A started span of work on several jobs: a child of the first job's trace, linked to
    every job's (`contexts`, one per job, None for a job published untraced). The caller
    ends it. `start_time_ns` (time.time_ns()): work that began before its trace was known."""
    if _tracer is None:
        return None
    distinct = list({(c.trace_id, c.span_id): c for c in contexts if c is not None}.values())
    parent = trace.set_span_in_context(trace.NonRecordingSpan(distinct[0])) if distinct else None
    return _tracer.start_span(
        name,
        context=parent,
        links=[Link(c) for c in distinct],
        attributes=_attributes(attributes),
        start_time=start_time_ns,
    )


@contextmanager
def batch_span(
    name: str, contexts: Iterable[SpanContext | None], **attributes: Any
) -> Iterator[None]:
    """start_batch_span's span, current around the block."""
    started = start_batch_span(name, contexts, **attributes)
    if started is None:
        yield
        return
    with trace.use_span(started, end_on_exit=True, record_exception=True):
        yield


def within(started: Span | None, function: Callable) -> Callable:
    """`function` run with the started span current, and ending it (on another thread)."""
    if started is None:
        return function

    def run(*args, **kwargs):
        with trace.use_span(started, end_on_exit=True, record_exception=True):
            return function(*args, **kwargs)

    return run


def end_when_done(started: Span | None, future: Future) -> None:
    """End the span when the future's work ends (in the thread that did it)."""
    if started is not None:
        future.add_done_callback(lambda _: started.end())


def _attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {f"renq.{key}": value for key, value in attributes.items() if value is not None}
