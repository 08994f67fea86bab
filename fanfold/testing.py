"""Property-test fanfold's reducer: Hypothesis strategies and invariant checks.

Use this module to test the reducer, or a rule you add to it (a reducer of your own
wrapping ``fanfold.statemachine.transition``)::

    from hypothesis import given

    from fanfold import testing


    @given(testing.event_sequences(transition=my_transition))
    def test_my_rule_keeps_every_invariant(trace: testing.Trace) -> None:
        testing.check_trace(trace)

Every strategy and every check that runs a reducer takes the reducer under test as
``transition=`` (fanfold's by default): the strategies draw only events it accepts,
from the states it reaches, and drop (and count, ``refused_draws``) those it refuses;
if it refuses everything they can draw in a state that has not ended, they raise
``NothingAccepted`` naming the state instead of spinning.

Strategies (all generate values the reducer under test can be fed):

- ``limits()``, ``conversation_created()``: small limits, so that queues, retries,
  grace rounds and budgets are reached in a few steps;
- ``model_replies(state)``, ``model_errors()``, ``child_outcomes()``: the pieces of
  events;
- ``each_plausible_event(state, seed)``: one of each kind of plausible event, without
  Hypothesis (for seeded walks);
- ``plausible_events(state)``: an event that could really arrive next (a reply to
  the call in flight, a result of the running tool, an outcome of a running child,
  a timer that is set, a cancel, a restart notice, a late result of an earlier call
  or of a written-off child);
- ``stale_events(state)`` (when ``has_stale_events(state)``): late results the reducer
  must absorb without effects;
- ``rejections(state)`` / ``rejected_events(state)``: events it must refuse, each
  with the exception expected;
- ``event_sequences()``: a ``Trace`` of accepted events from ``start`` (its repr is
  runnable Python, ready to paste into a regression test);
- ``conversations()``, ``terminal_conversations()``: reachable states (sub-agents still
  at work, children being cancelled and written off, come often).

To drive a state step by step instead, draw ``plausible_events(state)`` with
``st.data()`` and check each step with ``check_transition``.

Checks (each raises ``AssertionError`` naming the broken invariant):

- ``check_invariants(state)``: what holds in every reachable state;
- ``check_start(created, state, effects)``: what ``start`` must produce;
- ``check_transition(before, event, after, effects)``: what holds for every step;
- ``check_rejections(state)``: every event of ``rejections(state)`` is refused;
- ``check_late_events(state)``: every event of ``late_events(state)`` is absorbed;
- ``check_trace(trace)``: all of the above over a whole trace (the recipe);
- ``check_table()`` / ``table_report()``: which (phase, event type) cells the reducer
  handles and which it refuses, against the documented table (DESIGN.md).

The checks take tool call ids to be unique within one model reply (providers
guarantee it, and reject requests that break it); ``live_numbers(state)`` and
``state.children`` expose the bookkeeping they rely on.

This module imports Hypothesis (a dependency of fanfold); ``fanfold.statemachine``
never imports this module.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import math
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn, TypeVar

import attrs
from hypothesis import event as _record_event
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from fanfold.statemachine import (
    ALL_PHASES,
    CONTROL_TOOLS,
    SPAWN_AGENTS,
    STOP_MAX_TOKENS,
    STOP_REFUSAL,
    SUBMIT_ERROR,
    SUBMIT_RESULT,
    AbortCall,
    ApprovalDenied,
    ApprovalGranted,
    Asking,
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
    Children,
    ChildSpec,
    ChildSucceeded,
    Completed,
    Conversation,
    ConversationCreated,
    ConversationForked,
    DecisionEdit,
    DuplicateChildOutcome,
    Effect,
    EndCompleted,
    EndFailed,
    EndIdle,
    Error,
    ErrorKind,
    Event,
    Failed,
    ForkEdited,
    Idle,
    IllegalTransition,
    Limits,
    LimitsEdit,
    LlmRequesting,
    Message,
    ModelError,
    ModelFailed,
    ModelReplied,
    ModelReply,
    ModelRequest,
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
    ToolSpec,
    TurnFinished,
    TurnOutcome,
    UnknownCall,
    UnknownChild,
    Usage,
    UserAnswered,
    UserMessage,
    UserMessaged,
    WorkingDirectory,
    canonical_json,
    start,
)
from fanfold.statemachine import transition as _fanfold_transition
from fanfold.statemachine.agent_defs import AgentDefinition, find_agent
from fanfold.statemachine.approvals import ASK_USER_SPEC, needs_decision
from fanfold.statemachine.children import Mode, PendingChild, Summary, spawn_order
from fanfold.statemachine.control_tools import MAX_TASK_CHARS
from fanfold.statemachine.delegation import SUMMARY_HEADER
from fanfold.statemachine.limits import CONTEXT_MODES
from fanfold.statemachine.modes import may_start
from fanfold.statemachine.permissions import refusal
from fanfold.statemachine.table import TABLE
from fanfold.statemachine.transition import model_request

__all__ = [
    "ORDINARY_TOOLS",
    "NothingAccepted",
    "Reducer",
    "Rejected",
    "Step",
    "TableReport",
    "TableStep",
    "Trace",
    "check_invariants",
    "check_late_events",
    "check_rejections",
    "check_start",
    "check_table",
    "check_trace",
    "check_transition",
    "child_outcomes",
    "conversation_created",
    "conversations",
    "each_plausible_event",
    "event_sequences",
    "has_stale_events",
    "late_events",
    "limits",
    "live_numbers",
    "model_errors",
    "model_replies",
    "observe_step",
    "plausible_events",
    "refused_draws",
    "rejected_events",
    "rejections",
    "stale_events",
    "table_report",
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


# =========================================================================== checks


def _where(state: Conversation) -> str:
    text = repr(state.phase)
    if len(text) > 1500:
        text = text[:1500] + "..."
    kind = "sub-agent" if state.is_sub_agent else "root"
    return f"\n  in {kind} {state.id!r} at phase {text}"


def _fail(invariant: str, detail: str, state: Conversation) -> NoReturn:
    raise AssertionError(f"invariant {invariant!r} broken: {detail}{_where(state)}")


_BUSY = (LlmRequesting, AwaitingRetry, ToolExecuting, AwaitingSubAgents, CancellingSubAgents)
_QUIET = (Idle, Error, Completed, Failed)
_ROUND = (ToolExecuting, AwaitingSubAgents, CancellingSubAgents)


def _may_spawn(state: Conversation) -> bool:
    # Written out here, not imported, so the check does not trust the code it checks.
    return state.depth + 1 <= state.limits.max_depth


def check_invariants(state: Conversation) -> None:
    """Assert every invariant of a single reachable state.

    Identity and tools, no NaN or infinity in any field, counters within limits,
    phase allowed for a root or
    sub-agent, unique live call/timer numbers below ``next_call``, attempts within
    ``max_attempts``, a valid history (each tool call answered exactly once, in order,
    except the calls of the round in progress; a valid request while a model call is in
    flight or waits for its retry), the round's bookkeeping, and fan-in
    conservation (pending + finished children == children accepted this round,
    running <= max_concurrent, queued children start oldest first), and the summary
    of context mode summary (asked for once the round's tools are done, in flight only
    while children wait for it, exactly one of call/retry/text/error, no child waiting
    for one that failed).
    """
    _check_identity(state)
    _check_finite(state)
    _check_counters(state)
    _check_phase(state)
    live = live_numbers(state)
    for number, what in live.items():
        if not (0 <= number < state.next_call):
            _fail(
                "numbers below next_call",
                f"{what} has number {number}, next_call is {state.next_call}",
                state,
            )
    if isinstance(state.phase, LlmRequesting | AwaitingRetry):
        # The history is the request of the model call in flight (or to be retried):
        # valid as a request in this phase, not only at the step that issued it.
        _history_open_calls(state.history, state, request=True, what="history valid")
    open_calls = _history_open_calls(state.history, state, request=False)
    _check_round(state, open_calls)
    _check_children(state, open_calls)
    _check_spawn_tasks(state, open_calls)


# --------------------------------------------------------------------- finite numbers
#
# No state and no effect may hold a NaN or an infinity: one in a timer's delay, a time
# limit or a log breaks whoever reads it. The walk visits only the fields whose
# annotated type can hold a float (a history of messages holds none), so it is cheap
# enough for every step; a field it cannot read the type of is always visited.

_FLOAT_FIELDS: dict[type, tuple[str, ...]] = {}


def _float_fields(cls: type) -> tuple[str, ...]:
    cached = _FLOAT_FIELDS.get(cls)
    if cached is not None:
        return cached
    names = tuple(f.name for f in attrs.fields(cls))
    _FLOAT_FIELDS[cls] = names  # visit everything while the class is being looked at
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an unresolvable annotation: visit every field
        return names
    found = tuple(n for n in names if n not in hints or _may_hold_float(hints[n]))
    _FLOAT_FIELDS[cls] = found
    return found


def _may_hold_float(tp: Any) -> bool:
    if tp in (str, int, bool, type(None)):
        return False
    if isinstance(tp, type):
        if issubclass(tp, enum.Enum):
            return False
        if attrs.has(tp):
            return bool(_float_fields(tp))
        return True  # float, and anything unknown
    args = typing.get_args(tp)
    if args and typing.get_origin(tp) in (tuple, list, frozenset, typing.Union, types.UnionType):
        return any(_may_hold_float(a) for a in args if a is not Ellipsis)
    return True


def _non_finite_in(value: Any, path: str) -> str | None:
    """The path of the first NaN or infinity inside ``value``, or None."""
    if type(value) is float:
        return None if math.isfinite(value) else f"{path} = {value}"
    if attrs.has(type(value)):
        for name in _float_fields(type(value)):
            found = _non_finite_in(getattr(value, name), f"{path}.{name}")
            if found is not None:
                return found
    elif isinstance(value, tuple | list | frozenset):
        for index, item in enumerate(value):
            found = _non_finite_in(item, f"{path}[{index}]")
            if found is not None:
                return found
    elif isinstance(value, dict):
        for key, item in value.items():
            found = _non_finite_in(item, f"{path}[{key!r}]")
            if found is not None:
                return found
    return None


def _check_finite(state: Conversation, effects: Effects = ()) -> None:
    found = _non_finite_in(state, "state")
    for index, effect in enumerate(effects):
        if found is None:
            found = _non_finite_in(effect, f"effects[{index}]")
    if found is not None:
        _fail("only finite numbers", found, state)


def _json_non_finite(text: str) -> bool:
    """Whether the JSON ``text`` parses (as Python reads JSON) to something holding a
    NaN or an infinity."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return False
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


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


