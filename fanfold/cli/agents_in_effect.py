"""The agent definitions in effect for a run in a folder, their problems on stderr
(``run``, ``fanfold mcp``, ``fanfold worker``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fanfold.agents import AgentDefinition, load_agents
from fanfold.cli.display import printable
from fanfold.cli.output import hint


def agents_in_effect(
    cwd: Path, model_aliases: dict[str, str] | None = None, tools: Sequence[str] = ()
) -> tuple[AgentDefinition, ...]:
    """The agent definitions in effect for a run in ``cwd``, ``model`` names through
    the configuration's ``[model_aliases]``, ``tools`` the names of ``--tools`` (which
    rules may name). On stderr, one line each: an invalid
    file, left out (``fanfold agents`` says more), and every key or tool of a file
    that is ignored (a warning: the rest of the file is used)."""
    catalog = load_agents(cwd, model_aliases=model_aliases, tools=tools)
    for problem in catalog.problems:
        if problem.warning:
            hint(f"agent definition: {printable(str(problem))}", style="yellow")
        else:
            hint(f"agent definition left out: {printable(str(problem))}", style="yellow")
    return catalog.agents
