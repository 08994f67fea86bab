"""What a child gets from its agent definition, capped by its parent. Pure.

The reducer (``transition._spawn``, ``_start_queued``, ``_spawn_effect``) calls these
when a ``spawn_agents`` task names an agent (``"agent": "reviewer"``):

- the definition is looked up in the parent's ``agents`` (data from the root's
  creation event); an unknown name rejects the task, naming the known ones;
- its ``max_rounds`` and ``timeout`` cap what the task and the parent's limits allow;
  its ``max_tokens`` caps the share of the parent's budget the child gets (never
  more than that share: a definition cannot lift a child above its parent);
- its rules are added to the parent's permissions (``permissions.restrict``), and the
  child is offered only the parent's tools those permissions leave;
- its body gives the system prompt (``AgentDefinition.system_prompt``), its ``model``
  the model unless the task names one, and ``may_delegate: false`` takes
  ``spawn_agents`` away (the child's ``max_depth`` is its own depth).
"""

from __future__ import annotations

import attrs

from fanfold.statemachine.agent_defs import AgentDefinition, find_agent, scoped_servers
from fanfold.statemachine.limits import Limits
from fanfold.statemachine.messages import (
    AssistantMessage,
    Message,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)
from fanfold.statemachine.permissions import (
    Permissions,
    allows_tool,
    mcp_server_of,
    reading_tools,
    restrict,
)


def parent_context(history: tuple[Message, ...]) -> tuple[Message, ...]:
    """What a child of context mode ``full`` is given before its task: its parent's
    history before the reply that spawned it, and that reply's text (its tool calls
    left out: their results do not exist yet). During the spawning round that reply
    is the history's last assistant message, so the context is the same whenever
    the child's SpawnSubAgent is (re-)issued."""
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if isinstance(message, AssistantMessage):
            before = history[:index]
            return (*before, AssistantMessage(message.text)) if message.text.strip() else before
    return history


def own_messages(
    history: tuple[Message, ...], task: str | None, is_sub_agent: bool
) -> tuple[Message, ...]:
    """A conversation's own messages: a sub-agent's from its task on (one of context
    mode ``full`` is first given its parent's conversation, whose replies and tool
    calls are not its own). After its task a sub-agent gets no user message but the
    grace prompt, so its task is the last user message holding that text."""
    if not is_sub_agent or task is None:
        return history
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if isinstance(message, UserMessage) and message.text == task:
            return history[index:]
    return history


def agent_for(agents: tuple[AgentDefinition, ...], name: str) -> AgentDefinition | str:
    """The definition named ``name``, or the error a task naming it gets."""
    found = find_agent(agents, name)
    if found is not None:
        return found
    if not agents:
        return f"unknown agent {name!r}: no agents are defined"
    known = ", ".join(a.name for a in agents)
    return f"unknown agent {name!r}; known agents: {known}"


def capped_limits(
    definition: AgentDefinition | None, timeout: float | None, max_rounds: int
) -> tuple[float | None, int]:
    """A child's time limit and rounds, further capped by its definition."""
    if definition is None:
        return timeout, max_rounds
    if definition.timeout is not None:
        timeout = definition.timeout if timeout is None else min(timeout, definition.timeout)
    if definition.max_rounds is not None:
        max_rounds = min(max_rounds, definition.max_rounds)
    return timeout, max_rounds


def capped_share(definition: AgentDefinition | None, share: int) -> int:
    """The tokens set aside for a child: its share of the parent's budget, at most
    its definition's ``max_tokens``."""
    if definition is None or definition.max_tokens is None:
        return share
    return min(share, definition.max_tokens)


def permitted_tools(
    tools: tuple[ToolSpec, ...], permissions: Permissions | None
) -> tuple[ToolSpec, ...]:
    """``tools`` without those ``permissions`` refuse outright (the same tuple when
    none is removed, so siblings keep sharing it)."""
    if permissions is None:
        return tools
    reading = reading_tools(tools)
    kept = tuple(t for t in tools if allows_tool(permissions, t.name, reading))
    return tools if len(kept) == len(tools) else kept


@attrs.frozen
class ChildSetup:
    """What a child of an agent definition is given (the rest is as without one)."""

    tools: tuple[ToolSpec, ...]
    system_prompt: str
    limits: Limits
    permissions: Permissions | None
    agents: tuple[AgentDefinition, ...]


