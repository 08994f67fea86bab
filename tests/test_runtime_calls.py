"""The pool of call workers (``fanfold.runtime.calls``): a call is handed to an idle
worker, aborted where it is, and idle workers are retired when not wanted."""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable
from typing import Any

import trio
import trio.testing

from fanfold.runtime.calls import Call, Calls
from fanfold.runtime.timers import Timers

# The context the calls are made in: for the pool, a key (a new worker starts in the
# context current when it is started).
CONTEXT = contextvars.copy_context()


class Caller:
    """Runs each call as a sleep of ``call.request`` seconds; notes what happened."""

    def __init__(self) -> None:
        self.performed: list[int] = []
        self.ended: list[tuple[int, Any]] = []
        self.tasks: list[trio.lowlevel.Task] = []

    def perform(self, call: Call) -> Awaitable[str]:
        self.performed.append(call.number)
        self.tasks.append(trio.lowlevel.current_task())
        return self._sleep(call)

    async def _sleep(self, call: Call) -> str:
        await trio.sleep(call.request)
        if call.effect == "raise":
            raise ValueError(f"failed {call.number}")
        return f"result {call.number}"

    def call_done(self, call: Call, value: Any) -> None:
        self.ended.append((call.number, value))

    def call_failed(self, call: Call, error: Exception) -> None:
        self.ended.append((call.number, repr(error)))


async def test_a_call_runs_on_an_idle_worker(autojump_clock: object) -> None:
    caller = Caller()
    async with trio.open_nursery() as nursery:
        calls = Calls(nursery.start_soon, Timers())
        calls.start(Call(caller, 1, None, 1.0, 1), CONTEXT)
        await trio.sleep(2)
        assert caller.ended == [(1, "result 1")]
        calls.start(Call(caller, 2, None, 1.0, 1), CONTEXT)
        await trio.sleep(2)
        assert caller.ended == [(1, "result 1"), (2, "result 2")]
        # One worker served both: the second call did not start a task.
        assert calls.workers == 1 and caller.tasks[0] is caller.tasks[1]
        calls.trim(0)
        await trio.testing.wait_all_tasks_blocked()
        assert calls.workers == 0
        assert len(nursery.child_tasks) == 0


async def test_an_aborted_call_ends_unheard_and_its_worker_serves_on(
    autojump_clock: object,
) -> None:
    caller = Caller()
    async with trio.open_nursery() as nursery:
        calls = Calls(nursery.start_soon, Timers())
        running = Call(caller, 1, None, 100.0, 1)
        calls.start(running, CONTEXT)
        await trio.sleep(1)
        calls.cancel(running)
        await trio.sleep(200)
        assert caller.performed == [1] and caller.ended == []
        calls.start(Call(caller, 2, None, 1.0, 1), CONTEXT)
        await trio.sleep(2)
        assert caller.ended == [(2, "result 2")]
        assert calls.workers == 1 and caller.tasks[0] is caller.tasks[1]
        calls.trim(0)


async def test_a_call_aborted_before_it_started_never_runs(autojump_clock: object) -> None:
    caller = Caller()
    async with trio.open_nursery() as nursery:
        calls = Calls(nursery.start_soon, Timers())
        calls.start(Call(caller, 1, None, 1.0, 1), CONTEXT)
        await trio.sleep(2)  # its worker is idle now
        handed = Call(caller, 2, None, 1.0, 1)
        calls.start(handed, CONTEXT)  # handed over to the idle worker, which has not run yet
        calls.cancel(handed)
        await trio.sleep(5)
        assert caller.performed == [1] and caller.ended == [(1, "result 1")]
        # The worker is idle again, not lost: it takes the next call.
        calls.start(Call(caller, 3, None, 1.0, 1), CONTEXT)
        await trio.sleep(2)
        assert caller.ended[-1] == (3, "result 3") and calls.workers == 1
        calls.trim(0)


