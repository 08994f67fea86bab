"""Sans-IO pieces shared by the HTTP providers: SSE decoding, error classification,
retry hints, tool-argument checking and secret redaction.

Nothing here touches a socket or a clock of its own (``now`` is passed in), so every
function is tested with plain data. The rules, in one place:

- Every failure becomes a ``ModelError`` with one ``ErrorKind``; nothing is "unknown".
- HTTP status decides first (429 rate limit, 5xx server error, 401/403 auth, 408
  timeout, 413 context exhausted, 402 quota exhausted, other 4xx invalid request,
  unless the body says the context window is exceeded; a 5xx whose body says so in
  words that mean nothing else, as Ollama's does, is context exhausted too, never a
  retried server error; llama.cpp's 500 "Context size has been exceeded." is not one
  of them: its slots' shared context was full of other requests, a server error). A
  body that says the quota or credit is gone (``insufficient_quota``,
  ``billing_error``) is quota exhausted, also on a 429. An error that arrives
  *inside* a 200 stream is mapped to the status it stands for, then classified by
  the same table, so streaming and non-streaming calls classify identically (an
  Anthropic stream's error is the ``event: error`` line, whatever its data's
  ``type``).
- Error messages pass through ``redact`` before they leave a provider: API keys never
  reach an error, an event log or a log line.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

import attrs

from fanfold.providers.base import ProviderError
from fanfold.providers.settings import _KEY_LIKE, RequestSettings
from fanfold.providers.settings import REDACTED as REDACTED
from fanfold.providers.settings import Secret as Secret
from fanfold.providers.settings import looks_like_key as looks_like_key
from fanfold.statemachine import (
    STOP_MAX_TOKENS,
    ErrorKind,
    ModelError,
    ModelReply,
    Usage,
    canonical_json,
)
from fanfold.statemachine.messages import ToolCall, non_finite_path

# ------------------------------------------------------------------ secrets


# ``Secret``, ``REDACTED`` and the key shapes (``looks_like_key``) are defined in
# providers.settings (no HTTP stack, no reducer) and re-exported here: the configuration's
# parser needs them, and ``fanfold show`` reads a configuration for its prices without
# importing this module (issue 36).


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with each of ``secrets`` (and anything shaped like an API key) masked."""
    for secret in secrets:
        if len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return _KEY_LIKE.sub(REDACTED, text)


def redact_error(error: ModelError, secrets: Iterable[str] = ()) -> ModelError:
    """``error`` with its message redacted."""
    return attrs.evolve(error, message=redact(error.message, secrets))


def fail(kind: ErrorKind, message: str, retry_after: float | None = None) -> ProviderError:
    """A ``ProviderError`` of ``kind``, ready to raise."""
    return ProviderError(ModelError(kind, message, retry_after))


def malformed(message: str) -> ProviderError:
    """A ``ProviderError`` for a response fanfold cannot read (retryable)."""
    return fail(ErrorKind.MALFORMED_RESPONSE, message)


