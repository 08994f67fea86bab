"""Issue 25's worker benchmark (``bench/bench_workers.py``) still runs: one worker, two
small trees on the session's PostgreSQL cluster, and the same trees on SQLite. The
numbers are the benchmark's business; this checks that each point finished its trees
and measured something, and that the workers never saw the password on their command
line."""

from __future__ import annotations

import pytest
from pg_cluster import NOT_INSTALLED, Cluster, find_binaries

pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")
if find_binaries() is None:
    pytest.skip(NOT_INSTALLED, allow_module_level=True)

pytestmark = pytest.mark.slow


def test_the_worker_benchmark_runs_tiny_trees_on_postgresql_and_sqlite(
    pg_cluster: Cluster,
) -> None:
    from bench import bench_workers

    settings = bench_workers.Settings(
        workers=(1,), latencies=(0.05,), trees=(2,), children=2, rounds=2, repeats=1, idle=0.2
    )
    lines: list[str] = []
    results = bench_workers.measure(pg_cluster, settings, say=lines.append)

    by_backend = {r["backend"]: r for r in results}
    assert [r["backend"] for r in results] == ["sqlite", "sqlite", "postgresql"]
    pg, lite = by_backend["postgresql"], by_backend["sqlite"]
    for r in (pg, lite):
        assert r["trees"] == 2
        assert r["statuses"] and "running" not in r["statuses"], r
        assert r["worker_cpu"] > 0 and r["trees_per_s"] > 0
    # The same trees write the same steps on either log (root: start, spawn, answer;
    # each child its rounds), counted from each log.
    assert pg["steps"] == lite["steps"] > 2 * 2 * 2
    assert pg["statuses"] == lite["statuses"]
    # PostgreSQL did the writing: its CPU and transaction ids were counted.
    assert pg["pg_cpu"] > 0
    assert pg["write_xacts"] >= 2
    assert pg["ran_on_workers"] == 1
    assert pg["worker_exit_codes"] == [0]
    # The URL (with the cluster's password) went through $FANFOLD_DB only.
    assert pg["worker_argv"] and all(
        pg_cluster.password not in " ".join(argv) for argv in pg["worker_argv"]
    )
    assert len(lines) == 3 and all(line.startswith("| ") for line in lines)
    assert "| 0.05 | postgresql, 1, 8 |" in bench_workers.summary(results)
