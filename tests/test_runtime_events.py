"""``Runtime.events`` (issue 24): following a tree's committed steps without callbacks.

A real tree (scripted provider, real SQLite file, Trio's autojump clock): the steps a
reader gets are the log's, each once and in order per conversation, wherever in the
run it starts; a slow or cancelled reader changes nothing of the run."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import trio
import trio.testing
from runtime_helpers import open_runtime, reply, script, spawn, submit, think

from fanfold import replay
from fanfold.runtime import Runtime, TreeStep
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import Completed, ConversationCreated, Idle
from fanfold.tools.registry import ToolSet


def _provider() -> Any:
    return script(
        1.0,
        root=[reply("delegating", spawn("a", "b", "c")), reply("all done")],
        c1=[reply("", think()), reply("", submit("result a"))],
        c2=[reply("", think()), reply("", submit("result b"))],
        c3=[reply("", think()), reply("", submit("result c"))],
    )


def _logged(runtime: Runtime, root: str) -> dict[str, list[tuple[int, Any]]]:
    """Every event of the tree in the log, per conversation, in seq order."""
    return {
        row.id: [(e.seq, e.event) for e in runtime.store.events(row.id)]
        for row in runtime.store.tree(root)
    }


def _by_conversation(steps: list[TreeStep]) -> dict[str, list[tuple[int, Any]]]:
    got: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    for step in steps:
        got[step.conversation_id].append((step.seq, step.event))
    return dict(got)


async def test_a_reader_from_the_start_sees_every_step_once_in_order(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_runtime(tmp_path, _provider()) as runtime:
        root = await runtime.start("review", cwd=tmp_path)
        steps = [step async for step in runtime.events(root)]
        # It ended by itself: the tree is at rest.
        assert isinstance(runtime.state(root).phase, Idle)
        logged = _logged(runtime, root)
    assert len(logged) == 4
    assert _by_conversation(steps) == logged
    assert steps[0].seq == 0 and isinstance(steps[0].event, ConversationCreated)
    paths = {s.path for s in steps}
    assert paths == {"root", "root/1", "root/2", "root/3"}
    last = {s.conversation_id: s for s in steps}
    assert isinstance(last[root].phase, Idle)
    assert all(isinstance(last[f"{root}.{n}"].phase, Completed) for n in (1, 2, 3))


async def test_a_reader_that_starts_mid_run_sees_everything_from_the_start(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_runtime(tmp_path, _provider()) as runtime:
        root = await runtime.start("review", cwd=tmp_path)
        await trio.sleep(1.5)  # the children are in their first model call
        assert len(runtime.store.tree(root)) == 4
        assert runtime.store.conversation(root).status == "running"
        steps = [step async for step in runtime.events(root)]
        logged = _logged(runtime, root)
    assert _by_conversation(steps) == logged


async def test_a_slow_reader_neither_holds_nor_loses_the_run(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_runtime(tmp_path, _provider()) as runtime:
        root = await runtime.start("review", cwd=tmp_path)
        steps: list[TreeStep] = []
        finished = trio.Event()

        async def slow() -> None:
            async for step in runtime.events(root):
                steps.append(step)
                if len(steps) == 1:
                    await finished.wait()  # reads nothing while the whole run goes on

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow)
            result = await runtime.wait(root)
            # The run took its time as without a reader (root 1 s, children 2 s, root 1 s).
            assert trio.current_time() == 4.0
            assert len(steps) == 1
            finished.set()
        assert result.text == "all done"
        assert _by_conversation(steps) == _logged(runtime, root)


def _shape(runtime: Runtime, root: str) -> dict[str, list[str]]:
    """The tree's event types per place (ids differ between runs)."""
    return {
        "root" + cid[len(root) :]: [type(e).__name__ for _, e in events]
        for cid, events in _logged(runtime, root).items()
    }


