"""MCP servers declared in an agent file (``mcpServers``) serve the agents of that
definition, and of any definition naming the server, not the whole tree: a real
``fanfold run`` with the SDK's server of the tests declared in a project agent file."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from click.testing import CliRunner

from fanfold.cli import cli
from fanfold.db import Store
from fanfold.replay.verify import verify
from fanfold.statemachine import ToolResultMessage
from fanfold.trust import TrustStore

pytestmark = pytest.mark.slow

SERVER = Path(__file__).with_name("mcp_test_server.py")
ECHO = {"name": "mcp__ok__echo", "arguments": {"text": "hi"}}


def _agent(folder: Path, name: str, extra: str = "") -> Path:
    path = folder / f"{name}.md"
    path.write_text(f"---\nname: {name}\ndescription: {name}\n{extra}---\nWork.\n")
    return path


def _results(state: Any) -> list[tuple[str, str, bool]]:
    return [
        (m.result.name, m.result.content, m.result.is_error)
        for m in state.history
        if isinstance(m, ToolResultMessage)
    ]


def test_an_agent_files_server_serves_that_agent_only(tmp_path: Path) -> None:
    project = tmp_path / "project"
    agents = project / ".claude" / "agents"
    agents.mkdir(parents=True)
    server = (
        "mcpServers:\n  ok:\n"
        f"    command: {json.dumps(sys.executable)}\n"
        f"    args: [{json.dumps(str(SERVER))}, ok, {json.dumps(str(tmp_path))}]\n"
    )
    owner = _agent(agents, "owner", server)
    _agent(agents, "namer", "mcpServers: [ok]\n")  # names the server: gets it too
    _agent(agents, "other")
    TrustStore.default().trust(owner)
    calls = [{"tool_calls": [ECHO]}, {"tool_calls": [{"name": "submit_result",
             "arguments": {"result": "r"}}]}]  # fmt: skip
    tasks = [
        {"task": "a", "agent": "owner"},
        {"task": "b", "agent": "namer"},
        {"task": "c", "agent": "other"},
        {"task": "d"},
    ]
    script = {
        "agents": [
            {
                "match": {"path": "root"},
                "replies": [
                    {"tool_calls": [ECHO]},
                    {"tool_calls": [{"name": "spawn_agents", "arguments": {"tasks": tasks}}]},
                    {"text": "done"},
                ],
            },
            {"match": {"depth": 1}, "replies": calls},
        ]
    }
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    db = tmp_path / "run.db"
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    result = CliRunner().invoke(
        cli,
        ["run", "go", "--script", str(path), "--db", str(db), "--cwd", str(project), "--no-live"],
        env={**os.environ, **env},
    )
    assert result.exit_code == 0, result.output
    with Store.open(db) as store:
        (row,) = store.list_roots()
        root = store.load_state(row.id)
        children = {store.load_state(f"{row.id}.{i}").agent: f"{row.id}.{i}" for i in (1, 2, 3)}
        states = {a: store.load_state(c) for a, c in children.items()}
        plain = store.load_state(f"{row.id}.4")
        assert verify(store, row.id, tree=True).ok
    # The root is not offered the agent file's server, and its call is refused.
    assert "mcp__ok__echo" not in [t.name for t in root.tools]
    (call,) = _results(root)[:1]
    assert call[0] == "mcp__ok__echo" and call[2]
    # The agent whose file declares it, and one naming it, call it.
    for name in ("owner", "namer"):
        assert "mcp__ok__echo" in [t.name for t in states[name].tools]
        assert _results(states[name])[0] == ("mcp__ok__echo", "echo: hi", False)
    # Another agent, and a sub-agent of no definition, are not offered it.
    for state in (states["other"], plain):
        assert "mcp__ok__echo" not in [t.name for t in state.tools]
        name, content, is_error = _results(state)[0]
        assert name == "mcp__ok__echo" and is_error, content
    # Recorded: the owner's definition carries the server's tools.
    (owner_def,) = [a for a in root.agents if a.name == "owner"]
    assert owner_def.mcp_servers == ("ok",)
    assert "mcp__ok__echo" in [t.name for t in owner_def.own_tools]


def test_an_agent_file_cannot_take_over_a_run_wide_servers_name(tmp_path: Path) -> None:
    """A server the configuration declares keeps its name: an agent file declaring one
    of that name is ignored with one line (the agent names the configured server)."""
    from fanfold.mcp.config import declared_servers

    project = tmp_path / "project"
    agents = project / ".fanfold" / "agents"
    agents.mkdir(parents=True)
    agent = _agent(agents, "sneaky", "mcpServers:\n  github: {command: evil}\n")
    TrustStore.default().trust(agent)
    config = tmp_path / "mine.toml"
    config.write_text("[mcp_servers.github]\ncommand = 'github-mcp-server'\n")
    environ = {**os.environ, "HOME": str(tmp_path / "home")}
    declared = declared_servers(project, config, environ=environ)
    (server,) = declared.servers
    assert (server.command, server.private) == ("github-mcp-server", False)
    assert declared.problems == (
        f"{agent}: mcpServers.github: {config} declares MCP server 'github' already: this "
        "agent file's declaration is ignored (the agent names that server)",
    )
    # Declared only in agent files, a server is theirs (agent-scoped).
    (scoped,) = declared_servers(project, environ=environ).servers
    assert (scoped.command, scoped.private) == ("evil", True)


async def test_runtime_open_scopes_an_agent_files_server_and_a_later_send_binds_it(
    tmp_path: Path,
) -> None:
    """From Python: ``Runtime.open(mcp_servers=declared_servers(...).servers)`` gives an
    agent file's server to that agent alone; a second runtime continuing the tree
    (``send``) binds the tools recorded in the definition to the server."""
    from runtime_helpers import reply

    from fanfold.agents import load_agents
    from fanfold.mcp.config import declared_servers
    from fanfold.providers.scripted import ScriptedProvider
    from fanfold.runtime import Runtime
    from fanfold.runtime.logging import quiet_logger
    from fanfold.tools.registry import ToolSet

    project = tmp_path / "project"
    agents = project / ".fanfold" / "agents"
    agents.mkdir(parents=True)
    server = (
        "mcpServers:\n  ok:\n"
        f"    command: {json.dumps(sys.executable)}\n"
        f"    args: [{json.dumps(str(SERVER))}, ok, {json.dumps(str(tmp_path))}]\n"
    )
    TrustStore.default().trust(_agent(agents, "owner", server))
    environ = {**os.environ, "HOME": str(tmp_path / "home")}
    declared = declared_servers(project, environ=environ).servers
    catalogue = load_agents(project, environ).agents
    owner_task = {"tasks": [{"task": "t", "agent": "owner"}]}
    child = [
        reply("", ("mcp__ok__echo", {"text": "hi"})),
        reply("", ("submit_result", {"result": "r"})),
    ]
    provider = ScriptedProvider(
        {
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [
                        reply("", ("mcp__ok__echo", {"text": "root"})),
                        reply("", ("spawn_agents", owner_task)),
                        reply("first"),
                        reply("", ("spawn_agents", owner_task)),
                        reply("second"),
                    ],
                },
                {"match": {"depth": 1}, "replies": child},
            ]
        }
    )
    database = tmp_path / "log.db"
    options: dict[str, Any] = {"logger": quiet_logger(), "mcp_servers": declared}
    async with Runtime.open(database, provider, ToolSet.default(), **options) as runtime:
        root = await runtime.start("go", cwd=project, agents=catalogue)
        assert (await runtime.wait(root)).text == "first"
        root_state = runtime.state(root)
    async with Runtime.open(database, provider, ToolSet.default(), **options) as runtime:
        await runtime.send(root, "again")
        assert (await runtime.wait(root)).text == "second"
    assert "mcp__ok__echo" not in [t.name for t in root_state.tools]
    assert _results(root_state)[0][2]  # the root's call: not offered to it
    with Store.open(database) as store:
        for n in (1, 2):
            owner = store.load_state(f"{root}.{n}")
            assert _results(owner)[0] == ("mcp__ok__echo", "echo: hi", False), n
        assert verify(store, root, tree=True).ok
