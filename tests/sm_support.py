"""Helpers of the state-machine tests (``test_sm_*``): build events, take checked steps,
and run a whole tree of conversations in memory (``World``).

Every step taken through ``step`` or ``World`` is checked with
``fanfold.testing.check_transition``, so each example test also checks all invariants.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs
from hypothesis import strategies as st

from fanfold import testing
from fanfold.statemachine import (
    AbortCall,
    CallModel,
    CancelReason,
    CancelRequested,
    CancelSubAgents,
    ChildOutcome,
    ChildSucceeded,
    Conversation,
    ConversationCreated,
    Effect,
    Error,
    Event,
    Idle,
    Limits,
    LlmRequesting,
    ModelError,
    ModelFailed,
    ModelReplied,
    ModelReply,
    NotifyParent,
    RuntimeResumed,
    RunTool,
    ScheduleRetry,
    SpawnSubAgent,
    StartTimer,
    SubAgentFinished,
    TimerFired,
    ToolCall,
    ToolExecuting,
    ToolFinished,
    ToolResult,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessaged,
    start,
    transition,
)
from fanfold.statemachine.delegation import own_messages
from fanfold.testing import check_invariants, check_start, check_transition

E = TypeVar("E")
Effects = tuple[Effect, ...]

BASH = ToolSpec.from_schema("bash", "Run a shell command", {"type": "object"})
READ = ToolSpec.from_schema("read_file", "Read a file", {"type": "object"})
TOOLS = (BASH, READ)


# --------------------------------------------------------------------------- building


def created_root(limits: Limits | None = None, **overrides: Any) -> ConversationCreated:
    fields: dict[str, Any] = {
        "conversation_id": "root",
        "cwd": "/work",
        "system_prompt": "be brief",
        "limits": limits or Limits(),
        "tools": TOOLS,
    }
    fields.update(overrides)
    return ConversationCreated(**fields)


def created_child(
    limits: Limits | None = None, *, timeout: float | None = None, depth: int = 1, **kw: Any
) -> ConversationCreated:
    parent = "root" + ".1" * (depth - 1)
    fields: dict[str, Any] = {
        "conversation_id": parent + ".1",
        "parent_id": parent,
        "root_id": "root",
        "depth": depth,
        "cwd": "/work",
        "task": "count the files",
        "system_prompt": "be brief",
        "limits": limits or Limits(),
        "tools": TOOLS,
        "timeout": timeout,
    }
    fields.update(kw)
    return ConversationCreated(**fields)


def begin(created: ConversationCreated) -> tuple[Conversation, Effects]:
    """``start`` with its checks."""
    state, effects = start(created)
    check_start(created, state, effects)
    return state, effects


def root(limits: Limits | None = None, **overrides: Any) -> Conversation:
    return begin(created_root(limits, **overrides))[0]


def child(limits: Limits | None = None, **kw: Any) -> Conversation:
    return begin(created_child(limits, **kw))[0]


def step(state: Conversation, event: Event) -> tuple[Conversation, Effects]:
    """One transition, checked with every invariant."""
    after, effects = transition(state, event)
    check_transition(state, event, after, effects)
    return after, effects


def steps(state: Conversation, *events: Event) -> Conversation:
    for event in events:
        state, _ = step(state, event)
    return state


def tool(call_id: str, name: str = "bash", **arguments: Any) -> ToolCall:
    return ToolCall.of(call_id, name, arguments or {"command": "ls"})


def spawn(call_id: str, *tasks: str | dict[str, Any]) -> ToolCall:
    entries = [{"task": t} if isinstance(t, str) else t for t in tasks]
    return ToolCall.of(call_id, "spawn_agents", {"tasks": entries})


def submit(call_id: str, result: str) -> ToolCall:
    return ToolCall.of(call_id, "submit_result", {"result": result})


def submit_error(call_id: str, error: str) -> ToolCall:
    return ToolCall.of(call_id, "submit_error", {"error": error})


def call_of(state: Conversation) -> int:
    phase = state.phase
    assert isinstance(phase, LlmRequesting), phase
    return phase.call


def replied(
    state: Conversation, *calls: ToolCall, text: str = "", usage: Usage | None = None
) -> ModelReplied:
    """The model's reply to the call ``state`` awaits."""
    return ModelReplied(call_of(state), ModelReply(text, calls, usage or Usage()))


