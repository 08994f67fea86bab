"""Issue 35: a tree waiting only for people is unloaded from its runtime
(``Runtime.unload_tree``: nothing of it in memory, no timer running) and taken back by
``resume``; what was due meanwhile fires then (its approval timeout counted the time
it was unloaded). Real SQLite log, the runtime's own code; the worker's use of it is
tested with real processes in ``test_worker_parking.py``."""

from __future__ import annotations

from pathlib import Path

import trio
from runtime_helpers import open_runtime, reply, script

from fanfold.runtime import NotRunning, Runtime
from fanfold.runtime.approvals import Decision
from fanfold.statemachine import Limits, ToolResultMessage


def _results(runtime: Runtime, root: str) -> list[str]:
    history = runtime.state(root).history
    return [m.result.content.split("\n")[0] for m in history if isinstance(m, ToolResultMessage)]


async def _first_request(runtime: Runtime) -> str:
    with trio.fail_after(20):
        while not runtime.pending():
            await trio.sleep(0.01)
        # "Only for people": nothing in flight, nothing queued (the request's step
        # is committed and its effects ran).
        while not runtime.waiting_for_people(runtime.pending()[0].tree):
            await trio.sleep(0.01)
    return runtime.pending()[0].id


async def test_an_unloaded_tree_waits_in_the_log_and_a_decision_resumes_it(tmp_path: Path) -> None:
    provider = script(0.0, root=[reply("", ("bash", {"command": "echo pushed"})), reply("done")])
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("go", cwd=tmp_path, ask=["Bash(echo pushed:*)"])
        waiter = trio.Event()
        outcome: list[BaseException] = []

        async def wait_root() -> None:
            try:
                await runtime.wait(root)
            except NotRunning as exc:
                outcome.append(exc)
            waiter.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_root)
            request = await _first_request(runtime)
            parked = runtime.unload_tree(root)
            assert parked is not None
            assert parked.root_id == root and parked.requests == (request,)
            assert parked.due is None  # no time limit, no approval timeout
            with trio.fail_after(5):
                await waiter.wait()
        assert len(outcome) == 1  # a waiter hears it, rather than wait for ever
        assert runtime.pending() == [] and root not in runtime.loaded_ids()
        assert runtime.unload_tree(root) is None  # not loaded: nothing to unload
        # The log still has it waiting; a decision written meanwhile (as `fanfold
        # approve` does) is taken once the tree is back.
        await trio.to_thread.run_sync(
            runtime.decisions.write, Decision(request, "grant", None, "", "test", 0.0)
        )
        await runtime.resume([root], claimed=True)
        with trio.fail_after(20):
            result = await runtime.wait(root)
        assert result.text == "done" and _results(runtime, root) == ["pushed"]


async def test_an_unloaded_trees_approval_timeout_fires_once_it_is_resumed_when_due(
    tmp_path: Path,
) -> None:
    provider = script(0.0, root=[reply("", ("bash", {"command": "echo pushed"})), reply("done")])
    async with open_runtime(tmp_path, provider, limits=Limits(approval_timeout=1.0)) as runtime:
        root = await runtime.start("go", cwd=tmp_path, ask=["bash"])
        await _first_request(runtime)
        asked = runtime.now()
        parked = runtime.unload_tree(root)
        assert parked is not None and parked.due is not None
        assert asked - 0.1 <= parked.due <= asked + 1.0 + 0.1
        await trio.sleep(max(0.0, parked.due - runtime.now()))
        await runtime.resume([root], claimed=True)
        with trio.fail_after(20):
            result = await runtime.wait(root)
        assert result.text == "done"
        (denied,) = _results(runtime, root)
        assert denied == "denied by the user: no decision within 1.0s (approval_timeout)", denied


async def test_a_tree_with_work_in_flight_is_not_unloaded(tmp_path: Path) -> None:
    provider = script(0.5, root=[reply("done")])  # a model call in flight for 0.5 s
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await trio.sleep(0.1)
        assert runtime.unload_tree(root) is None
        assert root in runtime.loaded_ids()
        assert (await runtime.wait(root)).text == "done"


async def test_an_unloaded_trees_time_limit_is_due_and_ends_its_turn_once_resumed(
    tmp_path: Path,
) -> None:
    provider = script(0.0, root=[reply("", ("bash", {"command": "echo pushed"})), reply("done")])
    async with open_runtime(tmp_path, provider) as runtime:
        started = runtime.now()
        root = await runtime.start("go", cwd=tmp_path, ask=["bash"], timeout=1.0)
        await _first_request(runtime)
        parked = runtime.unload_tree(root)
        assert parked is not None and parked.due is not None
        assert started <= parked.due <= started + 1.0 + 0.1
        await trio.sleep(max(0.0, parked.due - runtime.now()))
        await runtime.resume([root], claimed=True)
        with trio.fail_after(20):
            result = await runtime.wait(root)
        assert (result.phase, result.text) == ("Error", "time limit of 1.0s reached")
        assert "pushed" not in _results(runtime, root)
