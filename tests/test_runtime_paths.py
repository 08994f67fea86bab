"""The runtime's fast paths: the per-conversation worker, the writer's callbacks, the
size-aware snapshot policy, background WAL checkpoints and the scripted provider's
shared latency timer.

Scripted provider, Trio's autojump clock, real SQLite files under tmp_path.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from db_scenarios import Driver, fan_out
from runtime_helpers import open_runtime, reply, script, spawn, submit, think

from fanfold.db import Store
from fanfold.db import store as store_module
from fanfold.providers.base import CallContext
from fanfold.providers.scripted import ScriptedProvider
from fanfold.statemachine import (
    Children,
    ChildSpec,
    Conversation,
    Effect,
    Event,
    Limits,
    ModelReply,
    ModelRequest,
    PendingChild,
)
from fanfold.tools.registry import ToolSet, _compile_check
from fanfold.tools.schema import validate


class Gate:
    """A provider whose calls block until released; records what was cancelled."""

    def __init__(self) -> None:
        self.started: list[tuple[str, int]] = []
        self.cancelled: list[tuple[str, int]] = []
        self.release = trio.Event()

    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply:
        key = (context.conversation_id, context.call)
        self.started.append(key)
        try:
            await self.release.wait()
        except trio.Cancelled:
            self.cancelled.append(key)
            raise
        self.release = trio.Event()
        return ModelReply(text=f"answer {len(self.started)}")


async def test_a_cancelled_call_is_aborted_and_the_next_turn_runs(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """AbortCall cancels the call running on the conversation's worker; the worker
    then serves the next turn with a fresh cancel scope."""
    gate = Gate()
    async with open_runtime(tmp_path, gate) as runtime:
        root = await runtime.start("first", cwd=tmp_path)
        await trio.testing.wait_all_tasks_blocked()
        await runtime.cancel(root)
        assert (await runtime.wait(root)).outcome == "cancelled"
        await trio.testing.wait_all_tasks_blocked()
        assert gate.cancelled == gate.started == [(root, 0)]
        await runtime.send(root, "second")
        await trio.testing.wait_all_tasks_blocked()
        gate.release.set()
        result = await runtime.wait(root)
    assert result.text == "answer 2"
    assert gate.started == [(root, 0), (root, 1)]


async def test_effects_run_only_after_their_step_is_committed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Write-ahead with actors that do not wait: every effect an observer sees
    executed belongs to a step already in the log."""
    provider = script(
        1.0,
        root=[reply("", spawn("a", "b")), reply("done")],
        c1=[reply("", think()), reply("", submit("ra"))],
        c2=[reply("", submit("rb"))],
    )
    committed: set[tuple[str, int]] = set()
    violations: list[str] = []

    async with open_runtime(tmp_path, provider) as runtime:
        append = runtime.store.append

        def recording_append(steps: Any) -> Any:
            reported = append(steps)
            committed.update((s.conversation_id, s.seq) for s in steps)
            return reported

        runtime.writer._append = recording_append

        def observe(
            before: Conversation, after: Conversation, event: Event, effects: tuple[Effect, ...]
        ) -> None:
            actor = runtime._actors.get(after.id)
            if actor is None or actor.seq == 0:
                return  # a creation is observed when it is made, as it always was
            if (after.id, actor.seq) not in committed:
                violations.append(f"{after.id} seq {actor.seq} observed before commit")

        runtime._observer = observe
        root = await runtime.start("go", cwd=tmp_path)
        result = await runtime.wait(root)
    assert result.text == "done"
    assert not violations


