"""Issue 35 in the runtime: the Python API (pending, requests, approve, deny,
answer), the decisions table as a second process writes it, and the request's
durability across a restart."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from runtime_helpers import open_runtime, reply, script

from fanfold.db import Store
from fanfold.replay.transcript import transcript
from fanfold.runtime import Runtime
from fanfold.runtime.approvals import (
    AlreadyDecided,
    BadDecision,
    Decision,
    FileDecisions,
    PendingRequest,
    UnknownRequest,
)
from fanfold.statemachine import ToolResultMessage
from fanfold.tools.ask_user import AskUserTool
from fanfold.tools.registry import ToolSet


def _results(runtime: Runtime, conversation_id: str) -> list[str]:
    state = runtime.state(conversation_id)
    # A bash result's first line is its output ("pushed\n[exit code 0]").
    return [
        m.result.content.split("\n")[0] for m in state.history if isinstance(m, ToolResultMessage)
    ]


async def test_approve_runs_the_call_and_a_second_decision_is_refused(tmp_path: Path) -> None:
    provider = script(
        0.0,
        root=[
            reply("", ("bash", {"command": "echo pushed"}), ("bash", {"command": "echo after"})),
            reply("done"),
        ],
    )
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("go", cwd=tmp_path, ask=["Bash(echo pushed:*)"])
        requests = runtime.requests()
        with trio.fail_after(20):
            request = await requests.__anext__()  # the async iterator of new requests
        await requests.aclose()
        assert request.tool == "bash" and request.path == "root"
        assert request.arguments() == {"command": "echo pushed"}
        assert request.rule == "the ask rule 'bash(echo pushed*)' of the run's ask rules"
        assert [r.id for r in runtime.pending()] == [request.id]
        with pytest.raises(BadDecision):
            await runtime.answer(request, "yes")
        await runtime.approve(request)
        with pytest.raises(UnknownRequest):
            await runtime.deny(request, "too late")
        result = await runtime.wait(root)
        assert result.text == "done"
        assert _results(runtime, root) == ["pushed", "after"]
        assert runtime.pending() == []
        assert FileDecisions(tmp_path / "log.db").state_of(request.id) == "applied"


async def test_deny_and_edited_arguments(tmp_path: Path) -> None:
    provider = script(
        0.0,
        root=[
            reply("", ("bash", {"command": "echo one"}), ("bash", {"command": "echo two"})),
            reply("done"),
        ],
    )
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("go", cwd=tmp_path, ask=["bash"])
        first = await _next(runtime)
        with pytest.raises(BadDecision, match="command"):
            await runtime.approve(first, {"command": 3})
        await runtime.approve(first, {"command": "echo edited"})
        second = await _next(runtime)
        await runtime.deny(second, "not now", by="alice")
        await runtime.wait(root)
        assert _results(runtime, root) == ["edited", "denied by the user: not now"]
    # The transcript shows each request and who decided what.
    with Store.open(tmp_path / "log.db", read_only=True) as store:
        entries = transcript(store, root).entries
    asked = [e.label for e in entries if e.kind == "request"]
    decided = [(e.label, e.text) for e in entries if e.kind == "decision"]
    assert len(asked) == 2 and all("the ask rule 'bash'" in label for label in asked)
    assert decided[0][0].endswith("approved with edited arguments")
    assert decided[1] == (f"call {second.call} denied by alice", "not now")


async def test_ask_user_is_answered(tmp_path: Path) -> None:
    provider = script(
        0.0,
        root=[
            reply("", ("ask_user", {"question": "Which branch?", "choices": ["main", "dev"]})),
            reply("done"),
        ],
    )
    tools = ToolSet.default(extra=[AskUserTool()])
    async with open_runtime(tmp_path, provider) as runtime:
        runtime.tools = tools  # offered to the tree started next
        root = await runtime.start("go", cwd=tmp_path)
        request = await _next(runtime)
        assert request.question == "Which branch?" and request.choices == ("main", "dev")
        await runtime.answer(request, "dev")
        await runtime.wait(root)
        assert _results(runtime, root) == ["dev"]


async def test_a_decision_written_by_another_writer_reaches_the_runtime_once(
    tmp_path: Path,
) -> None:
    """The decisions table as ``fanfold approve`` in another process writes it: the
    first writer wins, the second gets AlreadyDecided; the runtime applies it once."""
    provider = script(0.0, root=[reply("", ("bash", {"command": "echo x"})), reply("done")])
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("go", cwd=tmp_path, ask=["bash"])
        request = await _next(runtime)
        table = FileDecisions(tmp_path / "log.db")
        table.write(Decision(request.id, "deny", None, "from elsewhere", "cli", 0.0))
        with pytest.raises(AlreadyDecided):
            table.write(Decision(request.id, "grant", None, "", "other", 0.0))
        with pytest.raises(AlreadyDecided):
            await runtime.approve(request)
        await runtime.wait(root)
        assert _results(runtime, root) == ["denied by the user: from elsewhere"]
        with trio.fail_after(20):  # the row is marked once its event is committed
            while table.state_of(request.id) != "applied":
                await trio.sleep(0.01)


async def test_a_cancel_while_waiting_leaves_nothing_pending(tmp_path: Path) -> None:
    provider = script(0.0, root=[reply("", ("bash", {"command": "echo x"}))])
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("go", cwd=tmp_path, ask=["bash"])
        request = await _next(runtime)
        await runtime.cancel(root)
        await runtime.wait(root)
        assert runtime.pending() == []
        with pytest.raises(UnknownRequest):
            await runtime.approve(request)
        assert "never ran" in _results(runtime, root)[0]


async def _next(runtime: Runtime) -> PendingRequest:
    """The oldest open request, once there is one."""
    with trio.fail_after(20):
        while not runtime.pending():
            await trio.sleep(0.01)
    return runtime.pending()[0]


def test_deciders_racing_on_one_request_get_one_winner(tmp_path: Path) -> None:
    """Eight writers, each with its own connection (as eight `fanfold approve`
    processes have), write a decision for the same request at once: one row, one
    winner, and every other one told AlreadyDecided."""
    import threading

    db = tmp_path / "race.db"
    FileDecisions(db).new(["x:1"])  # the table exists (a runtime makes it first)
    start = threading.Barrier(8)
    outcomes: list[str] = []

    def decide(n: int) -> None:
        start.wait()
        try:
            FileDecisions(db).write(Decision("x:1", "deny", None, f"decider {n}", f"d{n}", 0.0))
            outcomes.append("won")
        except AlreadyDecided:
            outcomes.append("already decided")

    threads = [threading.Thread(target=decide, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["already decided"] * 7 + ["won"]
    assert FileDecisions(db).state_of("x:1") == "new"
