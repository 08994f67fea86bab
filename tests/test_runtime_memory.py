"""What the runtime itself allocates per waiting sub-agent (bytes, not time: exact for
a given code, whatever the machine's load). ``bench`` measures the whole heap."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import trio
from runtime_helpers import open_runtime, reply, script, spawn, submit

import fanfold.runtime
from fanfold.statemachine import Limits

RUNTIME = str(Path(fanfold.runtime.__file__).parent)
N = 100


def _runtime_bytes(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes allocated by ``fanfold/runtime/`` code (the innermost frame's file)."""
    only = snapshot.filter_traces([tracemalloc.Filter(True, RUNTIME + "/*")])
    return sum(stat.size for stat in only.statistics("filename"))


async def test_a_waiting_sub_agent_costs_the_runtime_little(tmp_path: Path) -> None:
    # N children, each waiting on an hour-long model call; the root waits on them.
    limits = Limits(max_tasks_per_call=N, max_concurrent=N)
    provider = script(
        3600.0,
        root=[reply("", spawn(*[f"task {i}" for i in range(N)]), latency=0), reply("done")],
        **{f"c{i + 1}": [reply("", submit("x"))] for i in range(N)},
    )
    async with open_runtime(tmp_path, provider, limits=limits) as runtime:
        gc.collect()
        tracemalloc.start()
        try:
            before = _runtime_bytes(tracemalloc.take_snapshot())
            await runtime.start("go", cwd=tmp_path)
            with trio.fail_after(60):
                while len(runtime.running()) < N + 1 or runtime.writer.pending:
                    await trio.sleep(0.01)
                await trio.sleep(0.2)  # the children's calls have started
            gc.collect()
            after = _runtime_bytes(tracemalloc.take_snapshot())
        finally:
            tracemalloc.stop()
        per_child = (after - before) / N
        # Its actor (slots), the task of its call (the provider's coroutine is
        # created there), the call's cancel scope and context, its time-limit timer
        # and the parent's backstop for it: about 1.2 KB. A worker task parked per
        # conversation, an instance dict, a dict of one timer and a bound method
        # per timer made it 2.1 KB.
        assert per_child < 1_400, per_child


def _calls_in_flight(runtime: fanfold.runtime.Runtime) -> int:
    return sum(1 for actor in runtime._actors.values() if actor._call and actor._call.started)


async def test_a_waiting_sub_agent_costs_the_process_under_4_kib(tmp_path: Path) -> None:
    # Issue 21's measure, whole heap (every module's allocations): N children whose
    # hour-long scripted calls are all in flight, the root waiting on them. A call of
    # a provider that replies at once waits on a timer, not on a task of its own with
    # its cancel scope and coroutines (those were 1.9 KB of 4.7 KB per child).
    n = 200
    limits = Limits(max_tasks_per_call=n, max_concurrent=n)
    provider = script(
        3600.0,
        root=[reply("", spawn(*[f"task {i}" for i in range(n)]), latency=0), reply("done")],
        **{f"c{i + 1}": [reply("", submit("x"))] for i in range(n)},
    )
    async with open_runtime(tmp_path, provider, limits=limits) as runtime:
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            await runtime.start("go", cwd=tmp_path)
            with trio.fail_after(60):
                while _calls_in_flight(runtime) < n or runtime.writer.pending:
                    await trio.sleep(0.01)
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        per_child = (after - before) / n
        assert per_child < 4_096, per_child
