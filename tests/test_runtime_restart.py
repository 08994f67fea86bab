"""Restarts at awkward moments: the runtime is cut right after a chosen batch is
committed (before any of its effects runs, as a crash would leave it), then a new
runtime resumes the log. Also: ``resume`` never takes over another runtime's work."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from runtime_helpers import open_runtime, reply, script, spawn, submit, think

from fanfold.db import Step, Store
from fanfold.runtime import DatabaseInUse, Runtime
from fanfold.statemachine import CancelReason, Completed, Failed, Idle, Limits


async def run_until_cut(
    tmp_path: Path,
    provider: Any,
    cut: Callable[[Sequence[Step]], bool],
    drive: Callable[[Runtime], Awaitable[None]],
    limits: Limits | None = None,
    **kwargs: Any,
) -> None:
    """Run ``drive``; stop the runtime once a committed batch satisfies ``cut``, before
    any callback of that batch runs (so none of its effects executes)."""
    async with open_runtime(tmp_path, provider, limits=limits, **kwargs) as runtime:
        append = runtime.store.append

        def cutting(steps: Sequence[Step]) -> Any:
            reported = append(steps)
            if cut(steps):
                runtime._nursery.cancel_scope.cancel()
            return reported

        runtime.writer._append = cutting
        await drive(runtime)
        await trio.sleep_forever()


def _recording(runtime: Runtime, into: list[tuple[str, int]]) -> None:
    append = runtime.store.append

    def recording(steps: Sequence[Step]) -> Any:
        into.extend((s.conversation_id, s.seq) for s in steps if s.snapshot and s.seq)
        return append(steps)

    runtime.writer._append = recording


async def test_a_cancelled_parent_resumed_with_an_ended_child_finishes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Cut after a child's final step, before its parent accepted the outcome: on resume
    the parent re-issues the cancel to every child it still waits for, including the
    ended one (not loaded: nothing to cancel), and hears its outcome re-delivered."""
    provider = script(
        1.0,
        root=[reply("", spawn("a", "b"))],
        c1=[reply("", think(), latency=50.0)],
        c2=[reply("", think(), latency=50.0)],
    )

    async def drive(runtime: Runtime) -> None:
        root = await runtime.start("go", cwd=tmp_path)
        await trio.sleep(3.0)
        await runtime.cancel(root)

    def child_ended(steps: Sequence[Step]) -> bool:
        return any(s.conversation_id.endswith(".1") and s.state.is_terminal for s in steps)

    await run_until_cut(tmp_path, provider, child_ended, drive)
    with Store.open(tmp_path / "log.db") as store:
        (root_row,) = store.list_roots()
        assert root_row.phase == "CancellingSubAgents"
    async with open_runtime(tmp_path, provider) as runtime:
        resumed = await runtime.resume()
        assert root_row.id in resumed and f"{root_row.id}.1" not in resumed
        result = await runtime.wait(root_row.id)
    assert result.phase == "Idle"
    with Store.open(tmp_path / "log.db") as store:
        assert [r.status for r in store.tree(root_row.id)] == ["idle", "failed", "failed"]


