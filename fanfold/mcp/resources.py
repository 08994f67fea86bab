"""MCP servers' resources as two tools, as Claude Code offers them: ``list_mcp_resources``
(``server``) and ``read_mcp_resource`` (``server``, ``uri``).

They are offered when at least one started server shared by the run (declared in
fanfold.toml or ``.mcp.json``, not in an agent file) declares the ``resources``
capability; their ``server`` argument is an enum of those servers, recorded in the
spec with the tree's tool set, so a resumed tree or a replay sees what was offered.
Both are marked read-only (MCP's resources are data the server exposes for reading).

Permissions (``fanfold.statemachine.permissions``): a call naming server S is
matched by a rule naming the tool (``read_mcp_resource``, Claude Code's
``ReadMcpResourceTool``; ``list_mcp_resources``, ``ListMcpResourcesTool``), by
``read-only``, and by every rule that names all of S's tools (``mcp__S``,
``mcp__S__*``, ``mcp__*``): an agent denied server S cannot read its resources, one
allowed only server S can. A server waiting for trust is never started: its resources
are not offered, and a call naming it gets the error result saying so.

Results are tool results: recorded in the log (replay and verify never contact the
server), text cut to the model's limit as any MCP result; binary contents (``blob``)
are described by URI, MIME type and size, never shown.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fanfold.statemachine import ToolSpec
from fanfold.statemachine.permissions import LIST_MCP_RESOURCES, READ_MCP_RESOURCE
from fanfold.tools.output import HeadTailBuffer
from fanfold.tools.tool import ToolOutput

if TYPE_CHECKING:
    from fanfold.mcp.client import McpHub

__all__ = ["LIST_MCP_RESOURCES", "READ_MCP_RESOURCE", "ResourceTool", "resource_tools"]

MAX_OUTPUT_CHARS = 30_000
"""Characters of a resource listing or contents the model is given (as a tool result)."""
MAX_RESOURCES = 500
"""Resources a listing names (its pages read until then)."""


def resource_specs(servers: list[str]) -> tuple[ToolSpec, ToolSpec]:
    """The two tools' specs for ``servers`` (the enum of their ``server`` argument)."""
    server = {
        "type": "string",
        "enum": servers,
        "description": "The MCP server: " + ", ".join(servers),
    }
    listing = ToolSpec.from_schema(
        LIST_MCP_RESOURCES,
        "List the resources (files, records, documents) an MCP server offers: each "
        "resource's URI, name, MIME type and description. Read one with "
        f"{READ_MCP_RESOURCE}.",
        {
            "type": "object",
            "properties": {"server": server},
            "required": ["server"],
            "additionalProperties": False,
        },
        read_only=True,
    )
    reading = ToolSpec.from_schema(
        READ_MCP_RESOURCE,
        f"Read one resource of an MCP server by its URI (as {LIST_MCP_RESOURCES} gives it).",
        {
            "type": "object",
            "properties": {
                "server": server,
                "uri": {"type": "string", "description": "The resource's URI"},
            },
            "required": ["server", "uri"],
            "additionalProperties": False,
        },
        read_only=True,
    )
    return listing, reading


class ResourceTool:
    """``list_mcp_resources`` or ``read_mcp_resource`` over ``hub``'s servers."""

    read_only = True
    idempotent = True
    """Reading twice is harmless: a call in flight at a crash is sent again."""

    def __init__(self, hub: McpHub, spec: ToolSpec) -> None:
        self.hub = hub
        self.spec = spec

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        name = str(args.get("server", ""))
        server = self.hub.servers.get(name)
        if server is None or server.declaration.private:
            served = ", ".join(sorted(s for s, v in self.hub.servers.items() if v.has_resources))
            return ToolOutput.error(
                f"no MCP server {name!r} offering resources here (servers that do: "
                f"{served or 'none'})"
            )
        if self.spec.name == LIST_MCP_RESOURCES:
            return await server.request(_listing, "resources/list")
        uri = str(args.get("uri", ""))
        return await server.request(lambda session: _contents(session, uri), "resources/read")


def resource_tools(hub: McpHub) -> list[ResourceTool]:
    """The two tools, if some started server shared by the run offers resources."""
    servers = [
        s.name for s in hub.servers.values() if s.has_resources and not s.declaration.private
    ]
    if not servers:
        return []
    return [ResourceTool(hub, spec) for spec in resource_specs(servers)]


async def _listing(session: Any) -> ToolOutput:
    import mcp_types

    lines: list[str] = []
    cursor: str | None = None
    pages = 0
    while len(lines) < MAX_RESOURCES and pages < 50:
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_resources(params=params)
        pages += 1
        for resource in page.resources:
            line = f"{resource.uri}"
            if resource.name:
                line += f"  name: {resource.name}"
            if resource.mime_type:
                line += f"  type: {resource.mime_type}"
            if resource.description:
                line += f"  - {' '.join(str(resource.description).split())[:300]}"
            lines.append(line)
        cursor = page.next_cursor
        if not cursor:
            break
    if cursor and len(lines) >= MAX_RESOURCES:
        lines.append(f"[more resources not listed: the first {MAX_RESOURCES} are shown]")
    return ToolOutput.ok(_capped("\n".join(lines) if lines else "(no resources)"))


async def _contents(session: Any, uri: str) -> ToolOutput:
    result = await session.read_resource(uri)
    parts: list[str] = []
    for content in result.contents:
        text = getattr(content, "text", None)
        if text is not None:
            parts.append(text)
            continue
        blob = getattr(content, "blob", "") or ""
        size = _decoded_size(blob)
        kind = content.mime_type or "unknown type"
        parts.append(f"[binary resource {content.uri}: {kind}, {size} bytes, not shown]")
    return ToolOutput.ok(_capped("\n".join(parts) if parts else "(empty resource)"))


def _decoded_size(blob: str) -> int:
    """Bytes of base64 ``blob`` (without decoding a large one)."""
    if len(blob) <= 4096:
        try:
            return len(base64.b64decode(blob, validate=False))
        except ValueError:
            pass
    padding = len(blob) - len(blob.rstrip("="))
    return len(blob) * 3 // 4 - padding


def _capped(text: str) -> str:
    if len(text) <= MAX_OUTPUT_CHARS:
        return text
    buffer = HeadTailBuffer(MAX_OUTPUT_CHARS)
    buffer.feed(text.encode())
    return buffer.text()
