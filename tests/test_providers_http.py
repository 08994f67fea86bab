"""The HTTP providers over real loopback HTTP (tests/fakeserver.py) and MockTransport.

Every fault is checked streaming and non-streaming, for both APIs, and must give the
same ErrorKind either way.
"""

from __future__ import annotations

import email.utils
import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
import trio
from fakeserver import (
    Drop,
    FakeServer,
    Json,
    Raw,
    Reply,
    Sse,
    Stall,
    anthropic_error,
    anthropic_message,
    anthropic_stream,
    openai_completion,
    openai_error,
    openai_stream,
    path_is,
    sse_file,
)

from fanfold.providers.anthropic import AnthropicProvider
from fanfold.providers.base import CallContext, ProviderError, StreamProgress
from fanfold.providers.http import HttpProvider, Timeouts
from fanfold.providers.openai import OpenAIProvider
from fanfold.statemachine import (
    AssistantMessage,
    ErrorKind,
    ModelReply,
    ModelRequest,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
)

FIXTURES = Path(__file__).parent / "fixtures"
KEY = "sk-test-THISisAsecretKEY0123456789"
Api = Literal["openai", "anthropic"]
APIS: list[Api] = ["openai", "anthropic"]

TOOL = ToolSpec.from_schema("get_weather", "Weather", {"type": "object", "properties": {}})
REQUEST = ModelRequest("Be brief.", (UserMessage("Weather in Paris?"),), (TOOL,))
CALL = ToolCall.of("call_Zx9", "get_weather", {"city": "Paris"})


def context(on_progress: Callable[[StreamProgress], None] | None = None) -> CallContext:
    return CallContext("conv-1", "conv-1", "root", 0, None, 1, on_progress=on_progress)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


def make(
    api: Api,
    base: str,
    *,
    stream: bool,
    key: str | None = KEY,
    read: float = 0.3,
    total: float | None = None,
    client: httpx.AsyncClient | None = None,
) -> HttpProvider:
    timeouts = Timeouts(connect=2.0, read=read, total=total)
    if api == "openai":
        return OpenAIProvider(
            base_url=base + "/v1",
            model="m",
            api_key=key,
            stream=stream,
            timeouts=timeouts,
            client=client,
        )
    return AnthropicProvider(
        base_url=base, model="m", api_key=key, stream=stream, timeouts=timeouts, client=client
    )


def ok(
    api: Api, stream: bool, text: str = "", calls: tuple[ToolCall, ...] = (), **kw: Any
) -> Reply:
    if api == "openai":
        return openai_stream(text, calls, **kw) if stream else openai_completion(text, calls)
    return anthropic_stream(text, calls, **kw) if stream else anthropic_message(text, calls)


def error(
    api: Api, status: int, message: str, type: str, headers: dict[str, str] | None = None
) -> Json:
    if api == "openai":
        return openai_error(status, message, type=type, headers=headers)
    return anthropic_error(status, message, type=type, headers=headers)


async def failure(provider: HttpProvider, request: ModelRequest = REQUEST) -> ProviderError:
    async with provider:
        with pytest.raises(ProviderError) as caught:
            await provider.complete(request, context())
    return caught.value


