"""Tools that answer in-process (``think``; ``InProcess``): answered in the engine's
round, without a task, with the same result, checks and log line as a task's call."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from runtime_helpers import reply, script, think

from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import Limits, ToolCall, ToolFinished, ToolResult, ToolSpec
from fanfold.tools import ThinkTool, ToolOutput, ToolSet
from fanfold.tools.tool import InProcess


@attrs.define
class Recording:
    """An in-process tool that notes the code of the task each call ran in."""

    outcome: BaseException | str = "noted"
    ran_in: list[str] = attrs.field(factory=list)

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec.from_schema("note", "notes", {"type": "object", "properties": {}})

    def answer(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        self.ran_in.append(trio.lowlevel.current_task().coro.cr_code.co_qualname)
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return ToolOutput.ok(self.outcome)

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        return self.answer(args, cwd)


def test_the_tool_set_says_which_calls_it_answers_in_process() -> None:
    tools = ToolSet.default(extra=[Recording()])
    assert isinstance(ThinkTool(), InProcess)
    assert tools.in_process("think") and tools.in_process("note")
    assert tools.in_process("no_such_tool")  # an error result: nothing to run
    assert not tools.in_process("bash") and not tools.in_process("read_file")
    answered = tools.answer(ToolCall("c1", "think", '{"thought": "x"}'), "/")
    assert (answered.tool_call_id, answered.content, answered.is_error) == ("c1", "ok", False)
    unknown = tools.answer(ToolCall("c2", "no_such_tool", "{}"), "/")
    assert unknown.is_error and "unknown tool 'no_such_tool'" in unknown.content
    bad = tools.answer(ToolCall("c3", "think", "{}"), "/")
    assert bad.is_error and "thought" in bad.content
    with pytest.raises(ValueError, match="not answered in-process"):
        tools.answer(ToolCall("c4", "bash", '{"command": "true"}'), "/")


async def test_same_result_in_process_as_from_run() -> None:
    tools = ToolSet.default()
    call = ToolCall("c1", "think", '{"thought": "x"}')
    assert tools.answer(call, "/") == await tools.run(call, "/")


async def _run(tmp_path: Path, tool: Recording) -> list[ToolFinished]:
    provider = script(0.5, root=[reply("", ("note", {}), think()), reply("done")])
    async with Runtime.open(
        tmp_path / "log.db",
        provider,
        ToolSet.default(extra=[tool]),
        limits=Limits(),
        logger=quiet_logger(),
        threaded_writes=False,
    ) as runtime:
        conversation_id = await runtime.start("go", cwd=tmp_path)
        result = await runtime.wait(conversation_id)
        assert (result.phase, result.text) == ("Idle", "done")
        events = runtime.store.events(conversation_id)
    return [e.event for e in events if isinstance(e.event, ToolFinished)]


async def test_an_in_process_tool_runs_in_the_engines_task(
    tmp_path: Path, autojump_clock: object
) -> None:
    tool = Recording()
    finished = await _run(tmp_path, tool)
    # Not in a worker or a task of its own: in the engine's round.
    assert tool.ran_in == ["Engine.run"]
    assert [(f.result.name, f.result.content, f.result.is_error) for f in finished] == [
        ("note", "noted", False),
        ("think", "ok", False),
    ]


async def test_an_in_process_tool_that_raises_gets_a_crashed_result(
    tmp_path: Path, autojump_clock: object
) -> None:
    tool = Recording(outcome=RuntimeError("boom"))
    finished = await _run(tmp_path, tool)
    assert tool.ran_in == ["Engine.run"]
    crashed = finished[0].result
    assert crashed.is_error and crashed.content == "tool crashed: RuntimeError: boom"
    assert finished[1].result.content == "ok"  # the conversation went on


@attrs.define
class _Answers:
    """The default tool set, noting each result it answers in-process."""

    tools: ToolSet = attrs.field(factory=ToolSet.default)
    answered: list[ToolResult] = attrs.field(factory=list)

    def specs(self) -> Any:
        return self.tools.specs()

    def in_process(self, name: str) -> bool:
        return self.tools.in_process(name)

    def answer(self, call: ToolCall, cwd: str, **kw: Any) -> ToolResult:
        self.answered.append(self.tools.answer(call, cwd, **kw))
        return self.answered[-1]

    async def run(self, call: ToolCall, cwd: str, **kw: Any) -> ToolResult:
        return await self.tools.run(call, cwd, **kw)


async def test_a_result_with_nothing_to_redact_is_not_copied(
    tmp_path: Path, autojump_clock: object
) -> None:
    # The redaction of a result makes a new one only when it removed something: a copy
    # per tool call (attrs.evolve) cost more than the check (issue 21). Redacted ones
    # are still copied (tests/test_tools_secrets.py).
    tools = _Answers()
    seen: list[ToolResult] = []

    def observe(before: Any, after: Any, event: Any, effects: Any) -> None:
        if isinstance(event, ToolFinished):
            seen.append(event.result)

    provider = script(0.5, root=[reply("", think(), think()), reply("done")])
    async with Runtime.open(
        tmp_path / "log.db",
        provider,
        tools,
        limits=Limits(),
        logger=quiet_logger(),
        observer=observe,
        redact=lambda text: text.replace("SECRET", "[redacted]"),
    ) as runtime:
        await runtime.wait(await runtime.start("go", cwd=tmp_path))
    assert len(seen) == 2 and all(a is b for a, b in zip(seen, tools.answered, strict=True))


async def test_a_result_with_a_secret_is_redacted_in_its_event(
    tmp_path: Path, autojump_clock: object
) -> None:
    provider = script(0.5, root=[reply("", ("note", {})), reply("done")])
    async with Runtime.open(
        tmp_path / "log.db",
        provider,
        ToolSet.default(extra=[Recording(outcome="the SECRET is out")]),
        limits=Limits(),
        logger=quiet_logger(),
        redact=lambda text: text.replace("SECRET", "[redacted]"),
    ) as runtime:
        conversation_id = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(conversation_id)
        events = runtime.store.events(conversation_id)
    finished = [e.event for e in events if isinstance(e.event, ToolFinished)]
    assert [f.result.content for f in finished] == ["the [redacted] is out"]
