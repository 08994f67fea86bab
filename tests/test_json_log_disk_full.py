"""A JSON log that cannot be written never stops a run (issue 32, item 8).

The database is the record; the JSON log is a convenience. A full disk under the JSON
log (a real one: a small tmpfs filled up, or ``/dev/full``, whose every write fails with
ENOSPC) used to end ``fanfold run`` with a 50-line traceback and exit 1 half-way
through the tree. Now the first failed write prints one warning line, later lines are
dropped, and the tree runs to its end.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from fanfold.runtime import logging as fanfold_logging

HANG_GUARD = 60
CHILDREN = 4


def test_a_failed_write_warns_once_and_drops_the_rest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # /dev/full: the kernel fails every write with ENOSPC.
    fanfold_logging.configure(json_file="/dev/full", console=None, file_level=logging.DEBUG)
    try:
        log = structlog.get_logger("fanfold")
        for n in range(3):
            log.info("line", n=n)
            fanfold_logging.flush()
        log.error("an error is written at once")  # also fails: no second warning
        for n in range(600):  # past the buffer's limit: written without flush()
            log.debug("more", n=n)
    finally:
        fanfold_logging.configure(json_file=None, console=None)
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("warning: cannot write the JSON log /dev/full: No space left on device")


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs with two pages left free: the JSON log fills it mid-run."""
    where = tmp_path / "full"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        with open(where / "filler", "wb") as filler:
            filler.write(b"\0" * (14 * 4096))
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def _script(markers: Path) -> dict[str, object]:
    child = {
        "match": {"path": "root/*"},
        "replies": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": f"echo x >> {markers}"}}]},
            {"tool_calls": [{"name": "submit_result", "arguments": {"result": "ok"}}]},
        ],
    }
    tasks = [{"task": f"job {i}"} for i in range(CHILDREN)]
    root = {
        "match": {"path": "root"},
        "replies": [
            {"tool_calls": [{"name": "spawn_agents", "arguments": {"tasks": tasks}}]},
            {"text": "all done"},
        ],
    }
    return {"latency": 0.01, "agents": [root, child]}


def test_a_full_disk_under_the_json_log_does_not_stop_the_run(
    tmp_path: Path, full_disk: Path
) -> None:
    (tmp_path / "s.json").write_text(json.dumps(_script(tmp_path / "markers.txt")))
    log = full_disk / "x.log.jsonl"
    command = [sys.executable, "-c", "from fanfold.cli import main; main()", "--log-level",
               "debug", "run", "go", "--script", "s.json", "--db", "x.db", "--json-log",
               str(log), "--no-live"]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=HANG_GUARD, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: cannot write the JSON log {log}: No space left on device; its lines are "
        "dropped from here on (the run goes on: the database is the record)"
    ], run.stderr
    assert "all done" in run.stdout
    assert (tmp_path / "markers.txt").read_text().split() == ["x"] * CHILDREN
    # The log was written until the disk was full (it is not the whole run's).
    assert 0 < log.stat().st_size <= 2 * 4096
    statvfs = os.statvfs(full_disk)
    assert statvfs.f_bavail == 0, errno.ENOSPC
    listing = subprocess.run(
        [sys.executable, "-c", "from fanfold.cli import main; main()", "ls", "--db", "x.db",
         "--json"], capture_output=True, text=True, timeout=HANG_GUARD, cwd=tmp_path,
    )  # fmt: skip
    (root,) = json.loads(listing.stdout)
    assert root["status"] == "idle"
