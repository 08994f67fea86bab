"""A fork edit built from Python whose task or system prompt is not a text (``TaskEdit(1)``)
is refused by the reducer with a typed error, so ``fork_at`` refuses it before anything is
written (it used to be accepted, and failed only when the log encoded it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sm_support as sm
from runtime_helpers import open_runtime
from test_runtime_fork import _provider

from fanfold import replay
from fanfold.statemachine import (
    ForkEdited,
    IllegalTransition,
    Limits,
    SystemPromptEdit,
    TaskEdit,
    transition,
)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (TaskEdit(1), "TaskEdit's task must be a text, not int"),  # type: ignore[arg-type]
        (TaskEdit(b"x"), "TaskEdit's task must be a text, not bytes"),  # type: ignore[arg-type]
        (SystemPromptEdit(1), "SystemPromptEdit's system_prompt must be a text, not int"),  # type: ignore[arg-type]
    ],
)
def test_a_fork_edit_whose_text_is_not_a_str_is_an_illegal_transition(
    edit: TaskEdit | SystemPromptEdit, message: str
) -> None:
    child = sm.child(Limits())  # a sub-agent before its first reply: a TaskEdit's place
    event = ForkEdited(edit)
    with pytest.raises(IllegalTransition, match=re.escape(message)) as refused:
        transition(child, event)
    assert refused.value.event is event and refused.value.state is child
    # A text in the same place is still accepted.
    assert transition(child, ForkEdited(type(edit)("other")))[0] != child


async def test_fork_refuses_a_task_edit_of_an_int_and_writes_nothing(tmp_path: Path) -> None:
    async with open_runtime(tmp_path, _provider()) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root)
        roots = runtime.store.list_roots()
        with pytest.raises(replay.EditRefused, match="TaskEdit's task must be a text, not int"):
            await runtime.fork(root, 0, agent="root/1", edit=TaskEdit(1), go_on=True)  # type: ignore[arg-type]
        assert runtime.store.list_roots() == roots
        assert runtime.running() == ()
