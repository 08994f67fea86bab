"""An MCP server for the tests of MCP beyond tools (resources, prompts, a tool list that
changes, progress and log notifications), written with the SDK's ``MCPServer`` and run
as a real subprocess over stdio: ``python mcp_extras_server.py MODE [DIR]``.

- ``extras``: resources ``note://greeting`` (text), ``note://logo`` (a 300 000-byte
  PNG-typed blob) and ``note://big`` (200 000 characters of text); a prompt ``review``
  (argument ``topic``); tools ``grow`` (adds the tool ``late`` and sends
  ``notifications/tools/list_changed`` before it answers), ``late`` (added by ``grow``),
  ``busy`` (sends $PROGRESS progress notifications, default 5, and $LOGS log messages,
  default 3, then answers ``busy done``).
- ``plain``: one tool ``echo``, no resources, no prompts.
"""

import os
import sys
import warnings
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer

# The SDK warns that logging is deprecated (protocol 2026-07-28) at every log message.
warnings.simplefilter("ignore")
MODE = sys.argv[1]
DIR = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(".")
server = MCPServer(MODE, log_level="ERROR")


@server.tool()
def echo(text: str) -> str:
    """Say it back."""
    return f"echo: {text}"


if MODE == "extras":

    @server.resource("note://greeting", name="greeting", mime_type="text/plain")
    def greeting() -> str:
        return "hello from a resource"

    @server.resource("note://logo", name="logo", mime_type="image/png")
    def logo() -> bytes:
        return b"\x89PNG" + b"\x00" * 299_996

    @server.resource("note://big", name="big", mime_type="text/plain")
    def big() -> str:
        return "x" * 200_000

    @server.prompt()
    def review(topic: str) -> str:
        """Review something."""
        return f"Please review {topic}."

    def late() -> str:
        """Added later."""
        return "late answer"

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Add the tool 'late'."""
        server.add_tool(late, name="late")
        (DIR / "grown").touch()
        await ctx.session.send_tool_list_changed()
        return "grown"

    @server.tool()
    async def busy(ctx: Context) -> str:
        """Report progress and log."""
        count = int(os.environ.get("PROGRESS", "5"))
        for i in range(count):
            await ctx.report_progress(i + 1, count, f"step {i + 1}")
        for i in range(int(os.environ.get("LOGS", "3"))):
            await ctx.info(f"log line {i}")
        return "busy done"


anyio.run(server.run_stdio_async)
