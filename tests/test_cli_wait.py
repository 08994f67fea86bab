"""``fanfold wait`` on a tree that is nowhere ends at once (issue 32, item 11).

It waited for ever for an id in neither the log nor a queue, even on a log file with
no queue at all or a path that cannot exist (``timeout 8`` gave 124), and an empty id
printed " is not in the log". Each case is a real process under a timeout: a hang is a
failed test, not a stuck run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fanfold.db import Store, open_store

HANG_GUARD = 20  # far above a CLI's start-up; the old code never returned


def _wait(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from fanfold.cli import main; main()", "wait", *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        env={k: v for k, v in os.environ.items() if k != "FANFOLD_DBOS_DB"},
    )


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr.strip()


def test_a_missing_database_is_named(tmp_path: Path) -> None:
    err = _one_line_error(_wait("abc", "--db", "/nonexistent/dir/x.db"))
    assert err.startswith("error: no database at /nonexistent/dir/x.db")


def test_an_unknown_id_in_a_log_file_without_a_queue(tmp_path: Path) -> None:
    Store.open(tmp_path / "x.db").close()  # a log, with no tree in it
    err = _one_line_error(_wait("abc", "--db", str(tmp_path / "x.db")))
    assert err.startswith(f"error: abc is not in the log {tmp_path / 'x.db'}, and no queue")


def test_an_empty_id_is_a_usage_error(tmp_path: Path) -> None:
    Store.open(tmp_path / "x.db").close()
    result = _wait("", "--db", str(tmp_path / "x.db"))
    assert result.returncode == 2, result.stderr
    assert "TREE_ID is empty" in result.stderr
    assert " is not in the log" not in result.stderr


@pytest.mark.parametrize("log", ["postgres", "file beside a queue"])
def test_an_id_neither_in_the_log_nor_on_the_queue(tmp_path: Path, pg_url: str, log: str) -> None:
    # A PostgreSQL log no worker has set up (no DBOS tables): nothing was ever queued.
    if log == "postgres":
        open_store(pg_url).close()
        args = ["--db", pg_url]
    else:
        Store.open(tmp_path / "x.db").close()
        args = ["--db", str(tmp_path / "x.db"), "--dbos-db", pg_url]
    err = _one_line_error(_wait("abc", *args))
    assert err.startswith("error: abc is neither in the log"), err
    assert "workers' queue" in err
