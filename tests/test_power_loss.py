"""Power loss (issue 32, item 1): no effect runs before the step that issued it is on
stable storage.

One real ``fanfold run`` is recorded under strace (``bench/power_loss.py``): every
write and sync of its log, every marker its bash commands append. A power loss at a
moment of that run keeps the WAL up to its last completed sync and loses the rest;
the commands that ran have run. At every distinct moment the cut log must hold the
step of every command that ran (none lost), and ``fanfold resume`` of a cut must
run no command a second time.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from bench_scripts import load_bench

pl = load_bench("power_loss")

needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")


@needs_strace
def test_a_power_loss_at_any_moment_keeps_every_step_whose_command_ran(tmp_path: Path) -> None:
    recording = pl.record(tmp_path / "run", children=3)
    moments = pl.distinct(recording)
    assert len(moments) >= 20
    ran = lost = 0
    for moment in moments:
        target = tmp_path / f"cut{moment}"
        marks = pl.cut(recording, moment, target)
        missing = pl.lost(target, marks)
        assert not missing, f"moment {moment}: commands ran, steps lost: {missing}"
        ran += len(marks)
        lost += len(missing)
        shutil.rmtree(target)
    assert ran > 0 and lost == 0
    # One sync per committed batch (before: none between the log's creation and close).
    assert recording.wal_syncs >= 10
    # Resume a cut in the middle of the fan-out (the moment the third command's marker
    # was appended: commands and model calls in flight): nothing runs twice, and the
    # tree goes on to its end. (bench/power_loss.py resumes many more.)
    third = next(m for m in moments if len(recording.marks[m]) == 3)
    target = tmp_path / "resumed"
    pl.cut(recording, third, target)
    code, twice = pl.resume(target)
    assert code == 0
    assert twice == [], f"commands run twice: {twice}"
    assert "r:2" in (target / pl.MARKERS).read_text().split()


def test_the_recorder_refuses_a_run_it_cannot_model(tmp_path: Path) -> None:
    wal = str(tmp_path / "x.db-wal")
    text = "\n".join(
        [
            f'1 pwrite64(3<{wal}>, "a"..., 4096, 0) = 4096',
            f"1 fdatasync(3<{wal}>) = 0",
            f'1 pwrite64(3<{wal}>, "a"..., 4096, 0) = 4096',  # a synced frame rewritten
        ]
    )
    with pytest.raises(pl.ModelBroken):
        pl.parse(tmp_path, text, b"\0" * 8192)
    text = f'1 pwrite64(3<{wal}>, "a"..., 100, 0) = 100\n2 fdatasync(3<{wal}> <unfinished ...>\n'
    text += (
        f'1 write(1<{tmp_path}/markers.txt>, "c1:1\\n", 5) = 5\n2 <... fdatasync resumed>) = 0\n'
    )
    recording = pl.parse(tmp_path, text, b"\0" * 100)
    # The marker was written before the sync returned: a loss then keeps 0 bytes.
    assert list(zip(recording.synced, map(sorted, recording.marks), strict=True)) == [
        (0, []),
        (0, []),
        (0, ["c1:1"]),
        (100, ["c1:1"]),
    ]
