"""Context-window overflow as local servers report it (llama.cpp, vLLM, Ollama).

The bodies in ``tests/fixtures/local`` are those servers' own error shapes. Each
overflow of one request must classify as CONTEXT_EXHAUSTED, which is not retried:
sending the same prompt again can never fit. llama.cpp's 500 "Context size has been
exceeded." is another thing (issue 33, item 13): found while decoding, when the
context its parallel slots share is full of *other* requests; the same request sent
again alone succeeds, so it is a SERVER_ERROR, retried with back-off.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakeserver import FakeServer, Json, Sse, sse_file

from fanfold.providers.base import CallContext, ProviderError
from fanfold.providers.http import Timeouts
from fanfold.providers.openai import OpenAIProvider
from fanfold.providers.wire import classify_http_error, classify_stream_error
from fanfold.statemachine import ErrorKind, ModelRequest, UserMessage

LOCAL = Path(__file__).parent / "fixtures" / "local"
NOW = 1_700_000_000.0
REQUEST = ModelRequest("Be brief.", (UserMessage("Summarise the repository."),), ())

# (fixture, the HTTP status the server sends it with)
OVERFLOWS = [
    ("llamacpp-context-400.json", 400),
    ("llamacpp-context-400-older.json", 400),
    ("vllm-context-400.json", 400),
    ("vllm-context-400-newer.json", 400),
    ("vllm-decoder-prompt-400.json", 400),
    ("vllm-prompt-length-400.json", 400),
    ("ollama-openai-context-400.json", 400),
    ("ollama-openai-context-500.json", 500),
]


def body(name: str) -> bytes:
    return (LOCAL / name).read_bytes()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


def provider(server: FakeServer, *, stream: bool) -> OpenAIProvider:
    return OpenAIProvider(
        base_url=server.url + "/v1",
        model="local",
        stream=stream,
        timeouts=Timeouts(connect=2.0, read=5.0),
    )


async def failure(llm: OpenAIProvider) -> ProviderError:
    async with llm:
        with pytest.raises(ProviderError) as caught:
            await llm.complete(REQUEST, CallContext("c", "c", "root", 0, None, 1))
    return caught.value


@pytest.mark.parametrize(("name", "status"), OVERFLOWS)
def test_recorded_overflow_bodies_are_context_exhausted(name: str, status: int) -> None:
    error = classify_http_error("openai", status, body(name), {"retry-after": "1"}, NOW)
    assert error.kind is ErrorKind.CONTEXT_EXHAUSTED
    assert not error.kind.retryable
    assert error.retry_after is None
    assert error.message.startswith(f"openai HTTP {status}: ")
    # The same body inside a 200 stream classifies the same way.
    assert classify_stream_error("openai", json.loads(body(name))).kind is error.kind


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize(("name", "status"), OVERFLOWS)
async def test_overflow_over_loopback(
    server: FakeServer, name: str, status: int, stream: bool
) -> None:
    server.enqueue(Json(json.loads(body(name)), status=status))
    caught = await failure(provider(server, stream=stream))
    assert caught.error.kind is ErrorKind.CONTEXT_EXHAUSTED
    assert len(server.requests) == 1


def test_llamacpp_shared_context_full_is_a_retried_server_error() -> None:
    """llama-server's 500 "Context size has been exceeded." (found while decoding,
    the slots' shared context full of other requests) is retried, and says why and
    what bounds it; its 400 ``exceed_context_size_error`` (this request alone does not
    fit) stays CONTEXT_EXHAUSTED, fatal."""
    error = classify_http_error("openai", 500, body("llamacpp-context-500.json"), {}, NOW)
    assert error.kind is ErrorKind.SERVER_ERROR and error.kind.retryable
    assert error.message.startswith("openai HTTP 500: server_error: Context size has been")
    assert "slots share" in error.message and "-np" in error.message
    streamed = classify_stream_error("anthropic", json.loads(body("llamacpp-context-500.json")))
    assert streamed.kind is ErrorKind.SERVER_ERROR and "-np" in streamed.message
    alone = classify_http_error("openai", 400, body("llamacpp-context-400.json"), {}, NOW)
    assert alone.kind is ErrorKind.CONTEXT_EXHAUSTED and "-np" not in alone.message


@pytest.mark.parametrize("stream", [True, False])
async def test_llamacpp_shared_context_full_over_loopback(server: FakeServer, stream: bool) -> None:
    server.enqueue(Json(json.loads(body("llamacpp-context-500.json")), status=500))
    caught = await failure(provider(server, stream=stream))
    assert caught.error.kind is ErrorKind.SERVER_ERROR


async def test_llamacpp_in_stream_overflow_is_a_server_error(server: FakeServer) -> None:
    # llama.cpp streams some text, then reports the shared context full as code 500
    # inside the 200 stream: retried (each conversation's back-off has its own jitter).
    server.enqueue(sse_file(LOCAL / "llamacpp-stream-context-exceeded.sse", chunk_size=37))
    caught = await failure(provider(server, stream=True))
    assert caught.error.kind is ErrorKind.SERVER_ERROR
    assert "Context size has been exceeded" in caught.error.message


@pytest.mark.parametrize(
    "payload",
    [
        {"error": {"code": 500, "message": "boom", "type": "server_error"}},
        {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}},
        # Loose phrases that a 4xx trusts are not enough to stop retrying a 5xx.
        {"error": {"code": 500, "message": "too many tokens in flight", "type": "server_error"}},
        {"error": {"code": 502, "message": "context window cache busy", "type": "api_error"}},
    ],
)
async def test_other_server_errors_stay_retryable(server: FakeServer, payload: object) -> None:
    server.enqueue(Sse(f"data: {json.dumps(payload)}\n\n"))
    caught = await failure(provider(server, stream=True))
    assert caught.error.kind is ErrorKind.SERVER_ERROR
    assert caught.error.kind.retryable


@pytest.mark.parametrize(
    "message",
    [
        # vLLM's V1 engine (issue 22: was INVALID_REQUEST, a fatal error with no advice)
        "The decoder prompt (length 5000) is longer than the maximum model length of 4096. "
        "Make sure that `max_model_len` is no smaller than the number of text tokens.",
        "The encoder prompt (length 5000) is longer than the maximum model length of 4096.",
        # vLLM's older scheduler
        "Prompt length of 5000 is longer than the maximum model length of 4096.",
    ],
)
@pytest.mark.parametrize("status", [400, 500])
def test_vllm_max_model_length_is_context_exhausted(message: str, status: int) -> None:
    payload = {"error": {"message": message, "type": "BadRequestError", "code": status}}
    error = classify_http_error("openai", status, json.dumps(payload), {}, NOW)
    assert error.kind is ErrorKind.CONTEXT_EXHAUSTED
    assert classify_stream_error("openai", payload).kind is ErrorKind.CONTEXT_EXHAUSTED


def test_llamacpp_exceed_context_size_type_alone_is_context_exhausted() -> None:
    """llama-server's current 400 names the overflow by its type; a build whose message
    says nothing about the context is still CONTEXT_EXHAUSTED, by the type."""
    payload = {
        "error": {"code": 400, "message": "bad request", "type": "exceed_context_size_error"}
    }
    error = classify_http_error("openai", 400, json.dumps(payload), {}, NOW)
    assert error.kind is ErrorKind.CONTEXT_EXHAUSTED
    assert classify_stream_error("openai", payload).kind is ErrorKind.CONTEXT_EXHAUSTED


def test_llamacpp_overflow_says_by_how_much() -> None:
    error = classify_http_error("openai", 400, body("llamacpp-context-400.json"), {}, NOW)
    assert error.message == (
        "openai HTTP 400: exceed_context_size_error: the request exceeds the available "
        "context size, try increasing it (prompt: 4476 tokens, context size: 4096)"
    )
