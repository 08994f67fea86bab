"""A long-lived runtime holds only the conversations with work in flight.

A conversation that comes to rest (sub-agent Completed/Failed, root Idle/Error) ends
its task and worker and is forgotten; its state is read from the log afterwards, and
a root is loaded again by its next user message.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import structlog
import trio
import trio.testing
from runtime_helpers import open_runtime, reply, script, spawn, submit, think

from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.actor import Actor
from fanfold.statemachine import (
    CancelReason,
    CancelRequested,
    Completed,
    Conversation,
    Idle,
    Limits,
)

CHILDREN = 20


def _tree_script() -> ScriptedProvider:
    """A root that spawns CHILDREN sub-agents (each thinks, then submits), then answers;
    and answers a second message without tools."""
    return ScriptedProvider(
        {
            "latency": 0.5,
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [
                        reply("", spawn(*(f"task {n}" for n in range(CHILDREN)))),
                        reply("all {{task}} done"),
                        reply("second answer"),
                    ],
                },
                {"match": {"depth": 1}, "replies": [reply("", think()), reply("", submit("ok"))]},
            ],
        }
    )


LIMITS = Limits(max_concurrent=CHILDREN, max_tasks_per_call=CHILDREN)


def _tasks(task: trio.lowlevel.Task) -> Iterator[trio.lowlevel.Task]:
    yield task
    for nursery in task.child_nurseries:
        for child in nursery.child_tasks:
            yield from _tasks(child)


def _actor_tasks() -> list[str]:
    """Names of the living tasks that run an actor or its worker."""
    root = trio.lowlevel.current_root_task()
    assert root is not None
    return [t.name for t in _tasks(root) if "Actor" in t.name]


def _actors_of(runtime: Runtime) -> int:
    """Actor objects of ``runtime`` still alive (other tests' leftovers do not count)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Actor and o.runtime is runtime)


def _states_of(roots: set[str]) -> int:
    """Conversation states of the trees rooted at ``roots`` still alive."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Conversation and o.root_id in roots)


async def _one_tree(runtime: Runtime, tmp_path: Path) -> str:
    root = await runtime.start("the review", cwd=tmp_path, limits=LIMITS)
    with trio.fail_after(3600):
        result = await runtime.wait(root)
    assert result.text == "all the review done"
    return root


async def test_a_finished_tree_leaves_no_task_and_no_state_behind(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_runtime(tmp_path, _tree_script(), limits=LIMITS) as runtime:
        await _one_tree(runtime, tmp_path)  # the runtime and the provider warmed up
        await trio.testing.wait_all_tasks_blocked()
        baseline = trio.lowlevel.current_statistics().tasks_living
        root = await _one_tree(runtime, tmp_path)
        await trio.testing.wait_all_tasks_blocked()
        # Every actor task and worker has ended; the runtime forgot every conversation.
        assert _actor_tasks() == []
        assert trio.lowlevel.current_statistics().tasks_living == baseline
        assert runtime.running() == ()
        assert _actors_of(runtime) == 0
        assert _states_of({root}) == 0
        # What ended is still there to read, from the log.
        children = runtime.tree(root).children
        assert len(children) == CHILDREN
        assert all(isinstance(c.state.phase, Completed) for c in children)
        first = await runtime.wait(f"{root}.1")
        assert (first.outcome, first.text, first.phase) == ("completed", "ok", "Completed")
        assert (await runtime.wait(root)).text == "all the review done"
        # Nothing to cancel at rest: returns, records nothing.
        seq = runtime.store.conversation(root).last_seq
        await runtime.cancel(f"{root}.1")
        await runtime.cancel(root)
        assert runtime.store.conversation(root).last_seq == seq
        # The root takes its next message: loaded again, then unloaded again.
        await runtime.send(root, "and then?")
        assert (await runtime.wait(root)).text == "second answer"
        await trio.testing.wait_all_tasks_blocked()
        assert runtime.running() == ()
        assert _actor_tasks() == []


async def test_memory_does_not_grow_over_sequential_trees(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_runtime(tmp_path, _tree_script(), limits=LIMITS) as runtime:
        counts = []
        roots = set()
        for _ in range(5):
            roots.add(await _one_tree(runtime, tmp_path))
            await trio.testing.wait_all_tasks_blocked()
            counts.append((_actors_of(runtime), _states_of(roots), len(runtime.timers._heap)))
        # No actor, no conversation state and no timer of an ended tree is kept.
        assert counts == [(0, 0, 0)] * 5


async def test_a_message_to_a_conversation_that_was_unloaded_is_dropped_and_logged(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A late cancel to a child that ended (its parent cancelling it while its outcome
    is on the way) finds it in the log, at rest, as after a restart."""
    provider = script(0.5, root=[reply("", spawn("a")), reply("done")], c1=[reply("a")])
    logger = structlog.get_logger("fanfold")
    async with open_runtime(tmp_path, provider, logger=logger) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root)
        await trio.testing.wait_all_tasks_blocked()
        with structlog.testing.capture_logs() as logs:
            runtime.deliver_between(f"{root}.1", CancelRequested(CancelReason.PARENT))
        assert [(e["event"], e["to"], e["status"]) for e in logs] == [
            ("delivery_dropped", f"{root}.1", "completed")
        ]
        assert isinstance(runtime.state(root).phase, Idle)


async def test_start_takes_the_callers_id_once_and_refuses_a_bad_or_taken_one(
    tmp_path: Path,
) -> None:
    # `fanfold run --detach` names the tree before a worker starts it: the worker must
    # start it under that id, and a second start under it (a re-executed workflow that
    # missed the log) must be refused before anything is recorded.
    provider = ScriptedProvider({"agents": [{"match": {"path": "root"}, "replies": [reply("hi")]}]})
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("say hi", conversation_id="tree-0001")
        assert root == "tree-0001"
        assert (await runtime.wait(root)).text == "hi"
        for bad in ("tree-0001", "", "../x", "a" * 65, "a b"):
            try:
                await runtime.start("again", conversation_id=bad)
            except ValueError as exc:
                assert "tree-0001" in str(exc) or "letters" in str(exc)
            else:
                raise AssertionError(f"start accepted the id {bad!r}")
        assert [r.id for r in runtime.store.list_roots()] == ["tree-0001"]
