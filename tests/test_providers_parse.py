"""Replies from both APIs, recorded and synthetic, streamed and whole, parse exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakeserver import anthropic_message, anthropic_stream, openai_completion, openai_stream

from fanfold.providers.anthropic import (
    AnthropicStreamAssembler,
    parse_anthropic_response,
    parse_anthropic_stream,
)
from fanfold.providers.base import ProviderError
from fanfold.providers.openai import (
    OpenAIStreamAssembler,
    parse_openai_response,
    parse_openai_stream,
)
from fanfold.providers.wire import decode_sse
from fanfold.statemachine import ErrorKind, ModelReply, ToolCall, Usage

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def malformed(excinfo: pytest.ExceptionInfo[ProviderError]) -> str:
    assert excinfo.value.error.kind is ErrorKind.MALFORMED_RESPONSE
    return excinfo.value.error.message


# ------------------------------------------------------------------ recorded OpenAI streams


def test_openai_fixture_one_tool_call() -> None:
    assert parse_openai_stream(fixture("openai/stream-one-tool-call.sse")) == ModelReply(
        text="",
        tool_calls=(
            ToolCall("call_4XzlGBLtUe9dy3GVNV4jhq7h", "get_weather", '{"city":"New York City"}'),
        ),
        usage=Usage(44, 16),
        stop_reason="tool_use",
    )


def test_openai_fixture_one_tool_call_2() -> None:
    reply = parse_openai_stream(fixture("openai/stream-one-tool-call-2.sse"))
    assert reply == ModelReply(
        text="",
        tool_calls=(
            ToolCall.of(
                "call_c91SqDXlYFuETYv8mUHzz6pp",
                "GetWeatherArgs",
                {"city": "Edinburgh", "country": "UK", "units": "c"},
            ),
        ),
        usage=Usage(76, 24),
        stop_reason="tool_use",
    )


def test_openai_fixture_text_refusal() -> None:
    """A recorded refusal: OpenAI says ``finish_reason: stop``; the ``refusal`` parts
    make it fanfold's stop reason ``refusal``, with the explanation kept."""
    reply = parse_openai_stream(fixture("openai/stream-text.sse"))
    sorry = "I'm sorry, I can't assist with that request."
    assert reply == ModelReply(sorry, (), Usage(79, 11), "refusal", stop_details=sorry)


def test_openai_fixture_cut_by_length() -> None:
    reply = parse_openai_stream(fixture("openai/stream-text-length.sse"))
    assert reply == ModelReply('{"', (), Usage(79, 1), "max_tokens")


def test_openai_stream_progress_counts_characters_and_tokens() -> None:
    assembler = OpenAIStreamAssembler()
    seen = []
    for event in decode_sse(fixture("openai/stream-one-tool-call.sse")):
        assembler.feed(event)
        seen.append((assembler.output_chars, assembler.output_tokens))
    assert seen[-1] == (len('{"city":"New York City"}'), 16)
    assert [c for c, _ in seen] == sorted(c for c, _ in seen)
    assert assembler.done


# ------------------------------------------------------------------ OpenAI stream faults


def _lines(name: str) -> list[str]:
    return [line for line in fixture(name).decode().split("\n\n") if line.strip()]


def test_openai_stream_without_done_is_malformed() -> None:
    body = "\n\n".join(_lines("openai/stream-text.sse")[:-1]) + "\n\n"
    with pytest.raises(ProviderError) as caught:
        parse_openai_stream(body)
    assert "[DONE]" in malformed(caught)


def test_openai_stream_with_cut_tool_arguments_is_malformed() -> None:
    lines = _lines("openai/stream-one-tool-call.sse")
    body = "\n\n".join([*lines[:5], *lines[-3:]]) + "\n\n"  # arguments stop at '{"city":"New'
    with pytest.raises(ProviderError) as caught:
        parse_openai_stream(body)
    assert "not valid JSON" in malformed(caught)


def test_openai_stream_invalid_event_json_is_malformed() -> None:
    with pytest.raises(ProviderError) as caught:
        parse_openai_stream('data: {"choices": [\n\ndata: [DONE]\n\n')
    assert "invalid JSON" in malformed(caught)


