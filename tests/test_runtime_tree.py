"""End-to-end runs of conversation trees through the Trio runtime.

Scripted provider, Trio's autojump clock (virtual time: exact and instant), real SQLite
files under tmp_path, and the real tool set.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trio.testing
from runtime_helpers import open_runtime, reply, script, spawn, submit, think

from fanfold import replay
from fanfold.db import Store
from fanfold.providers.base import CallContext, ProviderError
from fanfold.statemachine import (
    Completed,
    ErrorKind,
    Failed,
    IllegalTransition,
    Limits,
    ModelError,
    ModelReply,
    ModelRequest,
    SubAgentFinished,
    ToolResultMessage,
    TurnOutcome,
)
from fanfold.statemachine.transition import CANCELLED_RESULT


def fan_in(state_history: Any) -> dict[str, Any]:
    """The parsed spawn_agents result in a history."""
    for message in state_history:
        if isinstance(message, ToolResultMessage) and message.result.name == "spawn_agents":
            parsed: dict[str, Any] = json.loads(message.result.content)
            return parsed
    raise AssertionError("no spawn_agents result in the history")


async def test_parallel_fan_out_and_fan_in(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = script(
        1.0,
        root=[reply("delegating", spawn("a", "b", "c")), reply("all done")],
        c1=[reply("", think()), reply("", submit("result a"))],
        c2=[reply("", think()), reply("", submit("result b"))],
        c3=[reply("", think()), reply("", submit("result c"))],
    )
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("review", cwd=tmp_path)
        result = await runtime.wait(root)
        state = runtime.state(root)
        tree = runtime.tree(root)
    assert result.outcome == "answered"
    assert result.text == "all done"
    # Root round 1 (1 s), children in parallel (2 rounds, 2 s), root round 2 (1 s).
    assert trio.current_time() == pytest.approx(4.0)
    results = fan_in(state.history)["sub_agent_results"]
    assert [(r["task"], r["status"], r["result"]) for r in results] == [
        ("a", "completed", "result a"),
        ("b", "completed", "result b"),
        ("c", "completed", "result c"),
    ]
    assert [type(c.state.phase) for c in tree.children] == [Completed] * 3
    store = Store.open(tmp_path / "log.db")
    try:
        assert [r.id for r in store.list_roots()] == [root]
        assert sorted(r.id for r in store.children(root)) == [f"{root}.{i}" for i in (1, 2, 3)]
        # Every child's outcome was accepted exactly once.
        outcomes = [
            e.event.child_id for e in store.events(root) if isinstance(e.event, SubAgentFinished)
        ]
        assert sorted(outcomes) == [f"{root}.{i}" for i in (1, 2, 3)]
        # The log folds back to the live state.
        assert store.load_state(root) == state
    finally:
        store.close()


async def test_one_child_failing_leaves_siblings_results_intact(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = script(
        1.0,
        root=[reply("", spawn("ok-1", "broken", "ok-2")), reply("summary")],
        c1=[reply("", submit("one"))],
        c2=[reply("", ("submit_error", {"error": "cannot do it"}))],
        c3=[reply("", think()), reply("", submit("two"))],
    )
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root)
        results = fan_in(runtime.state(root).history)["sub_agent_results"]
    assert [(r["status"], r.get("result"), r.get("error")) for r in results] == [
        ("completed", "one", None),
        ("failed", None, "cannot do it"),
        ("completed", "two", None),
    ]
    assert results[1]["error_kind"] == "submitted_error"


async def test_child_time_limit_ends_it_timed_out_and_parent_continues(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = script(
        1.0,
        root=[reply("", spawn({"task": "slow", "timeout": 5}, "fast")), reply("done")],
        c1=[reply("", think(), latency=100.0)],
        c2=[reply("", submit("quick"))],
    )
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root)
        slow = runtime.state(f"{root}.1")
        results = fan_in(runtime.state(root).history)["sub_agent_results"]
    assert isinstance(slow.phase, Failed)
    assert slow.phase.kind is ErrorKind.TIMED_OUT
    # Root round (1 s) + the slow child's 5 s limit + root's second round (1 s).
    assert trio.current_time() == pytest.approx(7.0)
    assert [r["status"] for r in results] == ["failed", "completed"]
    assert results[0]["error_kind"] == "timed_out"


async def test_cancel_reaches_every_child_and_nothing_keeps_running(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    marker = tmp_path / "never-written"
    pid_file = tmp_path / "bash.pid"
    # The command outlives the cancel however slow the machine (it used to sleep 0.5 s,
    # which a loaded machine could spend before the cancel arrived).
    command = f"echo $$ > {pid_file} && sleep 30 && touch {marker}"
    provider = script(
        1.0,
        root=[reply("", spawn("sleepy", "busy", "waiting"))],
        c1=[reply("", ("bash", {"command": command}))],
        c2=[reply("", think(), latency=50.0)],
        c3=[reply("", think()), reply("", think(), latency=500.0)],
    )
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await trio.sleep(3.0)  # the bash process has been started by now
        # Block the loop (no virtual time passes) until the shell really runs.
        deadline = time.monotonic() + 10.0
        while not _written(pid_file) and time.monotonic() < deadline:
            time.sleep(0.01)
        await runtime.cancel(root)
        result = await runtime.wait(root)
        children = [runtime.state(f"{root}.{i}") for i in (1, 2, 3)]
        state = runtime.state(root)
    assert result.outcome == "cancelled"
    assert type(state.phase).__name__ == "Idle"
    for child in children:
        assert isinstance(child.phase, Failed)
        assert child.phase.kind is ErrorKind.CANCELLED
    results = fan_in(state.history)["sub_agent_results"]
    assert [r["error_kind"] for r in results] == ["cancelled"] * 3
    # The running bash call got the synthetic "cancelled" result in the child's history.
    bash_results = [
        m.result
        for m in children[0].history
        if isinstance(m, ToolResultMessage) and m.result.name == "bash"
    ]
    assert [r.content for r in bash_results] == [CANCELLED_RESULT]
    # The bash tool's process was killed with its conversation (real time: the clock of
    # the test is Trio's mock clock).
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10.0
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    assert not marker.exists()


def _written(path: Path) -> bool:
    """``path`` holds a whole line (``echo`` finished writing it)."""
    return path.exists() and path.read_text().endswith("\n")


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (killed, waiting to be reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: exists
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_retries_after_rate_limits_then_success(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rate_limited = {"kind": "rate_limit", "message": "slow down", "retry_after": 2.0}
    provider = script(
        1.0,
        root=[reply("finally", fail_first=[rate_limited, rate_limited])],
    )
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("hi", cwd=tmp_path)
        result = await runtime.wait(root)
    assert result.text == "finally"
    # Three attempts of 1 s each plus two 2 s waits from Retry-After.
    assert trio.current_time() == pytest.approx(7.0)


async def test_retries_exhausted_in_a_child_fail_only_that_child(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    down = {"kind": "server_error", "message": "503", "retry_after": 1.0}
    provider = script(
        1.0,
        root=[reply("", spawn("doomed", "fine")), reply("ok")],
        c1=[reply("never", fail_first=[down, down, down])],
        c2=[reply("", submit("fine result"))],
    )
    async with open_runtime(tmp_path, provider, limits=Limits(max_attempts=3)) as runtime:
        root = await runtime.start("hi", cwd=tmp_path)
        await runtime.wait(root)
        doomed = runtime.state(f"{root}.1")
        results = fan_in(runtime.state(root).history)["sub_agent_results"]
    assert isinstance(doomed.phase, Failed)
    assert doomed.phase.kind is ErrorKind.SERVER_ERROR
    assert [r["status"] for r in results] == ["failed", "completed"]


class _BrokenProvider:
    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply:
        if context.depth == 0 and context.call == 0:
            raise ProviderError(ModelError(ErrorKind.AUTH, "bad key"))
        raise RuntimeError("provider bug")


async def test_provider_errors_become_typed_events_not_crashes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_runtime(tmp_path, _BrokenProvider()) as runtime:
        root = await runtime.start("hi", cwd=tmp_path)
        result = await runtime.wait(root)
        assert result.outcome == "error"
        assert runtime.state(root).phase.kind is ErrorKind.AUTH  # type: ignore[union-attr]
        # A new message recovers from Error; the bug in the provider is typed too.
        await runtime.send(root, "again")
        await runtime.wait(root)
        assert runtime.state(root).phase.kind is ErrorKind.PROVIDER_FAILURE  # type: ignore[union-attr]


async def test_rejected_api_events_raise_and_record_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = script(1.0, root=[reply("", think()), reply("done")])
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("hi", cwd=tmp_path)
        with pytest.raises(IllegalTransition, match="busy"):
            await runtime.send(root, "interrupting")
        await runtime.wait(root)
        seq = runtime.store.conversation(root).last_seq
        store = runtime.store
        assert [type(e.event).__name__ for e in store.events(root)].count("UserMessaged") == 1
        assert seq == len(store.events(root)) - 1


async def test_one_log_line_per_transition_with_bound_ids(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = script(1.0, root=[reply("", spawn("x")), reply("done")], c1=[reply("", submit("r"))])
    # A CLI command run in this process before (CliRunner: test_agents_example.py)
    # leaves structlog configured with its file's level, whose filtering wrapper drops
    # debug lines before capture_logs sees them.
    structlog.reset_defaults()
    with structlog.testing.capture_logs() as logs:
        async with open_runtime(tmp_path, provider, logger=structlog.get_logger()) as runtime:
            root = await runtime.start("hi", cwd=tmp_path)
            await runtime.wait(root)
            events = {cid: len(runtime.store.events(cid)) for cid in (root, f"{root}.1")}
    lines = [entry for entry in logs if entry["event"] == "transition"]
    for conversation_id, count in events.items():
        mine = [entry for entry in lines if entry["conversation_id"] == conversation_id]
        # Every event after creation is one transition line.
        assert len(mine) == count - 1
    child_lines = [entry for entry in lines if entry["conversation_id"] == f"{root}.1"]
    assert {(entry["parent_id"], entry["depth"]) for entry in child_lines} == {(root, 1)}
    assert child_lines[-1]["after"] == "Completed"
    assert "NotifyParent" in child_lines[-1]["effects"]


async def test_dead_child_cannot_hang_the_parent(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = script(
        1.0,
        root=[reply("", spawn({"task": "zombie", "timeout": 10}, "fine")), reply("moved on")],
        c1=[reply("", think())],
        c2=[reply("", submit("ok"))],
    )
    limits = Limits(cancel_grace=5.0)
    async with open_runtime(tmp_path, provider, limits=limits) as runtime:
        original = runtime.deliver

        def drop_zombie_events(conversation_id: str, event: Any) -> None:
            # The zombie's inbox swallows everything: it never reports or acknowledges.
            if conversation_id.endswith(".1") and not isinstance(event, SubAgentFinished):
                return
            original(conversation_id, event)

        runtime.deliver = drop_zombie_events  # type: ignore[method-assign]
        root = await runtime.start("hi", cwd=tmp_path)
        # Kill the zombie's own timer path by blocking its inbox entirely.
        zombie_actor = None
        while zombie_actor is None:
            await trio.sleep(0.5)
            zombie_actor = runtime._actors.get(f"{root}.1")
        zombie_actor.deliver = lambda event: None  # type: ignore[method-assign]
        result = await runtime.wait(root)
        results = fan_in(runtime.state(root).history)["sub_agent_results"]
    assert result.text == "moved on"
    assert results[0]["error_kind"] == "timed_out"
    assert results[1]["status"] == "completed"
    # Spawned at t=1; deadline = 10 s limit + 5 s grace; then one root round.
    assert trio.current_time() == pytest.approx(1.0 + 15.0 + 1.0)


async def test_a_stored_conversation_continues_in_a_new_runtime(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = script(1.0, root=[reply("first answer"), reply("second answer")])
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("one", cwd=tmp_path)
        await runtime.wait(root)
    async with open_runtime(tmp_path, provider) as runtime:
        await runtime.send(root, "two")
        result = await runtime.wait(root)
        history = runtime.state(root).history
    assert result.text == "second answer"
    assert [type(m).__name__ for m in history] == [
        "UserMessage",
        "AssistantMessage",
        "UserMessage",
        "AssistantMessage",
    ]


async def test_a_turn_result_holds_the_outcome_enum_or_none(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = script(1.0, root=[reply("done")])
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        result = await runtime.wait(root)
        outcome: TurnOutcome | None = result.outcome
        assert outcome == "answered"  # a StrEnum: comparisons with the old strings hold
        assert outcome is TurnOutcome.ANSWERED
        # A fork of a root at rest has finished no turn: no outcome, rather than "".
        forked = replay.fork(runtime.store, root, 2, key=runtime.key)
        assert (await runtime.wait(forked)).outcome is None
