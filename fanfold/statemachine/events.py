"""Events: facts that happened, in the past tense. The only input of the reducer.

Ids, times and anything random arrive here as data; the reducer never makes them up.
"""

from __future__ import annotations

import typing

import attrs

from fanfold.statemachine.agent_defs import AgentDefinition
from fanfold.statemachine.children import ChildOutcome
from fanfold.statemachine.errors import CancelReason
from fanfold.statemachine.limits import Limits, optional_seconds
from fanfold.statemachine.messages import Message, ModelError, ModelReply, ToolResult, ToolSpec
from fanfold.statemachine.permissions import Permissions
from fanfold.statemachine.state import Conversation

_AGENTS_FIELD = {"since": 6, "omitted_at_default": True}


@attrs.frozen
class WorkingDirectory:
    """Where a sub-agent's working directory really is: what the runtime found, with
    symbolic links resolved, when it created the sub-agent. The reducer judges it.

    - ``resolved``: the sub-agent's ``cwd`` with every symbolic link followed;
    - ``parent``: the same for its parent's working directory;
    - ``project``: the same for the tree root's working directory;
    - ``is_directory``: whether ``cwd`` is a directory (following links).
    """

    resolved: str
    parent: str
    project: str
    is_directory: bool


@attrs.frozen
class ConversationCreated:
    """A conversation came into being. Folded by ``start``, never by ``transition``.

    ``tools`` are the ordinary tools the runtime offers; the reducer adds the control
    tools (``spawn_agents``, ``submit_result``, ``submit_error``) the context allows.
    A sub-agent (``parent_id`` set) starts working on ``task`` at once, unless
    ``workdir`` (the runtime's findings about its ``cwd``) shows the directory lies
    outside its parent's or the project, or is no directory: then it ends Failed
    (``invalid_cwd``) without a model call. ``workdir`` is None when nobody looked
    (a test, or a log of schema 2).
    ``sub_agent_prompt``: the system prompt its sub-agents get (and theirs); None (logs
    before schema 6): they get this conversation's own ``system_prompt``.
    ``agents`` (issue 12): the agent definitions its ``spawn_agents`` tasks may name
    (a root's come from the runtime, a child's from its parent); ``agent``: the
    definition a sub-agent was spawned as; ``permissions``: the rules its tool calls
    must pass (None: none). Its ``tools`` are already those its permissions leave.
    ``context``: what a sub-agent is given before its task (context mode ``full``: its
    parent's history up to the spawning reply); its history starts with it.
    """

    conversation_id: str
    parent_id: str | None = None
    root_id: str | None = None
    depth: int = 0
    cwd: str = "."
    task: str | None = None
    system_prompt: str = ""
    model: str | None = None
    limits: Limits = Limits()
    tools: tuple[ToolSpec, ...] = ()
    # An int from Python becomes a float, as in Limits (see limits.seconds).
    timeout: float | None = attrs.field(default=None, converter=optional_seconds)
    workdir: WorkingDirectory | None = attrs.field(default=None, metadata={"since": 3})
    sub_agent_prompt: str | None = attrs.field(
        default=None, metadata={"since": 6, "omitted_at_default": True}
    )
    agents: tuple[AgentDefinition, ...] = attrs.field(default=(), metadata=_AGENTS_FIELD)
    agent: str | None = attrs.field(default=None, metadata=_AGENTS_FIELD)
    permissions: Permissions | None = attrs.field(default=None, metadata=_AGENTS_FIELD)
    context: tuple[Message, ...] = attrs.field(default=(), metadata=_AGENTS_FIELD)
    # The wording of the reducer's texts it gets (``state.WORDING``; 0 when absent: a
    # log written before the field). The runtime sets today's for a root; a child's
    # is its parent's.
    wording: int = attrs.field(default=0, metadata={"since": 7, "omitted_at_default": True})


@attrs.frozen
class ConversationForked:
    """A conversation was forked from ``source_id`` at ``source_seq`` for debugging.

    Folded by ``start`` like ConversationCreated: the new conversation begins with
    ``state`` (the source's state at that step) under its own id. A root at rest is
    forked alone; any other state is one conversation of a tree forked with it, already
    under the fork's ids (see ``start``).

    ``edit``: the user's edit of this conversation, recorded with the fork in its one
    transaction and taken as the fork goes on: the runtime delivers
    ``ForkEdited(edit)`` in place of this conversation's first ``RuntimeResumed``
    (while the conversation is still at this seq 0), so a fork whose run was killed
    before the edit took effect still goes on edited. ``start`` refuses an edit the
    state does not admit. None: no edit (every fork before it, and most).

    ``picked``: this is the conversation the user forked at (``fanfold fork --agent``)
    in a tree fork, where ``source_seq`` is the step picked; the other copies hold
    their state at that moment. Information for the views (``ls``, ``diff`` name the
    forked agent and its seq); the reducer does not read it. False in every fork
    written before issue 34, and for a root forked at rest (it is alone).
    """

    conversation_id: str
    source_id: str
    source_seq: int
    state: Conversation
    edit: Edit | None = attrs.field(default=None, metadata={"since": 7, "omitted_at_default": True})
    picked: bool = attrs.field(default=False, metadata={"since": 7, "omitted_at_default": True})


@attrs.frozen
class UserMessaged:
    """The user sent a message to a root conversation."""

    text: str


@attrs.frozen
class ModelReplied:
    """Model call ``call`` returned a complete reply."""

    call: int
    reply: ModelReply


@attrs.frozen
class ModelFailed:
    """Model call ``call`` failed with a classified error."""

    call: int
    error: ModelError