def test_openai_stream_error_chunk_is_classified() -> None:
    body = 'data: {"error": {"message": "The server had an error", "type": "server_error"}}\n\n'
    with pytest.raises(ProviderError) as caught:
        parse_openai_stream(body)
    assert caught.value.error.kind is ErrorKind.SERVER_ERROR
    assert "The server had an error" in caught.value.error.message


def _chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    return (
        "data: "
        + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        + "\n\n"
    )


def test_openai_stream_parallel_tool_calls_interleaved() -> None:
    body = "".join(
        [
            _chunk({"role": "assistant", "content": "Let me "}),
            _chunk({"content": "look."}),
            _chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"x"'},
                        }
                    ]
                }
            ),
            _chunk(
                {
                    "tool_calls": [
                        {
                            "index": 1,
                            "id": "call_b",
                            "type": "function",
                            "function": {"name": "g", "arguments": ""},
                        }
                    ]
                }
            ),
            _chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"y": 2}'}}]}),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
            _chunk({}, "tool_calls"),
            "data: [DONE]\n\n",
        ]
    )
    reply = parse_openai_stream(body)
    assert reply.text == "Let me look."
    assert reply.tool_calls == (
        ToolCall("call_a", "f", '{"x":1}'),
        ToolCall("call_b", "g", '{"y":2}'),
    )
    assert reply.usage == Usage(0, 0)  # this server sent no usage chunk
    assert reply.stop_reason == "tool_use"


def test_openai_stream_fragments_without_index_and_repeated_names() -> None:
    # Some local servers omit `index` and repeat id/name on every fragment.
    body = "".join(
        [
            _chunk({"tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"a":'}}]}),
            _chunk({"tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "1}"}}]}),
            _chunk(
                {"tool_calls": [{"id": "c2", "function": {"name": "g", "arguments": {"b": 2}}}]}
            ),
            _chunk({}, "stop"),
            "data: [DONE]\n\n",
        ]
    )
    reply = parse_openai_stream(body)
    assert reply.tool_calls == (ToolCall("c1", "f", '{"a":1}'), ToolCall("c2", "g", '{"b":2}'))
    assert reply.stop_reason == "tool_use"


def test_openai_tool_call_without_id_gets_a_unique_one() -> None:
    body = "".join(
        [
            _chunk({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]}),
            _chunk({"tool_calls": [{"index": 1, "function": {"name": "f", "arguments": "{}"}}]}),
            "data: [DONE]\n\n",
        ]
    )
    first, second = parse_openai_stream(body).tool_calls
    assert first.id.startswith("call_") and second.id.startswith("call_")
    assert first.id != second.id


def test_openai_tool_call_without_name_is_malformed() -> None:
    body = (
        _chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"arguments": "{}"}}]})
        + "data: [DONE]\n\n"
    )
    with pytest.raises(ProviderError) as caught:
        parse_openai_stream(body)
    assert "no name" in malformed(caught)


# ------------------------------------------------------------------ OpenAI whole replies


def test_openai_whole_reply_shapes() -> None:
    reply = parse_openai_response(
        {
            "choices": [
                {
                    "message": {
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                        "tool_calls": [
                            {"id": "x", "function": {"name": "f", "arguments": {"k": [1]}}}
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4},
        }
    )
    assert reply == ModelReply("ab", (ToolCall("x", "f", '{"k":[1]}'),), Usage(3, 4), "tool_use")


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"choices": []},
        {"choices": [{"finish_reason": "stop"}]},
        {
            "choices": [
                {
                    "message": {
                        "content": "x",
                        "tool_calls": [
                            {"id": "a", "function": {"name": "f", "arguments": "{oops"}}
                        ],
                    }
                }
            ]
        },
        {"choices": [{"message": {"content": "x", "tool_calls": "nope"}}]},
    ],
)
def test_openai_whole_reply_malformed(data: Any) -> None:
    with pytest.raises(ProviderError) as caught:
        parse_openai_response(data)
    malformed(caught)


def test_openai_whole_reply_error_body_classified() -> None:
    with pytest.raises(ProviderError) as caught:
        parse_openai_response({"error": {"message": "quota", "type": "rate_limit_error"}})
    assert caught.value.error.kind is ErrorKind.RATE_LIMIT


# ------------------------------------------------------------------ recorded Anthropic streams


def test_anthropic_fixture_basic() -> None:
    assert parse_anthropic_stream(fixture("anthropic/basic_response.sse")) == ModelReply(
        "Hello there!", (), Usage(11, 6), "end_turn"
    )


