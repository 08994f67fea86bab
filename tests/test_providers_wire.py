"""Sans-IO provider pieces: SSE decoding, retry hints, error classification, redaction."""

from __future__ import annotations

import email.utils
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fanfold.providers.base import ProviderError
from fanfold.providers.wire import (
    REDACTED,
    Secret,
    SSEDecoder,
    SSEEvent,
    classify_http_error,
    classify_stream_error,
    decode_sse,
    is_context_error,
    parse_error_body,
    redact,
    retry_after,
    status_for,
    tool_arguments,
)
from fanfold.statemachine import ErrorKind

NOW = 1_800_000_000.0

# ------------------------------------------------------------------ SSE


def test_sse_basic_events_with_types_comments_and_multiline_data() -> None:
    body = (
        b": a comment\n"
        b"event: message_start\n"
        b'data: {"a": 1}\n'
        b"\n"
        b"data: line one\n"
        b"data:line two\n"
        b"id: 7\n"
        b"\n"
        b"event: ignored-without-data\n"
        b"\n"
        b"data\n"
        b"\n"
    )
    assert decode_sse(body) == [
        SSEEvent("message_start", '{"a": 1}'),
        SSEEvent("message", "line one\nline two", "7"),
        SSEEvent("message", "", "7"),
    ]


def test_sse_crlf_cr_and_bom() -> None:
    body = b"\xef\xbb\xbfdata: a\r\n\r\ndata: b\r\rdata: c\n\n"
    assert [e.data for e in decode_sse(body)] == ["a", "b", "c"]


def test_sse_unicode_line_separators_stay_inside_data() -> None:
    # U+2028 may appear unescaped in JSON; str.splitlines would cut the line there.
    text = 'data: {"t": "a\u2028b\u0085c"}\n\n'
    assert decode_sse(text.encode()) == [SSEEvent("message", '{"t": "a\u2028b\u0085c"}')]


def test_sse_last_event_without_blank_line_is_flushed() -> None:
    assert decode_sse(b"data: x\n\ndata: last") == [
        SSEEvent("message", "x"),
        SSEEvent("message", "last"),
    ]


@given(st.data())
def test_sse_any_chunking_gives_the_same_events(data: st.DataObject) -> None:
    body = (
        'event: a\r\ndata: {"x": "\u00e9\u2028"}\r\n\r\n'
        ": c\ndata: 1\ndata: 2\n\ndata: \u4e2d\u6587\r\r"
    ).encode()
    cuts = sorted(data.draw(st.sets(st.integers(1, len(body) - 1), max_size=12)))
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for start, end in zip([0, *cuts], [*cuts, len(body)], strict=True):
        events += decoder.feed(body[start:end])
    events += decoder.finish()
    assert events == decode_sse(body)
    assert [e.data for e in events] == ['{"x": "\u00e9\u2028"}', "1\n2", "\u4e2d\u6587"]


# ------------------------------------------------------------------ retry hints


def test_retry_after_seconds_and_ms() -> None:
    assert retry_after({"Retry-After": "7"}, NOW) == 7.0
    assert retry_after({"retry-after": "1.5"}, NOW) == 1.5
    assert retry_after({"retry-after-ms": "250", "retry-after": "9"}, NOW) == 0.25


def test_retry_after_http_date() -> None:
    date = email.utils.formatdate(NOW + 30, usegmt=True)
    assert retry_after({"Retry-After": date}, NOW) == pytest.approx(30.0)
    past = email.utils.formatdate(NOW - 30, usegmt=True)
    assert retry_after({"Retry-After": past}, NOW) == 0.0


