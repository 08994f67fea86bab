"""The single writer path: group commit of steps from many conversations.

Write-ahead: a step's effects run only once the step is durably in the log. The engine
(``engine.py``) hands each folded conversation's steps to the writer with a callback
(``submit``), then has it commit everything queued in one transaction
(``write_batch``), which runs the callbacks of that batch in submission order: that is
where the effects execute. Steps that queue up while a batch is being written go into
the next batch together, so the number of transactions grows with time spent writing,
not with the number of events.

A batch refused with ``TreeTakenOver`` (a PostgreSQL log: another runtime claimed one
of its trees since this one did) was written not at all. The writer tells the runtime
(``taken_over``: it drops every conversation of that tree) and writes the batch again
without that tree's steps, whose callbacks never run: their effects never execute
(write-ahead), and the other trees go on as if nothing happened.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from fanfold.db import Step, TreeTakenOver, claim_unit


class TreeDropped(TreeTakenOver):
    """This runtime stopped running tree ``root_id``: a commit of it was refused
    because another runtime claimed the tree (the ``TreeTakenOver``, also
    ``__cause__``). Its conversations were dropped from this runtime (their calls,
    timers and tools stopped, nothing more of them written); the new owner goes on
    from the log. Raised by ``Runtime.wait`` and by an API call whose event was not
    committed (``send``, ``cancel``) for that tree, until this runtime claims it
    again (``resume``)."""

    def __init__(self, taken: TreeTakenOver) -> None:
        super().__init__(
            taken.root_id,
            f"tree {taken.root_id!r} was dropped by this runtime: {taken}",
        )
        self.__cause__ = taken


OnCommit = Callable[[Sequence[Any]], None]
OnDrop = Callable[[TreeTakenOver], None]


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

    def __init__(
        self, append: Append, *, threaded: bool = True, units: Mapping[str, str] | None = None
    ):
        self._append = append
        self._units: Mapping[str, str] = {} if units is None else units
        """The store's units (``claim_unit``): a chunk's conversations are claimed by it."""
        self._threaded = threaded
        self._steps: list[Step] = []
        self._callbacks: list[tuple[int, OnCommit, OnDrop | None]] = []
        self.wake: Callable[[], None] = _nothing
        """Called when steps are queued: the engine that commits them (``Engine``)."""
        self.taken_over: Callable[[TreeTakenOver], None] | None = None
        """Called when a batch is refused with ``TreeTakenOver`` (the runtime drops that
        tree's conversations), before the batch is written again without that tree's
        steps. None: the error propagates (and stops the engine)."""
        self._count = 0
        self._batches = 0
        self._largest = 0

    def submit(
        self, steps: Sequence[Step], on_commit: OnCommit, on_drop: OnDrop | None = None
    ) -> None:
        """Queue ``steps``; once they are committed the writer calls ``on_commit`` with
        what ``append`` reported for them (or an empty list), in its own task.

        Callbacks run in the order they were submitted. A callback that raises is a bug
        in fanfold: it propagates and stops the runtime. If the steps are never written
        because their tree was taken over (see ``taken_over``), ``on_drop`` is called
        with the ``TreeTakenOver`` instead (None: nothing is called).
        """
        self._callbacks.append((len(steps), on_commit, on_drop))
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
        """Return once every step in ``steps`` is durably in the log (TreeDropped if
        their tree was taken over and they were not written)."""
        done = trio.Event()
        dropped: list[TreeTakenOver] = []

        def on_drop(taken: TreeTakenOver) -> None:
            dropped.append(taken)
            done.set()

        self.submit(steps, lambda _: done.set(), on_drop)
        await done.wait()
        if dropped:
            raise TreeDropped(dropped[0])

    def statistics(self) -> WriterStatistics:
        return WriterStatistics(self._count, self._batches, self._largest)

    async def write_batch(self) -> None:
        """Commit what is queued, then run its callbacks in order."""
        steps, callbacks = self._steps, self._callbacks
        self._steps, self._callbacks = [], []
        while True:
            try:
                reported = await self._append_batch(steps)
                break
            except TreeTakenOver as taken:
                if self.taken_over is None:
                    raise
                # Nothing of the batch was written. The tree's conversations are
                # dropped first (nothing more of them is submitted), then the batch
                # goes again without their steps; another tree taken over too is
                # found by the next try. (``root_id`` names the unit claimed, as
                # ``claim_unit`` names a step's; read before the drop, which forgets
                # the units of the conversations it unloads.)
                unit = taken.root_id
                units = self._units
                gone = {
                    step.conversation_id
                    for step in (*steps, *self._steps)
                    if claim_unit(step.state, units) == unit
                }
                if not any(step.conversation_id in gone for step in steps):
                    raise  # not a tree of this batch: writing it again would loop
                self.taken_over(taken)
                steps, callbacks = _without(gone, steps, callbacks, taken)
                # Queued meanwhile for the next batch: refused as surely.
                self._steps, self._callbacks = _without(gone, self._steps, self._callbacks, taken)
        if type(reported) is not list or len(reported) != len(steps):
            reported = []
        if steps:
            self._count += len(steps)
            self._batches += 1
            self._largest = max(self._largest, len(steps))
        # A cancel that arrived while the thread wrote: the batch is in the log, but
        # nothing more may start (resume re-issues what was in flight).
        await trio.lowlevel.checkpoint_if_cancelled()
        start = 0
        for count, on_commit, _ in callbacks:
            on_commit(reported[start : start + count] if reported else reported)
            start += count

    async def _append_batch(self, steps: list[Step]) -> Any:
        if not steps:
            return []
        if self._threaded:
            return await trio.to_thread.run_sync(self._append, steps)
        return self._append(steps)


Callbacks = list[tuple[int, OnCommit, OnDrop | None]]


def _without(
    gone: set[str], steps: list[Step], callbacks: Callbacks, taken: TreeTakenOver
) -> tuple[list[Step], Callbacks]:
    """``steps`` and their ``callbacks`` without the submissions that hold a step of a
    conversation in ``gone``; each one taken out hears ``on_drop``."""
    kept_steps: list[Step] = []
    kept: Callbacks = []
    start = 0
    for callback in callbacks:
        count, _, on_drop = callback
        group = steps[start : start + count]
        start += count
        if any(step.conversation_id in gone for step in group):
            if on_drop is not None:
                on_drop(taken)
        else:
            kept_steps.extend(group)
            kept.append(callback)
    return kept_steps, kept


def _nothing() -> None:
    pass
