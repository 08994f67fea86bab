"""Issue 33, item 9: a ``read-only`` refusal of an MCP tool says that its server does not
mark it ``readOnlyHint``; a task longer than ``MAX_TASK_CHARS`` (``spawn_agents``'
in the reducer, ``delegate_task``'s at the MCP tool's boundary) is an error result
naming the limit, and nothing of it is started or stored twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from sm_support import of_type, replied, root, spawn, step, tool, tool_results, user

from fanfold.statemachine import Limits, SpawnSubAgent, ToolSpec, control_tools
from fanfold.statemachine.control_tools import parse_task
from fanfold.statemachine.permissions import Permissions, Rule, RuleSet

ECHO = ToolSpec.from_schema("mcp__ok__echo", "Echo", {"type": "object"}, read_only=True)
# (Read so, not imported, so that this file runs against the code before the limit
# and fails there by what it checks.)
MAX_TASK_CHARS: int = getattr(control_tools, "MAX_TASK_CHARS", 1_000_000)
READ_ONLY = Permissions((RuleSet(allow=(Rule("read-only"),), source="agent 'looker'"),))


def test_a_read_only_refusal_of_an_mcp_tool_names_the_missing_read_only_hint() -> None:
    # Offered only what read-only takes; the model calls the others all the same. (A
    # conversation created with today's wording: the runtime records it.)
    state = root(tools=(ECHO,), permissions=READ_ONLY, wording=1)
    state, _ = step(state, user("go"))
    calls = (tool("c1", "mcp__ok__add", a=1), tool("c2", "peek", x=1))
    state, _ = step(state, replied(state, *calls))
    added, peeked = tool_results(state)
    assert added.is_error and added.content == (
        "mcp__ok__add refused: no allow rule of agent 'looker' matches this call (allowed: "
        "read-only); read-only takes an MCP tool only if its server marks it readOnlyHint, "
        "and server 'ok' does not mark 'mcp__ok__add'"
    )
    # Any other tool keeps the wording older logs recorded (they verify as they are).
    assert peeked.content == (
        "peek refused: no allow rule of agent 'looker' matches this call (allowed: read-only)"
    )


def test_a_spawn_task_longer_than_the_limit_is_an_error_result_naming_it() -> None:
    exact = "x" * MAX_TASK_CHARS
    assert not isinstance(parse_task({"task": exact}), str)
    too_long = exact + "y"
    assert parse_task({"task": too_long}) == (
        f"'task' is too long ({MAX_TASK_CHARS + 1} characters, at most {MAX_TASK_CHARS})"
    )
    state = root(Limits())
    state, _ = step(state, user("go"))
    state, effects = step(state, replied(state, spawn("s1", too_long, "short one")))
    (spawned,) = of_type(effects, SpawnSubAgent)  # the short one only
    assert spawned.task == "short one"
    children = state.children
    assert children is not None
    (rejected,) = children.rejected
    assert rejected.error.startswith("not spawned: 'task' is too long (1000001 characters")
    # Named by its start: the state holds no second copy of the whole task.
    assert rejected.task == "x" * 200 + f"... [{MAX_TASK_CHARS + 1} characters]"


async def test_delegate_task_refuses_a_task_longer_than_the_limit(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    from runtime_helpers import open_runtime

    from fanfold.providers.scripted import ScriptedProvider
    from fanfold.serve.mcp_server import DelegationError, DelegationLedger, DelegationService

    script = {"agents": [{"match": {"path": "root"}, "replies": [{"text": "done"}]}]}
    async with open_runtime(tmp_path, ScriptedProvider(script)) as runtime:
        service = DelegationService(
            runtime,
            cwd=tmp_path,
            agents=(),
            limits=Limits(),
            system_prompt="",
            ledger=DelegationLedger(tmp_path / "log.db"),
        )
        with pytest.raises(DelegationError) as refused:
            await service.delegate(None, "t" * (MAX_TASK_CHARS - 5), "context", None, True)
        assert str(refused.value).startswith(
            f"the task is too long ({MAX_TASK_CHARS + 4} characters with its context, "
            f"at most {MAX_TASK_CHARS})"
        )
        assert runtime.store.list_roots() == []  # nothing written
        assert not (tmp_path / "log.db.mcp-delegations").exists()
        answer = await service.delegate(None, "short", None, None, False)
    assert answer["status"] == "completed"