def _check_identity(state: Conversation) -> None:
    if state.depth < 0:
        _fail("depth", f"depth {state.depth} < 0", state)
    if (state.parent_id is None) != (state.depth == 0):
        _fail("root iff depth 0", f"parent_id={state.parent_id!r} with depth {state.depth}", state)
    if state.parent_id is None and state.root_id != state.id:
        _fail("root_id", f"root_id {state.root_id!r}", state)
    names = [t.name for t in state.tools]
    if len(names) != len(set(names)):
        _fail("unique tool names", f"tools {names}", state)
    if (SPAWN_AGENTS in names) != _may_spawn(state):
        _fail(
            "depth limit",
            f"spawn_agents offered={SPAWN_AGENTS in names} at depth {state.depth}, "
            f"max_depth {state.limits.max_depth}",
            state,
        )
    for name in (SUBMIT_RESULT, SUBMIT_ERROR):
        if (name in names) != state.is_sub_agent:
            _fail("submit tools only for sub-agents", f"{name} offered={name in names}", state)
    # A sub-agent refused its working directory never started (it issued no number),
    # nor its timer.
    never_started = state.next_call == 0 and isinstance(state.phase, Failed)
    if state.is_sub_agent:
        timed = state.timeout is not None and not never_started
    else:  # a root's time limit is per turn: armed while a turn is in progress
        timed = state.timeout is not None and not isinstance(state.phase, Idle | Error)
    if (state.deadline_timer is not None) != timed:
        _fail(
            "own time limit",
            f"deadline_timer={state.deadline_timer} with timeout={state.timeout}",
            state,
        )


def _check_counters(state: Conversation) -> None:
    lim = state.limits
    if not (0 <= state.rounds <= lim.max_rounds):
        _fail("rounds bounded", f"rounds {state.rounds}, max_rounds {lim.max_rounds}", state)
    if not (state.usage_input >= 0 and state.usage_output >= 0):
        _fail("usage", f"{state.usage}", state)
    if not (state.next_call >= 0 and state.spawned >= 0):
        _fail("counters", f"next_call {state.next_call}", state)
    ids = {f"{state.id}.{k}" for k in range(1, state.spawned + 1)}
    if not (
        len(set(state.written_off)) == len(state.written_off) and set(state.written_off) <= ids
    ):
        _fail(
            "written_off are own children, once",
            f"written_off {state.written_off}, spawned {state.spawned}",
            state,
        )


def _check_phase(state: Conversation) -> None:
    phase = state.phase
    lim = state.limits
    if isinstance(phase, Idle | Error) and state.is_sub_agent:
        _fail("Idle/Error only for roots", "sub-agent", state)
    if isinstance(phase, Completed | Failed) and not state.is_sub_agent:
        _fail("Completed/Failed only for sub-agents", "root", state)
    if isinstance(phase, Failed) and phase.reason and phase.kind != phase.reason.error_kind:
        _fail("cancel reason matches kind", f"kind {phase.kind} with reason {phase.reason}", state)
    if isinstance(phase, LlmRequesting):
        if not (1 <= phase.attempt <= lim.max_attempts):
            _fail(
                "retries bounded",
                f"attempt {phase.attempt}, max_attempts {lim.max_attempts}",
                state,
            )
        if phase.grace:
            if state.rounds != lim.max_rounds:
                _fail("grace round only at the round limit", f"rounds {state.rounds}", state)
        else:
            if state.rounds < 1:
                _fail("a model call uses a round", "rounds 0", state)
    if isinstance(phase, AwaitingRetry):
        if not (2 <= phase.next_attempt <= lim.max_attempts):
            _fail(
                "retries bounded",
                f"next_attempt {phase.next_attempt}, max_attempts {lim.max_attempts}",
                state,
            )
        if not phase.last_error.kind.retryable:
            _fail(
                "only retryable errors are retried",
                f"retrying after {phase.last_error.kind}",
                state,
            )


def _history_open_calls(
    history: tuple[Message, ...], state: Conversation, *, request: bool, what: str | None = None
) -> tuple[ToolCall, ...]:
    """Validate ``history``; return the calls of its last assistant message if none of
    them has a result yet (the round in progress). With ``request``, none may be open.
    ``what`` names the invariant in a failure.
    """
    if what is None:
        what = "history valid before every model call" if request else "history valid"
    if history and not isinstance(history[0], UserMessage):
        _fail(what, f"history starts with {type(history[0]).__name__}", state)
    open_calls: tuple[ToolCall, ...] = ()
    i, n = 0, len(history)
    while i < n:
        message = history[i]
        if isinstance(message, ToolResultMessage):
            _fail(what, f"message {i} is a tool result without a call: {message!r}", state)
        i += 1
        if not isinstance(message, AssistantMessage):
            continue
        if i < n and isinstance(history[i], AssistantMessage):
            _fail(what, f"two assistant messages in a row at {i}", state)
        calls = message.tool_calls
        if not calls:
            continue
        ids = [c.id for c in calls]
        if len(set(ids)) != len(ids):
            _fail(what, f"duplicate tool call ids {ids}", state)
        answered = 0
        while i < n and isinstance(history[i], ToolResultMessage):
            result = history[i]
            assert isinstance(result, ToolResultMessage)
            if answered >= len(calls):
                _fail(what, f"tool result {result.result.tool_call_id!r} without a call", state)
            call = calls[answered]
            if not (result.result.tool_call_id == call.id and result.result.name == call.name):
                _fail(
                    what,
                    f"result for {result.result.tool_call_id!r} ({result.result.name}) where "
                    f"{call.id!r} ({call.name}) was expected",
                    state,
                )
            answered += 1
            i += 1
        if answered == 0 and i == n and not request:
            open_calls = calls
        else:
            if answered != len(calls):
                _fail(
                    what,
                    f"tool call {calls[answered].id!r} has no result"
                    if answered < len(calls)
                    else "",
                    state,
                )
    if request:
        if not history:
            _fail(what, "no messages", state)
        if not isinstance(history[-1], UserMessage | ToolResultMessage):
            _fail(what, f"the request ends with {type(history[-1]).__name__}", state)
    return open_calls


