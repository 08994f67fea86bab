"""A conversation with sub-agents through the runtime and real HTTP providers on loopback.

The fake server speaks the OpenAI and Anthropic wire formats (streams included) and
injects faults: the tree retries where it should and fails cleanly where it should.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakeserver import (
    Drop,
    FakeServer,
    Sse,
    anthropic_error,
    anthropic_stream,
    first_user_contains,
    openai_error,
    openai_stream,
)
from runtime_helpers import open_runtime

from fanfold.providers.anthropic import AnthropicProvider
from fanfold.providers.http import Timeouts
from fanfold.providers.openai import OpenAIProvider
from fanfold.statemachine import (
    Completed,
    ErrorKind,
    Failed,
    Limits,
    ToolCall,
    ToolResultMessage,
)

LIMITS = Limits(max_attempts=4, retry_base=0.01, retry_cap=0.05)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


def spawn_call(*tasks: str) -> ToolCall:
    return ToolCall.of("call_spawn", "spawn_agents", {"tasks": [{"task": t} for t in tasks]})


def submit(result: str, call_id: str = "call_submit") -> ToolCall:
    return ToolCall.of(call_id, "submit_result", {"result": result})


def fan_in(history: Any) -> list[dict[str, Any]]:
    for message in history:
        if isinstance(message, ToolResultMessage) and message.result.name == "spawn_agents":
            results: list[dict[str, Any]] = json.loads(message.result.content)["sub_agent_results"]
            return results
    raise AssertionError("no fan-in in the history")


async def test_openai_tree_retries_and_fails_cleanly(tmp_path: Path, server: FakeServer) -> None:
    server.when(
        first_user_contains("review"),
        openai_stream(tool_calls=[spawn_call("alpha: list files", "beta: check auth")]),
        openai_stream(text="alpha worked, beta could not authenticate"),
    )
    # alpha: a rate limit with Retry-After, a 503, a dropped stream, then success.
    server.when(
        first_user_contains("alpha"),
        openai_error(429, "slow down", type="rate_limit_error", headers={"retry-after": "1"}),
        openai_error(503, "overloaded", type="server_error"),
        Sse(openai_stream(text="partial answer").body, cut_after=40, then="drop"),
    )
    server.when(first_user_contains("alpha"), openai_stream(tool_calls=[submit("3 files")]))
    # beta: a fatal auth error: no retry, the child fails, its sibling is unharmed.
    server.when(first_user_contains("beta"), openai_error(401, "bad key", type="auth_error"))
    provider = OpenAIProvider(
        base_url=server.url + "/v1", model="fake", api_key="sk-test-secret-key-123"
    )
    async with provider, open_runtime(tmp_path, provider, limits=LIMITS) as runtime:
        root = await runtime.start("please review", cwd=tmp_path)
        result = await runtime.wait(root)
        alpha = runtime.state(f"{root}.1")
        beta = runtime.state(f"{root}.2")
        children = fan_in(runtime.state(root).history)
    assert result.text == "alpha worked, beta could not authenticate"
    assert isinstance(alpha.phase, Completed)
    assert alpha.phase.result == "3 files"
    assert isinstance(beta.phase, Failed)
    assert beta.phase.kind is ErrorKind.AUTH
    assert "sk-test-secret-key-123" not in beta.phase.error
    assert [c["status"] for c in children] == ["completed", "failed"]
    assert server.unmatched == []

    # alpha: three retryable failures, then success on the 4th (last allowed) attempt;
    # beta: the fatal error is never retried.
    def first_user(request: Any) -> str:
        messages = request.json["messages"]
        return str(next(m["content"] for m in messages if m["role"] == "user"))

    users = [first_user(r) for r in server.requests]
    assert users.count("alpha: list files") == 4
    assert users.count("beta: check auth") == 1
    # The key went in the header, never into the log.
    store_text = (tmp_path / "log.db").read_bytes()
    assert b"sk-test-secret-key-123" not in store_text


async def test_anthropic_tree_with_streams(tmp_path: Path, server: FakeServer) -> None:
    server.when(
        first_user_contains("summarise"),
        anthropic_stream(text="Delegating.", tool_calls=[spawn_call("one", "two")]),
        anthropic_stream(text="Both done."),
    )
    server.when(
        first_user_contains("one"),
        anthropic_error(529, "overloaded", type="overloaded_error"),
        anthropic_stream(tool_calls=[submit("first")]),
    )
    server.when(first_user_contains("two"), Drop(), anthropic_stream(tool_calls=[submit("second")]))
    provider = AnthropicProvider(base_url=server.url, model="claude-fake", api_key="sk-ant-x")
    async with provider, open_runtime(tmp_path, provider, limits=LIMITS) as runtime:
        root = await runtime.start("summarise it", cwd=tmp_path)
        result = await runtime.wait(root)
        children = fan_in(runtime.state(root).history)
    assert result.text == "Both done."
    assert [(c["status"], c["result"]) for c in children] == [
        ("completed", "first"),
        ("completed", "second"),
    ]
    assert server.unmatched == []


async def test_a_stalled_stream_times_out_and_is_retried(
    tmp_path: Path, server: FakeServer
) -> None:
    server.when(
        first_user_contains("hello"),
        Sse(openai_stream(text="never finished").body, cut_after=30, then="stall"),
        openai_stream(text="second try"),
    )
    provider = OpenAIProvider(
        base_url=server.url + "/v1", model="m", api_key="k", timeouts=Timeouts(read=0.3)
    )
    async with provider, open_runtime(tmp_path, provider, limits=LIMITS) as runtime:
        root = await runtime.start("hello", cwd=tmp_path)
        result = await runtime.wait(root)
    assert result.text == "second try"


FIXTURES = Path(__file__).parent / "fixtures"


async def test_refusal_cut_off_and_truncated_children_reach_the_parent_typed(
    tmp_path: Path, server: FakeServer
) -> None:
    """Issue 13, item 1, over loopback with recorded streams: a child whose model
    refuses (OpenAI's recorded refusal) fails ``refused`` with the explanation; a
    child cut off at max_tokens inside a tool call fails ``output_truncated`` at once
    (one request: the same request would be cut off again); a child whose plain
    answer is cut off completes, marked ``completed_truncated``. The siblings'
    outcomes all reach the parent."""
    from fakeserver import sse_file

    server.when(
        first_user_contains("split"),
        openai_stream(tool_calls=[spawn_call("refuse me", "cut my call", "cut my text")]),
        openai_stream(text="reported"),
    )
    server.when(first_user_contains("refuse me"), sse_file(FIXTURES / "openai/stream-text.sse"))
    cut_call = openai_stream(
        tool_calls=[ToolCall("call_w", "write_file", '{"path": "a.txt", "content": "aaa')],
        finish_reason="length",
    )
    server.when(first_user_contains("cut my call"), cut_call)
    server.when(
        first_user_contains("cut my text"),
        openai_stream(text="half a sent", finish_reason="length"),
    )
    provider = OpenAIProvider(base_url=server.url + "/v1", model="fake")
    async with provider, open_runtime(tmp_path, provider, limits=LIMITS) as runtime:
        root = await runtime.start("split the work", cwd=tmp_path)
        result = await runtime.wait(root)
        refused, cut, half = (runtime.state(f"{root}.{i}") for i in (1, 2, 3))
        children = fan_in(runtime.state(root).history)
    assert result.text == "reported"
    assert isinstance(refused.phase, Failed) and refused.phase.kind is ErrorKind.REFUSED
    assert "I'm sorry, I can't assist with that request." in refused.phase.error
    assert isinstance(cut.phase, Failed) and cut.phase.kind is ErrorKind.OUTPUT_TRUNCATED
    assert "raise max_tokens" in cut.phase.error
    assert isinstance(half.phase, Completed) and half.truncated
    assert [(c["status"], c.get("error_kind")) for c in children] == [
        ("failed", "refused"),
        ("failed", "output_truncated"),
        ("completed_truncated", None),
    ]
    users = [
        next(str(m["content"]) for m in r.json["messages"] if m["role"] == "user")
        for r in server.requests
    ]
    assert users.count("cut my call") == 1  # fatal: never retried
    assert server.unmatched == []


async def test_a_root_cut_at_max_tokens_in_spawn_agents_runs_nothing(
    tmp_path: Path, server: FakeServer
) -> None:
    """Issue 33, item 11, as llama-server's Messages endpoint answered (not streamed):
    ``tool_use`` ``spawn_agents`` with ``input: {}`` and ``stop_reason: max_tokens``.
    fanfold ran ``spawn_agents({})`` every round; now the turn ends ``output_truncated``
    after one request, and no tool ran."""
    from fakeserver import anthropic_message

    cut = anthropic_message(
        tool_calls=[ToolCall.of("toolu_1", "spawn_agents", {})],
        stop_reason="max_tokens",
        usage=(1200, 256),
    )
    server.when(first_user_contains("fan out"), cut)
    provider = AnthropicProvider(base_url=server.url, model="local", stream=False)
    async with provider, open_runtime(tmp_path, provider, limits=LIMITS) as runtime:
        root = await runtime.start("fan out over the files", cwd=tmp_path)
        result = await runtime.wait(root)
        state = runtime.state(root)
    assert result.outcome == "error"
    assert "output_truncated" in result.text and "spawn_agents" in result.text
    assert not any(isinstance(m, ToolResultMessage) for m in state.history)
    assert state.usage_input == 1200 and state.usage_output == 256
    assert len(server.requests) == 1
    assert server.unmatched == []


LLAMA_FULL = {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_fan_out_over_a_full_shared_context_is_retried(
    tmp_path: Path, server: FakeServer, api: str
) -> None:
    """Issue 33, item 13: llama-server's parallel slots share one context; children
    of one fan-out sent together got HTTP 500 "Context size has been exceeded." (as
    the status, and inside a 200 stream), each succeeding when sent again. They are
    retried with back-off and complete; a child whose own prompt does not fit (the 400
    ``exceed_context_size_error``) fails ``context_exhausted`` after one request."""
    from fakeserver import Json

    alone = {
        "code": 400,
        "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 5000,
        "n_ctx": 4096,
    }
    if api == "openai":
        streamed, answer = Sse(f"data: {json.dumps({'error': LLAMA_FULL})}\n\n"), openai_stream
    else:
        start = anthropic_stream("Reading").body
        assert isinstance(start, str)
        head = start[: start.index("event: content_block_stop")]
        streamed = Sse(head + f"event: error\ndata: {json.dumps(LLAMA_FULL)}\n\n")
        answer = anthropic_stream
    server.when(
        first_user_contains("split"),
        answer(tool_calls=[spawn_call("one: a", "two: b", "three: c")]),
        answer(text="two of three"),
    )
    server.when(
        first_user_contains("one: a"),
        Json({"error": LLAMA_FULL}, status=500),
        streamed,
        answer(tool_calls=[submit("a done")]),
    )
    server.when(first_user_contains("two: b"), streamed, answer(tool_calls=[submit("b done")]))
    server.when(first_user_contains("three: c"), Json({"error": alone}, status=400))
    provider: OpenAIProvider | AnthropicProvider
    if api == "openai":
        provider = OpenAIProvider(base_url=server.url + "/v1", model="local")
    else:
        provider = AnthropicProvider(base_url=server.url, model="local")
    async with provider, open_runtime(tmp_path, provider, limits=LIMITS) as runtime:
        root = await runtime.start("split the work", cwd=tmp_path)
        result = await runtime.wait(root)
        children = fan_in(runtime.state(root).history)
    assert result.text == "two of three"
    assert [(c["status"], c.get("error_kind")) for c in children] == [
        ("completed", None),
        ("completed", None),
        ("failed", "context_exhausted"),
    ]

    def task(request: Any) -> str:
        messages = request.json["messages"]
        first = next(m["content"] for m in messages if m["role"] == "user")
        return json.dumps(first)

    tasks = [task(r) for r in server.requests]
    assert [sum("one: a" in t for t in tasks), sum("two: b" in t for t in tasks)] == [3, 2]
    assert sum("three: c" in t for t in tasks) == 1
    assert server.unmatched == []
