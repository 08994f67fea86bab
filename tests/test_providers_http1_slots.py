"""``http1.Slots`` (issue 36): the own HTTP path's slots in front of its pool, a
counter and a line instead of ``trio.CapacityLimiter``. At most ``total_tokens``
held at once, waiters served in the order they came, a waiter cancelled in line
never costs a slot, and a cancelled free acquire gives its slot back."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from fanfold.providers.http1 import Slots


async def test_slots_are_shared_in_order_and_a_cancelled_waiter_loses_none() -> None:
    slots = Slots(2)
    order: list[int] = []
    held = 0
    most = 0
    scopes: dict[int, trio.CancelScope] = {}
    go = trio.Event()

    async def call(number: int) -> None:
        nonlocal held, most
        with trio.CancelScope() as scope:
            scopes[number] = scope
            try:
                slots.acquire_on_behalf_of_nowait(number)
            except trio.WouldBlock:
                await slots.acquire_on_behalf_of(number)
            try:
                order.append(number)
                held += 1
                most = max(most, held)
                await go.wait()
                await trio.sleep(0)
                held -= 1
            finally:
                slots.release_on_behalf_of(number)

    async with trio.open_nursery() as nursery:
        for number in range(6):
            nursery.start_soon(call, number)
            await trio.testing.wait_all_tasks_blocked()
        scopes[3].cancel()  # in line behind 2: leaves it, takes nothing
        await trio.testing.wait_all_tasks_blocked()
        go.set()
    assert most == 2
    # Served in the order they came (two handed over at once run in either order).
    assert [set(order[:2]), set(order[2:4]), order[4:]] == [{0, 1}, {2, 4}, [5]]
    assert slots.borrowed_tokens == 0 and slots._waiting == 0
    slots.acquire_on_behalf_of_nowait(None)
    slots.acquire_on_behalf_of_nowait(None)
    with pytest.raises(trio.WouldBlock):
        slots.acquire_on_behalf_of_nowait(None)


async def test_a_free_acquire_cancelled_at_its_checkpoint_gives_its_slot_back() -> None:
    slots = Slots(1)
    with trio.CancelScope() as scope:
        scope.cancel()
        await slots.acquire_on_behalf_of(None)
    assert scope.cancelled_caught
    assert slots.borrowed_tokens == 0
