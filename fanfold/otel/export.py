"""A recorded tree's spans, for an OTLP endpoint (``fanfold export --format otlp``)."""

from __future__ import annotations

import gzip
import os
import socket
import ssl
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

import httpx
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

from fanfold import replay
from fanfold.db import Store
from fanfold.otel.spans import ServedBy, SpanObserver

BATCH = 512
"""Spans per OTLP request."""

CONNECT_TIMEOUT = 3.0
"""Seconds to open a connection to the endpoint (a collector is near, or down)."""

RESPONSE_LIMIT = 64 * 1024
"""Bytes of an endpoint's response read at most: an OTLP answer is a few bytes (an
empty ``ExportTraceServiceResponse``, or an error status); the rest is not read."""


class ExportFailed(Exception):
    """The OTLP endpoint did not take the spans (unreachable, refused, an error status,
    a redirect)."""


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


def shown_url(url: str) -> str:
    """``url`` as a message may show it: a ``user:password@`` in it (some collectors
    take basic credentials so) is replaced by ``***@``."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def send_otlp(
    spans: Sequence[ReadableSpan],
    endpoint: str,
    *,
    timeout: float = 10.0,
    connect_timeout: float = CONNECT_TIMEOUT,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Send ``spans`` to an OTLP/HTTP (protobuf) endpoint, in requests of ``BATCH``
    spans; raises ExportFailed, whose message ends with the cause (``Connection
    refused``, ``HTTP 404 Not Found``, a redirect and its ``Location``).

    One attempt per request, no retry: the user runs the command again. A redirect is
    never followed (it is reported with its target); the connection must open within
    ``connect_timeout`` seconds and each read take at most ``timeout``; an accepted
    request's answer is not read, an error's at most ``RESPONSE_LIMIT`` bytes (for its
    message), for at most about ``timeout`` seconds. From ``environ`` (default: the
    process's): the standard ``OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`` (a backend's
    credentials), ``..._CERTIFICATE`` (a CA file) and ``..._COMPRESSION`` (``gzip``).
    """
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    env = os.environ if environ is None else environ
    url = traces_url(endpoint)
    headers = {"content-type": "application/x-protobuf", **_env_headers(env)}
    gzipped = _env(env, "COMPRESSION").strip().lower() == "gzip"
    if gzipped:
        headers["content-encoding"] = "gzip"
    certificate = _env(env, "CERTIFICATE")
    verify: ssl.SSLContext | bool = True
    if certificate:
        try:
            verify = ssl.create_default_context(cafile=certificate)
        except (OSError, ssl.SSLError) as exc:
            raise ExportFailed(
                f"the OTLP certificate file {_short(certificate)} cannot be used: "
                f"{_short(str(exc))}"
            ) from None
    limits = httpx.Timeout(timeout, connect=connect_timeout)
    with httpx.Client(
        follow_redirects=False, timeout=limits, verify=verify, headers={"user-agent": "fanfold"}
    ) as client:
        for start in range(0, len(spans), BATCH):
            body = encode_spans(spans[start : start + BATCH]).SerializeToString()
            why = _post(client, url, gzip.compress(body) if gzipped else body, headers)
            if why is not None:
                raise ExportFailed(
                    f"the OTLP endpoint {shown_url(url)} did not take the spans "
                    f"({start} of {len(spans)} sent): {why}"
                )


def _post(client: httpx.Client, url: str, body: bytes, headers: dict[str, str]) -> str | None:
    """POST one request; None if the endpoint took it, else why not (short)."""
    try:
        with client.stream("POST", url, content=body, headers=headers) as response:
            status = response.status_code
            if 300 <= status <= 399:
                # Following it would send the spans (and the headers' credentials) to a
                # place the user never named; a collector does not redirect.
                where = response.headers.get("location", "")
                target = _short(where) if where else "no Location"
                return f"HTTP {status} redirect to {target} (not followed: give that URL)"
            if 200 <= status <= 299:
                return None  # taken; its body (a partial success, at most) is not read
            deadline = time.monotonic() + (client.timeout.read or 10.0)
            answer = b"".join(_bounded(response.iter_raw(), RESPONSE_LIMIT, deadline))
            reason = _short(response.reason_phrase or "", 60)
            kind = response.headers.get("content-type", "")
            # A text or JSON body says why; a protobuf one (google.rpc.Status) is left out.
            text = "text" in kind or "json" in kind
            detail = _short(answer.decode("utf-8", "replace")) if text and answer else ""
            return " ".join(p for p in (f"HTTP {status}", reason, detail and f"({detail})") if p)
    except httpx.ConnectError as exc:
        return _connect_failure(exc)
    except httpx.ConnectTimeout:
        return f"could not connect within {client.timeout.connect}s"
    except httpx.TimeoutException:
        return f"no answer within {client.timeout.read}s"
    except httpx.LocalProtocolError:
        # Its text may quote a header, and the headers may hold a credential.
        return "the request could not be sent (an invalid header: see OTEL_EXPORTER_OTLP_HEADERS)"
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        return f"{type(exc).__name__}: {_short(str(exc)) or 'no details'}"


def _bounded(chunks: Iterator[bytes], limit: int, deadline: float) -> Iterator[bytes]:
    """The first ``limit`` bytes of ``chunks``, as long as they come before
    ``deadline`` (``time.monotonic``: a server dripping a byte a second is not waited
    for); the rest is never read (the response is closed, and its connection with it)."""
    left = limit
    for chunk in chunks:
        yield chunk[:left]
        left -= len(chunk)
        if left <= 0 or time.monotonic() > deadline:
            return


def _connect_failure(exc: httpx.ConnectError) -> str:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(seen) < 20:
        seen.append(current)
        current = current.__cause__ or current.__context__
    if any(isinstance(c, ConnectionRefusedError) for c in seen):
        return "Connection refused"
    if any(isinstance(c, socket.gaierror) for c in seen):
        return "the host name could not be resolved"
    return f"could not connect: {_short(str(exc)) or 'no details'}"


def _env(env: Mapping[str, str], name: str) -> str:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``."""
    return env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or env.get(f"OTEL_EXPORTER_OTLP_{name}", "")


def _env_headers(env: Mapping[str, str]) -> dict[str, str]:
    """The headers of ``OTEL_EXPORTER_OTLP_HEADERS`` and ``..._TRACES_HEADERS`` (the
    latter wins): ``name=value`` pairs separated by commas, values URL-encoded, as the
    OTLP exporter specification says. Read here rather than by the SDK's parser, which
    logs a malformed variable's whole text, credentials included, to the console; a
    malformed one is an ExportFailed that does not quote it."""
    found: dict[str, str] = {}
    for name in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"):
        for item in env.get(name, "").split(","):
            if not item.strip():
                continue
            key, equals, value = item.partition("=")
            key = urllib.parse.unquote(key).strip().lower()
            if not equals or not key or not all(ch.isalnum() or ch in "-_." for ch in key):
                raise ExportFailed(
                    f"${name} is not a comma-separated list of name=value (its text is "
                    "not shown: it may hold a credential)"
                )
            found[key] = urllib.parse.unquote(value).strip()
    return found


def _short(text: str, limit: int = 200) -> str:
    """One line of printable text, at most ``limit`` characters."""
    flat = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