@attrs.frozen
class ToolFinished:
    """Tool call ``call`` produced a result (an error result is still a result)."""

    call: int
    result: ToolResult


@attrs.frozen
class SubAgentFinished:
    """Child ``child_id`` reached Completed or Failed and reported its outcome."""

    child_id: str
    outcome: ChildOutcome


@attrs.frozen
class TimerFired:
    """Timer ``timer`` (a retry backoff or a deadline) ran out."""

    timer: int


@attrs.frozen
class CancelRequested:
    """Someone asked the conversation to stop: the user, its parent, a limit or its timer."""

    reason: CancelReason = CancelReason.USER


@attrs.frozen
class RuntimeResumed:
    """The runtime restarted and found this conversation unfinished in the log.

    The reducer answers with the effects to re-issue: nothing that ran before the crash
    has a result, so in-flight model calls are repeated, an interrupted tool gets an
    error result (it is never run twice) unless it is one of ``idempotent_tools``,
    timers and children are started again.

    ``idempotent_tools``: the tools of the resuming runtime that declare a second call
    with the same arguments harmless (an MCP server's ``idempotent_tools`` in the
    user's configuration, a function tool's ``idempotent=True``): a call of one of them
    in flight at the crash is run again instead.

    ``forked``: no restart, but a fork's conversation going on for the first time
    (the runtime delivers it to one still at its seq 0): a tool running in its
    source when it was copied is not run again either, and its error result says
    that instead of speaking of a restart.
    """

    idempotent_tools: tuple[str, ...] = attrs.field(
        default=(), metadata={"since": 7, "omitted_at_default": True}
    )
    # A conversation of a fork going on for the first time (still at its seq 0): what
    # it has in flight was in flight in its source, not cut by a restart; a tool
    # running there gets a result that says so (FORKED_TOOL_RESULT).
    forked: bool = attrs.field(default=False, metadata={"since": 7, "omitted_at_default": True})


@attrs.frozen
class ReplyEdit:
    """Edit: the awaited model call's reply is this one instead (text or tool calls)."""

    reply: ModelReply


@attrs.frozen
class ToolResultEdit:
    """Edit: the running tool call's result is this one instead."""

    result: ToolResult


@attrs.frozen
class TaskEdit:
    """Edit: a sub-agent that has not had a reply yet works on this task instead."""

    task: str


@attrs.frozen
class SystemPromptEdit:
    """Edit: the conversation's system prompt is this one from its next model call on."""

    system_prompt: str


@attrs.frozen
class LimitsEdit:
    """Edit: the conversation runs under these limits from now on (its next rounds,
    retries, spawns and fan-in). Legal only where they admit the conversation as it is
    (see the transition table's ``ForkEdited`` column)."""

    limits: Limits


@attrs.frozen
class ToolsChanged:
    """MCP server ``server`` changed its tools (``notifications/tools/list_changed``)
    and ``tools`` are what it offers now (``mcp__SERVER__TOOL`` specs, as the runtime
    listed them). The conversation's offered tools of that server are replaced by those
    its permissions leave, from its next model call on: a request already sent keeps
    the set it offered. A conversation that has ended absorbs it."""

    server: str
    tools: tuple[ToolSpec, ...] = ()


@attrs.frozen
class ApprovalGranted:
    """A person approved tool call ``call``, which waits for a decision (issue 35).

    ``arguments_json``: edited arguments (a JSON object's text) to run it with instead
    of the model's; the reducer checks them against the tool's schema and the rules
    again. None: as the model wrote them. ``by``: who decided (for the trace)."""

    call: int
    arguments_json: str | None = None
    by: str = ""


@attrs.frozen
class ApprovalDenied:
    """A person refused tool call ``call``; its result is "denied by the user:
    ``reason``", so the model can adapt. ``by``: who decided."""

    call: int
    reason: str = ""
    by: str = ""


@attrs.frozen
class UserAnswered:
    """A person answered the ``ask_user`` question of call ``call``: ``text`` is the
    call's result. ``by``: who answered."""

    call: int
    text: str
    by: str = ""


@attrs.frozen
class DecisionEdit:
    """Edit: the request for a person's decision that the forked conversation holds
    open is decided this way instead (issue 35: approve what was denied, with edited
    arguments if given; deny what was approved; answer a question otherwise). Legal
    only where the conversation waits for that decision (``ToolExecuting.asking`` set,
    ``decision.call`` its call): the same rules as the decision event itself."""

    decision: ApprovalGranted | ApprovalDenied | UserAnswered


Edit = ReplyEdit | ToolResultEdit | TaskEdit | SystemPromptEdit | LimitsEdit | DecisionEdit


@attrs.frozen
class ForkEdited:
    """The user changed a forked conversation as it goes on, and the runtime continues
    it with that change in place of what was in flight (``RuntimeResumed`` and the
    edit in one step). Which edit is legal in which phase is the transition table's
    ``ForkEdited`` column; see DESIGN.md, "Time travel"."""

    edit: Edit


Event = (
    ConversationCreated
    | ConversationForked
    | UserMessaged
    | ModelReplied
    | ModelFailed
    | ToolFinished
    | SubAgentFinished
    | TimerFired
    | CancelRequested
    | RuntimeResumed
    | ForkEdited
    | ToolsChanged
    | ApprovalGranted
    | ApprovalDenied
    | UserAnswered
)

# The one list of event classes is the union above; the tuple is derived from it, so a
# new event is added in one place (codec registry, generators and table follow).
ALL_EVENTS: tuple[type[Event], ...] = typing.get_args(Event)
