"""Message conversion between fanfold's history and both wire formats, both ways."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fanfold.providers.anthropic import (
    anthropic_request_body,
    from_anthropic_messages,
    parse_anthropic_response,
    to_anthropic_messages,
)
from fanfold.providers.http import RequestSettings
from fanfold.providers.openai import (
    from_openai_messages,
    openai_request_body,
    parse_openai_response,
    to_openai_messages,
)
from fanfold.statemachine import (
    AssistantMessage,
    Message,
    ModelRequest,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)

FIXTURES = Path(__file__).parent / "fixtures"

WEATHER = ToolSpec.from_schema(
    "get_weather",
    "Look up the weather",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)

HISTORY: tuple[Message, ...] = (
    UserMessage("Weather in Paris and Oslo?"),
    AssistantMessage(
        "Checking both.",
        (
            ToolCall.of("call_A1", "get_weather", {"city": "Paris"}),
            ToolCall.of("call_B2", "get_weather", {"city": "Oslo"}),
        ),
    ),
    ToolResultMessage(ToolResult("call_A1", "get_weather", "18C sunny")),
    ToolResultMessage(ToolResult("call_B2", "get_weather", "no such city", is_error=True)),
    AssistantMessage("", (ToolCall.of("call_C3", "get_weather", {"city": "Bergen"}),)),
    ToolResultMessage(ToolResult("call_C3", "get_weather", "9C rain")),
    UserMessage("Also: be brief."),
    AssistantMessage("Paris 18C, Bergen 9C."),
    UserMessage("Thanks"),
)


# ------------------------------------------------------------------ OpenAI


def test_openai_messages_exact() -> None:
    wire = to_openai_messages("You are terse.", HISTORY)
    assert wire == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": "Checking both.",
            "tool_calls": [
                {
                    "id": "call_A1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "call_B2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_A1", "content": "18C sunny"},
        {"role": "tool", "tool_call_id": "call_B2", "content": "no such city"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_C3",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Bergen"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_C3", "content": "9C rain"},
        {"role": "user", "content": "Also: be brief."},
        {"role": "assistant", "content": "Paris 18C, Bergen 9C."},
        {"role": "user", "content": "Thanks"},
    ]


def test_openai_no_system_message_when_prompt_empty() -> None:
    assert to_openai_messages("", (UserMessage("hi"),)) == [{"role": "user", "content": "hi"}]


def test_openai_back_conversion_restores_history() -> None:
    system, history = from_openai_messages(to_openai_messages("sys", HISTORY))
    assert system == "sys"
    # OpenAI has no is_error flag on tool messages; everything else survives.
    expected = tuple(
        ToolResultMessage(ToolResult(m.result.tool_call_id, m.result.name, m.result.content))
        if isinstance(m, ToolResultMessage)
        else m
        for m in HISTORY
    )
    assert history == expected


def test_openai_request_body() -> None:
    request = ModelRequest("sys", (UserMessage("hi"),), (WEATHER,), model="ignored-here")
    body = openai_request_body(
        request, model="gpt-4o", stream=True, max_tokens=100, temperature=0.5
    )
    assert body == {
        "model": "gpt-4o",
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Look up the weather",
                    "parameters": WEATHER.input_schema(),
                },
            }
        ],
        "max_tokens": 100,
        "temperature": 0.5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    plain = openai_request_body(
        ModelRequest("", (UserMessage("hi"),), ()),
        model="m",
        stream=False,
        max_tokens=5,
        max_tokens_param="max_completion_tokens",
    )
    assert plain == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 5,
    }


def test_openai_reply_round_trips_into_next_request() -> None:
    """The ids, names and arguments a reply carries are sent back exactly."""
    reply = parse_openai_response(
        {
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_4XzlGBLtUe9dy3GVNV4jhq7h",
                                "type": "function",
                                "function": {
                                    "name": "get_weather",
                                    "arguments": '{"city":"New York City"}',
                                },
                            }
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 44, "completion_tokens": 16},
        }
    )
    history = (
        UserMessage("weather?"),
        AssistantMessage(reply.text, reply.tool_calls),
        ToolResultMessage(ToolResult("call_4XzlGBLtUe9dy3GVNV4jhq7h", "get_weather", "sunny")),
    )
    wire = to_openai_messages("", history)
    assert wire[1]["tool_calls"][0]["id"] == "call_4XzlGBLtUe9dy3GVNV4jhq7h"
    assert wire[1]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city":"New York City"}',
    }
    assert wire[2] == {
        "role": "tool",
        "tool_call_id": "call_4XzlGBLtUe9dy3GVNV4jhq7h",
        "content": "sunny",
    }


# ------------------------------------------------------------------ Anthropic


def test_anthropic_messages_exact() -> None:
    wire = to_anthropic_messages(HISTORY)
    assert wire == [
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking both."},
                {
                    "type": "tool_use",
                    "id": "call_A1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "call_B2",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_A1", "content": "18C sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "call_B2",
                    "content": "no such city",
                    "is_error": True,
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "call_C3",
                    "name": "get_weather",
                    "input": {"city": "Bergen"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_C3", "content": "9C rain"},
                {"type": "text", "text": "Also: be brief."},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Paris 18C, Bergen 9C."}]},
        {"role": "user", "content": "Thanks"},
    ]


def test_anthropic_roles_alternate_and_tool_results_come_first() -> None:
    history = (
        UserMessage("a"),
        UserMessage("b"),
        AssistantMessage(""),  # empty: the API rejects it, so it is left out
        UserMessage("c"),
        AssistantMessage("x", (ToolCall.of("t1", "f", {}),)),
        UserMessage("interjection"),
        ToolResultMessage(ToolResult("t1", "f", "done")),
    )
    wire = to_anthropic_messages(history)
    assert [m["role"] for m in wire] == ["user", "assistant", "user"]
    assert wire[0]["content"] == [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b"},
        {"type": "text", "text": "c"},
    ]
    assert [b["type"] for b in wire[2]["content"]] == ["tool_result", "text"]


def test_anthropic_request_body_system_on_top() -> None:
    request = ModelRequest("Be kind.", (UserMessage("hi"),), (WEATHER,))
    no_cache = RequestSettings(prompt_caching=False)
    body = anthropic_request_body(
        request, model="claude", stream=True, temperature=0.0, settings=no_cache
    )
    assert body == {
        "model": "claude",
        "max_tokens": 4096,
        "system": "Be kind.",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {
                "name": "get_weather",
                "description": "Look up the weather",
                "input_schema": WEATHER.input_schema(),
            }
        ],
        "temperature": 0.0,
        "stream": True,
    }
    assert "system" not in anthropic_request_body(
        ModelRequest("", (UserMessage("hi"),), ()), model="m", stream=False
    )


def test_anthropic_marks_the_stable_prefix_for_the_prompt_cache() -> None:
    """Issue 13, item 6: by default the last tool schema and the system prompt carry
    ``cache_control`` (the prefix the children of one fan-out share); the messages do
    not. Without a system prompt or tools, nothing of theirs is marked."""
    request = ModelRequest("Be kind.", (UserMessage("hi"),), (WEATHER, WEATHER))
    body = anthropic_request_body(request, model="claude", stream=False)
    ephemeral = {"type": "ephemeral"}
    assert body["system"] == [{"type": "text", "text": "Be kind.", "cache_control": ephemeral}]
    assert [t.get("cache_control") for t in body["tools"]] == [None, ephemeral]
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    bare = anthropic_request_body(
        ModelRequest("", (UserMessage("hi"),), ()), model="m", stream=False
    )
    assert "system" not in bare and "tools" not in bare


def test_anthropic_back_conversion_restores_history() -> None:
    assert from_anthropic_messages(to_anthropic_messages(HISTORY)) == HISTORY


def test_anthropic_rejects_stored_arguments_that_are_not_objects() -> None:
    bad = (UserMessage("x"), AssistantMessage("", (ToolCall("t", "f", "[1]"),)))
    with pytest.raises(ValueError, match="not a JSON object"):
        to_anthropic_messages(bad)


# ------------------------------------------------------------------ the recorded tool loop


def _strip(value: Any, drop_keys: set[str], drop_blocks: set[str]) -> Any:
    """``value`` without keys fanfold never sends and blocks it cannot hold."""
    if isinstance(value, dict):
        return {
            k: _strip(v, drop_keys, drop_blocks) for k, v in value.items() if k not in drop_keys
        }
    if isinstance(value, list):
        return [
            _strip(v, drop_keys, drop_blocks)
            for v in value
            if not (isinstance(v, dict) and v.get("type") in drop_blocks)
        ]
    return value


def _exchange() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(
        (FIXTURES / "anthropic" / "tool-loop-exchange.json").read_text()
    )
    return data


def test_tool_loop_exchange_first_request_and_reply() -> None:
    first = _exchange()[0]
    sent = first["request"]["body"]
    spec = sent["tools"][0]
    tool = ToolSpec.from_schema(spec["name"], spec["description"], spec["input_schema"])
    question = sent["messages"][0]["content"]
    body = anthropic_request_body(
        ModelRequest("", (UserMessage(question),), (tool,)),
        model=sent["model"],
        stream=False,
        max_tokens=sent["max_tokens"],
        settings=RequestSettings(prompt_caching=False),  # the recorded request has none
    )
    # allowed_callers belongs to a server-tool beta fanfold does not use.
    assert body == _strip(sent, {"allowed_callers"}, set())

    reply = parse_anthropic_response(first["response"]["body"])
    assert reply.text == "I'll check the weather for all three cities in Celsius simultaneously."
    assert reply.tool_calls == (
        ToolCall.of(
            "toolu_011MDRpaZRMRRjtFkJizD6nS",
            "get_weather",
            {"location": "San Francisco, CA", "units": "c"},
        ),
    )
    assert reply.stop_reason == "tool_use"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (3182, 237)


def test_tool_loop_exchange_second_request_is_our_history() -> None:
    first, second = _exchange()
    reply = parse_anthropic_response(first["response"]["body"])
    sent = second["request"]["body"]["messages"]
    result_block = sent[2]["content"][0]
    history = (
        UserMessage(sent[0]["content"]),
        AssistantMessage(reply.text, reply.tool_calls),
        ToolResultMessage(
            ToolResult(result_block["tool_use_id"], "get_weather", result_block["content"])
        ),
    )
    # fanfold cannot hold server_tool_use blocks (a server-side beta); all else matches.
    expected = _strip(copy.deepcopy(sent), {"caller"}, {"server_tool_use"})
    assert to_anthropic_messages(history) == expected
    assert from_anthropic_messages(sent) == history

    nxt = parse_anthropic_response(second["response"]["body"])
    assert nxt.text == ""
    assert nxt.tool_calls == (
        ToolCall.of(
            "toolu_01RXQDRjwv5Un7n98xFahjo8",
            "get_weather",
            {"location": "New York, NY", "units": "c"},
        ),
    )
    assert (nxt.usage.input_tokens, nxt.usage.output_tokens, nxt.stop_reason) == (0, 0, "tool_use")


# ------------------------------------------------------------------ property: both ways

_text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=20)
_args = st.dictionaries(
    st.text(max_size=5), st.integers() | st.text(max_size=5) | st.booleans(), max_size=3
)


@st.composite
def histories(draw: st.DrawFn) -> tuple[Message, ...]:
    """Valid conversations: a user turn, then model rounds whose tool calls all get
    results (in order), sometimes with a user interjection after them."""
    history: list[Message] = [UserMessage(draw(_text))]
    counter = 0
    for _ in range(draw(st.integers(0, 4))):
        calls = []
        for _ in range(draw(st.integers(0, 3))):
            counter += 1
            calls.append(
                ToolCall.of(
                    f"id_{counter}_{draw(st.text('abcXYZ019_-', max_size=6))}",
                    draw(_text),
                    draw(_args),
                )
            )
        text = draw(_text) if not calls else draw(st.just("") | _text)
        history.append(AssistantMessage(text, tuple(calls)))
        for call in calls:
            history.append(
                ToolResultMessage(
                    ToolResult(call.id, call.name, draw(st.text(max_size=10)), draw(st.booleans()))
                )
            )
        if not calls or draw(st.booleans()):
            history.append(UserMessage(draw(_text)))
    return tuple(history)


@given(histories(), st.text(max_size=10))
def test_openai_round_trip_property(history: tuple[Message, ...], system: str) -> None:
    back_system, back = from_openai_messages(to_openai_messages(system, history))
    assert back_system == system
    no_flags = tuple(
        ToolResultMessage(_without_error_flag(m.result)) if isinstance(m, ToolResultMessage) else m
        for m in history
    )
    assert back == no_flags


@given(histories())
def test_anthropic_round_trip_property(history: tuple[Message, ...]) -> None:
    wire = to_anthropic_messages(history)
    roles = [m["role"] for m in wire]
    assert all(a != b for a, b in itertools.pairwise(roles))
    assert roles[0] == "user"
    assert from_anthropic_messages(wire) == history


def _without_error_flag(result: ToolResult) -> ToolResult:
    return ToolResult(result.tool_call_id, result.name, result.content, False)