def _check_round(state: Conversation, open_calls: tuple[ToolCall, ...]) -> None:
    phase = state.phase
    if not isinstance(phase, _ROUND):
        if open_calls:
            _fail(
                "history valid",
                f"tool calls {[c.id for c in open_calls]} without results in "
                f"{type(phase).__name__}",
                state,
            )
        return
    if not open_calls:
        _fail("round has tool calls", "no open tool calls", state)
    by_id = {c.id: c for c in open_calls}
    result_ids = [r.tool_call_id for r in phase.results]
    if not (len(set(result_ids)) == len(result_ids) and set(result_ids) <= set(by_id)):
        _fail("one result per tool call", f"results {result_ids} for calls {list(by_id)}", state)
    for result in phase.results:
        if result.name != by_id[result.tool_call_id].name:
            _fail(
                "one result per tool call",
                f"result {result.tool_call_id!r} names {result.name}",
                state,
            )
    children = phase.children
    spawn_ids = {p.spec.spawn_call_id for p in children.pending} | {
        f.spec.spawn_call_id for f in children.finished
    }
    rejected_ids = {r.spawn_call_id for r in children.rejected}
    if not rejected_ids <= spawn_ids:
        _fail(
            "rejected tasks belong to a spawn with children", f"{rejected_ids - spawn_ids}", state
        )
    for spawn_id in spawn_ids:
        if not (spawn_id in by_id and by_id[spawn_id].name == SPAWN_AGENTS):
            _fail(
                "children come from spawn_agents calls of this round",
                f"spawn call {spawn_id!r}",
                state,
            )
        if spawn_id in result_ids:
            _fail(
                "one result per tool call",
                f"spawn call {spawn_id!r} has children and a result",
                state,
            )
    covered = [c.id in spawn_ids or c.id in result_ids for c in open_calls]
    if isinstance(phase, ToolExecuting):
        index = next((i for i, c in enumerate(open_calls) if c == phase.current), None)
        if index is None:
            # A call granted with edited arguments runs them under its own id and name.
            current = phase.current
            index = next(
                (
                    i
                    for i, c in enumerate(open_calls)
                    if c.id == current.id and c.name == current.name
                ),
                None,
            )
        if index is None:
            _fail("current tool is a call of the round", "", state)
        assert index is not None
        if not (all(covered[:index]) and not any(covered[index:])):
            _fail("tools run in order", f"covered {covered}, current at {index}", state)
        if phase.remaining != open_calls[index + 1 :]:
            _fail("tools run in order", f"remaining {[c.id for c in phase.remaining]}", state)
    elif isinstance(phase, AwaitingSubAgents):
        if not all(covered):
            _fail("every tool done before waiting", f"covered {covered}", state)
    else:
        first_gap = covered.index(False) if False in covered else len(covered)
        if any(covered[first_gap:]):
            _fail("results cover a prefix of the calls", f"covered {covered}", state)


def _check_children(state: Conversation, open_calls: tuple[ToolCall, ...]) -> None:
    children = state.children
    if children is None:
        return
    lim = state.limits
    phase = state.phase
    if (children.total or children.rejected) and not _may_spawn(state):
        _fail("depth limit", "children beyond max_depth", state)
    ids = [p.spec.id for p in children.pending] + [f.spec.id for f in children.finished]
    expected = {f"{state.id}.{k}" for k in range(state.spawned - len(ids) + 1, state.spawned + 1)}
    if not (len(set(ids)) == len(ids) and set(ids) == expected):
        _fail(
            "fan-in conservation",
            f"pending+finished {ids} are not the {len(ids)} children accepted this round "
            f"(spawned so far: {state.spawned})",
            state,
        )
    if children.running > lim.max_concurrent:
        _fail(
            "concurrency limit",
            f"{children.running} running, max_concurrent {lim.max_concurrent}",
            state,
        )
    # Queued children start oldest first, but for those that could not start when
    # younger ones did: a sequential call's step waits for the one before it, and a
    # child of context mode summary for the summary (and may still be queued behind
    # the younger ones after it is made).
    pending_list = list(children.pending)
    started = [
        p.started
        for p in pending_list
        if p.started or (p.spec.context != "summary" and may_start(p, pending_list))
    ]
    if started != sorted(started, reverse=True):
        _fail("queued children start oldest first", f"started flags {started}", state)
    _check_summary(state, children)
    for pending in children.pending:
        spec = pending.spec
        if spec.id in state.written_off:
            _fail("written-off children are not pending", "", state)
        if not _lexically_inside(spec.cwd, state.cwd):
            _fail("a child works inside its parent's cwd", f"{spec}, cwd {state.cwd!r}", state)
        if not (1 <= spec.max_rounds <= lim.max_rounds):
            _fail(
                "child max_rounds within the parent's",
                f"{spec}, max_rounds {lim.max_rounds}",
                state,
            )
        limit = lim.child_timeout
        if limit is not None and not (spec.timeout is not None and 0 < spec.timeout <= limit):
            _fail(
                "child time limit within the parent's",
                f"{spec.id} timeout {spec.timeout}, child_timeout {limit}",
                state,
            )
        running = pending.started and not isinstance(phase, CancellingSubAgents)
        has_deadline = pending.deadline_timer is not None
        if not running and has_deadline:
            _fail("deadline only while running", f"{spec.id}", state)
        if running and has_deadline != (spec.timeout is not None):
            _fail(
                "a running child with a time limit has a deadline",
                f"{spec.id} timeout {spec.timeout}, deadline {pending.deadline_timer}",
                state,
            )
    waiting = isinstance(phase, AwaitingSubAgents | CancellingSubAgents)
    if waiting and not children.pending:
        _fail("waiting for someone", "no pending children", state)
    if isinstance(phase, CancellingSubAgents):
        if not all(p.started for p in children.pending):
            _fail("queued children are never waited for when cancelling", "", state)
    elif children.running != lim.max_concurrent and any(
        not p.started and may_start(p, list(children.pending)) and not _awaits_summary(p, children)
        for p in children.pending
    ):
        # (A sequential call's step waits for the one before it: modes.may_start.)
        _fail(
            "queued children start as soon as a slot is free",
            f"{children.running} running of {lim.max_concurrent} with children queued",
            state,
        )


def _awaits_summary(pending: PendingChild, children: Children) -> bool:
    """A queued child of context mode summary whose summary is not made yet."""
    summary = children.summary
    return (
        not pending.started
        and pending.spec.context == "summary"
        and (summary is None or summary.text is None)
    )


def _check_summary(state: Conversation, children: Children) -> None:
    """The summary of context mode summary: asked for once the round's tools are done
    (so never beside a tool), in flight only while children wait for it, exactly one
    of its parts set, and every started child of that mode was given one."""
    phase = state.phase
    summary = children.summary
    waiting = [p.spec.id for p in children.pending if _awaits_summary(p, children)]
    if summary is None:
        if waiting and isinstance(phase, AwaitingSubAgents):
            _fail("children waiting for a summary have one asked for", f"{waiting}", state)
        return
    if isinstance(phase, ToolExecuting):
        _fail("a summary is asked for once the round's tools are done", f"{summary}", state)
    parts = [summary.call, summary.timer, summary.text, summary.error]
    if sum(part is not None for part in parts) != 1:
        _fail("a summary is one of: in flight, retrying, made, failed", f"{summary}", state)
    if summary.in_flight is not None:
        if not isinstance(phase, AwaitingSubAgents):
            _fail("a summary is in flight only while its round waits", f"{summary}", state)
        if not waiting:
            _fail("a summary is in flight only while children wait for it", f"{summary}", state)
        if not (1 <= summary.attempt <= state.limits.max_attempts):
            _fail("retries bounded", f"summary attempt {summary.attempt}", state)
    if summary.timer is not None and not (summary.delay is not None and summary.delay >= 0):
        _fail("a summary retry keeps its delay", f"{summary}", state)
    if summary.timer is not None and not (summary.kind is not None and summary.kind.retryable):
        _fail("a summary retry follows a retryable failure", f"{summary}", state)
    if summary.error is not None and summary.kind is None:
        _fail("a failed summary has a typed kind", f"{summary}", state)
    if summary.error is not None and waiting and isinstance(phase, AwaitingSubAgents):
        # Each ends failed when it would start: only one still queued behind others
        # of its call may wait.
        queued = [p for p in children.pending if p.spec.id in waiting]
        if any(may_start(p, list(children.pending)) for p in queued) and (
            children.running < state.limits.max_concurrent
        ):
            _fail("no child waits for a summary that failed", f"{waiting}", state)
    if summary.text is not None and not summary.text.strip():
        _fail("a summary has text", f"{summary}", state)


# --------------------------------------------------------------------- spawn tasks
#
# What a task of ``spawn_agents`` may ask for, written out here from the tool's schema
# and DESIGN.md ("Spawn limits", "Working directories"), not imported, so the check
# does not trust the code it checks.

_TASK_FIELDS = frozenset({"task", "cwd", "timeout", "max_iterations", "model", "agent", "context"})
_SUBMITTED = "submitted; the conversation ends"


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _relative_cwd(cwd: object) -> str | None:
    """A task's ``cwd`` normalised (``""`` for the parent's own), or None if refused."""
    if not isinstance(cwd, str) or not cwd or len(cwd) > 1024:
        return None
    if "\\" in cwd or cwd[0] in "/~" or any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in cwd):
        return None
    if len(cwd) >= 2 and cwd[1] == ":" and cwd[0].isascii() and cwd[0].isalpha():
        return None
    parts = [part for part in cwd.split("/") if part not in ("", ".")]
    return None if ".." in parts else "/".join(parts)


ExpectedChild = tuple[str, str, float | None, int, str | None]
"""What an accepted task gives its child: task, cwd, time limit, rounds, model."""


