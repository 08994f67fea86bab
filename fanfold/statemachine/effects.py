"""Effects: commands for the runtime. The only output of the reducer besides the state.

Each long-running effect carries a ``call`` (or ``timer``) number, unique within the
conversation; its result comes back as an event naming the same number.
"""

from __future__ import annotations

import enum
import typing

import attrs

from fanfold.statemachine.agent_defs import AgentDefinition
from fanfold.statemachine.children import ChildOutcome
from fanfold.statemachine.errors import CancelReason
from fanfold.statemachine.events import ConversationCreated, WorkingDirectory
from fanfold.statemachine.limits import Limits
from fanfold.statemachine.messages import Message, ToolCall, ToolSpec
from fanfold.statemachine.permissions import PathRules, Permissions

_AGENTS_FIELD = {"since": 6, "omitted_at_default": True}


@attrs.frozen
class CallModel:
    """Call the model; answer with ModelReplied or ModelFailed.

    The request is ``model_request(state)`` of the state this effect came with: the
    system prompt, the whole history, the tools offered now and the model. It is a
    view of the state, not a decision, so it is neither carried here nor logged
    (schema 6; before, every call stored the whole history and every tool schema
    again, and a log grew with the square of its conversation's length): the runtime
    derives it when it starts the call, replay from the state it rebuilds.

    ``attempt`` counts the tries of this request: 1, then one more after each retry's
    back-off (providers may report it). Logs of schema 3 and older do not record it.
    """

    call: int
    attempt: int = attrs.field(default=1, metadata={"since": 4})


# Fields of RunTool added after the log stopped storing effects (issue 21): no
# stored effect has them. Written only when not at their default, so an effect that
# older logs stored encodes as they stored it; NEVER_STORED tells replay to compare a
# stored effect with the recomputed one's field at its default (codec.as_recorded_by).
_DECIDED_FIELD = {"since": 7, "omitted_at_default": True, "never_stored": True}


@attrs.frozen
class RunTool:
    """Run ``tool_call`` in ``cwd``; answer with ToolFinished.

    The reducer decides how the call runs; the runtime only reads it:

    - ``confined``: the conversation's bash runs through allow patterns only
      (``confines_commands`` of its permissions), so the tool runs it with git's
      configured programs switched off (``fanfold/tools/git_guard.py``).
    - ``path_rules``: for a file tool of a conversation with rules, the rules its path
      must also pass once its symbolic links are resolved (the reducer matched the
      path as spelled; only the runtime can resolve links). None: no such check.
    """

    call: int
    tool_call: ToolCall
    cwd: str
    confined: bool = attrs.field(default=False, metadata=_DECIDED_FIELD)
    path_rules: PathRules | None = attrs.field(default=None, metadata=_DECIDED_FIELD)


@attrs.frozen
class ScheduleRetry:
    """Wait ``delay`` seconds before model attempt ``attempt``; answer with TimerFired.

    A back-off counts downtime: re-issued after a restart, it waits only what is left."""

    timer: int
    delay: float
    attempt: int


@attrs.frozen
class StartTimer:
    """A deadline: after ``delay`` seconds answer with TimerFired. ``purpose`` is for humans.

    ``counts_downtime``: when re-issued after a restart, the time since the timer was
    first started counts against ``delay``, downtime included (the conversation's own
    time limit). Otherwise the timer starts over: it waits for other conversations,
    which were down too (a child's deadline backstop, a cancel's grace). Logs of
    schema 3 and older do not record it.
    """

    timer: int
    delay: float
    purpose: str
    counts_downtime: bool = attrs.field(default=False, metadata={"since": 4})


@attrs.frozen
class AbortCall:
    """Stop model call, tool or timer ``call`` if it is still running; no answer expected."""

    call: int


@attrs.frozen
class SpawnSubAgent:
    """Create and start child ``child_id``. Idempotent: an existing child is left running."""

    child_id: str
    parent_id: str
    root_id: str
    task: str
    cwd: str
    timeout: float | None
    max_rounds: int
    depth: int
    limits: Limits
    tools: tuple[ToolSpec, ...]
    system_prompt: str
    model: str | None
    sub_agent_prompt: str | None = attrs.field(
        default=None, metadata={"since": 6, "omitted_at_default": True}
    )
    agents: tuple[AgentDefinition, ...] = attrs.field(default=(), metadata=_AGENTS_FIELD)
    agent: str | None = attrs.field(default=None, metadata=_AGENTS_FIELD)
    permissions: Permissions | None = attrs.field(default=None, metadata=_AGENTS_FIELD)
    context: tuple[Message, ...] = attrs.field(default=(), metadata=_AGENTS_FIELD)
    # The parent's wording (``Conversation.wording``), which the child gets.
    wording: int = attrs.field(default=0, metadata=_DECIDED_FIELD)

    def created_event(self, workdir: WorkingDirectory | None = None) -> ConversationCreated:
        """The child's first event, built from this effect with no decisions left;
        ``workdir`` is what the runtime found at ``cwd``."""
        return ConversationCreated(
            conversation_id=self.child_id,
            parent_id=self.parent_id,
            root_id=self.root_id,
            depth=self.depth,
            cwd=self.cwd,
            task=self.task,
            system_prompt=self.system_prompt,
            model=self.model,
            limits=self.limits,
            tools=self.tools,
            timeout=self.timeout,
            workdir=workdir,
            sub_agent_prompt=self.sub_agent_prompt,
            agents=self.agents,
            agent=self.agent,
            permissions=self.permissions,
            context=self.context,
            wording=self.wording,
        )


@attrs.frozen
class NotifyParent:
    """Deliver this sub-agent's outcome to its parent as SubAgentFinished."""

    parent_id: str
    child_id: str
    outcome: ChildOutcome


@attrs.frozen
class CancelSubAgents:
    """Deliver CancelRequested(``reason``) to each child in ``ids``."""

    ids: tuple[str, ...]
    reason: CancelReason


class TurnOutcome(enum.StrEnum):
    ANSWERED = "answered"
    CANCELLED = "cancelled"
    ERROR = "error"
    COMPLETED = "completed"
    FAILED = "failed"


@attrs.frozen
class TurnFinished:
    """The conversation stopped working: a root's turn ended, or a sub-agent ended."""

    outcome: TurnOutcome
    text: str


@attrs.frozen
class RequestApproval:
    """Tool call ``call`` (``tool_call``, of the agent at ``path``) waits for a person's
    decision, because of ``rule`` (issue 35). Answer with ApprovalGranted or
    ApprovalDenied. The request is durable as the state (``ToolExecuting.asking``);
    the effect tells the runtime to show it. Re-issued by RuntimeResumed (same call:
    the same request, never a second one)."""

    call: int
    tool_call: ToolCall
    rule: str
    path: str


@attrs.frozen
class AskUser:
    """The agent at ``path`` asks a person ``question`` (the ``ask_user`` tool call
    ``call``; ``choices``: answers it suggests, may be empty). Answer with
    UserAnswered (or ApprovalDenied: the person declines to answer)."""

    call: int
    tool_call: ToolCall
    question: str
    choices: tuple[str, ...]
    path: str


Effect = (
    CallModel
    | RunTool
    | ScheduleRetry
    | StartTimer
    | AbortCall
    | SpawnSubAgent
    | NotifyParent
    | CancelSubAgents
    | TurnFinished
    | RequestApproval
    | AskUser
)

# The one list of effect classes is the union above; the tuple is derived from it, so a
# new effect is added in one place (codec registry, generators and table follow).
ALL_EFFECTS: tuple[type[Effect], ...] = typing.get_args(Effect)
