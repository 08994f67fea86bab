"""One conversation's live side: its inbox, its committed state, its calls and timers.

The actor never decides anything the reducer should decide. It turns effects into
I/O (model calls, tools, timers, messages to other conversations) and I/O outcomes
back into events.

An actor has no task of its own: the runtime's engine (``engine.py``) folds what its
inbox holds through ``transition`` (``fold``), together with every other ready
conversation, hands the steps to the writer with a callback, and commits the batch.
Once the steps are committed the callback runs: only then does the actor's visible
``state`` move on and do the steps' effects execute, in order. Steps of one
conversation are committed, and their effects run, in the order they were made.

An actor is loaded while its conversation has work in flight. Once the conversation
is at rest (a root Idle or in Error, a sub-agent Completed or Failed), every step it
made is committed and its inbox is empty, its call and timers are stopped and the
runtime forgets it (``Runtime.unloaded``): a long-lived runtime holds only the
conversations that are working. The log has everything else.
"""

from __future__ import annotations

import contextvars
import functools
import os
import time
import traceback
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import trio

from fanfold.db import Step, TreeTakenOver
from fanfold.providers.base import (
    CallContext,
    ProviderContractError,
    ProviderError,
    StreamProgress,
    check_error,
    checked_reply,
)
from fanfold.runtime.calls import Call
from fanfold.runtime.host import Host
from fanfold.runtime.timers import Timer
from fanfold.runtime.writer import TreeDropped
from fanfold.statemachine import (
    AbortCall,
    AskUser,
    CallModel,
    CancelRequested,
    CancelSubAgents,
    Conversation,
    Effect,
    ErrorKind,
    Event,
    IllegalTransition,
    ModelError,
    ModelFailed,
    ModelReplied,
    ModelReply,
    ModelRequest,
    NotifyParent,
    RequestApproval,
    RuntimeResumed,
    RunTool,
    ScheduleRetry,
    SpawnSubAgent,
    StartTimer,
    SubAgentFinished,
    TimerFired,
    ToolCall,
    ToolFinished,
    ToolResult,
    TurnFinished,
    model_request,
    transition,
)
from fanfold.statemachine.permissions import link_refusal
from fanfold.statemachine.phases import Completed, Error, Failed
from fanfold.statemachine.state import tree_path as place_in_tree
from fanfold.tools.progress import CURRENT_CALL


class NotRunning(LookupError):
    """The conversation exists but is not loaded in this runtime (also
    ``fanfold.runtime.runtime.NotRunning``: defined here so the actor, which raises it
    for an unloaded tree, imports nothing above it)."""


@attrs.define
class _Submission:
    """An event from the API, whose caller waits to hear whether it was accepted."""

    event: Event
    done: trio.Event = attrs.field(factory=trio.Event)
    error: IllegalTransition | TreeDropped | None = None


# The API submissions of a fold's steps, by the step's index in the fold (None: no
# step of the fold was an API call's, as almost always).
_Waiting = dict[int, _Submission] | None


def tree_path(state: Conversation) -> str:
    """'root', 'root/1', 'root/1/2': the conversation's place in its tree."""
    return place_in_tree(state.id, state.root_id)


# Shared empty mappings, never written to: most conversations never need their own.
_NO_CALLS: dict[int, Call] = {}
_NO_TIMERS: dict[int, float] = {}
_NO_TIMER_OBJECTS: dict[int, Timer] = {}


