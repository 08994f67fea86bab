"""The runtime's timers (``StartTimer``, ``ScheduleRetry``): one task for all of them.

A parent with a thousand children holds a thousand deadline timers, and each child
one of its own; most are aborted (``AbortCall``) when the child reports. A task, a
cancel scope and a ``trio.sleep`` per timer, and a Cancelled exception per abort, cost
more than everything else the runtime does for a child. Here a timer is an entry in a
heap, an abort marks it dead, and one task, whose cancel scope carries the earliest
deadline, fires whatever is due. Deadlines are the ones ``trio.sleep`` would have
used (also under a mock clock); timers due at the same moment fire in the order they
were started.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Protocol

import trio


class Owner(Protocol):
    """Whoever started a timer: told its number when it fires."""

    def timer_fired(self, number: int) -> None: ...


class Timer:
    """One started timer; ``cancel()`` before it fires and it never does.

    It calls ``owner.timer_fired(number)``: its owner and a number rather than a
    closure, a ``functools.partial`` or even a bound method per timer (64 bytes each:
    a parent holds one timer per child)."""

    __slots__ = ("deadline", "number", "owner", "timers")

    def __init__(self, deadline: float, owner: Owner, number: int, timers: Timers) -> None:
        self.deadline = deadline
        self.owner: Owner | None = owner
        self.number = number
        self.timers: Timers | None = timers

    def cancel(self) -> None:
        timers = self.timers
        self.owner = self.timers = None
        if timers is not None:
            timers.cancelled()


class Timers:
    """Starts timers and fires them from ``run`` (a task of the runtime's nursery)."""

    def __init__(self) -> None:
        # (deadline, order, timer): compared as tuples, in C. A ``__lt__`` on the
        # timer cost a Python call per comparison, log2 of the timers started
        # per push and pop (3 timers per waiting sub-agent: about 10 calls a step at
        # N = 10,000, and growing with N).
        self._heap: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()
        self._scope: trio.CancelScope | None = None
        self._dead = 0  # cancelled timers still in the heap

    def cancelled(self) -> None:
        """A timer in the heap was cancelled. Cancelled timers stay in the heap until
        they come to its top; once they are most of it, it is rebuilt without them, so
        a long-lived runtime whose children report long before their backstop timers
        are due does not hold every cancelled timer until then."""
        self._dead += 1
        heap = self._heap
        if 2 * self._dead > len(heap):
            heap[:] = [entry for entry in heap if entry[2].owner is not None]
            heapq.heapify(heap)
            self._dead = 0

    def start(self, delay: float, owner: Owner, number: int = 0) -> Timer:
        """Call ``owner.timer_fired(number)`` (in the timers' task) once ``delay``
        seconds have passed."""
        if math.isnan(delay) or delay < 0:
            raise ValueError(f"a timer's delay must be a number >= 0, got {delay}")
        deadline = trio.current_time() + delay
        timer = Timer(deadline, owner, number, self)
        heapq.heappush(self._heap, (deadline, next(self._order), timer))
        scope = self._scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline
        return timer

    async def run(self) -> None:
        """Fire due timers forever; cancel to stop."""
        heap = self._heap
        while True:
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                timer = heapq.heappop(heap)[2]
                owner, timer.owner, timer.timers = timer.owner, None, None
                if owner is not None:
                    owner.timer_fired(timer.number)
                else:
                    self._dead -= 1
            # Nothing that fired stays alive in this frame while it sleeps (an owner
            # is a conversation's actor or a call, which holds its actor; a fired
            # timer holds neither).
            owner = None
            while heap and heap[0][2].owner is None:
                heapq.heappop(heap)  # aborted: no need to wake up for it
                self._dead -= 1
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None
