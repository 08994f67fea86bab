"""``fanfold agents``: the agent definitions in effect, and every file that is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fanfold.cli.errors import CliError

# What a command runs with (rich, the log, the reducer, the runtime, the providers) is
# imported in the functions that use it: `--help` imports none of it (issue 36,
# tests/test_cli_startup.py).
if TYPE_CHECKING:
    from fanfold.agents import AgentCatalog, AgentDefinition


@click.command(
    name="agents",
    epilog=("\b\nExamples:\n  fanfold agents\n  fanfold agents --cwd ~/src/app --json\n"),
)
@click.option(
    "--cwd",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="The project whose .fanfold/agents and .claude/agents are read.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def agents_command(cwd: Path, as_json: bool) -> None:
    """List the agents sub-agents can be delegated to (name, where it comes from,
    tools), and every invalid definition file with its path, line and problem.

    Exit status 1 when a file is invalid (it is left out of runs, which go on).
    """
    from fanfold.agents import load_agents
    from fanfold.cli.display import json_printable

    if not cwd.is_dir():
        raise CliError(f"--cwd {cwd} is not a directory")
    catalog = load_agents(cwd, model_aliases=_model_aliases(cwd))
    if as_json:
        # A project's agent file is untrusted text: C1 and bidirectional controls,
        # which json.dumps leaves raw, are written as JSON escapes (`show --json`'s way).
        click.echo(json_printable(json.dumps(_as_json(catalog, cwd), indent=2, ensure_ascii=False)))
    else:
        _print(catalog, cwd)
    if catalog.errors:
        raise click.exceptions.Exit(1)


def _model_aliases(cwd: Path) -> dict[str, str]:
    """The configuration's ``[model_aliases]`` (as ``fanfold run --cwd`` reads them),
    or none when there is no configuration or it does not load (``run`` says why)."""
    from fanfold.providers.config import ConfigError, load_config

    try:
        return dict(load_config(None, cwd=cwd).model_aliases)
    except ConfigError:
        return {}


def _tools(agent: AgentDefinition) -> str:
    allowed = "all of the parent's" if agent.allow is None else _rules(agent.allow)
    denied = f"; denied: {_rules(agent.deny)}" if agent.deny else ""
    return allowed + denied


def _rules(rules: tuple[Any, ...]) -> str:
    return ", ".join(str(rule) for rule in rules) or "none"


def _print(catalog: AgentCatalog, cwd: Path) -> None:
    from rich.table import Column, Table
    from rich.text import Text

    from fanfold.agents import agent_folders
    from fanfold.cli.display import printable, short
    from fanfold.cli.output import console, hint
    from fanfold.statemachine.agent_defs import ContextMode

    # Name, source and rules are folded, never cut: a path or a rule cut to
    # ".fanfold/agents/…" or "write_file(docs/…" says neither where nor what.
    table = Table(
        Column("name", overflow="fold"),
        Column("source", overflow="fold"),
        Column("tools", overflow="fold"),
        "description",
    )
    for agent in catalog.agents:
        extras = []
        if agent.model:
            extras.append(f"model {agent.model}")
        if agent.context != ContextMode.TASK_ONLY:
            extras.append(f"context {agent.context}")
        if not agent.may_delegate:
            extras.append("no delegation")
        tools = _tools(agent) + (f" ({', '.join(extras)})" if extras else "")
        # Texts come from files anyone could have written: plain Text, escaped.
        table.add_row(
            Text(printable(agent.name)),
            Text(printable(agent.source)),
            Text(printable(tools)),
            Text(short(agent.description, 70)),
        )
    console.print(table)
    for agent in catalog.overridden:
        hint(f"overridden: {printable(agent.name)} from {printable(agent.source)}", style="dim")
    for problem in catalog.problems:
        label = "warning" if problem.warning else "invalid"
        hint(f"{label}: {printable(str(problem))}", style="yellow" if problem.warning else "red")
    folders = ", ".join(str(f) for f in agent_folders(cwd))
    hint(f"searched (later overrides earlier): built-in, {printable(folders)}", style="dim")


def _as_json(catalog: AgentCatalog, cwd: Path) -> dict[str, Any]:
    from fanfold.agents import agent_folders

    def agent(a: AgentDefinition) -> dict[str, Any]:
        return {
            "name": a.name,
            "source": a.source,
            "description": a.description,
            "tools": None if a.allow is None else [str(r) for r in a.allow],
            "disallowed_tools": [str(r) for r in a.deny],
            "model": a.model,
            "max_rounds": a.max_rounds,
            "max_tokens": a.max_tokens,
            "timeout": a.timeout,
            "context": str(a.context),
            "may_delegate": a.may_delegate,
            "prompt_mode": str(a.prompt_mode),
        }

    return {
        "agents": [agent(a) for a in catalog.agents],
        "overridden": [agent(a) for a in catalog.overridden],
        "problems": [
            {
                "path": p.path,
                "line": p.line,
                "message": p.message,
                "severity": "warning" if p.warning else "error",
            }
            for p in catalog.problems
        ],
        "searched": [str(f) for f in agent_folders(cwd)],
    }
