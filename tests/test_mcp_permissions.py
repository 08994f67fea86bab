"""Permission rules over MCP tools: whole-server wildcards, and ``read-only`` taking
an MCP tool only where its server marks it read-only (no server needed here)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import open_runtime

from fanfold.providers.scripted import ScriptedProvider
from fanfold.statemachine import ToolSpec
from fanfold.statemachine.agent_defs import AgentDefinition
from fanfold.statemachine.permissions import Permissions, Rule, RuleSet, allows_tool, parse_rule
from fanfold.tools.registry import ToolSet
from fanfold.tools.tool import ToolOutput


class FakeMcpTool:
    """Stands for an MCP server's tool: a spec and the server's read-only claim."""

    def __init__(self, name: str, read_only: bool) -> None:
        self.spec = ToolSpec.from_schema(name, "a fake MCP tool", {"type": "object"})
        self.read_only = read_only

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        return ToolOutput.ok("done")


@pytest.mark.parametrize(
    ("rule", "tool", "allowed"),
    [
        ("mcp__github__*", "mcp__github__create_issue", True),
        ("mcp__github__*", "mcp__gitlab__create_issue", False),
        ("mcp__github", "mcp__github__get_issue", True),
        ("mcp__github", "mcp__githubby__get_issue", False),
        ("mcp__github__create_issue", "mcp__github__create_issue", True),
        ("mcp__github__create_issue", "mcp__github__delete_repo", False),
        ("mcp__github__*", "bash", False),
    ],
)
def test_rules_name_mcp_servers_and_tools(rule: str, tool: str, allowed: bool) -> None:
    parsed = parse_rule(rule)
    assert isinstance(parsed, Rule)
    assert allows_tool(Permissions((RuleSet(allow=(parsed,)),)), tool) is allowed
    denied = Permissions((RuleSet(deny=(parsed,)),))
    assert allows_tool(denied, tool) is not allowed


def test_a_wildcard_is_only_for_mcp_names_and_takes_no_pattern() -> None:
    assert isinstance(parse_rule("bash*"), str)
    assert isinstance(parse_rule("mcp__github__*(x)"), str)


async def test_read_only_takes_an_mcp_tool_only_where_its_server_says_so(
    tmp_path: Path,
) -> None:
    tools = ToolSet.default(
        extra=[FakeMcpTool("mcp__srv__look", True), FakeMcpTool("mcp__srv__change", False)]
    )
    reader = AgentDefinition("reader", "reads", allow=(Rule("read-only"),))
    whole = AgentDefinition("whole", "one server", allow=(Rule("mcp__srv__*"),))
    none = AgentDefinition("none", "no server", deny=(Rule("mcp__srv"),))
    script = ScriptedProvider({"agents": [{"replies": [{"text": "ok"}]}]})
    offered = {}
    async with open_runtime(tmp_path, script) as runtime:
        runtime.tools = tools
        for definition in (reader, whole, none):
            root = await runtime.start("go", cwd=tmp_path, agent=definition)
            await runtime.wait(root)
            offered[definition.name] = {
                t.name for t in runtime.state(root).tools if t.name.startswith("mcp__")
            }
    assert offered == {
        "reader": {"mcp__srv__look"},
        "whole": {"mcp__srv__look", "mcp__srv__change"},
        "none": set(),
    }


def test_an_agent_files_rules_naming_mcp_tools_are_kept() -> None:
    """MCP tools are known only at run time: an agent file's allow and deny rules that
    name them are kept (a dropped deny rule would make the tool callable)."""
    from fanfold.agents.definitions import parse_definition

    text = (
        "---\nname: triager\ndescription: triages\n"
        "tools: Read, mcp__github__*\n"
        "disallowedTools: mcp__github__delete_repo\n---\nTriage.\n"
    )
    definition, problems = parse_definition(text, "triager.md")
    assert problems == ()
    assert definition is not None
    permissions = Permissions((definition.rules("."),))
    assert allows_tool(permissions, "mcp__github__get_issue")
    assert not allows_tool(permissions, "mcp__github__delete_repo")
    assert not allows_tool(permissions, "mcp__slack__post")
