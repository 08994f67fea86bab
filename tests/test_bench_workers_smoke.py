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


def test_the_worker_benchmark_passes_placement_options_and_reports_the_spread(
    pg_cluster: Cluster,
) -> None:
    from bench import bench_workers

    # Placement off, then on (chunks of 5): one tree of 12 children, all at once (the
    # root's spawns are two spawn_agents calls in one reply: one step of 12 spawns).
    off, on = bench_workers.placings("100000,4", "5", None)
    assert (off.argv(), on.argv()) == (
        ["--spread-at", "100000", "--chunk-size", "5"],
        ["--spread-at", "4", "--chunk-size", "5"],
    )
    settings = bench_workers.Settings(
        workers=(1,), latencies=(0.05,), trees=(1,), children=12, rounds=2, repeats=1,
        idle=0.2, warm=False, sqlite=False, all_at_once=True, placements=(off, on),
    )  # fmt: skip
    lines: list[str] = []
    first, second = bench_workers.measure(pg_cluster, settings, say=lines.append)

    for r in (first, second):
        assert r["statuses"] == ["idle"], r
        # Every child ran and the root received each one's outcome once.
        assert r["children_run"] == r["outcomes_delivered"] == 12
        assert r["own_worker_share"] == 1.0  # one worker ran everything
        assert r["worker_exit_codes"] == [0]
    assert first["steps"] == second["steps"]
    assert first["children_placed"] == 0 and first["chunks_by_worker"] == []
    # All 12 spawns in one step, placed as chunks of 5, 5 and 2 on the one worker.
    assert second["children_placed"] == 12 and second["chunks_by_worker"] == [3]
    assert second["worker_argv"][0][-4:-2] == ["--spread-at", "4"]
    assert [line.split(" | ")[0] for line in lines] == ["| 100000/5/-", "| 4/5/-"]
    assert "| 0.05 | 1 | 4/5/- |" in bench_workers.placement_summary([first, second])
