"""A recorded tree's spans, for an OTLP endpoint (``fanfold export --format otlp``)."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

from fanfold import replay
from fanfold.db import Store
from fanfold.otel.spans import ServedBy, SpanObserver

BATCH = 512
"""Spans per OTLP request."""


class ExportFailed(Exception):
    """The OTLP endpoint did not take the spans (unreachable, refused, an error status)."""


def record_tree(
    store: Store,
    conversation_id: str,
    tracer: Tracer,
    *,
    capture_content: bool = False,
    served_by: ServedBy | None = None,
) -> None:
    """Emit the spans of ``conversation_id``'s tree (it and every sub-agent below it)
    from its log through ``tracer``, with the recorded times. Nothing is run: the log is
    replayed (``fanfold.replay.steps``); a damaged log raises LogCorrupt. ``served_by``:
    the provider and model of each conversation (``SpanObserver``)."""
    observer = SpanObserver(tracer, capture_content=capture_content, served_by=served_by)
    for step in replay.steps(store, conversation_id, tree=True):
        observer.step(step.conversation_id, step.event, step.effects, step.after_state, step.at)
    observer.close()


def tree_spans(
    store: Store,
    conversation_id: str,
    *,
    capture_content: bool = False,
    served_by: ServedBy | None = None,
) -> tuple[ReadableSpan, ...]:
    """The finished spans of a recorded tree, in the order they ended."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "fanfold"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    record_tree(
        store,
        conversation_id,
        provider.get_tracer("fanfold"),
        capture_content=capture_content,
        served_by=served_by,
    )
    provider.shutdown()
    spans: tuple[ReadableSpan, ...] = memory.get_finished_spans()
    return spans


def traces_url(endpoint: str) -> str:
    """An OTLP/HTTP base URL (``http://host:4318``) or the full traces URL."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


def send_otlp(spans: Sequence[ReadableSpan], endpoint: str, *, timeout: float = 10.0) -> None:
    """Send ``spans`` to an OTLP/HTTP (protobuf) endpoint; raises ExportFailed, whose
    message ends with the exporter's last complaint (``Connection refused``,
    ``HTTP 404 Not Found``). The exporter's own log lines (one per retry, with a
    repr of the whole exception) are kept from the console while it runs."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exporter = OTLPSpanExporter(endpoint=traces_url(endpoint), timeout=timeout)
    with _ExporterLog() as complaints:
        try:
            for start in range(0, len(spans), BATCH):
                result = exporter.export(spans[start : start + BATCH])
                if result is not SpanExportResult.SUCCESS:
                    why = f": {complaints.reason}" if complaints.reason else ""
                    raise ExportFailed(
                        f"the OTLP endpoint {traces_url(endpoint)} did not take the spans "
                        f"({start} of {len(spans)} sent){why}"
                    )
        finally:
            closing: Any = exporter  # its shutdown() is untyped
            closing.shutdown()


_EXPORTER_LOGGER = "opentelemetry.exporter.otlp"
_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\"()\]]+)")


class _ExporterLog(logging.Handler):
    """Takes the OTLP exporter's log records while it is installed (``with``): they
    do not propagate to the console, and ``reason`` is a short form of the last."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reason = ""
        self._logger = logging.getLogger(_EXPORTER_LOGGER)
        self._propagate = self._logger.propagate

    def __enter__(self) -> _ExporterLog:
        self._logger.addHandler(self)
        self._logger.propagate = False
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.propagate = self._propagate

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.WARNING:
            return
        args = record.args if isinstance(record.args, tuple) else ()
        message = str(record.msg)  # a logger may be given any object, not only text
        if message.startswith("Failed to export %s batch code:") and len(args) == 3:
            code, reason = args[1], args[2]
            if code is not None:
                self.reason = f"HTTP {code} {reason}".strip()
                return
            args = (reason,)
        elif message.startswith("Transient error %s") and args:
            args = (args[0],)
        else:  # "... due to timeout, max retries or shutdown": the last transient error's
            args = ()
        if args:
            text = " ".join(str(args[0]).split())
            found = _ERRNO.search(text)
            self.reason = found.group(1).strip() if found else text[:200]
