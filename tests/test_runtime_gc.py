"""The runtime's collector policy: tuned while open (restored on close), or untouched."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from runtime_helpers import open_runtime, reply, script, spawn, submit

from fanfold.runtime.runtime import GC_TUNED_THRESHOLD, GC_YOUNG_PER_CONVERSATION
from fanfold.statemachine import Limits


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    """An application's own thresholds, distinct from both CPython's and fanfold's."""
    before = gc.get_threshold()
    gc.set_threshold(1234, 11, 12)
    try:
        yield (1234, 11, 12)
    finally:
        gc.set_threshold(*before)


async def test_tuned_raises_the_young_threshold_while_open_and_restores_it(
    tmp_path: Path, autojump_clock: object, thresholds: tuple[int, int, int]
) -> None:
    async with open_runtime(tmp_path, script(1.0, root=[reply("hi")])) as rt:
        assert gc.get_threshold() == (GC_TUNED_THRESHOLD, 11, 12)
        await rt.wait(await rt.start("go"))
        assert gc.get_threshold() == (GC_TUNED_THRESHOLD, 11, 12)
        # The start-up objects were moved out of the collector's way.
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == thresholds


async def test_tuned_scales_the_young_threshold_with_the_conversations_loaded(
    tmp_path: Path, autojump_clock: object, thresholds: tuple[int, int, int]
) -> None:
    # A round's objects (a step of every loaded conversation) must not fill the young
    # generation, or the collections per step grow with N: the threshold follows
    # what is loaded, and comes back down once the tree is at rest.
    n = GC_TUNED_THRESHOLD // GC_YOUNG_PER_CONVERSATION + 200
    limits = Limits(max_tasks_per_call=n, max_concurrent=n)
    provider = script(
        100.0,
        root=[reply("", spawn(*[f"task {i}" for i in range(n)]), latency=0), reply("done")],
        **{f"c{i + 1}": [reply("", submit("x"))] for i in range(n)},
    )
    async with open_runtime(tmp_path, provider, limits=limits) as rt:
        root = await rt.start("go", cwd=tmp_path)
        with trio.fail_after(600):
            while len(rt.running()) < n + 1:
                await trio.sleep(1)
        young, *older = gc.get_threshold()
        assert young >= GC_YOUNG_PER_CONVERSATION * (n + 1) and older == [11, 12]
        await rt.wait(root)
        with trio.fail_after(600):
            while rt.running():
                await trio.sleep(1)
        assert gc.get_threshold() == (GC_TUNED_THRESHOLD, 11, 12)
    assert gc.get_threshold() == thresholds


async def test_runtimes_open_together_restore_the_thresholds_when_the_last_closes(
    tmp_path: Path, autojump_clock: object, thresholds: tuple[int, int, int]
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with open_runtime(tmp_path / "a", script(1.0, root=[reply("hi")])):
        async with open_runtime(tmp_path / "b", script(1.0, root=[reply("hi")])):
            assert gc.get_threshold()[0] == GC_TUNED_THRESHOLD
        assert gc.get_threshold()[0] == GC_TUNED_THRESHOLD
    assert gc.get_threshold() == thresholds


async def test_tuned_restores_the_thresholds_when_the_body_raises(
    tmp_path: Path, autojump_clock: object, thresholds: tuple[int, int, int]
) -> None:
    raised = []
    try:
        async with open_runtime(tmp_path, script(1.0, root=[reply("hi")])):
            raise RuntimeError("boom")
    except* RuntimeError as group:
        raised = [str(exc) for exc in group.exceptions]
    assert raised == ["boom"]
    assert gc.get_threshold() == thresholds


async def test_untouched_leaves_the_collector_alone(
    tmp_path: Path, autojump_clock: object, thresholds: tuple[int, int, int]
) -> None:
    async with open_runtime(tmp_path, script(1.0, root=[reply("hi")]), gc_policy="untouched") as rt:
        await rt.wait(await rt.start("go"))
        assert gc.get_threshold() == thresholds
    assert gc.get_threshold() == thresholds


async def test_an_unknown_policy_is_refused_before_anything_is_opened(
    tmp_path: Path, autojump_clock: object, thresholds: tuple[int, int, int]
) -> None:
    with pytest.raises(ValueError, match="gc_policy"):
        async with open_runtime(tmp_path, script(1.0, root=[reply("hi")]), gc_policy="off"):
            pass
    assert not (tmp_path / "log.db").exists()
    assert gc.get_threshold() == thresholds