def test_retry_after_openai_reset_headers_count_only_exhausted_limits() -> None:
    headers = {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1m2.5s",
        "x-ratelimit-remaining-tokens": "900",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    assert retry_after(headers, NOW) == 62.5
    headers["x-ratelimit-remaining-tokens"] = "0"
    assert retry_after(headers, NOW) == 360.0
    assert (
        retry_after(
            {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "120ms"}, NOW
        )
        == 0.12
    )


def test_retry_after_anthropic_reset_headers() -> None:
    headers = {
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2027-01-15T08:00:12Z",
        "anthropic-ratelimit-tokens-remaining": "5000",
        "anthropic-ratelimit-tokens-reset": "2027-01-15T08:05:00Z",
    }
    from datetime import UTC, datetime

    now = datetime(2027, 1, 15, 8, 0, 0, tzinfo=UTC).timestamp()
    assert retry_after(headers, now) == 12.0


def test_retry_after_absent_or_garbage() -> None:
    assert retry_after({}, NOW) is None
    assert retry_after({"retry-after": "soon"}, NOW) is None
    assert retry_after({"retry-after": "-5"}, NOW) == 0.0
    assert retry_after({"retry-after": "nan"}, NOW) is None


# ------------------------------------------------------------------ classification

OPENAI_CONTEXT = {
    "error": {
        "message": "This model's maximum context length is 128000 tokens. However, your "
        "messages resulted in 130000 tokens.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
ANTHROPIC_CONTEXT = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 208000 tokens > 200000 maximum",
    },
}
LLAMA_CPP_CONTEXT = {
    "error": {
        "code": 400,
        "message": "request (4476 tokens) exceeds the available context size (4096 tokens)",
        "type": "exceed_context_size_error",
    }
}


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (429, ErrorKind.RATE_LIMIT),
        (500, ErrorKind.SERVER_ERROR),
        (502, ErrorKind.SERVER_ERROR),
        (503, ErrorKind.SERVER_ERROR),
        (504, ErrorKind.SERVER_ERROR),
        (529, ErrorKind.SERVER_ERROR),
        (599, ErrorKind.SERVER_ERROR),
        (401, ErrorKind.AUTH),
        (403, ErrorKind.AUTH),
        (400, ErrorKind.INVALID_REQUEST),
        (404, ErrorKind.INVALID_REQUEST),
        (422, ErrorKind.INVALID_REQUEST),
        (409, ErrorKind.INVALID_REQUEST),
        (408, ErrorKind.TIMEOUT),
        (413, ErrorKind.CONTEXT_EXHAUSTED),
        (301, ErrorKind.INVALID_REQUEST),
        (402, ErrorKind.QUOTA_EXHAUSTED),
    ],
)
def test_status_table(status: int, kind: ErrorKind) -> None:
    error = classify_http_error("openai", status, b'{"error": {"message": "nope"}}', {}, NOW)
    assert error.kind is kind
    assert error.message.startswith(f"openai HTTP {status}: nope")


@pytest.mark.parametrize("body", [OPENAI_CONTEXT, ANTHROPIC_CONTEXT, LLAMA_CPP_CONTEXT])
@pytest.mark.parametrize("status", [400, 404, 422])
def test_context_length_errors(body: object, status: int) -> None:
    import json

    error = classify_http_error("x", status, json.dumps(body), {}, NOW)
    assert error.kind is ErrorKind.CONTEXT_EXHAUSTED


# OpenAI's answer when the account has no credit left: a 429 that no wait will fix.
OPENAI_QUOTA = {
    "error": {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota",
        "param": None,
        "code": "insufficient_quota",
    }
}


def test_insufficient_quota_is_fatal_not_a_rate_limit() -> None:
    import json

    error = classify_http_error("openai", 429, json.dumps(OPENAI_QUOTA), {"retry-after": "1"}, NOW)
    assert error.kind is ErrorKind.QUOTA_EXHAUSTED
    assert not error.kind.retryable
    assert error.retry_after is None
    assert "exceeded your current quota" in error.message
    # The same error arriving inside a stream classifies the same way.
    assert status_for(parse_error_body(json.dumps(OPENAI_QUOTA))) == 402
    plain = classify_http_error(
        "openai", 429, b'{"error": {"code": "rate_limit_exceeded"}}', {}, NOW
    )
    assert plain.kind is ErrorKind.RATE_LIMIT


def test_rate_limit_carries_retry_after_and_fatal_errors_do_not() -> None:
    error = classify_http_error("anthropic", 429, b"{}", {"retry-after": "3"}, NOW)
    assert (error.kind, error.retry_after) == (ErrorKind.RATE_LIMIT, 3.0)
    overloaded = classify_http_error("anthropic", 529, b"{}", {"retry-after": "4"}, NOW)
    assert (overloaded.kind, overloaded.retry_after) == (ErrorKind.SERVER_ERROR, 4.0)
    auth = classify_http_error("anthropic", 401, b"{}", {"retry-after": "3"}, NOW)
    assert (auth.kind, auth.retry_after) == (ErrorKind.AUTH, None)


def test_non_json_error_body_is_quoted_briefly() -> None:
    error = classify_http_error("openai", 502, b"<html>Bad gateway</html>" + b" " * 1000, {}, NOW)
    assert error.kind is ErrorKind.SERVER_ERROR
    assert error.message == "openai HTTP 502: <html>Bad gateway</html>"


