"""What every step must do (``check_transition``), the events the reducer must refuse
(``rejections``, ``check_rejections``) or absorb without effects (``late_events``,
``check_late_events``), and the recipe over a whole trace (``check_trace``).

Each check raises ``AssertionError`` naming the invariant broken.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import attrs
from hypothesis import strategies as st

from fanfold.statemachine import (
    CONTROL_TOOLS,
    STOP_MAX_TOKENS,
    STOP_REFUSAL,
    SUBMIT_ERROR,
    SUBMIT_RESULT,
    AbortCall,
    ApprovalDenied,
    ApprovalGranted,
    AskUser,
    AssistantMessage,
    AwaitingRetry,
    AwaitingSubAgents,
    CallModel,
    CancellingSubAgents,
    CancelReason,
    CancelRequested,
    CancelSubAgents,
    ChildFailed,
    ChildOutcome,
    ChildSucceeded,
    Completed,
    Conversation,
    ConversationCreated,
    ConversationForked,
    DecisionEdit,
    DuplicateChildOutcome,
    EndCompleted,
    EndFailed,
    Error,
    ErrorKind,
    Event,
    Failed,
    ForkEdited,
    Idle,
    IllegalTransition,
    LimitsEdit,
    LlmRequesting,
    ModelError,
    ModelFailed,
    ModelReplied,
    ModelReply,
    NotifyParent,
    ReplyEdit,
    RequestApproval,
    RuntimeResumed,
    RunTool,
    ScheduleRetry,
    SpawnSubAgent,
    StartTimer,
    SubAgentFinished,
    SystemPromptEdit,
    TaskEdit,
    TimerFired,
    ToolCall,
    ToolExecuting,
    ToolFinished,
    ToolResult,
    ToolResultEdit,
    ToolResultMessage,
    ToolsChanged,
    TurnFinished,
    TurnOutcome,
    UnknownCall,
    UnknownChild,
    Usage,
    UserAnswered,
    UserMessage,
    UserMessaged,
    start,
)
from fanfold.statemachine.approvals import needs_decision
from fanfold.statemachine.permissions import refusal
from fanfold.statemachine.transition import model_request
from fanfold.testing.delegation import (
    _check_cancel_ending,
    _check_cancels,
    _check_fan_in,
    _check_spawns,
    _check_summary_call,
    _check_summary_result,
    _started,
)
from fanfold.testing.invariants import (
    _ROUND,
    _check_finite,
    _check_no_duplicate_numbers,
    _check_timers_say_if_downtime_counts,
    _fail,
    _history_open_calls,
    _issued,
    _json_non_finite,
    check_invariants,
    check_start,
)
from fanfold.testing.strategies import (
    Effects,
    Reducer,
    Trace,
    _reducer,
    _stale_numbers,
    live_numbers,
)

__all__ = [
    "Rejected",
    "check_late_events",
    "check_rejections",
    "check_trace",
    "check_transition",
    "late_events",
    "rejected_events",
    "rejections",
]


@attrs.frozen
class Rejected:
    """An event the reducer must refuse in some state, and the exception it raises."""

    event: Event
    error: type[IllegalTransition]


def rejections(state: Conversation) -> tuple[Rejected, ...]:
    """Events ``transition(state, ...)`` must refuse, each with the exception expected.

    Numbers never issued, unknown children (never spawned, or of an earlier round),
    duplicate outcomes, outcomes of queued children, a result for the wrong tool
    call, user messages to a busy conversation or a sub-agent, a second
    ConversationCreated; in a terminal phase, anything but a late arrival.
    """
    terminal = state.is_terminal
    unknown: type[IllegalTransition] = IllegalTransition if terminal else UnknownChild
    never = state.next_call
    late = ChildSucceeded("late")
    found = [
        Rejected(ConversationCreated(state.id), IllegalTransition),
        Rejected(ConversationForked(state.id + "-fork", state.id, 0, state), IllegalTransition),
        Rejected(ModelReplied(never, ModelReply("?")), UnknownCall),
        Rejected(ModelFailed(never + 1, ModelError(ErrorKind.NETWORK, "?")), UnknownCall),
        Rejected(ToolFinished(never + 2, ToolResult("x", "bash", "?")), UnknownCall),
        Rejected(TimerFired(never), UnknownCall),
        Rejected(SubAgentFinished(f"{state.id}.{state.spawned + 1}", late), unknown),
        Rejected(SubAgentFinished("stranger", ChildFailed("?", ErrorKind.CANCELLED)), unknown),
    ]
    if state.is_sub_agent or terminal or not isinstance(state.phase, Idle | Error):
        found.append(Rejected(UserMessaged("hello?"), IllegalTransition))
    children = state.children
    this_round: set[str] = set()
    if children is not None:
        this_round = set(children.pending_ids()) | {f.spec.id for f in children.finished}
        for done in children.finished:
            if done.spec.id not in state.written_off:
                event = SubAgentFinished(done.spec.id, late)
                found.append(Rejected(event, DuplicateChildOutcome))
        for pending in children.pending:
            if not pending.started:
                found.append(Rejected(SubAgentFinished(pending.spec.id, late), IllegalTransition))
    for k in range(1, state.spawned + 1):
        child = f"{state.id}.{k}"
        if child not in this_round and child not in state.written_off:
            found.append(Rejected(SubAgentFinished(child, late), unknown))
    phase = state.phase
    # Issue 35: a decision needs an open request: one for a number never issued, for
    # a call that asks nothing (or no longer), or of the wrong kind, is refused.
    asked = phase.call if isinstance(phase, ToolExecuting) and phase.asking else None
    decisions: tuple[Callable[[int], Event], ...] = (
        ApprovalGranted,
        lambda n: ApprovalDenied(n, "?"),
        lambda n: UserAnswered(n, "?"),
    )
    for decide in decisions:
        found.append(Rejected(decide(never), IllegalTransition if terminal else UnknownCall))
        if state.next_call > 0 and asked != 0:
            found.append(Rejected(decide(0), IllegalTransition))
    if isinstance(phase, ToolExecuting) and phase.asking is not None and not terminal:
        if phase.asking.question:
            found.append(Rejected(ApprovalGranted(phase.call), IllegalTransition))
        else:
            found.append(Rejected(UserAnswered(phase.call, "?"), IllegalTransition))
            found.append(Rejected(ApprovalGranted(phase.call, "[1]"), IllegalTransition))
        found.append(
            Rejected(ToolFinished(phase.call, ToolResult("x", "bash", "?")), IllegalTransition)
        )
    if isinstance(phase, ToolExecuting) and not terminal:
        wrong = ToolResult(phase.current.id + "-other", phase.current.name, "?")
        found.append(Rejected(ToolFinished(phase.call, wrong), IllegalTransition))
        found.append(Rejected(ForkEdited(ToolResultEdit(wrong)), IllegalTransition))
    # Fork edits (issue 24): none once it has ended; a reply only to an awaited call,
    # a tool result only to a running tool.
    if terminal:
        found.append(Rejected(ForkEdited(SystemPromptEdit("edited")), IllegalTransition))
        found.append(Rejected(ForkEdited(LimitsEdit(state.limits)), IllegalTransition))
    elif state.rounds > 1:
        # New limits must admit the rounds already taken.
        fewer = attrs.evolve(state.limits, max_rounds=state.rounds - 1)
        found.append(Rejected(ForkEdited(LimitsEdit(fewer)), IllegalTransition))
    if not isinstance(phase, LlmRequesting):
        found.append(Rejected(ForkEdited(ReplyEdit(ModelReply("edited"))), IllegalTransition))
    if not isinstance(phase, ToolExecuting):
        edited = ToolResult("x", "bash", "edited")
        found.append(Rejected(ForkEdited(ToolResultEdit(edited)), IllegalTransition))
    return tuple(found)


def rejected_events(state: Conversation) -> st.SearchStrategy[Rejected]:
    """One of ``rejections(state)``."""
    return st.sampled_from(rejections(state))


def check_rejections(state: Conversation, *, transition: Reducer | None = None) -> None:
    """Assert that ``transition`` (the reducer under test, fanfold's by default) refuses
    every event of ``rejections(state)`` with the exception expected: a user message
    to a busy conversation or a sub-agent, numbers never issued, unknown, duplicate or
    queued children's outcomes, a second creation, fork edits that do not apply."""
    reducer = _reducer(transition)
    for rejected in rejections(state):
        try:
            after, _ = reducer(state, rejected.event)
        except rejected.error:
            continue
        except IllegalTransition as other:
            _fail(
                "events that must be refused are refused, as documented",
                f"{rejected.event!r} raised {type(other).__name__}, not {rejected.error.__name__}",
                state,
            )
        _fail(
            "events that must be refused are refused",
            f"{rejected.event!r} was accepted (-> {type(after.phase).__name__})",
            state,
        )


def late_events(state: Conversation) -> tuple[Event, ...]:
    """Events that must leave ``state`` exactly as it is, with no effect: late results
    and firings of the last calls and timers no longer awaited, a late outcome of each
    of the last written-off children (a cancelled child answering after all), and, with
    nothing to stop (at rest, or ended), a cancel; once ended, a restart notice too."""
    stale = _stale_numbers(state)[-2:]
    found: list[Event] = []
    for number in stale:
        found += [
            TimerFired(number),
            ModelReplied(number, ModelReply("late", usage=Usage(3, 2))),
            ModelFailed(number, ModelError(ErrorKind.NETWORK, "late", usage=Usage(1, 0))),
            ToolFinished(number, ToolResult("late", "bash", "late")),
        ]
    for child in state.written_off[-3:]:
        found += [
            SubAgentFinished(child, ChildSucceeded("late result", 7, True)),
            SubAgentFinished(child, ChildFailed("late", ErrorKind.CANCELLED, CancelReason.PARENT)),
        ]
    if state.is_terminal or isinstance(state.phase, Idle | Error):
        found += [CancelRequested(reason) for reason in CancelReason]
    if state.is_terminal:
        found.append(RuntimeResumed())
    return tuple(found)


def check_late_events(state: Conversation, *, transition: Reducer | None = None) -> None:
    """Assert that ``transition`` (the reducer under test, fanfold's by default) absorbs
    every event of ``late_events(state)``: the same state, no effect."""
    reducer = _reducer(transition)
    for event in late_events(state):
        try:
            after, effects = reducer(state, event)
        except IllegalTransition as error:
            _fail("late events are absorbed", f"{event!r} was refused: {error.reason}", state)
        if state.is_terminal and not (after == state and effects == ()):
            _fail(
                "terminal phases are terminal",
                f"{type(event).__name__} led to {type(after.phase).__name__} with effects "
                f"{effects}",
                state,
            )
        _absorbed(state, after, effects, f"{event!r} came late")


def check_trace(
    trace: Trace,
    *,
    transition: Reducer | None = None,
    meaning: Callable[[Event], Event] | None = None,
) -> None:
    """Run every shipped check over a trace: ``check_start``; before each step and
    after the last, ``check_rejections`` and ``check_late_events``; each step with
    ``check_transition``. The reducer is ``transition`` if given, else the trace's own
    (the one ``event_sequences(transition=...)`` generated it with). ``meaning``: for
    a rule that gives an event a new meaning (a user's "/stop" is a cancel), the
    event each step is checked as. The recipe::

        @given(testing.event_sequences(transition=my_transition))
        def test_my_rule_keeps_every_invariant(trace: testing.Trace) -> None:
            testing.check_trace(trace)
    """
    reducer = trace.transition if transition is None else transition
    state, effects = start(trace.created)
    check_start(trace.created, state, effects)
    for event in trace.events:
        check_rejections(state, transition=reducer)
        check_late_events(state, transition=reducer)
        after, effects = reducer(state, event)
        check_transition(state, event if meaning is None else meaning(event), after, effects)
        state = after
    check_rejections(state, transition=reducer)
    check_late_events(state, transition=reducer)


_BUSY = (LlmRequesting, AwaitingRetry, ToolExecuting, AwaitingSubAgents, CancellingSubAgents)
_QUIET = (Idle, Error, Completed, Failed)


def _check_non_finite_calls(before: Conversation, after: Conversation, effects: Effects) -> None:
    """A tool call whose arguments hold a non-finite number never runs: no RunTool, and
    its result is an error saying why (so no spawn and no submission come of it)."""
    for effect in effects:
        if isinstance(effect, RunTool) and _json_non_finite(effect.tool_call.arguments_json):
            _fail("non-finite arguments are refused", f"{effect} was issued", after)
    history = after.history
    start = len(before.history)
    calls: dict[str, ToolCall] = {}
    for message in reversed(history[:start]):
        if isinstance(message, AssistantMessage):
            calls = {c.id: c for c in message.tool_calls}
            break
    for message in history[start:]:
        if isinstance(message, AssistantMessage):
            calls = {c.id: c for c in message.tool_calls}
        elif isinstance(message, ToolResultMessage):
            result = message.result
            call = calls.get(result.tool_call_id)
            if call is None or not _json_non_finite(call.arguments_json):
                continue
            if not result.is_error:  # refused, or skipped by an ending before it
                _fail(
                    "non-finite arguments are refused",
                    f"{call} got the result {result}",
                    after,
                )


_SUBMITTED = "submitted; the conversation ends"


# --------------------------------------------------------------------- submissions


def _submission_value(call: ToolCall) -> str | None:
    """The text a ``submit_result``/``submit_error`` call submits, or None if it is
    refused: arguments that are no JSON object (``[...]``, ``"x"``, ``null``, ``7``),
    lack a string under ``result``/``error``, or hold a non-finite number."""
    if _json_non_finite(call.arguments_json):
        return None
    try:
        arguments = json.loads(call.arguments_json)
    except (ValueError, RecursionError):
        return None
    key = "result" if call.name == SUBMIT_RESULT else "error"
    value = arguments.get(key) if isinstance(arguments, dict) else None
    return value if isinstance(value, str) else None


def _new_results(before: Conversation, after: Conversation) -> list[ToolResult]:
    """The tool results a step recorded: in the round's bookkeeping or the history."""
    old = before.phase.results if isinstance(before.phase, _ROUND) else ()
    kept = after.phase.results if isinstance(after.phase, _ROUND) else ()
    found = [r for r in kept if r not in old]
    found += [
        m.result
        for m in after.history[len(before.history) :]
        if isinstance(m, ToolResultMessage) and m.result not in old and m.result not in found
    ]
    return found


def _ending_of(state: Conversation) -> Completed | Failed | Error | EndCompleted | EndFailed | None:
    phase = state.phase
    if isinstance(phase, CancellingSubAgents) and isinstance(
        phase.ending, EndCompleted | EndFailed
    ):
        return phase.ending
    return phase if isinstance(phase, Completed | Failed | Error) else None


def _check_submissions(before: Conversation, after: Conversation) -> None:
    """A submission is taken exactly when it is valid and offered (a sub-agent's), and
    the sub-agent then ends with its text; any other is refused with an error result
    (or skipped, when something ended the round before it)."""
    calls: dict[str, ToolCall] = {}
    for message in reversed(after.history):
        if isinstance(message, AssistantMessage):
            calls = {c.id: c for c in message.tool_calls}
            break
    for result in _new_results(before, after):
        call = calls.get(result.tool_call_id)
        if call is None or call.name not in (SUBMIT_RESULT, SUBMIT_ERROR):
            continue
        value = _submission_value(call) if after.is_sub_agent else None
        taken = not result.is_error and result.content == _SUBMITTED
        skipped = result.is_error and result.content.startswith(("skipped:", "cancelled:"))
        if taken != (value is not None) and not (skipped and value is not None):
            _fail(
                "a submission is taken exactly when it is valid",
                f"{call.arguments_json} of {call.name} got {result}",
                after,
            )
        if not taken:
            continue
        assert value is not None
        ending = _ending_of(after)
        expected: object = (
            (Completed(value), EndCompleted(value))
            if call.name == SUBMIT_RESULT
            else (
                Failed(value, ErrorKind.SUBMITTED_ERROR),
                EndFailed(value, ErrorKind.SUBMITTED_ERROR),
            )
        )
        if ending not in expected:  # type: ignore[operator]
            _fail("a submission ends the sub-agent with its text", f"{ending}", after)


# --------------------------------------------------------------------- endings' reasons

# The cancel reason each kind of ending implies (DESIGN.md "Cancellation", "Deadlines",
# "Token budget"); every other kind carries none.
_REASONS_OF_KIND: dict[ErrorKind, tuple[CancelReason, ...]] = {
    ErrorKind.CANCELLED: (CancelReason.USER, CancelReason.PARENT),
    ErrorKind.TIMED_OUT: (CancelReason.TIMEOUT,),
    ErrorKind.BUDGET_EXHAUSTED: (CancelReason.LIMIT,),
    ErrorKind.UNRESPONSIVE: (CancelReason.PARENT,),
}
# The outcomes a parent gives a child itself (it never started, was written off, or
# never acknowledged a cancel): each kind with its one reason.
_PARENT_MADE: dict[ErrorKind, CancelReason] = {
    ErrorKind.CANCELLED: CancelReason.PARENT,
    ErrorKind.TIMED_OUT: CancelReason.TIMEOUT,
    ErrorKind.BUDGET_EXHAUSTED: CancelReason.LIMIT,
    ErrorKind.UNRESPONSIVE: CancelReason.PARENT,
    ErrorKind.NOT_RUN: CancelReason.PARENT,
}
# A child whose summary (context mode summary) could not be made never starts: it
# fails with the summary call's kind, and that kind's reason.
_NO_SUMMARY = "not started: no summary of its parent's conversation: "


def _reason_fits(kind: ErrorKind, reason: CancelReason | None) -> bool:
    return reason in _REASONS_OF_KIND.get(kind, (None,))


def _check_reasons(before: Conversation, event: Event, after: Conversation) -> None:
    """The reason on every outcome the reducer makes is the one its kind implies: a
    sub-agent's ending, and the outcomes a parent records for children that did not
    report one themselves."""
    phase = after.phase
    if isinstance(phase, Failed) and not _reason_fits(phase.kind, phase.reason):
        _fail("an ending's reason fits its kind", f"{phase.kind} with {phase.reason}", after)
    ending = phase.ending if isinstance(phase, CancellingSubAgents) else None
    fits = not isinstance(ending, EndFailed) or _reason_fits(ending.kind, ending.reason)
    if after.is_sub_agent and not fits:
        _fail("an ending's reason fits its kind", f"{ending}", after)
    cb, ca = before.children, after.children
    if ca is None:
        return
    reported = event.child_id if isinstance(event, SubAgentFinished) else None
    old = {f.spec.id for f in cb.finished} if cb is not None else set()
    for done in ca.finished:
        if done.spec.id in old or done.spec.id == reported:
            continue
        outcome = done.outcome
        if not isinstance(outcome, ChildFailed):
            _fail("an outcome a parent makes has its kind's reason", f"{done}", after)
        if outcome.error.startswith(_NO_SUMMARY):
            fits = _reason_fits(outcome.kind, outcome.reason)
        else:
            fits = _PARENT_MADE.get(outcome.kind, "none") == outcome.reason
        if not fits:
            _fail("an outcome a parent makes has its kind's reason", f"{done}", after)


# --------------------------------------------------------------------- backoff and timers


def expected_backoff(state: Conversation, attempt: int, error: ModelError, timer: int) -> float:
    """The delay before ``attempt`` (>= 2) after ``error``, as DESIGN.md ("Retries")
    specifies it: the provider's hint of 0 or more, capped at ``retry_cap``; else
    ``min(retry_cap, retry_base * 2^(attempt-2))`` with equal jitter (50-100 %) from
    the 2-byte BLAKE2b digest of ``"<conversation id>:<timer>"``, rounded to 1 ms.

    Written out here as the contract it is: the delay is in every log, and replay
    checks it, so a different jitter breaks every recorded run.
    """
    lim = state.limits
    hint = error.retry_after
    if hint is not None and hint >= 0:
        return min(float(hint), lim.retry_cap)
    ceiling = min(lim.retry_cap, lim.retry_base * 2.0 ** (attempt - 2))
    digest = hashlib.blake2b(f"{state.id}:{timer}".encode(), digest_size=2).digest()
    return round(ceiling * (0.5 + int.from_bytes(digest, "big") / 0xFFFF / 2), 3)


def _check_timer_delays(after: Conversation, effects: Effects) -> None:
    """Every timer runs as long as its purpose says: a retry its backoff, a child's
    deadline its time limit plus one cancel grace per level that can exist below the
    parent (its backstop), the own time limit the conversation's timeout, a cancel's
    wait the cancel grace."""
    lim = after.limits
    phase = after.phase
    deadlines: dict[int, float] = {}
    levels = max(1, lim.max_depth - after.depth)
    children = after.children
    if children is not None:
        for pending in children.pending:
            if pending.deadline_timer is not None and pending.spec.timeout is not None:
                deadlines[pending.deadline_timer] = pending.spec.timeout + lim.cancel_grace * levels
    for index, effect in enumerate(effects):
        expected: float | None = None
        spawned = effects[index + 1] if index + 1 < len(effects) else None
        if isinstance(effect, ScheduleRetry) and isinstance(phase, AwaitingRetry):
            expected = expected_backoff(after, effect.attempt, phase.last_error, effect.timer)
        elif isinstance(effect, StartTimer):
            if effect.timer == after.deadline_timer:
                expected = after.timeout
            elif effect.timer in deadlines:
                expected = deadlines[effect.timer]
            elif isinstance(phase, CancellingSubAgents) and effect.timer == phase.grace_timer:
                expected = lim.cancel_grace
            elif (
                isinstance(phase, ToolExecuting)
                and phase.asking is not None
                and effect.timer == phase.asking.timer
            ):
                expected = lim.approval_timeout
            elif isinstance(spawned, SpawnSubAgent) and spawned.timeout is not None:
                # A child started and cancelled in one step (a reply that spawns and
                # submits): its deadline is set and aborted at once.
                expected = spawned.timeout + lim.cancel_grace * levels
        else:
            continue
        if expected is None or effect.delay != expected:
            _fail(
                "timers run as long as their purpose says", f"{effect}, expected {expected}", after
            )


def _check_charges(before: Conversation, event: Event, after: Conversation) -> None:
    """A child's tokens are charged to its parent once: what it reported, or its whole
    share when the parent writes it off (it never said what it used)."""
    expected = 0
    if isinstance(event, SubAgentFinished) and event.child_id not in before.written_off:
        expected += event.outcome.tokens
    children = before.children
    for child in after.written_off[len(before.written_off) :]:
        pending = children.find_pending(child) if children is not None else None
        expected += (pending.budget or 0) if pending is not None else 0
    if after.usage_children - before.usage_children != expected:
        _fail(
            "a child's tokens are charged once",
            f"usage_children {before.usage_children} -> {after.usage_children}, "
            f"expected +{expected}",
            after,
        )


def _event_number(event: Event) -> int | None:
    match event:
        case (
            ModelReplied(call=n) | ModelFailed(call=n) | ToolFinished(call=n) | TimerFired(timer=n)
        ):
            return n
    return None


def check_transition(
    before: Conversation,
    event: Event,
    after: Conversation,
    effects: Effects,
    *,
    transition: Reducer | None = None,
) -> None:
    """Assert every invariant of one accepted step ``transition(before, event)``.

    Besides ``check_invariants(after)``: identity never changes and history, counters
    and ``written_off`` only grow (a failure names the counters that shrank); only the
    model call's outcome changes the history while the call is in flight or waits for
    its retry; a terminal conversation absorbs with no effects;
    every entry into Completed/Failed emits exactly one matching NotifyParent and no
    other step emits any; TurnFinished exactly when work stops; every call and timer
    effect has a number, fresh numbers are issued once each, no awaited call or timer
    is dropped without an AbortCall; CallModel carries a valid history; retries are
    bounded and numbered; SpawnSubAgent respects depth, never exceeds the parent's
    limits (rounds, time, tokens; the rest inherited), passes the agent catalogue on
    exactly to a child that may spawn, gives a full-context child no tool call without
    its result, gives a later sequential step (re-issued too) the outcomes of the
    earlier steps of its call, and starts exactly the newly started children; no
    effect holds a NaN or an infinity, and a tool call whose arguments hold one never
    runs and gets an error result;
    fan-in only moves children from pending to finished, and a finished round gives
    each spawn_agents call one result listing each of its children once; late events
    are absorbed; a timer that fires is no longer awaited (but for the conversation's
    own time limit while its cancel waits for children); RuntimeResumed re-issues
    everything in flight.

    ``transition``: the reducer under test, when the step is to be re-run: it must
    give the same state and effects again (a reducer is a function of the state and
    the event, which replay relies on).
    """
    if transition is not None:
        again = transition(before, event)
        if again != (after, effects):
            _fail(
                "the reducer is a function of the state and the event",
                f"{type(event).__name__} gave another step when run again",
                after,
            )
    check_invariants(after)
    if isinstance(event, ToolsChanged):
        # The one step that changes the offered tools: that server's, nothing else.
        _check_tools_changed(before, event, after, effects)
        _check_fixed(before.evolve(tools=after.tools), after)
    else:
        _check_fixed(_as_edited(before, event), after)
    numbered = event
    # A fork edit is checked as what it stands for (besides its own checks below): an
    # edited reply as the reply of the awaited call, an edited tool result as the
    # running tool's, any other edit as a restart of the edited state.
    event = _plain_event(before, event)
    if isinstance(numbered, ForkEdited) and isinstance(event, RuntimeResumed):
        before = _as_edited(before, numbered)
    _check_history_while_calling(before, event, after)
    if before.is_terminal:
        if not (after == before and effects == ()):
            _fail(
                "terminal phases are terminal",
                f"{type(event).__name__} led to {type(after.phase).__name__} with effects "
                f"{effects}",
                before,
            )
        return
    _check_finite(after, effects)
    _check_non_finite_calls(before, after, effects)
    _check_numbers(before, numbered, after, effects)
    _check_notify(before, after, effects)
    _check_submitted(event, after)
    _check_turn_finished(before, event, after, effects)
    _check_model_and_tools(before, event, after, effects)
    _check_spawns(before, event, after, effects, restarted=isinstance(numbered, ForkEdited))
    _check_cancels(before, after, effects)
    _check_fan_in(before, event, after)
    _check_event_rules(before, event, after, effects)
    _check_submissions(before, after)
    _check_reasons(before, event, after)
    _check_timer_delays(after, effects)
    _check_charges(before, event, after)
    _check_approvals(before, numbered, after, effects)
    if isinstance(event, RuntimeResumed):
        _check_resume(before, after, effects)
    if isinstance(numbered, ForkEdited):
        _check_fork_edit(before, numbered, after, effects)


def _plain_event(state: Conversation, event: Event) -> Event:
    """The event a fork edit stands for in ``state`` (see ``check_transition``)."""
    match event, state.phase:
        case ForkEdited(edit=ReplyEdit(reply=reply)), LlmRequesting(call=n):
            return ModelReplied(n, reply)
        case ForkEdited(edit=ToolResultEdit(result=result)), ToolExecuting(call=n, current=c):
            return ToolFinished(n, attrs.evolve(result, name=c.name))
        case ForkEdited(edit=DecisionEdit(decision=decision)), _:
            return decision
        case ForkEdited(), _:
            return RuntimeResumed()
    return event


def _as_edited(state: Conversation, event: Event) -> Conversation:
    """``state`` with what a fork edit changes of its identity (its system prompt, a
    sub-agent's task and the task message): the rest must stay as it was."""
    match event:
        case ForkEdited(edit=SystemPromptEdit(system_prompt=text)):
            return state.evolve(system_prompt=text)
        case ForkEdited(edit=TaskEdit(task=task)):
            history = (*state.history[:-1], UserMessage(task))
            return state.evolve(task=task, history=history)
        case ForkEdited(edit=LimitsEdit(limits=limits)):
            return state.evolve(limits=limits)
    return state


def _check_fork_edit(
    before: Conversation, event: ForkEdited, after: Conversation, effects: Effects
) -> None:
    """A fork edit shows: the prompt or task is the new one, an edited reply or tool
    result is in the history or the round, and a reply is charged no tokens."""
    edit = event.edit
    match edit:
        case SystemPromptEdit(system_prompt=text) if after.system_prompt != text:
            _fail("an edit shows", "the system prompt is not the edited one", after)
        case LimitsEdit(limits=limits) if after.limits != limits:
            _fail("an edit shows", "the limits are not the edited ones", after)
        case TaskEdit(task=task) if (after.task, after.history[-1:]) != (
            task,
            (UserMessage(task),),
        ):
            _fail("an edit shows", "the task is not the edited one", after)
        case ReplyEdit(reply=reply):
            added = after.history[len(before.history) : len(before.history) + 1]
            if not added or not isinstance(added[0], AssistantMessage):
                _fail("an edit shows", "the edited reply is not in the history", after)
            elif (added[0].text, added[0].tool_calls) != (reply.text, reply.tool_calls):
                _fail("an edit shows", f"{added[0]} is not the edited reply", after)
            if after.usage != before.usage + reply.usage:
                _fail("an edit shows", "the edited reply's usage is not what it says", after)
        case ToolResultEdit(result=result):
            round_results = after.phase.results if isinstance(after.phase, _ROUND) else ()
            new = after.history[len(before.history) :]
            kept = [r.content for r in round_results] + [
                m.result.content for m in new if isinstance(m, ToolResultMessage)
            ]
            if result.content not in kept:
                _fail("an edit shows", "the edited tool result was lost", after)


def _check_tools_changed(
    before: Conversation, event: ToolsChanged, after: Conversation, effects: Effects
) -> None:
    """An MCP server's new tool list replaces that server's tools only: every other
    tool kept in order, the server's now among those it listed, nothing run, the phase
    and the history as they were."""
    prefix = f"mcp__{event.server}__"
    kept = [t for t in before.tools if not t.name.startswith(prefix)]
    others = [t for t in after.tools if not t.name.startswith(prefix)]
    listed = {t.name: t for t in event.tools}
    theirs = [t for t in after.tools if t.name.startswith(prefix)]
    if before.is_terminal:
        return
    if others != kept or any(listed.get(t.name) != t for t in theirs):
        _fail(
            "a server's new tool list replaces its tools only",
            f"{[t.name for t in before.tools]} -> {[t.name for t in after.tools]}",
            after,
        )
    if effects or after.phase != before.phase or after.history != before.history:
        _fail("a tool list change runs nothing", f"effects {effects}", after)


def _check_fixed(before: Conversation, after: Conversation) -> None:
    for name in (
        "id",
        "parent_id",
        "root_id",
        "depth",
        "cwd",
        "task",
        "system_prompt",
        "sub_agent_prompt",
        "model",
        "limits",
        "tools",
        "timeout",
        "wording",
        *(("deadline_timer",) if before.is_sub_agent else ()),
    ):
        if getattr(before, name) != getattr(after, name):
            _fail(
                "identity never changes",
                f"{name} changed from {getattr(before, name)!r} to {getattr(after, name)!r}",
                after,
            )
    if not before.is_sub_agent and before.deadline_timer != after.deadline_timer:
        # A root's time limit is its turn's: armed with a fresh number as a turn
        # starts, dropped as it ends, never changed in between.
        at_rest = (Idle, Error)
        starts = (
            before.deadline_timer is None
            and isinstance(before.phase, at_rest)
            and after.deadline_timer is not None
            and after.deadline_timer >= before.next_call
        )
        ends = after.deadline_timer is None and isinstance(after.phase, at_rest)
        if not (starts or ends):
            _fail(
                "a root's time limit is its turn's",
                f"deadline_timer changed from {before.deadline_timer!r} to"
                f" {after.deadline_timer!r} at {type(after.phase).__name__}",
                after,
            )
    if after.history[: len(before.history)] != before.history:
        _fail("history only grows", "a message was changed or removed", after)
    # Name exactly the counters that shrank: a message listing every counter hides
    # the one that matters (issue 22.10).
    shrunk = [
        f"{name} {getattr(before, name)}->{getattr(after, name)}"
        for name in _GROWING
        if getattr(after, name) < getattr(before, name)
    ]
    if after.written_off[: len(before.written_off)] != before.written_off:
        shrunk.append(f"written_off {before.written_off}->{after.written_off}")
    if shrunk:
        _fail("counters only grow", ", ".join(shrunk), after)


# The counters of a state that never decrease (``rounds`` restarts with each turn).
_GROWING = (
    "next_call",
    "spawned",
    "usage_input",
    "usage_output",
    "usage_cached",
    "usage_children",
    "refused_calls",
)


def _check_history_while_calling(before: Conversation, event: Event, after: Conversation) -> None:
    """While a model call is in flight (or waits for its retry), the history is the
    call's request: only the call's outcome may change it. A rule that let another
    event add a message there (a note during a model call) kept every other invariant:
    the request stayed valid, and the reply would follow a message the model never
    saw."""
    calling = LlmRequesting | AwaitingRetry
    if (
        isinstance(before.phase, calling)
        and isinstance(after.phase, calling)
        and not isinstance(event, ModelReplied | ModelFailed)
        and after.history != before.history
    ):
        added = after.history[len(before.history) :]
        _fail(
            "history valid in every phase",
            f"{type(event).__name__} changed the history of the model call in flight "
            f"(added {', '.join(type(m).__name__ for m in added) or 'nothing'})",
            after,
        )


def _check_numbers(
    before: Conversation, event: Event, after: Conversation, effects: Effects
) -> None:
    for effect in effects:
        number = effect.call if isinstance(effect, AbortCall) else _issued(effect)
        numbered = isinstance(effect, CallModel | RunTool | ScheduleRetry | StartTimer | AbortCall)
        if numbered and (type(number) is not int or number < 0):
            # E.g. a root's time limit (start accepts one) re-armed on resume: a root
            # has no timer number for it.
            _fail("every call and timer has a number", f"{effect}", after)
    _check_no_duplicate_numbers(after, effects, before.next_call)
    live_before, live_after = live_numbers(before), live_numbers(after)
    # A fork edit goes on as a restart does: it re-issues what was in flight.
    resumed = isinstance(event, RuntimeResumed | ForkEdited)
    for effect in effects:
        number = _issued(effect)
        reissued = number is not None and number < before.next_call
        # A grant runs the call under its request's number (issue 35).
        if (
            isinstance(event, ApprovalGranted)
            and isinstance(effect, RunTool)
            and (number == event.call)
        ):
            continue
        if reissued and not (resumed and number in live_before):
            _fail(
                "only a restart re-issues a number",
                f"{type(effect).__name__} re-uses {number}",
                after,
            )
    aborted = [e.call for e in effects if isinstance(e, AbortCall)]
    if len(set(aborted)) != len(aborted):
        _fail("abort once", f"aborts {aborted}", after)
    for number in aborted:
        if not (
            (number in live_before or number >= before.next_call)
            and number < after.next_call
            and number not in live_after
        ):
            _fail(
                "abort only what was in flight and is no longer awaited",
                f"AbortCall({number}); awaited before {live_before}, after {live_after}",
                after,
            )
    answered = _event_number(event)
    if isinstance(event, ApprovalGranted | ApprovalDenied | UserAnswered):
        answered = event.call  # a decision answers its request
    match event, before.phase:
        # An edited reply answers the awaited call; an edited result, the running tool.
        case ForkEdited(edit=ReplyEdit()), LlmRequesting(call=n):
            answered = n
        case ForkEdited(edit=ToolResultEdit()), ToolExecuting(call=n):
            answered = n
        case ForkEdited(edit=DecisionEdit(decision=decision)), _:
            answered = decision.call
    for number, what in live_before.items():
        if number in live_after or number in aborted or number == answered:
            continue
        interrupted = (
            resumed and isinstance(before.phase, ToolExecuting) and number == before.phase.call
        )
        if not interrupted:
            _fail(
                "nothing in flight is dropped without an AbortCall",
                f"{what} ({number}) is no longer awaited but was not aborted",
                after,
            )
    for number, what in live_after.items():
        if not (number in live_before or number >= before.next_call):
            _fail("awaited numbers are issued", f"{what} ({number}) appeared from nowhere", after)


def _check_notify(before: Conversation, after: Conversation, effects: Effects) -> None:
    notices = [e for e in effects if isinstance(e, NotifyParent)]
    if not after.is_terminal:
        if notices:
            _fail(
                "only entering Completed/Failed notifies the parent",
                f"{notices} while {type(after.phase).__name__}",
                after,
            )
        return
    if len(notices) != 1:
        _fail(
            "every entry into Completed/Failed notifies the parent once",
            f"{len(notices)} NotifyParent effects",
            after,
        )
    notice = notices[0]
    phase = after.phase
    expected: ChildOutcome
    # The outcome carries the tokens of the child's whole subtree (tree budgets).
    if isinstance(phase, Completed):
        # Cut off: its result is the text of a reply that stopped at the token limit.
        last = after.history[-1] if after.history else None
        cut = isinstance(last, AssistantMessage) and last.truncated
        expected = ChildSucceeded(phase.result, after.tokens_spent, after.submitted, cut)
    else:
        assert isinstance(phase, Failed)
        expected = ChildFailed(phase.error, phase.kind, phase.reason, after.tokens_spent)
    if notice != NotifyParent(after.parent_id or "", after.id, expected):
        _fail("the notice carries the outcome", f"{notice} for {phase}", after)


def _check_submitted(event: Event, after: Conversation) -> None:
    """A sub-agent ends Completed without having submitted exactly when its result is a
    reply without tool calls (plain text, or nothing); every other way to Completed is
    a ``submit_result`` call."""
    phase = after.phase
    if not isinstance(phase, Completed):
        return
    plain = isinstance(event, ModelReplied) and not event.reply.tool_calls
    if after.submitted == plain:
        _fail(
            "Completed says whether submit_result was called",
            f"submitted={after.submitted} after {type(event).__name__}",
            after,
        )


def _check_turn_finished(
    before: Conversation, event: Event, after: Conversation, effects: Effects
) -> None:
    finished = [e for e in effects if isinstance(e, TurnFinished)]
    stopped = isinstance(before.phase, _BUSY) and isinstance(after.phase, _QUIET)
    if len(finished) != (1 if stopped else 0):
        _fail(
            "TurnFinished exactly when work stops",
            f"{len(finished)} TurnFinished, {type(before.phase).__name__} -> "
            f"{type(after.phase).__name__}",
            after,
        )
    if not finished:
        return
    done = finished[0]
    phase = after.phase
    match phase:
        case Idle():
            answered = isinstance(event, ModelReplied)
            expected = TurnOutcome.ANSWERED if answered else TurnOutcome.CANCELLED
            ok = done.outcome is expected
        case Error(error=error):
            ok = done == TurnFinished(TurnOutcome.ERROR, error)
        case Completed(result=result):
            ok = done == TurnFinished(TurnOutcome.COMPLETED, result)
        case Failed(error=error):
            ok = done == TurnFinished(TurnOutcome.FAILED, error)
        case _:  # pragma: no cover - _QUIET is exhausted above
            ok = False
    if not ok:
        _fail("TurnFinished tells how the turn ended", f"{done} for {phase}", after)


def _check_model_and_tools(
    before: Conversation, event: Event, after: Conversation, effects: Effects
) -> None:
    phase = after.phase
    _check_timers_say_if_downtime_counts(after, effects)
    calls = [e for e in effects if isinstance(e, CallModel)]
    if len(calls) > 1:
        _fail("one model call at a time", f"{len(calls)} CallModel", after)
    summary = after.children.summary if after.children is not None else None
    if summary is not None and summary.call is not None:
        # The summary call (context mode summary): no round, no tools, the parent's
        # conversation as a full-context child gets it, then the instruction.
        _check_summary_call(after, summary, calls)
        calls = []
    for effect in calls:
        if not (isinstance(phase, LlmRequesting) and phase.call == effect.call):
            _fail("CallModel is awaited", f"CallModel({effect.call})", after)
        assert isinstance(phase, LlmRequesting)
        if effect.attempt != phase.attempt:
            _fail(
                "CallModel carries its attempt",
                f"CallModel attempt {effect.attempt}, phase attempt {phase.attempt}",
                after,
            )
        request = model_request(after)
        _history_open_calls(request.messages, after, request=True)
        if request.messages != after.history:
            _fail(
                "the model sees the whole history",
                "request messages differ from the history",
                after,
            )
        if phase.grace:
            names = {t.name for t in request.tools}
            allowed = {SUBMIT_RESULT, SUBMIT_ERROR} if after.is_sub_agent else set()
            tools_ok = names == allowed
        else:
            tools_ok = request.tools == after.tools
        if not tools_ok:
            _fail("the model is offered the allowed tools", f"{request.tools}", after)
        if not (request.system == after.system_prompt and request.model == after.model):
            _fail("request identity", "system prompt or model differ", after)
    runs = [e for e in effects if isinstance(e, RunTool)]
    if len(runs) > 1:
        _fail("tools run one after another", f"{len(runs)} RunTool", after)
    for run in runs:
        if not (
            isinstance(phase, ToolExecuting)
            and phase.call == run.call
            and phase.current == run.tool_call
            and run.cwd == after.cwd
            and run.tool_call.name not in CONTROL_TOOLS
            and after.offers(run.tool_call.name)
        ):
            _fail("RunTool runs the current, offered, ordinary tool", f"{run}", after)
        _check_run_decisions(run, after)
    if isinstance(phase, LlmRequesting) and phase.call >= before.next_call and not calls:
        _fail("a new model call is issued", "no CallModel", after)
    if (
        isinstance(phase, ToolExecuting)
        and phase.asking is None
        and phase.call >= before.next_call
        and not runs
    ):
        _fail("a new tool is run", "no RunTool", after)
    retries = [e for e in effects if isinstance(e, ScheduleRetry)]
    if len(retries) > 1:
        _fail("one retry timer", f"{retries}", after)
    if summary is not None and summary.timer is not None:
        for retry in retries:
            if not (
                retry.timer == summary.timer
                and retry.attempt == summary.attempt <= after.limits.max_attempts
                and retry.delay == summary.delay
                and retry.delay >= 0
            ):
                _fail("summary retries bounded", f"{retry} for {summary}", after)
        retries = []
    for retry in retries:
        if not (
            isinstance(phase, AwaitingRetry)
            and phase.timer == retry.timer
            and phase.next_attempt == retry.attempt <= after.limits.max_attempts
            and retry.delay >= 0
        ):
            _fail("retries bounded", f"{retry}", after)
        assert isinstance(phase, AwaitingRetry)
        hint = phase.last_error.retry_after
        if (hint is None or hint < 0) and retry.delay > after.limits.retry_cap:
            _fail("backoff capped", f"delay {retry.delay}, cap {after.limits.retry_cap}", after)
    if isinstance(phase, AwaitingRetry) and phase.timer >= before.next_call:
        if not retries:
            _fail("a retry is scheduled", "no ScheduleRetry", after)
        bphase = before.phase
        if not (
            isinstance(bphase, LlmRequesting)
            and isinstance(event, ModelFailed)
            and phase.next_attempt == bphase.attempt + 1
            and phase.grace == bphase.grace
        ):
            _fail("attempts count up by one", f"{bphase} -> {phase}", after)
    bphase = before.phase
    if (
        isinstance(bphase, AwaitingRetry)
        and isinstance(event, TimerFired)
        and event.timer == bphase.timer
    ) and not (
        isinstance(phase, LlmRequesting)
        and phase.attempt == bphase.next_attempt
        and phase.grace == bphase.grace
    ):
        _fail("the retry timer starts the next attempt", f"{bphase} -> {phase}", after)


def _asking_at(state: Conversation) -> tuple[int, ToolCall] | None:
    """The open request of ``state`` (its call number and tool call), if it has one."""
    phase = state.phase
    if isinstance(phase, ToolExecuting) and phase.asking is not None:
        return phase.call, phase.current
    return None


_DECISIONS = (ApprovalGranted, ApprovalDenied, UserAnswered)


def _check_approvals(
    before: Conversation, event: Event, after: Conversation, effects: Effects
) -> None:
    """Issue 35's properties, on every accepted step:

    - no call that must wait for a person (an ask rule, a tool needing approval,
      ``ask_user``) reaches ``RunTool`` unless the step is its grant, or it is the call
      already past its decision being run again (a restart of an idempotent tool);
    - a denied call never runs, and its result says so;
    - a decision closes its request (one decision per request: a second finds none
      open, and the reducer refuses it, which ``probe_illegal`` checks);
    - a cancel while waiting leaves nothing pending, its timer aborted;
    - edited arguments pass the rules again before they run;
    - a new request is shown (its RequestApproval or AskUser) and carries its call.
    """
    if isinstance(event, ForkEdited) and isinstance(event.edit, DecisionEdit):
        event = event.edit.decision  # a fork's other decision: checked as that decision
    open_before = _asking_at(before)
    open_after = _asking_at(after)
    for run in (e for e in effects if isinstance(e, RunTool)):
        granted = (
            isinstance(event, ApprovalGranted)
            and open_before is not None
            and open_before[0] == run.call == event.call
        )
        phase = before.phase
        again = (
            isinstance(phase, ToolExecuting)
            and phase.asking is None
            and phase.call == run.call
            and phase.current == run.tool_call
        )
        if not (granted or again) and (
            needs_decision(before.permissions, before.tools, run.tool_call, before.cwd) is not None
        ):
            _fail("no call that must be asked runs without a grant", f"{run}", after)
        edited = isinstance(event, ApprovalGranted) and event.arguments_json is not None
        if (
            granted
            and edited
            and refusal(before.permissions, run.tool_call, before.cwd) is not None
        ):
            _fail("edited arguments pass the rules again", f"{run}", after)
    if isinstance(event, _DECISIONS):
        if open_before is None or open_before[0] != event.call:
            _fail("a decision needs an open request", f"{event}", after)
        if open_after is not None and open_after[0] == event.call:
            _fail("a decision closes its request", f"{event}", after)
    if isinstance(event, ApprovalDenied) and any(
        isinstance(e, RunTool) and e.call == event.call for e in effects
    ):
        _fail("a denied call never runs", f"{event}", after)
    if isinstance(event, CancelRequested) and open_before is not None:
        if open_after is not None:
            _fail("a cancel while waiting leaves nothing pending", f"{after.phase}", after)
        phase = before.phase
        assert isinstance(phase, ToolExecuting) and phase.asking is not None
        aborted = {e.call for e in effects if isinstance(e, AbortCall)}
        if phase.asking.timer is not None and phase.asking.timer not in aborted:
            _fail("a cancel while waiting aborts its timer", f"{effects}", after)
    if open_after is not None and open_after != open_before:
        shown = [e for e in effects if isinstance(e, RequestApproval | AskUser)]
        if [(e.call, e.tool_call) for e in shown] != [open_after]:
            _fail("a new request is shown once", f"{shown}", after)


def _check_run_decisions(run: RunTool, after: Conversation) -> None:
    """How a RunTool says its call runs follows from the conversation's rules (spelled
    out here, not asked of ``permissions.py``): confined when some layer allows bash
    only through patterns; a file tool's call of a conversation with rules carries
    them, with every tool ``read-only`` stood for."""
    layers = () if after.permissions is None else after.permissions.layers
    confined = any(
        layer.allow is not None
        and not any(rule.tool == "bash" and rule.pattern is None for rule in layer.allow)
        for layer in layers
    )
    if run.confined != confined:
        _fail("RunTool is confined as its rules say", f"{run.confined} for {layers}", after)
    name = run.tool_call.name
    if after.permissions is None or name not in ("read_file", "write_file", "edit_file"):
        if run.path_rules is not None:
            _fail("only a file tool with rules carries them", f"{run.path_rules}", after)
        return
    reading = {"read_file", "think", "grep", "glob"} | {t.name for t in after.tools if t.read_only}
    rules = run.path_rules
    if rules is None or rules.permissions != after.permissions or set(rules.reading) != reading:
        _fail("a file tool carries its conversation's rules", f"{rules}", after)


def _absorbed(before: Conversation, after: Conversation, effects: Effects, why: str) -> None:
    if not (after == before and effects == ()):
        _fail(
            "late events are absorbed",
            f"{why}, but the state changed or effects {effects} were produced",
            after,
        )


def _check_event_rules(
    before: Conversation, event: Event, after: Conversation, effects: Effects
) -> None:
    phase = before.phase
    live = live_numbers(before)
    summary = before.children.summary if before.children is not None else None
    match event:
        case ModelReplied(call=n) | ModelFailed(call=n) if (
            summary is not None and summary.call is not None and summary.call == n
        ):
            _check_summary_result(before, event, after, effects, summary)
        case ModelReplied(call=n) | ModelFailed(call=n):
            if not (isinstance(phase, LlmRequesting) and phase.call == n):
                _absorbed(before, after, effects, f"model result for call {n} not awaited")
            elif isinstance(event, ModelReplied):
                reply = event.reply
                cut = reply.stop_reason == STOP_MAX_TOKENS and not reply.tool_calls
                if not (
                    after.history[len(before.history) : len(before.history) + 1]
                    == (AssistantMessage(reply.text, reply.tool_calls, truncated=cut),)
                    and after.usage == before.usage + reply.usage
                ):
                    _fail(
                        "a reply is recorded (a cut-off text marked truncated)",
                        "reply not appended to the history or usage not counted",
                        after,
                    )
                budget = before.limits.max_tokens
                if reply.tool_calls and reply.stop_reason != STOP_REFUSAL and not phase.grace:
                    spent = budget is not None and after.tokens_spent >= budget
                    end = after.phase
                    ended = isinstance(end, Error | Failed) and end.kind is (
                        ErrorKind.BUDGET_EXHAUSTED
                    )
                    if spent != ended:
                        _fail(
                            "tools asked for once the token budget is spent end the "
                            "conversation, and only then",
                            f"{after.tokens_spent} of {budget} spent -> {end}",
                            after,
                        )
                if reply.stop_reason == STOP_REFUSAL:
                    explanation = reply.stop_details or reply.text
                    end = after.phase
                    if not (
                        isinstance(end, Error | Failed)
                        and end.kind is ErrorKind.REFUSED
                        and explanation in end.error
                        and not any(isinstance(e, RunTool | SpawnSubAgent) for e in effects)
                    ):
                        _fail(
                            "a refusal ends the turn or the sub-agent as refused, with its "
                            "explanation, running nothing",
                            f"{reply.stop_details!r} -> {end} with {effects}",
                            after,
                        )
            else:
                error = event.error
                if after.usage != before.usage + error.usage:
                    _fail(
                        "a failed attempt's tokens count",
                        f"usage {before.usage} -> {after.usage} with {error.usage} reported",
                        after,
                    )
                budget = before.limits.max_tokens
                over = budget is not None and error.usage.total and after.tokens_spent >= budget
                retry = error.kind.retryable and phase.attempt < before.limits.max_attempts
                if over:
                    ok = (
                        isinstance(after.phase, Error | Failed)
                        and after.phase.kind is ErrorKind.BUDGET_EXHAUSTED
                    )
                elif retry:
                    ok = isinstance(after.phase, AwaitingRetry)
                else:
                    ok = isinstance(after.phase, Error | Failed) and after.phase.kind == error.kind
                if not ok:
                    _fail(
                        "retryable errors are retried up to max_attempts, others end the turn",
                        f"{error.kind} at attempt {phase.attempt} -> {after.phase}",
                        after,
                    )
        case ToolFinished(call=n):
            if not (isinstance(phase, ToolExecuting) and phase.call == n):
                _absorbed(before, after, effects, f"tool result for call {n} not awaited")
            else:
                round_results = after.phase.results if isinstance(after.phase, _ROUND) else ()
                new = after.history[len(before.history) :]
                if not (event.result in round_results or ToolResultMessage(event.result) in new):
                    _fail("every tool result is kept", f"{event.result} was lost", after)
        case TimerFired(timer=n):
            if n not in live:
                _absorbed(before, after, effects, f"timer {n} not set")
            elif n in live_numbers(after) and not (
                n == before.deadline_timer and isinstance(after.phase, CancellingSubAgents)
            ):
                _fail(
                    "a timer that fires is acted on",
                    f"{live[n]} ({n}) fired and is still awaited",
                    after,
                )
        case SubAgentFinished(child_id=child):
            if child in before.written_off:
                _absorbed(before, after, effects, f"{child} was written off")
            else:
                ca = after.children
                if ca is not None and not (
                    any(f.spec.id == child and f.outcome == event.outcome for f in ca.finished)
                ):
                    _fail("an accepted outcome is recorded", f"{child}'s outcome missing", after)
        case CancelRequested(reason=reason):
            if isinstance(phase, Idle | Error | CancellingSubAgents):
                _absorbed(before, after, effects, "nothing to cancel")
            else:
                _check_cancel_ending(before, after, reason)
        case UserMessaged(text=text):
            if not (
                isinstance(phase, Idle | Error)
                and isinstance(after.phase, LlmRequesting)
                and after.history == (*before.history, UserMessage(text))
            ):
                _fail("a user message starts a turn", f"{phase} -> {after.phase}", after)
        case RuntimeResumed():
            if not isinstance(phase, ToolExecuting) and after != before:
                _fail("a restart changes nothing", "the state changed", after)


def _check_resume(before: Conversation, after: Conversation, effects: Effects) -> None:
    reissued = {n for e in effects if (n := _issued(e)) is not None}
    live_before, live_after = live_numbers(before), live_numbers(after)
    for number, what in live_before.items():
        if number in live_after and number not in reissued:
            _fail(
                "a restart re-issues everything in flight",
                f"{what} ({number}) was not re-issued",
                after,
            )
    spawned = {e.child_id for e in effects if isinstance(e, SpawnSubAgent)}
    missing = (_started(before.children) & _started(after.children)) - spawned
    if missing:
        _fail("a restart re-spawns running children", f"{sorted(missing)}", after)
    phase = after.phase
    if (
        isinstance(phase, CancellingSubAgents)
        and CancelSubAgents(phase.children.pending_ids(), CancelReason.PARENT) not in effects
    ):
        _fail("a restart repeats the cancel", f"{effects}", after)
