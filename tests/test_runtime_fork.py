"""``Runtime.fork`` (issue 24): ``fanfold fork`` from Python, with the same edits, on a
real SQLite file, continued on the runtime that forked it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
import pytest
from runtime_helpers import open_runtime, reply, script, spawn, submit

from fanfold import replay
from fanfold.db import Store
from fanfold.statemachine import (
    ChildSucceeded,
    LimitsEdit,
    ModelReply,
    ReplyEdit,
    SystemPromptEdit,
    TaskEdit,
    ToolCall,
)


def _provider() -> Any:
    # The root delegates two tasks; root/1 runs a command, then submits its output;
    # root/2 answers in text. A fork goes on with the same script: replies are per
    # place and round.
    return script(
        0.0,
        root=[reply("", spawn("a", "b")), reply("the answer is {{last_tool_result}}")],
        c1=[
            reply("", ("bash", {"command": "echo 42"})),
            reply("", submit("{{last_tool_result}}")),
        ],
        c2=[reply("b done")],
    )


def _events(store: Store, root: str) -> list[Any]:
    return [(row.id, store.events(row.id)) for row in store.tree(root)]


async def test_a_sub_agent_forked_with_an_edited_reply_goes_on_here(tmp_path: Path) -> None:
    async with open_runtime(tmp_path, _provider()) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root)
        before = _events(runtime.store, root)
        edit = ReplyEdit(ModelReply("", (ToolCall.of("e1", "bash", {"command": "echo 99"}),)))
        fork = await runtime.fork(root, 0, agent="root/1", edit=edit, new_id="f", go_on=True)
        assert fork == "f"
        result = await runtime.wait(fork)
        assert result.outcome == "answered"
        child = runtime.state("f.1")
        assert isinstance(child.outcome, ChildSucceeded)
        assert child.outcome.result.startswith("99\n")  # the edited call ran, live
        assert runtime.store.conversation("f.1").forked_from == f"{root}.1"
        assert replay.verify(runtime.store, fork, tree=True).ok
        assert _events(runtime.store, root) == before  # the source is untouched


async def test_a_root_at_rest_is_forked_alone_with_its_edit_recorded(tmp_path: Path) -> None:
    async with open_runtime(tmp_path, _provider()) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root)
        last = runtime.store.conversation(root).last_seq
        edit = SystemPromptEdit("be terse")
        fork = await runtime.fork(root, last, edit=edit, go_on=True)
        assert runtime.store.load_state(fork).system_prompt == "be terse"
        assert runtime.store.conversation(fork).last_seq == 1  # the edit, at seq 1
        assert [row.id for row in runtime.store.tree(fork)] == [fork]
        assert runtime.running() == ()  # at rest: nothing goes on until a message


@pytest.mark.parametrize(
    ("where", "edit", "go_on", "message"),
    [
        (("root/1", 1), TaskEdit("x"), True, "TaskEdit is legal in"),
        (("root/1", 0), TaskEdit("x"), False, "add --continue (Runtime.fork: go_on=True)"),
    ],
)
async def test_an_edit_that_does_not_fit_raises_and_writes_nothing(
    tmp_path: Path, where: tuple[str, int], edit: TaskEdit, go_on: bool, message: str
) -> None:
    async with open_runtime(tmp_path, _provider()) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root)
        roots = runtime.store.list_roots()
        agent, seq = where
        with pytest.raises(replay.EditRefused, match=re.escape(message)):
            await runtime.fork(root, seq, agent=agent, edit=edit, go_on=go_on)
        assert runtime.store.list_roots() == roots
        assert runtime.running() == ()


async def test_a_tree_fork_without_go_on_waits_for_resume(tmp_path: Path) -> None:
    async with open_runtime(tmp_path, _provider()) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root)
        fork = await runtime.fork(root, 1, agent="2")
        assert runtime.running() == ()
        assert runtime.store.conversation(fork).status == "running"
        assert await runtime.resume([fork])
        assert (await runtime.wait(fork)).text.startswith("the answer is")


async def test_a_limits_edit_from_python(tmp_path: Path) -> None:
    async with open_runtime(tmp_path, _provider()) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root)
        at_zero = replay.state_at(runtime.store, f"{root}.1", 0)
        edit = LimitsEdit(attrs.evolve(at_zero.limits, max_rounds=1))
        fork = await runtime.fork(root, 0, agent="1", edit=edit, go_on=True)
        await runtime.wait(fork)
        child = runtime.state(f"{fork}.1")
        assert child.limits.max_rounds == 1
        assert isinstance(child.outcome, ChildSucceeded)  # it submitted in its grace round
        assert child.rounds == 1
