"""The tools of ``Runtime.open(mcp_servers=...)``: the program's tool runner plus the
MCP servers' tools, the servers started when a tree first needs them.

``fanfold.mcp`` (the ``mcp`` extra) is imported only when servers are given: the
runtime itself loads no MCP code.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from fanfold.statemachine import ToolCall, ToolResult, ToolSpec
from fanfold.tools.base import ToolRunner
from fanfold.tools.registry import ToolSet
from fanfold.tools.secrets import EnvPolicy

if TYPE_CHECKING:
    from fanfold.mcp.client import McpHub, McpServer, McpTool
    from fanfold.mcp.config import ServerDeclaration
    from fanfold.mcp.resources import ResourceTool


def declarations_of(servers: Any) -> tuple[ServerDeclaration, ...]:
    """``mcp_servers`` as declarations: a path names a configuration file
    (``[mcp_servers]``) or a ``.mcp.json`` (``fanfold.mcp.config.servers_of``); an
    iterable holds ``ServerDeclaration`` values (``declared_servers(...).servers``)."""
    try:
        from fanfold.mcp.config import ServerDeclaration, servers_of
    except ImportError as exc:  # pragma: no cover - the config reader needs no SDK
        raise ImportError(f"mcp_servers needs fanfold.mcp: {exc}") from None
    if isinstance(servers, str | os.PathLike):
        return servers_of(servers)
    declared = tuple(servers)
    for item in declared:
        if not isinstance(item, ServerDeclaration):
            raise TypeError(
                f"mcp_servers holds {type(item).__name__}, not a ServerDeclaration "
                "(give a path to a configuration file or .mcp.json, or declarations)"
            )
    return declared


@asynccontextmanager
async def served_tools(
    base: ToolRunner, declarations: tuple[ServerDeclaration, ...], redacted: EnvPolicy
) -> AsyncIterator[ServedTools]:
    """``base`` plus ``declarations``' servers (none started yet); on exit every
    server is stopped with everything it started."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ImportError("MCP servers need the MCP SDK: pip install 'fanfold[mcp]'") from None
    from fanfold.mcp.client import McpHub

    async with McpHub.open(
        declarations, cwd=Path.cwd(), env_policy=redacted, environ=os.environ
    ) as hub:
        yield ServedTools(base, hub)


