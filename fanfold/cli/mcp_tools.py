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
from fanfold.cli.output import hint, quietly
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


def _say_failure(line: str) -> None:
    """A server's failure during a call, for the user: one yellow line with the last
    lines of its stderr (the model's error result has the message alone)."""
    quietly(lambda: hint(f"MCP: {printable(line)}", style="yellow"))


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
        hub.on_failure = _say_failure
        tools, problems = await hub.discover()
        for problem in problems:
            hint(f"MCP: {printable(problem)}", style="yellow")
        # With list_mcp_resources and read_mcp_resource when a server offers resources.
        yield [*tools, *hub.resource_tools()]


@asynccontextmanager
async def worker_tools(
    declarations: Sequence[Any], cwd: Path, env_policy: EnvPolicy, base: Any
) -> AsyncIterator[Any]:
    """For ``fanfold worker``: ``base`` (its tool runner) plus the tools of the servers
    declared for the worker's own folder and configuration, started now, once, and
    stopped on exit (each problem, such as a server waiting for trust, one yellow
    line). Every tree the worker starts is offered them; a tree it resumes (taken over
    from another worker) has its recorded MCP tools bound by name to this worker's
    servers (``ServedTools.bind``); one of a server this worker lacks is an unknown
    tool, whose calls get error results naming it. ``base`` as it is when none are
    declared: nothing of the MCP SDK is imported then."""
    if not declarations:
        yield base
        return
    from fanfold.mcp.client import McpHub
    from fanfold.runtime.served import ServedTools

    async with McpHub.open(declarations, cwd=cwd, env_policy=env_policy, environ=os.environ) as hub:
        hub.on_failure = _say_failure
        served = ServedTools(base, hub)
        for problem in await served.discover():
            hint(f"MCP: {printable(problem)}", style="yellow")
        yield served


def unserved_agent_servers(
    agents: Sequence[Any], declarations: Sequence[Any], cwd: str
) -> list[str]:
    """For ``fanfold worker``: one line per agent definition of a tree's folder that
    names MCP servers the worker does not run (a worker never starts a tree's folder's
    servers, its agent files' included)."""
    served = {d.name for d in declarations}
    lines = []
    for agent in agents:
        missing = [name for name in agent.mcp_servers if name not in served]
        if missing:
            names = ", ".join(repr(name) for name in missing)
            lines.append(
                printable(
                    f"MCP: agent {agent.name!r} of {cwd} names server {names}, which this "
                    "worker does not run (a worker starts only its own folder's servers): "
                    "not offered"
                )
            )
    return lines


def scoped_to_agents(
    agents: tuple[Any, ...], tools: Sequence[Any]
) -> tuple[tuple[Any, ...], list[Any]]:
    """``agents`` given the tools of the servers their files declare (``own_tools``)
    and ``tools`` without those of an agent file's server that no definition names
    (one yellow line each: it serves nobody). The root is offered none of them
    (``Runtime.start``); ``delegation.child_setup`` gives them to those agents."""
    if not tools:
        return agents, []  # no server declared: nothing of fanfold.mcp is imported
    from fanfold.mcp.client import served_privately
    from fanfold.statemachine.agent_defs import with_own_tools

    scoped = tuple(t.spec for t in tools if served_privately(t))
    if not scoped:
        return agents, list(tools)
    agents = with_own_tools(agents, scoped)
    owned = {t.name for a in agents for t in a.own_tools}
    private = [t for t in tools if served_privately(t)]
    idle = {t.server.name for t in private} - {
        t.server.name for t in private if t.spec.name in owned
    }
    for name in sorted(idle):
        hint(f"MCP: server {name!r} of an agent file serves no agent in effect", style="yellow")
    return agents, [t for t in tools if not served_privately(t) or t.spec.name in owned]


@asynccontextmanager
async def scoped_mcp_tools(
    declarations: Sequence[Any], cwd: Path, env_policy: EnvPolicy, agents: tuple[Any, ...]
) -> AsyncIterator[tuple[tuple[Any, ...], list[Any]]]:
    """``mcp_tools``, then ``scoped_to_agents``: the agents and the tools to offer."""
    async with mcp_tools(declarations, cwd, env_policy) as served:
        yield scoped_to_agents(agents, served)


def recorded_specs(state: Any) -> tuple[Any, ...]:
    """A tree's recorded tool specs for ``resume`` and ``send``: its root's, and the
    tools of the agent-scoped servers its catalogue's definitions own."""
    return (*state.tools, *(t for a in state.agents for t in a.own_tools))


def recorded_declarations(
    trees: Sequence[tuple[str, Sequence[Any]]], config_path: Path | None
) -> tuple[Any, ...]:
    """For ``resume`` and ``send``: the servers declared now in the folders of the trees
    (``(cwd, recorded tool specs)`` each) that recorded MCP tools; a name declared in
    two folders is the first folder's."""
    from fanfold.statemachine.permissions import MCP_PREFIX, MCP_RESOURCE_TOOLS

    declared: dict[str, Any] = {}
    for cwd in dict.fromkeys(
        cwd
        for cwd, specs in trees
        if any(s.name.startswith(MCP_PREFIX) or s.name in MCP_RESOURCE_TOOLS for s in specs)
    ):
        for declaration in declarations_for(Path(cwd), config_path):
            declared.setdefault(declaration.name, declaration)
    return tuple(declared.values())


