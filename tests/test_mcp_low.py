"""Issue 33, item 9 (the "Low" items of MCP servers as tools): a missing server program
named as the supervisor said it, stderr kept out of the model's context, HTTP servers
reconnected a bounded number of times with back-off, a recorded tool of a server not
declared now, and a server offering two tools of one name. Real servers
(tests/mcp_test_server.py) as subprocesses, except where no server is the point."""

from __future__ import annotations

import itertools
import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

pytest.importorskip("mcp")

from structlog.testing import capture_logs

from fanfold.mcp import client
from fanfold.mcp.client import McpHub
from fanfold.mcp.config import ServerDeclaration
from fanfold.statemachine import ToolCall
from fanfold.tools.registry import ToolSet

SERVER = Path(__file__).with_name("mcp_test_server.py")
MISSING = "/nonexistent/fanfold-test/nope-server"


def _declaration(mode: str, where: Path, **kw: Any) -> ServerDeclaration:
    return ServerDeclaration(
        mode, "test", command=sys.executable, args=(str(SERVER), mode, str(where)), **kw
    )


async def test_a_missing_server_program_is_named_as_the_supervisor_said(tmp_path: Path) -> None:
    declaration = ServerDeclaration("nope", "test", command=MISSING)
    async with McpHub.open([declaration], cwd=tmp_path) as hub:
        tools, problems = await hub.discover()
        out = await hub.servers["nope"].call("anything", {})
    expected = f"MCP server 'nope' cannot start {MISSING}: No such file or directory"
    assert tools == [] and problems == [expected]
    assert out.is_error and out.content.startswith(expected)


def test_fanfold_tools_says_the_server_program_is_missing(tmp_path: Path) -> None:
    """The user's view: ``fanfold tools`` names the program and the system's reason."""
    from click.testing import CliRunner

    from fanfold.cli import cli

    config = tmp_path / "servers.toml"
    config.write_text(f"[mcp_servers.nope]\ncommand = {json.dumps(MISSING)}\n")
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    listed = CliRunner().invoke(
        cli, ["tools", "--json", "--cwd", str(tmp_path), "--config", str(config)], env=env
    )
    assert listed.exit_code == 0, listed.output
    (server,) = json.loads(listed.stdout)["mcp_servers"]
    assert server["status"] == "failed"
    assert f"cannot start {MISSING}: No such file or directory" in server["problem"]


