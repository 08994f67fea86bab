"""What holds in every reachable state (``check_invariants``) and what ``start`` must
produce (``check_start``): identity, counters, the phase, the open round, the children
and their summaries, finite numbers, fresh numbers in effects.

Each check raises ``AssertionError`` naming the invariant broken (``_fail``).
"""

from __future__ import annotations

import enum
import json
import math
import types
import typing
from typing import Any, NoReturn

import attrs

from fanfold.statemachine import (
    CONTROL_TOOLS,
    SPAWN_AGENTS,
    SUBMIT_ERROR,
    SUBMIT_RESULT,
    AskUser,
    AssistantMessage,
    AwaitingRetry,
    AwaitingSubAgents,
    CallModel,
    CancellingSubAgents,
    Children,
    ChildSpec,
    Completed,
    Conversation,
    ConversationCreated,
    ConversationForked,
    Effect,
    Error,
    ErrorKind,
    Failed,
    Idle,
    LlmRequesting,
    Message,
    ModelRequest,
    RequestApproval,
    RunTool,
    ScheduleRetry,
    StartTimer,
    ToolCall,
    ToolExecuting,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from fanfold.statemachine.agent_defs import find_agent
from fanfold.statemachine.children import PendingChild
from fanfold.statemachine.control_tools import MAX_TASK_CHARS
from fanfold.statemachine.modes import may_start
from fanfold.statemachine.transition import model_request
from fanfold.testing.strategies import Effects, _where, live_numbers

__all__ = ["check_invariants", "check_start"]


def _fail(invariant: str, detail: str, state: Conversation) -> NoReturn:
    raise AssertionError(f"invariant {invariant!r} broken: {detail}{_where(state)}")


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


# ----------------------------------------------------- numbers and timers in effects


def _issued(effect: Effect) -> int | None:
    """The number an effect asks to be answered with, if any."""
    match effect:
        case CallModel(call=n) | RunTool(call=n) | ScheduleRetry(timer=n) | StartTimer(timer=n):
            return n
        case RequestApproval(call=n) | AskUser(call=n):
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
