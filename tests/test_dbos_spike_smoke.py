"""Issue 25's prototype (``bench/dbos_spike.py``) still runs, and what its recovery part
found still holds: a worker killed with SIGKILL leaves its DBOS workflows PENDING
until something recovers them; every recovered tree then goes on from fanfold's log
on the other worker (not from the start) and its log replays identically. The
numbers are the benchmark's business; this checks outcomes only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pg_cluster import NOT_INSTALLED, find_binaries

pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")
if find_binaries() is None:
    pytest.skip(NOT_INSTALLED, allow_module_level=True)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent


def test_killed_workers_trees_are_resumed_from_the_log_elsewhere(tmp_path: Path) -> None:
    out = tmp_path / "spike.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.dbos_spike", "--quick", "--no-fsync",
         "--parts", "recovery", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    recovery = json.loads(out.read_text())["recovery"]

    killed = recovery["sigkill of w1"]
    assert killed["pending_on_w1_when_killed"] >= 2
    # DBOS left the dead worker's workflows to it: nothing took them over.
    assert len(killed["still_pending_on_w1"]) == killed["pending_on_w1_when_killed"]
    # Once recovered (by a restart under its executor id, then by re-enqueueing), a
    # tree that had begun ran a second time, resuming from its log (a workflow claimed
    # but not yet begun when its worker died runs once).
    reruns = recovery["executions"]["run_more_than_once"]
    killed_reruns = {name: runs for name, runs in reruns.items() if name.startswith("r")}
    assert set(killed_reruns) <= set(killed["still_pending_on_w1"])
    assert all(len(runs) == 2 for runs in reruns.values()), reruns
    assert any(runs[1].endswith("(resumed)") for runs in killed_reruns.values()), reruns
    # Every tree, the recovered ones included, finished once and replays identically.
    assert recovery["logs"] == {"trees": 16, "bad": []}
