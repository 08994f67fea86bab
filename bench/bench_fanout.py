"""Fan-out benchmark: a root spawns N sub-agents; each does 3 model rounds of 50 ms.

Reports wall time as a ratio to the ideal 150 ms, side by side with a plain Trio nursery
doing the same sleeps (the floor), for fanfold with its durable SQLite log and with an
in-memory database. Run:

    .venv/bin/python bench/bench_fanout.py            # N = 10, 100, 1000
    .venv/bin/python bench/bench_fanout.py 100 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import Limits
from fanfold.tools.registry import ToolSet

LATENCY = 0.05
ROUNDS = 3
IDEAL = LATENCY * ROUNDS


def script(n: int) -> ScriptedProvider:
    think = {"name": "think", "arguments": {"thought": "working"}}
    child_replies: list[dict[str, Any]] = [
        {"tool_calls": [think]},
        {"tool_calls": [think]},
        {"tool_calls": [{"name": "submit_result", "arguments": {"result": "done"}}]},
    ]
    return ScriptedProvider(
        {
            "latency": LATENCY,
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [
                        {
                            "latency": 0,
                            "tool_calls": [
                                {
                                    "name": "spawn_agents",
                                    "arguments": {
                                        "tasks": [{"task": f"task {i}"} for i in range(n)]
                                    },
                                }
                            ],
                        },
                        {"latency": 0, "text": "all done"},
                    ],
                },
                {"match": {"depth": 1}, "replies": child_replies},
            ],
        }
    )


async def plain_trio(n: int) -> float:
    async def child() -> None:
        for _ in range(ROUNDS):
            await trio.sleep(LATENCY)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(child)
    return time.perf_counter() - start


async def fanfold_run(n: int, database: str | Path) -> tuple[float, int]:
    elapsed, _, steps = await _fanfold_timed(n, database)
    return elapsed, steps


async def _fanfold_timed(n: int, database: str | Path) -> tuple[float, float, int]:
    """Wall time, CPU time of the process (every thread) and steps logged, from
    ``runtime.start`` to ``runtime.wait``."""
    limits = Limits(max_tasks_per_call=n, max_concurrent=n, child_timeout=None)
    async with Runtime.open(
        database, script(n), ToolSet.default(), limits=limits, logger=quiet_logger()
    ) as runtime:
        start, cpu = time.perf_counter(), time.process_time()
        root = await runtime.start("fan out", limits=limits)
        result = await runtime.wait(root)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        assert result.text == "all done", result
        steps = runtime.writer.statistics().steps
    return elapsed, cpu, steps


def measure(n: int, repeat: int) -> dict[str, Any]:
    floor = [trio.run(plain_trio, n) for _ in range(repeat)]
    durable, memory, cpu = [], [], []
    steps = 0
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            elapsed, used, steps = trio.run(_fanfold_timed, n, Path(tmp) / "bench.db")
            durable.append(elapsed)
            cpu.append(used)
        memory.append(trio.run(fanfold_run, n, ":memory:")[0])
    return {
        "n": n,
        "steps": steps,
        "plain_trio": statistics.median(floor) / IDEAL,
        "durable": statistics.median(durable) / IDEAL,
        "memory": statistics.median(memory) / IDEAL,
        "durable_steps_per_s": steps / statistics.median(durable),
        "durable_cpu_us_per_step": statistics.median(cpu) / steps * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[10, 100, 1000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"ideal: {IDEAL * 1000:.0f} ms; ratios are median wall time / ideal")
    print(
        f"{'N':>6} {'steps':>7} {'plain trio':>11} {'durable':>8} {'memory':>8} "
        f"{'steps/s':>9} {'cpu us/step':>12}"
    )
    for n in args.sizes:
        r = measure(n, args.repeat)
        print(
            f"{r['n']:>6} {r['steps']:>7} {r['plain_trio']:>10.2f}x {r['durable']:>7.2f}x "
            f"{r['memory']:>7.2f}x {r['durable_steps_per_s']:>9.0f} "
            f"{r['durable_cpu_us_per_step']:>12.0f}"
        )


if __name__ == "__main__":
    main()
