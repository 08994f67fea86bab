"""The calls in flight (model calls, tools that do I/O): a pool of worker tasks.

A call waits on the outside world, so it needs a task; a conversation does not (the
engine folds it). Each call is a ``Call`` handed to an idle worker of the runtime's
pool, or to a new one when none is idle; a worker that finished its call parks, idle,
for the next call of any conversation. Handing a call to a parked worker costs a
reschedule and a task switch; starting a task costs about 70 k instructions more
(``bench/README.md``), and most calls follow another call's end (a conversation's
next round), so the pool starts about as many tasks as calls are ever in flight at
once, not one per call. Idle workers are kept while they might serve a loaded
conversation (no more workers than conversations loaded, ``trim``): a runtime whose
trees ended goes back to its own tasks.

Each worker runs its calls inside a cancel scope it keeps until one is aborted
(``cancel``): a new scope per call would cost as much as the task.

A worker runs in the context (``contextvars``) it was started in, as any task does, so
it serves only calls made in that context: a conversation's calls run in its context
(the API caller's that created its tree), as they would in a task of its own. The
conversations of one tree share one context object, so they share their workers.

A model call whose provider knows its outcome at once (``RepliesAtOnce``: the scripted
provider, which only simulates latency) needs no task at all: ``schedule`` sets a
timer of the runtime's heap (``timers.py``) that delivers the outcome when it is due,
and ``cancel`` cancels that timer. A thousand sub-agents waiting on such calls hold a
thousand timer entries instead of a thousand Trio tasks, cancel scopes and coroutines
(about 1.9 KB each, ``bench/README.md``).

A provider that can only make so many calls at once (``LimitsCallsAtOnce``: an HTTP
provider, whose client has a pool of connections) gets at most that many workers: a
call past the limit waits in a queue of its gate (``Gate``) as the ``Call`` it already
is, with no task, no request body and no place in httpx's pool queue, and starts, in
the order the calls came, when one of the gate's calls ends (issue 36: 46 KiB per
waiting call, and CPU quadratic in the calls queued in httpcore's pool, before).
"""

from __future__ import annotations

import contextvars
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

if TYPE_CHECKING:
    from fanfold.runtime.timers import Timer, Timers


class Caller(Protocol):
    """Who made a call (``Actor``): says what to await for it, and hears how that
    ended (never when the call was aborted)."""

    def perform(self, call: Call) -> Awaitable[Any]:
        """What to await for ``call`` (the provider's ``complete``, a tool's run)."""
        ...

    def call_done(self, call: Call, value: Any) -> None:
        """``call``'s awaitable returned ``value``."""
        ...

    def call_failed(self, call: Call, error: Exception) -> None:
        """``call``'s awaitable raised ``error``."""
        ...


class Call:
    """One call in flight: who made it, its number, and what it runs (``perform``'s
    business: the effect, the model request, the attempt)."""

    __slots__ = (
        "attempt",
        "caller",
        "context",
        "effect",
        "gate",
        "note",
        "number",
        "outcome",
        "request",
        "started",
        "timer",
        "worker",
    )

    def __init__(self, caller: Caller, number: int, effect: Any, request: Any, attempt: int):
        self.caller = caller
        self.number = number
        self.effect = effect
        self.request = request
        self.attempt = attempt
        self.worker: _Worker | None = None  # None once it ended or was aborted
        self.started = False
        self.note: Any = None  # the caller's, from ``perform`` to the end
        # A scheduled call (``Calls.schedule``): its timer (None once it fired or was
        # cancelled), the outcome it delivers, and the context its caller hears it in.
        self.timer: Timer | None = None
        self.outcome: Any = None
        self.context: contextvars.Context | None = None
        # A call of a gate (``Calls.start_gated``): the gate, while the call counts
        # against it (queued or running); its context while it is queued.
        self.gate: Gate | None = None

    def timer_fired(self, _: int) -> None:
        """A scheduled call is due (``timers.Owner``): its caller hears its outcome,
        in the caller's context, as a worker would have told it."""
        outcome, context = self.outcome, self.context
        self.timer = self.outcome = self.context = None
        assert context is not None
        if isinstance(outcome, Exception):
            context.run(self.caller.call_failed, self, outcome)
        else:
            context.run(self.caller.call_done, self, outcome)


class Gate:
    """At most ``capacity`` calls running at once; the others wait in ``queue`` (a
    cancelled one stays there, with no gate, until it reaches the front)."""

    __slots__ = ("capacity", "queue", "running")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.running = 0
        self.queue: deque[Call] = deque()


class _Worker:
    __slots__ = ("call", "context", "pool", "retire", "scope", "task")

    def __init__(self, pool: Calls, call: Call | None, context: contextvars.Context) -> None:
        self.pool = pool
        self.context = context  # the context it was started in: it serves its calls
        self.call = call
        self.task: trio.lowlevel.Task | None = None  # set while parked, idle
        self.scope: trio.CancelScope | None = None
        self.retire = False

    def unpark(self, _: Any) -> trio.lowlevel.Abort:
        """Cancelled while idle: the runtime is closing."""
        if self.task is not None:
            self.pool._take_idle(self)
            self.task = None
        return trio.lowlevel.Abort.SUCCEEDED


_WORKER = "fanfold call"  # one name for every worker (Trio formats one per task otherwise)


