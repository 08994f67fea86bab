"""The database a fan-out leaves: its file size and its payload bytes by row type.

The fan-out of ``python -m bench`` (a root spawns N sub-agents, each does three model
rounds and submits; durable log on a file, default logging, CPU clock) is run once;
then the WAL is checkpointed into the file and the file size and the stored texts
(event payloads by type, effect payloads by type, snapshots, blobs) are summed. The
log-bytes section of ``python -m bench`` measures one conversation that spawns nothing;
this is what a tree of many sub-agents stores.

Run: ``.venv/bin/python bench/bench_fanout_log.py [--n 1000]``
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
from pathlib import Path

import trio

from bench.cpuclock import CpuClock
from bench.workload import default_logging, fanfold_fanout


def measure(n: int) -> dict[str, int]:
    """File bytes and payload bytes of the fan-out of ``n`` children, by part."""
    with tempfile.TemporaryDirectory() as tmp, default_logging(Path(tmp)):
        database = Path(tmp) / "fanout.db"
        trio.run(lambda: fanfold_fanout(n, database, threaded=False), clock=CpuClock())
        conn = sqlite3.connect(database)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            parts: dict[str, int] = {"file": os.path.getsize(database)}
            for table in ("events", "effects"):
                for kind, size in conn.execute(
                    f"SELECT type, SUM(LENGTH(payload)) FROM {table} GROUP BY type"
                ):
                    parts[f"{table} {kind}"] = size
            (snapshots,) = conn.execute(
                "SELECT COALESCE(SUM(LENGTH(snapshot_json)), 0) FROM conversations"
            ).fetchone()
            (blobs,) = conn.execute("SELECT COALESCE(SUM(LENGTH(body)), 0) FROM blobs").fetchone()
        finally:
            conn.close()
    parts["snapshots"] = snapshots
    parts["blobs"] = blobs
    parts["payload"] = sum(v for k, v in parts.items() if k != "file")
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=1000, help="sub-agents (default 1000)")
    args = parser.parse_args()
    parts = measure(args.n)
    for name, size in sorted(parts.items(), key=lambda item: -item[1]):
        print(f"{name:32s} {size:12,d} B  {size / args.n:9,.0f} B per child")


if __name__ == "__main__":
    main()
