"""A WAL deleted, cut or damaged after a crash is a loss the log reports (issue 32.6).

A real ``fanfold run`` whose root runs one bash command per round (each appends a
marker line) is killed with SIGKILL mid-run: every step is in ``<db>-wal`` (nothing
checkpointed yet). Then the WAL is damaged the ways a disk or a user can: a flipped
byte (early and late), cut short, deleted. SQLite reads what is left as an older, fully
consistent log, so before the high-water mark ``resume`` ran the lost steps' commands
again (marker lines twice), ``replay --verify`` called the log identical and a
deleted WAL made the tree vanish as "an empty log". Now both refuse with the loss
(exit 2, naming the database), and no marker runs twice.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
from click.testing import CliRunner
from db_scenarios import Driver, copied_mid_run, fan_out

from fanfold.cli import cli
from fanfold.db import LostSteps, Step, Store, highwater

HANG_GUARD = 60
ROUNDS = 40
KILL_AFTER = 10  # markers written before the kill
WAL_HEADER, FRAME_HEADER, PAGE = 32, 24, 4096


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from fanfold.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        cwd=cwd,
    )


def _script(markers: Path) -> dict[str, object]:
    command = "echo m{i} >> " + str(markers) + "; sleep 0.02"
    replies: list[dict[str, object]] = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": command.format(i=i)}}]}
        for i in range(ROUNDS)
    ]
    replies.append({"text": "done"})
    return {"latency": 0.01, "agents": [{"match": {"path": "root"}, "replies": replies}]}


def kill_a_run(where: Path, after: int) -> str:
    """Run a tree in ``where`` and kill it with SIGKILL after ``after`` markers; its
    log (``x.db``, ``x.db-wal``, its companions), the script and ``markers.kill`` (the
    markers at the kill) stay there. Returns the root's id."""
    (where / "s.json").write_text(json.dumps(_script(where / "markers.txt")))
    proc = subprocess.Popen(
        [sys.executable, "-c", "from fanfold.cli import main; main()", "run", "go",
         "--script", "s.json", "--db", "x.db", "--no-live", "--max-rounds", str(ROUNDS + 1)],
        cwd=where, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    markers = where / "markers.txt"
    deadline = time.monotonic() + HANG_GUARD
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if markers.exists() and len(markers.read_text().split()) >= after:
                break
            time.sleep(0.02)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    shutil.copy2(markers, where / "markers.kill")
    assert (where / "x.db-wal").stat().st_size > 4 * PAGE
    # Read before any damage (a tree may be gone after it).
    return str(json.loads(_cli("ls", "--db", "x.db", "--json", cwd=where).stdout)[0]["id"])


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The folder of a run killed after KILL_AFTER markers, and its root's id."""
    where = tmp_path_factory.mktemp("killed")
    return where, kill_a_run(where, KILL_AFTER)


def copy_run(killed: Path, to: Path) -> Path:
    """A copy of the killed run's files in ``to``, with its own markers file ``m.txt``
    (as it was at the kill) which its script's commands append to."""
    to.mkdir()
    for name in os.listdir(killed):
        if name.startswith("x."):
            shutil.copy2(killed / name, to / name)
    script = (killed / "s.json").read_text().replace(str(killed / "markers.txt"), str(to / "m.txt"))
    (to / "s.json").write_text(script)
    shutil.copy2(killed / "markers.kill", to / "m.txt")
    return to


def resume(folder: Path) -> subprocess.CompletedProcess[str]:
    """``fanfold resume`` with the copy's own script (a lost step's command, asked of
    the model again, appends to the copy's markers)."""
    return _cli("resume", "--db", "x.db", "--script", "s.json", cwd=folder)


def _in_process(*args: str) -> tuple[int, str]:
    """A CLI command in this process (no interpreter to start): exit code, output."""
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def _frames(wal: Path) -> int:
    return (wal.stat().st_size - WAL_HEADER) // (FRAME_HEADER + PAGE)


def _flip(wal: Path, frame: int) -> None:
    with open(wal, "r+b") as file:
        file.seek(WAL_HEADER + frame * (FRAME_HEADER + PAGE) + FRAME_HEADER + 100)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))