# ------------------------------------------------------------------ success over loopback


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("api", APIS)
async def test_text_and_tool_call_over_loopback(server: FakeServer, api: Api, stream: bool) -> None:
    server.enqueue(ok(api, stream, "Checking.", (CALL,)), ok(api, stream, "18C, sunny."))
    progress: list[StreamProgress] = []
    async with make(api, server.url, stream=stream) as provider:
        first = await provider.complete(REQUEST, context(progress.append))
        assert first == ModelReply("Checking.", (CALL,), Usage(10, 5), "tool_use")
        follow_up = ModelRequest(
            REQUEST.system,
            (
                *REQUEST.messages,
                AssistantMessage(first.text, first.tool_calls),
                ToolResultMessage(ToolResult("call_Zx9", "get_weather", "18C sunny")),
            ),
            REQUEST.tools,
        )
        second = await provider.complete(follow_up, context())
        assert second == ModelReply("18C, sunny.", (), Usage(10, 5), "end_turn")

    assert progress, "progress is reported"
    assert progress[-1].conversation_id == "conv-1"
    assert progress[-1].output_chars == len("Checking.") + len(CALL.arguments_json)
    assert progress[-1].output_tokens == 5
    if stream:
        assert len(progress) > 2  # reported as chunks arrive

    first_req, second_req = server.requests
    body = second_req.json
    if api == "openai":
        assert first_req.path == "/v1/chat/completions"
        assert first_req.headers["authorization"] == f"Bearer {KEY}"
        assert body["messages"][0] == {"role": "system", "content": "Be brief."}
        assert body["messages"][2]["tool_calls"][0]["id"] == "call_Zx9"
        assert body["messages"][3] == {
            "role": "tool",
            "tool_call_id": "call_Zx9",
            "content": "18C sunny",
        }
        assert body.get("stream_options") == ({"include_usage": True} if stream else None)
    else:
        assert first_req.path == "/v1/messages"
        assert first_req.headers["x-api-key"] == KEY
        assert first_req.headers["anthropic-version"] == "2023-06-01"
        # Marked for the prompt cache (the profile's default).
        cached = {"type": "ephemeral"}
        assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": cached}]
        assert body["tools"][-1]["cache_control"] == cached
        assert body["messages"][1]["content"][1]["id"] == "call_Zx9"
        assert body["messages"][2]["content"] == [
            {"type": "tool_result", "tool_use_id": "call_Zx9", "content": "18C sunny"}
        ]
    assert body.get("stream", False) is stream
    assert body["model"] == "m"


@pytest.mark.parametrize(
    ("api", "name"),
    [
        ("openai", "openai/stream-one-tool-call.sse"),
        ("openai", "openai/stream-one-tool-call-2.sse"),
        ("openai", "openai/stream-text.sse"),
        ("openai", "openai/stream-text-length.sse"),
        ("anthropic", "anthropic/basic_response.sse"),
        ("anthropic", "anthropic/tool_use_response.sse"),
    ],
)
async def test_recorded_streams_over_loopback(server: FakeServer, api: Api, name: str) -> None:
    from fanfold.providers.anthropic import parse_anthropic_stream
    from fanfold.providers.openai import parse_openai_stream

    parse = parse_openai_stream if api == "openai" else parse_anthropic_stream
    server.enqueue(sse_file(FIXTURES / name, chunk_size=37))  # odd chunks split lines
    async with make(api, server.url, stream=True) as provider:
        reply = await provider.complete(REQUEST, context())
    assert reply == parse((FIXTURES / name).read_bytes())


async def test_recorded_incomplete_tool_json_over_loopback(server: FakeServer) -> None:
    """Cut off at max_tokens inside a tool call: OUTPUT_TRUNCATED, with the tokens the
    server billed for it."""
    server.enqueue(sse_file(FIXTURES / "anthropic/incomplete_partial_json_response.sse"))
    caught = await failure(make("anthropic", server.url, stream=True))
    assert caught.error.kind is ErrorKind.OUTPUT_TRUNCATED
    assert caught.error.usage == Usage(450, 124)


async def test_request_model_overrides_provider_model(server: FakeServer) -> None:
    server.enqueue(ok("openai", False, "x"))
    async with make("openai", server.url, stream=False) as provider:
        await provider.complete(
            ModelRequest("", (UserMessage("hi"),), (), model="small-1"), context()
        )
    assert server.requests[0].json["model"] == "small-1"


async def test_streaming_request_answered_with_whole_json(server: FakeServer) -> None:
    server.enqueue(openai_completion("not streamed"))
    async with make("openai", server.url, stream=True) as provider:
        reply = await provider.complete(REQUEST, context())
    assert reply.text == "not streamed"


# ------------------------------------------------------------------ faults over loopback


def retry_date(seconds: float) -> str:
    return email.utils.formatdate(time.time() + seconds, usegmt=True)


