"""Realistic event sequences for the fanfold.db tests, made by driving the reducer by hand.

``Driver`` plays the runtime's part without any I/O: it feeds events to conversations,
creates children from SpawnSubAgent effects, delivers NotifyParent outcomes and
CancelSubAgents requests, and records every transition as a ``Step``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from fanfold.db import Status, Step, Store, status_of
from fanfold.statemachine import (
    AwaitingRetry,
    CancelRequested,
    CancelSubAgents,
    Conversation,
    ConversationCreated,
    Effect,
    ErrorKind,
    Event,
    LlmRequesting,
    ModelError,
    ModelFailed,
    ModelReplied,
    ModelReply,
    NotifyParent,
    SpawnSubAgent,
    SubAgentFinished,
    TimerFired,
    ToolCall,
    ToolExecuting,
    ToolFinished,
    ToolResult,
    ToolSpec,
    Usage,
    UserMessaged,
    start,
    transition,
)

BASH = ToolSpec.from_schema(
    "bash",
    "Run a shell command",
    {"type": "object", "required": ["command"], "properties": {"command": {"type": "string"}}},
)

ChildPlan = Literal["result", "error", "text", "retry", "tool"]
CHILD_PLANS: tuple[ChildPlan, ...] = ("result", "error", "text", "retry", "tool")


class Driver:
    """Drive conversations through the reducer and record the Steps a runtime would.

    ``snapshot_every``: ask for a snapshot every K steps of a conversation and
    whenever it comes to rest (status other than running); None never asks.
    """

    def __init__(self, *, t0: float = 1_000.0, snapshot_every: int | None = None) -> None:
        self.states: dict[str, Conversation] = {}
        self.effects: dict[str, tuple[Effect, ...]] = {}
        self.steps: list[Step] = []
        self.clock = t0
        self.snapshot_every = snapshot_every
        self._seq: dict[str, int] = {}

    def _record(
        self,
        cid: str,
        event: Event,
        state: Conversation,
        effects: tuple[Effect, ...],
        before: Conversation | None = None,
    ) -> Step:
        seq = self._seq.get(cid, -1) + 1
        self._seq[cid] = seq
        self.clock += 0.25
        every = self.snapshot_every
        snapshot = every is not None and (
            seq % every == 0 or status_of(state.phase) is not Status.RUNNING
        )
        step = Step(cid, seq, event, effects, state, self.clock, snapshot=snapshot, before=before)
        self.states[cid] = state
        self.effects[cid] = effects
        self.steps.append(step)
        return step

    def create(self, created: ConversationCreated) -> Step:
        state, effects = start(created)
        return self._record(created.conversation_id, created, state, effects)

    def feed(self, cid: str, event: Event) -> Step:
        before = self.states[cid]
        state, effects = transition(before, event)
        return self._record(cid, event, state, effects, before)

    # ---------------------------------------------------------------- runtime chores

    def model_call(self, cid: str) -> int:
        phase = self.states[cid].phase
        assert isinstance(phase, LlmRequesting), phase
        return phase.call

    def reply(self, cid: str, text: str = "", *calls: ToolCall) -> Step:
        return self.feed(
            cid, ModelReplied(self.model_call(cid), ModelReply(text, calls, Usage(12, 7)))
        )

    def finish_tool(self, cid: str, content: str) -> Step:
        phase = self.states[cid].phase
        assert isinstance(phase, ToolExecuting), phase
        result = ToolResult(phase.current.id, phase.current.name, content)
        return self.feed(cid, ToolFinished(phase.call, result))

    def spawn_children(self, cid: str) -> list[str]:
        """Create the children the last step of ``cid`` asked for."""
        spawned = [e for e in self.effects[cid] if isinstance(e, SpawnSubAgent)]
        for effect in spawned:
            self.create(effect.created_event())
        return [e.child_id for e in spawned]

    def deliver_outcome(self, child: str) -> Step:
        """Deliver the child's NotifyParent to its parent."""
        (note,) = [e for e in self.effects[child] if isinstance(e, NotifyParent)]
        return self.feed(note.parent_id, SubAgentFinished(note.child_id, note.outcome))

    def deliver_cancels(self, cid: str) -> list[str]:
        """Deliver the CancelSubAgents of the last step of ``cid`` to each child."""
        ids: list[str] = []
        for effect in self.effects[cid]:
            if isinstance(effect, CancelSubAgents):
                for child in effect.ids:
                    self.feed(child, CancelRequested(effect.reason))
                    ids.append(child)
        return ids

    def run_child(self, child: str, plan: ChildPlan) -> None:
        """Take a freshly started child to Completed or Failed along ``plan``."""
        n = child.rpartition(".")[2]
        match plan:
            case "result":
                self.reply(child, "", ToolCall.of(f"{child}-s", "submit_result", {"result": n}))
            case "error":
                self.reply(child, "", ToolCall.of(f"{child}-e", "submit_error", {"error": "no"}))
            case "text":
                self.reply(child, f"answer {n}")
            case "retry":
                error = ModelError(ErrorKind.RATE_LIMIT, "slow down", retry_after=2.0)
                self.feed(child, ModelFailed(self.model_call(child), error))
                phase = self.states[child].phase
                assert isinstance(phase, AwaitingRetry), phase
                self.feed(child, TimerFired(phase.timer))
                self.reply(child, f"answer {n} after a retry")
            case "tool":
                self.reply(child, "looking", ToolCall.of(f"{child}-b", "bash", {"command": "ls"}))
                self.finish_tool(child, "README.md\nfanfold\n")
                self.reply(child, "", ToolCall.of(f"{child}-s", "submit_result", {"result": "ls"}))