def test_redirect_names_location() -> None:
    error = classify_http_error("openai", 308, b"", {"location": "https://x/v1"}, NOW)
    assert "redirect to https://x/v1" in error.message


@pytest.mark.parametrize(
    ("payload", "kind"),
    [
        (
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            ErrorKind.SERVER_ERROR,
        ),
        (
            {"type": "error", "error": {"type": "api_error", "message": "Internal"}},
            ErrorKind.SERVER_ERROR,
        ),
        (
            {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}},
            ErrorKind.RATE_LIMIT,
        ),
        (
            {"type": "error", "error": {"type": "authentication_error", "message": "x"}},
            ErrorKind.AUTH,
        ),
        ({"type": "error", "error": {"type": "permission_error", "message": "x"}}, ErrorKind.AUTH),
        (
            {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}},
            ErrorKind.INVALID_REQUEST,
        ),
        (
            {"type": "error", "error": {"type": "request_too_large", "message": "big"}},
            ErrorKind.CONTEXT_EXHAUSTED,
        ),
        (ANTHROPIC_CONTEXT, ErrorKind.CONTEXT_EXHAUSTED),
        (OPENAI_CONTEXT, ErrorKind.CONTEXT_EXHAUSTED),
        (LLAMA_CPP_CONTEXT, ErrorKind.CONTEXT_EXHAUSTED),
        ({"error": {"message": "boom", "type": "server_error"}}, ErrorKind.SERVER_ERROR),
        (
            {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}},
            ErrorKind.SERVER_ERROR,
        ),
        ({"error": {"message": "?", "type": "mystery"}}, ErrorKind.SERVER_ERROR),
        ({"error": "plain string error"}, ErrorKind.SERVER_ERROR),
    ],
)
def test_in_stream_errors_classify_like_their_status(payload: object, kind: ErrorKind) -> None:
    assert classify_stream_error("api", payload).kind is kind


def test_parse_error_body_shapes() -> None:
    assert parse_error_body(b'{"detail": "Not Found"}').message == "Not Found"
    vllm = parse_error_body(
        b'{"object": "error", "message": "m", "type": "BadRequestError", "code": 400}'
    )
    assert (vllm.message, vllm.type, vllm.status) == ("m", "BadRequestError", 400)
    spend = parse_error_body(
        {
            "type": "error",
            "error": {"type": "rate_limit_error", "message": "m", "details": {"error_code": "x"}},
        }
    )
    assert (spend.type, spend.code) == ("rate_limit_error", "x")
    assert parse_error_body(b"").message is None


def test_is_context_error() -> None:
    assert is_context_error("input length and `max_tokens` exceed context limit: 1 + 2 > 2")
    assert not is_context_error("temperature must be <= 2", "invalid_request_error")


# ------------------------------------------------------------------ tool arguments


def test_tool_arguments_canonical_and_checked() -> None:
    assert tool_arguments('{ "b": 1, "a": "\u00e9" }', "t") == '{"a":"\u00e9","b":1}'
    assert tool_arguments("", "t") == "{}"
    assert tool_arguments(None, "t") == "{}"
    for bad in ('{"a": ', "[1, 2]", "nul"):
        with pytest.raises(ProviderError) as caught:
            tool_arguments(bad, "t")
        assert caught.value.error.kind is ErrorKind.MALFORMED_RESPONSE


# ------------------------------------------------------------------ secrets


def test_secret_never_shows_itself() -> None:
    secret = Secret("sk-live-abcdef0123456789")
    for text in (repr(secret), str(secret), f"{secret}", repr([secret]), repr({"k": secret})):
        assert "abcdef" not in text
    assert secret.reveal() == "sk-live-abcdef0123456789"
    with pytest.raises(TypeError):
        pickle.dumps(secret)


def test_redact_known_secrets_and_key_shaped_strings() -> None:
    text = (
        "key mykey-123456 and sk-ant-api03-AbCdEf0123 and Bearer abcdefghijk and sk-proj-****abcd"
    )
    out = redact(text, ["mykey-123456"])
    assert "mykey-123456" not in out
    assert "sk-ant-api03" not in out
    assert "abcdefghijk" not in out
    assert out.count(REDACTED) == 3
    assert "sk-proj-****abcd" in out  # already masked by the vendor; harmless