def _expected_child(entry: object, parent: Conversation) -> ExpectedChild | None:
    """The child a ``spawn_agents`` task entry must give, or None if it must be refused.

    Refused: anything but an object, a missing, blank or too long (``MAX_TASK_CHARS``)
    ``task``, an unknown field, a
    field of the wrong type (``true`` is no number), a ``cwd`` that leaves the parent's
    by its spelling, a ``timeout`` <= 0, a ``max_iterations`` < 1, an empty ``model``,
    an ``agent`` the parent's catalogue does not define, a ``context`` (its own or its
    definition's) the parent's limits do not offer.
    ``null`` is an absent field. Accepted numbers are capped by the parent's limits.
    """
    if not isinstance(entry, dict) or set(entry) - _TASK_FIELDS:
        return None
    task, cwd, timeout = entry.get("task"), entry.get("cwd"), entry.get("timeout")
    rounds, model = entry.get("max_iterations"), entry.get("model")
    if not (isinstance(task, str) and task.strip()) or len(task) > MAX_TASK_CHARS:
        return None
    where = parent.cwd
    if cwd is not None:
        relative = _relative_cwd(cwd)
        if relative is None:
            return None
        if relative:
            where = relative if parent.cwd == "." else parent.cwd.rstrip("/") + "/" + relative
    if timeout is not None and not (_is_number(timeout) and 0 < timeout < math.inf):
        return None
    if rounds is not None and not (
        isinstance(rounds, int) and not isinstance(rounds, bool) and rounds >= 1
    ):
        return None
    if model is not None and not (isinstance(model, str) and model):
        return None
    modes = parent.limits.context_modes
    if entry.get("context") not in (None, *modes):
        return None  # the context mode is the child's history, not one of these fields
    agent = entry.get("agent")
    definition = None
    if agent is not None:
        # A named agent must be one of the catalogue the tree was created with; its
        # limits and model apply, under the parent's.
        if not (isinstance(agent, str) and agent):
            return None
        definition = find_agent(parent.agents, agent)
        if definition is None:
            return None
        if entry.get("context") is None and definition.context.value not in modes:
            return None  # its definition asks for a mode the limits leave out
    lim = parent.limits
    limit = lim.child_timeout
    if timeout is None:
        seconds = limit
    else:
        seconds = float(timeout) if limit is None else min(float(timeout), limit)
    max_rounds = lim.max_rounds if rounds is None else min(rounds, lim.max_rounds)
    if definition is not None:
        if definition.timeout is not None:
            seconds = definition.timeout if seconds is None else min(seconds, definition.timeout)
        if definition.max_rounds is not None:
            max_rounds = min(max_rounds, definition.max_rounds)
    return (
        task,
        where,
        seconds,
        max_rounds,
        model or (definition.model if definition is not None else None) or parent.model,
    )


def _spawn_tasks(call: ToolCall) -> list[Any] | None:
    """The task entries of a ``spawn_agents`` call, or None if its arguments are no
    object holding a non-empty ``tasks`` list of finite JSON."""
    if _json_non_finite(call.arguments_json):
        return None
    try:
        arguments = json.loads(call.arguments_json)
    except (ValueError, RecursionError):
        return None
    tasks = arguments.get("tasks") if isinstance(arguments, dict) else None
    return tasks if isinstance(tasks, list) and tasks else None


def _check_spawn_tasks(state: Conversation, open_calls: tuple[ToolCall, ...]) -> None:
    """Each ``spawn_agents`` call of the round accepted exactly its valid tasks (up to
    ``max_tasks_per_call``), in order, each as the task asked within the parent's
    limits, and refused the rest; a call answered by an error accepted none."""
    phase = state.phase
    if not isinstance(phase, _ROUND):
        return
    children = phase.children
    specs: dict[str, list[ChildSpec]] = {}
    for spec in [p.spec for p in children.pending] + [f.spec for f in children.finished]:
        specs.setdefault(spec.spawn_call_id, []).append(spec)
    errors = {
        r.tool_call_id
        for r in phase.results
        if r.name == SPAWN_AGENTS and r.is_error and not r.content.startswith("skipped:")
    }
    for call in open_calls:
        if call.name != SPAWN_AGENTS or not (call.id in specs or call.id in errors):
            continue
        tasks = _spawn_tasks(call) if state.offers(SPAWN_AGENTS) else None
        entries = (tasks or [])[: state.limits.max_tasks_per_call]
        expected = [c for c in (_expected_child(e, state) for e in entries) if c is not None]
        got = sorted(specs.get(call.id, []), key=lambda s: int(s.id.rsplit(".", 1)[1]))
        accepted = [(s.task, s.cwd, s.timeout, s.max_rounds, s.model) for s in got]
        rejected = [r for r in children.rejected if r.spawn_call_id == call.id]
        if accepted != expected or (got and len(rejected) != len(tasks or []) - len(got)):
            _fail(
                "a spawn accepts exactly its valid tasks, within the parent's limits",
                f"{call.arguments_json} gave children {accepted} and {len(rejected)} "
                f"refusals, expected {expected}",
                state,
            )


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


# The fields of a sub-agent's ConversationCreated and where its SpawnSubAgent holds
# each (None: the runtime's, not the parent's to decide). A field added to either
# class fails the check until it is placed here.
_CREATED_FROM_SPAWN: dict[str, str | None] = {
    "conversation_id": "child_id",
    "parent_id": "parent_id",
    "root_id": "root_id",
    "depth": "depth",
    "cwd": "cwd",
    "task": "task",
    "system_prompt": "system_prompt",
    "model": "model",
    "limits": "limits",
    "tools": "tools",
    "timeout": "timeout",
    "workdir": None,
    "sub_agent_prompt": "sub_agent_prompt",
    "agents": "agents",
    "agent": "agent",
    "permissions": "permissions",
    "context": "context",
    "wording": "wording",
}


def _check_child_creation(spawn: SpawnSubAgent, after: Conversation) -> None:
    """The child's ConversationCreated carries its SpawnSubAgent field by field, and
    ``start`` makes of it a sub-agent that keeps every invariant."""
    created = spawn.created_event()
    names = [f.name for f in attrs.fields(ConversationCreated)]
    spawn_fields = {f.name for f in attrs.fields(SpawnSubAgent)} - {"max_rounds"}
    placed = {source for source in _CREATED_FROM_SPAWN.values() if source is not None}
    if set(names) != set(_CREATED_FROM_SPAWN) or placed != spawn_fields:
        _fail(
            "a child is created from its SpawnSubAgent, field by field",
            f"unplaced fields: {sorted(set(names) ^ set(_CREATED_FROM_SPAWN))} / "
            f"{sorted(placed ^ spawn_fields)}",
            after,
        )
    for name in names:
        source = _CREATED_FROM_SPAWN[name]
        value = None if source is None else getattr(spawn, source)
        if getattr(created, name) != value:
            _fail(
                "a child is created from its SpawnSubAgent, field by field",
                f"{name} is {getattr(created, name)!r}, the spawn says {value!r}",
                after,
            )
    state, effects = start(created)
    check_start(created, state, effects)


# --------------------------------------------------------------------------- start


def check_start(
    created: ConversationCreated | ConversationForked, state: Conversation, effects: Effects
) -> None:
    """Assert what ``start(created)`` must produce, and the first state's invariants."""
    check_invariants(state)
    if state.id != created.conversation_id:
        _fail("identity", "id differs", state)
    if isinstance(created, ConversationForked):
        source = created.state
        # A root at rest becomes a tree of its own; any other conversation is forked
        # with its tree, its state already under the fork's ids (see DESIGN, "Time
        # travel"), and starts exactly as it was.
        same = (
            attrs.evolve(source, id=state.id, root_id=state.id, written_off=())
            if source.parent_id is None and isinstance(source.phase, Idle | Error)
            else source
        )
        if state != same or effects != ():
            _fail("a fork starts where its source was", f"effects {effects}", state)
        return
    _check_finite(state, effects)
    _check_created_as_told(created, state)
    if state.next_call != sum(1 for e in effects if _issued(e) is not None):
        _fail("numbers", f"next_call {state.next_call} for effects {effects}", state)
    if not state.is_sub_agent:
        if not (isinstance(state.phase, Idle) and effects == () and state.history == ()):
            _fail("a root starts Idle", f"effects {effects}", state)
        return
    if state.history != (*created.context, UserMessage(created.task or "")):
        _fail("a sub-agent starts on its task", f"history {state.history}", state)
    kinds = [type(e).__name__ for e in effects]
    if _workdir_refused(created):
        if not (
            isinstance(state.phase, Failed)
            and state.phase.kind == ErrorKind.INVALID_CWD
            and kinds == ["NotifyParent", "TurnFinished"]
        ):
            _fail(
                "a sub-agent never works outside its parent's directory",
                f"{created.workdir} led to effects {kinds}",
                state,
            )
        return
    expected = ["StartTimer", "CallModel"] if created.timeout is not None else ["CallModel"]
    if kinds != expected:
        _fail("a sub-agent starts at once", f"effects {kinds}", state)
    first = LlmRequesting(call=state.next_call - 1, attempt=1, grace=False)
    # Context mode full: what the parent had said before the spawning call, then the task.
    request = ModelRequest(
        created.system_prompt,
        (*created.context, UserMessage(created.task or "")),
        state.tools,
        created.model,
    )
    if not (
        state.phase == first
        and effects[-1] == CallModel(first.call, 1)
        and state.rounds == 1
        and model_request(state) == request
    ):
        _fail(
            "a sub-agent's first model call asks its task of its model",
            f"{state.phase}, {effects}, rounds {state.rounds}",
            state,
        )
    if created.timeout is not None and effects[0] != StartTimer(
        0, created.timeout, "time limit", counts_downtime=True
    ):
        _fail("a sub-agent's own time limit starts with it", f"{effects[0]}", state)
    _check_timers_say_if_downtime_counts(state, effects)
    _check_no_duplicate_numbers(state, effects, 0)