class ServedTools:
    """A ``ToolRunner``: ``base`` and the MCP tools of ``hub``.

    ``discover`` (the first ``Runtime.start``) starts the servers that may start and
    adds their tools; ``bind`` (a tree loaded to go on: ``resume``, ``send``,
    ``attach``) adds the tools of recorded specs on the servers of those names, which
    start at their first call. A server that cannot start is a problem line, logged
    once; its tools are not offered (or, recorded, give error results naming it).
    """

    def __init__(self, base: ToolRunner, hub: McpHub) -> None:
        self.base = base
        self.hub = hub
        self.problems: tuple[str, ...] = ()
        self._served: dict[str, McpTool | ResourceTool] = {}
        self._set = ToolSet([])
        self._discovered = False
        self._withdrawn: set[str] = set()
        """Tools a server stopped listing (``list_changed``): offered to no new tree."""
        self._lock = trio.Lock()

    def specs(self) -> tuple[ToolSpec, ...]:
        served = self._set.specs()
        if self._withdrawn:
            served = tuple(s for s in served if s.name not in self._withdrawn)
        return (*self.base.specs(), *served)

    async def run(self, call: ToolCall, cwd: str, *, confined: bool = False) -> ToolResult:
        if call.name in self._set:
            return await self._set.run(call, cwd)
        if confined:
            return await self.base.run(call, cwd, confined=True)
        return await self.base.run(call, cwd)

    def scoped_specs(self) -> tuple[ToolSpec, ...]:
        """The specs of the tools of servers declared in agent files (``private``):
        the runtime gives them to the definitions that name their servers."""
        from fanfold.mcp.client import served_privately

        return tuple(t.spec for t in self._served.values() if served_privately(t))

    def read_only(self, name: str) -> bool:
        """As ``ToolSet.read_only``: the tool says it changes nothing."""
        if name in self._set:
            return self._set.read_only(name)
        answer = getattr(self.base, "read_only", None)
        return bool(answer(name)) if answer is not None else False

    def idempotent(self, name: str) -> bool:
        """As ``ToolSet.idempotent``: a second call is harmless (for MCP tools, the
        configuration's ``idempotent_tools``)."""
        if name in self._set:
            return self._set.idempotent(name)
        answer = getattr(self.base, "idempotent", None)
        return bool(answer(name)) if answer is not None else False

    async def discover(self) -> tuple[str, ...]:
        """Start the servers (once) and offer their tools; the problems found. Called
        again (the next tree's start), it lists anew the tools of each server that sent
        ``notifications/tools/list_changed`` since and was not yet listed anew after a
        call (``tool_changes``; an agent file's server only here): the next tree is
        offered the server's tools as they are now, recorded in its creation event."""
        async with self._lock:
            if not self._discovered:
                tools, problems = await self.hub.discover()
                self._add([*tools, *self.hub.resource_tools()])
                self.problems = tuple(problems)
                self._discovered = True
                return self.problems
            found: list[str] = []
            for server in self.hub.changed():
                found += await self._relist(server)
            return tuple(found)

    async def tool_changes(self) -> list[tuple[str, tuple[ToolSpec, ...]]]:
        """The servers shared by the run that sent ``notifications/tools/list_changed``
        since their tools were listed, each with its tools as listed now (the runner
        takes them at once). The runtime asks after each tool call and, before that
        call's result, gives every conversation a ``ToolsChanged``: the reducer
        replaces the server's tools from its next model call on, recorded in the log
        (replay needs no server). An agent file's server is listed anew at the next
        tree's start (``discover``)."""
        changed = [s for s in self.hub.changed() if not s.declaration.private]
        if not changed:
            return []
        made: list[tuple[str, tuple[ToolSpec, ...]]] = []
        async with self._lock:
            for server in changed:
                for line in await self._relist(server):
                    self.hub.logger.warning("mcp_problem", problem=line)
                specs = tuple(
                    t.spec
                    for n, t in self._served.items()
                    if getattr(t, "server", None) is server and n not in self._withdrawn
                )
                made.append((server.name, specs))
        return made

    async def _relist(self, server: McpServer) -> list[str]:
        """List ``server``'s tools anew into the runner; the lines to log."""
        found: list[str] = []
        tools, problems = await self.hub.relist(server)
        before = {
            n
            for n, t in self._served.items()
            if getattr(t, "server", None) is server and n not in self._withdrawn
        }
        now = {t.spec.name for t in tools}
        # A tool the server no longer lists is offered to no new tree; kept for
        # the trees that recorded it (their calls reach the server, which
        # answers for itself).
        self._withdrawn = (self._withdrawn | (before - now)) - now
        for tool in tools:  # a changed tool's new spec replaces the old
            self._served[tool.spec.name] = tool
        self._set = ToolSet(list(self._served.values()))
        added, gone = sorted(now - before), sorted(before - now)
        found += problems
        found.append(
            f"MCP server {server.name!r} changed its tools (tools/list_changed): "
            f"added {', '.join(added) or 'none'}; removed {', '.join(gone) or 'none'}"
        )
        return found

    def bind(self, specs: Iterable[ToolSpec]) -> None:
        """The recorded MCP tools among ``specs``, on the servers of those names."""
        wanted = [s for s in specs if s.name not in self._served]
        if wanted:
            self._add(self.hub.tools_for(wanted))

    def _add(self, tools: Iterable[McpTool | ResourceTool]) -> None:
        for tool in tools:
            self._served.setdefault(tool.spec.name, tool)
        self._set = ToolSet(list(self._served.values()))