def test_anthropic_fixture_tool_use() -> None:
    assert parse_anthropic_stream(fixture("anthropic/tool_use_response.sse")) == ModelReply(
        text="I'll check the current weather in Paris for you.",
        tool_calls=(
            ToolCall("toolu_01NRLabsLyVHZPKxbKvkfSMn", "get_weather", '{"location":"Paris"}'),
        ),
        usage=Usage(377, 65),
        stop_reason="tool_use",
    )


def test_anthropic_fixture_cut_off_in_a_tool_call_is_output_truncated() -> None:
    """The recorded stream stops (``stop_reason: max_tokens``) inside the JSON input of
    a tool call: not a malformed reply to retry with the same request (it would be cut
    off again) but OUTPUT_TRUNCATED, fatal, saying what to change."""
    with pytest.raises(ProviderError) as caught:
        parse_anthropic_stream(fixture("anthropic/incomplete_partial_json_response.sse"))
    error = caught.value.error
    assert error.kind is ErrorKind.OUTPUT_TRUNCATED and not error.kind.retryable
    assert "make_file" in error.message and "raise max_tokens" in error.message


def test_a_tool_block_cut_off_without_max_tokens_is_still_malformed() -> None:
    """Only the token limit makes a cut-off tool call 'truncated': a stream whose
    tool JSON is broken for another reason stays a (retryable) malformed reply."""
    text = fixture("anthropic/incomplete_partial_json_response.sse").decode()
    with pytest.raises(ProviderError) as caught:
        parse_anthropic_stream(
            text.replace('"stop_reason":"max_tokens"', '"stop_reason":"end_turn"')
        )
    assert "make_file" in malformed(caught)


def test_openai_refusal_in_a_complete_response() -> None:
    data = {
        "choices": [
            {
                "message": {"role": "assistant", "content": None, "refusal": "I can't help."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4},
    }
    reply = parse_openai_response(data)
    assert (reply.stop_reason, reply.stop_details, reply.text) == (
        "refusal",
        "I can't help.",
        "I can't help.",
    )
    data["choices"][0]["message"]["refusal"] = None  # type: ignore[index]
    data["choices"][0]["message"]["content"] = "Sure."  # type: ignore[index]
    assert parse_openai_response(data).stop_reason == "end_turn"


def test_openai_cut_off_tool_arguments_are_output_truncated() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": '{"pa'}}
    data = {
        "choices": [
            {"message": {"role": "assistant", "tool_calls": [call]}, "finish_reason": "length"}
        ]
    }
    with pytest.raises(ProviderError) as caught:
        parse_openai_response(data)
    assert caught.value.error.kind is ErrorKind.OUTPUT_TRUNCATED
    assert "write_file" in caught.value.error.message
    data["choices"][0]["finish_reason"] = "tool_calls"
    with pytest.raises(ProviderError) as caught:
        parse_openai_response(data)
    assert caught.value.error.kind is ErrorKind.MALFORMED_RESPONSE


def test_anthropic_refusal_keeps_its_stop_details() -> None:
    data = {
        "type": "message",
        "content": [{"type": "text", "text": ""}],
        "stop_reason": "refusal",
        "stop_details": {"type": "refusal", "explanation": "policy"},
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }
    reply = parse_anthropic_response(data)
    assert reply.stop_reason == "refusal"
    assert json.loads(reply.stop_details) == {"type": "refusal", "explanation": "policy"}


def test_anthropic_progress() -> None:
    assembler = AnthropicStreamAssembler()
    seen = []
    for event in decode_sse(fixture("anthropic/tool_use_response.sse")):
        assembler.feed(event)
        seen.append((assembler.output_chars, assembler.output_tokens))
    text = "I'll check the current weather in Paris for you."
    assert seen[0] == (0, 1)
    assert seen[-1] == (len(text) + len('{"location": "Paris"}'), 65)


# ------------------------------------------------------------------ Anthropic stream faults


def _events(name: str) -> list[str]:
    return [block for block in fixture(name).decode().split("\n\n") if block.strip()]


def test_anthropic_stream_cut_before_message_stop_is_malformed() -> None:
    for keep in (1, 4, len(_events("anthropic/basic_response.sse")) - 1):
        body = "\n\n".join(_events("anthropic/basic_response.sse")[:keep]) + "\n\n"
        with pytest.raises(ProviderError) as caught:
            parse_anthropic_stream(body)
        assert "message_stop" in malformed(caught)


def test_anthropic_stream_tool_block_without_stop_is_malformed_even_if_json_parses() -> None:
    events = [
        e
        for e in _events("anthropic/tool_use_response.sse")
        if '"content_block_stop","index":1' not in e
    ]
    with pytest.raises(ProviderError) as caught:
        parse_anthropic_stream("\n\n".join(events) + "\n\n")
    assert "cut off" in malformed(caught)


def test_anthropic_stream_error_event_is_classified() -> None:
    events = _events("anthropic/basic_response.sse")[:4]
    payload = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    error = f"event: error\ndata: {json.dumps(payload)}"
    with pytest.raises(ProviderError) as caught:
        parse_anthropic_stream("\n\n".join([*events, error]) + "\n\n")
    assert caught.value.error.kind is ErrorKind.SERVER_ERROR
    assert "Overloaded" in caught.value.error.message


def test_anthropic_stream_ignores_thinking_and_unknown_events() -> None:
    def event(payload: dict[str, Any]) -> str:
        return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n"

    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "usage": {"input_tokens": 5, "cache_read_input_tokens": 100, "output_tokens": 1}
            },
        },
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": ""},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "hmm"},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "s"},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "t1", "name": "noargs", "input": {}},
        },
        {"type": "content_block_stop", "index": 1},
        {"type": "some_future_event", "x": 1},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use"},
            "usage": {"output_tokens": 9},
        },
        {"type": "message_stop"},
    ]
    body = "".join(event(e) for e in events)
    assert parse_anthropic_stream(body) == ModelReply(
        "", (ToolCall("t1", "noargs", "{}"),), Usage(105, 9, cached_input_tokens=100), "tool_use"
    )