def snippet(text: str, limit: int = 300) -> str:
    """``text`` on one line, cut to ``limit`` characters, for error messages."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------ SSE


@attrs.frozen
class SSEEvent:
    """One server-sent event: its ``event`` type ("message" unless named) and ``data``."""

    event: str
    data: str
    id: str | None = None


_EOL = re.compile(rb"\r\n|\r|\n")


class SSEDecoder:
    """Incremental ``text/event-stream`` decoder (the WHATWG rules).

    Feed raw bytes as they arrive; get back the complete events. Lines end at CR, LF or
    CRLF only (not at the other characters ``str.splitlines`` knows, which may sit
    unescaped inside JSON), so decoding works on bytes. ``finish()`` dispatches an
    event still pending when the stream ends without its blank line.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self._started = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode ``chunk``; return the events it completed."""
        self._buffer += chunk
        events: list[SSEEvent] = []
        if b"\r" not in self._buffer:
            # Lines end at LF only (what servers send): one split, no regex per line.
            lines = self._buffer.split(b"\n")
            self._buffer = lines.pop()
            for line in lines:
                if self._started:
                    # The lines a stream is made of, without a call each: ``data: ``
                    # (the prefix is ASCII: decoding the rest alone is the same) and
                    # the blank line that ends an event.
                    if line[:6] == b"data: ":
                        self._data.append(line[6:].decode("utf-8", errors="replace"))
                        continue
                    if not line:
                        if self._data:
                            events.append(
                                SSEEvent(self._event or "message", "\n".join(self._data), self._id)
                            )
                            self._data = []
                        self._event = ""
                        continue
                event = self._line(line)
                if event is not None:
                    events.append(event)
            return events
        start = 0
        while True:
            match = _EOL.search(self._buffer, start)
            if match is None:
                break
            if match.group() == b"\r" and match.end() == len(self._buffer):
                break  # might be the first half of CRLF; wait for more
            event = self._line(self._buffer[start : match.start()])
            if event is not None:
                events.append(event)
            start = match.end()
        self._buffer = self._buffer[start:]
        return events

    def finish(self) -> list[SSEEvent]:
        """End of stream: flush a last unterminated line and a pending event."""
        events: list[SSEEvent] = []
        rest, self._buffer = self._buffer, b""
        for line in _EOL.split(rest):
            if line:
                event = self._line(line)
                if event is not None:
                    events.append(event)
        event = self._dispatch()
        if event is not None:
            events.append(event)
        return events

    def _line(self, raw: bytes) -> SSEEvent | None:
        line = raw.decode("utf-8", errors="replace")
        if not self._started:
            self._started = True
            line = line.removeprefix("\ufeff")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id" and "\0" not in value:
            self._id = value
        return None

    def _dispatch(self) -> SSEEvent | None:
        if not self._data:
            self._event = ""
            return None
        event = SSEEvent(self._event or "message", "\n".join(self._data), self._id)
        self._event = ""
        self._data = []
        return event


def decode_sse(body: bytes | str) -> list[SSEEvent]:
    """All events of a complete SSE body (a recorded stream, for instance)."""
    decoder = SSEDecoder()
    data = body.encode() if isinstance(body, str) else body
    return [*decoder.feed(data), *decoder.finish()]


# ``json.loads`` of a str without its own call (what it calls: the default decoder's
# ``decode``; a BOM fails there as "Expecting value" instead, a ValueError all the same).
_decode_json = json.JSONDecoder().decode


class StreamAssembler(Protocol):
    """Builds one reply from a stream's events (sans-IO; raises ProviderError)."""

    @property
    def done(self) -> bool:
        """True once the stream's terminal event arrived."""

    @property
    def output_chars(self) -> int:
        """Characters of text and tool arguments received so far."""

    @property
    def output_tokens(self) -> int | None:
        """Output tokens as last reported by the server, if it reported any."""

    @property
    def usage(self) -> Usage:
        """The usage the server reported so far: billed even if the stream then fails."""

    def feed(self, event: SSEEvent) -> None:
        """Take one event; raise ProviderError for an error event or bad data."""

    def finish(self) -> ModelReply:
        """The reply; MALFORMED_RESPONSE if the stream ended before its terminal event."""


class AssemblerProgress:
    """The part of a ``StreamAssembler`` the HTTP loop reads after every event, which
    the providers' assemblers share: plain attributes, not properties (issue 36)."""

    def __init__(self) -> None:
        self.done = False
        """True once the stream's terminal event arrived."""
        self.output_chars = 0
        """Characters of text and tool arguments so far."""
        self.output_tokens: int | None = None
        """Output tokens, once the server reported them."""


def assemble(assembler: StreamAssembler, body: bytes | str) -> ModelReply:
    """The reply of a complete recorded stream ``body``, built by ``assembler``."""
    for event in decode_sse(body):
        assembler.feed(event)
    return assembler.finish()


