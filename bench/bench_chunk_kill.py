"""Issue 32 item 3's campaign: kill -9 a worker holding chunks of a placed fan-out.

Not a feature: nothing in ``fanfold`` imports this. ``python -m bench.bench_chunk_kill
[--runs N] [--children C] [--chunk K] [--chunk-concurrency J] [--workers W] [--lease S]
[--seed R] [--keep DIR]`` starts a throwaway PostgreSQL cluster (``tests/pg_cluster.py``)
and, per run, a fresh database (fanfold's log and DBOS's queue), W ``fanfold worker``
processes (lease S, 8 s by default; poll 0.05 s) and one tree fanning out to C children
at once, placed in chunks of K (``tests/chunk_kill.py``: each child runs one ``bash``
command appending its task to a marker file). Once a worker that does not run the root
holds chunks and children are coming to rest, it is killed with SIGKILL a random 0-1.5 s
later; nobody is restarted. Per run: whether the root came to rest within 90 s,
children at rest whose outcome the root never took (lost), outcomes taken twice
(duplicated), marker lines written twice (commands twice), ``replay.verify`` of the
tree, survivors that stopped, and processes left with the run's environment after the
workers were stopped. ``--keep`` keeps a hung run's worker output there.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from chunk_kill import kill_one, script, worker_args  # noqa: E402
from pg_cluster import Cluster, find_binaries, wait_gone  # noqa: E402
from test_worker_crash import _fanfold_processes  # noqa: E402
from test_worker_dbos import Bench  # noqa: E402


def _workflows(url: str) -> list[list[str]]:
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT workflow_uuid, name, status, executor_id FROM dbos.workflow_status ORDER BY 1"
        ).fetchall()
    return [[str(v) for v in row] for row in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--children", type=int, default=200)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--chunk-concurrency", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--lease", type=float, default=8.0, help="the workers' --lease")
    parser.add_argument(
        "--keep", type=Path, default=None, help="where to keep a hung run's worker output"
    )
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    rng = random.Random(seed)
    print(f"seed {seed}", flush=True)
    binaries = find_binaries()
    if binaries is None:
        raise SystemExit("PostgreSQL is not installed")
    results = []
    with tempfile.TemporaryDirectory() as tmp, Cluster.create(binaries) as cluster:
        for run in range(args.runs):
            folder = Path(tmp) / f"run{run}"
            folder.mkdir()
            bench = Bench(folder, cluster, "postgresql")
            bench.url = bench.log = cluster.url_for(f"chunk_kill_{run}")
            bench.env["FANFOLD_DBOS_DB"] = bench.url
            bench.script.write_text(json.dumps(script(args.children)))
            # The last --lease given wins: the bench's own over the tests' 2.5 s, which
            # a root's worker placing hundreds of children overran at a load of 15-20
            # (its lease claimed, exit 3, nobody left to finish the tree).
            bench.worker_args = (
                *worker_args(args.chunk, args.chunk_concurrency),
                "--lease",
                str(args.lease),
            )
            try:
                bench.start_workers(*(f"w{i}" for i in range(1, args.workers + 1)))
                started = time.monotonic()
                counts = kill_one(
                    bench, f"ck{run}", args.children, rng, cwd=folder / "tree", timeout=90
                )
                counts["run_seconds"] = round(time.monotonic() - started, 1)
                if not counts["finished"] and args.keep is not None:
                    # What the workers said, and who holds what, for a hang's post-mortem.
                    kept = args.keep / f"run{run}"
                    kept.mkdir(parents=True, exist_ok=True)
                    for err in folder.glob("*.err"):
                        shutil.copy(err, kept / err.name)
                    (kept / "workflows.json").write_text(json.dumps(_workflows(bench.url)))
                    counts["kept"] = str(kept)
            finally:
                bench.stop_all()
            for proc, _ in bench.workers.values():
                wait_gone(proc.pid)
            counts["processes_left"] = len(_fanfold_processes(folder))
            print(json.dumps(counts), flush=True)
            results.append(counts)
    total = {
        key: sum(int(r[key]) for r in results)
        for key in ("lost", "duplicated", "commands_twice", "processes_left")
    }
    total["runs"] = len(results)
    total["hung"] = sum(1 for r in results if not r["finished"])
    total["verify_failures"] = sum(1 for r in results if not r["verify_ok"])
    total["survivors_stopped"] = sum(1 for r in results if r["survivors_stopped"])
    print("total", json.dumps(total), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
