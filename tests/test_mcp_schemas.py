"""MCP servers' schemas as servers write them: a server made with the SDK's `MCPServer`
whose tools are typed with pydantic (`tests/mcp_test_server.py typed`), offered whole,
its calls checked by fanfold against the schemas as given, replayed without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

pytestmark = pytest.mark.slow

SERVER = Path(__file__).with_name("mcp_test_server.py")
HOME = {"street": "Main 1", "zip": "12345"}
VALID: list[tuple[str, dict[str, Any]]] = [
    ("tag", {"items": ["a", "b"]}),
    ("pick", {"mode": "fast", "level": None}),
    ("short", {"text": "abc"}),
    ("register", {"person": {"name": "Ann", "home": HOME, "work": None}}),
    ("scores", {"values": {"a": 1}}),
    ("ranged", {"n": 3, "ratio": 0.25}),
    ("when", {"day": "2026-12-07"}),
    ("link", {"url": "https://example.com/x"}),
]
# Each refused by fanfold, before the server, with the argument named.
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("tag", {"items": "a"}, "argument 'items' must be an array or a null, got a string"),
    ("pick", {"mode": "medium"}, 'argument \'mode\' must be one of "fast", "slow"'),
    ("short", {"text": "too long"}, "argument 'text' must be at most 5 characters long"),
    (
        "register",
        {"person": {"name": "Ann", "home": {**HOME, "zip": "1"}}},
        "argument 'person.home.zip' must match the pattern",
    ),
    (
        "register",
        {"person": {"name": "Ann", "home": HOME, "work": {"zip": "12345"}}},
        "missing required argument 'person.work.street'",
    ),
    ("scores", {"values": {"a": "1"}}, "argument 'values.a' must be an integer, got a string"),
    ("ranged", {"n": 0}, "argument 'n' must be >= 1, got 0"),
    ("when", {}, "missing required argument 'day'"),
]


def _calls(calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    return {
        "tool_calls": [{"name": f"mcp__typed__{name}", "arguments": args} for name, args in calls]
    }


def test_a_pydantic_typed_sdk_server_is_offered_whole_checked_and_replayed(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from fanfold.cli import cli
    from fanfold.db import Store
    from fanfold.statemachine import ToolFinished

    config = tmp_path / "config.toml"
    config.write_text(
        f"[mcp_servers.typed]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = {json.dumps([str(SERVER), 'typed', str(tmp_path)])}\n"
    )
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    # `fanfold tools` lists every tool (before: 5 of the 8 left out, "unsupported
    # keyword(s)"), with no problem line.
    listed = CliRunner().invoke(
        cli, ["tools", "--json", "--cwd", str(tmp_path), "--config", str(config)], env=env
    )
    assert listed.exit_code == 0, listed.output
    listing = json.loads(listed.stdout)
    names = {t["name"] for t in listing["tools"] if t["name"].startswith("mcp__")}
    assert names == {f"mcp__typed__{name}" for name, _ in VALID}
    (server,) = listing["mcp_servers"]
    assert server["status"] == "started" and not server.get("left_out"), server
    assert not (tmp_path / "calls").exists()  # (listing started the server: no call)

    script = tmp_path / "script.json"
    replies = [_calls(VALID), _calls([(n, a) for n, a, _ in INVALID]), {"text": "done"}]
    script.write_text(json.dumps({"agents": [{"match": {"path": "root"}, "replies": replies}]}))
    work = tmp_path / "work"
    work.mkdir()
    db = tmp_path / "run.db"
    command = [sys.executable, "-c", "from fanfold.cli import main; main()", "run", "go"]
    command += ["--script", str(script), "--db", str(db), "--cwd", str(work), "--no-live"]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env, "FANFOLD_CONFIG": str(config)},
    )
    assert done.returncode == 0, done.stderr
    with Store.open(db, read_only=True) as store:
        (root,) = store.list_roots()
        offered = store.load_state(root.id).tools
        results = [
            e.event.result for e in store.events(root.id) if isinstance(e.event, ToolFinished)
        ]
    # The schemas are recorded as the server gave them: the model saw $ref and format.
    recorded = {spec.name: spec.input_schema() for spec in offered}
    assert recorded["mcp__typed__register"]["properties"]["person"] == {"$ref": "#/$defs/Person"}
    assert recorded["mcp__typed__link"]["properties"]["url"]["format"] == "uri"
    assert len(results) == len(VALID) + len(INVALID)
    valid, invalid = results[: len(VALID)], results[len(VALID) :]
    for (name, _), result in zip(VALID, valid, strict=True):
        assert not result.is_error, (name, result.content)
        assert result.name == f"mcp__typed__{name}"
    assert json.loads(valid[3].content)["person"]["home"] == HOME
    assert json.loads(valid[6].content) == {"day": "2026-12-07"}
    for (name, _, problem), result in zip(INVALID, invalid, strict=True):
        assert result.is_error, (name, result.content)
        assert result.content.startswith(f"mcp__typed__{name}: {problem}"), result.content
    # The invalid calls never reached the server: it saw the valid ones only.
    seen = (tmp_path / "calls").read_text().split()
    assert sorted(seen) == sorted(name for name, _ in VALID)
    # The server is gone: replay verifies from the recorded schemas alone.
    config.unlink()
    verify = CliRunner().invoke(cli, ["replay", root.id, "--db", str(db), "--verify", "--tree"])
    assert verify.exit_code == 0, verify.output
    assert "identical" in verify.output
