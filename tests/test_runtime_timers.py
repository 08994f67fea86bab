"""The runtime's timers (``fanfold.runtime.timers``): one heap, one task."""

from __future__ import annotations

import trio
import trio.testing

from fanfold.runtime.timers import Timers


class Owner:
    def __init__(self) -> None:
        self.fired: list[tuple[int, float]] = []

    def timer_fired(self, number: int) -> None:
        self.fired.append((number, trio.current_time()))


async def test_timers_fire_when_due_in_the_order_started_and_cancelled_ones_never(
    autojump_clock: object,
) -> None:
    owner = Owner()
    timers = Timers()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timers.run)
        await trio.testing.wait_all_tasks_blocked()
        timers.start(5.0, owner, 1)
        timers.start(2.0, owner, 2)
        timers.start(5.0, owner, 3)  # due with 1: after it, as started
        cancelled = timers.start(1.0, owner, 4)
        timers.start(2.0, owner, 5)
        cancelled.cancel()
        await trio.sleep(10)
        assert owner.fired == [(2, 2.0), (5, 2.0), (1, 5.0), (3, 5.0)]
        # Cancelled timers do not pile up: once most of the heap, it is rebuilt.
        for number in range(100):
            timers.start(1000.0, owner, 100 + number).cancel()
        assert len(timers._heap) < 100
        nursery.cancel_scope.cancel()