def failed(state: Conversation, error: ModelError) -> ModelFailed:
    return ModelFailed(call_of(state), error)


def tool_done(state: Conversation, content: str = "ok", is_error: bool = False) -> ToolFinished:
    """The result of the tool ``state`` runs."""
    phase = state.phase
    assert isinstance(phase, ToolExecuting), phase
    current = phase.current
    return ToolFinished(phase.call, ToolResult(current.id, current.name, content, is_error))


def of_type(effects: Effects, kind: type[E]) -> list[E]:
    return [e for e in effects if isinstance(e, kind)]


def only(effects: Effects, kind: type[E]) -> E:
    found = of_type(effects, kind)
    assert len(found) == 1, f"expected one {kind.__name__} in {effects}"
    return found[0]


def fan_in(content: str) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(content)
    return payload


def tool_results(state: Conversation) -> list[ToolResult]:
    return [m.result for m in state.history if isinstance(m, ToolResultMessage)]


# --------------------------------------------------------------------------- world


@attrs.define
class World:
    """A tiny in-memory runtime running a tree of conversations through the reducer.

    Effects become pending work (model calls, tools, timers, mail between parents and
    children); a test picks which piece arrives next and how, so every interleaving
    of results, failures, timeouts, cancels and restarts is reachable. Aborted work
    may still deliver late, as a real runtime's racing results would.
    """

    convs: dict[str, Conversation] = attrs.field(factory=dict)
    models: dict[tuple[str, int], CallModel] = attrs.field(factory=dict)
    tools: dict[tuple[str, int], RunTool] = attrs.field(factory=dict)
    timers: dict[tuple[str, int], StartTimer | ScheduleRetry] = attrs.field(factory=dict)
    mail: list[tuple[str, Event]] = attrs.field(factory=list)
    late: list[tuple[str, Event]] = attrs.field(factory=list)
    notices: Counter[str] = attrs.field(factory=Counter)
    ended: dict[str, Conversation] = attrs.field(factory=dict)
    reported: dict[str, ChildOutcome] = attrs.field(factory=dict)
    steps: int = 0
    # With checked=False only the tree-wide checks run (used to show that they catch
    # bugs on their own, without check_transition after every step).
    checked: bool = True

    @classmethod
    def with_root(cls, limits: Limits, *, checked: bool = True) -> World:
        world = cls(checked=checked)
        state, effects = begin(created_root(limits))
        world.convs[state.id] = state
        world.run(state.id, effects)
        return world

    @property
    def root(self) -> Conversation:
        return self.convs["root"]

    def apply(self, cid: str, event: Event) -> Effects:
        before = self.convs[cid]
        after, effects = transition(before, event)
        if self.checked:
            check_transition(before, event, after, effects)
        self.convs[cid] = after
        self.steps += 1
        if after.is_terminal and cid not in self.ended:
            self.ended[cid] = after
        self.run(cid, effects)
        return effects

    def run(self, cid: str, effects: Effects) -> None:
        for effect in effects:
            match effect:
                case CallModel(call=n):
                    self.models[(cid, n)] = effect
                case RunTool(call=n):
                    self.tools[(cid, n)] = effect
                case ScheduleRetry(timer=n) | StartTimer(timer=n):
                    self.timers[(cid, n)] = effect
                case AbortCall(call=n):
                    self._abort(cid, n)
                case SpawnSubAgent(child_id=child_id):
                    if child_id not in self.convs:  # SpawnSubAgent is idempotent
                        state, more = begin(effect.created_event())
                        self.convs[child_id] = state
                        self.run(child_id, more)
                case NotifyParent(parent_id=parent, child_id=child_id, outcome=outcome):
                    self.notices[child_id] += 1
                    self.mail.append((parent, SubAgentFinished(child_id, outcome)))
                case CancelSubAgents(ids=ids, reason=reason):
                    for child_id in ids:
                        self.mail.append((child_id, CancelRequested(reason)))

    def _abort(self, cid: str, n: int) -> None:
        if (cid, n) in self.models:
            del self.models[(cid, n)]
            self.late.append((cid, ModelReplied(n, ModelReply("too late"))))
        if (cid, n) in self.tools:
            run = self.tools.pop((cid, n))
            result = ToolResult(run.tool_call.id, run.tool_call.name, "too late")
            self.late.append((cid, ToolFinished(n, result)))
        if (cid, n) in self.timers:
            del self.timers[(cid, n)]
            self.late.append((cid, TimerFired(n)))

    # The ways a piece of pending work can arrive. Each removes it from the world.

    def reply(self, key: tuple[str, int], reply: ModelReply) -> None:
        del self.models[key]
        self.apply(key[0], ModelReplied(key[1], reply))

    def fail(self, key: tuple[str, int], error: ModelError) -> None:
        del self.models[key]
        self.apply(key[0], ModelFailed(key[1], error))

    def finish_tool(self, key: tuple[str, int], content: str, is_error: bool = False) -> None:
        run = self.tools.pop(key)
        result = ToolResult(run.tool_call.id, run.tool_call.name, content, is_error)
        self.apply(key[0], ToolFinished(key[1], result))

    def fire(self, key: tuple[str, int]) -> None:
        del self.timers[key]
        self.apply(key[0], TimerFired(key[1]))

    def deliver_mail(self, index: int) -> None:
        cid, event = self.mail.pop(index)
        if isinstance(event, SubAgentFinished) and event.child_id not in (
            self.convs[cid].written_off
        ):
            self.reported[event.child_id] = event.outcome
        self.apply(cid, event)

    def deliver_late(self, index: int) -> None:
        cid, event = self.late.pop(index)
        self.apply(cid, event)

    def restart(self, cid: str) -> None:
        """The runtime restarted: ``cid``'s in-flight work is lost, then it resumes."""
        for pending in (self.models, self.tools, self.timers):
            for key in [k for k in pending if k[0] == cid]:
                del pending[key]
        self.apply(cid, RuntimeResumed())

    def busy(self) -> bool:
        return bool(self.models or self.tools or self.timers or self.mail)

    def drain(self, answer: Callable[[Conversation], ModelReply] | None = None) -> None:
        """Deliver everything pending, plainly, until the whole tree is quiet."""
        for _ in range(10_000):
            if self.mail:
                self.deliver_mail(0)
            elif self.tools:
                self.finish_tool(next(iter(self.tools)), "ok")
            elif self.models:
                key = next(iter(self.models))
                self.reply(key, answer(self.convs[key[0]]) if answer else ModelReply("done"))
            elif self.timers:
                self.fire(min(self.timers, key=lambda k: (k[1], k[0])))
            else:
                return
        raise AssertionError("the world did not quiesce")

    # Checks of the whole tree.

    def children_of(self, parent: str) -> list[str]:
        return [c for c, s in self.convs.items() if s.parent_id == parent]

    def check(self) -> None:
        """Tree-wide invariants that hold after every delivery."""
        for cid, state in self.convs.items():
            check_invariants(state)
            ended = self.ended.get(cid)
            assert ended is None or state == ended, f"{cid} left its terminal phase"
            expected = 1 if state.is_terminal else 0
            assert self.notices[cid] == expected, (
                f"{cid} notified its parent {self.notices[cid]} times, "
                f"phase {type(state.phase).__name__}"
            )
            assert state.parent_id is None or state.depth <= state.limits.max_depth
            live = [
                c
                for c in self.children_of(cid)
                if not self.convs[c].is_terminal and c not in state.written_off
            ]
            # A parent stops waiting for a running child only by writing it off.
            round_children = state.children
            waiting = set(round_children.pending_ids()) if round_children else set()
            assert set(live) <= waiting, f"{cid} left {sorted(set(live) - waiting)} running"
            assert len(live) <= state.limits.max_concurrent, (
                f"{cid} has {len(live)} live children, max_concurrent {state.limits.max_concurrent}"
            )

    def check_quiet(self) -> None:
        """After ``drain``: every child ended, and each child's outcome appears exactly
        once in its parent's history (its spawn_agents call's aggregated result)."""
        assert not self.busy()
        for cid, state in self.convs.items():
            if state.parent_id is None:
                quiet = isinstance(state.phase, Idle | Error)
                assert quiet, f"the root still waits in {state.phase}"
            else:
                assert state.is_terminal, f"{cid} still waits in {state.phase}"
            listed: Counter[str] = Counter()
            # Its own messages: a child of context mode full starts with its
            # parent's conversation, whose fan-in results are not its own.
            for message in own_messages(state.history, state.task, state.is_sub_agent):
                if isinstance(message, ToolResultMessage) and message.result.name == (
                    "spawn_agents"
                ):
                    try:
                        payload = json.loads(message.result.content)
                    except ValueError:
                        continue
                    if isinstance(payload, dict):
                        for entry in payload.get("sub_agent_results", []):
                            listed[entry["agent_id"]] += 1
                            outcome = self.reported.get(entry["agent_id"])
                            if outcome is not None:
                                # The parent got its real outcome, not a stand-in.
                                assert _shows(entry, outcome), f"{entry} for {outcome}"
            # Every child it accepted (spawned, or queued and cancelled before it
            # started) is listed exactly once; every child that ran was accepted.
            accepted = {f"{cid}.{k}" for k in range(1, state.spawned + 1)}
            assert set(listed) == accepted, (
                f"{cid}'s history lists {dict(listed)}, it accepted {sorted(accepted)}"
            )
            assert all(n == 1 for n in listed.values()), f"{cid} lists {dict(listed)}"
            assert set(self.children_of(cid)) <= accepted