def _check_created_as_told(created: ConversationCreated, state: Conversation) -> None:
    """Everything the creation event says is kept: a root at depth 0 and a sub-agent at
    depth >= 1 (with a task), its task, directory, prompts, model, limits, time limit,
    agent, agent definitions, permissions, and the ordinary tools it was offered, in
    order."""
    if (created.parent_id is None) != (created.depth == 0) or created.depth < 0:
        _fail("a root at depth 0, a sub-agent deeper", f"depth {created.depth}", state)
    told = {
        "parent_id": created.parent_id,
        "root_id": created.root_id or created.conversation_id,
        "depth": created.depth,
        "cwd": created.cwd,
        "task": created.task,
        "system_prompt": created.system_prompt,
        "sub_agent_prompt": created.sub_agent_prompt,
        "model": created.model,
        "limits": created.limits,
        "timeout": created.timeout,
        "agent": created.agent,
        "agents": created.agents,
        "permissions": created.permissions,
        "wording": created.wording,
    }
    for name, value in told.items():
        if getattr(state, name) != value:
            _fail(
                "a conversation starts as created",
                f"{name} is {getattr(state, name)!r}, created with {value!r}",
                state,
            )
    # The control tools are the reducer's own: a runtime offering one is ignored.
    ordinary = tuple(t for t in state.tools if t.name not in CONTROL_TOOLS)
    if ordinary != tuple(t for t in created.tools if t.name not in CONTROL_TOOLS):
        _fail("a conversation starts as created", f"tools {ordinary} for {created.tools}", state)
    if state.usage != Usage() or state.usage_children or state.spawned or state.written_off:
        _fail("a conversation starts afresh", "counters not zero", state)


def _workdir_refused(created: ConversationCreated) -> bool:
    """Whether the runtime's findings put a sub-agent's directory outside its parent's
    or the project, or found no directory there."""
    found = created.workdir
    if found is None or created.parent_id is None:
        return False

    def inside(path: str, directory: str) -> bool:
        return path == directory or path.startswith(directory.rstrip("/") + "/")

    return not (
        inside(found.resolved, found.project)
        and inside(found.resolved, found.parent)
        and found.is_directory
    )


# --------------------------------------------------------------------------- transitions


def _issued(effect: Effect) -> int | None:
    """The number an effect asks to be answered with, if any."""
    match effect:
        case CallModel(call=n) | RunTool(call=n) | ScheduleRetry(timer=n) | StartTimer(timer=n):
            return n
        case RequestApproval(call=n) | AskUser(call=n):
            return n
    return None


def _event_number(event: Event) -> int | None:
    match event:
        case (
            ModelReplied(call=n) | ModelFailed(call=n) | ToolFinished(call=n) | TimerFired(timer=n)
        ):
            return n
    return None


def _check_no_duplicate_numbers(state: Conversation, effects: Effects, first_fresh: int) -> None:
    fresh = sorted(n for e in effects if (n := _issued(e)) is not None and n >= first_fresh)
    if fresh != list(range(first_fresh, state.next_call)):
        _fail(
            "fresh numbers issued once each",
            f"numbers {fresh} issued, expected {first_fresh}..{state.next_call - 1}",
            state,
        )


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


def _check_timers_say_if_downtime_counts(after: Conversation, effects: Effects) -> None:
    """Only the conversation's own time limit (and an approval timeout) counts
    downtime after a restart."""
    for effect in effects:
        if isinstance(effect, StartTimer):
            own = effect.timer == after.deadline_timer
            phase = after.phase
            # An approval timeout is a person's wall-clock time: a decision can be
            # written while no runtime runs (issue 35).
            if isinstance(phase, ToolExecuting) and phase.asking is not None:
                own = own or effect.timer == phase.asking.timer
            if effect.counts_downtime != own:
                _fail(
                    "StartTimer says whether downtime counts",
                    f"{effect} (own time limit: {own})",
                    after,
                )


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


def _check_summary_call(after: Conversation, summary: Summary, calls: list[CallModel]) -> None:
    for effect in calls:
        if not (effect.call == summary.call and effect.attempt == summary.attempt):
            _fail("CallModel is awaited", f"{effect} for {summary}", after)
        request = model_request(after)
        messages = request.messages
        # The parent's conversation as plain turns: its user messages in order, tool
        # calls and results written as text (no tool blocks: no tools are offered).
        asked = [
            m.text
            for m in messages[:-1]
            if isinstance(m, UserMessage) and not m.text.startswith("[result of ")
        ]
        said = [m.text for m in after.history if isinstance(m, UserMessage)]
        if not (
            messages
            and isinstance(messages[-1], UserMessage)
            and asked == said
            and not any(isinstance(m, ToolResultMessage) for m in messages)
            and not any(isinstance(m, AssistantMessage) and m.tool_calls for m in messages)
            and request.tools == ()
            and request.system == after.system_prompt
            and request.model == after.model
        ):
            _fail("a summary call sees the parent's conversation, no tools", f"{request}", after)


def _started(children: Children | None) -> set[str]:
    if children is None:
        return set()
    return {p.spec.id for p in children.pending if p.started}


def _check_spawns(
    before: Conversation,
    event: Event,
    after: Conversation,
    effects: Effects,
    *,
    restarted: bool = False,
) -> None:
    spawns = [e for e in effects if isinstance(e, SpawnSubAgent)]
    ids = [e.child_id for e in spawns]
    if len(set(ids)) != len(ids):
        _fail("spawn each child once", f"{ids}", after)
    after_children = after.children
    specs = {}
    if after_children is not None:
        specs = {p.spec.id: p.spec for p in after_children.pending}
    started_before, started_after = _started(before.children), _started(after_children)
    for spawn in spawns:
        _check_within_parent_limits(before.limits, spawn, after)
        _check_child_creation(spawn, after)
        if not (spawn.depth == before.depth + 1 <= before.limits.max_depth):
            _fail(
                "depth limit",
                f"SpawnSubAgent depth {spawn.depth} from depth {before.depth}, max_depth "
                f"{before.limits.max_depth}",
                after,
            )
        if spawn.child_id not in started_after:
            _fail(
                "spawned children are running",
                f"{spawn.child_id} not running after the step",
                after,
            )
        spec = specs[spawn.child_id]
        if not (
            spawn.parent_id == after.id
            and spawn.root_id == after.root_id
            and _told_earlier_steps(spawn, spec, after_children)
            and spawn.cwd == spec.cwd
            and spawn.timeout == spec.timeout
            and spawn.max_rounds == spec.max_rounds == spawn.limits.max_rounds
            and not any(t.name in CONTROL_TOOLS for t in spawn.tools)
        ):
            _fail("SpawnSubAgent matches the accepted task", f"{spawn} for {spec}", after)
    budget = before.limits.max_tokens
    for spawn in spawns:
        pending = after_children.find_pending(spawn.child_id) if after_children else None
        given = pending.budget if pending is not None else None
        cap = _definition_of(after, spawn)
        if budget is None and spawn.limits.max_tokens != (cap and cap.max_tokens):
            _fail(
                "no budget, no shares (but an agent definition's own budget)",
                f"{spawn.child_id} got {spawn.limits.max_tokens}",
                after,
            )
        if budget is not None and not (given is not None and 0 < given == spawn.limits.max_tokens):
            _fail(
                "a child of a budgeted parent runs on its share",
                f"{spawn.child_id}: share {given}, limits {spawn.limits.max_tokens}",
                after,
            )
    newly = started_after - started_before
    shares = after_children.reserved if after_children is not None else 0
    if newly and budget is not None and shares + after.tokens_spent > budget:
        _fail(
            "token shares never add up to more than the budget",
            f"{shares} set aside + {after.tokens_spent} spent > {budget}",
            after,
        )
    expected = newly | (
        started_before & started_after if restarted or isinstance(event, RuntimeResumed) else set()
    )
    if set(ids) != expected:
        _fail(
            "exactly the newly started children are spawned",
            f"spawned {sorted(ids)}, newly started {sorted(newly)}",
            after,
        )