def child_setup(
    definition: AgentDefinition | None,
    *,
    parent_permissions: Permissions | None,
    parent_agents: tuple[AgentDefinition, ...],
    tools: tuple[ToolSpec, ...],
    default_prompt: str,
    limits: Limits,
    depth: int,
    cwd: str,
) -> ChildSetup:
    """A child's tools, prompt, limits, permissions and catalogue.

    ``tools``, ``default_prompt`` and ``limits`` are what it would get without a
    definition; ``depth`` and ``cwd`` are its own. The catalogue goes down only to a
    child that may spawn (it is a few KB per creation event otherwise wasted).
    """
    permissions = parent_permissions
    prompt = default_prompt
    tools = _scoped_for(definition, parent_agents, tools)
    if definition is not None:
        permissions = restrict(parent_permissions, definition.rules(cwd))
        prompt = definition.system_prompt(default_prompt)
        if definition.max_tokens is not None and limits.max_tokens is None:
            limits = attrs.evolve(limits, max_tokens=definition.max_tokens)
        if not definition.may_delegate and limits.max_depth > depth:
            limits = attrs.evolve(limits, max_depth=depth)
    agents = parent_agents if depth + 1 <= limits.max_depth else ()
    return ChildSetup(permitted_tools(tools, permissions), prompt, limits, permissions, agents)


def _scoped_for(
    definition: AgentDefinition | None,
    catalogue: tuple[AgentDefinition, ...],
    tools: tuple[ToolSpec, ...],
) -> tuple[ToolSpec, ...]:
    """A child's tools before its rules narrow them: its parent's, without the
    agent-scoped MCP servers' tools (``AgentDefinition.own_tools``) unless its own
    definition names the server, and with its definition's own tools. So a server an
    agent file declares serves the agents of that definition (and of any definition
    naming it in ``mcpServers``), never its siblings, its parent or its other
    sub-agents: Claude Code's scoping of an agent's servers. The only way a child holds
    a tool its parent lacks; every layer of rules above it still applies."""
    scoped = scoped_servers(catalogue)
    if definition is not None:
        scoped |= scoped_servers((definition,))
    if not scoped:
        return tools
    named = () if definition is None else definition.mcp_servers
    kept = tuple(
        t for t in tools if (s := mcp_server_of(t.name)) is None or s not in scoped or s in named
    )
    if definition is not None and definition.own_tools:
        have = {t.name for t in kept}
        kept += tuple(t for t in definition.own_tools if t.name not in have)
    return tools if kept == tools else kept


SUMMARY_PROMPT = (
    "Write a summary of this conversation so far for the sub-agents you are about to "
    "delegate to: the goal, what has been found, decided or tried, the files, names and "
    "facts that matter, and what is still open. Plain text only, no tool calls: the "
    "sub-agents will know nothing of this conversation but this summary and their task."
)
"""The instruction that ends a summary call's request (context mode ``summary``)."""

SUMMARY_HEADER = "A summary of the conversation of the agent that delegated this task:\n\n"
SUMMARY_CUT = "\n[the summary was cut off at the output token limit]"
"""Ends a summary whose reply was cut off at the output token limit."""
"""What a child of context mode ``summary`` reads before the summary."""


def summary_messages(history: tuple[Message, ...]) -> tuple[Message, ...]:
    """The messages of a summary call: the parent's conversation as plain turns, then
    the instruction to summarise it.

    A reply's tool calls and the tools' results are written into the text
    (``[tool call NAME: ARGUMENTS]``, ``[result of NAME: CONTENT]``), the spawning
    reply's calls included (they say what is being delegated): the request then holds
    no tool call and offers no tool, which every API accepts (Anthropic's refuses tool
    blocks in a request that defines no tools), and the model has nothing to call.
    """
    flat: list[Message] = []
    for message in history:
        match message:
            case AssistantMessage(text=text, tool_calls=calls):
                lines = [text] if text.strip() else []
                lines += [f"[tool call {c.name}: {c.arguments_json}]" for c in calls]
                if lines:
                    flat.append(AssistantMessage("\n".join(lines)))
            case ToolResultMessage(result=result):
                error = " (error)" if result.is_error else ""
                flat.append(UserMessage(f"[result of {result.name}{error}: {result.content}]"))
            case _:
                flat.append(message)
    return (*flat, UserMessage(SUMMARY_PROMPT))


def summary_context(text: str) -> tuple[Message, ...]:
    """What a child of context mode ``summary`` is given before its task."""
    return (UserMessage(SUMMARY_HEADER + text),)
