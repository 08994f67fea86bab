"""The engine: one task that folds, commits and starts the effects of every ready
conversation, in batches.

A conversation does not have a task of its own. Whatever reaches it (a model's reply, a
tool's result, a timer, a message from another conversation, an API call) goes to its
inbox and marks it *ready*. The engine takes every ready conversation at once, folds
each one's queued events through the pure reducer (``Actor.fold``), commits all the
resulting steps in one transaction (``LogWriter.write_batch``), and only then runs each
step's effects, in order (write-ahead: nothing is executed that is not in the log).
Events that arrive while a batch is committing wait for the next batch, so the number
of transactions follows the time spent committing, not the number of events.

Against a task per conversation this saves a task switch and a wake-up per step and a
task's memory per conversation: the loop runs as many conversations' steps as are ready
without switching. Model calls and tools that wait on the outside world run concurrently,
each on a worker of the runtime's pool while it is in flight (``calls.py``); tools that
answer in-process need none; timers share one heap (``timers.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

if TYPE_CHECKING:
    from fanfold.runtime.writer import LogWriter


class Foldable(Protocol):
    """A conversation the engine folds (``Actor``): whether it is in the ready queue,
    and ``fold``, which applies its queued events and hands the steps to the writer."""

    queued: bool

    def fold(self) -> None: ...


@attrs.frozen
class EngineStatistics:
    """What the engine did: ``rounds`` of folding (each followed by at most one
    commit), ``folds`` of one conversation's inbox, the most conversations folded in one
    round."""

    rounds: int
    folds: int
    largest_round: int


class Engine:
    """Folds ready conversations in batches and commits their steps through ``writer``.

    ``run`` is the engine's task (in the runtime's nursery); ``ready`` is called, from
    any task, when a conversation's inbox got something. ``after_round`` is called after
    each round that committed a batch, and before the engine waits for work;
    ``after_commit`` after each committed batch (and its callbacks), only then.
    """

    def __init__(
        self,
        writer: LogWriter,
        after_round: Callable[[], None] = lambda: None,
        after_commit: Callable[[], None] = lambda: None,
    ) -> None:
        self.writer = writer
        self._after_round = after_round
        self._after_commit = after_commit
        writer.wake = self._wake
        self._ready: deque[Foldable] = deque()
        self._waiter: trio.lowlevel.Task | None = None
        self._rounds = 0
        self._folds = 0
        self._largest = 0

    def ready(self, actor: Foldable) -> None:
        """``actor`` has something to fold (or may have come to rest): take it in the
        next round. An actor already waiting for its round is not queued twice."""
        if not actor.queued:
            actor.queued = True
            self._ready.append(actor)
            self._wake()

    def statistics(self) -> EngineStatistics:
        return EngineStatistics(self._rounds, self._folds, self._largest)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            trio.lowlevel.reschedule(waiter)

    def _abort_wait(self, _: Any) -> trio.lowlevel.Abort:
        self._waiter = None
        return trio.lowlevel.Abort.SUCCEEDED

    async def run(self) -> None:
        """Fold, commit and execute forever; cancel to stop (a commit in progress
        always finishes, but once the runtime is cancelled no effect starts)."""
        ready, writer, after_round = self._ready, self.writer, self._after_round
        while True:
            if ready or writer.pending:
                # Busy: still let the calls, timers and API callers run between rounds.
                await trio.lowlevel.checkpoint()
            else:
                after_round()  # nothing left to do: write the buffered log lines
                self._waiter = trio.lowlevel.current_task()
                await trio.lowlevel.wait_task_rescheduled(self._abort_wait)
            self._fold_ready()
            if writer.pending:
                # In a function of its own so that nothing of the batch stays alive in
                # this frame between rounds (see LogWriter.write_batch).
                await writer.write_batch()
                self._after_commit()
                # The log lines of the steps just committed and of the effects they
                # started (and of the calls that ended meanwhile): one write and one
                # flush per round, not per line (see fanfold.runtime.logging).
                after_round()

    def _fold_ready(self) -> None:
        """Fold every conversation that is ready now; those made ready meanwhile (an
        effect can only start after a commit, so only API callers can) wait for the
        next round."""
        ready = self._ready
        count = len(ready)
        if not count:
            return
        self._rounds += 1
        self._folds += count
        if count > self._largest:
            self._largest = count
        for _ in range(count):
            actor = ready.popleft()
            actor.queued = False
            actor.fold()
