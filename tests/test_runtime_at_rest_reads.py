"""``Conversation.at_rest`` is read once per step on the step path (issue 21: it was read
3.6 times per step, each read building the union of four phase classes anew)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given

from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import Conversation, Limits
from fanfold.statemachine.phases import Completed, Error, Failed, Idle
from fanfold.testing import conversations
from fanfold.tools import ToolSet

THINK = {"name": "think", "arguments": {"thought": "working"}}
SUBMIT = {"name": "submit_result", "arguments": {"result": "done"}}
SPAWN = {"name": "spawn_agents", "arguments": {"tasks": [{"task": f"t{i}"} for i in range(10)]}}


_AT_REST = Conversation.__dict__["at_rest"]
assert isinstance(_AT_REST, property)


class _Steps:
    def __init__(self) -> None:
        self.count = 0

    def step(self, *args: Any) -> None:
        self.count += 1


async def test_at_rest_is_read_about_once_per_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per step: one read when the step is made (its snapshot, its waiters and its
    lifecycle line share it) and one by the step's fingerprint; before, the snapshot
    and the waiters (and the lifecycle line, when logged) each read it again."""
    reads = 0
    real = _AT_REST.fget
    assert real is not None

    def counted(state: Conversation) -> bool:
        nonlocal reads
        # Reads made to unload a settled actor (once per committed batch, not per
        # step) or for an API caller's wait are not the step's.
        if sys._getframe(1).f_code.co_name not in ("settled", "wait_at_rest"):
            reads += 1
        return bool(real(state))

    monkeypatch.setattr(Conversation, "at_rest", property(counted))
    script = {
        "agents": [
            {"match": {"path": "root"}, "replies": [{"tool_calls": [SPAWN]}, {"text": "ok"}]},
            {
                "match": {"depth": 1},
                "replies": [{"tool_calls": [THINK]}] * 2 + [{"tool_calls": [SUBMIT]}],
            },
        ]
    }
    steps = _Steps()
    async with Runtime.open(
        str(tmp_path / "log.db"),
        ScriptedProvider(script),
        ToolSet.default(),
        limits=Limits(),
        logger=quiet_logger(),
        step_observers=[steps],
    ) as runtime:
        root = await runtime.start("work", cwd=str(tmp_path))
        await runtime.wait(root)
        assert type(runtime.state(root).phase) is Idle
    assert steps.count >= 70  # root: 4 and more, each of 10 children: 7
    assert reads <= 2 * steps.count, (reads, steps.count)


@given(conversations())
def test_at_rest_is_true_exactly_for_the_phases_at_rest(state: Conversation) -> None:
    assert state.at_rest is isinstance(state.phase, Idle | Error | Completed | Failed)
