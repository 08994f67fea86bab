"""The published git server from PyPI, `mcp-server-git` (the reference servers' git
server, the SDK's `MCPServer` with pydantic-typed tools), through `fanfold run`: its
tools offered whole (issue 33's "Tests and measures" names it), a scripted tree calling
them with valid and invalid arguments, and replay verifying with the server gone.

It comes from the `test-mcp-published` extra, which `.ci/run` installs; without it the
test is skipped, saying so."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")
if importlib.util.find_spec("mcp_server_git") is None:
    pytest.skip(
        "the published MCP server mcp-server-git is not installed: "
        "pip install -e '.[test-mcp-published]' (CI installs it)",
        allow_module_level=True,
    )

pytestmark = pytest.mark.slow

TOOLS = {
    "git_status",
    "git_diff_unstaged",
    "git_diff_staged",
    "git_diff",
    "git_commit",
    "git_add",
    "git_reset",
    "git_log",
    "git_create_branch",
    "git_checkout",
    "git_show",
    "git_branch",
}


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def test_a_scripted_tree_calls_the_published_git_server_and_replays_without_it(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from fanfold.cli import cli
    from fanfold.db import Store
    from fanfold.statemachine import ToolFinished

    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "notes.txt").write_text("one\n")
    _git(repo, "add", "notes.txt")
    _git(repo, "commit", "-q", "-m", "first")
    (repo / "notes.txt").write_text("two\n")
    config = tmp_path / "config.toml"
    config.write_text(
        f"[mcp_servers.git]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = ['-m', 'mcp_server_git', '--repository', {json.dumps(str(repo))}]\n"
    )
    calls = [
        ("git_status", {"repo_path": str(repo)}),
        ("git_add", {"repo_path": str(repo), "files": []}),  # minItems 1
        ("git_log", {"repo_path": str(repo), "max_count": "many"}),  # an integer
        ("git_status", {"repo_path": str(tmp_path)}),  # outside --repository
    ]
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "agents": [
                    {
                        "match": {"path": "root"},
                        "replies": [
                            {
                                "tool_calls": [
                                    {"name": f"mcp__git__{n}", "arguments": a} for n, a in calls
                                ]
                            },
                            {"text": "done"},
                        ],
                    }
                ]
            }
        )
    )
    db = tmp_path / "run.db"
    runner = CliRunner()
    args = ["run", "look", "--script", str(script), "--config", str(config), "--db", str(db)]
    done = runner.invoke(cli, [*args, "--cwd", str(repo), "--no-live"])
    assert done.exit_code == 0, done.output
    with Store.open(db, read_only=True) as store:
        (root,) = store.list_roots()
        offered = {t.name: t for t in store.load_state(root.id).tools}
        results = [
            e.event.result for e in store.events(root.id) if isinstance(e.event, ToolFinished)
        ]
    # Every tool offered (pydantic's schemas: minItems, defaults, anyOf with null),
    # marked read-only where the server says so.
    assert {n.removeprefix("mcp__git__") for n in offered if n.startswith("mcp__git__")} == TOOLS
    assert offered["mcp__git__git_status"].read_only
    assert not offered["mcp__git__git_commit"].read_only
    status, add, log, outside = results
    assert not status.is_error and "notes.txt" in status.content
    # Invalid arguments: error results naming the argument, never sent to the server.
    assert add.is_error and "files" in add.content
    assert log.is_error and "max_count" in log.content
    # The server's own refusal is its error result; it answered the call after it.
    assert outside.is_error and "outside the allowed repository" in outside.content
    config.unlink()
    verify = runner.invoke(cli, ["replay", root.id, "--db", str(db), "--verify", "--tree"])
    assert verify.exit_code == 0, verify.output
    assert "identical" in verify.output
