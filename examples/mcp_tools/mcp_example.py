"""A local MCP server's tool and a Python function tool, offline: a scripted root
delegates to a sub-agent that asks the ``weather`` MCP server (weather_server.py, run
by fanfold over stdio) for a forecast and converts it with ``to_fahrenheit`` (an
ordinary typed function), then hands its finding back.

Needs the ``mcp`` extra. Run from the repository's root::

    python examples/mcp_tools/mcp_example.py /tmp/mcp.db
    fanfold show ID --db /tmp/mcp.db                       # names the MCP server
    fanfold replay ID --db /tmp/mcp.db --verify --tree     # needs neither tool

The server is declared here in code, as a user's own configuration would declare it
(``[mcp_servers.weather]`` in ~/.config/fanfold/config.toml); declared in a project's
``.mcp.json`` or ``./fanfold.toml`` it would start only after ``fanfold trust``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

import fanfold
from fanfold.mcp.config import ServerDeclaration
from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.tools.registry import ToolSet

HERE = Path(__file__).parent

WEATHER = ServerDeclaration(
    "weather",
    source="examples/mcp_tools/mcp_example.py",
    command=sys.executable,
    args=(str(HERE / "weather_server.py"),),
)


@fanfold.tool(read_only=True, idempotent=True)
def to_fahrenheit(celsius: float) -> str:
    """Convert a temperature.

    Args:
        celsius: Degrees Celsius.
    """
    return f"{celsius * 9 / 5 + 32:g} °F"


async def main(database: str) -> str:
    provider = ScriptedProvider.from_file(HERE / "script.json")
    tools = ToolSet.default(extra=[to_fahrenheit])
    # The server starts when the tree starts (its tools join the tree's tool set) and
    # stops when the runtime closes. mcp_servers="path/to/fanfold.toml" works too.
    async with Runtime.open(
        database, provider, tools, logger=quiet_logger(), mcp_servers=[WEATHER]
    ) as runtime:
        root = await runtime.start("Weather in Lyon tomorrow, in °F?", cwd=HERE)
        result = await runtime.wait(root)
    print(root)
    print(result.text)
    return root


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "mcp.db")