@asynccontextmanager
async def recorded_mcp_tools(
    trees: Sequence[tuple[str, Sequence[Any]]],
    declarations: Sequence[Any],
    env_policy: EnvPolicy,
) -> AsyncIterator[list[Any]]:
    """For ``resume`` and ``send``: the MCP tools the trees recorded, bound to
    ``declarations`` (``recorded_declarations``); a server starts only when a resumed
    call needs it (a project's only if trusted)."""
    if not declarations:
        yield []
        return
    from fanfold.mcp.client import McpHub

    first = next((cwd for cwd, _ in trees), ".")
    async with McpHub.open(
        declarations, cwd=first, env_policy=env_policy, environ=os.environ
    ) as hub:
        hub.on_failure = _say_failure
        names: set[str] = set()
        tools = []
        for _, specs in trees:
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


class RefreshingTools:
    """A command's tool set (fixed: built with the servers' tools when the command
    started) plus what a server lists after ``notifications/tools/list_changed``: the
    runner ``Runtime.refresh_tools`` asks after each tool call (``tool_changes``), as
    ``ServedTools`` is for ``Runtime.open(mcp_servers=...)``. A tool the server stopped
    listing is offered to no new tree."""

    def __init__(self, base: Any, hub: Any) -> None:
        import trio

        from fanfold.tools.registry import ToolSet

        self.base = base
        self.hub = hub
        self._added: dict[str, Any] = {}
        self._set = ToolSet([])
        self._withdrawn: set[str] = set()
        self._lock = trio.Lock()

    def specs(self) -> tuple[Any, ...]:
        added = self._set.specs()
        names = {s.name for s in added} | self._withdrawn
        return (*(s for s in self.base.specs() if s.name not in names), *added)

    async def run(self, call: Any, cwd: str, *, confined: bool = False) -> Any:
        if call.name in self._set:
            return await self._set.run(call, cwd)
        if confined:
            return await self.base.run(call, cwd, confined=True)
        return await self.base.run(call, cwd)

    def read_only(self, name: str) -> bool:
        """As ``ToolSet.read_only``."""
        return bool(self._set.read_only(name) if name in self._set else self.base.read_only(name))

    def idempotent(self, name: str) -> bool:
        """As ``ToolSet.idempotent``."""
        if name in self._set:
            return bool(self._set.idempotent(name))
        return bool(self.base.idempotent(name))

    def in_process(self, name: str) -> bool:
        """As ``ToolSet.in_process``; a tool a server added runs as a task."""
        return name not in self._set and bool(self.base.in_process(name))

    def answer(self, call: Any, cwd: str, *, confined: bool = False) -> Any:
        """As ``ToolSet.answer`` (never a server's tool: see ``in_process``)."""
        return self.base.answer(call, cwd, confined=confined)

    async def tool_changes(self) -> list[tuple[str, tuple[Any, ...]]]:
        """The shared servers that said their tools changed, each with its tools as
        listed now (taken into this runner); see ``ServedTools.tool_changes``."""
        from fanfold.tools.registry import ToolSet

        made: list[tuple[str, tuple[Any, ...]]] = []
        async with self._lock:
            for server in [s for s in self.hub.changed() if not s.declaration.private]:
                tools, problems = await self.hub.relist(server)
                for problem in problems:
                    self.hub.logger.warning("mcp_problem", problem=problem)
                prefix = f"mcp__{server.name}__"
                listed = {t.spec.name for t in tools}
                offered = {s.name for s in self.specs() if s.name.startswith(prefix)}
                self._withdrawn = (self._withdrawn | (offered - listed)) - listed
                for tool in tools:
                    self._added[tool.spec.name] = tool
                self._set = ToolSet(list(self._added.values()))
                self.hub.logger.warning(
                    "mcp_problem",
                    problem=f"MCP server {server.name!r} changed its tools "
                    f"(tools/list_changed): now {', '.join(sorted(listed)) or 'none'}",
                )
                made.append((server.name, tuple(t.spec for t in tools)))
        return made


def refreshing(tools: Any, extra: Sequence[Any]) -> Any:
    """``tools`` (a command's tool set holding ``extra``, the servers' tools) as a
    runner that takes a server's changed tool list (``RefreshingTools``); ``tools``
    itself when no server is running."""
    hub = next(
        (
            getattr(t, "hub", None) or getattr(getattr(t, "server", None), "hub", None)
            for t in extra
            if getattr(t, "hub", None) or getattr(t, "server", None)
        ),
        None,
    )
    return tools if hub is None else RefreshingTools(tools, hub)
