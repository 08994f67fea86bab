"""The trace page's data: a tree's log replayed into rows, marks, steps and a divergence.

Everything here is plain JSON data (dicts, lists, strings, numbers), built from what the
log records: each event's time, the effects it produced and the state the reducer
recomputes. Nothing is run; texts are kept as they are (the page escapes them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from fanfold.db import CodecError, RawLog, Store, ToolProgressRow, UnknownConversation
from fanfold.replay import render
from fanfold.replay.compare import Said, compare, differing_lines
from fanfold.replay.core import replay_log, subtree_logs
from fanfold.replay.errors import ReplayFailure
from fanfold.replay.lineage import lineage
from fanfold.replay.report import Divergence, Finding, ReplayStep
from fanfold.statemachine import (
    AbortCall,
    ApprovalDenied,
    ApprovalGranted,
    AskUser,
    AssistantMessage,
    AwaitingSubAgents,
    CallModel,
    CancellingSubAgents,
    CancelRequested,
    CancelSubAgents,
    ChildFailed,
    ChildOutcome,
    ChildSucceeded,
    Completed,
    Conversation,
    Error,
    ErrorKind,
    Failed,
    ForkEdited,
    Idle,
    ModelFailed,
    ModelReplied,
    RequestApproval,
    RuntimeResumed,
    RunTool,
    ScheduleRetry,
    StartTimer,
    SubAgentFinished,
    TimerFired,
    ToolExecuting,
    ToolFinished,
    ToolResultMessage,
    TurnFinished,
    TurnOutcome,
    UserAnswered,
    UserMessage,
    spawn_order,
)
from fanfold.statemachine.approvals import question_of
from fanfold.statemachine.permissions import mcp_server_of
from fanfold.statemachine.transition import is_summary_call
from fanfold.trace.html import file_name

FORMAT = "fanfold-trace"
VERSION = 1

STATE_TEXT_LIMIT = 4000
"""Strings longer than this are cut in the pretty states of a divergence (the full
texts are in the agents' messages)."""

COMPARE_CONTEXT = 3
"""How many of the items two conversations share are shown before the first one
where they part (the ones before are counted, not repeated)."""


def build_trace(store: Store, conversation_id: str, *, vs: str | None = None) -> dict[str, Any]:
    """The trace of ``conversation_id`` and every sub-agent below it, as JSON data.

    The log is replayed through today's reducer (nothing is executed): the first step
    it does not reproduce is the trace's ``divergence`` (recorded vs recomputed), and a
    damaged log's problems are ``findings`` (the steps before them are still shown).

    ``fork``: where a forked conversation came from (else None). ``compare``: this
    tree beside another, agent by agent (``replay.compare``): ``vs``'s tree if given
    (this tree is then A), else, for a fork whose original is in the store, the
    original (A) beside this fork (B), as ``fanfold diff ORIGINAL FORK``.
    Raises UnknownConversation for an unknown id (``vs`` included).
    """
    logs = subtree_logs(store, conversation_id)
    ordered = _tree_order(logs)
    index = {log.row.id: i for i, log in enumerate(ordered)}
    replayed: list[list[ReplayStep]] = []
    findings: list[Finding] = []
    divergences: list[tuple[Divergence, int]] = []
    whole: dict[str, list[ReplayStep]] = {}  # undamaged, for a comparison to reuse
    for rank, log in enumerate(ordered):
        steps, finding, divergence = _replay(log)
        replayed.append(steps)
        if finding is not None:
            findings.append(finding)
        else:
            whole[log.row.id] = steps
        if divergence is not None:
            divergences.append((divergence, rank))
    times = [s.at for steps in replayed for s in steps]
    t0 = min(times, default=ordered[0].row.created_at)
    t1 = max(times, default=t0)
    # The latest progress of the tool calls in flight (a side table the runtime writes,
    # not the log's facts): shown on a running call's mark only.
    progress = store.progress_of([log.row.id for log in ordered])
    agents = [
        _agent(log, steps, index, t1, progress)
        for log, steps in zip(ordered, replayed, strict=True)
    ]
    for agent in agents:
        parent = agent["parent"]
        if parent is not None:
            agents[parent]["children"].append(agent["index"])
    all_steps = sorted(
        (
            (step.at, step.rowid if step.rowid is not None else -1, rank, step.seq, step)
            for rank, steps in enumerate(replayed)
            for step in steps
        ),
        key=lambda item: item[:4],
    )
    numbers = render.Numbers()  # what an AbortCall stops, a TimerFired was
    step_rows = [_step_row(step, rank, numbers) for _, _, rank, _, step in all_steps]
    first = min(divergences, key=lambda d: (d[0].at, d[1], d[0].seq), default=None)
    diverged: dict[str, Any] | None = None
    if first is not None:
        found, rank = first
        position = next(
            i for i, (_, _, r, seq, _) in enumerate(all_steps) if r == rank and seq == found.seq
        )
        diverged = _divergence(found, rank, position)
    prompts: dict[str, int] = {}
    for agent in agents:
        _relative(agent, t0)
        prompt = agent["system_prompt"]
        agent["system_prompt"] = prompts.setdefault(prompt, len(prompts))
    for row in step_rows:
        row[2] = _at(row[2], t0)
    if diverged is not None:
        diverged["at"] = _at(diverged["at"], t0)
    fork = _fork(store, conversation_id)
    comparison = None
    if vs is not None:
        store.conversation(vs)  # an unknown id is the caller's mistake: raised
        comparison = _compared(store, conversation_id, vs, "a", whole)
    elif fork is not None and fork["source_tree"] is not None:
        comparison = _compared(store, fork["source_tree"], conversation_id, "b", whole)
    return {
        "format": FORMAT,
        "version": VERSION,
        "root": conversation_id,
        "started_at": t0,
        "duration": _at(t1, t0),
        "agents": agents,
        "prompts": list(prompts),
        "steps": step_rows,
        "divergence": diverged,
        "findings": [str(f) for f in findings],
        "fork": fork,
        "compare": comparison,
    }


def _fork(store: Store, conversation_id: str) -> dict[str, Any] | None:
    """Where ``conversation_id`` was forked from: the source conversation and seq, and
    the source's tree (None when that tree is not in this store: an imported fork)."""
    source = lineage(store, store.conversation(conversation_id))
    if source is None:
        return None
    try:
        source_tree: str | None = store.conversation(source.source_id).root_id
    except UnknownConversation:
        source_tree = None
    return {
        "source": source.source_id,
        "seq": source.seq,
        "source_tree": source_tree,
        # The original's page as `fanfold trace` names it, for a file's link (a file
        # name of safe characters only; `fanfold ui` links its own route instead).
        "file": file_name(source_tree) if source_tree is not None else None,
    }


def _compared(
    store: Store, a: str, b: str, this: str, replayed: dict[str, list[ReplayStep]]
) -> dict[str, Any]:
    """``build_comparison``, or what stopped it (a damaged log on either side): the
    page still shows this tree, and says why the two are not side by side."""
    try:
        return build_comparison(store, a, b, this=this, replayed=replayed)
    except (ReplayFailure, CodecError) as exc:
        return {"a": a, "b": b, "this": this, "agents": [], "error": str(exc)}


def build_comparison(
    store: Store,
    a: str,
    b: str,
    *,
    this: str,
    replayed: Mapping[str, Sequence[ReplayStep]] | None = None,
) -> dict[str, Any]:
    """The trees of ``a`` and ``b`` side by side, per agent (matched by place, as
    ``fanfold diff``): where the two conversations part (``replay.compare``), and the
    items from a few before that point on, aligned by index, each pair flagged when
    it differs and each differing item with the lines the other side does not have.
    ``this``: which side ("a" or "b") is the tree the page shows; ``replayed``: its
    conversations' steps, already replayed (``compare``'s).

    Items are ``[seq, kind, text, marked lines or None]``; rows ``[a item, b item,
    differs]`` from index ``from``; a pair that never parts carries no rows (its
    counts say how many items both have).
    """
    agents = []
    for pair in compare(store, a, b, with_items=True, replayed=replayed):
        a_items, b_items = pair.a_items, pair.b_items
        parting = pair.parting.index if pair.parting is not None else None
        if pair.a_id is not None and pair.b_id is not None and parting is None:
            start = max(len(a_items), len(b_items))  # the same throughout: nothing shown
        else:
            start = max(0, (parting or 0) - COMPARE_CONTEXT)
        rows = []
        for index in range(start, max(len(a_items), len(b_items))):
            left = a_items[index] if index < len(a_items) else None
            right = b_items[index] if index < len(b_items) else None
            differs = (
                left is None or right is None or (left.kind, left.key) != (right.kind, right.key)
            )
            if differs:
                left, right = _spread(left), _spread(right)
            marks: tuple[list[int] | None, list[int] | None] = (None, None)
            if differs and left is not None and right is not None:
                marks = differing_lines(left, right)
            rows.append([_said(left, marks[0]), _said(right, marks[1]), differs])
        agents.append(
            {
                "path": pair.path,
                "a": pair.a_id,
                "b": pair.b_id,
                "parting": parting,
                "from": start,
                "a_count": len(a_items),
                "b_count": len(b_items),
                "rows": rows,
            }
        )
    return {
        "a": store.conversation(a).root_id,
        "b": store.conversation(b).root_id,
        "this": this,
        "agents": agents,
        "error": None,
    }


def _spread(item: Said | None) -> Said | None:
    """A tool call's arguments or a tool result that is JSON, one value per line (a
    fan-in result is one line of JSON holding every child's outcome: marked whole,
    it would not say which child differs); other items as they are."""
    if item is None or item.kind not in ("tool_call", "tool_result"):
        return item
    spread = [_json_lines(item.text), _json_lines(item.key)]
    if spread[0] is None or spread[1] is None:
        return item
    return attrs.evolve(item, text=spread[0], key=spread[1])


def _json_lines(text: str) -> str | None:
    """``name {json}`` or ``name: {json}`` with the JSON indented, or None."""
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        return None
    try:
        value = json.loads(text[start:])
        spread = json.dumps(value, indent=1, ensure_ascii=False)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to spread
        return None
    return text[:start].rstrip() + "\n" + spread


def _said(item: Said | None, marked: list[int] | None) -> list[Any] | None:
    return None if item is None else [item.seq, item.kind, item.text, marked]


def _at(when: float, t0: float) -> float:
    """A time as seconds since the trace's first event (to the microsecond)."""
    return round(when - t0, 6)


def _relative(agent: dict[str, Any], t0: float) -> None:
    agent["start"] = _at(agent["start"], t0)
    agent["end"] = _at(agent["end"], t0)
    for mark in agent["marks"]:
        mark["t0"] = _at(mark["t0"], t0)
        mark["t1"] = _at(mark["t1"], t0)
    for outcome in agent["child_outcomes"]:
        outcome["at"] = _at(outcome["at"], t0)
    for request in agent["requests"]:
        request["asked_at"] = _at(request["asked_at"], t0)
        if request["decision"] is not None:
            request["decision"]["at"] = _at(request["decision"]["at"], t0)


def _tree_order(logs: list[RawLog]) -> list[RawLog]:
    """Depth first, each parent's children in the order it spawned them."""
    by_parent: dict[str | None, list[RawLog]] = {}
    ids = {log.row.id for log in logs}
    roots = []
    for log in logs:
        parent = log.row.parent_id
        if parent in ids:
            by_parent.setdefault(parent, []).append(log)
        else:
            roots.append(log)
    ordered: list[RawLog] = []
    stack = list(reversed(roots))
    while stack:
        log = stack.pop()
        ordered.append(log)
        children = sorted(by_parent.get(log.row.id, []), key=lambda c: spawn_order(c.row.id))
        stack.extend(reversed(children))
    return ordered


def _replay(log: RawLog) -> tuple[list[ReplayStep], Finding | None, Divergence | None]:
    steps: list[ReplayStep] = []
    divergence = None
    for outcome in replay_log(log):
        if isinstance(outcome, Finding):
            return steps, outcome, divergence
        if divergence is None and not outcome.matches:
            divergence = Divergence.of(outcome)
        steps.append(outcome)
    return steps, None, divergence


def _usage(reply_usage: Any) -> dict[str, int]:
    return {
        "input": reply_usage.input_tokens,
        "output": reply_usage.output_tokens,
        "cached": reply_usage.cached_input_tokens,
    }


def _marks(steps: list[ReplayStep], end: float) -> Iterator[dict[str, Any]]:
    """The intervals and instants of one conversation's timeline.

    Kinds: ``model`` (a model call, ``error`` set when it failed), ``tool`` (a tool
    run), ``retry`` (a back-off before another attempt), ``wait`` (waiting for
    sub-agents), ``cancelling`` (waiting for cancelled sub-agents to acknowledge),
    ``cancel`` (a cancel request, an instant), ``deadline`` (a time limit or deadline
    that fired, an instant), ``resumed`` (the runtime restarted, an instant).
    ``open`` marks were still in flight when the log ends.
    """
    calls: dict[int, dict[str, Any]] = {}
    timers: dict[int, dict[str, Any]] = {}
    phase_mark: dict[str, Any] | None = None
    for step in steps:
        at, event = step.at, step.event
        match event:
            case ModelReplied(call=call, reply=reply) if call in calls:
                mark = calls.pop(call)
                mark.update(
                    t1=at,
                    tokens=_usage(reply.usage),
                    stop=reply.stop_reason,
                    tools=[c.name for c in reply.tool_calls],
                )
                yield mark
            case ModelFailed(call=call, error=error) if call in calls:
                mark = calls.pop(call)
                mark.update(t1=at, error=error.kind.value, message=error.message)
                mark["tokens"] = _usage(error.usage)
                yield mark
            case ToolFinished(call=call, result=result) if call in calls:
                mark = calls.pop(call)
                mark.update(t1=at, error="tool_error" if result.is_error else None)
                yield mark
            case TimerFired(timer=timer) if timer in timers:
                timer_mark = timers.pop(timer)
                if timer_mark["k"] == "retry":
                    timer_mark["t1"] = at
                    yield timer_mark
                else:
                    yield {"k": "deadline", "t0": at, "t1": at, "label": timer_mark["label"]}
            case CancelRequested(reason=reason):
                yield {"k": "cancel", "t0": at, "t1": at, "label": f"cancel ({reason.value})"}
            case RuntimeResumed(forked=True):
                yield {"k": "resumed", "t0": at, "t1": at, "label": "fork went on"}
            case RuntimeResumed():
                yield {"k": "resumed", "t0": at, "t1": at, "label": "runtime resumed"}
            case ForkEdited(edit=edit):
                # A forked conversation went on with a user's edit (issue 24).
                label = f"fork went on, edited ({type(edit).__name__})"
                yield {"k": "resumed", "t0": at, "t1": at, "label": label}
        for effect in step.effects:
            match effect:
                case CallModel(call=call, attempt=attempt):
                    what = (
                        "summary call" if is_summary_call(step.after_state, call) else "model call"
                    )
                    calls[call] = {
                        "k": "model",
                        "t0": at,
                        "label": f"{what} {call}"
                        + (f" (attempt {attempt})" if attempt > 1 else ""),
                        "attempt": attempt,
                    }
                case RunTool(call=call, tool_call=tool_call):
                    server = mcp_server_of(tool_call.name)
                    calls[call] = {
                        "k": "tool",
                        "call": call,
                        "t0": at,
                        "label": f"tool {tool_call.name}"
                        + (f" (MCP server {server})" if server else ""),
                        "tool": tool_call.name,
                        "server": server,
                    }
                case ScheduleRetry(timer=timer, delay=delay, attempt=attempt):
                    failed = step.event if isinstance(step.event, ModelFailed) else None
                    timers[timer] = {
                        "k": "retry",
                        "t0": at,
                        "label": f"retry back-off {delay:g} s before attempt {attempt}",
                        "error": failed.error.kind.value if failed is not None else None,
                    }
                case StartTimer(timer=timer, delay=delay, purpose=purpose):
                    timers[timer] = {"k": "timer", "label": f"{purpose} ({delay:g} s)"}
                case AbortCall(call=call) if call in calls:
                    mark = calls.pop(call)
                    mark.update(t1=at, error="aborted")
                    yield mark
                case AbortCall(call=call) if call in timers:
                    timer_mark = timers.pop(call)
                    if timer_mark["k"] == "retry":
                        timer_mark.update(t1=at, aborted=True)
                        yield timer_mark
                case CancelSubAgents(ids=ids, reason=reason):
                    yield {
                        "k": "cancel",
                        "t0": at,
                        "t1": at,
                        "label": f"cancel {len(ids)} sub-agent(s) ({reason.value})",
                    }
        kind = _waiting(step.after_state)
        if phase_mark is not None and phase_mark["k"] != kind:
            phase_mark["t1"] = at
            yield phase_mark
            phase_mark = None
        if kind is not None and phase_mark is None:
            label = "waiting for sub-agents" if kind == "wait" else "cancelling sub-agents"
            phase_mark = {"k": kind, "t0": at, "label": label}
    for mark in [*calls.values(), *(t for t in timers.values() if t["k"] == "retry")]:
        mark.update(t1=end, open=True)
        yield mark
    if phase_mark is not None:
        phase_mark.update(t1=end, open=True)
        yield phase_mark


def _waiting(state: Conversation) -> str | None:
    match state.phase:
        case AwaitingSubAgents():
            return "wait"
        case CancellingSubAgents():
            return "cancelling"
    return None


def _outcome(state: Conversation | None) -> dict[str, Any]:
    match state.phase if state is not None else None:
        case Completed(result=result):
            return {"status": "completed", "text": result}
        case Failed(error=error, kind=kind, reason=reason):
            status = "cancelled" if kind.value == "cancelled" else "failed"
            return {
                "status": status,
                "kind": kind.value,
                "reason": reason.value if reason is not None else None,
                "text": error,
                **_refusal(kind, error),
            }
        case Error(error=error, kind=kind):
            status = "cancelled" if kind.value == "cancelled" else "error"
            return {"status": status, "kind": kind.value, "text": error, **_refusal(kind, error)}
        case Idle():
            assert state is not None
            answer = next(
                (m.text for m in reversed(state.history) if isinstance(m, AssistantMessage)),
                "",
            )
            return {"status": "idle", "text": answer}
        case None:
            return {"status": "unknown", "text": ""}
    return {"status": "running", "text": ""}


def _refusal(kind: ErrorKind, error: str) -> dict[str, Any]:
    """A refusal's ``category`` (or None) and ``explanation``, for the page to show
    apart from the recorded error text; nothing for other failures."""
    said = render.model_refusal(kind, error)
    return {} if said is None else {"category": said.category, "explanation": said.explanation}


def _child_outcome(child_id: str, outcome: ChildOutcome, at: float) -> dict[str, Any]:
    match outcome:
        case ChildSucceeded(result=result, tokens=tokens, truncated=truncated):
            return {
                "id": child_id,
                "at": at,
                "ok": True,
                "text": result,
                "tokens": tokens,
                "truncated": truncated,
            }
        case ChildFailed(error=error, kind=kind, reason=reason, tokens=tokens):
            return {
                "id": child_id,
                "at": at,
                "ok": False,
                "kind": kind.value,
                "reason": reason.value if reason is not None else None,
                "text": error,
                "tokens": tokens,
                **_refusal(kind, error),
            }
    raise AssertionError(outcome)  # pragma: no cover - ChildOutcome is a closed union


def _messages(state: Conversation | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in state.history if state is not None else ():
        match message:
            case UserMessage(text=text):
                out.append({"role": "user", "text": text})
            case AssistantMessage(text=text, tool_calls=calls, truncated=truncated):
                out.append(
                    {
                        "role": "assistant",
                        "text": text,
                        "truncated": truncated,
                        "calls": [
                            {
                                "id": c.id,
                                "name": c.name,
                                "arguments": c.arguments_json,
                                "server": mcp_server_of(c.name),
                            }
                            for c in calls
                        ],
                    }
                )
            case ToolResultMessage(result=result):
                out.append(
                    {
                        "role": "tool",
                        "id": result.tool_call_id,
                        "name": result.name,
                        "text": result.content,
                        "error": result.is_error,
                    }
                )
    return out


def _agent(
    log: RawLog,
    steps: list[ReplayStep],
    index: dict[str, int],
    trace_end: float,
    progress: Mapping[tuple[str, int], ToolProgressRow],
) -> dict[str, Any]:
    row = log.row
    state = steps[-1].after_state if steps else None
    outcome = _outcome(state)
    turn = _last_turn(steps)
    if outcome["status"] == "idle" and turn is not None:
        # A root at rest: how its last turn ended (a cancelled turn is Idle too).
        if turn.outcome is TurnOutcome.CANCELLED:
            outcome = {"status": "cancelled", "kind": "cancelled", "text": turn.text}
        else:
            outcome = {"status": "idle", "text": turn.text}
    running = outcome["status"] == "running"
    start = steps[0].at if steps else row.created_at
    end = trace_end if running or not steps else steps[-1].at
    child_outcomes = [
        _child_outcome(s.event.child_id, s.event.outcome, s.at)
        for s in steps
        if isinstance(s.event, SubAgentFinished)
    ]
    first = steps[0].after_state if steps else None
    return {
        "index": index[row.id],
        "id": row.id,
        "parent": index.get(row.parent_id) if row.parent_id is not None else None,
        "depth": row.depth,
        "task": row.task or "",
        "status": outcome["status"],
        "outcome": outcome,
        "start": start,
        "end": end,
        "model": state.model if state is not None else None,
        "system_prompt": first.system_prompt if first is not None else "",
        "tokens": {
            "input": state.usage_input if state is not None else 0,
            "output": state.usage_output if state is not None else 0,
            "cached": state.usage_cached if state is not None else 0,
            "subtree": state.tokens_spent if state is not None else 0,
        },
        "rounds": state.rounds if state is not None else 0,
        # The agent definition it was spawned as, and the calls its permissions refused.
        "agent": state.agent if state is not None else None,
        "refused_calls": state.refused_calls if state is not None else 0,
        "marks": sorted(
            _with_progress(_marks(steps, end), row.id, progress), key=lambda m: (m["t0"], m["t1"])
        ),
        "messages": _messages(state),
        "child_outcomes": child_outcomes,
        "requests": _requests(steps, row.id, state),
        "children": [],
    }


def _requests(
    steps: list[ReplayStep], conversation_id: str, state: Conversation | None
) -> list[dict[str, Any]]:
    """The requests for a person's decision this agent made (issue 35), in the order
    asked: the recorded ``RequestApproval``/``AskUser`` effects (a restart re-issues
    one: the same request, kept once) and the decision event that closed each one
    (who, when, edited arguments, the reason or the answer). ``open``: the request
    the final state still holds; a request neither open nor decided was ended by a
    cancel, a deadline or its approval timeout. Texts are kept as they are."""
    found: dict[int, dict[str, Any]] = {}
    for step in steps:
        for effect in step.effects:
            if isinstance(effect, RequestApproval | AskUser) and effect.call not in found:
                question = effect.question if isinstance(effect, AskUser) else None
                found[effect.call] = {
                    "id": f"{conversation_id}:{effect.call}",
                    "call": effect.call,
                    "tool": effect.tool_call.name,
                    "arguments": effect.tool_call.arguments_json,
                    "rule": effect.rule if isinstance(effect, RequestApproval) else "ask_user",
                    "question": question,
                    "choices": list(effect.choices) if isinstance(effect, AskUser) else [],
                    "asked_at": step.at,
                    "open": False,
                    "decision": None,
                }
        event = step.event
        if isinstance(event, ApprovalGranted | ApprovalDenied | UserAnswered):
            entry = found.get(event.call)
            if entry is not None and entry["decision"] is None:
                decision: dict[str, Any] = {"by": event.by, "at": step.at}
                match event:
                    case ApprovalGranted(arguments_json=edited):
                        decision.update(kind="grant", arguments=edited)
                    case ApprovalDenied(reason=reason):
                        decision.update(kind="deny", text=reason)
                    case UserAnswered(text=text):
                        decision.update(kind="answer", text=text)
                entry["decision"] = decision
    if state is not None and isinstance(state.phase, ToolExecuting):
        asking = state.phase.asking
        entry = found.get(state.phase.call)
        if asking is not None and entry is not None:
            entry["open"] = True
            if asking.question and entry["question"] is None:
                asked = question_of(state.phase.current)
                if not isinstance(asked, str):
                    entry["question"], choices = asked
                    entry["choices"] = list(choices)
    return list(found.values())


def _with_progress(
    marks: Iterator[dict[str, Any]],
    conversation_id: str,
    progress: Mapping[tuple[str, int], ToolProgressRow],
) -> Iterator[dict[str, Any]]:
    """``marks``, a tool call still in flight given its latest progress report
    (``progress``: the ``tool_progress`` side table) as ``progress`` and
    ``progress_reports``. Only a call whose ``RunTool`` has no result in the log, and
    only a report made since that call (re)started: a row a killed runtime left is
    shown for no call that ended since, nor for the call ``resume`` issued again. The
    text is the server's: kept as it is here, escaped by the page."""
    for mark in marks:
        if mark["k"] == "tool" and mark.get("open"):
            row = progress.get((conversation_id, mark["call"]))
            if row is not None and row.at >= mark["t0"]:
                mark["progress"] = row.text
                mark["progress_reports"] = row.reports
        yield mark


def _last_turn(steps: list[ReplayStep]) -> TurnFinished | None:
    for step in reversed(steps):
        for effect in step.effects:
            if isinstance(effect, TurnFinished):
                return effect
    return None


def _step_row(step: ReplayStep, rank: int, numbers: render.Numbers) -> list[Any]:
    """``[agent, seq, at, phase after, event, effects, state summary, matches]``;
    ``numbers`` has learnt the numbers issued by the steps before (a conversation's
    own steps come in their order)."""
    cid = step.conversation_id
    event = numbers.describe(cid, step.event, width=60)
    numbers.learn(cid, step.effects)
    return [
        rank,
        step.seq,
        step.at,
        type(step.after_state.phase).__name__,
        event,
        [numbers.describe(cid, e, width=40) for e in step.effects],
        render.summary(step.after_state),
        step.matches,
    ]


def _divergence(found: Divergence, rank: int, position: int) -> dict[str, Any]:
    recorded_state = None
    if found.recorded_state is not None and found.recorded_state != found.after_state:
        recorded_state = render.pretty(found.recorded_state, limit=STATE_TEXT_LIMIT)
    return {
        "agent": rank,
        "step": position,
        "seq": found.seq,
        "at": found.at,
        "headline": found.headline(),
        "event": render.pretty(found.event, limit=STATE_TEXT_LIMIT),
        "notes": list(found.notes),
        "effects_match": found.effects_match,
        "recorded_effects": render.pretty(found.recorded_effects, limit=STATE_TEXT_LIMIT),
        "recomputed_effects": render.pretty(found.recomputed_effects, limit=STATE_TEXT_LIMIT),
        "fingerprint_match": found.fingerprint_matches,
        "fingerprint": render.fingerprint_diff(
            found.recorded_fingerprint, found.recomputed_fingerprint
        )
        if not found.fingerprint_matches
        else [found.recorded_fingerprint],
        "recorded_state": recorded_state,
        "recomputed_state": render.pretty(found.after_state, limit=STATE_TEXT_LIMIT)
        if recorded_state is not None
        else None,
        "before": render.summary(found.before_state) if found.before_state is not None else None,
        "after": render.summary(found.after_state),
        "text": found.diff(),
    }
