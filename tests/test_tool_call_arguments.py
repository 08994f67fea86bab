"""A tool call's arguments decoded once and kept on the call (issue 21's lever "decoded
arguments kept on the tool call"): read-only, out of the call's fields (equality, hash,
codec and fingerprint see only the text), and never decoded again by the reducer, the
tool registry or the providers."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from fanfold.db import codec
from fanfold.providers.anthropic import parse_anthropic_stream
from fanfold.providers.openai import parse_openai_stream
from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import Limits, ModelReplied, ModelReply, ToolCall
from fanfold.statemachine.messages import JsonArray, JsonObject, frozen_json, thawed_json
from fanfold.tools import ToolSet
from fanfold.tools.function import tool

FIXTURES = Path(__file__).parent / "fixtures"


class _Decodes:
    """Counts ``json.loads`` of given texts, whoever calls it (any thread)."""

    def __init__(self, texts: set[str]) -> None:
        self.texts = texts
        self.seen: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = json.loads

        def counting(text: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(text, str) and text in self.texts:
                self.seen.append(text)
            return real(text, *args, **kwargs)

        monkeypatch.setattr(json, "loads", counting)


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Decodes]:
    counter = _Decodes(set())
    counter.install(monkeypatch)
    yield counter


# ------------------------------------------------------------------ a run


THINK = {"name": "think", "arguments": {"thought": "working"}}
SUBMIT = {"name": "submit_result", "arguments": {"result": "done"}}
SPAWN = {"name": "spawn_agents", "arguments": {"tasks": [{"task": "a"}, {"task": "b"}]}}


async def test_a_fan_out_decodes_no_tool_call_arguments_text(
    tmp_path: Path, decodes: _Decodes
) -> None:
    """Root spawns two children; each thinks twice and submits. The scripted provider
    builds the calls from their values, so nothing (reducer: spawn_agents,
    submit_result; registry: think) parses an arguments text: before the kept value,
    every one of the 2 x 3 + 1 calls was parsed at least once."""
    script = {
        "agents": [
            {"match": {"path": "root"}, "replies": [{"tool_calls": [SPAWN]}, {"text": "ok"}]},
            {
                "match": {"depth": 1},
                "replies": [{"tool_calls": [THINK]}] * 2 + [{"tool_calls": [SUBMIT]}],
            },
        ]
    }
    decodes.texts.update(
        json.dumps(call["arguments"], sort_keys=True, separators=(",", ":"))
        for call in (THINK, SUBMIT, SPAWN)
    )
    async with Runtime.open(
        str(tmp_path / "log.db"),
        ScriptedProvider(script),
        ToolSet.default(),
        limits=Limits(),
        logger=quiet_logger(),
    ) as runtime:
        root = await runtime.start("work", cwd=str(tmp_path))
        await runtime.wait(root)
        assert runtime.state(root).phase.__class__.__name__ == "Idle"
        children = [runtime.state(f"{root}.{n}") for n in (1, 2)]
    # The children really ran their calls: both completed with the submitted result.
    assert [type(c.phase).__name__ for c in children] == ["Completed", "Completed"]
    assert decodes.seen == []


# ------------------------------------------------------------------ the kept value


def test_a_call_made_from_text_decodes_it_once(decodes: _Decodes) -> None:
    text = '{"command":"ls","timeout":5}'
    decodes.texts.add(text)
    call = ToolCall("c1", "bash", text)
    first = call.arguments()
    assert call.arguments() is first
    assert attrs.evolve(call).arguments() == first
    # Once for the call, once for its evolved copy (a new call: nothing carried over).
    assert decodes.seen == [text, text]


def test_the_kept_arguments_are_read_only_at_every_level() -> None:
    call = ToolCall.of("c1", "spawn_agents", {"tasks": [{"task": "a"}], "mode": "all"})
    arguments = call.arguments()
    assert type(arguments) is JsonObject
    assert type(arguments["tasks"]) is JsonArray
    assert type(arguments["tasks"][0]) is JsonObject
    changes: list[Callable[[], object]] = [
        lambda: arguments.__setitem__("mode", "x"),
        lambda: arguments.pop("mode"),
        lambda: arguments.update(mode="x"),
        lambda: arguments.setdefault("new", 1),
        lambda: arguments.clear(),
        lambda: arguments["tasks"].append({}),
        lambda: arguments["tasks"].__setitem__(0, {}),
        lambda: arguments["tasks"][0].__delitem__("task"),
        lambda: arguments["tasks"].sort(),
    ]
    for change in changes:
        with pytest.raises(TypeError, match="read-only"):
            change()
    assert call.arguments() == {"tasks": [{"task": "a"}], "mode": "all"}
    # A copy to change is a plain dict; pickle and deepcopy keep the read-only form.
    assert type(dict(arguments)) is dict
    assert type({**arguments, "x": 1}) is dict
    assert pickle.loads(pickle.dumps(arguments)) == arguments
    assert type(copy.deepcopy(arguments)["tasks"]) is JsonArray
    plain = thawed_json(arguments)
    plain["tasks"].append({"task": "b"})
    assert type(plain["tasks"]) is list and len(arguments["tasks"]) == 1


def test_the_kept_value_changes_nothing_the_log_or_a_comparison_sees() -> None:
    value = {"b": [1, 2.5, None, True], "a": {"é": "x"}}
    kept = ToolCall.of("c1", "t", value)
    from_text = ToolCall("c1", "t", kept.arguments_json)
    assert kept == from_text and hash(kept) == hash(from_text)
    assert repr(kept) == repr(from_text)
    assert kept.arguments() == from_text.arguments() == value
    event = ModelReplied(1, ModelReply(tool_calls=(kept,)))
    same = ModelReplied(1, ModelReply(tool_calls=(from_text,)))
    assert codec.encode_event(event) == codec.encode_event(same)
    assert codec.decode_event(codec.encode_event(event)) == event


def test_a_hand_built_read_only_value_is_kept_read_only_inside() -> None:
    call = ToolCall.of("c1", "t", JsonObject({"a": [1], "b": JsonArray([{"c": 2}])}))
    arguments = call.arguments()
    assert type(arguments["a"]) is JsonArray
    assert type(arguments["b"][0]) is JsonObject
    assert arguments == {"a": [1], "b": [{"c": 2}]}


@pytest.mark.parametrize(
    "value",
    [{1: "int key"}, {"a": (1, 2)}, {"a": {"b": {3}}}],
    ids=["int-key", "tuple", "set"],
)
def test_a_value_json_would_not_give_back_is_not_kept(value: dict[str, Any]) -> None:
    """``of`` keeps only what reading its text back gives; otherwise the text is read."""
    with pytest.raises(ValueError):
        frozen_json(value)
    if "a" in value and isinstance(value["a"], dict):
        with pytest.raises(TypeError):  # json.dumps refuses a set: nothing to keep
            ToolCall.of("c1", "t", value)
        return
    call = ToolCall.of("c1", "t", value)
    assert call.arguments() == json.loads(call.arguments_json)


# ------------------------------------------------------------------ providers


@pytest.mark.parametrize(
    ("parse", "fixture"),
    [
        (parse_openai_stream, "openai/stream-one-tool-call.sse"),
        (parse_openai_stream, "openai/stream-one-tool-call-2.sse"),
    ],
)
def test_a_provider_keeps_the_arguments_it_parsed(
    parse: Any, fixture: str, decodes: _Decodes
) -> None:
    reply = parse((FIXTURES / fixture).read_text())
    assert reply.tool_calls
    decodes.texts.update(call.arguments_json for call in reply.tool_calls)
    for call in reply.tool_calls:
        assert type(call.arguments()) is JsonObject
        assert call.arguments() == json.loads(call.arguments_json)
    # The checks above parsed each text once (json.loads, for the comparison) only.
    assert len(decodes.seen) == len(reply.tool_calls)


def test_an_anthropic_stream_keeps_the_arguments_it_parsed(decodes: _Decodes) -> None:
    from fakeserver import anthropic_stream

    call = ToolCall("toolu_1", "bash", '{"command":"ls -la"}')
    reply = parse_anthropic_stream(anthropic_stream(tool_calls=[call]).body)
    decodes.texts.add(call.arguments_json)
    (parsed,) = reply.tool_calls
    assert parsed == call
    assert type(parsed.arguments()) is JsonObject
    assert parsed.arguments() == {"command": "ls -la"}
    assert decodes.seen == []


# ------------------------------------------------------------------ tools


async def test_a_function_tool_gets_a_copy_it_may_change() -> None:
    """A user's function may change its arguments: it gets plain lists and dicts, and
    the call's kept arguments stay as they were."""

    seen: list[Any] = []

    @tool
    def grow(items: list[Any], options: dict[str, Any]) -> str:
        """Append to what it is given.

        Args:
            items: a list
            options: a mapping
        """
        items.append("more")
        options["changed"] = True
        seen.append((items, options))
        return "ok"

    call = ToolCall.of("c1", "grow", {"items": [["x"]], "options": {"k": [1]}})
    result = await ToolSet([grow]).run(call, "/")
    assert result.content == "ok" and not result.is_error
    assert seen == [([["x"], "more"], {"k": [1], "changed": True})]
    assert call.arguments() == {"items": [["x"]], "options": {"k": [1]}}


def test_think_reads_the_kept_arguments(decodes: _Decodes) -> None:
    call = ToolCall.of("c1", "think", {"thought": "working"})
    decodes.texts.add(call.arguments_json)
    result = ToolSet.default().answer(call, "/")
    assert result.content == "ok"
    assert decodes.seen == []