def load_event_json(event: SSEEvent, what: str) -> dict[str, Any]:
    """The JSON object in ``event.data``; MALFORMED_RESPONSE if it is not one."""
    try:
        value = _decode_json(event.data)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        raise malformed(f"{what}: invalid JSON in stream event: {snippet(event.data)}") from None
    if type(value) is not dict:
        raise malformed(f"{what}: stream event is not a JSON object: {snippet(event.data)}")
    return value


# ------------------------------------------------------------------ tool arguments


def tool_arguments(raw: str | None, what: str) -> str:
    """Check the argument text of a tool call; return it as canonical JSON.

    Empty text means no arguments (``{}``). Anything else must be a JSON object; an
    invalid or cut-off text raises MALFORMED_RESPONSE.
    """
    return _checked_arguments(raw, what)[0]


def _checked_arguments(raw: str | None, what: str) -> tuple[str, dict[str, Any]]:
    """``tool_arguments``, with the parsed object."""
    if raw is None or not raw.strip():
        return "{}", {}
    try:
        value = json.loads(raw)
        if not isinstance(value, dict):
            raise malformed(f"{what}: tool arguments are not a JSON object: {snippet(raw)}")
        # Writing it back recurses too: JSON that parsed near the recursion limit
        # may not be written (issue 22.5).
        return canonical_json(value), value
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        raise malformed(f"{what}: tool arguments are not valid JSON: {snippet(raw)}") from None


def tool_call(id: str, name: str, raw: str | None, what: str, *, cut_off: bool) -> ToolCall:
    """The ToolCall of a reply: its argument text checked as ``tool_arguments_or_cut_off``
    does, and the arguments parsed here kept on the call (decoded once, where the
    model's reply enters: ``ToolCall.parsed``)."""
    try:
        text, value = _checked_arguments(raw, what)
    except ProviderError:
        if cut_off:
            raise cut_off_tool_call(what, name) from None
        raise
    return ToolCall.parsed(id, name, text, value)


TRUNCATED_ADVICE = (
    "the same request would be cut off again: raise max_tokens in the model profile "
    "(fanfold.toml), or ask the model for smaller outputs"
)


def cut_off_tool_call(what: str, name: str) -> ProviderError:
    """The reply stopped at the output token limit inside tool ``name``'s arguments:
    OUTPUT_TRUNCATED (fatal: retrying sends the same request), not a malformed reply."""
    return fail(
        ErrorKind.OUTPUT_TRUNCATED,
        f"{what}: the reply was cut off at the output token limit inside the arguments "
        f"of tool {name!r}; {TRUNCATED_ADVICE}",
    )


# Stop reasons that say the output was cut before the model ended it.
_CUT_STOP_REASONS = frozenset({STOP_MAX_TOKENS, "model_context_window_exceeded"})


def refuse_cut_tool_calls(reply: ModelReply, what: str) -> ModelReply:
    """``reply``, unless it stopped at the output token limit (stop reason
    ``max_tokens``, OpenAI's ``length``) with tool calls: then OUTPUT_TRUNCATED.

    The last call of such a reply was being written when the limit struck: its
    arguments may parse and still be cut (llama-server sent a ``tool_use`` with
    ``input: {}`` and ``stop_reason: max_tokens``), so no call of it runs, whether its
    arguments parsed or not, streamed or not (issue 33, item 11). Anthropic's
    ``model_context_window_exceeded`` (the reply was cut where the context window
    ended) is such a cut too."""
    if reply.stop_reason not in _CUT_STOP_REASONS or not reply.tool_calls:
        return reply
    name = reply.tool_calls[-1].name
    raise fail(
        ErrorKind.OUTPUT_TRUNCATED,
        f"{what}: the reply was cut off at the output token limit while it called tool "
        f"{name!r} (its arguments may be incomplete, so no call of it is run); "
        f"{TRUNCATED_ADVICE}",
    )


