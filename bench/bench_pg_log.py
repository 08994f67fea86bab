"""The event log in PostgreSQL against SQLite (issue 25): ``python -m bench.bench_pg_log``.

Two workloads, each on a new SQLite file and on a new database of a throwaway
PostgreSQL cluster (``tests/pg_cluster.py``, fsync as chosen, over loopback TCP):

- **fan-out**: ``Runtime.open`` runs one root spawning ``--children`` children at zero
  model latency (``bench.workload.fanout_script``); wall time, the process's CPU, steps,
  and on PostgreSQL the write transactions (transaction ids consumed).
- **lone steps**: ``append`` of one step at a time (a chain, where nothing batches):
  the steps of ``db_scenarios.fan_out``, ``--rounds`` times on a new log each.

Needs the ``postgres`` extra and PostgreSQL's server programs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import trio

from bench.workload import fanout_limits, fanout_script
from fanfold.db import open_store
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.tools.registry import ToolSet

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from db_scenarios import Driver, fan_out  # noqa: E402
from pg_cluster import Cluster  # noqa: E402


def _fresh_database(cluster: Cluster, name: str) -> str:
    with psycopg.connect(cluster.conninfo, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    return cluster.url_for(name)


def _xid(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT txid_current()").fetchone()
    assert row is not None
    return int(row[0])


def fan_out_run(target: str, children: int, cwd: str) -> dict[str, Any]:
    """One tree of ``children`` children on the log ``target``."""

    async def main() -> str:
        async with Runtime.open(
            target, fanout_script(children, child_latency=0), ToolSet.default(),
            logger=quiet_logger(),
        ) as runtime:  # fmt: skip
            root = await runtime.start("fan out", cwd=cwd, limits=fanout_limits(children))
            await runtime.wait(root)
            return root

    wall, cpu = time.perf_counter(), time.process_time()
    root = trio.run(main)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    with open_store(target, read_only=True) as store:
        steps = sum(len(log.events) for log in store.raw_tree(root))
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "steps": steps}


def lone_steps(target: str) -> tuple[int, float, float]:
    """``append`` of each step of a small tree alone: (steps, wall s, CPU s)."""
    driver = Driver()
    fan_out(driver)
    with open_store(target) as store:
        wall, cpu = time.perf_counter(), time.process_time()
        for step in driver.steps:
            store.append([step])
        return (
            len(driver.steps),
            time.perf_counter() - wall,
            time.process_time() - cpu,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--fsync", action="store_true", help="the cluster syncs its WAL")
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="fanfold-bench-pg-")
    with Cluster.create(fsync=args.fsync) as cluster:
        for run in range(args.runs):
            sqlite = os.path.join(folder, f"fan{run}.db")
            print(f"fan-out {args.children} sqlite   {fan_out_run(sqlite, args.children, folder)}")
            url = _fresh_database(cluster, f"fan{run}")
            before = _xid(url)
            result = fan_out_run(url, args.children, folder)
            result["write_xacts"] = _xid(url) - before - 1
            print(f"fan-out {args.children} postgres {result}")
        for kind in ("sqlite", "postgres"):
            n = wall = cpu = 0.0
            for i in range(args.rounds):
                target = (
                    os.path.join(folder, f"lone{i}.db")
                    if kind == "sqlite"
                    else _fresh_database(cluster, f"lone{i}")
                )
                open_store(target).close()  # the schema is not what is measured
                steps, w, c = lone_steps(target)
                n, wall, cpu = n + steps, wall + w, cpu + c
            print(
                f"lone steps {kind:8} {int(n)} steps: {wall / n * 1e6:.0f} us wall, "
                f"{cpu / n * 1e6:.0f} us CPU per step"
            )
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
