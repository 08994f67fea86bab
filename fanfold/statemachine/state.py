"""The state of one conversation: a frozen value holding everything a decision needs."""

from __future__ import annotations

from typing import Any

import attrs

from fanfold.statemachine.agent_defs import AgentDefinition
from fanfold.statemachine.children import ChildFailed, ChildOutcome, Children, ChildSucceeded
from fanfold.statemachine.limits import Limits
from fanfold.statemachine.messages import AssistantMessage, Message, ToolSpec, Usage
from fanfold.statemachine.permissions import Permissions
from fanfold.statemachine.phases import (
    TERMINAL_PHASES,
    AwaitingSubAgents,
    CancellingSubAgents,
    Completed,
    Error,
    Failed,
    Idle,
    Phase,
    ToolExecuting,
)

# Fields of agent definitions and permissions (issue 12), written only when set, so
# states without them encode, and fingerprint, as before; a log without them decodes
# at any version (they are not used there).
_AGENTS_FIELD = {"since": 6, "omitted_at_default": True}
_WORDING_FIELD = {"since": 7, "omitted_at_default": True}

WORDING = 1
"""The wording of the reducer's texts for the model (refusals) that conversations
created now get, recorded in their ``ConversationCreated`` and passed from parent to
child, so that a log replays with the wording it was written with (verify compares
every text):

- 0: before issue 33 (a log without the field);
- 1: a ``read-only`` refusal of an MCP tool also says that ``read-only`` takes an MCP
  tool only if its server marks it ``readOnlyHint`` (``permissions.refusal``).

A change of wording a model sees raises it; the reducer keeps every earlier one."""


# The phases of a conversation at rest (``Conversation.at_rest``), for a lookup by class.
_AT_REST = frozenset((Idle, Error, Completed, Failed))


# No __weakref__ slot (nothing takes weak references to states): it would keep
# ``evolve``'s draft from becoming a Conversation (see _compile_evolve).
@attrs.frozen(weakref_slot=False)
class Conversation:
    """One conversation, root or sub-agent.

    - ``tools``: every tool offered to the model, control tools included.
    - ``rounds``: model rounds used (per turn for a root, per lifetime for a sub-agent).
    - ``next_call``: the number the next model call, tool call or timer will get.
    - ``spawned``: children spawned so far; child ids are ``f"{id}.{n}"``.
    - ``written_off``: children the parent stopped waiting for (deadline or no
      acknowledgement); a late outcome from one of them is absorbed.
    - ``deadline_timer``: its own time-limit timer, if it has one: a sub-agent's
      for its life, a root's (``timeout`` set) for the turn in progress.
    - ``usage_children``: tokens used by its sub-agents (and theirs), as they reported
      them; a written-off child is charged its whole budget. ``max_tokens`` bounds
      ``usage.total + usage_children``: the budget of the whole tree below.
    - ``agents``: the agent definitions ``spawn_agents`` tasks may name; ``agent``:
      the one it was spawned as; ``permissions``: the rules its tool calls must pass
      (its parent's and its definition's); ``refused_calls``: calls they refused.
    """

    id: str
    parent_id: str | None
    root_id: str
    depth: int
    cwd: str
    task: str | None
    system_prompt: str
    model: str | None
    limits: Limits
    tools: tuple[ToolSpec, ...]
    history: tuple[Message, ...]
    phase: Phase
    timeout: float | None = None
    rounds: int = 0
    usage_input: int = 0
    usage_output: int = 0
    next_call: int = 0
    spawned: int = 0
    written_off: tuple[str, ...] = ()
    deadline_timer: int | None = None
    usage_children: int = attrs.field(default=0, metadata={"since": 2})
    # Of usage_input, the tokens read from the provider's prompt cache (schema 6).
    usage_cached: int = attrs.field(default=0, metadata={"since": 6, "omitted_at_default": True})
    # The system prompt of its sub-agents (None: its own, as before schema 6).
    sub_agent_prompt: str | None = attrs.field(
        default=None, metadata={"since": 6, "omitted_at_default": True}
    )
    # Agent definitions its spawn_agents tasks may name (issue 12).
    agents: tuple[AgentDefinition, ...] = attrs.field(default=(), metadata=_AGENTS_FIELD)
    # The definition it was spawned as, by name (None: none, or a root).
    agent: str | None = attrs.field(default=None, metadata=_AGENTS_FIELD)
    # The rules its tool calls must pass (None: no rules).
    permissions: Permissions | None = attrs.field(default=None, metadata=_AGENTS_FIELD)
    # Tool calls its permissions refused.
    refused_calls: int = attrs.field(default=0, metadata=_AGENTS_FIELD)
    # The wording of the reducer's texts it was created under (``WORDING``): 0 for a
    # conversation of a log written before there were two.
    wording: int = attrs.field(default=0, metadata=_WORDING_FIELD)

    @property
    def is_sub_agent(self) -> bool:
        return self.parent_id is not None

    @property
    def is_terminal(self) -> bool:
        return isinstance(self.phase, TERMINAL_PHASES)

    @property
    def at_rest(self) -> bool:
        """Nothing in flight: Idle, Error, Completed or Failed."""
        # A lookup of the phase's class (phases are never subclassed): the union
        # ``Idle | Error | Completed | Failed`` was built anew on every read, about
        # 8x the cost of this lookup, and the runtime reads it about once a step.
        return type(self.phase) in _AT_REST

    @property
    def children(self) -> Children | None:
        """The children of the current tool round, if the phase tracks any."""
        match self.phase:
            case (
                ToolExecuting(children=c)
                | AwaitingSubAgents(children=c)
                | CancellingSubAgents(children=c)
            ):
                return c
        return None

    @property
    def usage(self) -> Usage:
        return Usage(self.usage_input, self.usage_output, self.usage_cached)

    @property
    def outcome(self) -> ChildOutcome | None:
        """What an ended sub-agent reports to its parent (NotifyParent): its result or
        error, and the tokens of its subtree; None while it has not ended."""
        match self.phase:
            case Completed(result=result):
                return ChildSucceeded(result, self.tokens_spent, self.submitted, self.truncated)
            case Failed(error=error, kind=kind, reason=reason):
                return ChildFailed(error, kind, reason, self.tokens_spent)
        return None

    @property
    def submitted(self) -> bool:
        """Whether an ended sub-agent called ``submit_result`` (or ``submit_error``).

        False for one that Completed with the plain text of a reply without tool calls
        (a chat model that ignores tools): its history ends with that reply, while a
        submission is always answered by a tool result. Read from the history rather
        than kept in the phase, so that states of older logs encode (and fingerprint)
        exactly as they were recorded.
        """
        history = self.history
        return not (history and isinstance(history[-1], AssistantMessage))

    @property
    def truncated(self) -> bool:
        """True when the history ends with a model reply cut off at the output token
        limit: a sub-agent Completed with that text, or a root's answer, is cut."""
        history = self.history
        return (
            bool(history) and isinstance(history[-1], AssistantMessage) and (history[-1].truncated)
        )

    @property
    def tokens_spent(self) -> int:
        """Tokens of this conversation and of every sub-agent below it."""
        return self.usage_input + self.usage_output + self.usage_children

    def offers(self, tool_name: str) -> bool:
        # A plain loop: any() over a generator costs more than the search itself.
        for tool in self.tools:  # noqa: SIM110
            if tool.name == tool_name:
                return True
        return False

    def evolve(self, **changes: Any) -> Conversation:
        """A copy with ``changes``: ``attrs.evolve`` without its per-call overhead.

        The reducer makes several copies per event and Conversation has no validators
        or converters, so copying field by field is safe and several times faster. The
        body is generated below, once, with one line per field.
        """
        raise NotImplementedError  # replaced by _compile_evolve()