def tool_arguments_or_cut_off(raw: str | None, what: str, name: str, cut_off: bool) -> str:
    """``tool_arguments``; when the reply stopped at the token limit (``cut_off``),
    arguments that do not parse are reported as ``cut_off_tool_call``."""
    try:
        return tool_arguments(raw, what)
    except ProviderError:
        if cut_off:
            raise cut_off_tool_call(what, name) from None
        raise


def finite_json(value: Any) -> Any:
    """``value`` (parsed JSON) with every NaN or infinity replaced by its name as a
    string (``"NaN"``, ``"Infinity"``, ``"-Infinity"``), so that it encodes as JSON.

    Arguments holding such numbers are refused by the reducer, but stay in the history
    a provider sends back to the model; the same ``value`` when there are none.
    """
    if non_finite_path(value) is None:
        return value
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: finite_json(inner) for key, inner in value.items()}
    if isinstance(value, list):
        return [finite_json(inner) for inner in value]
    return value


def billed(error: ModelError, usage: Usage) -> ModelError:
    """``error`` carrying the usage the server reported before it failed (a stream
    broken after its usage chunk, a whole reply that could not be used): the tokens
    were billed, so they count. An error that states its own usage keeps it."""
    if usage.total and not error.usage.total:
        return attrs.evolve(error, usage=usage)
    return error


def parse_billed(
    data: Any,
    what: str,
    parse: Callable[[dict[str, Any], str], ModelReply],
    usage_of: Callable[[Mapping[str, Any]], Usage],
) -> ModelReply:
    """A whole (non-streaming) reply ``data`` parsed by ``parse(data, what)`` once it
    is a JSON object (else MALFORMED_RESPONSE). A reply that cannot be used (cut off inside a
    tool call, malformed, an error) still says what it cost: the ProviderError
    carries the ``usage`` the server reported (``usage_of`` reads it)."""
    try:
        if not isinstance(data, dict):
            raise malformed(f"{what}: not a JSON object")
        return parse(data, what)
    except ProviderError as exc:
        usage = data.get("usage") if isinstance(data, dict) else None
        spent = usage_of(usage) if isinstance(usage, dict) else Usage()
        raise ProviderError(billed(exc.error, spent)) from None


def add_sampling(
    body: dict[str, Any], temperature: float | None, settings: RequestSettings, stop_field: str
) -> None:
    """Put the sampling parameters both APIs take into a request ``body``:
    ``temperature``, the stop sequences (as ``stop_field``) and ``top_p``, each only
    when set."""
    if temperature is not None:
        body["temperature"] = temperature
    if settings.stop:
        body[stop_field] = list(settings.stop)
    if settings.top_p is not None:
        body["top_p"] = settings.top_p


def as_int(value: Any) -> int:
    """A token count from a response; anything not a non-negative int counts as 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


# ------------------------------------------------------------------ retry hints

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def _duration(text: str) -> float | None:
    """OpenAI's reset durations: "1s", "6m0s", "120ms", "1h2m3.5s"."""
    text = text.strip()
    if not text:
        return None
    total = 0.0
    pos = 0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            return None
        value, unit = float(match.group(1)), match.group(2)
        total += value * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[unit]
        pos = match.end()
    return total if pos == len(text) else None


