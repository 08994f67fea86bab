"""``fanfold replay --verify`` ends its process without the interpreter's teardown
(issue 34: freeing a verified tree's states one by one was ~45 k instructions per
event), yet with its exit code, its whole report and the exit handlers run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from db_scenarios import Driver, fan_out
from replay_helpers import write

# Runs the script's entry point with an object whose finaliser runs only in the
# interpreter's teardown (a module global), and an exit handler (atexit).
PROGRAM = """
import atexit, os, sys
class Witness:
    def __del__(self):
        sys.stderr.write("torn down\\n")
witness = Witness()
atexit.register(lambda: sys.stderr.write("exit handlers ran\\n"))
if os.environ.get("CHANGED_REDUCER"):
    # A changed reducer: one more effect after a tool's result.
    import importlib
    from fanfold.statemachine import AbortCall
    reducer = importlib.import_module("fanfold.statemachine.transition")
    original = reducer._on_tool_finished
    def changed(state, event):
        after, effects = original(state, event)
        return after, (*effects, AbortCall(999))
    reducer._on_tool_finished = changed
sys.argv = ["fanfold", *sys.argv[1:]]
from fanfold.cli import main
main()
"""


@pytest.fixture
def db(tmp_path: Path) -> Path:
    driver = Driver(snapshot_every=2)
    fan_out(driver)
    path = tmp_path / "log.db"
    write(path, driver.steps)
    return path


def run(*args: str | Path, changed: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CHANGED_REDUCER": "1" if changed else ""}
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_verify_ends_without_teardown_and_keeps_its_output(db: Path) -> None:
    done = run("replay", "r", "--verify", "--tree", "--db", db)
    assert done.returncode == 0, done.stderr
    assert "identical:" in done.stdout and done.stdout.endswith("\n")
    assert "exit handlers ran" in done.stderr
    assert "torn down" not in done.stderr


def test_a_divergence_keeps_exit_code_1_and_its_report(db: Path) -> None:
    done = run("replay", "r", "--verify", "--tree", "--db", db, changed=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "seq 2" in done.stdout + done.stderr, done.stdout + done.stderr
    assert "exit handlers ran" in done.stderr
    assert "torn down" not in done.stderr


def test_other_commands_still_tear_down(db: Path) -> None:
    done = run("replay", "r", "--step", "--db", db)
    assert done.returncode == 0, done.stderr
    assert "torn down" in done.stderr
