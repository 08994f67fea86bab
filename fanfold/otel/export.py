"""A recorded tree's spans, for an OTLP endpoint (``fanfold export --format otlp``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

from fanfold import replay
from fanfold.db import Store
from fanfold.otel.spans import SpanObserver

BATCH = 512
"""Spans per OTLP request."""


class ExportFailed(Exception):
    """The OTLP endpoint did not take the spans (unreachable, refused, an error status)."""


def record_tree(
    store: Store, conversation_id: str, tracer: Tracer, *, capture_content: bool = False
) -> None:
    """Emit the spans of ``conversation_id``'s tree (it and every sub-agent below it)
    from its log through ``tracer``, with the recorded times. Nothing is run: the log is
    replayed (``fanfold.replay.steps``); a damaged log raises LogCorrupt."""
    observer = SpanObserver(tracer, capture_content=capture_content)
    for step in replay.steps(store, conversation_id, tree=True):
        observer.step(step.conversation_id, step.event, step.effects, step.after_state, step.at)
    observer.close()


def tree_spans(
    store: Store, conversation_id: str, *, capture_content: bool = False
) -> tuple[ReadableSpan, ...]:
    """The finished spans of a recorded tree, in the order they ended."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "fanfold"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    record_tree(
        store, conversation_id, provider.get_tracer("fanfold"), capture_content=capture_content
    )
    provider.shutdown()
    spans: tuple[ReadableSpan, ...] = memory.get_finished_spans()
    return spans


def traces_url(endpoint: str) -> str:
    """An OTLP/HTTP base URL (``http://host:4318``) or the full traces URL."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


def send_otlp(spans: Sequence[ReadableSpan], endpoint: str, *, timeout: float = 10.0) -> None:
    """Send ``spans`` to an OTLP/HTTP (protobuf) endpoint; raises ExportFailed."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exporter = OTLPSpanExporter(endpoint=traces_url(endpoint), timeout=timeout)
    try:
        for start in range(0, len(spans), BATCH):
            result = exporter.export(spans[start : start + BATCH])
            if result is not SpanExportResult.SUCCESS:
                raise ExportFailed(
                    f"the OTLP endpoint {traces_url(endpoint)} did not take the spans "
                    f"({start} of {len(spans)} sent)"
                )
    finally:
        closing: Any = exporter  # its shutdown() is untyped
        closing.shutdown()