def _check_within_parent_limits(parent: Limits, spawn: SpawnSubAgent, after: Conversation) -> None:
    """Nothing a model asks for in a task lifts a child above its parent's limits: its
    rounds, time limit and token budget are at most the parent's, the rest inherited."""
    problems = []
    if not (
        1 <= spawn.max_rounds <= parent.max_rounds and spawn.limits.max_rounds <= parent.max_rounds
    ):
        problems.append(
            f"max_rounds {spawn.max_rounds} (limits {spawn.limits.max_rounds}), "
            f"parent's {parent.max_rounds}"
        )
    cap = parent.child_timeout
    timeout = spawn.timeout
    if timeout is not None and not (0 < timeout <= (math.inf if cap is None else cap)):
        problems.append(f"timeout {timeout}, parent's child_timeout {cap}")
    if cap is not None and timeout is None:
        problems.append(f"no time limit, parent's child_timeout {cap}")
    tokens = spawn.limits.max_tokens
    if parent.max_tokens is not None and not (tokens is not None and tokens <= parent.max_tokens):
        problems.append(f"max_tokens {tokens}, parent's {parent.max_tokens}")
    definition = _definition_of(after, spawn)
    inherited = attrs.evolve(
        spawn.limits, max_rounds=parent.max_rounds, max_tokens=parent.max_tokens
    )
    if definition is not None and not definition.may_delegate:
        # An agent that may not delegate lives at its own max_depth.
        if spawn.limits.max_depth != min(parent.max_depth, spawn.depth):
            problems.append(f"max_depth {spawn.limits.max_depth} of a non-delegating agent")
        inherited = attrs.evolve(inherited, max_depth=parent.max_depth)
    if inherited != parent:
        problems.append(f"limits {spawn.limits} are not the parent's {parent}")
    if not _lexically_inside(spawn.cwd, after.cwd):
        problems.append(f"cwd {spawn.cwd!r} is not inside the parent's {after.cwd!r}")
    # The child is told the sub-agent prompt (its role), passed on down the tree; a
    # parent without one (logs before schema 6) passes its own system prompt.
    told = after.system_prompt if after.sub_agent_prompt is None else after.sub_agent_prompt
    if definition is not None:
        told = definition.system_prompt(told)
    _check_child_permissions(after, spawn, problems)
    problem = _context_problem(spawn, after)
    if problem is not None:
        problems.append(problem)
    if (spawn.system_prompt, spawn.sub_agent_prompt) != (told, after.sub_agent_prompt):
        problems.append(
            f"system prompt {spawn.system_prompt!r} / {spawn.sub_agent_prompt!r}, "
            f"expected {told!r} / {after.sub_agent_prompt!r}"
        )
    if spawn.wording != after.wording:  # the texts it is told are worded as its parent's
        problems.append(f"wording {spawn.wording}, the parent's is {after.wording}")
    if problems:
        _fail(
            "a child never exceeds its parent's limits",
            f"{spawn.child_id}: " + "; ".join(problems),
            after,
        )


def _definition_of(parent: Conversation, spawn: SpawnSubAgent) -> AgentDefinition | None:
    if spawn.agent is None:
        return None
    found = find_agent(parent.agents, spawn.agent)
    if found is None:
        _fail("a child's agent is one of its parent's", f"unknown {spawn.agent!r}", parent)
    return found


def _context_problem(spawn: SpawnSubAgent, after: Conversation) -> str | None:
    """What is wrong with a child's context for its context mode, if anything."""
    children = after.children
    spec = None if children is None else children.find_pending(spawn.child_id)
    mode = None if spec is None else spec.spec.context
    if mode == "summary":
        summary = None if children is None else children.summary
        if summary is None or summary.text is None:
            return "it was started before its summary was made"
        if spawn.context != (UserMessage(SUMMARY_HEADER + summary.text),):
            return "its context is not the round's summary"
        return None
    if mode == "full":
        if not _from_parents_history(spawn.context, after.history):
            return "its context is not its parent's history (and reply text)"
        return None
    return None if spawn.context == () else "a task_only child was given a context"


def _from_parents_history(context: tuple[Message, ...], history: tuple[Message, ...]) -> bool:
    """A child's context (mode full) is a prefix of its parent's history, possibly
    followed by the text of the spawning reply without its tool calls; every tool call
    in it has its result in it (the spawning call, whose result does not exist yet,
    never is)."""
    answered = {m.result.tool_call_id for m in context if isinstance(m, ToolResultMessage)}
    for message in context:
        if isinstance(message, AssistantMessage) and any(
            call.id not in answered for call in message.tool_calls
        ):
            return False
    n = len(context)
    if context == history[:n]:
        return True
    last = context[-1]
    return (
        context[:-1] == history[: n - 1]
        and isinstance(last, AssistantMessage)
        and not last.tool_calls
    )


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


def _check_child_permissions(
    parent: Conversation, spawn: SpawnSubAgent, problems: list[str]
) -> None:
    """A child never holds what its parent lacks: its permission layers extend its
    parent's, and its tools are among its parent's, but for its definition's own tools
    (an agent-scoped MCP server's, ``AgentDefinition.own_tools``)."""
    parent_layers = () if parent.permissions is None else parent.permissions.layers
    layers = () if spawn.permissions is None else spawn.permissions.layers
    if layers[: len(parent_layers)] != parent_layers:
        problems.append(f"permissions {spawn.permissions} do not extend {parent.permissions}")
    offered = {t.name for t in parent.tools}
    definition = next((a for a in parent.agents if a.name == spawn.agent), None)
    if definition is not None:
        offered |= {t.name for t in definition.own_tools}
    extra = sorted(t.name for t in spawn.tools if t.name not in offered)
    if extra:
        problems.append(f"tools {extra} its parent lacks")
    # The catalogue of agent definitions goes down, whole, exactly to a child that may
    # spawn (named an agent or not).
    catalogue = parent.agents if spawn.depth + 1 <= spawn.limits.max_depth else ()
    if spawn.agents != catalogue:
        problems.append(f"agents {[a.name for a in spawn.agents]}, expected the parent's")


def _lexically_inside(cwd: str, parent: str) -> bool:
    """Whether ``cwd`` names ``parent`` or a directory below it, by its spelling alone:
    no ``..``, ``.`` or empty component, no control character, no backslash."""
    if cwd == parent:
        return True
    if parent == ".":
        rest = cwd
    else:
        head = parent.rstrip("/") + "/"
        if not cwd.startswith(head):
            return False
        rest = cwd[len(head) :]
    parts = rest.split("/")
    return (
        all(part not in ("", ".", "..") for part in parts)
        and "\\" not in rest
        and not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in rest)
    )


_EARLIER_STEPS = "\n\nThe earlier steps of this sequence and their outcomes:\n"


def _told_earlier_steps(spawn: SpawnSubAgent, spec: ChildSpec, children: Children | None) -> bool:
    """A child is given its task; a later step of a sequential call also the outcomes
    of the earlier steps of its own call, in order (all finished before it started, so
    a re-issued step is told the same)."""
    earlier = []
    sequential = spec.mode is not None and spec.mode.mode is Mode.SEQUENTIAL
    if sequential and children is not None:
        earlier = sorted(
            (
                done
                for done in children.finished
                if done.spec.spawn_call_id == spec.spawn_call_id
                and spawn_order(done.spec.id) < spawn_order(spec.id)
            ),
            key=lambda done: spawn_order(done.spec.id),
        )
    if not earlier:
        return spawn.task == spec.task
    if not spawn.task.startswith(spec.task + _EARLIER_STEPS):
        return False
    expected: list[dict[str, str]] = []
    for done in earlier:
        outcome = done.outcome
        entry = {"task": done.spec.task}
        if isinstance(outcome, ChildSucceeded):
            entry.update(status="completed", result=outcome.result)
        else:
            entry.update(status="failed", error=outcome.error, kind=outcome.kind.value)
        expected.append(entry)
    try:
        told = json.loads(spawn.task[len(spec.task + _EARLIER_STEPS) :])
    except ValueError:
        return False
    return bool(told == expected)


def _pending_specs(before: Conversation, ids: tuple[str, ...]) -> list[ChildSpec]:
    """The specs of ``before``'s pending children ``ids`` (they may have left the
    children of the state after, flushed into its history)."""
    children = before.children
    pending = () if children is None else children.pending
    return [p.spec for p in pending if p.spec.id in ids]


def _check_cancels(before: Conversation, after: Conversation, effects: Effects) -> None:
    cancels = [e for e in effects if isinstance(e, CancelSubAgents)]
    running = _started(before.children) | _started(after.children)
    new_written_off = set(after.written_off[len(before.written_off) :])
    for cancel in cancels:
        if not (bool(cancel.ids) and set(cancel.ids) <= running):
            _fail(
                "cancel only running children", f"{cancel} while running {sorted(running)}", after
            )
        if cancel.reason is CancelReason.TIMEOUT:
            if not (set(cancel.ids) <= new_written_off):
                _fail("a child past its deadline is written off", f"{cancel}", after)
        elif set(cancel.ids) <= new_written_off:
            # A race whose quorum was reached writes its other running children off
            # and tells them to cancel, without waiting (fanfold.statemachine.modes).
            if not all(
                spec.mode is not None and spec.mode.mode is Mode.RACE
                for spec in _pending_specs(before, cancel.ids)
            ):
                _fail("only a race's quorum writes running children off", f"{cancel}", after)
        else:
            phase = after.phase
            if not (
                isinstance(phase, CancellingSubAgents)
                and set(cancel.ids) == set(phase.children.pending_ids())
            ):
                _fail("a cancel reaches every pending child", f"{cancel}", after)
    phase = after.phase
    entered = isinstance(phase, CancellingSubAgents) and not isinstance(
        before.phase, CancellingSubAgents
    )
    if entered:
        assert isinstance(phase, CancellingSubAgents)
        told = any(
            isinstance(e, CancelSubAgents) and e.reason is CancelReason.PARENT for e in effects
        )
        bounded = any(isinstance(e, StartTimer) and e.timer == phase.grace_timer for e in effects)
        if not (told and bounded):
            _fail(
                "cancelling tells every running child and bounds the wait",
                f"effects {effects}",
                after,
            )