def _shows(entry: dict[str, Any], outcome: ChildOutcome) -> bool:
    if isinstance(outcome, ChildSucceeded):
        # The status tells how the child ended: submit_result, or plain text.
        status = "completed" if outcome.submitted else "completed_without_submit"
        status = "completed_truncated" if outcome.truncated else status
        return bool(entry["status"] == status)
    return bool(entry["status"] == "failed" and entry["error_kind"] == outcome.kind)


def messages_of(state: Conversation) -> list[str]:
    return [type(m).__name__ for m in state.history]


def user(text: str) -> UserMessaged:
    return UserMessaged(text)


# --------------------------------------------------------------------------- random runs


def random_run(world: World, data: st.DataObject, max_moves: int) -> None:
    """Up to ``max_moves`` deliveries in an order Hypothesis chooses, checking the whole
    tree after each."""
    for _ in range(_pick(data, range(max_moves + 1))):
        moves = world_moves(world, data)
        if not moves:
            return
        _pick(data, moves)()
        world.check()


_BYTE = st.integers(0, 255)


def _pick(data: st.DataObject, options: Sequence[E]) -> E:
    return options[data.draw(_BYTE) % len(options)]


def world_moves(world: World, data: st.DataObject) -> list[Callable[[], object]]:
    """What may happen next in ``world``, weighted towards progress."""
    moves: list[Callable[[], object]] = []

    def reply() -> None:
        key = _pick(data, sorted(world.models))
        world.reply(key, data.draw(testing.model_replies(world.convs[key[0]])))

    def fail() -> None:
        world.fail(_pick(data, sorted(world.models)), data.draw(testing.model_errors()))

    def finish_tool() -> None:
        world.finish_tool(_pick(data, sorted(world.tools)), "ok", _pick(data, [False, True]))

    def cancel() -> None:
        live = sorted(c for c, s in world.convs.items() if not s.is_terminal)
        world.apply(_pick(data, live), CancelRequested(_pick(data, list(CancelReason))))

    def restart() -> None:
        world.restart(_pick(data, sorted(c for c, s in world.convs.items() if not s.is_terminal)))

    if world.models:
        moves += [reply, reply, reply, fail]
    if world.tools:
        moves += [finish_tool, finish_tool]
    if world.mail:
        moves += [lambda: world.deliver_mail(_pick(data, range(len(world.mail))))] * 3
    if world.timers:
        moves.append(lambda: world.fire(_pick(data, sorted(world.timers))))
    if world.late:
        moves.append(lambda: world.deliver_late(_pick(data, range(len(world.late)))))
    if isinstance(world.root.phase, Idle | Error):
        moves.append(lambda: world.apply("root", UserMessaged("more")))
    if moves and _pick(data, range(12)) == 11:
        moves = [cancel, restart]
    return moves


def first_reply(data: st.DataObject) -> ModelReply:
    """The root's first reply in a tree test: spawn 1-5 children, and sometimes run a
    tool too, so children may finish while their parent is still running tools."""
    tasks = [f"task {i}" for i in range(data.draw(st.integers(1, 5)))]
    calls = [spawn("first", *tasks)]
    if data.draw(st.booleans()):
        calls.append(tool("meanwhile"))
    return ModelReply("delegating", tuple(calls))
