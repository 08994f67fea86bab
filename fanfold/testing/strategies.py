"""Hypothesis strategies that generate what fanfold's reducer (or a user's rule) can be
fed: limits, creations, model replies and errors, plausible, stale and late events,
whole traces (``event_sequences``) and the states they reach (``conversations``).

Generation reads its choices from ``_Dice`` and builds values in plain Python; every
strategy that runs a reducer takes it as ``transition=`` and draws only events it
accepts (``refused_draws`` counts the others; ``NothingAccepted`` when it accepts none).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import attrs
from hypothesis import event as _record_event
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from fanfold.statemachine import (
    CONTROL_TOOLS,
    SPAWN_AGENTS,
    STOP_MAX_TOKENS,
    STOP_REFUSAL,
    SUBMIT_ERROR,
    SUBMIT_RESULT,
    ApprovalDenied,
    ApprovalGranted,
    Asking,
    AwaitingRetry,
    AwaitingSubAgents,
    CancellingSubAgents,
    CancelReason,
    CancelRequested,
    ChildFailed,
    ChildOutcome,
    ChildSucceeded,
    Conversation,
    ConversationCreated,
    Effect,
    Error,
    ErrorKind,
    Event,
    Idle,
    IllegalTransition,
    Limits,
    LlmRequesting,
    ModelError,
    ModelFailed,
    ModelReplied,
    ModelReply,
    RuntimeResumed,
    SubAgentFinished,
    TimerFired,
    ToolCall,
    ToolExecuting,
    ToolFinished,
    ToolResult,
    ToolSpec,
    Usage,
    UserAnswered,
    UserMessaged,
    WorkingDirectory,
    canonical_json,
    start,
)
from fanfold.statemachine import transition as _fanfold_transition
from fanfold.statemachine.approvals import ASK_USER_SPEC
from fanfold.statemachine.children import Summary
from fanfold.statemachine.limits import CONTEXT_MODES

__all__ = [
    "ORDINARY_TOOLS",
    "NothingAccepted",
    "Reducer",
    "Step",
    "Trace",
    "child_outcomes",
    "conversation_created",
    "conversations",
    "each_plausible_event",
    "event_sequences",
    "has_stale_events",
    "limits",
    "live_numbers",
    "model_errors",
    "model_replies",
    "plausible_events",
    "refused_draws",
    "stale_events",
    "terminal_conversations",
]
Effects = tuple[Effect, ...]
Step = tuple[Conversation, Event, Conversation, Effects]
"""One accepted step: ``(before, event, after, effects)``."""

ORDINARY_TOOLS = (
    ToolSpec.from_schema("bash", "Run a shell command", {"type": "object"}),
    ToolSpec.from_schema("read_file", "Read a file", {"type": "object"}),
    ToolSpec.from_schema("think", "Think out loud", {"type": "object"}),
)
"""Ordinary tools the generated conversations are offered (the runtime's tool set)."""

ASKING_TOOLS = (
    ToolSpec.from_schema("deploy", "Ship it", {"type": "object"}, needs_approval=True),
    ASK_USER_SPEC,
)
"""Issue 35: a tool every call of which waits for a person, and the question tool,
offered to the conversations generated with ``asking=True`` (half of them with an
approval timeout). Not by default: the draws of every other generated conversation
stay what they were, so the hard states are reached as often as before."""

_TEXTS = (
    "done",
    "",
    " ",
    "ok",
    "a longer answer, long enough to be cut by a small child_result_cap",
    'résumé ✓ "quoted" {"json": [1]}\n',
    "\x00\t\U0001f600",
)
_RETRYABLE = tuple(k for k in ErrorKind if k.retryable)


# =========================================================================== strategies
#
# Generation reads its choices from ``_Dice`` and builds values in plain Python: a
# strategy per choice (or per step) costs more than the reducer step it feeds, and
# these strategies run loops of dozens of steps. Every choice shrinks towards its
# first option, which is always the most ordinary one.

_T = TypeVar("_T")
_CHUNK = st.binary(min_size=16, max_size=16)
_USAGES = (Usage(10, 5), Usage(0, 0), Usage(40, 20), Usage(100, 60), Usage(1, 1))
# What a provider may report of a failed model call; the other kinds are endings the
# reducer decides (cancelled, timed out, budget, ...), each with its cancel reason.
_MODEL_KINDS = tuple(
    k
    for k in ErrorKind
    if k
    not in (
        ErrorKind.SUBMITTED_ERROR,
        ErrorKind.REFUSED,
        ErrorKind.CANCELLED,
        ErrorKind.TIMED_OUT,
        ErrorKind.ITERATION_LIMIT,
        ErrorKind.BUDGET_EXHAUSTED,
        ErrorKind.UNRESPONSIVE,
        ErrorKind.INTERRUPTED,
        ErrorKind.INVALID_CWD,
    )
)
_ERROR_KINDS = (*_RETRYABLE, *_RETRYABLE, *_MODEL_KINDS)
_REASONS = tuple(CancelReason)
_ALL_KINDS = tuple(ErrorKind)
_TASK_EXTRAS: tuple[dict[str, Any], ...] = (
    {},
    {},
    {"cwd": "sub"},
    {"cwd": "./a//b/"},
    {"timeout": 2},
    {"timeout": 0.5, "max_iterations": 2},
    {"max_iterations": 1},
    {"timeout": 1e9, "model": "big", "max_iterations": 1000},
    # Boundaries that are accepted: the least time above 0, null for an absent field.
    {"timeout": 1e-06, "cwd": "."},
    {"timeout": None, "max_iterations": None, "model": None, "cwd": None},
    # Context modes: the parent's conversation, or a summary of it (one model call).
    {"context": "full"},
    {"context": "summary"},
    {"context": "summary", "timeout": 2},
    {"context": "task_only"},
)
# Execution modes of a spawn_agents call (most calls parallel, the default).
_CALL_MODES: tuple[dict[str, Any], ...] = (
    {},
    {},
    {},
    {"mode": "sequential"},
    {"mode": "sequential", "keep_going": True},
    {"mode": "race"},
    {"quorum": 1},
)
_BAD_TASKS: tuple[Any, ...] = (
    "just a string",
    {},
    {"task": ""},
    {"task": "x", "colour": "red"},
    {"task": "x", "timeout": -1},
    {"task": "x", "max_iterations": 0},
    {"task": 5},
    {"task": "x", "timeout": math.nan},
    {"task": "x", "cwd": "../outside"},
    {"task": "x", "cwd": "/"},
    # The boundaries just outside, and fields of the wrong type (``true`` is no number).
    {"task": " "},
    {"task": "x", "timeout": 0},
    {"task": "x", "timeout": "2"},
    {"task": "x", "timeout": True},
    {"task": "x", "max_iterations": 1.5},
    {"task": "x", "max_iterations": True},
    {"task": "x", "max_iterations": "3"},
    {"task": "x", "model": ""},
    {"task": "x", "model": 7},
    {"task": "x", "cwd": 5},
    {"task": "x", "cwd": "~/x"},
    {"task": "x", "cwd": "C:/x"},
    {"task": "x", "cwd": "a\\b"},
    {"task": "x", "cwd": "a/../.."},
    {"task": ["x"]},
)
# What the runtime may find at a sub-agent's working directory "/work" (a parent's
# "/work" too): mostly fine, now and then outside (a symbolic link) or not a directory.
_WORKDIRS = (
    None,
    WorkingDirectory("/work", "/work", "/work", True),
    None,
    WorkingDirectory("/work", "/work", "/work", True),
    WorkingDirectory("/srv/other", "/work", "/work", True),
    WorkingDirectory("/work/x", "/work/y", "/work", True),
    WorkingDirectory("/work/file", "/work", "/work", False),
)
_BAD_SPAWNS = (
    "not json",
    "[]",
    '{"tasks":"x"}',
    '{"tasks":[]}',
    "{}",
    '{"tasks":[{"task":"x","timeout":1e999}]}',
    '{"tasks":[{"task":"x","max_iterations":-Infinity}]}',
)
# Arguments of ordinary tools; Python's JSON reader takes NaN, Infinity and 1e999 (read
# as infinity), so a provider may pass them on: the reducer must refuse those calls.
_TOOL_ARGUMENTS = (
    '{"command":"ls"}',
    '{"command":"ls"}',
    '{"command":"ls"}',
    '{"command":"ls","timeout":NaN}',
    '{"command":"ls","deep":[{"x":[1e999]}]}',
)
_QUESTIONS = (
    '{"question":"which one?","choices":["a","b"]}',
    '{"question":"why?"}',
    '{"question":3}',  # not a question: an error result, never asked
)


class _Dice:
    """The choices of one example, read one byte at a time from 16-byte draws.

    A Hypothesis draw costs about as much as a reducer step, so choices are batched.
    Each choice reads exactly one byte, and byte 0 always means the first (most
    ordinary) option, so shrinking a byte simplifies one choice.
    """

    def __init__(self, draw: Callable[[st.SearchStrategy[bytes]], bytes]) -> None:
        self._draw = draw
        self._bytes = b""
        self._at = 0

    def byte(self) -> int:
        if self._at >= len(self._bytes):
            self._bytes = self._draw(_CHUNK)
            self._at = 0
        self._at += 1
        return self._bytes[self._at - 1]

    def pick(self, options: Sequence[_T]) -> _T:
        """One of ``options`` (more than 256 of them take more than one byte)."""
        count = len(options)
        if count == 1:
            return options[0]
        value, scale = self.byte(), 256
        while scale < count:
            value, scale = value * 256 + self.byte(), scale * 256
        return options[value % count]

    def one_in(self, n: int) -> bool:
        """True about once in ``n`` choices."""
        return self.byte() % n == n - 1

    def flip(self) -> bool:
        return self.byte() % 2 == 1

    def text(self) -> str:
        return self.pick(_TEXTS)


def _limits(dice: _Dice) -> Limits:
    return Limits(
        max_rounds=dice.pick(range(1, 5)),
        max_attempts=dice.pick(range(1, 5)),
        retry_base=dice.pick([1.0, 0.5, 2.0]),
        retry_cap=dice.pick([60.0, 1.0, 3.0]),
        max_concurrent=dice.pick(range(1, 4)),
        max_tasks_per_call=dice.pick(range(1, 5)),
        max_depth=dice.pick([1, 2, 0, 3]),
        child_timeout=dice.pick([None, 5.0, 60.0, 1.0]),
        cancel_grace=dice.pick([30.0, 1.0]),
        child_result_cap=dice.pick([8000, 5, 40]),
        max_tokens=dice.pick([None, 150, None, 400]),
        # Now and then the modes of a schema 6 log, or task_only alone: tasks asking
        # for another are refused.
        context_modes=dice.pick(
            [CONTEXT_MODES, CONTEXT_MODES, ("task_only", "full"), ("task_only",)]
        ),
    )


@st.composite
def limits(draw: st.DrawFn) -> Limits:
    """Small limits: every queue, retry, grace round and budget is a few steps away."""
    return _limits(_Dice(draw))


def _created(
    dice: _Dice, sub_agent: bool | None, lim: Limits | None, asking: bool = False
) -> ConversationCreated:
    is_sub = dice.flip() if sub_agent is None else sub_agent
    lim = _limits(dice) if lim is None else lim
    tools = (ORDINARY_TOOLS[0], *(t for t in ORDINARY_TOOLS[1:] if dice.flip()))
    if asking:
        tools = (*tools, *ASKING_TOOLS)
        if dice.flip():
            lim = attrs.evolve(lim, approval_timeout=5.0)
    model = dice.pick([None, "small"])
    if not is_sub:
        return ConversationCreated(
            conversation_id="root",
            cwd="/work",
            system_prompt="You are helpful.",
            model=model,
            limits=lim,
            tools=tools,
            # A delegated tree's root runs with its agent's time limit, per turn.
            timeout=dice.pick([None, None, 5.0, 1.0]),
        )
    top = max(1, lim.max_depth)
    # Half of the sub-agents sit where they may still delegate (below max_depth), so
    # that nested fan-outs (a sub-agent waiting for its own children) are reached
    # often, not by luck: the draws after this one vary with every change elsewhere.
    below = top > 1 and dice.flip()
    depth = dice.pick(range(1, top if below else top + 1))
    parent = "root" + ".1" * (depth - 1)
    return ConversationCreated(
        conversation_id=parent + ".1",
        parent_id=parent,
        root_id="root",
        depth=depth,
        cwd="/work",
        task=dice.pick(["review the code", "count the files"]),
        system_prompt="You are helpful.",
        model=model,
        limits=lim,
        tools=tools,
        timeout=dice.pick([None, 5.0, 1.0]),
        workdir=dice.pick(_WORKDIRS),
    )


@st.composite
def conversation_created(
    draw: st.DrawFn,
    sub_agent: bool | None = None,
    limits_strategy: st.SearchStrategy[Limits] | None = None,
) -> ConversationCreated:
    """A ConversationCreated for a root (``sub_agent=False``), a sub-agent (``True``)
    at any allowed depth, or either; with ``limits()`` unless told otherwise.
    """
    lim = None if limits_strategy is None else draw(limits_strategy)
    return _created(_Dice(draw), sub_agent, lim)


def _model_error(dice: _Dice) -> ModelError:
    return ModelError(
        kind=dice.pick(_ERROR_KINDS),
        message=dice.pick(["overloaded", "boom"]),
        retry_after=dice.pick([None, None, 0.0, 2.5, -1.0]),
        # Tokens the server billed for the failed attempt, as it reported them.
        usage=dice.pick([Usage(), Usage(), Usage(), Usage(12, 3), Usage(0, 1)]),
    )


def _child_outcome(dice: _Dice) -> ChildOutcome:
    tokens = dice.pick([0, 0, 40, 90, 300])  # what the child says it used
    if dice.flip():
        return ChildFailed(dice.text(), dice.pick(_ALL_KINDS), dice.pick([None, *_REASONS]), tokens)
    return ChildSucceeded(dice.text(), tokens, dice.flip())


@st.composite
def model_errors(draw: st.DrawFn) -> ModelError:
    """Classified model failures of every kind a provider reports, retryable ones more
    often."""
    return _model_error(_Dice(draw))


@st.composite
def child_outcomes(draw: st.DrawFn) -> ChildOutcome:
    """What a child reports: a result, or a failure of any kind (cancelled ones too)."""
    return _child_outcome(_Dice(draw))


def _spawn_arguments(dice: _Dice, max_tasks: int) -> str:
    if dice.one_in(10):
        return dice.pick(_BAD_SPAWNS)
    tasks: list[Any] = []
    for index in range(dice.pick(range(1, max_tasks + 2))):
        if dice.one_in(4):
            # Half of the refused tasks are well-formed but for one unknown field.
            bad = {"task": "x", "colour": "red"} if dice.flip() else dice.pick(_BAD_TASKS)
            tasks.append(bad)
        else:
            tasks.append({"task": f"task {index}", **dice.pick(_TASK_EXTRAS)})
    return canonical_json({"tasks": tasks, **dice.pick(_CALL_MODES)})


def _submit_arguments(dice: _Dice, key: str) -> str:
    if dice.one_in(4):
        return dice.pick(
            [
                canonical_json({key: 3}),
                "{}",
                "not json",
                canonical_json({key: "x", "n": math.inf}),
                # Valid JSON that is no object.
                canonical_json([key, "x"]),
                canonical_json("x"),
                "null",
                "7",
            ]
        )
    return canonical_json({key: dice.text()})


def _tool_call(dice: _Dice, state: Conversation, call_id: str) -> ToolCall:
    ordinary = [t.name for t in state.tools if t.name not in CONTROL_TOOLS] or ["bash"]
    names = [*ordinary, *ordinary, SPAWN_AGENTS, SPAWN_AGENTS, "no_such_tool"]
    if state.is_sub_agent:
        names += [SUBMIT_RESULT, SUBMIT_ERROR]
    elif dice.one_in(4):
        names += [SUBMIT_RESULT, SUBMIT_ERROR]  # not offered to a root: error results
    name = dice.pick(names)
    if name == SPAWN_AGENTS:
        arguments = _spawn_arguments(dice, state.limits.max_tasks_per_call)
    elif name == SUBMIT_RESULT:
        arguments = _submit_arguments(dice, "result")
    elif name == SUBMIT_ERROR:
        arguments = _submit_arguments(dice, "error")
    elif name == "ask_user":
        arguments = dice.pick(_QUESTIONS)
    else:
        arguments = dice.pick(_TOOL_ARGUMENTS)
    return ToolCall(call_id, name, arguments)


def _model_reply(dice: _Dice, state: Conversation) -> ModelReply:
    phase = state.phase
    number = phase.call if isinstance(phase, LlmRequesting) else state.next_call
    text = dice.text()
    usage = dice.pick(_USAGES)
    budget = state.limits.max_tokens
    if budget is not None and budget > state.tokens_spent and dice.one_in(4):
        # Spend exactly what is left of the token budget, or one token less.
        left = budget - state.tokens_spent - dice.pick([0, 1])
        usage = Usage(left - left // 2, left // 2)
    if dice.one_in(8 if state.is_sub_agent else 4):
        # A plain answer; now and then one cut off at the output token limit.
        cut = dice.one_in(5)
        return ModelReply(
            text=text, usage=usage, stop_reason=STOP_MAX_TOKENS if cut else "end_turn"
        )
    if dice.one_in(40):
        # The model declines (its explanation in stop_details, or only in the text).
        details = dice.pick(["", "policy", dice.text()])
        return ModelReply(text, usage=usage, stop_reason=STOP_REFUSAL, stop_details=details)
    count = dice.pick(range(1, 4))
    calls = tuple(_tool_call(dice, state, f"call{number}-{i}") for i in range(count))
    return ModelReply(text=text, tool_calls=calls, usage=usage, stop_reason="tool_use")


@st.composite
def model_replies(draw: st.DrawFn, state: Conversation) -> ModelReply:
    """A reply to ``state``'s model call: text only, or 1-3 tool calls of any kind.

    Tool calls include ordinary tools, ``spawn_agents`` (valid, partly invalid, empty,
    over the per-call limit), ``submit_result``/``submit_error`` (valid or malformed;
    now and then to a root, which is not offered them) and tools nobody offers. Tool
    call ids are unique within the conversation.
    """
    return _model_reply(_Dice(draw), state)


def live_numbers(state: Conversation) -> dict[int, str]:
    """Call and timer numbers ``state`` still awaits an answer for, with what each is.

    A terminal conversation awaits nothing.
    """
    if state.is_terminal:
        return {}
    live: dict[int, str] = {}

    def add(number: int, what: str) -> None:
        if number in live:
            raise AssertionError(
                f"invariant 'unique numbers' broken: {number} is both {live[number]!r} "
                f"and {what!r}{_where(state)}"
            )
        live[number] = what

    if state.deadline_timer is not None:
        add(state.deadline_timer, "own time limit")
    match state.phase:
        case LlmRequesting(call=call):
            add(call, "model call")
        case AwaitingRetry(timer=timer):
            add(timer, "retry timer")
        case ToolExecuting(call=call, asking=asking):
            add(call, "tool call" if asking is None else "request for a decision")
            if asking is not None and asking.timer is not None:
                add(asking.timer, "approval timeout")
        case CancellingSubAgents(grace_timer=timer):
            add(timer, "cancel grace timer")
    children = state.children
    if children is not None:
        for pending in children.pending:
            if pending.deadline_timer is not None:
                add(pending.deadline_timer, f"deadline of {pending.spec.id}")
        summary = children.summary
        if summary is not None and summary.call is not None:
            add(summary.call, "summary call")
        if summary is not None and summary.timer is not None:
            add(summary.timer, "summary retry timer")
    return live


_Maker = Callable[[_Dice, Conversation], Event]


def _user_message(dice: _Dice, state: Conversation) -> Event:
    return UserMessaged(dice.text())


def _reply(dice: _Dice, state: Conversation) -> Event:
    assert isinstance(state.phase, LlmRequesting)
    return ModelReplied(state.phase.call, _model_reply(dice, state))


def _failure(dice: _Dice, state: Conversation) -> Event:
    assert isinstance(state.phase, LlmRequesting)
    return ModelFailed(state.phase.call, _model_error(dice))


def _retry_fires(dice: _Dice, state: Conversation) -> Event:
    assert isinstance(state.phase, AwaitingRetry)
    return TimerFired(state.phase.timer)


def _summary_of(state: Conversation) -> Summary:
    children = state.children
    assert children is not None and children.summary is not None
    return children.summary


def _summary_reply(dice: _Dice, state: Conversation) -> Event:
    call = _summary_of(state).call
    assert call is not None
    # Mostly a summary; now and then an empty text, a refusal, or tool calls (none
    # are offered: the text is what counts).
    return ModelReplied(
        call,
        _model_reply(dice, state)
        if dice.one_in(4)
        else ModelReply(dice.text(), usage=dice.pick(_USAGES)),
    )


def _summary_failure(dice: _Dice, state: Conversation) -> Event:
    call = _summary_of(state).call
    assert call is not None
    return ModelFailed(call, _model_error(dice))


def _summary_retry_fires(dice: _Dice, state: Conversation) -> Event:
    timer = _summary_of(state).timer
    assert timer is not None
    return TimerFired(timer)


def _tool_result(dice: _Dice, state: Conversation) -> Event:
    phase = state.phase
    assert isinstance(phase, ToolExecuting)
    current = phase.current
    result = ToolResult(current.id, current.name, dice.text(), dice.one_in(4))
    return ToolFinished(phase.call, result)


def _decision(dice: _Dice, state: Conversation) -> Event:
    """A person's decision on the open request (issue 35): a grant (now and then with
    edited arguments, some refused by the reducer, some by the rules), a denial, or an
    answer to a question."""
    phase = state.phase
    assert isinstance(phase, ToolExecuting) and phase.asking is not None
    if phase.asking.question:
        if dice.one_in(3):
            return ApprovalDenied(phase.call, dice.text())
        return UserAnswered(phase.call, dice.text())
    choice = dice.pick(range(5))
    if choice == 0:
        return ApprovalGranted(phase.call)
    if choice == 1:
        return ApprovalDenied(phase.call, dice.text())
    edits = ('{"command":"ls -l"}', '{"command":"rm -rf /"}', "[1]", '{"x":NaN}')
    return ApprovalGranted(phase.call, dice.pick(edits))


def _approval_timeout(dice: _Dice, state: Conversation) -> Event:
    phase = state.phase
    assert isinstance(phase, ToolExecuting) and phase.asking is not None
    assert phase.asking.timer is not None
    return TimerFired(phase.asking.timer)


def _child_reports(dice: _Dice, state: Conversation) -> Event:
    children = state.children
    assert children is not None
    running = [p.spec.id for p in children.pending if p.started]
    return SubAgentFinished(dice.pick(running), _child_outcome(dice))


def _child_deadline(dice: _Dice, state: Conversation) -> Event:
    children = state.children
    assert children is not None
    timers = [p.deadline_timer for p in children.pending if p.deadline_timer is not None]
    return TimerFired(dice.pick(timers))


def _grace_fires(dice: _Dice, state: Conversation) -> Event:
    assert isinstance(state.phase, CancellingSubAgents)
    return TimerFired(state.phase.grace_timer)


def _cancel(dice: _Dice, state: Conversation) -> Event:
    return CancelRequested(dice.pick(_REASONS))


def _resume(dice: _Dice, state: Conversation) -> Event:
    return RuntimeResumed()


def _own_deadline(dice: _Dice, state: Conversation) -> Event:
    assert state.deadline_timer is not None
    return TimerFired(state.deadline_timer)


def _late_child_result(dice: _Dice, state: Conversation) -> Event:
    # A child the parent stopped waiting for (its deadline, the cancel grace, a race's
    # quorum) reports after all: the race between a cancel and a child's result.
    return SubAgentFinished(dice.pick(state.written_off), _child_outcome(dice))


def _progress_makers(state: Conversation) -> list[_Maker]:
    """Events that move the conversation forward, most usual first.

    Besides progress, the hard cases come often here (issue 34): a late result of a
    written-off child, the cancel grace running out while children are cancelled,
    the conversation's own time limit during a fan-in, and a user message to a busy
    conversation or to a sub-agent (which fanfold refuses: a generator drawing for
    fanfold's reducer drops it and draws again, counting it; a reducer that accepts
    it has the step checked)."""
    if state.is_terminal:
        return []
    makers: list[_Maker] = []
    phase = state.phase
    match phase:
        case Idle() | Error():
            makers.append(_user_message)
        case LlmRequesting():
            makers += [_reply, _reply, _reply, _failure]
        case AwaitingRetry():
            makers.append(_retry_fires)
        case ToolExecuting(asking=None):
            makers += [_tool_result, _tool_result]
        case ToolExecuting(asking=Asking() as asking):
            makers += [_decision, _decision]
            if asking.timer is not None:
                makers.append(_approval_timeout)
    if state.is_sub_agent or not isinstance(phase, Idle | Error):
        makers.append(_user_message)
    if state.written_off:
        makers.append(_late_child_result)
    children = state.children
    if children is not None:
        if children.summary is not None and children.summary.call is not None:
            makers += [_summary_reply, _summary_reply, _summary_failure]
        if children.summary is not None and children.summary.timer is not None:
            makers.append(_summary_retry_fires)
        if children.running:
            makers += [_child_reports, _child_reports, _child_reports]
            if state.limits.max_tokens is not None:
                # A restart must re-issue each running child with its share.
                makers.append(_resume)
        if any(p.deadline_timer is not None for p in children.pending):
            makers += [_child_deadline, _child_deadline]
        if state.deadline_timer is not None:
            # The conversation's own time limit runs out during the fan-in.
            makers.append(_own_deadline)
        if isinstance(phase, CancellingSubAgents):
            # As likely as a child's acknowledgement: the children it writes off
            # are the ones whose late results come next.
            makers += [_grace_fires, _grace_fires, _grace_fires]
        elif children.pending:
            # Cancels matter most while children run: make them common here.
            makers += [_cancel, _cancel, _cancel]
    return makers


def _stale_numbers(state: Conversation) -> list[int]:
    live = live_numbers(state)
    return [n for n in range(state.next_call) if n not in live]


def _rare_makers(state: Conversation, stale: bool) -> list[_Maker]:
    makers: list[_Maker] = [_cancel, _resume]
    if state.deadline_timer is not None and not state.is_terminal:
        makers.append(_own_deadline)
    if stale and (state.written_off or _stale_numbers(state)):
        makers.append(_stale_event)
    return makers


def _stale_event(dice: _Dice, state: Conversation) -> Event:
    numbers = _stale_numbers(state)
    if state.written_off and (not numbers or dice.flip()):
        return SubAgentFinished(dice.pick(state.written_off), _child_outcome(dice))
    number = dice.pick(numbers)
    match dice.pick(range(4)):
        case 0:
            return TimerFired(number)
        case 1:
            return ModelReplied(number, ModelReply(dice.text()))
        case 2:
            return ModelFailed(number, _model_error(dice))
    return ToolFinished(number, ToolResult("old", "bash", dice.text()))


@st.composite
def stale_events(draw: st.DrawFn, state: Conversation, transition: Reducer | None = None) -> Event:
    """A late event the reducer must absorb: a result or firing of a call or timer
    issued earlier but no longer awaited, or an outcome of a written-off child.

    Use only when ``has_stale_events(state)``. ``transition``: the reducer under test
    (fanfold's by default); an event it refuses is not drawn (see ``plausible_events``).
    """
    assert has_stale_events(state), "nothing can be stale in this state"
    dice = _Dice(draw)
    return _accepted(dice, state, transition, lambda: _stale_event(dice, state))[0]


def has_stale_events(state: Conversation) -> bool:
    return bool(state.written_off or _stale_numbers(state))


def _plausible_event(dice: _Dice, state: Conversation, stale: bool) -> Event:
    progress = _progress_makers(state)
    if progress and not dice.one_in(16):
        return dice.pick(progress)(dice, state)
    return dice.pick(_rare_makers(state, stale))(dice, state)


# ----------------------------------------------------------------- the reducer under test

Reducer = Callable[[Conversation, Event], tuple[Conversation, Effects]]
"""A reducer under test: fanfold's ``transition``, or a rule of your own around it
(``def my_transition(state, event): ...``, returning ``(state, effects)`` and raising the
``IllegalTransition`` family for what it refuses)."""


def _reducer(transition: Reducer | None) -> Reducer:
    return _fanfold_transition if transition is None else transition


_TRIES = 12
"""Events drawn in one state before the generator tries one of each kind in turn."""

_REFUSED: dict[str, int] = {}


def refused_draws(reset: bool = False) -> dict[str, int]:
    """How many drawn events the reducers under test refused since the last reset,
    by ``"<event> in <phase>"``: the generators drop a refused event and draw again
    (each refusal is also a Hypothesis ``event``, shown by
    ``pytest --hypothesis-show-statistics``). ``reset`` empties the count."""
    counts = dict(_REFUSED)
    if reset:
        _REFUSED.clear()
    return counts


class NothingAccepted(AssertionError):
    """The reducer under test refused every event a generator could draw in a state
    that has not ended: no conversation there could ever move on."""


def _count_refusal(state: Conversation, event: Event) -> str:
    key = f"{type(event).__name__} in {type(state.phase).__name__}"
    _REFUSED[key] = _REFUSED.get(key, 0) + 1
    # (Outside a Hypothesis test, as in each_plausible_event, there is nothing to tell.)
    with contextlib.suppress(InvalidArgument):
        _record_event(f"refused by the reducer under test: {key}")
    return key


def _accepted(
    dice: _Dice, state: Conversation, transition: Reducer | None, draw: Callable[[], Event]
) -> tuple[Event, Conversation, Effects]:
    """An event from ``draw`` that ``transition`` accepts in ``state``, with the step it
    takes. Refused ones are counted and drawn again; after ``_TRIES`` refusals, one of
    each kind the generators make is tried in turn; if every one is refused,
    ``NothingAccepted`` names the state and what was refused, rather than spinning."""
    reducer = _reducer(transition)
    refused: list[str] = []
    for _ in range(_TRIES):
        event = draw()
        try:
            after, effects = reducer(state, event)
        except IllegalTransition as error:
            refused.append(f"{_count_refusal(state, event)}: {error.reason}")
            continue
        return event, after, effects
    makers = _progress_makers(state) + _rare_makers(state, True)
    for make in dict.fromkeys(makers):
        event = make(dice, state)
        try:
            after, effects = reducer(state, event)
        except IllegalTransition as error:
            refused.append(f"{_count_refusal(state, event)}: {error.reason}")
            continue
        return event, after, effects
    kinds = sorted(set(refused))
    raise NothingAccepted(
        f"invariant 'a conversation that has not ended accepts some plausible event' broken: "
        f"the reducer under test refused all {len(refused)} events drawn "
        f"({'; '.join(kinds)}){_where(state)}"
    )


def _drawer(dice: _Dice, state: Conversation, stale: bool) -> Callable[[], Event]:
    return lambda: _plausible_event(dice, state, stale)


def each_plausible_event(
    state: Conversation, seed: bytes, transition: Reducer | None = None
) -> list[Event]:
    """One event of each kind ``plausible_events(state)`` may draw (progress, and rare
    ones: cancels, restarts, time limits, late results) that ``transition`` (fanfold's
    by default) accepts, its choices read from ``seed`` (repeated as needed). Without
    Hypothesis: for seeded walks, such as the transition table's check
    (``table_report``), which so reach every event a generator makes.
    """
    chunk = (seed or b"\0") * (16 // max(1, len(seed)) + 1)
    dice = _Dice(lambda _: chunk[:16])
    makers = _progress_makers(state) + _rare_makers(state, True)
    reducer = _reducer(transition)
    found = []
    for make in dict.fromkeys(makers):
        event = make(dice, state)
        try:
            reducer(state, event)
        except IllegalTransition:
            _count_refusal(state, event)
            continue
        found.append(event)
    return found


@st.composite
def plausible_events(
    draw: st.DrawFn, state: Conversation, stale: bool = True, transition: Reducer | None = None
) -> Event:
    """An event that could really arrive next in ``state`` and that ``transition`` (the
    reducer under test, fanfold's by default) accepts.

    Mostly progress: a reply or failure of the model call in flight, the running
    tool's result, a running child's outcome, a timer that is set, and (while
    children run) a cancel; often the hard cases (a written-off child's late result,
    the cancel grace running out, a time limit during a fan-in). About one in sixteen
    is a cancel, a restart notice, the conversation's own time limit or
    (``stale=True``) a late result. An event the reducer refuses (a user message to a
    busy conversation, or whatever a rule of yours refuses) is dropped and counted
    (``refused_draws``), and another drawn; ``NothingAccepted`` if none is accepted.
    """
    dice = _Dice(draw)
    return _accepted(dice, state, transition, _drawer(dice, state, stale))[0]


# --------------------------------------------------------------------------- traces


@attrs.frozen
class Trace:
    """A conversation's creation and the events it accepted, replayable.

    ``transition`` is the reducer that accepted them (fanfold's by default), the one
    ``steps`` and ``final`` re-run. The default attrs repr leaves it out and is
    runnable Python: paste a shrunk failure into a test (and pass your reducer).
    """

    created: ConversationCreated
    events: tuple[Event, ...]
    transition: Reducer = attrs.field(default=_fanfold_transition, repr=False, eq=False)

    def start(self) -> tuple[Conversation, Effects]:
        return start(self.created)

    def steps(self) -> Iterator[Step]:
        """Re-run the reducer over the events: ``(before, event, after, effects)``."""
        state, _ = start(self.created)
        for event in self.events:
            after, effects = self.transition(state, event)
            yield state, event, after, effects
            state = after

    def final(self) -> Conversation:
        state, _ = start(self.created)
        for event in self.events:
            state, _ = self.transition(state, event)
        return state


def _walk(
    dice: _Dice,
    created: ConversationCreated,
    max_steps: int,
    stale: bool,
    transition: Reducer | None,
    live: bool = False,
) -> tuple[Trace, Conversation]:
    """A walk of accepted events. ``live``: a step that would end a sub-agent is
    taken only one time in four (the walk stops before it), so the states drawn are
    more often sub-agents still at work (issue 34: 15 of 300 were)."""
    state, _ = start(created)
    events: list[Event] = []
    for _ in range(dice.pick(range(max_steps + 1))):
        if state.is_terminal:
            break
        event, after, _ = _accepted(dice, state, transition, _drawer(dice, state, stale))
        if live and after.is_terminal and not dice.one_in(4):
            break
        state = after
        events.append(event)
        if live and _hard(state) and dice.one_in(3):
            break  # stay in a hard state: it passes in a step or two
    return Trace(created, tuple(events), _reducer(transition)), state


def _hard(state: Conversation) -> bool:
    """A state the checks need often and walks pass through quickly: children being
    cancelled and not answered yet, children written off (their late results may
    come), a live sub-agent waiting for children of its own."""
    phase = state.phase
    return (
        (isinstance(phase, CancellingSubAgents) and bool(phase.children.pending))
        or (bool(state.written_off) and not state.is_terminal)
        or (state.is_sub_agent and isinstance(phase, AwaitingSubAgents))
    )


@st.composite
def event_sequences(
    draw: st.DrawFn,
    created: ConversationCreated | None = None,
    *,
    sub_agent: bool | None = None,
    max_steps: int = 40,
    stale: bool = True,
    transition: Reducer | None = None,
    asking: bool = False,
) -> Trace:
    """A trace of up to ``max_steps`` plausible events accepted by ``transition`` (the
    reducer under test, fanfold's by default), from ``created`` (or a generated root
    or sub-agent). It stops early once the conversation reached a terminal phase.
    Check it whole with ``check_trace``. ``asking``: the generated conversation is
    offered a tool needing approval and ``ask_user`` (``ASKING_TOOLS``), so its calls
    wait for a person and get decided in every way (issue 35).
    """
    dice = _Dice(draw)
    if created is None:
        created = _created(dice, sub_agent, None, asking)
    trace, _ = _walk(dice, created, max_steps, stale, transition)
    return trace


@st.composite
def conversations(
    draw: st.DrawFn,
    *,
    sub_agent: bool | None = None,
    max_steps: int = 40,
    stale: bool = True,
    transition: Reducer | None = None,
    asking: bool = False,
) -> Conversation:
    """A state reachable from ``start`` through plausible events accepted by
    ``transition`` (the reducer under test, fanfold's by default). Sub-agents still
    at work come often: a walk stops before most steps that would end a sub-agent.
    ``asking``: as for ``event_sequences``."""
    dice = _Dice(draw)
    created = _created(dice, sub_agent, None, asking)
    _, state = _walk(dice, created, max_steps, stale, transition, live=True)
    return state


@st.composite
def terminal_conversations(
    draw: st.DrawFn, max_steps: int = 20, transition: Reducer | None = None
) -> Conversation:
    """A sub-agent that reached Completed or Failed, by any route ``transition`` (the
    reducer under test, fanfold's by default) takes."""
    dice = _Dice(draw)
    reducer = _reducer(transition)
    _, state = _walk(dice, _created(dice, True, None), max_steps, True, transition)
    # Up to three tries as the dice say (a submission may be malformed: the round goes
    # on), then a cancel and, if it waits for children, its grace timer: both end it.
    for attempt in range(5):
        phase = state.phase
        if state.is_terminal:
            return state
        if isinstance(phase, LlmRequesting) and attempt < 3 and dice.flip():
            call = ToolCall(f"final{phase.call}", SUBMIT_RESULT, _submit_arguments(dice, "result"))
            event: Event = ModelReplied(phase.call, ModelReply(tool_calls=(call,)))
        elif isinstance(phase, CancellingSubAgents):
            event = TimerFired(phase.grace_timer)
        else:
            event = CancelRequested(dice.pick(_REASONS))
        state, _ = reducer(state, event)
    assert state.is_terminal, f"could not end {state.phase!r}"
    return state


# ------------------------------------------------------------------ where a check failed


def _where(state: Conversation) -> str:
    text = repr(state.phase)
    if len(text) > 1500:
        text = text[:1500] + "..."
    kind = "sub-agent" if state.is_sub_agent else "root"
    return f"\n  in {kind} {state.id!r} at phase {text}"