def _timestamp(text: str) -> float | None:
    """An RFC 3339 timestamp ("2026-02-25T20:02:37Z") as epoch seconds."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _seconds_or_date(text: str, now: float) -> float | None:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp() - now


def retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """The server's retry delay hint in seconds, or None if it gave none.

    In order: ``retry-after-ms``; ``retry-after`` (seconds or an HTTP date); else the
    latest reset of an exhausted limit among OpenAI's ``x-ratelimit-reset-*``
    (durations) and Anthropic's ``anthropic-ratelimit-*-reset`` (timestamps), counting
    only limits whose ``remaining`` header says 0. ``now`` is the wall clock (epoch
    seconds), used for dates. Never negative.
    """
    lower = {key.lower(): value for key, value in headers.items()}
    delay: float | None = None
    if "retry-after-ms" in lower:
        try:
            delay = float(lower["retry-after-ms"]) / 1000.0
        except ValueError:
            delay = None
    if delay is None and "retry-after" in lower:
        delay = _seconds_or_date(lower["retry-after"], now)
    if delay is None:
        resets: list[float] = []
        for key, value in lower.items():
            if key.startswith("x-ratelimit-reset-"):
                limit = key.removeprefix("x-ratelimit-reset-")
                if lower.get(f"x-ratelimit-remaining-{limit}", "").strip() == "0":
                    seconds = _duration(value)
                    if seconds is not None:
                        resets.append(seconds)
            elif key.startswith("anthropic-ratelimit-") and key.endswith("-reset"):
                limit = key.removeprefix("anthropic-ratelimit-").removesuffix("-reset")
                if lower.get(f"anthropic-ratelimit-{limit}-remaining", "").strip() == "0":
                    moment = _timestamp(value)
                    if moment is not None:
                        resets.append(moment - now)
        delay = max(resets) if resets else None
    if delay is None or delay != delay:  # NaN
        return None
    return max(0.0, delay)


# ------------------------------------------------------------------ classification

# Phrases that can only mean "the prompt does not fit the context window". They win
# over any status, 5xx included: Ollama's runner may answer an overflow with a 500;
# retrying the same prompt can never succeed.
_OVERFLOW_PATTERNS = (
    "context_length_exceeded",  # OpenAI code
    "maximum context length",  # OpenAI, vLLM ("This model's maximum context length is")
    "context length is only",  # vLLM
    # vLLM: "The decoder prompt (length N) is longer than the maximum model length of
    # M" (V1 engine), "Prompt length of N is longer than the maximum model length"
    "longer than the maximum model length",
    "context length exceeded",
    "exceeds the context length",  # Ollama ("the input length exceeds the context length")
    "exceeded max context length",  # Ollama ("prompt too long; exceeded max context ...")
    "prompt too long",  # Ollama
    "exceed_context_size",  # llama.cpp type
    "exceeds the available context size",  # llama.cpp
    "prompt is too long",  # Anthropic
)
# llama.cpp's 500 (as the status and inside a 200 stream) when decoding finds no room
# in the KV cache. Its slots share one context (``kv_unified``), and a request that
# alone does not fit is refused first with the 400 ``exceed_context_size_error``: so
# this one means the other requests in flight filled the context, and the same
# request succeeds sent again when they are done (issue 33, item 13). A server error
# then, retried with back-off (each conversation's jitter its own); on a 4xx it is
# still an overflow.
_SHARED_CONTEXT_FULL = "context size has been exceeded"
SHARED_CONTEXT_ADVICE = (
    "llama-server: the context its parallel slots share was full of other requests in "
    "flight, sent again it may fit; -c and -np bound a fan-out, see the llama.cpp "
    "recipe of the configuration guide (docs/how-to/configuration.md)"
)
# Looser phrases, trusted only on a 4xx (a client error that names the context).
_CONTEXT_PATTERNS = (
    *_OVERFLOW_PATTERNS,
    _SHARED_CONTEXT_FULL,
    "context window",
    "context limit",  # Anthropic: "... exceed context limit"
    "input is too long",
    "too many tokens",
    "request_too_large",
)


def is_context_error(*texts: str | None, strict: bool = False) -> bool:
    """True if an error's message/type/code says the context window is exceeded.

    ``strict`` accepts only the phrases that cannot mean anything else (for a 5xx).
    """
    joined = " ".join(text.lower() for text in texts if text)
    patterns = _OVERFLOW_PATTERNS if strict else _CONTEXT_PATTERNS
    return any(pattern in joined for pattern in patterns)


@attrs.frozen
class ErrorBody:
    """What an error body says, whichever API shaped it (all fields optional)."""

    message: str | None = None
    type: str | None = None
    code: str | None = None
    status: int | None = None

    def describe(self) -> str:
        """A one-line description for an error message."""
        label = self.type or self.code
        text = self.message or ""
        if label and label not in text:
            text = f"{label}: {text}" if text else label
        return snippet(text)


def parse_error_body(body: Any) -> ErrorBody:
    """Read an error payload: OpenAI's ``{"error": {...}}``, Anthropic's
    ``{"type": "error", "error": {...}}``, llama.cpp's numeric ``code``, vLLM's
    top-level ``message``/``type``, FastAPI's ``detail``, or plain text."""
    try:
        return _parse_error_body(body)
    except RecursionError:
        # A body nested too deeply to read (or to write back as its message): its
        # beginning, as text, is all it says (issue 22.5).
        if isinstance(body, bytes):
            body = body.decode("utf-8", errors="replace")
        return ErrorBody(message=snippet(body) if isinstance(body, str) else None)


