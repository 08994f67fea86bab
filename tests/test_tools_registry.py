"""ToolSet: lookup, argument checks and which failures become error results."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from fanfold.statemachine import ToolCall, ToolResult, ToolSpec
from fanfold.tools import (
    PathPolicy,
    SchemaError,
    ThinkTool,
    ToolInputError,
    ToolOutput,
    ToolRunner,
    ToolSet,
)


@attrs.frozen
class Raising:
    """A test tool that raises whatever it is given."""

    error: BaseException
    name: str = "raising"

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec.from_schema(self.name, "raises", {"type": "object", "properties": {}})

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        raise self.error


async def run(tools: ToolSet, name: str, arguments_json: str = "{}") -> ToolResult:
    return await tools.run(ToolCall("id-1", name, arguments_json), "/")


def test_default_tool_set() -> None:
    tools = ToolSet.default()
    assert tools.names == ("bash", "read_file", "write_file", "edit_file", "think", "grep", "glob")
    assert tuple(s.name for s in tools.specs()) == tools.names
    assert "bash" in tools
    assert "spawn_agents" not in tools
    assert tools.get("nope") is None
    runner: ToolRunner = tools
    assert runner.specs() == tools.specs()


def test_default_policy_is_cwd_and_can_be_changed() -> None:
    assert PathPolicy().mode == "cwd"
    read_file = ToolSet.default(policy=PathPolicy("any")).get("read_file")
    assert read_file is not None
    assert attrs.asdict(read_file)["policy"] == {"mode": "any"}  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PathPolicy("home")  # type: ignore[arg-type]


def test_construction_refuses_duplicates_control_tools_and_bad_schemas() -> None:
    with pytest.raises(ValueError, match="duplicate tool name 'think'"):
        ToolSet([ThinkTool(), ThinkTool()])
    with pytest.raises(ValueError, match="'submit_result' is a control tool"):
        ToolSet([Raising(RuntimeError(), name="submit_result")])

    @attrs.frozen
    class BadSchema(Raising):
        @property
        def spec(self) -> ToolSpec:
            return ToolSpec.from_schema("bad", "x", {"type": "object", "oneOf": []})

    with pytest.raises(SchemaError, match="bad: not a valid JSON Schema: at oneOf"):
        ToolSet([BadSchema(RuntimeError())])


async def test_unknown_tool_is_an_error_result() -> None:
    result = await run(ToolSet.default(), "python")
    assert result == ToolResult(
        "id-1",
        "python",
        "unknown tool 'python'. Available tools: bash, read_file, write_file, edit_file, think, "
        "grep, glob",
        is_error=True,
    )


@pytest.mark.parametrize(
    ("arguments_json", "message"),
    [
        ('{"command": ', "bash: the arguments are not valid JSON (Expecting value"),
        ('["ls"]', 'bash: the arguments must be a JSON object, got ["ls"]'),
        ('"ls"', 'bash: the arguments must be a JSON object, got "ls"'),
        ("", "bash: missing required argument 'command'"),
        ("{}", "bash: missing required argument 'command'"),
        ('{"command": ["ls"]}', "bash: argument 'command' must be a string, got an array"),
        ('{"cmd": "ls"}', "bash: missing required argument 'command'; unknown argument 'cmd'"),
    ],
)
async def test_bad_arguments_are_error_results(arguments_json: str, message: str) -> None:
    result = await run(ToolSet.default(), "bash", arguments_json)
    assert result.is_error
    assert result.tool_call_id == "id-1"
    assert result.name == "bash"
    assert result.content.startswith(message), result.content


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (ToolInputError("that will not do"), "raising: that will not do"),
        (
            FileNotFoundError(2, "No such file or directory", "/x"),
            "raising: No such file or directory (/x)",
        ),
        (PermissionError(13, "Permission denied"), "raising: Permission denied"),
        (OSError("disk on fire"), "raising: disk on fire"),
        (
            UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
            "raising: input is not valid UTF-8 text (invalid start byte)",
        ),
        (trio.TooSlowError(), "raising: timed out"),
    ],
)
async def test_input_os_and_timeout_errors_become_error_results(
    error: BaseException, message: str
) -> None:
    result = await run(ToolSet([Raising(error)]), "raising")
    assert result == ToolResult("id-1", "raising", message, is_error=True)


@pytest.mark.parametrize(
    "error", [RuntimeError("bug"), KeyError("bug"), TypeError("bug"), AssertionError()]
)
async def test_bugs_propagate(error: BaseException) -> None:
    with pytest.raises(type(error)):
        await run(ToolSet([Raising(error)]), "raising")


async def test_cancellation_propagates() -> None:
    class Sleeper(Raising):
        async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
            await trio.sleep_forever()
            raise AssertionError("unreachable")

    with trio.move_on_after(0.01) as scope:
        await run(ToolSet([Sleeper(RuntimeError())]), "raising")
    assert scope.cancelled_caught


async def test_successful_result_carries_call_id_and_name(tmp_path: Path) -> None:
    tools = ToolSet.default()
    result = await tools.run(ToolCall.of("abc", "think", {"thought": "hmm"}), str(tmp_path))
    assert result == ToolResult("abc", "think", "ok", is_error=False)


@attrs.frozen
class Flood:
    """A tool of a program's own that does not cap its output."""

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec.from_schema("flood", "floods", {"type": "object", "properties": {}})

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        return ToolOutput.ok("a" * 60_000 + "b" * 600_000)


async def test_every_tools_output_is_capped_by_the_tool_set() -> None:
    result = await run(ToolSet([Flood()]), "flood")
    assert len(result.content) < 100_300
    assert result.content.startswith("a" * 50_000)
    assert result.content.endswith("b" * 50_000)
    assert "560000 characters omitted" in result.content


def test_a_tool_that_says_it_is_read_only_has_a_read_only_spec() -> None:
    """A tool object's ``read_only`` attribute goes into the spec the log records (what
    the reducer's ``read-only`` rule reads); fanfold's own reading tools keep their
    specs unmarked (``READING_TOOLS`` names them), as older logs hold them."""

    @attrs.frozen
    class Peek(Raising):
        read_only: bool = True

    tools = ToolSet.default(extra=[Peek(ValueError(), name="peek"), Raising(ValueError())])
    marked = {spec.name for spec in tools.specs() if spec.read_only}
    assert marked == {"peek"}
    assert tools.read_only("grep") and tools.read_only("peek")
