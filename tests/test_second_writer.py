"""A second writer on a live database, through another name of the same file.

``resume`` refuses while another runtime has the database open (``presence.py``). The
database has more names than the one typed: a symbolic link to it, a hard link. A
``fanfold run`` holds a tree (its sub-agents sleep in bash); ``fanfold resume`` through
each other name must be refused as already running, and run nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fanfold.cli import cli
from fanfold.runtime.presence import DatabaseInUse, Presence


def _slow_script(path: Path, pids: Path) -> Path:
    """The root spawns one sub-agent, which writes its shell's pid and sleeps."""
    slow = {"name": "bash", "arguments": {"command": f"echo $$ >> {pids}; sleep 60"}}
    spawn = {"name": "spawn_agents", "arguments": {"tasks": [{"task": "a"}]}}
    path.write_text(
        json.dumps(
            {
                "latency": 0.01,
                "agents": [
                    {"match": {"path": "root"}, "replies": [{"tool_calls": [spawn]}]},
                    {"match": {"depth": 1}, "replies": [{"tool_calls": [slow]}, {"text": "ok"}]},
                ],
            }
        )
    )
    return path


def _started(pids: Path) -> list[int]:
    return [int(line) for line in pids.read_text().split()] if pids.exists() else []


@pytest.mark.skipif(not hasattr(os, "link"), reason="needs hard links")
def test_resume_through_a_symlink_or_a_hard_link_is_refused_while_a_run_holds_the_tree(
    tmp_path: Path,
) -> None:
    real = tmp_path / "real"
    other = tmp_path / "other"
    real.mkdir()
    other.mkdir()
    db = real / "log.db"
    pids = tmp_path / "pids"
    script = _slow_script(tmp_path / "slow.json", pids)
    fanfold = [sys.executable, "-c", "from fanfold.cli import main; main()"]
    options = ["--db", str(db), "--script", str(script), "--cwd", str(tmp_path)]
    run = subprocess.Popen(
        [*fanfold, "run", "--no-live", *options, "work"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _started(pids) and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_started(pids)) == 1, "the sub-agent's bash command never started"
        link = tmp_path / "link.db"
        link.symlink_to(db)
        hard = other / "hard.db"
        os.link(db, hard)
        linked_folder = tmp_path / "linked"
        linked_folder.symlink_to(real, target_is_directory=True)
        for name in (link, hard, linked_folder / "log.db", db):
            result = CliRunner().invoke(cli, ["resume", "--db", str(name), "--script", str(script)])
            assert result.exit_code == 2, (name, result.output)
            assert "another fanfold runtime has" in result.output, (name, result.output)
        # Nothing was taken over: no second bash command, and the run still holds its tree.
        time.sleep(0.5)
        assert len(_started(pids)) == 1
        assert run.poll() is None, run.communicate()
    finally:
        run.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.communicate(timeout=30)
        run.kill()
        for pid in _started(pids):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def test_presence_locks_the_resolved_path_and_refuses_a_hard_link_while_open(
    tmp_path: Path,
) -> None:
    db = tmp_path / "log.db"
    db.write_bytes(b"")
    (tmp_path / "link.db").symlink_to(db)
    os.link(db, tmp_path / "hard.db")
    first = Presence(db)
    try:
        assert first.path == f"{db}-runtimes"
        assert first.identity_path is not None
        for name in ("link.db", "log.db"):  # the same resolved path: open side by side
            second = Presence(tmp_path / name)
            try:
                assert second.path == first.path
                assert not second.alone() and not first.alone()
            finally:
                second.close()
        with pytest.raises(DatabaseInUse, match="under another name"):
            Presence(tmp_path / "hard.db")
        assert first.alone()
    finally:
        first.close()
    alone = Presence(tmp_path / "hard.db")  # nobody else has it open: allowed
    try:
        assert alone.alone()
    finally:
        alone.close()
