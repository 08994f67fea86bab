"""Agent definitions: files users write to say what kind of agent to delegate to.

``load_agents(project)`` finds them (built-ins, the user's folders, the project's)
and returns an ``AgentCatalog``; its ``agents`` go to ``Runtime.start(agents=...)``,
and from there, as data, to the reducer.
"""

from fanfold.agents.catalog import AgentCatalog, agent_folders, load_agents
from fanfold.agents.definitions import AgentProblem, parse_definition
from fanfold.statemachine.agent_defs import AgentDefinition, PromptMode

__all__ = [
    "AgentCatalog",
    "AgentDefinition",
    "AgentProblem",
    "PromptMode",
    "agent_folders",
    "load_agents",
    "parse_definition",
]