async def test_a_child_resumed_at_its_creation_still_snapshots_by_size(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    limits = Limits(max_rounds=20)
    child = [reply("", think("x" * 2000)) for _ in range(15)] + [reply("", submit("r"))]
    root = [reply("", spawn("a")), reply("done")]

    async def drive(runtime: Runtime) -> None:
        await runtime.start("go", cwd=tmp_path, limits=limits)

    def child_created(steps: Sequence[Step]) -> bool:
        return any(s.seq == 0 and s.conversation_id.endswith(".1") for s in steps)

    await run_until_cut(tmp_path, script(1.0, root=root), child_created, drive, limits)
    snapshots: list[tuple[str, int]] = []
    async with open_runtime(tmp_path, script(1.0, root=root, c1=child), limits=limits) as runtime:
        _recording(runtime, snapshots)
        resumed = await runtime.resume()
        (root_id,) = [i for i in resumed if "." not in i]
        await runtime.wait(root_id)
        assert isinstance(runtime.state(f"{root_id}.1").phase, Completed)
    child_snapshots = [seq for cid, seq in snapshots if cid.endswith(".1")]
    # Each think round logs ~2 KB of events; the state grows by the same: a snapshot is
    # due every few steps, not only at the end (32 steps).
    assert len(child_snapshots) >= 3, child_snapshots


def _one_slow_child() -> Any:
    return script(
        1.0, root=[reply("", spawn("a")), reply("done")], c1=[reply("", submit("a"), latency=30.0)]
    )


async def test_resume_refuses_while_another_runtime_has_the_database_open(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = _one_slow_child()
    async with open_runtime(tmp_path, provider) as first:
        root = await first.start("go", cwd=tmp_path)
        await trio.sleep(5.0)  # the child is calling the model: the tree is unfinished
        async with open_runtime(tmp_path, provider) as second:
            with pytest.raises(DatabaseInUse, match="another fanfold runtime has"):
                await second.resume()
            assert second.running() == ()
        result = await first.wait(root)
    assert (result.outcome, result.text) == ("answered", "done")
    async with open_runtime(tmp_path, provider) as later:
        assert await later.resume() == []  # nothing unfinished, and nobody else is open


async def test_resume_after_the_other_runtime_closed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = _one_slow_child()
    async with open_runtime(tmp_path, provider) as first:
        root = await first.start("go", cwd=tmp_path)
        await trio.sleep(5.0)
    assert os.path.exists(tmp_path / "log.db-runtimes")
    async with open_runtime(tmp_path, provider) as second:
        assert sorted(await second.resume()) == [root, f"{root}.1"]
        result = await second.wait(root)
    assert result.text == "done"
    with Store.open(tmp_path / "log.db") as store:
        assert isinstance(store.load_state(root).phase, Idle)


@pytest.mark.parametrize(("down", "expected"), [(10.0, 30.0), (200.0, 0.0)])
async def test_a_resumed_childs_time_limit_counts_from_its_start_not_the_restart(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, down: float, expected: float
) -> None:
    """A child with a 100 s limit runs 60 s, the process is down for ``down`` seconds:
    after the restart its re-issued deadline timer fires once the 100 s are used up
    (at once if they already were), not 100 s after the restart."""
    offset = [1_000_000.0]

    def wall_clock() -> float:
        return offset[0] + trio.current_time()

    provider = script(
        1.0,
        root=[reply("", spawn("slow")), reply("done")],
        c1=[reply("", submit("never"), latency=10_000.0)],
    )
    limits = Limits(child_timeout=100.0)
    async with open_runtime(tmp_path, provider, limits=limits, clock=wall_clock) as first:
        root = await first.start("go", cwd=tmp_path)
        await trio.sleep(61.0)  # the child's model call started at t = 1
    offset[0] += down
    async with open_runtime(tmp_path, provider, limits=limits, clock=wall_clock) as second:
        assert sorted(await second.resume()) == [root, f"{root}.1"]
        resumed_at = trio.current_time()
        await second.wait(f"{root}.1")
        took = trio.current_time() - resumed_at
        assert (await second.wait(root)).text == "done"
    assert took == pytest.approx(expected, abs=0.01)
    with Store.open(tmp_path / "log.db") as store:
        child = store.load_state(f"{root}.1").phase
    assert isinstance(child, Failed) and child.reason is CancelReason.TIMEOUT, child


@pytest.mark.parametrize(
    ("jump", "expected"),
    [(-3600.0, 60.0), (-30.0, 60.0), (3600.0, 0.0)],
    ids=["back-an-hour", "back-past-the-log", "forward-an-hour"],
)
async def test_a_clock_jump_while_down_never_restarts_a_time_limit(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, jump: float, expected: float
) -> None:
    """Issue 32.12. A child with a 100 s limit started at t = 1; its sibling's outcome
    is recorded at t = 41; the runtime stops at t = 61. The wall clock is then set
    ``jump`` seconds away from what it was. Set back, the child's limit counts what the
    log holds (40 s ran by its latest step, so 60 s are left), never restarts (a
    resume's downtime is never negative: 100 s were left on 6da5079). Set forward, the
    jump is downtime like any other (the log cannot tell them apart): the limit is up."""
    offset = [1_000_000.0]

    def wall_clock() -> float:
        return offset[0] + trio.current_time()

    provider = script(
        1.0,
        root=[reply("", spawn("slow", "quick")), reply("done")],
        c1=[reply("", submit("never"), latency=10_000.0)],
        c2=[reply("", submit("quick"), latency=40.0)],
    )
    limits = Limits(child_timeout=100.0)
    async with open_runtime(tmp_path, provider, limits=limits, clock=wall_clock) as first:
        root = await first.start("go", cwd=tmp_path)
        await trio.sleep(61.0)
    offset[0] += jump
    async with open_runtime(tmp_path, provider, limits=limits, clock=wall_clock) as second:
        assert sorted(await second.resume()) == [root, f"{root}.1"]
        resumed_at = trio.current_time()
        await second.wait(f"{root}.1")
        took = trio.current_time() - resumed_at
        assert (await second.wait(root)).text == "done"
    assert took == pytest.approx(expected, abs=0.01)
    with Store.open(tmp_path / "log.db") as store:
        child = store.load_state(f"{root}.1").phase
    assert isinstance(child, Failed) and child.reason is CancelReason.TIMEOUT, child


async def test_an_outcome_redelivered_on_resume_carries_the_childs_tokens(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Cut after the child's last step, before its parent heard: the re-delivered
    outcome must charge the parent's tree budget as the original would have."""
    provider = script(
        1.0,
        root=[
            reply("", spawn("a"), usage={"input_tokens": 10, "output_tokens": 10}),
            reply("done"),
        ],
        c1=[reply("", submit("A"), usage={"input_tokens": 300, "output_tokens": 200})],
    )
    limits = Limits(max_tokens=10_000)

    async def drive(runtime: Runtime) -> None:
        await runtime.start("go", cwd=tmp_path)

    def child_ended(steps: Sequence[Step]) -> bool:
        return any(s.state.parent_id is not None and s.state.is_terminal for s in steps)

    await run_until_cut(tmp_path, provider, child_ended, drive, limits=limits)
    with Store.open(tmp_path / "log.db") as store:
        (row,) = store.list_roots()
        assert store.load_state(row.id).usage_children == 0  # not delivered yet
    async with open_runtime(tmp_path, provider, limits=limits) as runtime:
        await runtime.resume()
        assert (await runtime.wait(row.id)).text == "done"
    with Store.open(tmp_path / "log.db") as store:
        assert store.load_state(row.id).usage_children == 500


@pytest.mark.parametrize("down", [5.0, 100.0])
async def test_after_a_long_restart_children_still_get_their_grace_to_acknowledge(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, down: float
) -> None:
    """Cut while the root waits for its children to acknowledge a cancel; the process
    stays down for longer than the grace. The grace timer waits for other
    conversations, which were down too: it starts over, and the children, which
    acknowledge at once after the restart, are not written off as unresponsive."""
    offset = [1_000_000.0]

    def wall_clock() -> float:
        return offset[0] + trio.current_time()

    provider = script(
        1.0,
        root=[reply("", spawn("a", "b"))],
        c1=[reply("", think(), latency=500.0)],
        c2=[reply("", think(), latency=500.0)],
    )
    limits = Limits(cancel_grace=30.0, child_timeout=None, max_tokens=100_000)

    async def drive(runtime: Runtime) -> None:
        root = await runtime.start("go", cwd=tmp_path)
        await trio.sleep(3.0)
        await runtime.cancel(root)

    def root_cancelling(steps: Sequence[Step]) -> bool:
        return any(
            s.state.parent_id is None and type(s.state.phase).__name__ == "CancellingSubAgents"
            for s in steps
        )

    await run_until_cut(tmp_path, provider, root_cancelling, drive, limits=limits, clock=wall_clock)
    offset[0] += down
    async with open_runtime(tmp_path, provider, limits=limits, clock=wall_clock) as runtime:
        (root,) = [i for i in await runtime.resume() if "." not in i]
        await runtime.wait(root)
    with Store.open(tmp_path / "log.db") as store:
        state = store.load_state(root)
    assert isinstance(state.phase, Idle)
    assert state.written_off == ()


async def test_a_claimed_resume_goes_on_beside_another_runtime_on_the_log(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # `fanfold worker`: other workers have the log open running their own trees; the
    # worker that holds a tree's exclusive claim (its per-tree lock) resumes it beside
    # them. Without the claim the database-wide rule still refuses.
    provider = _one_slow_child()
    async with open_runtime(tmp_path, provider) as first:
        left = await first.start("go", cwd=tmp_path)
        await trio.sleep(5.0)  # closed mid-tree: `left` is unfinished in the log
    async with open_runtime(tmp_path, provider) as busy:
        other = await busy.start("other", cwd=tmp_path)
        await trio.sleep(5.0)
        async with open_runtime(tmp_path, provider) as taker:
            with pytest.raises(DatabaseInUse):
                await taker.resume([left])
            with pytest.raises(ValueError, match="needs the roots"):
                await taker.resume(claimed=True)
            assert sorted(await taker.resume([left], claimed=True)) == [left, f"{left}.1"]
            assert (await taker.wait(left)).text == "done"
            assert other not in {s.id for s in taker.running()}
        assert (await busy.wait(other)).text == "done"
