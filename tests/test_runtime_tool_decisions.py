"""The runtime runs a tool call as the reducer's ``RunTool`` says, and decides nothing
from the state itself: whether bash is confined (the git guard) and which rules a file
tool's path must pass through its symbolic links come from the effect.

Each test makes the reducer decide otherwise than the conversation's rules would (its
``_run_tool`` replaced), through the real runtime, real tools and a real log: a runtime
that still asked the state would run the call the other way."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import attrs
import pytest
from runtime_helpers import reply, script, spawn, submit, think

from fanfold.db import Store
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import Limits, RunTool, ToolCall, ToolResult, ToolResultMessage
from fanfold.statemachine.agent_defs import AgentDefinition
from fanfold.statemachine.permissions import PathRules, Permissions, Rule, RuleSet
from fanfold.tools.registry import ToolSet

# The module (the package's name ``transition`` is the function).
reducer = importlib.import_module("fanfold.statemachine.transition")


class _Recording:
    """The default tools, noting how each call was asked to run: (tool, confined)."""

    def __init__(self) -> None:
        self.base = ToolSet.default()
        self.seen: list[tuple[str, bool]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    async def run(self, call: ToolCall, cwd: str, *, confined: bool = False) -> ToolResult:
        self.seen.append((call.name, confined))
        return await self.base.run(call, cwd, confined=confined)

    def answer(self, call: ToolCall, cwd: str, *, confined: bool = False) -> ToolResult:
        self.seen.append((call.name, confined))
        return self.base.answer(call, cwd, confined=confined)


def _deciding(monkeypatch: pytest.MonkeyPatch, **decisions: Any) -> None:
    """Make the reducer put ``decisions`` on every RunTool it issues."""
    issue = reducer._run_tool

    def run_tool(*args: Any) -> RunTool:
        run: RunTool = attrs.evolve(issue(*args), **decisions)
        return run

    monkeypatch.setattr(reducer, "_run_tool", run_tool)


async def _run(tmp_path: Path, provider: Any, tools: _Recording, **start: Any) -> str:
    async with Runtime.open(
        tmp_path / "log.db",
        provider,
        tools,
        limits=Limits(),
        logger=quiet_logger(),
        threaded_writes=False,
    ) as runtime:
        root_id = await runtime.start("go", cwd=tmp_path, **start)
        await runtime.wait(root_id)
    return root_id


def _results(tmp_path: Path, conversation_id: str) -> list[ToolResult]:
    with Store.open(tmp_path / "log.db") as store:
        state = store.load_state(conversation_id)
    return [m.result for m in state.history if isinstance(m, ToolResultMessage)]


async def test_a_call_the_reducer_confines_runs_confined_whatever_the_rules_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root has no rules (``confines_commands`` is False for it): told by the
    reducer, its bash runs through the git guard and its in-process tool is answered
    confined too."""
    _deciding(monkeypatch, confined=True)
    tools = _Recording()
    provider = script(0.0, root=[reply("", ("bash", {"command": "echo hi"}), think()), reply("ok")])
    await _run(tmp_path, provider, tools)
    assert tools.seen == [("bash", True), ("think", True)]


async def test_a_call_the_reducer_leaves_unconfined_runs_unconfined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other way: an agent whose bash only allow patterns permit (the runtime once
    confined it from its rules) runs unguarded when the effect says so."""
    _deciding(monkeypatch, confined=False)
    tools = _Recording()
    lister = AgentDefinition("lister", "lists", allow=(Rule("bash", "ls*"), Rule("read-only")))
    provider = script(
        0.0,
        root=[reply("", spawn({"task": "t", "agent": "lister"})), reply("done")],
        c1=[reply("", ("bash", {"command": "ls"})), reply("", submit("listed"))],
    )
    await _run(tmp_path, provider, tools, agents=(lister,))
    assert tools.seen == [("bash", False)]


async def test_the_rules_a_path_must_pass_through_its_links_come_from_the_effect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root has no rules; the reducer gives its write_file the rule
    ``write_file(docs/**)``: a write through ``docs/link -> ../src`` is refused, one
    through a link that stays in ``docs/`` is written."""
    (tmp_path / "src").mkdir()
    (tmp_path / "docs" / "inner").mkdir(parents=True)
    (tmp_path / "docs" / "link").symlink_to("../src")
    (tmp_path / "docs" / "same").symlink_to("inner")
    layer = RuleSet((Rule("write_file", "docs/**"),), (), "the test", str(tmp_path))
    rules = Permissions((layer,))
    _deciding(monkeypatch, path_rules=PathRules(rules))
    provider = script(
        0.0,
        root=[
            reply(
                "",
                ("write_file", {"path": "docs/link/evil.py", "content": "x"}),
                ("write_file", {"path": "docs/same/fine.md", "content": "y"}),
            ),
            reply("ok"),
        ],
    )
    root_id = await _run(tmp_path, provider, _Recording())
    assert not (tmp_path / "src" / "evil.py").exists()
    assert (tmp_path / "docs" / "inner" / "fine.md").read_text() == "y"
    refused, written = _results(tmp_path, root_id)
    assert refused.is_error and not written.is_error
    assert refused.content == (
        "write_file refused: no allow rule of the test matches this call (allowed: "
        "write_file(docs/**)): 'docs/link/evil.py' leads to 'src/evil.py' through a "
        "symbolic link"
    )