def tree_path(conversation_id: str, root_id: str) -> str:
    """'root', 'root/1', 'root/1/2': conversation ``conversation_id``'s place in the
    tree of ``root_id`` (as the runtime's CallContext.path and the scripted provider's
    ``match`` name it, and as ``transcript --agent`` takes it)."""
    return "root" + conversation_id[len(root_id) :].replace(".", "/")


def _compile_evolve() -> None:
    """Give Conversation an ``evolve`` that copies the state into a mutable draft of the
    same layout, writes the changes there, and makes the draft the Conversation:

    new = _new(_Draft)
    new.id = self.id
    ...
    for key, value in changes.items(): setattr(new, key, value)   # names checked
    new.__class__ = Conversation
    return new

    A frozen class can only be written through its slots' descriptors, one call each
    (22,000 instructions per copy of the 29 fields, callgrind, 2026-11-28); the
    draft, a plain class with the same ``__slots__``, takes plain attribute stores
    (6,500 with the class switch). The draft never leaves this function: what it
    returns is a Conversation like any other (``tests/test_sm_state_copy.py`` checks
    it equals ``attrs.evolve``'s). Python allows the ``__class__`` switch between
    classes of the same slots; a Conversation without a ``__weakref__`` slot has the
    layout the check accepts (with one, CPython's check refuses any such pair).
    """
    names = tuple(a.name for a in attrs.fields(Conversation))
    draft = type("_ConversationDraft", (), {"__slots__": Conversation.__dict__["__slots__"]})
    namespace: dict[str, Any] = {
        "_new": object.__new__,
        "_Draft": draft,
        "Conversation": Conversation,
        "_names": frozenset(names),
        "_setattr": setattr,
    }
    lines = ["def evolve(self, **changes):", "    new = _new(_Draft)"]
    lines += [f"    new.{name} = self.{name}" for name in names]
    lines += [
        "    for key, value in changes.items():",
        "        if key not in _names:",
        "            unknown = sorted(k for k in changes if k not in _names)",
        "            raise TypeError(f'Conversation has no field(s) {unknown}')",
        "        _setattr(new, key, value)",
        "    new.__class__ = Conversation",
        "    return new",
    ]
    exec(compile("\n".join(lines), "<Conversation.evolve>", "exec"), namespace)
    evolve = namespace["evolve"]
    evolve.__doc__ = Conversation.evolve.__doc__
    evolve.__qualname__ = "Conversation.evolve"
    evolve.__module__ = __name__
    Conversation.evolve = evolve  # type: ignore[method-assign]


_compile_evolve()