async def test_workers_are_kept_only_while_wanted(autojump_clock: object) -> None:
    caller = Caller()
    async with trio.open_nursery() as nursery:
        calls = Calls(nursery.start_soon, Timers())
        for number in range(3):
            calls.start(Call(caller, number, None, 1.0, 1), CONTEXT)
        await trio.sleep(2)
        assert calls.workers == 3
        calls.trim(1)  # one conversation still loaded
        await trio.testing.wait_all_tasks_blocked()
        assert calls.workers == 1 and len(nursery.child_tasks) == 1
        calls.trim(0)


async def test_what_a_call_raises_goes_to_its_caller(autojump_clock: object) -> None:
    caller = Caller()
    async with trio.open_nursery() as nursery:
        calls = Calls(nursery.start_soon, Timers())
        calls.start(Call(caller, 1, "raise", 1.0, 1), CONTEXT)
        await trio.sleep(2)
        assert caller.ended == [(1, "ValueError('failed 1')")]
        calls.start(Call(caller, 2, None, 1.0, 1), CONTEXT)  # the worker goes on
        await trio.sleep(2)
        assert caller.ended[-1] == (2, "result 2") and calls.workers == 1
        calls.trim(0)


async def test_a_worker_serves_only_calls_of_its_context(autojump_clock: object) -> None:
    caller = Caller()
    other = contextvars.copy_context()
    async with trio.open_nursery() as nursery:
        calls = Calls(nursery.start_soon, Timers())
        calls.start(Call(caller, 1, None, 1.0, 1), CONTEXT)
        await trio.sleep(2)
        calls.start(Call(caller, 2, None, 1.0, 1), other)
        await trio.sleep(2)
        assert caller.tasks[0] is not caller.tasks[1] and calls.workers == 2
        calls.start(Call(caller, 3, None, 1.0, 1), CONTEXT)
        await trio.sleep(2)
        assert caller.tasks[2] is caller.tasks[0] and calls.workers == 2
        calls.trim(0)


LABEL: contextvars.ContextVar[str] = contextvars.ContextVar("label", default="none")


class Heard(Caller):
    """Notes, with each ending, the ``LABEL`` of the context it was heard in."""

    def call_done(self, call: Call, value: Any) -> None:
        self.ended.append((call.number, (value, LABEL.get())))

    def call_failed(self, call: Call, error: Exception) -> None:
        self.ended.append((call.number, (repr(error), LABEL.get())))


async def test_a_scheduled_call_ends_on_its_timer_without_a_task(autojump_clock: object) -> None:
    # A call whose outcome is known when it starts (a provider that replies at once)
    # waits on the runtime's timers: no worker, no task; it ends when due, in the
    # context it was scheduled in; an exception as its outcome is a failure; one
    # cancelled before it is due is never heard of.
    caller = Heard()
    timers = Timers()
    context = contextvars.copy_context()
    context.run(LABEL.set, "tree A")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timers.run)
        await trio.testing.wait_all_tasks_blocked()
        calls = Calls(nursery.start_soon, timers)
        first, second, third = (Call(caller, n, None, None, 1) for n in (1, 2, 3))
        calls.schedule(first, 5.0, "reply 1", context)
        calls.schedule(second, 3.0, ValueError("broken"), context)
        calls.schedule(third, 4.0, "reply 3", context)
        assert first.started and calls.workers == 0 and len(nursery.child_tasks) == 1
        await trio.sleep(3.5)
        assert caller.ended == [(2, ("ValueError('broken')", "tree A"))]
        calls.cancel(third)
        await trio.sleep(2)
        assert caller.ended == [(2, ("ValueError('broken')", "tree A")), (1, ("reply 1", "tree A"))]
        assert trio.current_time() == 5.5
        calls.cancel(first)  # ended already: nothing happens
        assert caller.performed == [] and calls.workers == 0
        assert timers._heap == []  # nothing of the calls is kept
        nursery.cancel_scope.cancel()