def _parse_error_body(body: Any) -> ErrorBody:
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return ErrorBody(message=snippet(body) or None)
    if not isinstance(body, dict):
        return ErrorBody(message=snippet(json.dumps(body)))
    inner = body.get("error")
    if isinstance(inner, str):
        return ErrorBody(message=inner, type=_str(body.get("type")))
    source: dict[str, Any] = inner if isinstance(inner, dict) else body
    message = source.get("message") or source.get("detail")
    if not isinstance(message, str):
        message = json.dumps(message) if message is not None else None
    prompt, window = source.get("n_prompt_tokens"), source.get("n_ctx")
    if as_int(prompt) and as_int(window) and message is not None:
        # llama.cpp's overflow: say by how much, its message may not.
        message += f" (prompt: {prompt} tokens, context size: {window})"
    code = source.get("code")
    status = code if isinstance(code, int) and not isinstance(code, bool) else None
    details = source.get("details")
    if code is None and isinstance(details, dict):
        code = details.get("error_code")
    return ErrorBody(
        message=message,
        type=_str(source.get("type")),
        code=_str(code) if status is None else None,
        status=status,
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


_TYPE_STATUS = {
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "requests": 429,
    "tokens": 429,
    "overloaded_error": 529,
    "api_error": 500,
    "server_error": 500,
    "internal_error": 500,
    "service_unavailable": 503,
    "timeout_error": 408,
    "authentication_error": 401,
    "invalid_api_key": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "invalid_request_error": 400,
    "request_too_large": 413,
    "billing_error": 402,
    "insufficient_quota": 402,
    "exceed_context_size_error": 400,
}


_QUOTA_LABELS = frozenset({"insufficient_quota", "billing_error"})


def status_for(error: ErrorBody) -> int:
    """The HTTP status an in-stream error stands for (500 when it cannot tell)."""
    if error.status is not None and 400 <= error.status <= 599:
        return error.status
    for label in (error.type, error.code):
        if label and label in _TYPE_STATUS:
            return _TYPE_STATUS[label]
    if is_context_error(error.message, error.type, error.code):
        return 400
    return 500


def kind_for_status(status: int, error: ErrorBody) -> ErrorKind:
    """The table: which ErrorKind an HTTP status (with its error body) means."""
    if status == 402 or _QUOTA_LABELS.intersection((error.type, error.code)):
        # A 429 that says the quota is gone is not a rate limit: no retry brings
        # credit back.
        return ErrorKind.QUOTA_EXHAUSTED
    if status == 429:
        return ErrorKind.RATE_LIMIT
    if status == 408:
        return ErrorKind.TIMEOUT
    if status in (401, 403):
        return ErrorKind.AUTH
    if status == 413:
        return ErrorKind.CONTEXT_EXHAUSTED
    if 500 <= status <= 599:
        if is_context_error(error.message, error.type, error.code, strict=True):
            return ErrorKind.CONTEXT_EXHAUSTED
        return ErrorKind.SERVER_ERROR
    if 400 <= status <= 499:
        if is_context_error(error.message, error.type, error.code):
            return ErrorKind.CONTEXT_EXHAUSTED
        return ErrorKind.INVALID_REQUEST
    if 300 <= status <= 399:
        return ErrorKind.INVALID_REQUEST  # a redirect: the base_url is wrong
    return ErrorKind.MALFORMED_RESPONSE


def classify_http_error(
    api: str,
    status: int,
    body: bytes | str,
    headers: Mapping[str, str],
    now: float,
) -> ModelError:
    """Classify a non-2xx HTTP response of ``api`` ("openai" or "anthropic")."""
    error = parse_error_body(body)
    kind = kind_for_status(status, error)
    message = f"{api} HTTP {status}"
    described = error.describe()
    if described:
        message += f": {described}"
    if 300 <= status <= 399:
        location = headers.get("location") or headers.get("Location") or "?"
        message += f" (redirect to {snippet(location, 120)}; check base_url)"
    hint = retry_after(headers, now) if kind.retryable else None
    return ModelError(kind, _advised(message, kind, error), hint)


def _advised(message: str, kind: ErrorKind, error: ErrorBody) -> str:
    """``message``, and for llama.cpp's shared context found full (a server error)
    what it means and what bounds it."""
    if kind is ErrorKind.SERVER_ERROR and _SHARED_CONTEXT_FULL in (error.message or "").lower():
        return f"{message} ({SHARED_CONTEXT_ADVICE})"
    return message


def classify_stream_error(api: str, payload: Any) -> ModelError:
    """Classify an error event inside a 200 stream, as its HTTP status would be."""
    error = parse_error_body(payload)
    status = status_for(error)
    kind = kind_for_status(status, error)
    message = f"{api} stream error: {error.describe() or 'no details'}"
    return ModelError(kind, _advised(message, kind, error))


PROVIDER_TOP_LEVEL_REFUSED = ("oneOf", "anyOf", "allOf", "enum", "const", "not")
"""Keywords both providers refuse at the top of a tool's schema (OpenAI: "schema must
have type 'object' and not have 'oneOf'/'anyOf'/'allOf'/'enum'/'not' at the top level";
Anthropic: "input_schema does not support oneOf, allOf, or anyOf at the top level")."""


def provider_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` as a provider takes it: unchanged unless it has what a provider's API
    refuses. Two narrowings, each on a copy (the schema as given stays what calls are
    checked against and what the log records):

    - its top level has a keyword both OpenAI's and Anthropic's APIs refuse there
      (``PROVIDER_TOP_LEVEL_REFUSED``: a server's "one of these arguments" rule, say):
      a copy without them, with the properties its ``anyOf``/``oneOf``/``allOf``
      branches describe merged into its own (so the model still sees every argument)
      and ``type: object``;
    - a ``pattern`` anywhere in it that does not start with ``^`` and end with ``$``,
      which llama.cpp's server (the OpenAI and the Anthropic endpoint alike) refuses
      with the whole request ("JSON schema conversion failed: Pattern must start with
      '^' and end with '$'"): the copy says it in the value's ``description`` instead
      (see ``unanchored_patterns_described``).

    fanfold still validates calls against the whole schema: a call breaking a dropped
    rule gets an error result saying so."""
    schema = unanchored_patterns_described(schema)
    if schema.get("type") == "object" and not any(k in schema for k in PROVIDER_TOP_LEVEL_REFUSED):
        return schema
    out = {k: v for k, v in schema.items() if k not in PROVIDER_TOP_LEVEL_REFUSED}
    out["type"] = "object"
    properties = dict(out.get("properties", {})) if isinstance(out.get("properties"), dict) else {}
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        for branch in branches if isinstance(branches, list) else ():
            if isinstance(branch, dict) and isinstance(branch.get("properties"), dict):
                for name, sub in branch["properties"].items():
                    properties.setdefault(name, sub)
    if properties or "properties" in out:
        out["properties"] = properties
    return out


# The keywords whose value is a schema, a list of schemas, or a name -> schema map
# (draft 2020-12 and draft-07): where ``unanchored_patterns_described`` looks for
# ``pattern``. A property *named* "pattern" is a key of ``properties``, never read as
# the keyword.
_SUBSCHEMA = (
    "additionalProperties",
    "items",
    "additionalItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def anchored(pattern: str) -> bool:
    """Whether ``pattern`` starts with ``^`` and ends with ``$``: the only patterns
    llama.cpp's JSON-Schema-to-grammar conversion takes."""
    return len(pattern) >= 2 and pattern.startswith("^") and pattern.endswith("$")


def unanchored_patterns_described(schema: Any) -> Any:
    """``schema`` with every ``pattern`` llama.cpp's server refuses (one not starting
    with ``^`` and ending with ``$``) moved into its schema's ``description``
    ("... (matches the regular expression X)"), so every server takes the request and
    the model still reads the rule. The same object when it has none (the common case:
    nothing is copied); otherwise a copy, ``schema`` untouched. An anchored pattern is
    left as given. (JSON Schema's ``pattern`` is a search, not a full match: anchoring
    it would change its meaning, so it is described, not rewritten.)"""
    if isinstance(schema, list):
        items = [unanchored_patterns_described(s) for s in schema]
        return schema if all(a is b for a, b in zip(items, schema, strict=True)) else items
    if not isinstance(schema, dict):
        return schema
    changed: dict[str, Any] = {}
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and not anchored(pattern):
        said = f"matches the regular expression {pattern}"
        text = schema.get("description")
        changed["description"] = (
            f"{text} ({said})" if isinstance(text, str) and text else said[0].upper() + said[1:]
        )
    for key in (*_SUBSCHEMA, *_SUBSCHEMA_LISTS):
        if key in schema and key not in changed:
            sub = unanchored_patterns_described(schema[key])
            if sub is not schema[key]:
                changed[key] = sub
    for key in _SUBSCHEMA_MAPS:
        value = schema.get(key)
        if isinstance(value, dict):
            mapped = {name: unanchored_patterns_described(sub) for name, sub in value.items()}
            if any(mapped[name] is not value[name] for name in value):
                changed[key] = mapped
    if not changed:
        return schema
    out = {k: v for k, v in schema.items() if not (k == "pattern" and "description" in changed)}
    out.update(changed)
    return out


class IdentityMemo:
    """Values remembered by the identity of a tuple (and a small hashable ``extra``):
    the same tool-set tuple, offered by every call of one conversation, is then found
    without hashing and comparing its specs again (attrs' generated ``__hash__`` and
    ``__eq__`` per spec per call; issue 36). Holds the tuples it remembers (at most
    ``size``, the oldest forgotten first), so an id is never reused while remembered."""

    __slots__ = ("_entries", "_size")

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._entries: dict[int, tuple[tuple[Any, ...], Any, Any]] = {}

    def get(self, key: object, extra: Any) -> Any:
        """The value remembered for this very tuple and ``extra``, or None."""
        entry = self._entries.get(id(key))
        if entry is not None and entry[0] is key and entry[1] == extra:
            return entry[2]
        return None

    def made(self, key: object, extra: Any, make: Callable[[], Any]) -> Any:
        """The value remembered for ``key`` and ``extra``, else ``make()``'s, remembered."""
        found = self.get(key, extra)
        if found is None:
            found = make()
            self.put(key, extra, found)
        return found

    def put(self, key: object, extra: Any, value: Any) -> None:
        """Remember ``value`` (only for a tuple: a list could change meanwhile)."""
        if type(key) is not tuple:
            return
        entries = self._entries
        if len(entries) >= self._size:
            del entries[next(iter(entries))]
        entries[id(key)] = (key, extra, value)