def _fan_in_entries(content: str) -> list[dict[str, Any]]:
    try:
        payload = json.loads(content)
    except ValueError:
        return []
    if not isinstance(payload, dict):
        return []
    entries = payload.get("sub_agent_results", [])
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _check_fan_in(before: Conversation, event: Event, after: Conversation) -> None:
    cb, ca = before.children, after.children
    if cb is None:
        return
    if ca is not None:
        if ca.finished[: len(cb.finished)] != cb.finished:
            _fail(
                "fan-in conservation: finished only grows",
                f"{[f.spec.id for f in cb.finished]} -> {[f.spec.id for f in ca.finished]}",
                after,
            )
        before_ids = set(cb.pending_ids()) | {f.spec.id for f in cb.finished}
        after_pending = set(ca.pending_ids())
        after_ids = after_pending | {f.spec.id for f in ca.finished}
        new_ids = {f"{after.id}.{k}" for k in range(before.spawned + 1, after.spawned + 1)}
        if not (before_ids <= after_ids and after_pending <= set(cb.pending_ids()) | new_ids):
            _fail(
                "fan-in conservation: pending only shrinks",
                f"pending {cb.pending_ids()} -> {ca.pending_ids()}",
                after,
            )
        return
    # The round ended: each spawn_agents call got one result listing its children.
    new = after.history[len(before.history) :]
    results = {m.result.tool_call_id: m.result for m in new if isinstance(m, ToolResultMessage)}
    known = {f.spec.id: f.outcome for f in cb.finished}
    if isinstance(event, SubAgentFinished) and event.child_id not in before.written_off:
        known[event.child_id] = event.outcome
    by_call: dict[str, list[str]] = {}
    for spec in [p.spec for p in cb.pending] + [f.spec for f in cb.finished]:
        by_call.setdefault(spec.spawn_call_id, []).append(spec.id)
    cap = after.limits.child_result_cap
    for call_id, child_ids in by_call.items():
        if call_id not in results:
            _fail(
                "every tool call gets exactly one result",
                f"spawn_agents call {call_id!r} got no result",
                after,
            )
        entries = _fan_in_entries(results[call_id].content)
        listed = [e.get("agent_id") for e in entries]
        in_spawn_order = sorted(child_ids, key=lambda c: int(c.rsplit(".", 1)[1]))
        if listed != in_spawn_order:
            _fail(
                "exactly one outcome per child reaches the parent, in spawn order",
                f"fan-in of {call_id!r} lists {listed}, children are {in_spawn_order}",
                after,
            )
        for entry in entries:
            outcome = known.get(str(entry.get("agent_id")))
            if outcome is not None and not _entry_matches(entry, outcome, cap):
                _fail("the fan-in reports each child's outcome", f"{entry} for {outcome}", after)


def _entry_matches(entry: dict[str, Any], outcome: ChildOutcome, cap: int) -> bool:
    def capped(shown: object, text: str) -> bool:
        if not isinstance(shown, str):
            return False
        return shown == text if len(text) <= cap else shown.startswith(text[:cap])

    match outcome:
        case ChildSucceeded(result=result, submitted=submitted, truncated=truncated):
            status = "completed" if submitted else "completed_without_submit"
            status = "completed_truncated" if truncated else status
            return entry.get("status") == status and capped(entry.get("result"), result)
        case ChildFailed(error=error, kind=kind):
            return (
                entry.get("status") == "failed"
                and entry.get("error_kind") == kind
                and capped(entry.get("error"), error)
            )
    return False  # pragma: no cover


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


def _check_summary_result(
    before: Conversation,
    event: ModelReplied | ModelFailed,
    after: Conversation,
    effects: Effects,
    summary: Summary,
) -> None:
    """The summary call answered: its tokens count, the history is untouched (a
    summary is no round), and the summary is made from a text, retried, or failed."""
    usage = event.reply.usage if isinstance(event, ModelReplied) else event.error.usage
    # (It is no round: only the next model call, once its round ends, takes one.)
    ended = isinstance(after.phase, LlmRequesting)
    if after.usage != before.usage + usage or (after.rounds != before.rounds and not ended):
        _fail("a summary call's tokens count, and it is no round", f"{after.usage}", after)
    if after.history[: len(before.history)] != before.history:
        _fail("a summary call leaves the history alone", "history changed", after)
    children = after.children
    made = children.summary if children is not None else None
    if isinstance(event, ModelReplied):
        reply = event.reply
        good = reply.stop_reason != STOP_REFUSAL and reply.text.strip()
        cut = reply.stop_reason == STOP_MAX_TOKENS
        if (
            good
            and made is not None
            and not (
                made.text == reply.text
                or (cut and made.text is not None and made.text.startswith(reply.text + "\n["))
            )
        ):
            _fail(
                "a summary is the reply's text (marked when cut off)",
                f"{made} for {reply.text!r}",
                after,
            )
        if not good and made is not None and made.error is None:
            _fail("a refused or empty summary is a failure", f"{made}", after)
        if not good:
            for spawn in (e for e in effects if isinstance(e, SpawnSubAgent)):
                first = spawn.context[0] if spawn.context else None
                if isinstance(first, UserMessage) and first.text.startswith(SUMMARY_HEADER):
                    _fail("no child starts without its summary", spawn.child_id, after)
        return
    error = event.error
    # A billed failure that leaves nothing of the budget for another attempt ends
    # the summary budget_exhausted, as it ends a conversation's own call.
    budget = before.limits.max_tokens
    reserved = before.children.reserved if before.children is not None else 0
    over = (
        budget is not None and error.usage.total > 0 and budget - after.tokens_spent - reserved <= 0
    )
    if over and made is not None and made.kind is not ErrorKind.BUDGET_EXHAUSTED:
        _fail(
            "a summary is not retried once a billed failure spent the budget",
            f"{error.kind} at attempt {summary.attempt} -> {made}",
            after,
        )
    retry = error.kind.retryable and summary.attempt < before.limits.max_attempts and not over
    if retry != (made is not None and made.timer is not None):
        _fail(
            "a summary's retryable failures are retried up to max_attempts",
            f"{error.kind} at attempt {summary.attempt} -> {made}",
            after,
        )
    if made is not None and made.timer is not None and made.attempt != summary.attempt + 1:
        _fail("attempts count up by one", f"{summary} -> {made}", after)
    if not retry and not over and made is not None and made.kind != error.kind:
        _fail("a failed summary keeps the error's kind", f"{made} for {error.kind}", after)


def _check_cancel_ending(before: Conversation, after: Conversation, reason: CancelReason) -> None:
    phase = after.phase
    if isinstance(phase, CancellingSubAgents):
        ending = phase.ending
    elif isinstance(phase, Idle):
        ending = EndIdle()
    elif isinstance(phase, Failed):
        ending = EndFailed(phase.error, phase.kind, phase.reason)
    elif isinstance(phase, Error) and not before.is_sub_agent:
        ending = EndFailed(phase.error, phase.kind, reason)
    else:
        _fail("a cancel stops the work", f"ended in {phase}", after)
    if before.is_sub_agent:
        if not (
            isinstance(ending, EndFailed)
            and ending.reason is reason
            and ending.kind == reason.error_kind
        ):
            _fail(
                "a cancelled sub-agent fails with the cancel's reason",
                f"{ending} for {reason}",
                after,
            )
    elif reason is CancelReason.TIMEOUT and before.deadline_timer is not None:
        # Its turn's own time limit ran out: an error, not a user's cancel.
        if not (isinstance(ending, EndFailed) and ending.kind is ErrorKind.TIMED_OUT):
            _fail("a root past its time limit ends its turn in error", f"{ending}", after)
    elif not isinstance(ending, EndIdle):
        _fail("a cancelled root goes Idle", f"{ending}", after)


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


# --------------------------------------------------------------------------- the table

TableStep = tuple[str, str, str]
"""One observed step: ``(phase, event type, outcome)``; the outcome is the phase it led
to, or the name of the exception it raised."""


