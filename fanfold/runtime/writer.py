"""The single writer path: group commit of steps from many conversations.

Write-ahead: a step's effects run only once the step is durably in the log. The engine
(``engine.py``) hands each folded conversation's steps to the writer with a callback
(``submit``), then has it commit everything queued in one transaction
(``write_batch``), which runs the callbacks of that batch in submission order: that is
where the effects execute. Steps that queue up while a batch is being written go into
the next batch together, so the number of transactions grows with time spent writing,
not with the number of events.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from fanfold.db import Step


@attrs.frozen
class WriterStatistics:
    steps: int
    batches: int
    largest_batch: int


Append = Callable[[Sequence[Step]], Any]
"""``Store.append``: records a batch of steps atomically; its return value, if it is a
list with one entry per step, is passed back to the callbacks (see ``submit``)."""


class LogWriter:
    """Commits steps in batches through ``append``, in a worker thread if ``threaded``."""

    def __init__(self, append: Append, *, threaded: bool = True):
        self._append = append
        self._threaded = threaded
        self._steps: list[Step] = []
        self._callbacks: list[tuple[int, Callable[[Sequence[Any]], None]]] = []
        self.wake: Callable[[], None] = _nothing
        """Called when steps are queued: the engine that commits them (``Engine``)."""
        self._count = 0
        self._batches = 0
        self._largest = 0

    def submit(self, steps: Sequence[Step], on_commit: Callable[[Sequence[Any]], None]) -> None:
        """Queue ``steps``; once they are committed the writer calls ``on_commit`` with
        what ``append`` reported for them (or an empty list), in its own task.

        Callbacks run in the order they were submitted. A callback that raises is a bug
        in fanfold: it propagates and stops the runtime.
        """
        self._callbacks.append((len(steps), on_commit))
        self._steps.extend(steps)
        self.wake()

    @property
    def threaded(self) -> bool:
        """Whether batches are written from a worker thread (a file database)."""
        return self._threaded

    @property
    def pending(self) -> bool:
        """Whether steps are queued and not yet committed."""
        return bool(self._callbacks)

    async def commit(self, *steps: Step) -> None:
        """Return once every step in ``steps`` is durably in the log."""
        done = trio.Event()
        self.submit(steps, lambda _: done.set())
        await done.wait()

    def statistics(self) -> WriterStatistics:
        return WriterStatistics(self._count, self._batches, self._largest)

    async def write_batch(self) -> None:
        """Commit what is queued, then run its callbacks in order."""
        steps, callbacks = self._steps, self._callbacks
        self._steps, self._callbacks = [], []
        if self._threaded:
            reported = await trio.to_thread.run_sync(self._append, steps)
        else:
            reported = self._append(steps)
        if type(reported) is not list or len(reported) != len(steps):
            reported = []
        self._count += len(steps)
        self._batches += 1
        self._largest = max(self._largest, len(steps))
        # A cancel that arrived while the thread wrote: the batch is in the log, but
        # nothing more may start (resume re-issues what was in flight).
        await trio.lowlevel.checkpoint_if_cancelled()
        start = 0
        for count, on_commit in callbacks:
            on_commit(reported[start : start + count] if reported else reported)
            start += count


def _nothing() -> None:
    pass
