"""Issue 35: where ask rules and tools that need approval come from (fanfold.toml,
an MCP server's declaration, an agent file, a Python tool) and the CLI's checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import fanfold
from fanfold.agents.definitions import parse_definition
from fanfold.cli import cli
from fanfold.mcp.config import servers_in
from fanfold.providers.config import ConfigError, parse_config
from fanfold.statemachine import ToolCall
from fanfold.statemachine.approvals import needs_decision
from fanfold.statemachine.permissions import Permissions, RuleSet


def test_permissions_in_fanfold_toml() -> None:
    config = parse_config({"permissions": {"ask": ["Bash(git push:*)"], "approval_timeout": 3600}})
    assert config.ask == ("Bash(git push:*)",) and config.approval_timeout == 3600.0
    with pytest.raises(ConfigError, match=r"permissions\.ask\[0\]"):
        parse_config({"permissions": {"ask": ["bash(x"]}})
    with pytest.raises(ConfigError, match="permissions"):
        parse_config({"permissions": {"asks": []}})


def test_an_mcp_servers_ask_tools() -> None:
    (server,) = servers_in(
        b'[mcp_servers.github]\ncommand = "gh-mcp"\nask_tools = ["create_*"]\n',
        Path("fanfold.toml"),
    )
    assert server.asks("create_issue") and not server.asks("list_issues")


def test_an_agent_files_ask_key_and_a_tool_that_needs_approval() -> None:
    text = "---\nname: pusher\ndescription: pushes\nask: Bash(git push:*)\n---\nPush.\n"
    definition, problems = parse_definition(text, "pusher.md")
    assert definition is not None, problems
    layer = definition.rules("/w")
    push = ToolCall.of("c", "bash", {"command": "git push origin main"})
    decided = needs_decision(Permissions((layer,)), (), push, "/w")
    assert (
        decided is not None and decided.rule == "the ask rule 'bash(git push*)' of agent 'pusher'"
    )

    @fanfold.tool(needs_approval=True)
    def deploy(service: str) -> str:
        """Deploy a service.

        Args:
            service: the service's name.
        """
        return service

    assert deploy.spec.needs_approval
    call = ToolCall.of("d", "deploy", {"service": "api"})
    assert needs_decision(None, (deploy.spec,), call, "/w") is not None
    assert needs_decision(Permissions((RuleSet(),)), (), call, "/w") is None


def test_bad_input_to_the_commands_is_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    db = tmp_path / "x.db"
    bad_rule = runner.invoke(cli, ["run", "go", "--ask", "bash(", "--db", str(db)])
    assert bad_rule.exit_code == 2 and "--ask" in bad_rule.output
    for args in (["approve", "nope"], ["deny", "nope", "--reason", "r"], ["answer", "nope", "t"]):
        done = runner.invoke(cli, [*args, "--db", str(db)])
        assert done.exit_code == 2, done.output
        assert done.exception is None or isinstance(done.exception, SystemExit)
    args_not_json = runner.invoke(cli, ["approve", "x", "--args", "{", "--db", str(db)])
    assert args_not_json.exit_code == 2 and "--args is not JSON" in args_not_json.output