def damage(folder: Path, how: str) -> None:
    wal = folder / "x.db-wal"
    frames = _frames(wal)
    if how == "flip early":
        _flip(wal, 1)
    elif how == "flip late":
        _flip(wal, frames * 3 // 4)
    elif how == "cut":
        os.truncate(wal, WAL_HEADER + (frames // 2) * (FRAME_HEADER + PAGE) + 1000)
    else:
        wal.unlink()
        (folder / "x.db-shm").unlink(missing_ok=True)


DAMAGE = ["flip early", "flip late", "cut", "delete"]


@pytest.mark.parametrize("how", DAMAGE)
def test_a_lost_wal_is_reported_and_nothing_runs_twice(
    killed: tuple[Path, str], tmp_path: Path, how: str
) -> None:
    where, root = killed
    folder = copy_run(where, tmp_path / "case")
    damage(folder, how)
    before = (folder / "m.txt").read_text().split()

    db = str(folder / "x.db")
    code, output = _in_process("replay", root, "--verify", "--tree", "--db", db)
    assert code == 2, output
    assert output.startswith(f"error: the log {db} lost committed steps"), output

    code, output = _in_process("resume", "--db", db, "--script", str(folder / "s.json"))
    assert code == 2, output
    assert output.startswith(f"error: the log {db} lost committed steps"), output
    assert "Nothing was run" in output
    after = (folder / "m.txt").read_text().split()
    assert after == before  # no marker ran (twice or at all)
    assert len(after) == len(set(after))


# The mark's rules, in-process on Store (fast).


def _live_copy(tmp_path: Path) -> tuple[Path, list[Step]]:
    """A log whose second batch is still in the WAL of an open store, copied with its
    mark while open (as a crash leaves it); returns the copy and the steps."""
    driver = Driver(snapshot_every=3)
    fan_out(driver)
    live, copy = tmp_path / "live", tmp_path / "copy"
    copied_mid_run(driver.steps, live, copy)
    shutil.copy2(live / "log.db-committed", copy / "log.db-committed")
    return copy / "log.db", driver.steps


def test_a_writer_refuses_a_log_whose_wal_was_cut_and_the_mark_names_the_step(
    tmp_path: Path,
) -> None:
    db, steps = _live_copy(tmp_path)
    with Store.open(db, read_only=True) as store:  # intact: nothing to report
        store.check_committed()
    os.truncate(f"{db}-wal", WAL_HEADER + FRAME_HEADER + PAGE)  # one frame left
    before = db.read_bytes()
    last = steps[-1]
    with pytest.raises(LostSteps, match=f"step {last.seq} of conversation {last.conversation_id}"):
        Store.open(db)
    assert db.read_bytes() == before  # nothing migrated or written
    with Store.open(db, read_only=True) as store, pytest.raises(LostSteps):
        store.check_committed()
    Path(f"{db}-committed").unlink()  # the user accepts the log as it is
    Store.open(db).close()


def test_a_mark_of_another_database_or_a_damaged_mark_accuses_nothing(tmp_path: Path) -> None:
    db, steps = _live_copy(tmp_path)
    mark = Path(f"{db}-committed")
    text = mark.read_bytes()
    # A new log at the path (the old one removed, its mark left): another instance id.
    for name in ("log.db", "log.db-wal"):
        (db.parent / name).unlink()
    with Store.open(db) as store:
        store.append(steps[:1])
    assert mark.read_bytes() != text  # overwritten by the new log's
    # A damaged mark is no evidence.
    mark.write_bytes(text.replace(b"committed 2", b"committed 3"))
    Store.open(db).close()
    # Through a symlink to the log, the same mark (at the resolved path) is found: one
    # naming a step this log does not hold is a loss.
    mark.write_bytes(text)
    Store.open(db).close()  # another database's mark: ignored
    with Store.open(db) as store:
        store.append(steps[1:2])
    current = highwater.read(str(db))
    assert current is not None and current.seq == steps[1].seq
    mark.write_bytes(attrs.evolve(current, seq=99).line())
    os.symlink(db, tmp_path / "link.db")
    with pytest.raises(LostSteps, match="step 99 of conversation"):
        Store.open(tmp_path / "link.db")
