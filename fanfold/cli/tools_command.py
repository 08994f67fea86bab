"""``fanfold tools``: the tools a run in a folder is offered, where each comes from, and
which agents' permissions allow it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fanfold.cli.errors import CliError, user_errors
from fanfold.cli.python_tools import load_tools, tools_option

# What a command runs with (rich, the log, the reducer, the runtime, the providers) is
# imported in the functions that use it: `--help` imports none of it (issue 36,
# tests/test_cli_startup.py).
if TYPE_CHECKING:
    from fanfold.providers.config import Config


@click.command(
    "tools",
    epilog=(
        "\b\nExamples:\n  fanfold tools\n  fanfold tools --tools ./mytools.py:lookup_issue --json\n"
    ),
)
@click.option(
    "--cwd",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="The folder a run would work in (its agent definitions are read).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Configuration (TOML; default: $FANFOLD_CONFIG, ./fanfold.toml, "
    "~/.config/fanfold/config.toml).",
)
@tools_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def tools_command(
    cwd: Path, config_path: Path | None, tool_refs: tuple[str, ...], as_json: bool
) -> None:
    """List the tools `fanfold run` offers: each with where it comes from, whether it
    only reads, and which agents' permission rules allow it (the root has no rules:
    it may call every tool)."""
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Column, Table
    from rich.text import Text

    from fanfold.cli.display import json_printable, printable, short
    from fanfold.cli.output import console, hint
    from fanfold.providers.config import load_config

    if not cwd.is_dir():
        raise CliError(f"--cwd {cwd} is not a directory")
    with user_errors():
        config = load_config(config_path, cwd=cwd)
    python_tools = load_tools(tool_refs)
    listing = _listing(config, cwd.resolve(), python_tools, tool_refs)
    _add_mcp(listing, config, cwd.resolve(), config_path)
    if as_json:
        # Tool descriptions come from agent files and MCP servers: escaped as `agents`.
        click.echo(json_printable(json.dumps(listing, indent=2, ensure_ascii=False)))
        return
    # A tool's name is what a user copies into an agent file's rules: never folded
    # across lines (it was, at the 80 columns rich assumes when stdout is not a
    # terminal); the other columns give way.
    longest = max((len(t["name"]) for t in listing["tools"]), default=4)
    table = Table(
        Column("tool", no_wrap=True, min_width=longest),
        Column("source", overflow="fold"),
        "reads only",
        Column("agents allowed", overflow="fold"),
        "description",
    )
    for tool in listing["tools"]:
        table.add_row(
            Text(tool["name"]),
            Text(printable(tool["source"])),
            "yes" if tool["read_only"] else "no",
            Text(printable(", ".join(tool["agents"]) or "none")),
            Text(short(tool["description"], 60)),
        )
    out = console
    if not console.is_terminal:
        # Into a pipe or a file: the table at its natural width, one line per tool
        # (rich folded it into the 80 columns it assumes, a tool's name over several
        # lines), for grep and the like; --json for programs. A console of its own:
        # print(width=) cannot go past the console's width.
        wide = console.options.update_width(1000)
        out = Console(width=max(80, Measurement.get(console, wide, table).maximum))
    out.print(table)
    for agent, problems in listing["agents_left_out"].items():
        hint(f"agent definition left out: {printable(agent)}: {printable(problems)}", style="red")
    for server in listing["mcp_servers"]:
        if server["status"] != "started":
            hint(printable(server["problem"]), style="yellow")
        for left in server["left_out"]:
            hint(printable(left), style="yellow")
        if server.get("prompts"):
            hint(
                printable(
                    f"MCP server {server['name']} prompts (for you, not offered to the "
                    f"model): {', '.join(server['prompts'])}"
                ),
                style="dim",
            )
    if "web_fetch" not in [t["name"] for t in listing["tools"]]:
        hint("web_fetch: not offered (no [tools.web_fetch] domains configured)", style="dim")


def _listing(
    config: Config, cwd: Path, python_tools: list[Any], tool_refs: tuple[str, ...]
) -> dict[str, Any]:
    from fanfold.agents import load_agents
    from fanfold.statemachine.permissions import Permissions, allows_tool, reading_tools
    from fanfold.tools.registry import ToolSet
    from fanfold.tools.secrets import EnvPolicy

    env_policy = EnvPolicy(frozenset(config.key_variables()), frozenset(config.pass_env))
    builtin = ToolSet.default(env_policy=env_policy, web_domains=config.web_domains)
    tools = ToolSet.default(
        env_policy=env_policy, web_domains=config.web_domains, extra=python_tools
    )
    catalog = load_agents(cwd, model_aliases=dict(config.model_aliases))
    # What read-only stands for here: fanfold's reading tools and the Python tools
    # that say they only read (as the reducer decides from the recorded specs).
    reading = reading_tools(tools.specs())
    entries = []
    for spec in tools.specs():
        source = "built-in"
        if spec.name not in builtin.names:
            source = f"Python: --tools {', '.join(tool_refs)}"
        elif spec.name == "web_fetch":
            source = f"built-in; domains from [tools.web_fetch] of {config.source}"
        agents = [
            agent.name
            for agent in catalog.agents
            if allows_tool(Permissions((agent.rules(str(cwd)),)), spec.name, reading)
        ]
        entries.append(
            {
                "name": spec.name,
                "source": source,
                "read_only": tools.read_only(spec.name),
                "description": spec.description,
                "agents": agents,
            }
        )
    left_out: dict[str, str] = {}
    for problem in catalog.errors:
        left_out[problem.path] = "; ".join(
            filter(None, (left_out.get(problem.path), f"{problem.line}: {problem.message}"))
        )
    return {
        "config": config.source,
        "tools": entries,
        "web_domains": list(config.web_domains),
        "agents_left_out": left_out,
    }


def _add_mcp(listing: dict[str, Any], config: Config, cwd: Path, config_path: Path | None) -> None:
    """Start the folder's MCP servers that may start, list their tools into
    ``listing["tools"]`` and each server's state into ``listing["mcp_servers"]``."""
    from fanfold.agents import load_agents
    from fanfold.cli.mcp_tools import declarations_for
    from fanfold.statemachine.agent_defs import with_own_tools
    from fanfold.statemachine.permissions import Permissions, allows_tool, reading_tools
    from fanfold.tools.secrets import EnvPolicy

    listing["mcp_servers"] = []
    declarations = declarations_for(cwd, config_path)
    if not declarations:
        return
    import trio

    from fanfold.mcp.client import McpHub

    env_policy = EnvPolicy(frozenset(config.key_variables()), frozenset(config.pass_env))
    catalog = load_agents(cwd, model_aliases=dict(config.model_aliases))

    async def discover() -> tuple[list[Any], list[Any], list[Any]]:
        async with McpHub.open(declarations, cwd=cwd, env_policy=env_policy) as hub:
            tools, _ = await hub.discover()
            return tools, list(hub.servers.values()), hub.resource_tools()

    tools, servers, resource_tools = trio.run(discover)
    reading = reading_tools(tuple(t.spec for t in tools))
    scoped = tuple(t.spec for t in tools if t.server.declaration.private)
    agents = with_own_tools(catalog.agents, scoped)
    for tool in tools:
        declaration = tool.server.declaration
        listing["tools"].append(
            {
                "name": tool.spec.name,
                "source": f"MCP server {declaration.name} ({declaration.source})",
                "read_only": tool.read_only,
                "description": tool.spec.description,
                # An agent file's server serves the agents that name it, no other.
                "agents": [
                    a.name
                    for a in agents
                    if allows_tool(Permissions((a.rules(str(cwd)),)), tool.spec.name, reading)
                    and (not declaration.private or tool.spec in a.own_tools)
                ],
                "scope": "agents naming it" if declaration.private else "run",
                "server": declaration.name,
                "idempotent": tool.idempotent,
            }
        )
    if resource_tools:
        reading = reading_tools(tuple(t.spec for t in [*tools, *resource_tools]))
    for tool in resource_tools:
        listing["tools"].append(
            {
                "name": tool.spec.name,
                "source": "MCP resources of "
                + ", ".join(s.name for s in servers if s.has_resources),
                "read_only": True,
                "description": tool.spec.description,
                "agents": [
                    a.name
                    for a in agents
                    if allows_tool(Permissions((a.rules(str(cwd)),)), tool.spec.name, reading)
                ],
                "scope": "run",
                "server": None,
                "idempotent": True,
            }
        )
    for server in servers:
        declaration = server.declaration
        status = "started"
        if declaration.needs_trust:
            status = "waits for trust"
        elif server.problem is not None:
            status = "failed"
        listing["mcp_servers"].append(
            {
                "name": declaration.name,
                "source": declaration.source,
                "transport": declaration.transport,
                "declared_by": "project" if declaration.project else "user",
                # Names of the variables it is given, never their values.
                "env": [name for name, _ in declaration.env],
                "headers": [name for name, _ in declaration.headers],
                "status": status,
                "problem": server.problem,
                "left_out": list(server.left_out),
                "resources": server.has_resources,
                # MCP prompts are the user's (Claude Code's slash commands): listed
                # here, never offered to the model.
                "prompts": list(server.prompts),
            }
        )
