"""Issue 33's "Tests and measures", for the servers that were only tested through the
hub: a Streamable HTTP server and an HTTP+SSE server (the SDK's, uvicorn on loopback
ports), a server that prints a banner on stdout before ``initialize``, and a server of
300 tools filtered by ``include_tools``, declared together. For each: the run offers
what it should (the discovery ``fanfold tools`` lists), a scripted tree (``fanfold
run``) calls its tools with valid and invalid arguments, and replay verifies with every
server gone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from test_mcp_config_expansion import sse_server
from test_mcp_http import http_server

pytestmark = pytest.mark.slow

SERVER = Path(__file__).with_name("mcp_test_server.py")


def test_http_sse_banner_and_filtered_servers_list_call_and_replay_without_them(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from fanfold.cli import cli
    from fanfold.db import Store
    from fanfold.statemachine import ToolFinished

    python = json.dumps(sys.executable)
    server = json.dumps(str(SERVER))
    (tmp_path / "h").mkdir()
    (tmp_path / "s").mkdir()
    with http_server(tmp_path / "h") as (http_url, _), sse_server(tmp_path / "s") as sse_url:
        config = tmp_path / "servers.toml"
        config.write_text(
            f"[mcp_servers.web]\nurl = {json.dumps(http_url)}\n"
            f"[mcp_servers.old]\nurl = {json.dumps(sse_url)}\ntype = 'sse'\n"
            f"[mcp_servers.loud]\ncommand = {python}\n"
            f"args = [{server}, 'banner', {json.dumps(str(tmp_path))}]\n"
            f"[mcp_servers.many]\ncommand = {python}\n"
            f"args = [{server}, 'many', {json.dumps(str(tmp_path))}]\n"
            "env = { MANY_TOOLS = '300' }\ninclude_tools = ['tool_29?']\n"
        )
        runner = CliRunner()
        calls = [
            ("mcp__web__echo", {"text": "over http"}),
            ("mcp__web__add", {"a": 1, "b": "two"}),
            ("mcp__old__echo", {"text": "over sse"}),
            ("mcp__old__echo", {}),
            ("mcp__loud__add", {"a": 2, "b": 3}),
            ("mcp__loud__add", {"a": 2}),
            ("mcp__many__tool_295", {"x": 7}),
            ("mcp__many__tool_295", {"x": 1.5}),
        ]
        script = tmp_path / "script.json"
        reply = {"tool_calls": [{"name": n, "arguments": a} for n, a in calls]}
        script.write_text(
            json.dumps(
                {"agents": [{"match": {"path": "root"}, "replies": [reply, {"text": "done"}]}]}
            )
        )
        db = tmp_path / "run.db"
        args = ["run", "go", "--script", str(script), "--config", str(config), "--db", str(db)]
        done = runner.invoke(cli, [*args, "--cwd", str(tmp_path), "--no-live"])
        assert done.exit_code == 0, done.output
    with Store.open(db, read_only=True) as store:
        (root,) = store.list_roots()
        # What the run offered (what `fanfold tools` lists: one discovery; listing
        # through `fanfold tools` itself is tested with the published and the SDK's
        # servers, and would start these servers once more here).
        names = {t.name for t in store.load_state(root.id).tools}
        results = [
            e.event.result for e in store.events(root.id) if isinstance(e.event, ToolFinished)
        ]
    for name in ("web", "old", "loud"):
        assert {f"mcp__{name}__echo", f"mcp__{name}__add"} <= names, names
    assert {n for n in names if n.startswith("mcp__many__")} == {
        f"mcp__many__tool_{i}" for i in range(290, 300)
    }
    outcomes = [(r.name, r.is_error) for r in results]
    assert outcomes == [(n, i % 2 == 1) for i, (n, _) in enumerate(calls)]
    web, web_bad, old, old_bad, loud, loud_bad, many, many_bad = (r.content for r in results)
    assert (web, old, json.loads(loud), many) == (
        "echo: over http",
        "echo: over sse",
        {"sum": 5},
        "7",
    )
    # Invalid arguments: fanfold's error results naming the argument.
    assert "'b'" in web_bad and "'text'" in old_bad and "'b'" in loud_bad and "'x'" in many_bad
    # Every server gone (the HTTP ones stopped, the declarations deleted): replay holds.
    config.unlink()
    verify = runner.invoke(cli, ["replay", root.id, "--db", str(db), "--verify", "--tree"])
    assert verify.exit_code == 0, verify.output
    assert "identical" in verify.output
