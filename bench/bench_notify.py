"""Placement with and without LISTEN/NOTIFY (issue 36): spawn -> first child and fan-in.

Two runtimes in one process on one PostgreSQL log (a throwaway cluster,
``tests/pg_cluster.py``): the tree's runtime places a root's N children in chunks, the
other runs them (chunks handed over through a Trio channel, as in
``tests/test_placement.py``: no DBOS queue, so "spawn -> first child" here is the
placement's own part, without a dequeue poll). Both poll every ``--poll`` seconds; the
variants are ``listen`` on (woken by the log's notifications) and off (the poll alone),
interleaved. Per run, from the steps' times in the log: the root's spawning step to
its first child's first step, and the last child's last step to the root's last
``SubAgentFinished`` (fan-in), and the root's ``SubAgentFinished`` commits.

    .venv/bin/python -m bench.bench_notify --children 128 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg
import trio

from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.placement import PlacementSettings
from fanfold.statemachine import Limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pg_cluster import Cluster
from test_placement import _fan_out, _Queue, _serve_chunks


async def _one(url: str, n: int, latency: float, poll: float, listen: bool) -> dict[str, float]:
    settings = PlacementSettings(spread_at=32, chunk=16, poll=poll, listen=listen)
    provider = ScriptedProvider(_fan_out(n, child_latency=latency))
    queue = _Queue()
    ran: dict[str, Any] = {}
    limits = Limits(max_concurrent=n, max_tasks_per_call=n)
    async with Runtime.open(url, provider, []) as a, Runtime.open(url, provider, []) as b:
        a.use_placement(queue, settings)
        b.use_placement(queue, settings)
        await trio.sleep(0.3)

        with tempfile.TemporaryDirectory() as tmp:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_serve_chunks, queue, [b], ran)
                root = await a.start("fan out", cwd=Path(tmp), limits=limits)
                phase = (await a.wait(root)).phase
                nursery.cancel_scope.cancel()
    assert phase == "Idle", phase
    with psycopg.connect(url) as conn:

        def one(sql: str, *args: Any) -> Any:
            row = conn.execute(sql, args).fetchone()
            assert row is not None
            return row[0]

        spawned = one(
            "SELECT min(at) FROM fanfold.events WHERE conversation_id = %s"
            " AND type = 'ModelReplied'",
            root,
        )
        first = one("SELECT min(at) FROM fanfold.events WHERE conversation_id LIKE %s", root + ".%")
        last_child = one(
            "SELECT max(at) FROM fanfold.events WHERE conversation_id LIKE %s", root + ".%"
        )
        last = one(
            "SELECT max(at) FROM fanfold.events WHERE conversation_id = %s"
            " AND type = 'SubAgentFinished'",
            root,
        )
        commits = one(
            "SELECT count(DISTINCT xmin::text) FROM fanfold.events WHERE conversation_id = %s"
            " AND type = 'SubAgentFinished'",
            root,
        )
    return {"first_child": first - spawned, "fan_in": last - last_child, "commits": commits}


async def _main(args: argparse.Namespace) -> None:
    rows: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with Cluster.create() as cluster:
        k = 0
        for _ in range(args.repeats):
            for listen in (True, False):
                k += 1
                with psycopg.connect(cluster.conninfo, autocommit=True) as conn:
                    conn.execute(f"CREATE DATABASE b{k}")
                got = await _one(
                    cluster.url_for(f"b{k}"), args.children, args.latency, args.poll, listen
                )
                rows[listen].append(got)
                print(listen, got, flush=True)
    for listen, runs in rows.items():
        med = {key: statistics.median(g[key] for g in runs) for key in runs[0]}
        rng = {key: (min(g[key] for g in runs), max(g[key] for g in runs)) for key in runs[0]}
        print(f"listen={listen}: median {med} range {rng}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--children", type=int, default=128)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--poll", type=float, default=0.2)
    parser.add_argument("--repeats", type=int, default=5)
    trio.run(_main, parser.parse_args())


if __name__ == "__main__":
    main()
