"""A program continuing a tree with ``Runtime.resume``/``send``/``attach`` on a tool set
that lacks a Python tool the tree recorded is told so (``MissingTools``), before
anything is recorded, instead of every call of that tool getting "unknown tool"."""

from __future__ import annotations

import sqlite3
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
import trio
import trio.testing
from runtime_helpers import reply, script

import fanfold
from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import MissingTools, Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import Limits, ToolSpec
from fanfold.tools.registry import ToolSet, unsupplied


@fanfold.tool
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: The key.
    """
    return f"value of {key}"


def _open(
    tmp_path: Path, provider: ScriptedProvider, *, with_lookup: bool
) -> AbstractAsyncContextManager[Runtime]:
    tools = ToolSet.default(extra=[lookup]) if with_lookup else ToolSet.default()
    return Runtime.open(
        tmp_path / "log.db",
        provider,
        tools,
        limits=Limits(),
        logger=quiet_logger(),
        threaded_writes=False,
    )


def _counts(tmp_path: Path) -> tuple[int, int, int]:
    """Rows of events, effects and tree records: what a continuation would add to."""
    with sqlite3.connect(tmp_path / "log.db") as db:
        return (
            db.execute("select count(*) from events").fetchone()[0],
            db.execute("select count(*) from effects").fetchone()[0],
            db.execute("select count(*) from trees").fetchone()[0],
        )


async def _unfinished_trees(tmp_path: Path) -> tuple[str, str]:
    """Two trees cut while their model call is in flight: one started with ``lookup``,
    one without. Both stay unfinished in the log."""
    slow = script(1.0, root=[reply("never", latency=1000.0)])
    async with _open(tmp_path, slow, with_lookup=True) as runtime:
        with_tool = await runtime.start("go", cwd=tmp_path)
        await trio.sleep(1.0)
    async with _open(tmp_path, slow, with_lookup=False) as runtime:
        without = await runtime.start("go", cwd=tmp_path)
        await trio.sleep(1.0)
    return with_tool, without


async def _idle_tree(tmp_path: Path) -> str:
    """A tree started with ``lookup`` that answered and is at rest."""
    quick = script(0.0, root=[reply("hi")])
    async with _open(tmp_path, quick, with_lookup=True) as runtime:
        root: str = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root)
    return root


def _done() -> ScriptedProvider:
    return script(0.0, root=[reply("done"), reply("done again")])


async def test_resume_naming_a_tree_whose_tool_is_missing_raises_and_writes_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with_tool, _ = await _unfinished_trees(tmp_path)
    before = _counts(tmp_path)
    async with _open(tmp_path, _done(), with_lookup=False) as runtime:
        with pytest.raises(MissingTools) as raised:
            await runtime.resume([with_tool])
        assert raised.value.root_id == with_tool
        assert raised.value.names == ("lookup",)
        assert "'lookup'" in str(raised.value) and with_tool in str(raised.value)
        assert isinstance(raised.value, ValueError)
        assert runtime.running() == ()
    assert _counts(tmp_path) == before


async def test_resume_of_all_skips_a_tree_whose_tool_is_missing_and_resumes_the_others(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with_tool, without = await _unfinished_trees(tmp_path)
    with sqlite3.connect(tmp_path / "log.db") as db:
        query = "select count(*) from events where conversation_id = ?"
        before = db.execute(query, (with_tool,)).fetchone()[0]
    async with _open(tmp_path, _done(), with_lookup=False) as runtime:
        plan = runtime.resume_plan()
        assert plan.roots == (without,)
        (skip,) = plan.skipped
        assert skip.root_id == with_tool and "'lookup'" in skip.reason
        assert await runtime.resume() == [without]
        assert (await runtime.wait(without)).text == "done"
        assert runtime.store.conversation(with_tool).status == "running"  # left as it was
    with sqlite3.connect(tmp_path / "log.db") as db:
        assert db.execute(query, (with_tool,)).fetchone()[0] == before


@pytest.mark.parametrize("how", ["send", "attach"])
async def test_send_and_attach_refuse_a_tree_whose_tool_is_missing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, how: str
) -> None:
    root = await _idle_tree(tmp_path)
    before = _counts(tmp_path)
    async with _open(tmp_path, _done(), with_lookup=False) as runtime:
        with pytest.raises(MissingTools) as raised:
            if how == "send":
                await runtime.send(root, "more")
            else:
                runtime.attach(root)
        assert raised.value.root_id == root and raised.value.names == ("lookup",)
        assert runtime.running() == ()
    assert _counts(tmp_path) == before


async def test_fork_going_on_refuses_a_tree_whose_tool_is_missing_before_writing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with_tool, _ = await _unfinished_trees(tmp_path)
    before = _counts(tmp_path)
    async with _open(tmp_path, _done(), with_lookup=False) as runtime:
        with pytest.raises(MissingTools) as raised:
            await runtime.fork(with_tool, 1, go_on=True)
        assert raised.value.root_id == with_tool and raised.value.names == ("lookup",)
    assert _counts(tmp_path) == before
    async with _open(tmp_path, _done(), with_lookup=True) as runtime:
        fork = await runtime.fork(with_tool, 1, go_on=True)
        assert (await runtime.wait(fork)).text == "done"


def test_unsupplied_leaves_out_built_in_control_and_mcp_tools() -> None:
    """What a runtime (or ``--tools``) must supply: only the Python tools; MCP tools
    are bound to servers on their first call or answered with an error naming one."""
    recorded = [
        ToolSpec(name, "d", '{"type": "object"}')
        for name in ("bash", "submit_result", "mcp__files__read", "lookup", "other", "lookup")
    ]
    assert unsupplied(recorded, ["other"]) == ["lookup"]


async def test_with_the_tool_supplied_resume_send_and_attach_go_on(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with_tool, _ = await _unfinished_trees(tmp_path)
    idle = await _idle_tree(tmp_path)
    async with _open(tmp_path, _done(), with_lookup=True) as runtime:
        assert runtime.resume_plan().skipped == ()
        assert await runtime.resume([with_tool]) == [with_tool]
        assert (await runtime.wait(with_tool)).text == "done"
        runtime.attach(idle)
        await runtime.send(idle, "more")
        assert (await runtime.wait(idle)).text == "done again"  # the script's next reply
    assert _counts(tmp_path)[0] > 0