@attrs.frozen
class TableReport:
    """What a reducer did, cell by cell, against the documented table
    (``fanfold.statemachine.table.TABLE``, rendered in DESIGN.md).

    ``observed``: every step seen; ``unlisted``: steps the table does not list (a rule
    that refuses where the table accepts, or leads where it says nothing leads);
    ``unreached``: targets and refusals the table lists that no step took (a rule that
    leaves a cell out). ``cells()`` says of each (phase, event type) seen whether it
    was handled, raised, or both.
    """

    observed: frozenset[TableStep]
    unlisted: tuple[TableStep, ...]
    unreached: tuple[TableStep, ...]

    def cells(self) -> dict[tuple[str, str], str]:
        """``"handled"``, ``"raises"`` or ``"handled or raises"`` for each cell seen."""
        phases = {phase.__name__ for phase in ALL_PHASES}
        found: dict[tuple[str, str], set[str]] = {}
        for phase, event, outcome in self.observed:
            found.setdefault((phase, event), set()).add(
                "handled" if outcome in phases else "raises"
            )
        return {cell: " or ".join(sorted(kinds)) for cell, kinds in sorted(found.items())}

    @property
    def agrees(self) -> bool:
        return not self.unlisted and not self.unreached

    def __str__(self) -> str:
        lines = [f"{len(self.observed)} steps observed"]
        lines += [f"not in the table: {p} x {e} -> {o}" for p, e, o in self.unlisted]
        lines += [f"listed, never taken: {p} x {e} -> {o}" for p, e, o in self.unreached]
        return "\n".join(lines)


def _table_outcome(reducer: Reducer, state: Conversation, event: Event) -> tuple[str, Any]:
    try:
        after, _ = reducer(state, event)
    except IllegalTransition as error:
        return type(error).__name__, None
    return type(after.phase).__name__, after


def observe_step(
    state: Conversation, event: Event, seen: set[TableStep], transition: Reducer | None = None
) -> Conversation | None:
    """Run one step of ``transition`` (fanfold's by default), add what it did to
    ``seen``, and return the state after it (None if refused). An awaited reply or the
    running tool's result is also tried as the fork edit that stands for it."""
    reducer = _reducer(transition)
    result, after = _table_outcome(reducer, state, event)
    phase = state.phase
    seen.add((type(phase).__name__, type(event).__name__, result))
    mirrored: Event | None = None
    match event:
        case ModelReplied(call=n, reply=reply) if isinstance(phase, LlmRequesting) and (
            phase.call == n
        ):
            mirrored = ForkEdited(ReplyEdit(reply))
        case ToolFinished(call=n, result=tool_result) if isinstance(phase, ToolExecuting) and (
            phase.call == n
        ):
            mirrored = ForkEdited(ToolResultEdit(tool_result))
    if mirrored is not None:
        edited, _ = _table_outcome(reducer, state, mirrored)
        seen.add((type(phase).__name__, "ForkEdited", edited))
    return after if isinstance(after, Conversation) else None


_MCP_PROBE_TOOL = ToolSpec.from_schema("mcp__srv__t", "a server's tool", {"type": "object"})


def _probe_table(state: Conversation, seen: set[TableStep], reducer: Reducer) -> None:
    """Try, without moving on, the events that leave ``state`` rarely: every refusal,
    late results of each kind, outcomes of written-off children, cancels, restarts,
    fork edits."""
    probes: list[Event] = [r.event for r in rejections(state)]
    probes += [CancelRequested(reason) for reason in CancelReason]
    probes.append(RuntimeResumed())
    probes.append(ToolsChanged("srv", (_MCP_PROBE_TOOL,)))  # an MCP server's new tool list
    probes += late_events(state)
    probes += [ForkEdited(SystemPromptEdit("edited")), ForkEdited(TaskEdit("edited task"))]
    probes.append(UserMessaged("hi"))
    probes += _decisions_on(state)
    for event in probes:
        observe_step(state, event, seen, reducer)
    _probe_asking_rounds(state, seen, reducer)


def _decisions_on(state: Conversation) -> list[Event]:
    """Every decision on ``state``'s open request (issue 35), if it has one."""
    phase = state.phase
    if not (isinstance(phase, ToolExecuting) and phase.asking is not None):
        return []
    probes: list[Event] = [
        ApprovalGranted(phase.call),
        ApprovalGranted(phase.call, '{"command":"ls","n":NaN}'),  # refused on the way
        ApprovalDenied(phase.call, "no"),
        UserAnswered(phase.call, "yes"),
    ]
    if phase.asking.timer is not None:
        probes.append(TimerFired(phase.asking.timer))
    return probes


def _probe_asking_rounds(state: Conversation, seen: set[TableStep], reducer: Reducer) -> None:
    """From a model call in flight, rounds whose first call waits for a person and
    whose next calls end the round in each way (another tool, children, a submit with
    and without children running), each decided in every way: the decisions' cells,
    whatever follows them (issue 35)."""
    phase = state.phase
    if not isinstance(phase, LlmRequesting):
        return
    asking = [t.name for t in state.tools if t.needs_approval or t.name == "ask_user"]
    if not asking:
        return
    follow = [
        (ToolCall("p2", "bash", '{"command":"ls"}'),),
        (ToolCall("p2", SPAWN_AGENTS, '{"tasks":[{"task":"t"}]}'),),
        (ToolCall("p2", SUBMIT_RESULT, '{"result":"r"}'),),
        (ToolCall("p2", SUBMIT_ERROR, '{"error":"e"}'),),
        (
            ToolCall("p2", SPAWN_AGENTS, '{"tasks":[{"task":"t"}]}'),
            ToolCall("p3", SUBMIT_RESULT, '{"result":"r"}'),
        ),
    ]
    for name in asking:
        arguments = '{"question":"q?"}' if name == "ask_user" else "{}"
        for after_it in follow:
            first = ToolCall("p1", name, arguments)
            for calls in ((first, *after_it), (*after_it[:1], first, *after_it[1:])):
                reply = ModelReply(tool_calls=calls, stop_reason="tool_use")
                waiting = observe_step(state, ModelReplied(phase.call, reply), seen, reducer)
                if waiting is None:
                    continue
                for event in _decisions_on(waiting):
                    observe_step(waiting, event, seen, reducer)


def table_report(
    transition: Reducer | None = None,
    *,
    walks: int = 200,
    steps: int = 60,
    extra: frozenset[TableStep] | set[TableStep] = frozenset(),
) -> TableReport:
    """Which (phase, event type) cells ``transition`` (the reducer under test, fanfold's
    by default) handles and which it refuses, against the documented table.

    Seeded walks (``walks`` of up to ``steps`` steps, half of them sub-agents, their
    creations drawn as ``conversation_created()`` draws them) try one event of each
    kind the generators make and move on with one accepted, and, in every state, try
    each refusal of
    ``rejections``, the late events of ``late_events``, cancels, restarts, fork edits
    and a user message. Deterministic: the same reducer gives the same report.
    ``extra``: steps observed elsewhere (``observe_step``), added before comparing.
    """
    reducer = _reducer(transition)
    seen: set[TableStep] = set(extra)
    for walk in range(walks):
        dice = _seeded_dice(f"table:{walk}".encode())
        # Half the walks offer tools that wait for a person (issue 35's cells).
        created = _created(dice, walk % 2 == 1, None, asking=walk % 4 >= 2)
        state, _ = start(created)
        for _ in range(steps):
            _probe_table(state, seen, reducer)
            if state.is_terminal:
                break
            makers = dict.fromkeys(_progress_makers(state) + _rare_makers(state, True))
            moved = [observe_step(state, make(dice, state), seen, reducer) for make in makers]
            accepted = [after for after in moved if after is not None]
            if not accepted:
                break
            state = dice.pick(accepted)
    return _compare_table(frozenset(seen))


def _seeded_dice(seed: bytes) -> _Dice:
    """Dice reading a stream of bytes made from ``seed`` (BLAKE2b in counter mode)."""
    counter = iter(range(1 << 62))

    def chunk(_: object) -> bytes:
        block = next(counter).to_bytes(8, "big")
        return hashlib.blake2b(seed + block, digest_size=16).digest()

    return _Dice(chunk)


def _compare_table(observed: frozenset[TableStep]) -> TableReport:
    def allows(phase: str, event: str, outcome: str) -> bool:
        cell = TABLE.get((phase, event))
        return cell is not None and (
            outcome in cell.targets or outcome in {e.__name__ for e in cell.refusals}
        )

    unlisted = tuple(sorted(step for step in observed if not allows(*step)))
    unreached = tuple(
        sorted(
            (phase, event, outcome)
            for (phase, event), cell in TABLE.items()
            for outcome in (*cell.targets, *(e.__name__ for e in cell.refusals))
            if (phase, event, outcome) not in observed
        )
    )
    return TableReport(observed, unlisted, unreached)


def check_table(transition: Reducer | None = None, **options: Any) -> TableReport:
    """Assert that ``table_report(transition, **options)`` agrees with the documented
    table both ways; return the report. A rule you add fails it naming each cell it
    changes: update ``fanfold/statemachine/table.py`` (DESIGN.md, "Adding a
    transition")."""
    report = table_report(transition, **options)
    if not report.agrees:
        raise AssertionError(f"invariant 'the transition table is the reducer's' broken:\n{report}")
    return report