def test_anthropic_stream_delta_for_unknown_block_is_malformed() -> None:
    body = (
        'data: {"type": "message_start", "message": {"usage": {}}}\n\n'
        'data: {"type": "content_block_delta", "index": 3, '
        '"delta": {"type": "text_delta", "text": "x"}}\n\n'
    )
    with pytest.raises(ProviderError) as caught:
        parse_anthropic_stream(body)
    assert "never started" in malformed(caught)


# ------------------------------------------------------------------ Anthropic whole replies


@pytest.mark.parametrize(
    "data",
    [
        "text",
        {"type": "message"},
        {
            "type": "message",
            "content": [{"type": "tool_use", "id": "t", "name": "f", "input": [1]}],
        },
        {"type": "message", "content": [{"type": "tool_use", "name": "f", "input": {}}]},
        {"type": "message", "content": ["x"]},
    ],
)
def test_anthropic_whole_reply_malformed(data: Any) -> None:
    with pytest.raises(ProviderError) as caught:
        parse_anthropic_response(data)
    malformed(caught)


def test_anthropic_whole_reply_error_body_classified() -> None:
    with pytest.raises(ProviderError) as caught:
        parse_anthropic_response(
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        )
    assert caught.value.error.kind is ErrorKind.SERVER_ERROR


# ------------------------------------------------------------------ streamed == whole

CALLS = (
    ToolCall.of("call_1", "search", {"q": "trio \u00e9"}),
    ToolCall.of("call_2", "read", {"path": "/x", "n": 3}),
)


@pytest.mark.parametrize("text", ["", "Hello, world! \u2028 done"])
@pytest.mark.parametrize("calls", [(), CALLS])
def test_streamed_and_whole_replies_agree(text: str, calls: tuple[ToolCall, ...]) -> None:
    whole = parse_openai_response(openai_completion(text, calls, usage=(7, 8)).body)
    streamed = parse_openai_stream(openai_stream(text, calls, usage=(7, 8)).body)
    assert (
        whole
        == streamed
        == ModelReply(text, calls, Usage(7, 8), "tool_use" if calls else "end_turn")
    )
    whole = parse_anthropic_response(anthropic_message(text, calls, usage=(7, 8)).body)
    streamed = parse_anthropic_stream(anthropic_stream(text, calls, usage=(7, 8)).body)
    assert (
        whole
        == streamed
        == ModelReply(text, calls, Usage(7, 8), "tool_use" if calls else "end_turn")
    )
