"""``fanfold resume`` of a tree started by ``run --script S --config F`` uses F as the
run did (issue 33, item 10's leftover): its settings (system prompt, aliases,
web_fetch domains, pass_env) and its MCP servers. Before, a scripted tree's record
named the script alone, and its resume ran without F: its MCP tools were unknown."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fanfold.cli.models import choose_model, rebuilt_choice

SERVER = Path(__file__).with_name("mcp_test_server.py")
SETTINGS = """\
system_prompt = "You answer in haiku."

[model_aliases]
sonnet = "some-model"

[tools.web_fetch]
domains = ["docs.python.org"]
"""


def test_a_scripted_trees_recorded_description_rebuilds_its_settings(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"agents": [{"replies": [{"text": "hi"}]}]}))
    config = tmp_path / "settings.toml"
    config.write_text(SETTINGS)
    chosen = choose_model(script, config, None, None, tmp_path)
    assert chosen.recorded.config is not None  # the settings' file, with its sha256
    rebuilt = rebuilt_choice(chosen.recorded)
    assert rebuilt.recorded == chosen.recorded
    assert rebuilt.system_prompt == "You answer in haiku."
    assert rebuilt.web_domains == ("docs.python.org",)
    assert rebuilt.model_aliases == (("sonnet", "some-model"),)
    assert rebuilt.description == chosen.description
    # A changed settings file is named, as a changed script is.
    config.write_text(SETTINGS + "\n# edited\n")
    with pytest.raises(ValueError, match=r"config file it runs on, .* changed since"):
        rebuilt_choice(chosen.recorded)


SCRIPT = {
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                {"tool_calls": [{"name": "mcp__ok__slow", "arguments": {"seconds": 600}}]},
                {"tool_calls": [{"name": "mcp__ok__echo", "arguments": {"text": "back"}}]},
                {"text": "done: {{last_tool_result}}"},
            ],
        }
    ]
}


@pytest.mark.slow
def test_resume_of_a_killed_scripted_tree_uses_the_configurations_servers(
    tmp_path: Path,
) -> None:
    pytest.importorskip("mcp")
    work = tmp_path / "work"
    work.mkdir()
    config = tmp_path / "servers.toml"
    args = json.dumps([str(SERVER), "ok", str(tmp_path)])
    config.write_text(f"[mcp_servers.ok]\ncommand = {json.dumps(sys.executable)}\nargs = {args}\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    db = tmp_path / "k.db"
    # No configuration of the user's: only --config declares the server.
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "x")}
    env.pop("FANFOLD_CONFIG", None)
    fanfold = [sys.executable, "-c", "from fanfold.cli import main; main()"]
    options = ["--script", str(script), "--config", str(config), "--db", str(db)]
    run = subprocess.Popen(
        [*fanfold, "run", "go", *options, "--cwd", str(work), "--no-live"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(6000):  # bounded, not timed: 120 s at most
            if (tmp_path / "slow-started").exists() or run.poll() is not None:
                break
            time.sleep(0.02)
        assert (tmp_path / "slow-started").exists()
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    # A copy of the killed log, for the resume whose configuration lacks the server.
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in tmp_path.glob("k.db*"):
        shutil.copy(path, copy / path.name)

    resumed = subprocess.run(
        [*fanfold, "resume", "--db", str(db)], env=env, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "done: echo: back" in resumed.stdout  # the server of --config, bound again

    # Resumed on a configuration without the server: said up front, and the call is an
    # error result naming the server (it was "unknown tool").
    bare = tmp_path / "bare.toml"
    bare.write_text('system_prompt = "x"\n')
    other = subprocess.run(
        [
            *fanfold,
            "resume",
            "--db",
            str(copy / "k.db"),
            "--script",
            str(script),
            "--config",
            str(bare),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert other.returncode == 0, other.stderr
    said = " ".join(other.stderr.split())
    assert "recorded tools of server 'ok', not declared now" in said
    assert (
        "done: MCP server 'ok' is not declared in this run's configuration; its tool "
        "'mcp__ok__echo' cannot run" in " ".join(other.stdout.split())
    )
