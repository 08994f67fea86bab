"""The MCP servers' tools of a ``fanfold run``: declared for its folder, started when
its tree starts, stopped when it ends (``fanfold.mcp``)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs

from fanfold.cli.display import printable
from fanfold.cli.models import ModelChoice
from fanfold.cli.output import hint
from fanfold.tools.secrets import EnvPolicy


def declarations_for(cwd: Path, config_path: Path | None) -> tuple[Any, ...]:
    """The servers declared for ``cwd`` (each problem a yellow line); () when none, or
    when the ``mcp`` extra is missing (said once)."""
    from fanfold.mcp.config import declared_servers

    declared = declared_servers(cwd, config_path)
    for problem in declared.problems:
        hint(f"MCP: {printable(problem)}", style="yellow")
    if not declared.servers:
        return ()
    try:
        import mcp  # noqa: F401
    except ImportError:
        hint(
            "MCP servers are declared but the MCP SDK is missing: pip install 'fanfold[mcp]'",
            style="yellow",
        )
        return ()
    return declared.servers


@asynccontextmanager
async def mcp_tools(
    declarations: Sequence[Any], cwd: Path, env_policy: EnvPolicy
) -> AsyncIterator[list[Any]]:
    """The tools of ``declarations``' servers (started now, stopped on exit); every
    server that waits for trust or failed is one yellow line."""
    if not declarations:
        yield []
        return
    from fanfold.mcp.client import McpHub

    async with McpHub.open(declarations, cwd=cwd, env_policy=env_policy, environ=os.environ) as hub:
        tools, problems = await hub.discover()
        for problem in problems:
            hint(f"MCP: {printable(problem)}", style="yellow")
        yield tools


@asynccontextmanager
async def recorded_mcp_tools(
    trees: Sequence[tuple[str, Sequence[Any]]],
    config_path: Path | None,
    env_policy: EnvPolicy,
) -> AsyncIterator[list[Any]]:
    """For ``resume``: the MCP tools the trees recorded (``(cwd, tool specs)`` each),
    bound to the servers their folders declare now; a server starts only when a
    resumed call needs it (a project's only if trusted)."""
    from fanfold.mcp.client import PREFIX

    wanted = [(cwd, [s for s in specs if s.name.startswith(PREFIX)]) for cwd, specs in trees]
    wanted = [(cwd, specs) for cwd, specs in wanted if specs]
    if not wanted:
        yield []
        return
    declared: dict[str, Any] = {}
    for cwd, _ in wanted:
        for declaration in declarations_for(Path(cwd), config_path):
            declared.setdefault(declaration.name, declaration)
    if not declared:
        yield []
        return
    from fanfold.mcp.client import McpHub

    async with McpHub.open(
        declared.values(), cwd=wanted[0][0], env_policy=env_policy, environ=os.environ
    ) as hub:
        names: set[str] = set()
        tools = []
        for _, specs in wanted:
            for tool in hub.tools_for(specs):
                if tool.spec.name not in names:
                    names.add(tool.spec.name)
                    tools.append(tool)
        yield tools


def with_server_secrets(choice: ModelChoice, declarations: Sequence[Any]) -> ModelChoice:
    """``choice`` whose environment policy also treats the variables the servers'
    ``env``/``headers`` name as keys: bash commands never see them, and their values
    are redacted from the log (a server echoing its token writes no token there)."""
    from fanfold.mcp.config import secret_variables

    names = secret_variables(declarations)
    if not names:
        return choice
    policy = choice.env_policy
    return attrs.evolve(
        choice,
        env_policy=EnvPolicy(policy.key_variables | names, policy.pass_env - names),
    )