def _fault_invalid_json(api: Api, stream: bool) -> Reply:
    if stream:
        return Sse(
            'data: {"choices": [{"delta": \n\n'
            if api == "openai"
            else 'event: message_start\ndata: {"type": \n\n'
        )
    return Raw(b'{"choices": [{"message": ', content_type="application/json")


def _fault_invalid_tool_args(api: Api, stream: bool) -> Reply:
    call = ToolCall("call_bad", "get_weather", '{"city": "Par')
    if api == "openai":
        return openai_stream("", (call,)) if stream else openai_completion("", (call,))
    if stream:
        return anthropic_stream("", (call,))
    return Json(
        {"type": "message", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{"}]}
    )


def _fault_cut_cleanly(api: Api, stream: bool) -> Reply:
    full = ok(api, True, "Hello there, this is long enough", (CALL,))
    assert isinstance(full, Sse)
    if stream:
        return Sse(full.body, cut_after=len(full.body) // 2, then="end")
    whole = ok(api, False, "Hello there")
    assert isinstance(whole, Json)
    return Raw(json.dumps(whole.body).encode()[:40], content_type="application/json")


def _fault_drop_mid_body(api: Api, stream: bool) -> Reply:
    full = ok(api, True, "Hello there, this is long enough", (CALL,))
    assert isinstance(full, Sse)
    return Sse(full.body, cut_after=len(full.body) // 2, then="drop")


def _fault_stall(api: Api, stream: bool) -> Reply:
    full = ok(api, True, "Hello there, this is long enough")
    assert isinstance(full, Sse)
    return Sse(full.body, cut_after=len(full.body) // 2, then="stall") if stream else Stall()


FAULTS: list[tuple[str, Callable[[Api, bool], Reply], ErrorKind, float | None]] = [
    (
        "429-retry-after-seconds",
        lambda api, s: error(
            api, 429, "Rate limit reached", "rate_limit_error", {"retry-after": "7"}
        ),
        ErrorKind.RATE_LIMIT,
        7.0,
    ),
    (
        "429-retry-after-date",
        lambda api, s: error(
            api, 429, "slow down", "rate_limit_error", {"retry-after": retry_date(120)}
        ),
        ErrorKind.RATE_LIMIT,
        120.0,
    ),
    (
        "429-retry-after-ms",
        lambda api, s: error(api, 429, "slow down", "rate_limit_error", {"retry-after-ms": "1500"}),
        ErrorKind.RATE_LIMIT,
        1.5,
    ),
    (
        "500",
        lambda api, s: error(api, 500, "Internal error", "api_error"),
        ErrorKind.SERVER_ERROR,
        None,
    ),
    (
        "502-html",
        lambda api, s: Raw(b"<html>bad gateway</html>", 502, "text/html"),
        ErrorKind.SERVER_ERROR,
        None,
    ),
    (
        "503",
        lambda api, s: error(api, 503, "unavailable", "api_error"),
        ErrorKind.SERVER_ERROR,
        None,
    ),
    (
        "529",
        lambda api, s: error(api, 529, "Overloaded", "overloaded_error"),
        ErrorKind.SERVER_ERROR,
        None,
    ),
    (
        "401",
        lambda api, s: error(api, 401, "invalid x-api-key", "authentication_error"),
        ErrorKind.AUTH,
        None,
    ),
    ("403", lambda api, s: error(api, 403, "forbidden", "permission_error"), ErrorKind.AUTH, None),
    (
        "400",
        lambda api, s: error(api, 400, "messages: bad", "invalid_request_error"),
        ErrorKind.INVALID_REQUEST,
        None,
    ),
    (
        "404",
        lambda api, s: error(api, 404, "model not found", "not_found_error"),
        ErrorKind.INVALID_REQUEST,
        None,
    ),
    (
        "400-context",
        lambda api, s: error(
            api,
            400,
            "prompt is too long: 208000 tokens > 200000 maximum"
            if api == "anthropic"
            else "This model's maximum context length is 8192 tokens",
            "invalid_request_error",
        ),
        ErrorKind.CONTEXT_EXHAUSTED,
        None,
    ),
    ("408", lambda api, s: error(api, 408, "timeout", "timeout_error"), ErrorKind.TIMEOUT, None),
    ("invalid-json", _fault_invalid_json, ErrorKind.MALFORMED_RESPONSE, None),
    ("invalid-tool-arguments", _fault_invalid_tool_args, ErrorKind.MALFORMED_RESPONSE, None),
    ("body-cut-cleanly", _fault_cut_cleanly, ErrorKind.MALFORMED_RESPONSE, None),
    ("connection-dropped-mid-body", _fault_drop_mid_body, ErrorKind.NETWORK, None),
    ("connection-dropped-before-reply", lambda api, s: Drop(), ErrorKind.NETWORK, None),
    ("stalled", _fault_stall, ErrorKind.TIMEOUT, None),
]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(("fault", "reply", "kind", "hint"), FAULTS, ids=[f[0] for f in FAULTS])
async def test_faults_are_classified(
    server: FakeServer,
    api: Api,
    stream: bool,
    fault: str,
    reply: Callable[[Api, bool], Reply],
    kind: ErrorKind,
    hint: float | None,
) -> None:
    server.enqueue(reply(api, stream))
    started = time.monotonic()
    caught = await failure(make(api, server.url, stream=stream))
    assert caught.error.kind is kind, caught.error
    if hint is None:
        assert caught.error.retry_after is None
    else:
        assert caught.error.retry_after == pytest.approx(hint, abs=2.0)
    assert KEY not in caught.error.message
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("api", APIS)
async def test_error_event_inside_a_200_stream(server: FakeServer, api: Api) -> None:
    if api == "openai":
        body = 'data: {"error": {"message": "Overloaded", "type": "server_error"}}\n\n'
    else:
        body = (
            'event: message_start\ndata: {"type": "message_start", "message": {"usage": {}}}\n\n'
            'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", '
            '"message": "Overloaded"}}\n\n'
        )
    server.enqueue(Sse(body))
    caught = await failure(make(api, server.url, stream=True))
    assert caught.error.kind is ErrorKind.SERVER_ERROR
    assert "Overloaded" in caught.error.message


async def test_connection_refused_is_network() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    caught = await failure(make("openai", f"http://127.0.0.1:{port}", stream=True))
    assert caught.error.kind is ErrorKind.NETWORK


@pytest.mark.parametrize("api", APIS)
async def test_connection_refused_says_so_with_the_profile_and_the_url(api: Api) -> None:
    """Issue 13, item 9: not "all attempts to connect to 127.0.0.1:18099 failed" but
    that the connection was refused, for which profile and URL; never the key, nor
    a password or query the URL holds."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cls = OpenAIProvider if api == "openai" else AnthropicProvider
    provider = cls(
        base_url=f"http://user:hunter2@127.0.0.1:{port}/v1?key=QUERYKEY",
        model="m",
        api_key=KEY,
        profile="local",
    )
    caught = await failure(provider)
    message = caught.error.message
    assert caught.error.kind is ErrorKind.NETWORK
    assert "connection refused" in message
    assert "profile 'local'" in message
    assert f"http://127.0.0.1:{port}/v1" in message
    for secret in (KEY, "hunter2", "QUERYKEY"):
        assert secret not in message


@pytest.mark.parametrize("api", APIS)
async def test_total_timeout_cuts_a_slow_stream(server: FakeServer, api: Api) -> None:
    server.enqueue(ok(api, True, "a slow but steady stream of text", delay=0.05, piece=2))
    started = time.monotonic()
    caught = await failure(make(api, server.url, stream=True, read=5.0, total=0.3))
    assert caught.error.kind is ErrorKind.TIMEOUT
    assert "0.3s" in caught.error.message
    assert time.monotonic() - started < 1.5


async def test_fault_then_success_sequence(server: FakeServer) -> None:
    """What the runtime sees while retrying: retryable kinds, then the reply."""
    server.enqueue(
        openai_error(429, "slow", type="requests", headers={"retry-after": "1"}),
        openai_error(500, "oops", type="server_error"),
        Sse(openai_stream("partial").body, cut_after=60, then="drop"),
        openai_stream("finally"),
    )
    kinds: list[ErrorKind] = []
    async with make("openai", server.url, stream=True) as provider:
        for _ in range(4):
            try:
                reply = await provider.complete(REQUEST, context())
            except ProviderError as exc:
                assert exc.error.kind.retryable
                kinds.append(exc.error.kind)
    assert kinds == [ErrorKind.RATE_LIMIT, ErrorKind.SERVER_ERROR, ErrorKind.NETWORK]
    assert reply.text == "finally"
    assert len(server.requests) == 4


async def test_unscripted_request_fails_fatally(server: FakeServer) -> None:
    server.when(path_is("/elsewhere"), Json({}))
    caught = await failure(make("openai", server.url, stream=True))
    assert caught.error.kind is ErrorKind.INVALID_REQUEST
    assert "no scripted reply" in caught.error.message
    assert len(server.unmatched) == 1


# ------------------------------------------------------------------ secrets


@pytest.mark.parametrize("api", APIS)
async def test_api_key_never_in_errors_reprs_or_logs(
    server: FakeServer, api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    echo = f"Incorrect API key provided: {KEY}. You can find your API key at ..."
    server.enqueue(
        error(api, 401, echo, "authentication_error"),
        Sse(
            f'data: {{"error": {{"message": "bad key {KEY}", "type": "authentication_error"}}}}\n\n'
        ),
        Json({"unexpected": KEY}),
    )
    provider = make(api, server.url, stream=True)
    async with provider:
        errors = []
        for stream in (True, True, False):
            provider.stream = stream
            with pytest.raises(ProviderError) as caught:
                await provider.complete(REQUEST, context())
            errors.append(caught.value)
    assert errors[0].error.kind is ErrorKind.AUTH
    for exc in errors:
        for text in (exc.error.message, str(exc), repr(exc), repr(exc.error)):
            assert KEY not in text
            assert "THISisAsecret" not in text
        assert exc.__cause__ is None
    assert "[REDACTED]" in errors[0].error.message
    for text in (repr(provider), str(vars(provider))):
        assert KEY not in text
    assert caplog.records, "httpx/httpcore debug logs were captured"
    assert KEY not in caplog.text


def test_api_key_that_cannot_be_a_header_is_refused_without_echo() -> None:
    for bad in ("sk-abc\ndef-123456", "sk-\u00e9t\u00e9-123456", "sk abc 123456"):
        with pytest.raises(ValueError) as caught:
            OpenAIProvider(model="m", api_key=bad)
        assert bad not in str(caught.value)
        assert "abc" not in str(caught.value)


# ------------------------------------------------------------------ MockTransport units


def mock_client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


async def test_openai_sends_no_authorization_without_key() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=openai_completion("hi").body)

    async with mock_client(handler) as client:
        provider = make("openai", "http://local:8080", stream=False, key=None, client=client)
        assert (await provider.complete(REQUEST, context())).text == "hi"
    assert "authorization" not in seen[0].headers
    assert str(seen[0].url) == "http://local:8080/v1/chat/completions"


@pytest.mark.parametrize("base", ["https://api.example.com", "https://api.example.com/v1/"])
async def test_anthropic_url_with_or_without_v1(base: str) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=anthropic_message("hi").body)

    async with mock_client(handler) as client:
        provider = AnthropicProvider(
            base_url=base, model="m", api_key="k-123456", stream=False, client=client
        )
        await provider.complete(REQUEST, context())
    assert str(seen[0].url) == "https://api.example.com/v1/messages"


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (httpx.ConnectError("refused"), ErrorKind.NETWORK),
        (httpx.ReadError("reset by peer"), ErrorKind.NETWORK),
        (httpx.RemoteProtocolError("peer closed"), ErrorKind.NETWORK),
        (httpx.WriteError("broken pipe"), ErrorKind.NETWORK),
        (httpx.ConnectTimeout("slow"), ErrorKind.TIMEOUT),
        (httpx.ReadTimeout("slow"), ErrorKind.TIMEOUT),
        (httpx.PoolTimeout("busy"), ErrorKind.TIMEOUT),
        (
            httpx.LocalProtocolError(f"Illegal header value b'Bearer {KEY}\\n'"),
            ErrorKind.INVALID_REQUEST,
        ),
        (httpx.UnsupportedProtocol("ftp"), ErrorKind.INVALID_REQUEST),
        (httpx.DecodingError("bad gzip"), ErrorKind.MALFORMED_RESPONSE),
    ],
)
@pytest.mark.parametrize("stream", [True, False])
async def test_transport_exceptions_are_classified(
    exc: Exception, kind: ErrorKind, stream: bool
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    async with mock_client(handler) as client:
        caught = await failure(make("openai", "http://x", stream=stream, client=client))
    assert caught.error.kind is kind
    assert KEY not in caught.error.message


async def test_missing_model_is_invalid_request() -> None:
    provider = OpenAIProvider(model=None)
    caught = await failure(provider)
    assert caught.error.kind is ErrorKind.INVALID_REQUEST


async def test_unexpected_2xx_is_malformed() -> None:
    async with mock_client(lambda request: httpx.Response(204)) as client:
        caught = await failure(make("anthropic", "http://x", stream=False, client=client))
    assert caught.error.kind is ErrorKind.MALFORMED_RESPONSE


async def test_total_timeout_with_mock_transport() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        await trio.sleep(5)
        return httpx.Response(200, json=openai_completion("late").body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        caught = await failure(make("openai", "http://x", stream=False, total=0.05, client=client))
    assert caught.error.kind is ErrorKind.TIMEOUT


async def test_outer_cancellation_is_not_swallowed(server: FakeServer) -> None:
    """An AbortCall from the runtime cancels the call; it must not become an error."""
    server.enqueue(Stall())
    async with make("openai", server.url, stream=True, read=5.0) as provider:
        with trio.move_on_after(0.1) as scope:
            await provider.complete(REQUEST, context())
    assert scope.cancelled_caught


@pytest.mark.parametrize("api", APIS)
async def test_history_that_cannot_be_sent_is_invalid_request(api: Api) -> None:
    """A stored tool call whose arguments are not an object (Anthropic), or a tool schema
    that is not JSON (both): fatal INVALID_REQUEST, and no request goes out."""
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(500)

    broken_tool = ToolSpec("t", "broken", "{not json")
    requests = [ModelRequest("", (UserMessage("x"),), (broken_tool,))]
    if api == "anthropic":
        bad_call = AssistantMessage("", (ToolCall("c1", "f", "[1, 2]"),))
        requests.append(ModelRequest("", (UserMessage("x"), bad_call), ()))
    async with mock_client(handler) as client:
        for request in requests:
            caught = await failure(make(api, "http://x", stream=True, client=client), request)
            assert caught.error.kind is ErrorKind.INVALID_REQUEST
    assert sent == []


@pytest.mark.parametrize("api", APIS)
async def test_empty_keepalive_events_are_ignored(server: FakeServer, api: Api) -> None:
    full = ok(api, True, "hello")
    assert isinstance(full, Sse)
    body = full.body if isinstance(full.body, str) else full.body.decode()
    server.enqueue(Sse(": keep-alive\n\ndata:\n\n" + body))
    async with make(api, server.url, stream=True) as provider:
        assert (await provider.complete(REQUEST, context())).text == "hello"


@pytest.mark.parametrize("api", APIS)
async def test_a_stream_that_fails_after_its_usage_reports_the_billed_tokens(
    server: FakeServer, api: Api
) -> None:
    """Issue 13, item 2: the usage the server reported before the stream failed (an
    error event, or the connection dropped) is carried by the error."""
    if api == "openai":
        usage = (
            'data: {"choices": [], "usage": {"prompt_tokens": 1200, "completion_tokens": 83}}\n\n'
        )
        error = 'data: {"error": {"message": "Overloaded", "type": "server_error"}}\n\n'
    else:
        usage = (
            'event: message_start\ndata: {"type": "message_start", "message": {"usage": '
            '{"input_tokens": 1200, "output_tokens": 83}}}\n\n'
        )
        error = (
            'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", '
            '"message": "Overloaded"}}\n\n'
        )
    server.enqueue(Sse(usage + error))
    caught = await failure(make(api, server.url, stream=True))
    assert caught.error.kind is ErrorKind.SERVER_ERROR
    assert caught.error.usage == Usage(1200, 83)
    server.enqueue(Sse(usage, then="drop"))
    caught = await failure(make(api, server.url, stream=True))
    assert caught.error.usage == Usage(1200, 83), caught.error


def _cut_in_a_tool_call(api: Api) -> Json:
    """A whole (non-streaming) reply stopped at max_tokens inside a tool call's
    arguments, as llama-server sends it, with the usage the server reported."""
    if api == "openai":
        return Json(
            {
                "id": "chatcmpl-cut",
                "object": "chat.completion",
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "length",
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "call_1",
                                    "type": "function",
                                    "function": {
                                        "name": "get_weather",
                                        "arguments": '{"city": "Pa',
                                    },
                                }
                            ],
                        },
                    }
                ],
                "usage": {"prompt_tokens": 1435, "completion_tokens": 200, "total_tokens": 1635},
            }
        )
    return Json(
        {
            "id": "msg_cut",
            "type": "message",
            "role": "assistant",
            "model": "m",
            # A server that could not parse the cut arguments hands them on as text.
            "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": '{"ci'}],
            "stop_reason": "max_tokens",
            "usage": {"input_tokens": 1435, "output_tokens": 200},
        }
    )


@pytest.mark.parametrize("api", APIS)
async def test_a_whole_reply_that_cannot_be_used_keeps_its_billed_tokens(
    server: FakeServer, api: Api
) -> None:
    """Issue 22, item 11: a non-streaming reply cut inside a tool call lost its usage
    (``0 tokens, $0.0000`` where the server reported 1,435 + 200): the parser raised
    before it read ``usage``."""
    server.enqueue(_cut_in_a_tool_call(api))
    caught = await failure(make(api, server.url, stream=False))
    assert caught.error.kind in (ErrorKind.OUTPUT_TRUNCATED, ErrorKind.MALFORMED_RESPONSE)
    assert caught.error.usage == Usage(1435, 200)
    # The same body from a server that ignores stream=true and answers with JSON.
    server.enqueue(_cut_in_a_tool_call(api))
    caught = await failure(make(api, server.url, stream=True))
    assert caught.error.usage == Usage(1435, 200)


async def test_a_stream_cut_in_a_tool_call_keeps_its_billed_tokens(server: FakeServer) -> None:
    """The streaming path of the same cut (its usage chunk comes after finish_reason)."""
    cut = ToolCall("call_1", "get_weather", '{"city": "Pa')
    server.enqueue(openai_stream("", (cut,), finish_reason="length", usage=(1435, 200)))
    caught = await failure(make("openai", server.url, stream=True))
    assert caught.error.kind is ErrorKind.OUTPUT_TRUNCATED
    assert caught.error.usage == Usage(1435, 200)


def _cut_after_a_whole_tool_call(api: Api, stream: bool) -> Reply:
    """A reply whose tool call parsed whole but whose stop reason says the output was
    cut at the token limit, as llama-server's Messages endpoint answered: a
    ``tool_use`` block with ``input: {}`` and ``stop_reason: max_tokens``."""
    call = ToolCall.of("toolu_cut", "spawn_agents", {})
    if api == "openai":
        if stream:
            return openai_stream("", (call,), finish_reason="length", usage=(900, 64))
        reply = openai_completion("", (call,), finish_reason="length", usage=(900, 64))
        return reply
    if stream:
        return anthropic_stream("", (call,), stop_reason="max_tokens", usage=(900, 64))
    return anthropic_message("", (call,), stop_reason="max_tokens", usage=(900, 64))


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("api", APIS)
async def test_a_tool_call_in_a_reply_cut_at_max_tokens_is_never_run(
    server: FakeServer, api: Api, stream: bool
) -> None:
    """Issue 33, item 11: a reply stopped at the output token limit must not run its
    last tool call, even when the call's arguments parse (``{}`` here, cut before the
    model wrote them): OUTPUT_TRUNCATED, fatal, with the tokens billed."""
    server.enqueue(_cut_after_a_whole_tool_call(api, stream))
    caught = await failure(make(api, server.url, stream=stream))
    assert caught.error.kind is ErrorKind.OUTPUT_TRUNCATED
    assert not caught.error.kind.retryable
    assert "spawn_agents" in caught.error.message and "raise max_tokens" in caught.error.message
    assert caught.error.usage == Usage(900, 64)
    assert len(server.requests) == 1


def _anthropic_stream_then_error(payload: dict[str, Any]) -> Sse:
    """An Anthropic stream that starts, writes some text, then reports an error as
    llama-server's Messages endpoint does: an ``event: error`` line whose data is the
    server's error object (its ``type`` is the error's, not ``"error"``)."""
    started = anthropic_stream("Let me look at the files").body
    assert isinstance(started, str)
    # Keep the beginning (up to the text's last delta), drop the end of the message.
    head = started[: started.index("event: content_block_stop")]
    return Sse(head + f"event: error\ndata: {json.dumps(payload)}\n\n", chunk_size=41)


@pytest.mark.parametrize(
    ("payload", "kind"),
    [
        ({"code": 400, "message": "too long", "type": "exceed_context_size_error"}, "context"),
        ({"code": 503, "message": "Loading model", "type": "unavailable_error"}, "server"),
        ({"code": 401, "message": "Invalid API Key", "type": "authentication_error"}, "auth"),
        ({"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}, ""),
    ],
)
async def test_an_error_event_in_an_anthropic_stream_is_the_servers_error(
    server: FakeServer, payload: dict[str, Any], kind: str
) -> None:
    """Issue 33, item 12: the stream parser took an event's type from its JSON's
    ``type`` ("server_error"), never saw the error, and reported a malformed stream
    (retried, the server's message lost). The ``event:`` line names it: the error
    carries the server's message and is classified as the same error on the OpenAI
    endpoint (and as an HTTP error of that status) is."""
    server.enqueue(_anthropic_stream_then_error(payload))
    caught = await failure(make("anthropic", server.url, stream=True))
    assert caught.error.kind is not ErrorKind.MALFORMED_RESPONSE
    assert payload["message"] in caught.error.message
    server.enqueue(Sse(f"data: {json.dumps({'error': payload})}\n\n"))
    on_openai = await failure(make("openai", server.url, stream=True))
    assert caught.error.kind is on_openai.error.kind
    expected = {
        "context": ErrorKind.CONTEXT_EXHAUSTED,
        "server": ErrorKind.SERVER_ERROR,
        "auth": ErrorKind.AUTH,
    }
    if kind:
        assert caught.error.kind is expected[kind]


def test_an_error_event_with_text_data_keeps_the_text() -> None:
    """An ``event: error`` whose data is not JSON is still the server's error, its
    text the message (not "invalid JSON in stream event")."""
    from fanfold.providers.anthropic import AnthropicStreamAssembler
    from fanfold.providers.wire import SSEEvent

    assembler = AnthropicStreamAssembler()
    with pytest.raises(ProviderError) as caught:
        assembler.feed(SSEEvent("error", "upstream model crashed"))
    assert caught.value.error.kind is ErrorKind.SERVER_ERROR
    assert "upstream model crashed" in caught.value.error.message


def test_a_reply_cut_at_the_context_window_runs_no_tool_call() -> None:
    """Anthropic's ``model_context_window_exceeded`` stop reason is a cut too."""
    from fanfold.providers.anthropic import parse_anthropic_response

    body = anthropic_message("", (CALL,), stop_reason="model_context_window_exceeded").body
    with pytest.raises(ProviderError) as caught:
        parse_anthropic_response(body)
    assert caught.value.error.kind is ErrorKind.OUTPUT_TRUNCATED
    assert parse_anthropic_response(anthropic_message("", (CALL,)).body).tool_calls == (CALL,)
