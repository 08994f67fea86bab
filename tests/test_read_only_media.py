"""Inspecting a log on read-only media: ``ls``, ``show``, ``replay --verify`` and
``export`` open the database read-only and write nothing, so a log copied off a CI
machine or mounted read-only can be debugged where it is.

The media is real: a read-only bind mount in a private mount namespace
(``unshare --mount --map-root-user``), so even root cannot write there."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from db_scenarios import Driver, copied_mid_run, fan_out

from fanfold.db import Store

COMMANDS = {
    "ls": ["ls"],
    "show": ["show", "r", "--json"],
    "verify": ["replay", "r", "--verify", "--tree"],
    "export": ["export", "r"],
}


def _inspect_read_only(folder: Path) -> dict[str, tuple[int, str]]:
    """Run each command on ``folder/log.db`` with ``folder`` mounted read-only."""
    cli = f"{sys.executable} -c 'from fanfold.cli import main; main()'"
    lines = [
        f"mount --bind -o ro {folder} {folder} || exit 97",
        f"touch {folder}/probe 2>/dev/null && exit 98",  # the mount must refuse writes
    ]
    for name, args in COMMANDS.items():
        lines.append(
            f"echo '=={name}=='; {cli} {' '.join(args)} --db {folder}/log.db; echo \"rc=$?\""
        )
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private read-only mount")
    done = subprocess.run(
        ["unshare", "--mount", "--map-root-user", "sh", "-c", "\n".join(lines)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode == 97 or "unshare failed" in done.stderr:
        pytest.skip(f"cannot make a read-only mount here: {done.stderr.strip()}")
    assert done.returncode != 98, "the bind mount is writable: the test proves nothing"
    assert "Traceback" not in done.stderr, done.stderr
    results = {}
    parts = done.stdout.split("\n")
    current = None
    buffer: list[str] = []
    for line in parts:
        if line.startswith("==") and line.endswith("==") and line[2:-2] in COMMANDS:
            current, buffer = line[2:-2], []
        elif line.startswith("rc=") and current is not None:
            results[current] = (int(line[3:]), "\n".join(buffer))
            current = None
        elif current is not None:
            buffer.append(line)
    assert set(results) == set(COMMANDS), (done.stdout, done.stderr)
    return results


def _check(results: dict[str, tuple[int, str]], events: int) -> None:
    assert {name: rc for name, (rc, _) in results.items()} == dict.fromkeys(COMMANDS, 0), results
    assert re.search(r"^│ r\s+│ idle", results["ls"][1], re.M), results["ls"][1]
    shown = json.loads(results["show"][1])
    assert shown["id"] == "r" and len(shown["children"]) == 3
    assert f"identical: {events} event(s) of 4 conversation(s)" in results["verify"][1]
    exported = [json.loads(line) for line in results["export"][1].splitlines() if line]
    assert sum(1 for line in exported if line.get("record") == "step") == events, exported[:3]


@pytest.fixture
def tree() -> Driver:
    driver = Driver(snapshot_every=2)
    fan_out(driver)
    return driver


def test_a_closed_log_on_read_only_media_can_be_inspected(tmp_path: Path, tree: Driver) -> None:
    folder = tmp_path / "media"
    folder.mkdir()
    with Store.open(folder / "log.db") as store:
        store.append(tree.steps)
    before = (folder / "log.db").read_bytes()
    _check(_inspect_read_only(folder), len(tree.steps))
    assert (folder / "log.db").read_bytes() == before
    # The high-water mark is the writing store's (fanfold.db.highwater).
    assert sorted(p.name for p in folder.iterdir()) == ["log.db", "log.db-committed"]


def test_a_log_copied_mid_run_reads_its_wal_on_read_only_media(
    tmp_path: Path, tree: Driver
) -> None:
    """Copied while a runtime was writing: the newest steps are only in ``-wal``, and
    there is no ``-shm``. None of them may be missed."""
    folder = tmp_path / "media"
    copied_mid_run(tree.steps, tmp_path / "live", folder)
    assert (folder / "log.db-wal").stat().st_size > 0
    _check(_inspect_read_only(folder), len(tree.steps))
    assert sorted(p.name for p in folder.iterdir()) == ["log.db", "log.db-wal"]