async def test_a_parent_with_many_children_snapshots_by_size(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A snapshot is taken once the events since the last one outweigh it, and at rest;
    the stored state rebuilds exactly."""
    n = 300
    groups = {"a": 1.0, "b": 2.0, "c": 3.0}  # children report in three waves
    tasks = [f"{group} {i}" for i in range(n // 3) for group in groups]
    name, arguments = spawn(*tasks)
    provider = ScriptedProvider(
        {
            "latency": 1.0,
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [
                        {"tool_calls": [{"name": name, "arguments": arguments}]},
                        {"text": "all done"},
                    ],
                },
                *(
                    {
                        "match": {"task": f"{group} *"},
                        "replies": [{"tool_calls": [submit_call()], "latency": latency}],
                    }
                    for group, latency in groups.items()
                ),
            ],
        }
    )
    limits = Limits(max_tasks_per_call=n, max_concurrent=n, child_timeout=None)
    snapshots: list[tuple[str, int]] = []
    async with open_runtime(tmp_path, provider, limits=limits) as runtime:
        append = runtime.store.append

        def recording_append(steps: Any) -> Any:
            snapshots.extend((s.conversation_id, s.seq) for s in steps if s.snapshot and s.seq)
            return append(steps)

        runtime.writer._append = recording_append
        root = await runtime.start("go", cwd=tmp_path, limits=limits)
        assert (await runtime.wait(root)).text == "all done"
        final = runtime.state(root)
        last_seq = runtime.store.conversation(root).last_seq  # (unloaded at rest)
    root_snapshots = [seq for cid, seq in snapshots if cid == root]
    # The first wave of outcomes outweighs the created state: one snapshot; the next
    # two waves weigh less than that snapshot (which holds all 300 children): none;
    # then one at rest. Every 100 steps would have written three big ones meanwhile.
    assert last_seq > 300
    assert len(root_snapshots) == 2
    assert root_snapshots[-1] == last_seq
    assert len([cid for cid, _ in snapshots if cid != root]) == n  # every child at rest
    with Store.open(tmp_path / "log.db") as store:
        assert store.load_state(root) == final
        assert store.conversation(root).snapshot_seq == last_seq


def submit_call() -> dict[str, Any]:
    name, arguments = submit("ok")
    return {"name": name, "arguments": arguments}


def test_the_wal_is_checkpointed_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "CHECKPOINT_BYTES", 1)
    path = tmp_path / "wal.db"
    with Store.open(path) as store:
        assert store._connection().execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
        driver = Driver()
        fan_out(driver)
        steps = driver.steps
        store.append(steps)
        checkpointer = store._checkpointer
        assert checkpointer is not None
        thread = checkpointer._thread
        assert thread is not None
        thread.join()
        # The checkpoint copied every frame back into the database file.
        other = sqlite3.connect(path)
        busy, log, copied = other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        other.close()
        assert busy == 0 and log == copied
    with Store.open(path) as store:
        assert store.conversation(steps[-1].conversation_id).last_seq == steps[-1].seq


async def test_scripted_latency_wakes_in_deadline_order_and_cancels(
    autojump_clock: trio.testing.MockClock,
) -> None:
    provider = ScriptedProvider(
        {
            "agents": [
                {"match": {"path": f"root/{i}"}, "replies": [{"text": str(i), "latency": i}]}
                for i in (3, 1, 2, 5)
            ]
        }
    )
    woke: list[tuple[str, float]] = []

    async def call(i: int) -> None:
        context = CallContext("c", "r", f"root/{i}", 1, "t", 0)
        reply = await provider.complete(ModelRequest("", (), ()), context)
        woke.append((reply.text, trio.current_time()))

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for i in (3, 1, 2):
            nursery.start_soon(call, i)
        with trio.move_on_after(4):
            await call(5)  # cancelled while it sleeps
    assert woke == [("1", start + 1), ("2", start + 2), ("3", start + 3)]
    assert trio.current_time() == start + 4
    # A latency of 0 is a plain checkpoint.
    zero = ScriptedProvider({"agents": [{"replies": [{"text": "now", "latency": 0}]}]})
    reply = await zero.complete(ModelRequest("", (), ()), CallContext("c", "r", "root", 0, "t", 0))
    assert reply.text == "now" and trio.current_time() == start + 4


def test_the_fast_argument_check_never_accepts_what_validation_refuses() -> None:
    tools = ToolSet.default(web_domains=["example.com"])
    specs = {spec.name: spec for spec in tools.specs()}
    values: list[Any] = [None, True, 0, 1.5, "", "x", [], {}, ["a"], {"a": 1}]
    # The bounds and enums the fast check now takes (bash's timeout, read_file's
    # offset, grep's output_mode), on both sides of each edge.
    values += [1, 2.0, -1, 600, 600.5, 601, float("nan"), float("inf"), "count", "lines"]
    keys = ["thought", "command", "timeout", "path", "content", "old_string", "new_string"]
    keys += ["replace_all", "limit", "offset", "other", "pattern", "output_mode", "url"]
    dice = random.Random(7)
    accepted = 0
    for name in tools.names:
        schema = specs[name].input_schema()
        check = _compile_check(schema)
        for _ in range(3000):
            arguments: Any = {k: dice.choice(values) for k in dice.sample(keys, dice.randint(0, 4))}
            if dice.random() < 0.05:
                arguments = dice.choice(values)
            if check(arguments):
                accepted += 1
                assert validate(schema, arguments) == [], (name, arguments)
    assert _compile_check(specs["think"].input_schema())({"thought": "hmm"})
    grep = _compile_check(specs["grep"].input_schema())
    assert grep({"pattern": "x", "output_mode": "count"})
    assert _compile_check(specs["bash"].input_schema())({"command": "x", "timeout": 5})
    assert accepted > 0


def test_finding_a_pending_child_by_search_matches_a_scan() -> None:
    dice = random.Random(11)

    def spec(child_id: str) -> ChildSpec:
        return ChildSpec(child_id, "t", "/", None, 3, "call")

    for _ in range(500):
        numbers = sorted(dice.sample(range(1, 400), dice.randint(0, 80)))
        pending = [PendingChild(spec(f"p.{n}")) for n in numbers]
        if dice.random() < 0.3:
            dice.shuffle(pending)
        if pending and dice.random() < 0.2:
            pending.insert(dice.randrange(len(pending)), PendingChild(spec("p.x")))
        children = Children(tuple(pending))
        ids = [p.spec.id for p in children.pending]
        for child_id in [f"p.{dice.randint(0, 410)}" for _ in range(6)] + ["p.x", "p.²", "q"]:
            expected = ids.index(child_id) if child_id in ids else -1
            assert children.index_of(child_id) == expected
