"""Agent definitions as the reducer sees them: plain data, never read from disk here.

``fanfold.agents`` reads definition files (Markdown with YAML front matter) and the
built-ins into ``AgentDefinition`` values; the runtime puts them in the root's
``ConversationCreated.agents``, the state keeps them and passes them down, so every
decision a definition leads to is the reducer's, and replay makes it again from the
log alone.
"""

from __future__ import annotations

import enum

import attrs

from fanfold.statemachine.limits import integer, optional_seconds
from fanfold.statemachine.messages import ToolSpec
from fanfold.statemachine.permissions import Rule, RuleSet, mcp_server_of

# Added with agent-scoped MCP servers (schema 7): written only when not empty, so every
# definition before them encodes (and fingerprints) as it did.
_SCOPED = {"since": 7, "omitted_at_default": True}


class ContextMode(enum.StrEnum):
    """What a sub-agent is given besides its task."""

    TASK_ONLY = "task_only"
    """A fresh history holding just the task (the default)."""
    FULL = "full"
    """Its parent's history before the spawning reply, that reply's text, then the task."""
    SUMMARY = "summary"
    """A summary of its parent's conversation so far (one model call of the parent per
    tool round, shared by the round's children of this mode), then the task."""


class PromptMode(enum.StrEnum):
    """How a definition's body meets the default sub-agent prompt."""

    EXTEND = "extend"
    """The default prompt (the sub-agent's role, submit_result), then the body."""
    REPLACE = "replace"
    """The body alone."""


@attrs.frozen
class AgentDefinition:
    """What a delegated agent is: its prompt, its rules, its model and limits.

    - ``allow``: allow rules (the ``tools`` list); None: every tool its parent has.
    - ``deny``: deny rules (``disallowed_tools``).
    - ``ask``: ask rules (``ask``): a call one matches waits for a person's decision
      (deny beats ask beats allow).
    - ``model``: a model profile or name; None: the parent's.
    - ``max_rounds``, ``max_tokens``, ``timeout``: caps; the parent's limits (and the
      share of its budget it has left) cap them in turn.
    - ``may_delegate``: False: it is not offered ``spawn_agents``.
    - ``context``: what it is given besides its task (a task may say otherwise).
    - ``source``: where it was found (a path, or ``built-in``), for people.
    - ``mcp_servers``: the MCP servers its file names in ``mcpServers`` (declared
      there, or named in a list): agents of this definition get those servers'
      tools where the servers are agent-scoped (see ``own_tools``).
    - ``own_tools``: the tools of the agent-scoped servers it names (declared in an
      agent file), as the servers listed them when the tree started: offered to an
      agent of this definition (its rules still apply) and to no other agent, unless
      that one's definition names the server too (``delegation.child_setup``).
    """

    name: str
    description: str
    prompt: str = ""
    prompt_mode: PromptMode = PromptMode.EXTEND
    allow: tuple[Rule, ...] | None = None
    deny: tuple[Rule, ...] = ()
    model: str | None = None
    # Built from Python too: an int timeout becomes a float here, as in Limits (stored
    # as an int it would decode as a float, and replay would report a divergence).
    max_rounds: int | None = attrs.field(default=None, validator=integer)
    max_tokens: int | None = attrs.field(default=None, validator=integer)
    timeout: float | None = attrs.field(default=None, converter=optional_seconds)
    may_delegate: bool = True
    source: str = "built-in"
    context: ContextMode = ContextMode.TASK_ONLY
    mcp_servers: tuple[str, ...] = attrs.field(default=(), metadata=_SCOPED)
    own_tools: tuple[ToolSpec, ...] = attrs.field(default=(), metadata=_SCOPED)
    # Ask rules (``ask``, issue 35): its calls they match wait for a person's decision.
    ask: tuple[Rule, ...] = attrs.field(default=(), metadata=_SCOPED)

    def rules(self, base: str) -> RuleSet:
        """Its rules as a layer, path patterns relative to ``base``."""
        return RuleSet(self.allow, self.deny, f"agent '{self.name}'", base, self.ask)

    def system_prompt(self, default: str) -> str:
        """The system prompt of an agent of this kind, ``default`` being the one a
        sub-agent gets without a definition."""
        if self.prompt_mode is PromptMode.REPLACE:
            return self.prompt
        if not self.prompt.strip():
            return default
        if not default:
            return self.prompt
        return default + "\n\n" + self.prompt


def find_agent(agents: tuple[AgentDefinition, ...], name: str) -> AgentDefinition | None:
    for agent in agents:
        if agent.name == name:
            return agent
    return None


def with_own_tools(
    definitions: tuple[AgentDefinition, ...], scoped: tuple[ToolSpec, ...]
) -> tuple[AgentDefinition, ...]:
    """``definitions``, each given the tools of ``scoped`` (the tools of MCP servers
    declared in agent files) whose server it names in ``mcp_servers``. The runtime
    records the result in the root's creation event: which agents get an agent-scoped
    server's tools is then recorded data, decided again by replay without the server."""
    if not scoped:
        return definitions
    given = []
    for definition in definitions:
        own = tuple(t for t in scoped if mcp_server_of(t.name) in definition.mcp_servers)
        if own != definition.own_tools:
            definition = attrs.evolve(definition, own_tools=own)
        given.append(definition)
    return tuple(given)


def scoped_servers(definitions: tuple[AgentDefinition, ...]) -> frozenset[str]:
    """The agent-scoped MCP servers of a catalogue: those some definition's
    ``own_tools`` come from. Their tools go to the agents whose definitions name them,
    never to a root or to a sub-agent of another definition or of none."""
    return frozenset(
        server
        for definition in definitions
        for tool in definition.own_tools
        if (server := mcp_server_of(tool.name)) is not None
    )


def without_scoped(
    tools: tuple[ToolSpec, ...], definitions: tuple[AgentDefinition, ...]
) -> tuple[ToolSpec, ...]:
    """``tools`` without the agent-scoped servers' tools (what a root is offered; the
    same tuple when none is removed)."""
    scoped = scoped_servers(definitions)
    if not scoped:
        return tools
    kept = tuple(t for t in tools if mcp_server_of(t.name) not in scoped)
    return tools if len(kept) == len(tools) else kept
