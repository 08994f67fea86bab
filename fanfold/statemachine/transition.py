"""The reducer: ``start(created)`` and ``transition(state, event) -> (state, effects)``.

Rules of this module (everything that decides lives here):

- Pure: no I/O, no clock, no randomness. Same inputs, same outputs, every time.
- Every event is either handled by an explicit rule or rejected with IllegalTransition;
  a rejected event changes nothing. There is no catch-all that drops events.
- Events that can legitimately arrive late get explicit "absorb" rules that return
  the state unchanged with no effects:
    * a result or timer firing for a call issued earlier but no longer awaited
      (aborted by a cancel, or superseded); a number never issued raises UnknownCall;
    * an outcome from a child the parent already wrote off (deadline, no ack);
    * a cancel request when nothing runs (Idle, Error, already cancelling, ended);
    * a restart notice for a conversation with nothing in flight.
- Every tool call in the history gets exactly one result before the next model call,
  including on cancel ("cancelled" for the running tool, "skipped" for the rest).
- Every entry into Completed or Failed emits exactly one NotifyParent.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from typing import Any

import attrs

from fanfold.statemachine.agent_defs import AgentDefinition, ContextMode
from fanfold.statemachine.children import (
    ChildFailed,
    Children,
    ChildSpec,
    PendingChild,
    RejectedTask,
    Summary,
    fan_in_result,
)
from fanfold.statemachine.control_tools import (
    CONTROL_TOOLS,
    GRACE_PROMPT,
    MAX_TASK_CHARS,
    ROOT_GRACE_PROMPT,
    SPAWN_AGENTS,
    SUBMIT_ERROR,
    SUBMIT_ERROR_SPEC,
    SUBMIT_RESULT,
    SUBMIT_RESULT_SPEC,
    TaskRequest,
    can_spawn,
    join_cwd,
    offered_tools,
    one_of,
    ordinary_tools,
    parse_task,
)
from fanfold.statemachine.delegation import (
    SUMMARY_CUT,
    agent_for,
    capped_limits,
    capped_share,
    child_setup,
    parent_context,
    permitted_tools,
    summary_context,
    summary_messages,
)
from fanfold.statemachine.effects import (
    AbortCall,
    CallModel,
    CancelSubAgents,
    Effect,
    NotifyParent,
    RunTool,
    ScheduleRetry,
    SpawnSubAgent,
    StartTimer,
    TurnFinished,
    TurnOutcome,
)
from fanfold.statemachine.errors import (
    CancelReason,
    DuplicateChildOutcome,
    ErrorKind,
    IllegalTransition,
    UnknownCall,
    UnknownChild,
)
from fanfold.statemachine.events import (
    CancelRequested,
    ConversationCreated,
    ConversationForked,
    Event,
    ForkEdited,
    LimitsEdit,
    ModelFailed,
    ModelReplied,
    ReplyEdit,
    RuntimeResumed,
    SubAgentFinished,
    SystemPromptEdit,
    TaskEdit,
    TimerFired,
    ToolFinished,
    ToolResultEdit,
    ToolsChanged,
    UserMessaged,
    WorkingDirectory,
)
from fanfold.statemachine.limits import Limits, with_max_rounds
from fanfold.statemachine.messages import (
    STOP_MAX_TOKENS,
    STOP_REFUSAL,
    AssistantMessage,
    Message,
    ModelError,
    ModelReply,
    ModelRequest,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
    may_hold_non_finite,
    non_finite_path,
)
from fanfold.statemachine.modes import may_start, parse_mode, settle, task_with_earlier
from fanfold.statemachine.permissions import (
    confines_commands,
    mcp_server_of,
    path_rules,
    reading_tools,
    refusal,
)
from fanfold.statemachine.phases import (
    AwaitingRetry,
    AwaitingSubAgents,
    CancellingSubAgents,
    Completed,
    EndCompleted,
    EndFailed,
    EndIdle,
    Ending,
    Error,
    Failed,
    Idle,
    LlmRequesting,
    Phase,
    ToolExecuting,
)
from fanfold.statemachine.state import Conversation

Effects = tuple[Effect, ...]
Transition = tuple[Conversation, Effects]

_NO_CHILDREN = Children()  # a round without children (one value, not one per reply)

CANCELLED_RESULT = "cancelled: the conversation was cancelled while this tool ran"
SKIPPED_RESULT = "skipped: the conversation stopped before this tool ran"
INTERRUPTED_RESULT = (
    "interrupted: the runtime restarted while this tool ran; it may have partly run "
    "and was not run again"
)
FORKED_TOOL_RESULT = (
    "not run in this fork: it was still running in the source when this conversation "
    "was forked, and the fork has no result of it from there; it was not run again "
    "(it may have run in the source)"
)


# --------------------------------------------------------------------------- entry


def start(created: ConversationCreated | ConversationForked) -> Transition:
    """The first state of a conversation, from its ConversationCreated event.

    A root conversation starts Idle. A sub-agent starts working on its task at once,
    with its own time-limit timer when it has one. A fork starts in its source's
    state, under its own id.
    """
    if isinstance(created, ConversationForked):
        return _fork(created)
    if created.parent_id is not None and not created.task:
        raise IllegalTransition(None, created, "a sub-agent needs a task")
    if created.depth < 0 or (created.parent_id is None) != (created.depth == 0):
        raise IllegalTransition(
            None, created, "depth must be 0 for a root and >= 1 for a sub-agent"
        )
    if created.timeout is not None and not (0.0 <= created.timeout < math.inf):
        raise IllegalTransition(
            None, created, f"a time limit must be a finite number >= 0, got {created.timeout}"
        )
    is_sub = created.parent_id is not None
    refused = None
    if is_sub and created.workdir is not None:
        refused = workdir_problem(created.cwd, created.workdir)
    # A sub-agent that will run takes number 0 for its time limit: set in the state as
    # it is built, so that its first step copies the state once (_call_model's).
    timed = is_sub and refused is None and created.timeout is not None
    state = Conversation(
        id=created.conversation_id,
        parent_id=created.parent_id,
        root_id=created.root_id or created.conversation_id,
        depth=created.depth,
        cwd=created.cwd,
        task=created.task,
        system_prompt=created.system_prompt,
        model=created.model,
        limits=created.limits,
        tools=offered_tools(
            permitted_tools(created.tools, created.permissions),
            depth=created.depth,
            is_sub_agent=is_sub,
            limits=created.limits,
            agents=created.agents,
        ),
        history=(),
        phase=Idle(),
        timeout=created.timeout,
        sub_agent_prompt=created.sub_agent_prompt,
        agents=created.agents,
        agent=created.agent,
        permissions=created.permissions,
        deadline_timer=0 if timed else None,
        next_call=1 if timed else 0,
    )
    if not is_sub:
        return state, ()
    assert created.task is not None
    # Context mode full: what its parent had said so far, then the task.
    history = (*created.context, UserMessage(created.task))
    if refused is not None:
        # It never runs a tool there, nor calls the model: the parent hears at once.
        return _apply_ending(state, EndFailed(refused, ErrorKind.INVALID_CWD), history)
    timer: Effects = ()
    if timed:
        assert created.timeout is not None
        timer = (StartTimer(0, created.timeout, "time limit", counts_downtime=True),)
    return _after(timer, _call_model(state, history=history))


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def workdir_problem(cwd: str, workdir: WorkingDirectory) -> str | None:
    """Why a sub-agent may not work in ``cwd``, given what the runtime found there; None
    if it may. Its real directory (links followed) must lie inside its parent's and
    inside the project (the tree root's working directory), and be a directory."""
    via = f"'{cwd}' resolves to '{workdir.resolved}'"
    if not _inside(workdir.resolved, workdir.project):
        return f"working directory {via}, outside the project '{workdir.project}'"
    if not _inside(workdir.resolved, workdir.parent):
        return f"working directory {via}, outside its parent's '{workdir.parent}'"
    if not workdir.is_directory:
        return f"working directory {via}, which is not a directory"
    return None


def _fork(forked: ConversationForked) -> Transition:
    source = forked.state
    if not source.is_sub_agent and isinstance(source.phase, Idle | Error):
        # A root at rest: a new tree of one conversation, under the fork's id. Nothing
        # is in flight, so its edit is an event of its own (seq 1), not a pending one.
        if forked.edit is not None:
            raise IllegalTransition(
                source, forked, "a root forked at rest takes its edit as a ForkEdited event"
            )
        state = attrs.evolve(
            source, id=forked.conversation_id, root_id=forked.conversation_id, written_off=()
        )
        return state, ()
    # One conversation of a tree forked at a moment of its run (a sub-agent, or a
    # conversation with work in flight): the whole tree is copied, so the state
    # arrives already under the fork's ids (its own, its parent's, its children's).
    # It starts as it was and issues nothing: the runtime continues the forked tree
    # as it recovers one after a crash (RuntimeResumed re-issues what was in flight).
    if source.id != forked.conversation_id:
        raise IllegalTransition(
            source,
            forked,
            "a fork of a sub-agent or of a conversation with work in flight carries its "
            f"state under the fork's ids (state of {source.id!r}, fork "
            f"{forked.conversation_id!r})",
        )
    if source.is_sub_agent == (source.root_id == source.id):
        raise IllegalTransition(source, forked, "its root id does not match its place")
    if forked.edit is not None:
        # The edit waits in the log for the fork to go on (the runtime delivers it as
        # ForkEdited): it must be one the state admits, or that resume would fail.
        try:
            transition(source, ForkEdited(forked.edit))
        except IllegalTransition as exc:
            raise IllegalTransition(
                source, forked, f"its edit does not fit its state: {exc.reason}"
            ) from None
    return source, ()


def transition(state: Conversation, event: Event) -> Transition:
    """Apply ``event`` to ``state``; returns the new state and the effects to run.

    Raises an IllegalTransition subclass, leaving nothing changed, if the event is not
    acceptable in this state.
    """
    # One dictionary lookup by the event's class instead of a chain of isinstance
    # tests (the table is _HANDLERS, at the end of this module).
    name = _HANDLERS.get(type(event))
    if name is None:
        if isinstance(event, ConversationCreated | ConversationForked):
            raise IllegalTransition(state, event, "the conversation already exists")
        raise IllegalTransition(state, event, "not an event")
    if type(state.phase) in _ENDED:
        return _in_terminal_phase(state, event)
    handler: Callable[[Conversation, Any], Transition] = _RULES[name]
    return handler(state, event)


_ENDED = frozenset((Completed, Failed))  # TERMINAL_PHASES, for a lookup by class


# ------------------------------------------------------------------ small helpers


def _absorb(state: Conversation) -> Transition:
    return state, ()


def _after(effects: Effects, then: Transition) -> Transition:
    """``then``, with ``effects`` to run before its own."""
    if not effects:
        return then
    state, more = then
    return state, (*effects, *more)


def _current_or_stale(state: Conversation, event: Event, number: int, current: int | None) -> bool:
    """True if ``number`` is the awaited call; False if issued earlier (stale).

    A number this conversation never issued is a bug in whoever sent it: raise.
    """
    if number == current:
        return True
    if 0 <= number < state.next_call:
        return False
    raise UnknownCall(state, event, f"call {number} was never issued (next is {state.next_call})")


def _issue(state: Conversation) -> tuple[Conversation, int]:
    """Take the next call/timer number."""
    return state.evolve(next_call=state.next_call + 1), state.next_call


def _backoff(state: Conversation, attempt: int, error: ModelError, timer: int) -> float:
    """Delay before ``attempt`` (>= 2): the provider's hint, else exponential backoff.

    Jitter spreads many children hitting one rate limit; it is derived from a hash of
    the conversation id and timer, so it is deterministic (no randomness in the core).
    """
    limits = state.limits
    if error.retry_after is not None and error.retry_after >= 0:
        # Honour the server's hint, but never wait longer than the backoff cap.
        return min(float(error.retry_after), limits.retry_cap)
    ceiling = min(limits.retry_cap, limits.retry_base * 2.0 ** (attempt - 2))
    digest = hashlib.blake2b(f"{state.id}:{timer}".encode(), digest_size=2).digest()
    fraction = int.from_bytes(digest, "big") / 0xFFFF
    return round(ceiling * (0.5 + fraction / 2), 3)


def _offered_now(state: Conversation, grace: bool) -> tuple[ToolSpec, ...]:
    if not grace:
        return state.tools
    return (SUBMIT_RESULT_SPEC, SUBMIT_ERROR_SPEC) if state.is_sub_agent else ()


def model_request(state: Conversation) -> ModelRequest:
    """The request of the model call ``state`` awaits (its phase is LlmRequesting):
    the system prompt, the whole history, the tools offered now (only the submit tools
    in a grace round) and the model. What a ``CallModel`` effect asks for.

    While a round's children wait for the summary of context mode ``summary``, the
    call awaited is that summary's (``summary_request``).

    Raises ValueError if ``state`` awaits no model call.
    """
    phase = state.phase
    if _summary_call(state) is not None:
        return summary_request(state)
    if not isinstance(phase, LlmRequesting):
        raise ValueError(
            f"conversation {state.id!r} awaits no model call (phase {type(phase).__name__})"
        )
    return ModelRequest(
        system=state.system_prompt,
        messages=state.history,
        tools=_offered_now(state, phase.grace),
        model=state.model,
    )


def summary_request(state: Conversation) -> ModelRequest:
    """The request of a summary call: the parent's system prompt and model, its
    conversation as plain turns (``delegation.summary_messages``) and the instruction
    to summarise; no tools (a summary is text)."""
    return ModelRequest(
        system=state.system_prompt,
        messages=summary_messages(state.history),
        tools=(),
        model=state.model,
    )


def is_summary_call(state: Conversation, call: int) -> bool:
    """Whether model call ``call``, awaited in ``state``, is a summary call (context
    mode ``summary``) rather than one of the conversation's rounds."""
    summary = _summary_call(state)
    return summary is not None and summary.call == call


def _summary_call(state: Conversation) -> Summary | None:
    """The summary whose model call ``state`` awaits, if it awaits one."""
    phase = state.phase
    if isinstance(phase, AwaitingSubAgents):
        summary = phase.children.summary
        if summary is not None and summary.call is not None:
            return summary
    return None


def _call_model(
    state: Conversation,
    *,
    attempt: int = 1,
    grace: bool = False,
    history: tuple[Message, ...] | None = None,
    rounds: int | None = None,
    changes: dict[str, Any] | None = None,
) -> Transition:
    """Start a model call. A new round past ``max_rounds`` becomes the grace round.

    ``history``, ``rounds``: the history and round count to call with when the step
    changed them (the round's tool results, ``_round_history``; a user's message and
    its new turn), so that the step copies the state once; ``changes``: the step's
    other changes not made yet (a child outcome's tokens), made in the same copy.
    """
    # One copy of the state for the history, the round, the call number and the phase.
    more = {} if changes is None else dict(changes)
    # A step that took numbers before the call (a root's turn timer) says where the
    # numbering stands in ``changes``.
    call = more.pop("next_call", state.next_call)
    phase = LlmRequesting(call=call, attempt=attempt, grace=grace)
    if history is None:
        history = state.history
    if rounds is None:
        rounds = state.rounds
    if attempt == 1 and not grace:
        if rounds >= state.limits.max_rounds:
            prompt = GRACE_PROMPT if state.is_sub_agent else ROOT_GRACE_PROMPT
            state = state.evolve(
                **more,
                history=(*history, UserMessage(prompt)),
                rounds=rounds,
                next_call=call + 1,
                phase=LlmRequesting(call=call, attempt=attempt, grace=True),
            )
        elif changes is None:  # every round's path: no ** of an empty dictionary
            state = state.evolve(
                history=history, rounds=rounds + 1, next_call=call + 1, phase=phase
            )
        else:
            state = state.evolve(
                **more, history=history, rounds=rounds + 1, next_call=call + 1, phase=phase
            )
    else:
        state = state.evolve(
            **more, history=history, rounds=rounds, next_call=call + 1, phase=phase
        )
    return state, (CallModel(call, attempt),)


def _tool_error(call: ToolCall, message: str) -> ToolResult:
    return ToolResult(call.id, call.name, message, is_error=True)


def _open_tool_calls(history: tuple[Message, ...]) -> tuple[ToolCall, ...]:
    """Tool calls of the last assistant message that have no result in ``history``."""
    answered: set[str] = set()
    for message in reversed(history):
        match message:
            case ToolResultMessage(result=result):
                answered.add(result.tool_call_id)
            case AssistantMessage(tool_calls=calls):
                return tuple(c for c in calls if c.id not in answered)
            case UserMessage():
                return ()
    return ()


def _append_round_results(
    state: Conversation, results: tuple[ToolResult, ...], children: Children
) -> Conversation:
    """``state`` with ``_round_history``."""
    return state.evolve(history=_round_history(state, results, children))


def _round_history(
    state: Conversation,
    results: tuple[ToolResult, ...],
    children: Children,
    history: tuple[Message, ...] | None = None,
) -> tuple[Message, ...]:
    """The history (``state``'s, or ``history`` when the step changed it) with one
    result per open tool call appended, in the calls' order.

    A ``spawn_agents`` call's result is the fan-in of its children; a call with no
    recorded result (possible only when a conversation ends early) gets "skipped".
    """
    if history is None:
        history = state.history
    # Results are matched to calls in order, so that two calls sharing an id (a
    # provider's bug) each keep their own result instead of both showing the last.
    by_id: dict[str, list[ToolResult]] = {}
    for done in results:
        by_id.setdefault(done.tool_call_id, []).append(done)
    spawn_ids: frozenset[str] | set[str] = frozenset()
    if children is not _NO_CHILDREN:  # every round of a conversation that spawns none
        spawn_ids = (
            {p.spec.spawn_call_id for p in children.pending}
            | {f.spec.spawn_call_id for f in children.finished}
            | {r.spawn_call_id for r in children.rejected}
        )
    appended = []
    for call in _open_tool_calls(history):
        if by_id.get(call.id):
            result = by_id[call.id].pop(0)
        elif call.id in spawn_ids:
            result = fan_in_result(call.id, children, state.limits.child_result_cap)
        else:
            result = _tool_error(call, SKIPPED_RESULT)
        appended.append(ToolResultMessage(result))
    return (*history, *appended)


# ------------------------------------------------------------------ endings


def _apply_ending(
    state: Conversation,
    ending: Ending,
    history: tuple[Message, ...] | None = None,
    changes: dict[str, Any] | None = None,
) -> Transition:
    """Leave the busy phases: back to Idle (root) or into a terminal phase (sub-agent).

    ``history``: the history to end with when the step changed it; ``changes``: the
    step's other changes not made yet (a model reply's usage and history, see
    ``_run_tools``), made in the same copy: one copy of the state for all."""
    effects: list[Effect] = []
    if state.deadline_timer is not None:
        effects.append(AbortCall(state.deadline_timer))
    fields = {} if changes is None else dict(changes)
    if history is not None:
        fields["history"] = history
    match ending:
        case EndIdle():
            # Only a root: its time limit was its turn's (the next turn arms its own).
            state = state.evolve(**fields, phase=Idle(), deadline_timer=None)
            effects.append(TurnFinished(TurnOutcome.CANCELLED, "cancelled"))
        case EndCompleted(result=result):
            # Only a sub-agent completes (submit_result is never offered to a root;
            # a root's answer is _answered's Idle).
            state = state.evolve(**fields, phase=Completed(result))
            assert state.parent_id is not None and state.outcome is not None
            effects.append(NotifyParent(state.parent_id, state.id, state.outcome))
            effects.append(TurnFinished(TurnOutcome.COMPLETED, result))
        case EndFailed(error=error, kind=kind, reason=reason):
            if not state.is_sub_agent:
                state = state.evolve(**fields, phase=Error(error, kind), deadline_timer=None)
                effects.append(TurnFinished(TurnOutcome.ERROR, error))
            else:
                state = state.evolve(**fields, phase=Failed(error, kind, reason))
                assert state.parent_id is not None and state.outcome is not None
                effects.append(NotifyParent(state.parent_id, state.id, state.outcome))
                effects.append(TurnFinished(TurnOutcome.FAILED, error))
    return state, tuple(effects)


def _stop_children(
    state: Conversation,
    results: tuple[ToolResult, ...],
    children: Children,
    ending: Ending,
    changes: dict[str, Any] | None = None,
) -> Transition:
    """Cancel every pending child, then end once all have acknowledged.

    Queued children never started, so they are finished here and now; running ones
    are told to cancel, and a grace timer bounds how long we wait for them. A summary
    call in flight is aborted. ``changes``: the model reply's, not made yet (see
    ``_run_tools``).
    """
    children, aborted = _summary_stopped(children)
    return _after(aborted, _stop_children_now(state, results, children, ending, changes))


def _stop_children_now(
    state: Conversation,
    results: tuple[ToolResult, ...],
    children: Children,
    ending: Ending,
    changes: dict[str, Any] | None = None,
) -> Transition:
    for pending in children.pending:
        if not pending.started:
            children = children.finish(
                pending.spec.id,
                ChildFailed(
                    "cancelled before it started", ErrorKind.CANCELLED, CancelReason.PARENT
                ),
            )
    running = children.pending_ids()
    if not running:
        # Every submit without running children (each sub-agent's last step): the
        # reply's changes, the round's results and the ending in one copy.
        history = None if changes is None else changes["history"]
        history = _round_history(state, results, children, history)
        return _apply_ending(state, ending, history, changes)
    if changes is not None:
        state = state.evolve(**changes)
    # Deadlines no longer apply: the cancel grace timer bounds the wait from now on.
    effects: list[Effect] = []
    for pending in children.pending:
        if pending.deadline_timer is not None:
            effects.append(AbortCall(pending.deadline_timer))
    children = attrs.evolve(
        children, pending=tuple(attrs.evolve(p, deadline_timer=None) for p in children.pending)
    )
    effects.append(CancelSubAgents(running, CancelReason.PARENT))
    state, grace = _issue(state)
    effects.append(StartTimer(grace, state.limits.cancel_grace, "cancel acknowledgement"))
    state = state.evolve(
        phase=CancellingSubAgents(
            children=children, results=results, ending=ending, grace_timer=grace
        ),
    )
    return state, tuple(effects)


def _cancel_ending(state: Conversation, reason: CancelReason) -> Ending:
    if not state.is_sub_agent:
        if reason is CancelReason.TIMEOUT and state.deadline_timer is not None:
            # The turn outlived the root's own time limit: an error the caller sees
            # (a delegated tree's agent definition set it), not a user's cancel.
            return EndFailed(f"time limit of {state.timeout}s reached", reason.error_kind, reason)
        return EndIdle()
    if reason is CancelReason.TIMEOUT:
        # The runtime may time out a sub-agent that has no limit of its own.
        limit = "" if state.timeout is None else f" of {state.timeout}s"
        return EndFailed(f"time limit{limit} reached", reason.error_kind, reason)
    return EndFailed(f"cancelled ({reason})", reason.error_kind, reason)


def _in_terminal_phase(state: Conversation, event: Event) -> Transition:
    """Completed and Failed: absorb what may arrive late, refuse everything else."""
    match event:
        case CancelRequested() | RuntimeResumed() | ToolsChanged():
            return _absorb(state)
        case (
            ModelReplied(call=n) | ModelFailed(call=n) | ToolFinished(call=n) | TimerFired(timer=n)
        ):
            _current_or_stale(state, event, n, None)
            return _absorb(state)
        case SubAgentFinished(child_id=child) if child in state.written_off:
            return _absorb(state)
    raise IllegalTransition(state, event, "the conversation has ended")


# ------------------------------------------------------------------ user messages


def _on_user_message(state: Conversation, event: UserMessaged) -> Transition:
    if state.is_sub_agent:
        raise IllegalTransition(state, event, "a sub-agent takes no user messages")
    if not isinstance(state.phase, Idle | Error):
        raise IllegalTransition(
            state, event, "the conversation is busy; wait for the turn to end or cancel it"
        )
    # A new turn: its rounds count from 0 (one copy of the state, _call_model's).
    history = (*state.history, UserMessage(event.text))
    limit = state.timeout
    if limit is None:
        return _call_model(state, history=history, rounds=0)
    # A root with a time limit (the agent definition a delegated tree runs as) gives
    # each turn that long, counted like a sub-agent's, downtime included; the turn's
    # end aborts it (_answered, _apply_ending). The timer takes the next number, the
    # model call the one after, in _call_model's copy.
    timer = state.next_call
    return _after(
        (StartTimer(timer, limit, "time limit", counts_downtime=True),),
        _call_model(
            state,
            history=history,
            rounds=0,
            changes={"deadline_timer": timer, "next_call": timer + 1},
        ),
    )


# ------------------------------------------------------------------ model results


def _on_model_result(state: Conversation, event: ModelReplied | ModelFailed) -> Transition:
    summary = _summary_call(state)
    if summary is not None:
        if not _current_or_stale(state, event, event.call, summary.call):
            return _absorb(state)
        return _on_summary_result(state, summary, event)
    phase = state.phase
    current = phase.call if isinstance(phase, LlmRequesting) else None
    if not _current_or_stale(state, event, event.call, current):
        return _absorb(state)
    assert isinstance(phase, LlmRequesting)
    if isinstance(event, ModelFailed):
        return _on_model_failed(state, phase, event.error)
    return _on_model_replied(state, phase, event)


def _count_usage(state: Conversation, usage: Usage) -> Conversation:
    """``state`` with the tokens of one model call (or a billed failed attempt) added."""
    return state.evolve(
        usage_input=state.usage_input + usage.input_tokens,
        usage_cached=state.usage_cached + usage.cached_input_tokens,
        usage_output=state.usage_output + usage.output_tokens,
    )


def _finite_hint(error: ModelError) -> ModelError:
    """``error`` without a NaN or infinite delay hint: that is no hint, and the state
    keeps no such number (the backoff ignores it either way)."""
    if error.retry_after is not None and not math.isfinite(error.retry_after):
        return attrs.evolve(error, retry_after=None)
    return error


def _on_model_failed(state: Conversation, phase: LlmRequesting, error: ModelError) -> Transition:
    error = _finite_hint(error)
    if error.usage.total:
        # A failed attempt the server billed counts like any other: in the usage and
        # against the token budget, which may end the conversation instead of a retry.
        state = _count_usage(state, error.usage)
        budget = state.limits.max_tokens
        if budget is not None and state.tokens_spent >= budget:
            return _apply_ending(
                state,
                EndFailed(
                    f"token budget of {budget} exhausted ({state.tokens_spent} used) by a "
                    f"failed model call ({error.kind}): {error.message}",
                    ErrorKind.BUDGET_EXHAUSTED,
                    CancelReason.LIMIT,
                ),
            )
    if error.kind.retryable and phase.attempt < state.limits.max_attempts:
        state, timer = _issue(state)
        attempt = phase.attempt + 1
        delay = _backoff(state, attempt, error, timer)
        state = state.evolve(
            phase=AwaitingRetry(
                timer=timer, next_attempt=attempt, last_error=error, grace=phase.grace
            ),
        )
        return state, (ScheduleRetry(timer, delay, attempt),)
    why = "retries exhausted" if error.kind.retryable else "not retryable"
    message = f"model call failed ({error.kind}, {why} after {phase.attempt} attempt(s)): "
    return _apply_ending(state, EndFailed(message + error.message, error.kind))


def _on_model_replied(state: Conversation, phase: LlmRequesting, event: ModelReplied) -> Transition:
    reply = event.reply
    # A plain-text reply cut off at the output token limit is kept, marked: the user
    # and the parent see that the answer or result is cut (a reply with tool calls cut
    # off never gets here from the HTTP providers: they report output_truncated).
    truncated = reply.stop_reason == STOP_MAX_TOKENS and not reply.tool_calls
    # One copy of the state (this is every round's path): not _count_usage + evolve.
    usage = reply.usage
    changes = {
        "usage_input": state.usage_input + usage.input_tokens,
        "usage_cached": state.usage_cached + usage.cached_input_tokens,
        "usage_output": state.usage_output + usage.output_tokens,
        "history": (*state.history, AssistantMessage(reply.text, reply.tool_calls, truncated)),
    }
    budget = state.limits.max_tokens
    if (
        reply.tool_calls
        and not phase.grace
        and reply.stop_reason != STOP_REFUSAL
        and (budget is None or state.tokens_spent + usage.total < budget)
    ):
        # Every round's path: the tools run with the reply's changes still to make,
        # so that the step copies the state once (see _run_tools).
        return _run_tools(state, reply.tool_calls, (), _NO_CHILDREN, changes)
    if (
        not reply.tool_calls
        and reply.stop_reason != STOP_REFUSAL
        and not (phase.grace and state.is_sub_agent and not reply.text.strip())
    ):
        # An answer (a root's every turn): the reply's changes and the end in one copy.
        return _answered(state, reply.text, changes)
    state = state.evolve(**changes)
    if reply.stop_reason == STOP_REFUSAL:
        # The model declined: a typed failure carrying its explanation, never an empty
        # result or answer. Tool calls that came with it are not run.
        state = _append_round_results(state, (), _NO_CHILDREN)
        return _apply_ending(state, _refusal(reply))
    if not reply.tool_calls:  # the grace round of a sub-agent, ended with no text
        return _apply_ending(state, _iteration_limit(state, reply.text))
    if phase.grace:
        return _grace_tool_calls(state, reply.tool_calls, reply.text)
    budget = state.limits.max_tokens
    if budget is not None and state.tokens_spent >= budget:
        state = _append_round_results(state, (), _NO_CHILDREN)
        return _apply_ending(
            state,
            EndFailed(
                f"token budget of {budget} exhausted ({state.tokens_spent} used)",
                ErrorKind.BUDGET_EXHAUSTED,
                CancelReason.LIMIT,  # kept by a sub-agent's Failed, not by a root's Error
            ),
        )
    return _run_tools(state, reply.tool_calls, (), _NO_CHILDREN)


def _refusal(reply: ModelReply) -> EndFailed:
    explanation = reply.stop_details or reply.text or "(no explanation given)"
    return EndFailed(f"the model refused the request: {explanation}", ErrorKind.REFUSED)


def _answered(state: Conversation, text: str, changes: dict[str, Any]) -> Transition:
    """A plain-text reply ends the turn (``changes``: the reply's, not made yet)."""
    if state.is_sub_agent:
        # Plain text from a sub-agent is its result, but it never called submit_result
        # (a chat model that ignores tools): the parent and the user are told so.
        # (Conversation.submitted reads it from the history the reply ends).
        return _apply_ending(state, EndCompleted(text), changes=changes)
    if state.deadline_timer is not None:  # the turn's time limit, no longer needed
        timer = state.deadline_timer
        state = state.evolve(**changes, phase=Idle(), deadline_timer=None)
        return state, (AbortCall(timer), TurnFinished(TurnOutcome.ANSWERED, text))
    state = state.evolve(**changes, phase=Idle())
    return state, (TurnFinished(TurnOutcome.ANSWERED, text),)


def _iteration_limit(state: Conversation, last_text: str) -> EndFailed:
    detail = f"; last text: {last_text}" if last_text.strip() else ""
    return EndFailed(
        f"reached the limit of {state.limits.max_rounds} model rounds without a result" + detail,
        ErrorKind.ITERATION_LIMIT,
    )


def _grace_tool_calls(
    state: Conversation, calls: tuple[ToolCall, ...], last_text: str
) -> Transition:
    """The grace round asked for tools: only submit_result/submit_error count now."""
    if state.is_sub_agent:
        for call in calls:
            if call.name in (SUBMIT_RESULT, SUBMIT_ERROR):
                done = _submission(call)
                if isinstance(done, EndCompleted | EndFailed):
                    state = _append_round_results(state, (_submitted(call),), _NO_CHILDREN)
                    return _apply_ending(state, done)
        state = _append_round_results(state, (), _NO_CHILDREN)
        return _apply_ending(state, _iteration_limit(state, last_text))
    state = _append_round_results(state, (), _NO_CHILDREN)
    return _apply_ending(
        state,
        EndFailed(
            f"reached the limit of {state.limits.max_rounds} model rounds in this turn",
            ErrorKind.ITERATION_LIMIT,
        ),
    )


# ------------------------------------------------------------------ tools


def _refused_numbers(call: ToolCall) -> str | None:
    """Why ``call`` is refused for a non-finite number in its arguments, or None.

    JSON has no NaN or infinity, but Python's reader (and so a provider's) accepts
    ``NaN``, ``Infinity`` and literals like ``1e999``. No tool, control tool or not,
    runs on one: a NaN time limit would reach a timer, a log, a request body.
    Arguments that are not JSON at all are left to the tool to report.
    """
    if not may_hold_non_finite(call.arguments_json):
        return None  # the common case, told without parsing the arguments
    try:
        arguments = call.arguments()
    except ValueError:
        return None
    path = non_finite_path(arguments)
    if path is None:
        return None
    where = f" at '{path}'" if path else ""
    return (
        f"refused: the arguments of {call.name} hold a non-finite number{where} (NaN, "
        "Infinity, or a literal too large for a float); send finite numbers"
    )


def _submission(call: ToolCall) -> Ending | str:
    """Read a submit_result / submit_error call: the ending, or an error message."""
    refused = _refused_numbers(call)
    if refused is not None:
        return refused
    key = "result" if call.name == SUBMIT_RESULT else "error"
    try:
        args = call.arguments()
    except ValueError:
        return f"invalid JSON arguments for {call.name}"
    value = args.get(key) if isinstance(args, dict) else None
    if not isinstance(value, str):
        return f"{call.name} needs a string argument '{key}'"
    if call.name == SUBMIT_RESULT:
        return EndCompleted(value)
    return EndFailed(value, ErrorKind.SUBMITTED_ERROR)


def _submitted(call: ToolCall) -> ToolResult:
    return ToolResult(call.id, call.name, "submitted; the conversation ends")


def _run_tools(
    state: Conversation,
    queue: tuple[ToolCall, ...],
    results: tuple[ToolResult, ...],
    children: Children,
    changes: dict[str, Any] | None = None,
) -> Transition:
    """Work through the round's tool calls in order.

    Control tools are handled here, synchronously; the first ordinary tool becomes a
    RunTool effect and the round waits in ToolExecuting for its result.

    ``changes``: the model reply's changes to the state (usage, history), made with
    the phase in one copy when an ordinary tool runs first (every round's case), or
    before anything else that reads or changes the state.
    """
    effects: list[Effect] = []  # of the control tools run on the way
    while queue:
        call, queue = queue[0], queue[1:]
        # What decides the first checks (permissions, tools, arguments) is not among
        # ``changes``: they may wait until the state is needed as a whole.
        refused = _refused_by_rules(state, call)
        if changes is not None and (
            refused is not None or call.name == SPAWN_AGENTS or not state.offers(call.name)
        ):
            # A submit's ending takes the changes with it (_stop_children).
            state, changes = state.evolve(**changes), None
        if refused is not None:
            # Decided here from the rules in the state, so replay refuses it again.
            state = state.evolve(refused_calls=state.refused_calls + 1)
            results = (*results, _tool_error(call, refused))
        elif not state.offers(call.name):
            results = (*results, _tool_error(call, _not_offered(state, call.name)))
        elif (refused := _refused_numbers(call)) is not None:
            results = (*results, _tool_error(call, refused))
        elif call.name == SPAWN_AGENTS:
            state, children, result, spawned = _spawn(state, call, children)
            effects += spawned
            if result is not None:
                results = (*results, result)
        elif call.name in (SUBMIT_RESULT, SUBMIT_ERROR):
            ending = _submission(call)
            if isinstance(ending, str):
                results = (*results, _tool_error(call, ending))
                continue
            results = (*results, _submitted(call))
            return _after(tuple(effects), _stop_children(state, results, children, ending, changes))
        else:
            number = state.next_call  # issued with the phase: one copy of the state
            state = state.evolve(
                **(changes or {}),
                next_call=number + 1,
                phase=ToolExecuting(
                    current=call,
                    call=number,
                    remaining=queue,
                    results=results,
                    children=children,
                ),
            )
            return state, (*effects, _run_tool(state, number, call))
    if changes is not None:
        state = state.evolve(**changes)
    return _after(tuple(effects), _tools_done(state, results, children))


def _run_tool(state: Conversation, number: int, call: ToolCall) -> RunTool:
    """The effect that runs ``call`` as tool call ``number``, with how it must run.

    Both are decisions from the state's rules, so they are made here and carried on
    the effect: the runtime reads them and decides nothing (it cannot run a confined
    agent's bash unguarded by asking the wrong question, and replay derives the same
    effect). ``confined``: bash only through allow patterns, so git's configured
    programs are switched off. ``path_rules``: the rules a file tool's path must pass
    once the runtime has resolved its symbolic links (I/O the reducer cannot do).
    """
    permissions = state.permissions
    if permissions is None:  # no rules (a root, an unrestricted agent): nothing to carry
        return RunTool(number, call, state.cwd)
    return RunTool(
        number,
        call,
        state.cwd,
        confined=confines_commands(permissions),
        path_rules=path_rules(permissions, call, state.tools),
    )


def _refused_by_rules(state: Conversation, call: ToolCall) -> str | None:
    """Why the conversation's permissions refuse ``call`` (naming the rule), or None.
    Control tools are never refused: a sub-agent can always submit."""
    if state.permissions is None or call.name in CONTROL_TOOLS:
        return None
    # ``read-only`` stands for fanfold's reading tools and the tools whose recorded
    # specs say they are read-only: this conversation's, as the log holds them.
    why = refusal(state.permissions, call, state.cwd, reading_tools(state.tools))
    return None if why is None else f"{call.name} {why}"


def _not_offered(state: Conversation, name: str) -> str:
    if name == SPAWN_AGENTS and not can_spawn(state.depth, state.limits):
        return (
            f"spawn_agents is not available at depth {state.depth} "
            f"(max_depth is {state.limits.max_depth})"
        )
    offered = ", ".join(t.name for t in state.tools) or "none"
    return f"unknown or unavailable tool '{name}'; available tools: {offered}"


def _tools_done(
    state: Conversation,
    results: tuple[ToolResult, ...],
    children: Children,
) -> Transition:
    effects: Effects = ()
    if children.summary is None and any(_wants_summary(p) for p in children.pending):
        # Asked for only now, when the round's tools are done, so that a
        # conversation never has a model call and a tool in flight at once.
        state, children, effects = _ask_for_summary(state, children)
        if not effects:
            # None could be asked for: the children waiting for it end now.
            state, children, effects = _start_queued(state, children)
    if children.pending:
        state = state.evolve(phase=AwaitingSubAgents(children=children, results=results))
        return state, effects
    return _after(effects, _call_model(state, history=_round_history(state, results, children)))


def _on_tool_finished(state: Conversation, event: ToolFinished) -> Transition:
    phase = state.phase
    current = phase.call if isinstance(phase, ToolExecuting) else None
    if not _current_or_stale(state, event, event.call, current):
        return _absorb(state)
    assert isinstance(phase, ToolExecuting)
    if event.result.tool_call_id != phase.current.id:
        raise IllegalTransition(
            state,
            event,
            f"result is for tool call {event.result.tool_call_id!r}, "
            f"running is {phase.current.id!r}",
        )
    return _run_tools(state, phase.remaining, (*phase.results, event.result), phase.children)


# ------------------------------------------------------------------ spawning


def _spawn(
    state: Conversation, call: ToolCall, children: Children
) -> tuple[Conversation, Children, ToolResult | None, Effects]:
    """Accept the tasks of one spawn_agents call, and start what may start now.

    Returns a plain error result if nothing could be accepted; otherwise the call's
    result is the fan-in, built once all its children have finished.
    """
    try:
        args = call.arguments()
    except ValueError:
        return state, children, _tool_error(call, "invalid JSON arguments for spawn_agents"), ()
    tasks = args.get("tasks") if isinstance(args, dict) else None
    if not isinstance(tasks, list):
        return state, children, _tool_error(call, "spawn_agents needs a 'tasks' array"), ()
    if not tasks:
        return state, children, _tool_error(call, "spawn_agents needs at least one task"), ()
    mode = parse_mode(args, len(tasks))
    if isinstance(mode, str):
        return state, children, _tool_error(call, f"spawn_agents: {mode}"), ()
    limits = state.limits
    accepted: list[PendingChild] = []
    rejected: list[RejectedTask] = []
    spawned = state.spawned  # counted here, set once: one copy of the state, not one per task
    for index, entry in enumerate(tasks):
        text = entry.get("task", "") if isinstance(entry, dict) else ""
        text = text if isinstance(text, str) else json.dumps(text)
        if len(text) > MAX_TASK_CHARS:
            # Refused by parse_task; its fan-in entry names it by its start, not a
            # second copy of the whole (the call's arguments hold it once).
            text = f"{text[:200]}... [{len(text)} characters]"
        if index >= limits.max_tasks_per_call:
            rejected.append(
                RejectedTask(
                    call.id,
                    text,
                    f"not spawned: at most {limits.max_tasks_per_call} tasks per call",
                )
            )
            continue
        request = parse_task(entry, limits.context_modes)
        definition = None
        if not isinstance(request, str) and request.agent is not None:
            found = agent_for(state.agents, request.agent)
            request = found if isinstance(found, str) else request
            definition = None if isinstance(found, str) else found
        context = None if isinstance(request, str) else _context_mode(request, definition)
        if context not in (None, *limits.context_modes) and definition is not None:
            # A definition's mode the operator's limits leave out (a task's own was
            # checked by parse_task).
            request = (
                f"agent {definition.name!r} asks for context {context}; the limits offer "
                f"{one_of(limits.context_modes)}"
            )
        if isinstance(request, str):
            rejected.append(RejectedTask(call.id, text, f"not spawned: {request}"))
            continue
        timeout, max_rounds = capped_limits(definition, *_task_limits(request, limits))
        spawned += 1
        spec = ChildSpec(
            id=f"{state.id}.{spawned}",
            task=request.task,
            cwd=join_cwd(state.cwd, request.cwd),
            timeout=timeout,
            max_rounds=max_rounds,
            spawn_call_id=call.id,
            model=request.model or (definition and definition.model) or state.model,
            agent=request.agent,
            mode=mode,
            context=context,
        )
        accepted.append(PendingChild(spec))
    if not accepted:
        lines = "; ".join(f"{r.task!r}: {r.error}" for r in rejected)
        return state, children, _tool_error(call, f"no sub-agent was spawned: {lines}"), ()
    state = state.evolve(spawned=spawned)
    children = attrs.evolve(
        children,
        pending=(*children.pending, *accepted),
        rejected=(*children.rejected, *rejected),
    )
    state, children, started = _start_queued(state, children)
    return state, children, None, started


def _task_limits(request: TaskRequest, limits: Limits) -> tuple[float | None, int]:
    """The time limit and round limit of a child for ``request``.

    Every number a task may ask for is capped by the parent's limit: a task may ask for
    less time or fewer rounds than the operator allowed, never more.
    """
    timeout = request.timeout if request.timeout is not None else limits.child_timeout
    if timeout is not None and limits.child_timeout is not None:
        timeout = min(timeout, limits.child_timeout)
    max_rounds = limits.max_rounds
    if request.max_iterations is not None:
        max_rounds = min(request.max_iterations, max_rounds)
    return timeout, max_rounds


def _start_queued(
    state: Conversation, children: Children
) -> tuple[Conversation, Children, Effects]:
    """Start queued children, oldest first, while fewer than max_concurrent run; the
    effects start them (a deadline timer each, then the spawn).

    A child that cannot start (no token budget left, or no summary to give it) is
    finished failed instead, and its call's mode applies (a sequential call's later
    steps are not run, or, with ``keep_going``, are tried in turn): so a queued child
    never waits behind one that will never run.
    """
    all_effects: list[Effect] = []
    while True:
        state, children, effects, unable = _start_pass(state, children)
        all_effects += effects
        if not unable:
            return state, children, tuple(all_effects)
        for child_id, outcome in unable:
            if children.find_pending(child_id) is None:
                continue  # already finished by an earlier one's mode (not run)
            children = children.finish(child_id, outcome)
            state, children, ended = _settle_mode(state, children)
            all_effects += ended


def _start_pass(
    state: Conversation, children: Children
) -> tuple[Conversation, Children, Effects, list[tuple[str, ChildFailed]]]:
    """One pass of ``_start_queued``: the children started, and those that cannot
    start with the outcome each gets."""
    effects: list[Effect] = []
    running = children.running
    pending = children.pending
    # A token budget covers the whole tree below a conversation: each child starts
    # with a share of what is left (spent and set aside for running children
    # deducted), split with the children still queued and the parent itself, so the
    # shares can never add up to more than the budget, however many run at once.
    budget = state.limits.max_tokens
    if budget is not None:
        available = budget - state.tokens_spent - children.reserved
        unstarted = sum(1 for p in pending if not p.started)
    refused: list[str] = []
    unable: list[tuple[str, ChildFailed]] = []
    summary = children.summary
    next_call = state.next_call
    # Positions in the roster: starting a child replaces its entry alone, and the
    # scan stops once max_concurrent run (the children before the first queued one
    # are all started: a child outcome costs a scan of the running ones, not of all).
    for i, child in pending.positions():
        if running >= state.limits.max_concurrent:
            break
        if child.started or not may_start(child, pending):
            continue
        if _wants_summary(child):
            if summary is None or summary.in_flight is not None:
                continue  # its context is not made yet
            if summary.text is None:
                unable.append((child.spec.id, _without_summary(summary)))
                continue
        share = None
        if budget is not None:
            share = available // (unstarted + 1)
            if child.spec.agent is not None:
                share = capped_share(_agent_of(state, child.spec.agent), share)
            unstarted -= 1
            if share <= 0 or refused:
                # Oldest first: once one queued child cannot get a share, none of the
                # younger ones starts ahead of it.
                refused.append(child.spec.id)
                continue
            available -= share
        deadline = None
        if child.spec.timeout is not None:
            deadline, next_call = next_call, next_call + 1  # _issue's, set after the loop
            effects.append(
                StartTimer(
                    deadline,
                    child.spec.timeout + _backstop_grace(state),
                    f"deadline of {child.spec.id}",
                )
            )
        started = PendingChild(child.spec, started=True, deadline_timer=deadline, budget=share)
        children = children.started(i, started)
        effects.append(_spawn_effect(state, child.spec, share, children))
        running += 1
    if next_call != state.next_call:
        state = state.evolve(next_call=next_call)  # one copy for all the deadlines
    # Nothing left to give them: they never start (a child would spend tokens on its
    # first model call before it could notice).
    unable += [(child_id, _budget_used_up(budget)) for child_id in refused]
    unable.sort(key=lambda item: children.index_of(item[0]))  # oldest first
    return state, children, tuple(effects), unable


def _budget_used_up(budget: int | None) -> ChildFailed:
    return ChildFailed(
        f"not started: the token budget of {budget} is used up",
        ErrorKind.BUDGET_EXHAUSTED,
        CancelReason.LIMIT,
    )


def _backstop_grace(state: Conversation) -> float:
    """How long past a child's time limit its parent waits before writing it off.

    A child that hits its limit cancels its own children and may wait one cancel grace
    for them, and they for theirs: one grace per level that can exist below us.
    """
    levels = max(1, state.limits.max_depth - state.depth)
    return state.limits.cancel_grace * levels


def _spawn_effect(
    state: Conversation, spec: ChildSpec, budget: int | None, children: Children | None = None
) -> SpawnSubAgent:
    limits = with_max_rounds(state.limits, spec.max_rounds)
    if budget is not None:
        limits = attrs.evolve(limits, max_tokens=budget)
    # A sub-agent is told its role (the sub-agent prompt), not the root's; logs
    # before schema 6 have none, and their children inherit the parent's prompt.
    prompt = state.system_prompt if state.sub_agent_prompt is None else state.sub_agent_prompt
    tools = ordinary_tools(state.tools)
    setup = None
    if spec.agent is not None or state.agents:
        setup = child_setup(
            None if spec.agent is None else _agent_of(state, spec.agent),
            parent_permissions=state.permissions,
            parent_agents=state.agents,
            tools=tools,
            default_prompt=prompt,
            limits=limits,
            depth=state.depth + 1,
            cwd=spec.cwd,
        )
    return SpawnSubAgent(
        child_id=spec.id,
        parent_id=state.id,
        root_id=state.root_id,
        task=task_with_earlier(spec, children),
        cwd=spec.cwd,
        timeout=spec.timeout,
        max_rounds=spec.max_rounds,
        depth=state.depth + 1,
        limits=limits if setup is None else setup.limits,
        tools=tools if setup is None else setup.tools,
        system_prompt=prompt if setup is None else setup.system_prompt,
        model=spec.model,
        sub_agent_prompt=state.sub_agent_prompt,
        agents=() if setup is None else setup.agents,
        agent=spec.agent,
        permissions=state.permissions if setup is None else setup.permissions,
        context=_context_for(state, spec, children),
    )


def _context_for(
    state: Conversation, spec: ChildSpec, children: Children | None
) -> tuple[Message, ...]:
    """What a child is given before its task, by its context mode."""
    if spec.context == ContextMode.FULL:
        return parent_context(state.history)
    if spec.context == ContextMode.SUMMARY:
        # It starts only once the summary is made (_start_pass).
        summary = children.summary if children is not None else None
        assert summary is not None and summary.text is not None
        return summary_context(summary.text)
    return ()


def _context_mode(request: TaskRequest, definition: AgentDefinition | None) -> str | None:
    """A child's context mode: the task's, else its definition's; None: task_only."""
    mode = request.context
    if mode is None and definition is not None:
        mode = definition.context.value
    return None if mode in (None, ContextMode.TASK_ONLY) else mode


def _agent_of(state: Conversation, name: str) -> AgentDefinition:
    """The definition an accepted child names (it was found when it was accepted;
    the parent's catalogue never changes)."""
    found = agent_for(state.agents, name)
    assert not isinstance(found, str), found
    return found


# ------------------------------------------------------------------ summary context


def _wants_summary(child: PendingChild) -> bool:
    """A queued child of context mode ``summary``: it starts once the summary is made."""
    return not child.started and child.spec.context == ContextMode.SUMMARY


def _ask_for_summary(
    state: Conversation, children: Children
) -> tuple[Conversation, Children, Effects]:
    """Issue the round's summary call, unless the token budget has nothing left for
    it (a call made then would overshoot the budget): then there is no summary, and
    the children waiting for one end ``budget_exhausted`` as they come to start."""
    spent = _no_budget_for_summary(state, children)
    if spent is not None:
        return state, attrs.evolve(children, summary=spent), ()
    state, call = _issue(state)
    return state, attrs.evolve(children, summary=Summary(call=call)), (CallModel(call, 1),)


def _no_budget_for_summary(state: Conversation, children: Children) -> Summary | None:
    """The summary that cannot be made when the token budget has nothing left for a
    summary call (or its next attempt), else None."""
    budget = state.limits.max_tokens
    if budget is not None and budget - state.tokens_spent - children.reserved <= 0:
        return Summary(
            error=f"the token budget of {budget} is used up", kind=ErrorKind.BUDGET_EXHAUSTED
        )
    return None


def _without_summary(summary: Summary) -> ChildFailed:
    """The outcome of a child whose summary could not be made: it never started."""
    kind = summary.kind or ErrorKind.PROVIDER_FAILURE
    reason = CancelReason.LIMIT if kind is ErrorKind.BUDGET_EXHAUSTED else None
    return ChildFailed(
        f"not started: no summary of its parent's conversation: {summary.error}", kind, reason
    )


def _on_summary_result(
    state: Conversation, summary: Summary, event: ModelReplied | ModelFailed
) -> Transition:
    """The summary call answered: its tokens count as the parent's (not as a round);
    a text starts the children waiting for it; a refusal, an empty text or a failure
    that is not retried (or is out of attempts) ends them failed, never started."""
    phase = state.phase
    assert isinstance(phase, AwaitingSubAgents) and summary.call is not None
    if isinstance(event, ModelReplied):
        reply = event.reply
        state = _count_usage(state, reply.usage)
        if reply.stop_reason == STOP_REFUSAL:
            explanation = reply.stop_details or reply.text or "(no explanation given)"
            made = Summary(
                error=f"the model refused to summarise: {explanation}", kind=ErrorKind.REFUSED
            )
        elif not reply.text.strip():
            made = Summary(
                error="the summary call returned no text", kind=ErrorKind.MALFORMED_RESPONSE
            )
        elif reply.stop_reason == STOP_MAX_TOKENS:
            # Cut off at the output token limit: kept, and the children told so.
            made = Summary(text=reply.text + SUMMARY_CUT)
        else:
            made = Summary(text=reply.text)
        return _summary_settled(state, phase, made)
    error = _finite_hint(event.error)
    state = _count_usage(state, error.usage)
    # A billed failure may have spent the budget: then no further attempt (each
    # would overshoot it more), as with the conversation's own calls.
    spent = _no_budget_for_summary(state, phase.children) if error.usage.total else None
    if spent is not None:
        return _summary_settled(state, phase, spent)
    if error.kind.retryable and summary.attempt < state.limits.max_attempts:
        state, timer = _issue(state)
        attempt = summary.attempt + 1
        delay = _backoff(state, attempt, error, timer)
        # (Its kind says why it waits: the views show it, as for the parent's calls.)
        retry = Summary(attempt=attempt, timer=timer, delay=delay, kind=error.kind)
        state = _with_children(state, attrs.evolve(phase.children, summary=retry))
        return state, (ScheduleRetry(timer, delay, attempt),)
    why = "retries exhausted" if error.kind.retryable else "not retryable"
    made = Summary(
        error=f"the summary call failed ({error.kind}, {why} after {summary.attempt} "
        f"attempt(s)): {error.message}",
        kind=error.kind,
    )
    return _summary_settled(state, phase, made)


def _summary_settled(state: Conversation, phase: AwaitingSubAgents, made: Summary) -> Transition:
    """Start (or fail) the children waiting for the summary; the last one ends the round."""
    children = attrs.evolve(phase.children, summary=made)
    state, children, started = _start_queued(state, children)
    return _after(started, _round_goes_on(state, phase, children))


def _retry_summary(state: Conversation, summary: Summary) -> Transition:
    """The summary's retry timer fired: its next attempt, as a new call, unless the
    budget was spent meanwhile (by a sibling's tokens): then there is no summary."""
    phase = state.phase
    assert isinstance(phase, AwaitingSubAgents)
    children = phase.children
    spent = _no_budget_for_summary(state, children)
    if spent is not None:
        return _summary_settled(state, phase, spent)
    state, call = _issue(state)
    retry = Summary(call=call, attempt=summary.attempt)
    return _with_children(state, attrs.evolve(children, summary=retry)), (
        CallModel(call, summary.attempt),
    )


def _summary_stopped(children: Children) -> tuple[Children, Effects]:
    """The round stops needing its summary (it ends, or is cancelled): the call or
    retry timer in flight, if any, is aborted, and no longer awaited."""
    summary = children.summary
    if summary is None or summary.in_flight is None:
        return children, ()
    stopped = Summary(
        attempt=summary.attempt, error="not needed any more", kind=ErrorKind.CANCELLED
    )
    return attrs.evolve(children, summary=stopped), (AbortCall(summary.in_flight),)


# ------------------------------------------------------------------ fan-in


def _with_children(
    state: Conversation, children: Children, changes: dict[str, Any] | None = None
) -> Conversation:
    """``state`` with ``children`` in its phase (and ``changes`` not made yet: a child
    outcome's tokens, see ``_on_child_finished``), in one copy."""
    phase = state.phase
    assert isinstance(phase, ToolExecuting | AwaitingSubAgents | CancellingSubAgents)
    if type(phase) is AwaitingSubAgents:
        # Every child outcome but the last: its two fields (tests/test_sm_state_copy.py
        # holds the class to them), not attrs.evolve's generic copy.
        changed: Phase = AwaitingSubAgents(children, phase.results)
    else:
        changed = attrs.evolve(phase, children=children)
    if changes is None:
        return state.evolve(phase=changed)
    return state.evolve(**changes, phase=changed)


def _on_child_finished(state: Conversation, event: SubAgentFinished) -> Transition:
    if event.child_id in state.written_off:
        return _absorb(state)
    children = state.children
    if children is None:
        raise UnknownChild(
            state,
            event,
            f"SubAgentFinished for unknown agent {event.child_id!r}: no children are pending",
        )
    index = children.index_of(event.child_id)
    if index < 0:
        if children.is_finished(event.child_id):
            raise DuplicateChildOutcome(
                state, event, f"outcome of agent {event.child_id!r} was already accepted"
            )
        raise UnknownChild(state, event, f"SubAgentFinished for unknown agent {event.child_id!r}")
    pending = children.pending.at(index)
    if not pending.started:
        raise IllegalTransition(
            state, event, f"agent {event.child_id!r} is queued and has not started"
        )
    abort: Effects = ()
    if pending.deadline_timer is not None:
        abort = (AbortCall(pending.deadline_timer),)
    # The tokens it reports are counted in the copy that records its outcome, not in
    # one of their own (every outcome of a real model's child carries some).
    changes = None
    if event.outcome.tokens:
        changes = {"usage_children": state.usage_children + event.outcome.tokens}
    return _after(abort, _child_settled(state, children.finish_at(index, event.outcome), changes))


def _settle_mode(state: Conversation, children: Children) -> tuple[Conversation, Children, Effects]:
    """What the mode of the finished child's call makes of its siblings (modes.settle):
    running ones it ends are written off, charged their shares and told to cancel."""
    settled = settle(children)
    if not settled.cancel:
        return state, settled.children, ()
    state = state.evolve(
        written_off=(*state.written_off, *settled.cancel),
        usage_children=state.usage_children + settled.charged,
    )
    effects: Effects = (
        *(AbortCall(timer) for timer in settled.deadline_timers),
        CancelSubAgents(settled.cancel, CancelReason.PARENT),
    )
    return state, settled.children, effects


def _child_settled(
    state: Conversation, children: Children, changes: dict[str, Any] | None = None
) -> Transition:
    """A child got its outcome: start queued ones, and finish the wait when none remain.

    ``changes``: the outcome's changes to the state not made yet (its tokens), made
    with the next phase in one copy on the common paths, first on the others."""
    phase = state.phase
    if isinstance(phase, CancellingSubAgents):
        if children.pending:
            return _with_children(state, children, changes), ()
        history = _round_history(state, phase.results, children)
        ending = _apply_ending(state, phase.ending, history, changes)
        return _after((AbortCall(phase.grace_timer),), ending)
    if changes is not None and (
        children.finished[-1].spec.mode is not None
        or len(children.pending) >= state.limits.max_concurrent
        or not isinstance(phase, AwaitingSubAgents)
        or children.summary is not None
    ):
        # A path that may read or change the state on the way (a mode's write-offs,
        # queued children's shares of the budget, a summary, a round's other tools):
        # the changes first. Without a mode, settling changes nothing.
        state, changes = state.evolve(**changes), None
    # The call's mode may end its other children (sequential failure, race quorum).
    state, children, ended = _settle_mode(state, children)
    # Queued children exist only while max_concurrent children run, so after one
    # finished there are at least max_concurrent pending ones; fewer means none is
    # queued and the scan in _start_queued can be skipped (it is O(pending)); a
    # sequential call queues its next step behind the one that just finished.
    started: Effects = ()
    if len(children.pending) >= state.limits.max_concurrent or (
        children.finished and children.finished[-1].spec.mode is not None
    ):
        state, children, started = _start_queued(state, children)
    started = (*ended, *started)
    if isinstance(phase, AwaitingSubAgents):
        return _after(started, _round_goes_on(state, phase, children, changes))
    return _with_children(state, children), started


def _round_goes_on(
    state: Conversation,
    phase: AwaitingSubAgents,
    children: Children,
    changes: dict[str, Any] | None = None,
) -> Transition:
    """Go on waiting for ``children``; once none is pending, the fan-in results and
    the next model call. A summary still in flight once no child waits for it (the
    round ends, or a race cancelled its children) is no longer needed: aborted."""
    if children.pending:
        summary = children.summary
        if (
            summary is not None
            and summary.in_flight is not None
            and not any(_wants_summary(p) for p in children.pending)
        ):
            children, aborted = _summary_stopped(children)
            return _with_children(state, children, changes), aborted
        return _with_children(state, children, changes), ()
    children, aborted = _summary_stopped(children)
    history = _round_history(state, phase.results, children)
    return _after(aborted, _call_model(state, history=history, changes=changes))


# ------------------------------------------------------------------ timers


def _on_timer(state: Conversation, event: TimerFired) -> Transition:
    timer = event.timer
    phase = state.phase
    if timer == state.deadline_timer:
        return _on_cancel(state, CancelRequested(CancelReason.TIMEOUT))
    if isinstance(phase, AwaitingRetry) and timer == phase.timer:
        return _call_model(state, attempt=phase.next_attempt, grace=phase.grace)
    if isinstance(phase, CancellingSubAgents) and timer == phase.grace_timer:
        return _give_up_on_children(state, phase)
    children = state.children
    if children is not None and children.summary is not None and timer == children.summary.timer:
        return _retry_summary(state, children.summary)
    if children is not None:
        for pending in children.pending:
            if pending.deadline_timer == timer:
                return _child_deadline(state, children, pending)
    _current_or_stale(state, event, timer, None)
    return _absorb(state)


def _child_deadline(state: Conversation, children: Children, pending: PendingChild) -> Transition:
    """A child outlived its time limit plus grace without reporting: write it off."""
    child = pending.spec.id
    outcome = ChildFailed(
        f"did not report within its time limit of {pending.spec.timeout}s "
        f"(+{_backstop_grace(state)}s grace)",
        ErrorKind.TIMED_OUT,
        CancelReason.TIMEOUT,
    )
    # It never reported what it used: it is charged all it was given.
    state = state.evolve(
        written_off=(*state.written_off, child),
        usage_children=state.usage_children + (pending.budget or 0),
    )
    cancel = CancelSubAgents((child,), CancelReason.TIMEOUT)
    return _after((cancel,), _child_settled(state, children.finish(child, outcome)))


def _give_up_on_children(state: Conversation, phase: CancellingSubAgents) -> Transition:
    """The cancel grace ran out: record every silent child as unresponsive and end."""
    children = phase.children
    for pending in phase.children.pending:
        children = children.finish(
            pending.spec.id,
            ChildFailed(
                f"did not acknowledge cancellation within {state.limits.cancel_grace}s",
                ErrorKind.UNRESPONSIVE,
                CancelReason.PARENT,
            ),
        )
    state = state.evolve(
        written_off=(*state.written_off, *phase.children.pending_ids()),
        usage_children=state.usage_children + phase.children.reserved,
    )
    state = _append_round_results(state, phase.results, children)
    return _apply_ending(state, phase.ending)


# ------------------------------------------------------------------ cancel


def _on_cancel(state: Conversation, event: CancelRequested) -> Transition:
    ending = _cancel_ending(state, event.reason)
    match state.phase:
        case Idle() | Error() | CancellingSubAgents():
            return _absorb(state)
        case LlmRequesting(call=call):
            return _after((AbortCall(call),), _apply_ending(state, ending))
        case AwaitingRetry(timer=timer):
            return _after((AbortCall(timer),), _apply_ending(state, ending))
        case ToolExecuting(
            current=current, call=call, remaining=remaining, results=results, children=children
        ):
            stopped = (
                _tool_error(current, CANCELLED_RESULT),
                *(_tool_error(c, SKIPPED_RESULT) for c in remaining),
            )
            stopping = _stop_children(state, (*results, *stopped), children, ending)
            return _after((AbortCall(call),), stopping)
        case AwaitingSubAgents(children=children, results=results):
            return _stop_children(state, results, children, ending)
    raise IllegalTransition(state, event, "no rule")  # pragma: no cover - phases exhausted


# ------------------------------------------------------------------ restart


def _resume_prelude(state: Conversation) -> list[Effect]:
    """What a restart re-issues whatever the phase: the conversation's own time limit
    and its round's started children."""
    effects: list[Effect] = []
    if state.deadline_timer is not None and state.timeout is not None:
        effects.append(
            StartTimer(state.deadline_timer, state.timeout, "time limit", counts_downtime=True)
        )
    children = state.children
    if children is not None:
        for pending in children.pending:
            if pending.started:
                effects.append(_spawn_effect(state, pending.spec, pending.budget, children))
                if pending.deadline_timer is not None and pending.spec.timeout is not None:
                    effects.append(
                        StartTimer(
                            pending.deadline_timer,
                            pending.spec.timeout + _backstop_grace(state),
                            f"deadline of {pending.spec.id}",
                        )
                    )
    return effects


def _on_resume(state: Conversation, event: RuntimeResumed) -> Transition:
    """Re-issue whatever was in flight when the runtime stopped."""
    effects = _resume_prelude(state)
    match state.phase:
        case Idle() | Error():
            return state, tuple(effects)
        case LlmRequesting(call=call, attempt=attempt):
            effects.append(CallModel(call, attempt))
            return state, tuple(effects)
        case AwaitingRetry(timer=timer, next_attempt=attempt, last_error=error):
            effects.append(ScheduleRetry(timer, _backoff(state, attempt, error, timer), attempt))
            return state, tuple(effects)
        case ToolExecuting(current=current, call=call) if current.name in event.idempotent_tools:
            # The tool says a second call is harmless: run it again, same call number.
            effects.append(_run_tool(state, call, current))
            return state, tuple(effects)
        case ToolExecuting(
            current=current, remaining=remaining, results=results, children=children
        ):
            result = _tool_error(
                current, FORKED_TOOL_RESULT if event.forked else INTERRUPTED_RESULT
            )
            then = _run_tools(state, remaining, (*results, result), children)
            return _after(_still_armed(effects, then[0]), then)
        case AwaitingSubAgents(children=Children(summary=Summary() as summary)):
            if summary.call is not None:
                effects.append(CallModel(summary.call, summary.attempt))
            elif summary.timer is not None and summary.delay is not None:
                effects.append(ScheduleRetry(summary.timer, summary.delay, summary.attempt))
            return state, tuple(effects)
        case AwaitingSubAgents():
            return state, tuple(effects)
        case CancellingSubAgents(children=children, grace_timer=grace):
            effects.append(CancelSubAgents(children.pending_ids(), CancelReason.PARENT))
            effects.append(StartTimer(grace, state.limits.cancel_grace, "cancel acknowledgement"))
            return state, tuple(effects)
    raise IllegalTransition(state, event, "no rule")  # pragma: no cover - phases exhausted


# ------------------------------------------------------------------ tool list changes


def _on_tools_changed(state: Conversation, event: ToolsChanged) -> Transition:
    """An MCP server's tools changed: its tools among the conversation's ordinary tools
    are replaced by the new ones its permissions leave (first of each name), the
    control tools recomputed as ``start`` computes them. Nothing runs: the next model
    call offers the new set, a request in flight keeps the one it was sent with."""
    server = event.server
    kept = tuple(
        t for t in state.tools if t.name not in CONTROL_TOOLS and mcp_server_of(t.name) != server
    )
    names = {t.name for t in kept}
    new: list[ToolSpec] = []
    for spec in event.tools:
        if mcp_server_of(spec.name) == server and spec.name not in names:
            names.add(spec.name)
            new.append(spec)
    ordinary = permitted_tools((*kept, *new), state.permissions)
    tools = offered_tools(
        ordinary,
        depth=state.depth,
        is_sub_agent=state.is_sub_agent,
        limits=state.limits,
        agents=state.agents,
    )
    if tools == state.tools:
        return _absorb(state)
    return state.evolve(tools=tools), ()


# ------------------------------------------------------------------ fork edits

# An edit is delivered as a fork's conversation first goes on: what it re-issues is
# re-issued as for a fork, not a restart (a running tool's result says so).
_FIRST_GOING_ON = RuntimeResumed(forked=True)


def _on_fork_edit(state: Conversation, event: ForkEdited) -> Transition:
    """A forked conversation goes on with the user's edit in place of what was in
    flight: a restart (``_on_resume``) and the edit in one step, so that what the edit
    starts (a tool of an edited reply) runs live and is never taken for work a crash
    interrupted. The ids and numbers are the fork's own; only the edit is new."""
    edit, phase = event.edit, state.phase
    # An edit built from Python (``Runtime.fork``, ``fork_at``) is not typed at run
    # time: a task or prompt that is not a text would become the state's and fail
    # only when the log encodes it (or later, in a provider).
    text = getattr(edit, "task", getattr(edit, "system_prompt", ""))
    if not isinstance(text, str):
        field = "task" if isinstance(edit, TaskEdit) else "system_prompt"
        raise IllegalTransition(
            state,
            event,
            f"{type(edit).__name__}'s {field} must be a text, not {type(text).__name__}",
        )
    match edit, phase:
        case SystemPromptEdit(system_prompt=text), _:
            # From the next model call on; one in flight is issued again with it.
            return _on_resume(state.evolve(system_prompt=text), _FIRST_GOING_ON)
        case LimitsEdit(limits=limits), _:
            problem = limits_edit_problem(state, limits)
            if problem is not None:
                raise IllegalTransition(state, event, problem)
            # From now on; what is in flight is issued again under them.
            return _on_resume(state.evolve(limits=limits), _FIRST_GOING_ON)
        case TaskEdit(task=task), LlmRequesting() | AwaitingRetry() if (
            state.is_sub_agent
            and state.rounds <= 1
            and state.history[-1:] == (UserMessage(state.task or ""),)
        ):
            # Its task is the last message it was given and no reply came yet.
            if not task:
                raise IllegalTransition(state, event, "a sub-agent needs a task")
            history = (*state.history[:-1], UserMessage(task))
            return _on_resume(state.evolve(task=task, history=history), _FIRST_GOING_ON)
        case ReplyEdit(reply=reply), LlmRequesting(call=call):
            return _edited(state, _on_model_result(state, ModelReplied(call, reply)))
        case ToolResultEdit(result=result), ToolExecuting(current=current, call=call):
            if result.tool_call_id != current.id:
                raise IllegalTransition(
                    state,
                    event,
                    f"the running tool call is {current.id!r}, not {result.tool_call_id!r}",
                )
            result = attrs.evolve(result, name=current.name)
            return _edited(state, _on_tool_finished(state, ToolFinished(call, result)))
    legal = {
        "ReplyEdit": "LlmRequesting (a model call awaited)",
        "ToolResultEdit": "ToolExecuting (a tool call running)",
        "TaskEdit": "a sub-agent's LlmRequesting or AwaitingRetry before its first reply",
        "SystemPromptEdit": "any phase but Completed and Failed",
        "LimitsEdit": "any phase but Completed and Failed",
    }
    raise IllegalTransition(
        state,
        event,
        f"{type(edit).__name__} is legal in {legal[type(edit).__name__]}, not in "
        f"{type(phase).__name__}",
    )


def limits_edit_problem(state: Conversation, limits: Limits) -> str | None:
    """Why ``limits`` cannot replace ``state``'s limits where it is (None: they can).

    New limits apply from now on, so they must admit what has already happened: the
    rounds taken, the attempt in flight or awaited, a summary retry's recorded delay,
    the children running now, and a round's token shares (cut from the old budget).
    Anything else they change takes effect at the next round, retry, spawn or fan-in.
    """
    old, phase = state.limits, state.phase
    if can_spawn(state.depth, limits) != can_spawn(state.depth, old):
        # Whether spawn_agents is among its tools was settled at its creation.
        return (
            f"max_depth {limits.max_depth} would change whether it may spawn sub-agents at "
            f"depth {state.depth} (its tools are fixed; max_depth is {old.max_depth})"
        )
    if limits.max_rounds < state.rounds:
        return f"max_rounds {limits.max_rounds} is below the {state.rounds} rounds it has taken"
    grace = isinstance(phase, LlmRequesting | AwaitingRetry) and phase.grace
    if grace and limits.max_rounds != old.max_rounds:
        # The grace round is the one past max_rounds: its meaning would change under it.
        return f"max_rounds cannot change in the grace round (it is {old.max_rounds})"
    attempts = []
    if isinstance(phase, LlmRequesting):
        attempts.append(phase.attempt)
    if isinstance(phase, AwaitingRetry):
        attempts.append(phase.next_attempt)
    children = state.children
    summary = children.summary if children is not None else None
    if summary is not None and summary.in_flight is not None:
        attempts.append(summary.attempt)
    if attempts and limits.max_attempts < max(attempts):
        return (
            f"max_attempts {limits.max_attempts} is below the attempt in flight ({max(attempts)})"
        )
    waits = summary.delay if summary is not None and summary.timer is not None else None
    if waits is not None and waits > limits.retry_cap:
        return (
            f"retry_cap {limits.retry_cap:g} is below the summary retry's recorded "
            f"delay ({waits:g}s)"
        )
    if _round_spawned(state):
        # This round's spawn_agents calls were answered under the old limits (each
        # child's rounds, time limit, token share; the tasks accepted): they stay
        # until the round ends, at its fan-in.
        changed = [name for name in _SPAWN_LIMITS if getattr(limits, name) != getattr(old, name)]
        if changed:
            return (
                f"{', '.join(changed)} cannot change while this round's spawn_agents "
                "calls stand (edit a step before or after the round)"
            )
    if children is not None and children.pending:
        if limits.max_concurrent < children.running:
            return (
                f"max_concurrent {limits.max_concurrent} is below the {children.running} "
                "children running"
            )
        if any(not p.started for p in children.pending) and (
            limits.max_concurrent != old.max_concurrent
        ):
            # Queued children start as slots free up under the limit they queued for.
            return "max_concurrent cannot change while a round has children queued"
    return None


_SPAWN_LIMITS = (
    "max_rounds",
    "max_tasks_per_call",
    "max_depth",
    "child_timeout",
    "max_tokens",
    "context_modes",
)
"""The limits a ``spawn_agents`` call is answered under."""


def _round_spawned(state: Conversation) -> bool:
    """Whether ``state`` is in a tool round whose reply called ``spawn_agents``."""
    if not isinstance(state.phase, ToolExecuting | AwaitingSubAgents | CancellingSubAgents):
        return False
    for message in reversed(state.history):
        if isinstance(message, AssistantMessage):
            return any(call.name == SPAWN_AGENTS for call in message.tool_calls)
    return False  # pragma: no cover - a tool round follows a reply


def _edited(before: Conversation, edited: Transition) -> Transition:
    """The edit's step, after what a restart re-issues of ``before`` (its time limit,
    its round's children), unless the edit ended it."""
    after, effects = edited
    if after.is_terminal:
        return after, effects
    return after, (*_still_armed(_resume_prelude(before), after), *effects)


def _still_armed(prelude: list[Effect], after: Conversation) -> tuple[Effect, ...]:
    """``prelude`` (what a restart re-issues) without the timers that the same step
    disarmed: a child's deadline once the step went on to cancel that child (a
    ``submit_result`` after an interrupted tool), which ``after`` no longer holds."""
    children = after.children
    armed = {after.deadline_timer}
    if children is not None:
        armed.update(p.deadline_timer for p in children.pending)
    return tuple(e for e in prelude if not (isinstance(e, StartTimer) and e.timer not in armed))


# The rule of each event class (see transition), by name: looked up in the module
# at each call, so that a rule replaced in the module (the mutation tests do) is the
# one that runs.
_HANDLERS: dict[type, str] = {
    UserMessaged: "_on_user_message",
    ModelReplied: "_on_model_result",
    ModelFailed: "_on_model_result",
    ToolFinished: "_on_tool_finished",
    SubAgentFinished: "_on_child_finished",
    TimerFired: "_on_timer",
    CancelRequested: "_on_cancel",
    RuntimeResumed: "_on_resume",
    ForkEdited: "_on_fork_edit",
    ToolsChanged: "_on_tools_changed",
}
_RULES = globals()


def fold(
    created: ConversationCreated | ConversationForked, events: list[Event] | tuple[Event, ...]
) -> Conversation:
    """The state after ``created`` and then ``events`` (effects discarded)."""
    state, _ = start(created)
    for event in events:
        state, _ = transition(state, event)
    return state
