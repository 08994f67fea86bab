"""What a ``Runtime.events`` reader that keeps up costs a run.

One fan-out of N children answering at once (scripted provider, no latency, a file
database), run alone, then with a reader following it (``phases`` on and off): the
wall time until the root is at rest, and until the reader has every step.

Run: ``.venv/bin/python bench/bench_events.py [--n 1000] [--runs 3]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import trio

from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import Limits
from fanfold.tools.registry import ToolSet


def _provider(n: int) -> ScriptedProvider:
    spawn = {"name": "spawn_agents", "arguments": {"tasks": [{"task": f"t{i}"} for i in range(n)]}}
    submit = {"name": "submit_result", "arguments": {"result": "ok"}}
    return ScriptedProvider(
        {
            "latency": 0.0,
            "agents": [
                {"match": {"path": "root"}, "replies": [{"tool_calls": [spawn]}, {"text": "done"}]},
                {"match": {"path": "root/*"}, "replies": [{"tool_calls": [submit]}]},
            ],
        }
    )


async def _one(db: Path, n: int, reader: str) -> tuple[float, float | None, int]:
    """(seconds to the root's rest, seconds to the reader's last step, steps read)."""
    limits = Limits(max_concurrent=n, max_tasks_per_call=n)
    async with Runtime.open(
        db, _provider(n), ToolSet.default(), logger=quiet_logger(), limits=limits
    ) as runtime:
        started = time.perf_counter()
        root = await runtime.start("go", cwd=".")
        seen = 0
        done: float | None = None

        async def follow() -> None:
            nonlocal seen, done
            async for _ in runtime.events(root, phases=reader == "phases"):
                seen += 1
            done = time.perf_counter() - started

        async with trio.open_nursery() as nursery:
            if reader != "none":
                nursery.start_soon(follow)
            await runtime.wait(root)
            ran = time.perf_counter() - started
        return ran, done, seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for k in range(args.runs):
            for reader in ("none", "phases", "bare"):
                db = Path(folder) / f"{reader}-{k}.db"
                ran, done, seen = trio.run(_one, db, args.n, reader)
                tail = "" if done is None else f", reader done {done:.2f} s ({seen} steps)"
                print(f"n={args.n} reader={reader}: run {ran:.2f} s{tail}")


if __name__ == "__main__":
    main()