def fan_out(
    driver: Driver,
    root: str = "r",
    plans: Sequence[ChildPlan] = ("tool", "retry", "error"),
    *,
    finish: bool = True,
) -> list[str]:
    """A root delegates one task per plan to sub-agents, each follows its plan, the
    root aggregates and answers. With ``finish=False`` it stops with the children
    started and the root waiting. Returns the child ids."""
    driver.create(ConversationCreated(root, cwd="/work", task=None, tools=(BASH,)))
    driver.feed(root, UserMessaged("review this repository"))
    tasks = [{"task": f"review part {i}"} for i in range(len(plans))]
    driver.reply(root, "delegating", ToolCall.of(f"{root}-spawn", "spawn_agents", {"tasks": tasks}))
    children = driver.spawn_children(root)
    if not finish:
        return children
    for child, plan in zip(children, plans, strict=True):
        driver.run_child(child, plan)
        driver.deliver_outcome(child)
    driver.reply(root, "all reviewed: 2 fine, 1 failed")
    return children


def cancelled_fan_out(driver: Driver, root: str = "c") -> list[str]:
    """A root spawns two sub-agents, one finishes, then the user cancels the root."""
    children = fan_out(driver, root, ("result", "text"), finish=False)
    driver.run_child(children[0], "result")
    driver.deliver_outcome(children[0])
    driver.feed(root, CancelRequested())
    for child in driver.deliver_cancels(root):
        driver.deliver_outcome(child)
    return children


def copied_mid_run(steps: Sequence[Step], live: Path, copy: Path) -> None:
    """Write ``steps`` to ``live/log.db`` as a runtime would (the first half committed
    and checkpointed by a closed store, the rest still in the WAL of an open one) and
    copy ``log.db`` and ``log.db-wal``, not ``-shm``, to ``copy`` while it is open."""
    live.mkdir()
    copy.mkdir()
    half = len(steps) // 2
    with Store.open(live / "log.db") as writer:
        writer.append(steps[:half])
    with Store.open(live / "log.db") as writer:
        writer.append(steps[half:])
        for name in ("log.db", "log.db-wal"):
            (copy / name).write_bytes((live / name).read_bytes())
