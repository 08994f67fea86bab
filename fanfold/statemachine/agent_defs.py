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
from fanfold.statemachine.permissions import Rule, RuleSet


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
    - ``model``: a model profile or name; None: the parent's.
    - ``max_rounds``, ``max_tokens``, ``timeout``: caps; the parent's limits (and the
      share of its budget it has left) cap them in turn.
    - ``may_delegate``: False: it is not offered ``spawn_agents``.
    - ``context``: what it is given besides its task (a task may say otherwise).
    - ``source``: where it was found (a path, or ``built-in``), for people.
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

    def rules(self, base: str) -> RuleSet:
        """Its rules as a layer, path patterns relative to ``base``."""
        return RuleSet(self.allow, self.deny, f"agent '{self.name}'", base)

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
