"""The step checks of sub-agents: a ``SpawnSubAgent`` as the call asked, within its
parent's limits, rules and working directory, its child created field by field; the
cancels, the fan-in of results, a summary's call and result, a cancel's ending.

Called by ``check_transition`` (``fanfold.testing.checks``) on every step.
"""

from __future__ import annotations

import json
import math
from typing import Any

import attrs

from fanfold.statemachine import (
    CONTROL_TOOLS,
    STOP_MAX_TOKENS,
    STOP_REFUSAL,
    AssistantMessage,
    CallModel,
    CancellingSubAgents,
    CancelReason,
    CancelSubAgents,
    ChildFailed,
    ChildOutcome,
    Children,
    ChildSpec,
    ChildSucceeded,
    Conversation,
    ConversationCreated,
    EndFailed,
    EndIdle,
    Error,
    ErrorKind,
    Event,
    Failed,
    Idle,
    Limits,
    LlmRequesting,
    Message,
    ModelFailed,
    ModelReplied,
    RuntimeResumed,
    SpawnSubAgent,
    StartTimer,
    SubAgentFinished,
    ToolResultMessage,
    UserMessage,
    start,
)
from fanfold.statemachine.agent_defs import AgentDefinition, find_agent
from fanfold.statemachine.children import Mode, Summary, spawn_order
from fanfold.statemachine.delegation import SUMMARY_HEADER
from fanfold.statemachine.transition import model_request
from fanfold.testing.invariants import _fail, _lexically_inside, check_start
from fanfold.testing.strategies import Effects

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
