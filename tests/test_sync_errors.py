"""A failed sync is an error naming the database (issue 32, item 9), with real faults:
strace makes ``fdatasync``/``fsync`` of the log's files return EIO in a real
``fanfold run``.

- at close (the final checkpoint's sync of the database file): exit 2 and one line
  naming the log, its WAL kept (before: exit 0, no word);
- during the run (a commit's sync of the WAL): the run stops with exit 2 and that
  error; every command that ran has its step in the log (the failed batch's effects
  never started);
- at open (the sync of the log's folder): exit 2 before anything runs;
- in a background checkpoint: the next commit refuses with that error.

And the writer's rule, without a database: a batch whose append raised SyncFailed runs
none of its callbacks (where the effects start), and the error stops its caller.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import load_bench

from fanfold.db import Step, Store, SyncFailed
from fanfold.runtime.writer import LogWriter
from fanfold.statemachine import ConversationCreated, start

needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")


pl = load_bench("power_loss")


def _run(
    folder: Path, children: int, strace: list[str], setup: str = ""
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``fanfold run`` of the power-loss script in ``folder`` (its log made before),
    under ``strace`` with these options (after the Python statement ``setup``); the
    run and the markers its commands wrote."""
    folder.mkdir()
    (folder / "s.json").write_text(json.dumps(pl.script(children, 1)))
    Store.open(folder / pl.DB).close()
    markers = folder / pl.MARKERS
    markers.touch()
    env = {**os.environ, "MARK": str(markers)}
    env.pop("HOLD", None)
    done = subprocess.run(
        [
            "strace",
            "-f",
            "-qq",
            "-o",
            str(folder / "trace.txt"),
            *strace,
            sys.executable,
            "-c",
            f"{setup}\nimport sys\nfrom fanfold.cli import main\nsys.exit(main())",
            "run",
            "go",
            "--script",
            str(folder / "s.json"),
            "--db",
            str(folder / pl.DB),
            "--no-live",
            "--cwd",
            str(folder),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, markers.read_text().split()


def _one_error_line(done: subprocess.CompletedProcess[str], db: Path, *words: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert f"could not sync the event log {db} to disk" in errors[0]
    for word in words:
        assert word in errors[0]


@needs_strace
def test_a_failed_sync_while_closing_the_log_is_exit_2_naming_it(tmp_path: Path) -> None:
    folder = tmp_path / "close"
    db = folder / pl.DB
    # The database file is synced only by the checkpoint at close (the run's commits
    # sync the WAL): every fdatasync of it fails.
    done, ran = _run(
        folder,
        1,
        ["-P", str(db), "-e", "trace=fdatasync,fsync", "-e", "inject=fdatasync:error=EIO"],
    )
    assert "INJECTED" in (folder / "trace.txt").read_text()
    _one_error_line(done, db, "while closing", "disk I/O error")
    assert sorted(ran) == ["c1:1", "r:1", "r:2", "r:end"]  # the run itself went through
    # Its WAL is kept, and holds every step: nothing committed is lost.
    assert (folder / f"{pl.DB}-wal").stat().st_size > 0
    assert pl.lost(folder, frozenset(ran)) == []


@needs_strace
def test_a_failed_sync_of_a_commit_stops_the_run_before_its_effects(tmp_path: Path) -> None:
    folder = tmp_path / "commit"
    db = folder / pl.DB
    # The WAL's fourth sync in each thread fails, and every one after it (a commit's
    # sync: the writer's thread makes them all; the close's checkpoint syncs the WAL
    # on the main thread, which gets that far only in a long run).
    wal = f"{db}-wal"
    done, ran = _run(
        folder,
        6,
        ["-P", wal, "-e", "trace=fdatasync,fsync", "-e", "inject=fdatasync:error=EIO:when=4+"],
    )
    assert "INJECTED" in (folder / "trace.txt").read_text()
    _one_error_line(done, db, "a commit", "none of its steps were taken")
    # The run stopped there: not every command ran. Every one that ran has its step in
    # the log: none was started by the batch whose sync failed (that batch is gone).
    assert 0 < len(ran) < 9, ran
    assert pl.lost(folder, frozenset(ran)) == []
    assert len(ran) == len(set(ran))


@needs_strace
def test_a_failed_sync_of_a_background_checkpoint_stops_the_run(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint"
    db = folder / pl.DB
    # A checkpoint after every commit (the threshold is 4 MB; set to a byte in the
    # run's own process); every sync of the database file fails (only checkpoints
    # make them). The failure happens in the checkpoint's thread; the next commit
    # reports it, and the close does not report it again.
    done, ran = _run(
        folder,
        6,
        ["-P", str(db), "-e", "trace=fdatasync", "-e", "inject=fdatasync:error=EIO"],
        setup="import fanfold.db.store\nfanfold.db.store.CHECKPOINT_BYTES = 1",
    )
    assert "INJECTED" in (folder / "trace.txt").read_text()
    _one_error_line(done, db, "a checkpoint", "nothing more is written")
    assert len(ran) < 9, ran  # stopped before its end
    assert pl.lost(folder, frozenset(ran)) == []


@needs_strace
def test_a_failed_sync_of_the_log_folder_at_open_is_exit_2(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    done, ran = _run(
        folder, 1, ["-P", str(folder), "-e", "trace=fsync", "-e", "inject=fsync:error=EIO"]
    )
    _one_error_line(done, folder / pl.DB, "its folder")
    assert ran == []


async def test_the_writer_starts_no_effect_of_a_batch_whose_sync_failed() -> None:
    created = ConversationCreated(conversation_id="r", cwd="/", task="t")
    state, effects = start(created)
    step = Step("r", 0, created, effects, state, 0.0)

    def append(steps: object) -> list[tuple[int, int]]:
        raise SyncFailed("x.db", "disk I/O error", "(a commit: none of its steps were taken)")

    started: list[object] = []
    writer = LogWriter(append, threaded=False)
    writer.submit([step], started.append)
    with pytest.raises(SyncFailed, match=r"could not sync the event log x\.db"):
        await writer.write_batch()
    assert started == []
