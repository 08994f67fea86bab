"""A root's time limit through the runtime: ``Runtime.start(timeout=)`` and the
``timeout`` of the agent definition a delegated root runs as (``fanfold mcp``'s
``delegate_task``). Before, a root had none: a delegated agent whose definition says
``timeout: 2`` ran for as long as its model and children took."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing
from runtime_helpers import open_runtime, reply, script, spawn, submit

from fanfold import replay
from fanfold.statemachine import TurnOutcome
from fanfold.statemachine.agent_defs import AgentDefinition


async def test_a_delegated_roots_agent_timeout_bounds_its_turn(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = script(
        1.0,
        root=[reply("delegating", spawn("slow part")), reply("never reached")],
        c1=[{"text": "", "latency": 600.0}, reply("", submit("too late"))],
    )
    slow = AgentDefinition(name="reviewer", description="reviews", timeout=5.0)
    async with open_runtime(tmp_path, provider) as runtime:
        started = trio.current_time()
        root = await runtime.start("review", cwd=tmp_path, agent=slow)
        result = await runtime.wait(root)
        took = trio.current_time() - started
        child = runtime.state(root + ".1")
        assert replay.verify(runtime.store, root, tree=True).ok
    assert result.outcome is TurnOutcome.ERROR
    assert result.text == "time limit of 5.0s reached"
    assert result.phase == "Error"
    assert type(child.phase).__name__ == "Failed"  # cancelled with its parent's turn
    assert took < 600.0


async def test_the_start_timeout_is_capped_by_the_agents(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = script(100.0, root=[reply("late answer")])
    agent = AgentDefinition(name="quick", description="q", timeout=3.0)
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("go", cwd=tmp_path, agent=agent, timeout=50.0)
        result = await runtime.wait(root)
        assert runtime.state(root).timeout == 3.0
    assert result.text == "time limit of 3.0s reached"


async def test_a_turn_within_its_time_limit_answers(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = script(1.0, root=[reply("quick answer"), reply("second answer")])
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("go", cwd=tmp_path, timeout=3.0)
        assert (await runtime.wait(root)).text == "quick answer"
        # Each turn has the whole limit: the first's time does not count.
        await trio.sleep(10.0)
        await runtime.send(root, "more")
        assert (await runtime.wait(root)).text == "second answer"
        assert replay.verify(runtime.store, root, tree=True).ok