async def test_the_servers_stderr_goes_to_the_log_and_the_user_not_the_model(
    tmp_path: Path,
) -> None:
    said: list[str] = []
    async with McpHub.open([_declaration("ok", tmp_path)], cwd=tmp_path) as hub:
        hub.on_failure = said.append
        tools = {t.tool: t for t in (await hub.discover())[0]}
        with capture_logs() as logs:
            died = await tools["die"].run({}, ".")
    # The model: the server's name and why, not what it wrote on stderr (another
    # call's traceback could be there).
    assert died.is_error and died.content.startswith("MCP server 'ok' died")
    assert "dying now" not in died.content and "stderr" not in died.content
    # The log and the user: the same, with the stderr tail.
    (logged,) = [e for e in logs if e["event"] == "mcp_call_failed"]
    assert logged["server"] == "ok" and logged["tool"] == "die"
    assert logged["error"] == died.content and "dying now" in logged["stderr"]
    assert len(said) == 1 and said[0].startswith(died.content) and "dying now" in said[0]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_an_http_server_is_reconnected_a_bounded_number_of_times_with_back_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing listens: each call tries again (on main the second call already said
    "restarted once already"), each later attempt waiting longer after the last
    failure, until the bound."""
    monkeypatch.setattr(client, "HTTP_RECONNECTS", 3, raising=False)
    monkeypatch.setattr(client, "RECONNECT_BACKOFF", 0.2, raising=False)
    url = f"http://127.0.0.1:{_closed_port()}/mcp"
    declaration = ServerDeclaration("web", "test", url=url, startup_timeout=10)
    async with McpHub.open([declaration], cwd=tmp_path) as hub:
        server = hub.servers["web"]
        outs, failed_at = [], []
        for _ in range(5):
            outs.append(await server.call("echo", {"text": "x"}))
            failed_at.append(trio.current_time())
    assert all(o.is_error and o.content.startswith("MCP server 'web'") for o in outs)
    assert "failed to start" in outs[3].content  # 1 start and 3 reconnections tried
    assert outs[4].content.endswith("and was reconnected 3 times already")
    assert server.starts == 4
    # (Each wait counts from the failure, a moment before the call returned.)
    gaps = [b - a for a, b in itertools.pairwise(failed_at[:4])]
    assert all(g > w - 0.05 for g, w in zip(gaps, (0.2, 0.4, 0.8), strict=True)), gaps
    assert failed_at[4] - failed_at[3] < 0.2  # the refusal waits for nothing


async def test_a_tool_offered_twice_by_one_server_is_left_out_once(tmp_path: Path) -> None:
    async with McpHub.open([_declaration("dupes", tmp_path)], cwd=tmp_path) as hub:
        tools, problems = await hub.discover()
        # A run's tool set takes them (on main: "duplicate tool name 'mcp__dupes__fine'").
        toolset = ToolSet.default(extra=tools)
        out = await toolset.run(ToolCall.of("c1", "mcp__dupes__fine", {}), ".")
    assert [(t.tool, t.spec.description) for t in tools] == [
        ("fine", "first"),
        ("weird", "weird (MCP server dupes)"),
    ]
    assert problems == [
        "MCP server 'dupes': tool 'fine' left out: the server offers another tool of that "
        "name (the first is kept)"
    ]
    assert hub.servers["dupes"].left_out == problems
    assert (out.content, out.is_error) == ("fine indeed", False)


async def test_a_recorded_tool_of_a_server_not_declared_now_names_the_server() -> None:
    out = await ToolSet.default().run(ToolCall.of("c1", "mcp__gone__get_issue", {"n": 1}), ".")
    assert out.is_error
    assert out.content == (
        "MCP server 'gone' is not declared in this run's configuration; its tool "
        "'mcp__gone__get_issue' cannot run"
    )
    # Any other unknown tool is still named with the tools there are.
    other = await ToolSet.default().run(ToolCall.of("c2", "frobnicate", {}), ".")
    assert other.content.startswith("unknown tool 'frobnicate'. Available tools: bash")


def test_resume_warns_of_a_recorded_server_not_declared_now(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fanfold.cli.resume_command import _say_undeclared
    from fanfold.statemachine import ToolSpec

    specs = tuple(
        ToolSpec.from_schema(name, "d", {"type": "object"})
        for name in ("mcp__gone__a", "mcp__here__b", "mcp__gone__c")
    )
    declared = (ServerDeclaration("here", "test", command="x"),)
    _say_undeclared(("t1", "t2"), [(".", specs), (".", specs)], ["t1"], declared)
    err = capsys.readouterr().err
    assert err.count("MCP: ") == 1  # t2 is not resumed
    assert "tree t1 recorded tools of server 'gone', not declared now" in err


def test_fanfold_run_prints_the_servers_stderr_and_records_the_message_alone(
    tmp_path: Path,
) -> None:
    """The user's view of a server dying mid-call: ``run`` prints one yellow line with
    the last lines of its stderr (and the JSON log has them), while the tool result in
    the log, what the model read, holds the message alone."""
    from click.testing import CliRunner

    from fanfold.cli import cli
    from fanfold.db import Store
    from fanfold.statemachine import ToolResultMessage

    config = tmp_path / "servers.toml"
    args = json.dumps([str(SERVER), "ok", str(tmp_path)])
    config.write_text(f"[mcp_servers.ok]\ncommand = {json.dumps(sys.executable)}\nargs = {args}\n")
    script = tmp_path / "script.json"
    calls = [{"tool_calls": [{"name": "mcp__ok__die", "arguments": {}}]}, {"text": "ok"}]
    script.write_text(json.dumps({"agents": [{"match": {"path": "root"}, "replies": calls}]}))
    db = tmp_path / "d.db"
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    ran = CliRunner().invoke(
        cli,
        [
            *("run", "go", "--no-live", "--cwd", str(tmp_path), "--script", str(script)),
            *("--config", str(config), "--db", str(db)),
        ],
        env=env,
    )
    assert ran.exit_code == 0, ran.output
    said = " ".join(ran.stderr.split())
    assert "MCP: MCP server 'ok' died during the call; its stderr ends:" in said
    assert "dying now" in said
    with Store.open(db, read_only=True) as store:
        (root,) = store.list_roots()
        state = store.load_state(root.id)
    (result,) = [m.result for m in state.history if isinstance(m, ToolResultMessage)]
    assert result.is_error and result.content == "MCP server 'ok' died during the call"
    logged = [json.loads(line) for line in db.with_suffix(".log.jsonl").read_text().splitlines()]
    (failed,) = [line for line in logged if line["event"] == "mcp_call_failed"]
    assert "dying now" in failed["stderr"] and failed["tool"] == "die"