class Actor:
    """The live side of one conversation inside a Runtime.

    ``state`` and ``seq`` are the committed state and its seq; the reducer may already
    have moved further (steps handed to the writer but not yet committed).
    """

    # Slots: a thousand waiting sub-agents are a thousand actors. ``__dict__`` is made
    # only if something sets another attribute (a test replacing a method): a
    # pointer per actor until then.
    __slots__ = (
        "__dict__",
        "_at_rest_event",
        "_call",
        "_context",
        "_dropped",
        "_head",
        "_head_seq",
        "_inbox",
        "_log",
        "_log_lifecycle",
        "_log_transitions",
        "_logged",
        "_more",
        "_path",
        "_snapshot_asked",
        "_snapshot_size",
        "_timer",
        "_timers",
        "_timers_started",
        "_uncommitted",
        "_unloaded",
        "last_turn",
        "queued",
        "runtime",
        "seq",
        "state",
    )

    def __init__(
        self,
        runtime: Host,
        state: Conversation,
        seq: int,
        *,
        created: bool,
        timers_started: dict[int, float] | None = None,
        context: contextvars.Context | None = None,
    ) -> None:
        self.runtime = runtime
        self.state = state
        self.seq = seq
        # Set when the conversation comes to rest; made only when someone waits (most
        # sub-agents are never waited on directly, and a trio.Event is 200 bytes).
        self._at_rest_event: trio.Event | None = None
        self.last_turn: TurnFinished | None = None
        self._head = state  # the state after the last step handed to the writer
        self._head_seq = seq
        # Snapshot policy (see runtime.py): bytes of events committed since the last
        # snapshot, and that snapshot's size (None: not known yet, then the creation
        # event's size stands for the state start() rebuilds for free; 0 for an actor
        # loaded from the log, resumed or attached, whose first snapshot is due at once).
        self._logged = 0
        self._snapshot_size: int | None = None if created else 0
        self._snapshot_asked = False
        # A list, not a deque: it is drained whole each round, and an empty deque
        # costs 600 bytes (a block of 64 slots) per loaded conversation. None while
        # empty (most conversations wait with nothing queued): an empty list is 56.
        self._inbox: list[Event | _Submission] | None = None
        self.queued = False
        """Whether the engine has this actor in its ready queue (see ``Engine.ready``)."""
        self._unloaded = False
        # Set when its tree was taken over by another runtime (``drop``): inert from
        # then on, and ``wait_at_rest`` raises.
        self._dropped: TreeTakenOver | None = None
        # The call in flight, and, rarely, more: a call started while an aborted one
        # still unwinds (see ``_start``).
        self._call: Call | None = None
        self._more: dict[int, Call] = _NO_CALLS
        # The timers started and not fired nor aborted: the first in a slot (a
        # sub-agent mostly has one, its time limit), more in a dict (a parent's
        # backstops for its children), made when needed: a dict of one is 230 bytes.
        self._timer: Timer | None = None
        self._timers: dict[int, Timer] = _NO_TIMER_OBJECTS
        # For a resumed conversation: when each timer it had started before the restart
        # was first started (the ``at`` of that step), so a re-issued timer keeps its
        # original deadline instead of starting over.
        self._timers_started = timers_started or _NO_TIMERS
        # The context its effects run in, and its calls' tasks inherit: the one it was
        # created in (the API caller's, or for a sub-agent its parent's), as a task of
        # its own would have had.
        self._context = contextvars.copy_context() if context is None else context
        self._uncommitted = 0  # batches handed to the writer and not committed yet
        self._path = tree_path(state)
        self._log: Any = None  # bound on first use (binding costs more than a step)
        self._log_transitions = runtime.logs_transitions
        self._log_lifecycle = runtime.logs_lifecycle

    @property
    def at_rest(self) -> bool:
        return self.state.at_rest

    @property
    def has_inbox(self) -> bool:
        """Whether events wait to be folded, or steps to be committed."""
        return bool(self._inbox) or self._uncommitted > 0

    async def wait_at_rest(self) -> None:
        """Return once the committed state is at rest (a turn or a sub-agent's life
        ended)."""
        while not self.state.at_rest:
            if self._dropped is not None:
                raise TreeDropped(self._dropped)
            if self._unloaded:  # parked: its tree waits for people, in the log only
                raise NotRunning(f"conversation {self.state.id!r} was unloaded while waiting")
            if self._at_rest_event is None:
                self._at_rest_event = trio.Event()
            await self._at_rest_event.wait()

    @property
    def log(self) -> Any:
        """The runtime's logger bound with this conversation's id, parent and depth."""
        if self._log is None:
            state = self.state
            self._log = self.runtime.logger.bind(
                conversation_id=state.id, parent_id=state.parent_id, depth=state.depth
            )
        return self._log

    def _log_rest(self, after: Conversation) -> None:
        """The lifecycle line of a conversation that came to rest: a sub-agent ended
        or failed, a root's turn ended or failed (kind and error, never message text)."""
        phase = after.phase
        if isinstance(phase, Failed | Error):
            name = "conversation_failed" if isinstance(phase, Failed) else "turn_failed"
            self.log.info(name, error_kind=phase.kind.value, error=_clip(phase.error))
        else:
            name = "conversation_ended" if isinstance(phase, Completed) else "turn_ended"
            self.log.info(name, seq=self.seq)

    # ---------------------------------------------------------------- inbox

    def deliver(self, event: Event) -> None:
        """Queue an event produced by the runtime (results, timers, other conversations)."""
        if self._dropped is not None:
            return  # its tree is another runtime's: nothing of it is folded here
        if self._inbox is None:
            self._inbox = [event]
        else:
            self._inbox.append(event)
        self._wake()

    async def submit(self, event: Event) -> None:
        """Queue an API event and wait until it is committed; re-raise a rejection
        (or TreeDropped)."""
        if self._dropped is not None:
            raise TreeDropped(self._dropped)
        submission = _Submission(event)
        if self._inbox is None:
            self._inbox = [submission]
        else:
            self._inbox.append(submission)
        self._wake()
        await submission.done.wait()
        if submission.error is not None:
            raise submission.error

    def _wake(self) -> None:
        self.runtime.engine.ready(self)

    def fold(self) -> None:
        """Apply everything queued, in order, and hand the steps to the writer (the
        engine's round). An actor that has nothing left to do is unloaded: at rest,
        every step committed (its effects executed) and nothing queued."""
        if self._dropped is not None:
            return
        items = self._inbox
        if items:
            self._inbox = None
            self._steps(items)
        elif self.settled:
            self._unload()

    def hand_over_first(self, first: Step) -> None:
        """Queue a new conversation's creation step: it goes to the writer before any
        event queued for the conversation, so its effects run first."""

        def on_commit(reported: Sequence[Any]) -> None:
            self._uncommitted -= 1
            if reported:
                self._snapshot_size = reported[0][0]
            for observer in self.runtime.step_observers:
                observer.step(
                    first.conversation_id, first.event, first.effects, first.state, first.at
                )
            if not self.runtime.closing:
                self._context.run(self._execute_all, first.effects)
            self._unload_if_settled()

        self._uncommitted += 1
        self.runtime.writer.submit([first], on_commit, self._batch_dropped)

    def _batch_dropped(self, _: TreeTakenOver) -> None:
        # A batch of it never written (its tree was taken over); a bound method, not a
        # closure made for every step (a step's cost is counted in instructions).
        self._uncommitted -= 1

    @property
    def settled(self) -> bool:
        """At rest with every step committed and nothing queued: it may be unloaded."""
        return self.state.at_rest and not self._uncommitted and not self._inbox

    def _unload_if_settled(self) -> None:
        if self.settled:
            self._unload()

    def drop(self, taken: TreeTakenOver) -> None:
        """Its tree was taken over by another runtime (``taken``: a commit of it was
        refused, nothing of the batch written): stop its call, timers and tools, fail
        whoever waits on it (``TreeDropped``) and let the runtime forget it. Nothing
        queued or uncommitted is written, and no effect of it runs (write-ahead); the
        new owner goes on from the log."""
        if self._dropped is not None:
            return
        self._dropped = taken
        items, self._inbox = self._inbox, None
        for item in items or ():
            if isinstance(item, _Submission):
                item.error = TreeDropped(taken)
                item.done.set()
        if self._at_rest_event is not None:
            self._at_rest_event.set()  # its waiters see the drop
            self._at_rest_event = None
        self._unloaded = True
        self._stop_tasks()
        self.runtime.unloaded(self.state.id, self)

    def park(self) -> float | None:
        """Unload a conversation that is not at rest but has nothing of its own in
        flight: its tree waits only for people (``Runtime.unload_tree``). Its timers are
        stopped (a resume re-issues them from the log, a time limit keeping its first
        start); returns the earliest of their deadlines, on Trio's clock (None: none).
        Whoever waits on it hears ``NotRunning``."""
        timers = [t for t in (self._timer, *self._timers.values()) if t is not None]
        due = min((t.deadline for t in timers), default=None)
        if self._at_rest_event is not None:
            self._at_rest_event.set()  # its waiters see the unload
            self._at_rest_event = None
        self._unload()
        return due

    def _unload(self) -> None:
        """Nothing is in flight at rest: stop any call and timer left, so nothing
        keeps a task or a reference to this actor alive, and let the runtime forget
        it. What may be addressed to it later finds it in the log: a message from
        another conversation (a late cancel, an outcome of a written-off child) would
        be absorbed by a phase at rest and is dropped (``Runtime.deliver_between``); a
        user message loads it again (``Runtime.send``)."""
        if self._unloaded:
            return
        self._unloaded = True
        self._stop_tasks()
        self.runtime.unloaded(self.state.id, self)

    def _steps(self, items: list[Event | _Submission]) -> None:
        """Apply queued events in order and hand their steps to the writer at once.

        A step is the one record of what it did until its effects ran: the ``Step``
        the writer logs holds the event, the effects and the state after, and the
        state before is the one the previous step left (``self.state`` when it is
        committed), so nothing else is kept per step (issue 21)."""
        steps: list[Step] = []
        rests: list[bool] = []
        waiting: _Waiting = None
        now = self.runtime.now
        state, seq = self._head, self._head_seq
        conversation_id = state.id
        for item in items:
            if isinstance(item, _Submission):
                submission: _Submission | None = item
                event = item.event
            else:
                submission = None
                event = item
            previous = state
            try:
                state, effects = transition(state, event)
            except IllegalTransition as exc:
                if submission is None:
                    # The runtime itself produced an event the reducer refuses: a bug.
                    raise
                submission.error = exc
                submission.done.set()
                continue
            if submission is not None:
                if waiting is None:
                    waiting = {}
                waiting[len(steps)] = submission
            seq += 1
            # A snapshot when the events logged since the last one outweigh it (see
            # runtime.py), and always at rest (what Runtime.make_step does).
            size = self._snapshot_size
            snapshot = size is not None and self._logged >= size and not self._snapshot_asked
            if snapshot:
                self._snapshot_asked = True
            # Whether the state after is at rest, read once per step: the step's
            # snapshot here, its waiters and its lifecycle line when committed.
            rest = state.at_rest
            if rest:
                snapshot = True
            steps.append(
                Step(
                    conversation_id,
                    seq,
                    event,
                    effects,
                    state,
                    now(),
                    snapshot,
                    False,
                    before=previous,
                )
            )
            rests.append(rest)
        if steps:
            self._head, self._head_seq = state, seq
            self._hand_over(steps, waiting, rests)
        else:
            self._unload_if_settled()  # every event refused: nothing changed

    def _hand_over(self, steps: list[Step], waiting: _Waiting, rests: list[bool]) -> None:
        def on_commit(reported: Sequence[Any]) -> None:
            self._uncommitted -= 1
            self._context.run(self._committed, steps, reported, waiting, rests)
            self._unload_if_settled()

        on_drop: Callable[[TreeTakenOver], None] = self._batch_dropped
        if waiting:

            def on_drop(taken: TreeTakenOver) -> None:
                # Never written (its tree was taken over): its API callers hear why.
                self._uncommitted -= 1
                for submission in waiting.values():
                    submission.error = TreeDropped(taken)
                    submission.done.set()

        self._uncommitted += 1
        self.runtime.writer.submit(steps, on_commit, on_drop)

    def _committed(
        self, steps: list[Step], reported: Sequence[Any], waiting: _Waiting, rests: list[bool]
    ) -> None:
        """The writer committed these steps: publish them, then (write-ahead) execute
        their effects, in order. Runs in the engine's task, in this actor's context."""
        runtime = self.runtime
        executing = not runtime.closing
        for index, step in enumerate(steps):
            # The state before this step is the one the previous step left: steps of a
            # conversation are committed in the order they were made.
            before, after, event, effects = self.state, step.state, step.event, step.effects
            submission = None if waiting is None else waiting.get(index)
            rest = rests[index]
            self.state, self.seq = after, step.seq
            if reported:
                event_size, snapshot_size = reported[index]
                if snapshot_size:
                    self._snapshot_size, self._logged = snapshot_size, 0
                    self._snapshot_asked = False
                else:
                    self._logged += event_size
            if rest and self._at_rest_event is not None:
                self._at_rest_event.set()
                self._at_rest_event = None
            if self._log_transitions:  # debug only: a line per step costs ~50 µs
                self.log.debug(
                    "transition",
                    seq=self.seq,
                    event_type=type(event).__name__,
                    before=type(before.phase).__name__,
                    after=type(after.phase).__name__,
                    effects=[type(e).__name__ for e in effects],
                )
            if self._log_lifecycle and rest and not before.at_rest:
                self._log_rest(after)
            runtime.observe(before, after, event, effects)
            for observer in runtime.step_observers:
                observer.step(after.id, event, effects, after, step.at)
            if submission is not None:
                submission.done.set()
            if after.is_terminal and not before.is_terminal:
                # Nothing may keep running for an ended conversation.
                self._stop_tasks()
            if executing:
                self._execute_all(effects, reissued=isinstance(event, RuntimeResumed))

    # ---------------------------------------------------------------- effects

    def _execute_all(self, effects: tuple[Effect, ...], *, reissued: bool = False) -> None:
        """Execute ``effects``; ``reissued``: they are what ``RuntimeResumed`` re-issued
        after a restart (a child it spawns may exist already)."""
        # One dictionary lookup by the effect's class (_EXECUTORS, below the class)
        # instead of a chain of class patterns: a step's effects are started here.
        placement = self.runtime.placement
        if placement is not None:
            # Where children run is the runtime's: a big fan-out's spawns are placed
            # in chunks for the workers' queue instead (placement.py).
            effects = placement.take(self, effects, reissued)
        for effect in effects:
            _EXECUTORS[type(effect)](self, effect, reissued)

    def _start_model_call(self, effect: CallModel, _: bool) -> None:
        # The request is a view of the state this effect came with (self.state is that
        # state while its effects are started): derived now, not later, when the
        # conversation may have moved on.
        self._start(effect.call, effect, model_request(self.state), effect.attempt)

    def _run_tool_effect(self, effect: RunTool, _: bool) -> None:
        if self.runtime.answers_in_process(effect.tool_call.name):
            # No I/O, nothing to wait for or cancel: answered now, without a task (its
            # ToolFinished is folded in the engine's next round).
            self.deliver(self._answer_tool(effect))
        else:
            self._start(effect.call, effect, None, 0)

    def _start_timer(self, effect: ScheduleRetry | StartTimer, _: bool) -> None:
        timer = effect.timer
        started = self.runtime.timers.start(self._remaining(effect), self, timer)
        if self._timer is None:
            self._timer = started
        else:
            if self._timers is _NO_TIMER_OBJECTS:
                self._timers = {}
            self._timers[timer] = started

    def _abort_call(self, effect: AbortCall, _: bool) -> None:
        self._abort(effect.call)

    def _spawn_child(self, effect: SpawnSubAgent, reissued: bool) -> None:
        self.runtime.spawn_child(effect, reissued=reissued, context=self._context)

    def _notify_parent(self, effect: NotifyParent, _: bool) -> None:
        self.runtime.deliver_between(
            effect.parent_id, SubAgentFinished(effect.child_id, effect.outcome)
        )

    def _cancel_children(self, effect: CancelSubAgents, _: bool) -> None:
        for child_id in effect.ids:
            self.runtime.deliver_between(child_id, CancelRequested(effect.reason))

    def _turn_finished(self, effect: TurnFinished, _: bool) -> None:
        self.last_turn = effect

    def _request_decision(self, effect: RequestApproval | AskUser, _: bool) -> None:
        # The request is the state (durable in the log); the runtime shows it to
        # whoever waits for requests and reads the decisions written for it.
        self.runtime.request_opened(self.state)

    # Each call (a model call, a tool that does I/O) runs on a worker of the runtime's
    # pool (``calls.py``), handed over when its step is committed and back in the pool
    # once its result is delivered: a conversation holds a task only while a call is
    # in flight, and one that waits on nothing (a parent waiting on its children)
    # holds none. The reducer has one call in flight per conversation (``_call``); one
    # started while an aborted one still unwinds goes to ``_more``. In-process tools
    # need no task at all (``_answer_tool``). Timers are entries of the runtime's
    # Timers (see timers.py).

    def _start(
        self, number: int, effect: CallModel | RunTool, request: ModelRequest | None, attempt: int
    ) -> None:
        """Start a model call (with its ``request``) or a tool on a worker; a model
        call whose provider ``RepliesAtOnce`` on a timer instead (no task)."""
        call = Call(self, number, effect, request, attempt)
        if self._call is None:
            self._call = call
        else:
            if self._more is _NO_CALLS:
                self._more = {}
            self._more[number] = call
        calls = self.runtime.calls
        if request is not None:
            reply_after = getattr(self.runtime.provider, "reply_after", None)
            if reply_after is not None:
                # Runs in this actor's context (``_committed`` and the creation step's
                # callback run the effects in it), as ``complete`` would on a worker.
                try:
                    delay, outcome = reply_after(request, self._call_context(call))
                except Exception as error:  # as if ``complete`` had raised it
                    delay, outcome = 0.0, error
                calls.schedule(call, delay, outcome, self._context)
                return
            gate = self.runtime.model_call_gate
            if gate is not None:
                calls.start_gated(call, self._context, gate)
                return
        calls.start(call, self._context)

    def perform(self, call: Call) -> Awaitable[Any]:
        """What a worker awaits for ``call`` (``calls.Caller``): a tool's run (its
        event), or the provider's ``complete`` (its reply, made an event by
        ``call_done`` or ``call_failed``): no coroutine of the runtime's own stays
        alive while a model call waits."""
        if call.request is None:
            return self._run_tool(call.effect)
        return self.runtime.provider.complete(call.request, self._call_context(call))

    def _call_context(self, call: Call) -> CallContext:
        """The CallContext of model call ``call``; with info lines on, the call is
        timed for its log line from here (``call.note``)."""
        state = self.state
        on_progress = self.runtime.on_progress
        if self._log_lifecycle:
            call.note = _CallLog(on_progress)
            on_progress = call.note.progress  # timed for the call's log line
        return CallContext(
            conversation_id=state.id,
            root_id=state.root_id,
            path=self._path,
            depth=state.depth,
            task=state.task,
            call=call.number,
            attempt=call.attempt,
            on_progress=on_progress,
        )

    def call_done(self, call: Call, value: Any) -> None:
        """``call`` ended (``calls.Caller``): its event into the inbox. A reply is held
        to the provider contract first (what ``complete_checked`` does)."""
        self._forget_call(call)
        if call.request is None:
            self.deliver(value)  # a tool's event
            return
        try:
            reply = checked_reply(value)
        except ProviderContractError as exc:
            self.deliver(self._provider_broken(call, exc))
            return
        if call.note is not None:
            self._log_model_call(call.note, call, reply=reply)
        self.deliver(ModelReplied(call.number, _redact_reply(reply, self.runtime.redact)))

    def call_failed(self, call: Call, error: Exception) -> None:
        """``call`` raised (``calls.Caller``): a provider's classified failure becomes
        ModelFailed; anything else a broken provider's."""
        self._forget_call(call)
        if call.request is None:
            raise error  # ``_run_tool`` turns what a tool raises into a result: a bug
        if isinstance(error, ProviderError):
            try:
                check_error(error)
            except ProviderContractError as exc:
                self.deliver(self._provider_broken(call, exc))
                return
            failure = attrs.evolve(error.error, message=self.runtime.redact(error.error.message))
            if call.note is not None:
                self._log_model_call(call.note, call, error=failure)
            self.deliver(ModelFailed(call.number, failure))
            return
        self.deliver(self._provider_broken(call, error))

    def _provider_broken(self, call: Call, exc: Exception) -> Event:
        # A provider must classify its failures and hand back well-formed values; one
        # that raised something else, or returned or raised an ill-typed value
        # (ProviderContractError), is broken. Fatal (not retried: its cause is
        # unknown) and logged loudly.
        self.log.error("provider raised", exc_info=exc)
        error = ModelError(ErrorKind.PROVIDER_FAILURE, _describe(exc))
        if call.note is not None:
            self._log_model_call(call.note, call, error=error)
        return ModelFailed(call.number, error)

    def _forget_call(self, call: Call) -> None:
        if self._call is call:
            self._call = None
        elif self._more.get(call.number) is call:
            del self._more[call.number]

    def _remaining(self, effect: StartTimer | ScheduleRetry) -> float:
        """The delay of a timer; for the conversation's own time limit and a retry's
        back-off, less the time they already ran before a restart.

        Timer numbers are never reused within a conversation, so a number started
        before the restart is the same timer, re-issued by ``RuntimeResumed``. A time
        limit counts from when it was first started, downtime included: that is what a
        deadline means. Timers that wait for *other* conversations to answer (a
        parent's backstop for a child, a cancel's grace) start over: those were down
        too, and must get their full grace to report before they are written off.
        """
        started = self._timers_started.get(effect.timer)
        # The reducer says which timers count downtime; a back-off always does.
        counts = isinstance(effect, ScheduleRetry) or effect.counts_downtime
        if started is None or not counts:
            return effect.delay
        return max(0.0, effect.delay - max(0.0, self.runtime.now() - started))

    def _forget_timer(self, number: int) -> Timer | None:
        """Timer ``number`` if it was started and is neither fired nor aborted, now
        forgotten."""
        timer = self._timer
        if timer is not None and timer.number == number:
            self._timer = None
            return timer
        return self._timers.pop(number, None)

    def timer_fired(self, number: int) -> None:
        """Timer ``number`` fired (``timers.Owner``): the reducer hears of it."""
        self._forget_timer(number)
        self.deliver(TimerFired(number))

    def _abort(self, number: int) -> None:
        timer = self._forget_timer(number)
        if timer is not None:
            timer.cancel()
            return
        call = self._call
        if call is not None and call.number == number:
            self._call = None
        else:
            call = self._more.pop(number, None)
        if call is not None:
            self.runtime.calls.cancel(call)

    def _stop_tasks(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for timer in self._timers.values():
            timer.cancel()
        self._timers = _NO_TIMER_OBJECTS
        calls = self.runtime.calls
        if self._call is not None:
            calls.cancel(self._call)
            self._call = None
        for call in self._more.values():
            calls.cancel(call)
        self._more = _NO_CALLS

    def _log_model_call(
        self,
        call_log: _CallLog,
        call: Call,
        *,
        reply: ModelReply | None = None,
        error: ModelError | None = None,
    ) -> None:
        """One info line per model call: who served it, how long it took, its tokens
        (a failed attempt's too: what the server billed for it) and stop reason, or its
        error's kind, message and retry hint. Never the
        request's or the reply's text, never a key (the endpoint loses its user
        part and query)."""
        profile, model, endpoint = _served_by(
            self.runtime.provider, call.request.model, self.state.depth
        )
        fields: dict[str, Any] = {
            "call": call.number,
            "attempt": call.attempt,
            "profile": profile,
            "model": model,
            "endpoint": endpoint,
            "latency_s": round(time.perf_counter() - call_log.started, 6),
            "first_token_s": call_log.first_token,
        }
        if reply is not None:
            fields.update(
                input_tokens=reply.usage.input_tokens,
                output_tokens=reply.usage.output_tokens,
                stop_reason=reply.stop_reason,
                tool_calls=len(reply.tool_calls),
            )
            self.log.info("model_call", outcome="replied", **fields)
        else:
            assert error is not None
            self.log.info(
                "model_call",
                outcome="failed",
                # What the failed attempt was billed (zero when the server said
                # nothing): `show` counts it, so the line says it too.
                input_tokens=error.usage.input_tokens,
                output_tokens=error.usage.output_tokens,
                error_kind=error.kind.value,
                error=_clip(error.message),
                retry_after=error.retry_after,
                **fields,
            )

    def _tool_refusal(self, effect: RunTool) -> ToolFinished | None:
        """The error result of a tool call that may not run where it would (outside
        the project, or through a symbolic link to a path its rules refuse)."""
        call: ToolCall = effect.tool_call
        outside = self.runtime.tool_cwd_problem(self.state, effect.cwd)
        if outside is not None:
            return ToolFinished(effect.call, ToolResult(call.id, call.name, outside, True))
        linked = _refused_through_a_link(effect)
        if linked is not None:
            return ToolFinished(effect.call, ToolResult(call.id, call.name, linked, True))
        return None

    def _answer_tool(self, effect: RunTool) -> Event:
        """A call the tool runner answers in-process (``AnswersInProcess``), answered
        at once, with the same checks, log line and redaction as ``_run_tool``."""
        refused = self._tool_refusal(effect)
        if refused is not None:
            return refused
        call: ToolCall = effect.tool_call
        started = time.perf_counter()
        try:
            result = self.runtime.answer_tool(call, effect.cwd, confined=effect.confined)
        except Exception as exc:
            return self._tool_crashed(effect, started, exc)
        return self._tool_finished(effect, started, result, "ok")

    async def _run_tool(self, effect: RunTool) -> Event:
        refused = self._tool_refusal(effect)
        if refused is not None:
            return refused
        call: ToolCall = effect.tool_call
        started = time.perf_counter()
        # Whose call this is, for a tool that reports progress (an MCP server's
        # notifications/progress: fanfold.tools.progress, read by the live view).
        reporting = CURRENT_CALL.set((self.state.id, effect.call))
        try:
            if effect.confined:
                # The reducer says the agent runs bash through allow patterns only: its
                # git must not start what the repository's configuration names
                # (git_guard.py).
                result = await self.runtime.tools.run(call, effect.cwd, confined=True)
            else:
                result = await self.runtime.tools.run(call, effect.cwd)
        except Exception as exc:
            return self._tool_crashed(effect, started, exc)
        finally:
            CURRENT_CALL.reset(reporting)
        # A server that changed its tools during the call (MCP's list_changed): every
        # conversation hears of it before this result is folded. A failure here is
        # not the tool's: its result stands.
        try:
            await self.runtime.refresh_tools()
        except Exception as exc:
            self.log.error("tool list refresh failed", exc_info=exc)
        return self._tool_finished(effect, started, result, "ok")

    def _tool_crashed(self, effect: RunTool, started: float, exc: Exception) -> Event:
        # A tool must return error results for bad input; this one crashed. The
        # model still gets a result so the conversation can go on.
        call: ToolCall = effect.tool_call
        self.log.error("tool raised", tool=call.name, exc_info=exc)
        result = ToolResult(call.id, call.name, f"tool crashed: {_describe(exc)}", True)
        return self._tool_finished(effect, started, result, "crashed")

    def _tool_finished(
        self, effect: RunTool, started: float, result: ToolResult, outcome: str
    ) -> Event:
        if self._log_lifecycle:
            if outcome == "ok" and result.is_error:
                outcome = "error"
            self._log_tool_call(effect.call, effect.tool_call.name, started, outcome)
        content = self.runtime.redact(result.content)
        if content != result.content:  # a copy only when a secret was taken out
            result = attrs.evolve(result, content=content)
        return ToolFinished(effect.call, result)

    def _log_tool_call(self, number: int, name: str, started: float, outcome: str) -> None:
        """One info line per tool call: its name, duration and outcome ("ok", "error":
        an error result, "crashed": the tool raised); never its arguments or output."""
        duration = round(time.perf_counter() - started, 6)
        self.log.info("tool_call", call=number, tool=name, duration_s=duration, outcome=outcome)


# How each effect is executed, by its class: every Effect of the reducer's
# (tests/test_runtime_tasks.py checks none is missing).
_EXECUTORS: dict[type, Callable[[Actor, Any, bool], None]] = {
    CallModel: Actor._start_model_call,
    RunTool: Actor._run_tool_effect,
    ScheduleRetry: Actor._start_timer,
    StartTimer: Actor._start_timer,
    AbortCall: Actor._abort_call,
    SpawnSubAgent: Actor._spawn_child,
    NotifyParent: Actor._notify_parent,
    CancelSubAgents: Actor._cancel_children,
    TurnFinished: Actor._turn_finished,
    RequestApproval: Actor._request_decision,
    AskUser: Actor._request_decision,
}


class _CallLog:
    """Times one model call for its log line; the first streamed progress report
    stands for the first token (None: the provider does not stream)."""

    __slots__ = ("_forward", "first_token", "started")

    def __init__(self, forward: Callable[[StreamProgress], None] | None) -> None:
        self.started = time.perf_counter()
        self.first_token: float | None = None
        self._forward = forward

    def progress(self, progress: StreamProgress) -> None:
        if self.first_token is None:
            self.first_token = round(time.perf_counter() - self.started, 6)
        if self._forward is not None:
            self._forward(progress)


def _served_by(
    provider: object, model: str | None, depth: int
) -> tuple[str | None, str | None, str | None]:
    """Which profile, model and endpoint serve a call, as far as the provider says:
    a router's ``resolve`` (the CLI's), else its own ``model`` and ``base_url``
    attributes. Only plain strings are taken (never a repr that might hold a key)."""
    source: object = provider
    resolve = getattr(provider, "resolve", None)
    if callable(resolve):
        try:
            source, model = resolve(model, depth)
        except Exception:  # a bad model name: the call itself reports it
            source = None
    profile = getattr(source, "name", None)
    if model is None:
        model = getattr(source, "model", None)
    return (
        profile if isinstance(profile, str) else None,
        model if isinstance(model, str) else None,
        _endpoint(getattr(source, "base_url", None)),
    )


def _endpoint(base_url: object) -> str | None:
    """``base_url`` without credentials: scheme, host, port and path only."""
    if not isinstance(base_url, str):
        return None
    return _endpoint_of(base_url)


@functools.lru_cache(maxsize=64)
def _endpoint_of(base_url: str) -> str | None:
    # Parsed once per URL, not per model call's log line.
    try:
        parts = urllib.parse.urlsplit(base_url)
    except ValueError:  # an unbalanced IPv6 bracket: log no endpoint rather than fail
        return None
    host = parts.hostname or ""
    number = _port(parts)
    port = f":{number}" if number is not None else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _port(parts: urllib.parse.SplitResult) -> int | None:
    try:
        return parts.port
    except ValueError:
        return None


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _redact_reply(reply: ModelReply, redact: Callable[[str], str]) -> ModelReply:
    """``reply`` with secrets redacted from its text and its tool calls' arguments (the
    same object when nothing was redacted: a copy per call cost more than the check)."""
    text = redact(reply.text)
    changed = text != reply.text
    calls = []
    for call in reply.tool_calls:
        arguments = redact(call.arguments_json)
        if arguments != call.arguments_json:
            call = attrs.evolve(call, arguments_json=arguments)
            changed = True
        calls.append(call)
    return attrs.evolve(reply, text=text, tool_calls=tuple(calls)) if changed else reply


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _refused_through_a_link(effect: RunTool) -> str | None:
    """Why a file tool's call, permitted by its path as spelled, is refused by the
    path its symbolic links lead to (None: permitted, or no link on the way).

    The reducer matches path rules on the spelling alone (it does no I/O), so
    ``write_file(docs/**)`` permits ``docs/link/x.py``; if ``docs/link`` is a link to
    ``../src``, the file written is ``src/x.py``, which the rule does not permit. The
    reducer put on the effect which rules apply (``path_rules``, None: no check);
    this resolves the links, the one thing it cannot do, and the pure
    ``link_refusal`` judges the path found.
    """
    rules = effect.path_rules
    if rules is None:
        return None
    call, cwd = effect.tool_call, effect.cwd
    try:
        arguments = call.arguments()
    except ValueError:
        return None
    path = arguments.get("path") if isinstance(arguments, dict) else None
    if not isinstance(path, str) or not path or "\x00" in path:
        return None
    spelled = os.path.normpath(os.path.join(cwd, path))
    real_cwd = os.path.realpath(cwd)
    real = os.path.realpath(spelled)
    if os.path.relpath(real, real_cwd) == os.path.relpath(spelled, cwd):
        return None
    # The real path, spelled from the working directory as the reducer spells it.
    return link_refusal(rules, call, cwd, os.path.relpath(real, real_cwd))