async def test_a_cancelled_reader_leaves_the_run_as_it_was(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    (tmp_path / "alone").mkdir()
    async with open_runtime(tmp_path / "alone", _provider()) as runtime:
        alone = await runtime.start("review", cwd=tmp_path)
        expected = (await runtime.wait(alone), _shape(runtime, alone))
    (tmp_path / "read").mkdir()
    async with open_runtime(tmp_path / "read", _provider()) as runtime:
        root = await runtime.start("review", cwd=tmp_path)
        taken: list[TreeStep] = []
        with trio.CancelScope() as scope:
            async for step in runtime.events(root):
                taken.append(step)
                if len(taken) == 3:
                    scope.cancel()  # takes effect at the reader's next wait
        broke = 0
        async for _ in runtime.events(root):
            broke += 1
            break
        result = await runtime.wait(root)
        assert len(taken) >= 3 and broke == 1
        assert (result.outcome, result.text) == (expected[0].outcome, expected[0].text)
        assert _shape(runtime, root) == expected[1]
        assert replay.verify(runtime.store, root, tree=True).ok


async def test_a_reader_ends_when_the_runtime_closes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    slow = script(100.0, root=[reply("late")])
    ended = trio.Event()
    steps: list[TreeStep] = []

    async def follow(runtime: Runtime, root: str) -> None:
        async for step in runtime.events(root):
            steps.append(step)
        ended.set()

    async with trio.open_nursery() as outer, open_runtime(tmp_path, slow) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        outer.start_soon(follow, runtime, root)
        await trio.sleep(1.0)  # the model call is still going
    assert ended.is_set()
    assert [s.seq for s in steps] == [0, 1]  # created, then the user's message


async def test_a_small_page_reads_on_until_everything_is_given(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: Any
) -> None:
    monkeypatch.setattr("fanfold.runtime.runtime.EVENTS_PAGE", 2)
    async with open_runtime(tmp_path, _provider()) as runtime:
        root = await runtime.start("review", cwd=tmp_path)
        await trio.sleep(2.5)  # more than a page is in the log
        steps = [step async for step in runtime.events(root)]
        assert _by_conversation(steps) == _logged(runtime, root)


async def test_reads_from_a_worker_thread_with_threaded_writes(tmp_path: Path) -> None:
    provider = script(
        0.0,
        root=[reply("delegating", spawn("a", "b")), reply("all done")],
        c1=[reply("", submit("result a"))],
        c2=[reply("", submit("result b"))],
    )
    async with Runtime.open(
        tmp_path / "log.db", provider, ToolSet.default(), logger=quiet_logger()
    ) as runtime:
        assert runtime.writer.threaded
        root = await runtime.start("review", cwd=tmp_path)
        steps = [step async for step in runtime.events(root)]
        assert _by_conversation(steps) == _logged(runtime, root)


async def test_without_phases_the_same_steps_come_unfolded(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_runtime(tmp_path, _provider()) as runtime:
        root = await runtime.start("review", cwd=tmp_path)
        steps = [step async for step in runtime.events(root, phases=False)]
        assert _by_conversation(steps) == _logged(runtime, root)
        assert all(step.phase is None for step in steps)


async def test_a_paged_reader_folds_each_event_of_an_events_only_log_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: Any
) -> None:
    # An events-only log's effects are derived by folding. A reader going page by
    # page hands the store the state it reached, so the store folds each page's own
    # events: before, it folded the conversation from seq 0 for every page
    # (quadratic in the log's length).
    import fanfold.db.store as store_module

    monkeypatch.setattr("fanfold.runtime.runtime.EVENTS_PAGE", 2)
    rounds = 12
    provider = script(1.0, root=[*(reply("", think()) for _ in range(rounds)), reply("done")])
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("review", cwd=tmp_path)
        await runtime.wait(root)
        logged = _logged(runtime, root)
        events = len(logged[root])
        assert events > 4 * 2  # many pages
        folds = 0
        store_module._load_reducer()  # the store binds the reducer's functions to fold
        real = getattr(store_module, "transition")  # noqa: B009 (imported there, not exported)

        def counted(state: Any, event: Any) -> Any:
            nonlocal folds
            folds += 1
            return real(state, event)

        monkeypatch.setattr(store_module, "transition", counted)
        steps = [step async for step in runtime.events(root)]
    assert _by_conversation(steps) == logged
    # Every event but the first (``start``) folded once by the store.
    assert folds == events - 1
