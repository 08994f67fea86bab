"""The CLI's JSON log: lifecycle and call lines by default, transitions at debug."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from click.testing import CliRunner
from test_cli import FAST_SCRIPT, _write

from fanfold.cli import cli


@pytest.fixture(autouse=True)
def _no_handler_left() -> Iterator[None]:
    yield
    logging.getLogger("fanfold").handlers.clear()
    structlog.reset_defaults()


def _run(tmp_path: Path, *options: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    db = tmp_path / "cli.db"
    script = _write(tmp_path / "script.json", FAST_SCRIPT)
    result = CliRunner().invoke(
        cli,
        [*options, "run", "--db", str(db), "--script", str(script), "--cwd", str(tmp_path), "go"],
        env=env,
    )
    assert result.exit_code == 0, result.output
    text = (tmp_path / "cli.log.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_the_default_log_has_lifecycle_and_call_lines_and_no_transitions(tmp_path: Path) -> None:
    lines = _run(tmp_path, env={"FANFOLD_LOG_LEVEL": ""})
    events = [line["event"] for line in lines]
    assert "transition" not in events
    assert events.count("conversation_started") == 2
    assert events.count("conversation_ended") == 1
    assert events.count("turn_ended") == 1
    assert events.count("model_call") == 4
    tools = [line for line in lines if line["event"] == "tool_call"]
    assert [(line["tool"], line["outcome"]) for line in tools] == [("bash", "ok")]
    for line in lines:
        if line["event"] == "model_call":
            assert line["outcome"] == "replied"
            assert "echo 42" not in json.dumps(line)


@pytest.mark.parametrize(
    ("options", "env"),
    [(("--log-level", "debug"), {}), ((), {"FANFOLD_LOG_LEVEL": "DEBUG"})],
    ids=["option", "environment"],
)
def test_debug_adds_one_transition_line_per_step(
    tmp_path: Path, options: tuple[str, ...], env: dict[str, str]
) -> None:
    lines = _run(tmp_path, *options, env=env)
    transitions = [line for line in lines if line["event"] == "transition"]
    # Root: message, spawn reply, child outcome, answer; child: 2 replies, 1 tool result
    # (the creation steps are committed before the actor logs).
    assert len(transitions) == 4 + 3
    assert any(line["event"] == "model_call" for line in lines)


def test_an_unknown_log_level_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--log-level", "chatty", "ls", "--db", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "--log-level" in result.output


def test_a_command_that_fails_its_checks_leaves_no_json_log(tmp_path: Path) -> None:
    """Issue 32.14: the JSON log is created at its first line, so a run refused before
    it logs anything (here a script that does not parse) leaves no empty
    ``X.log.jsonl`` behind; a folder that cannot take it is still refused at once
    (``test_cli.py::test_unreadable_task_files_and_log_places_are_one_line``)."""
    import subprocess
    import sys

    bad = tmp_path / "bad.json"
    bad.write_text('{"agents": 5}')
    args = ["run", "--db", str(tmp_path / "a.db"), "--script", str(bad), "go"]
    done = subprocess.run(
        [sys.executable, "-c", "from fanfold.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, "Traceback" in done.stderr) == (2, False), done
    assert "agents: expected a list" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]