class Calls:
    """The pool: ``start`` a call, ``cancel`` it; ``trim`` idle workers."""

    def __init__(self, start_soon: Callable[..., None], timers: Timers) -> None:
        self._start_soon = start_soon
        self._timers = timers
        # Idle workers by their context's id (a Context is not hashable; the workers
        # keep theirs alive, so an id in here is never reused).
        self._idle: dict[int, list[_Worker]] = {}
        self._workers = 0

    @property
    def workers(self) -> int:
        """How many worker tasks there are, busy or idle (not counting retired ones
        that have not returned yet)."""
        return self._workers

    def start(self, call: Call, context: contextvars.Context) -> None:
        """Run ``call`` on an idle worker of ``context``, or on a new one; the caller
        runs in ``context`` (``context.run``), so a new worker starts in it."""
        idle = self._idle.get(id(context))
        if idle:
            worker = idle.pop()
            if not idle:
                del self._idle[id(context)]
            worker.call = call
            call.worker = worker
            task, worker.task = worker.task, None
            assert task is not None
            trio.lowlevel.reschedule(task)
        else:
            worker = _Worker(self, call, context)
            call.worker = worker
            self._workers += 1
            self._start_soon(self._work, worker, name=_WORKER)

    def start_gated(self, call: Call, context: contextvars.Context, gate: Gate) -> None:
        """``start`` once fewer than ``gate.capacity`` of the gate's calls run; until
        then ``call`` waits in the gate's queue (not ``started``)."""
        call.gate = gate
        if gate.running < gate.capacity and not gate.queue:
            gate.running += 1
            self.start(call, context)
        else:
            call.context = context
            gate.queue.append(call)

    def _gate_freed(self, gate: Gate) -> None:
        """One of ``gate``'s calls ended: the next queued one (not cancelled) runs."""
        gate.running -= 1
        queue = gate.queue
        while queue:
            call = queue.popleft()
            if call.gate is gate:  # not cancelled while it waited
                context, call.context = call.context, None
                assert context is not None
                gate.running += 1
                self.start(call, context)
                return

    def schedule(
        self, call: Call, delay: float, outcome: Any, context: contextvars.Context
    ) -> None:
        """End ``call`` with ``outcome`` once ``delay`` seconds have passed, with no
        task: its caller hears ``call_failed`` if ``outcome`` is an exception, else
        ``call_done``, in ``context``."""
        call.outcome, call.context = outcome, context
        call.started = True
        call.timer = self._timers.start(delay, call)

    def cancel(self, call: Call) -> None:
        """Abort ``call``: one handed over and not started never starts; a running
        one is cancelled (its caller hears nothing more of it)."""
        timer = call.timer
        if timer is not None:  # a scheduled call: its timer never fires
            call.timer = call.outcome = call.context = None
            timer.cancel()
            return
        gate = call.gate
        if gate is not None and call.worker is None:  # queued: it never starts
            call.gate = call.context = None
            return
        worker = call.worker
        call.worker = None
        if worker is None or worker.call is not call:
            return  # it ended already
        worker.call = None  # handed over and not started: it never starts
        if call.started and worker.scope is not None:
            worker.scope.cancel()  # running: cancelled where it waits (``_work``
            # frees its gate once it has unwound)
        elif not call.started:
            self._ended(call)

    def trim(self, wanted: int) -> None:
        """Retire idle workers while there are more workers than ``wanted`` (the
        conversations loaded: none of them can have more than one call in flight
        but rarely, and a runtime at rest needs none)."""
        while self._idle and self._workers > wanted:
            key, idle = next(iter(self._idle.items()))
            worker = idle.pop()
            if not idle:
                del self._idle[key]
            worker.retire = True
            self._workers -= 1
            task, worker.task = worker.task, None
            assert task is not None
            trio.lowlevel.reschedule(task)

    def _ended(self, call: Call) -> None:
        """``call`` ran and ended (or was aborted while it ran): its gate is freed."""
        gate = call.gate
        if gate is not None:
            call.gate = None
            self._gate_freed(gate)

    def _take_idle(self, worker: _Worker) -> None:
        idle = self._idle[id(worker.context)]
        idle.remove(worker)
        if not idle:
            del self._idle[id(worker.context)]

    async def _work(self, worker: _Worker) -> None:
        try:
            while not worker.retire:
                running: Call | None = None
                with trio.CancelScope() as scope:
                    worker.scope = scope
                    while not worker.retire:
                        call = worker.call
                        if call is None:
                            worker.task = trio.lowlevel.current_task()
                            self._idle.setdefault(id(worker.context), []).append(worker)
                            await trio.lowlevel.wait_task_rescheduled(worker.unpark)
                            continue
                        call.started = True
                        running = call
                        # The caller's awaitable is awaited right here: no frame of
                        # the caller's own stays alive while the call waits.
                        try:
                            value = await call.caller.perform(call)
                        except Exception as error:
                            worker.call = running = None
                            self._ended(call)
                            if call.worker is worker:  # not aborted meanwhile
                                call.worker = None
                                call.caller.call_failed(call, error)
                        else:
                            worker.call = running = None
                            self._ended(call)
                            if call.worker is worker:
                                call.worker = None
                                call.caller.call_done(call, value)
                # The scope was cancelled: its call was aborted. A fresh one for the next.
                worker.call = None
                if running is not None:
                    self._ended(running)
        finally:
            if not worker.retire:  # cancelled (the runtime closing): not retired
                self._workers -= 1
