"""A tiny local MCP server (the SDK's server side) for examples/mcp_tools: one
read-only tool, ``forecast``. Started by fanfold over stdio; nothing to install but
the ``mcp`` extra."""

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

FORECASTS = {"lyon": 18, "oslo": -3}

server = MCPServer("weather", log_level="ERROR")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def forecast(city: str) -> str:
    """Tomorrow's forecast for a city, in degrees Celsius."""
    degrees = FORECASTS.get(city.lower())
    if degrees is None:
        return f"no forecast for {city}"
    return f"{city}: {degrees} °C tomorrow"


if __name__ == "__main__":
    server.run()
