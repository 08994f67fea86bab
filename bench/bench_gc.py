"""The collector during a fan-out: collections and CPU per generation.

The fan-out of ``python -m bench`` (durable log on a file, default logging, CPU clock)
runs once with ``gc.callbacks`` timing every collection in the event loop's thread;
``--threshold`` sets the runtime's young-generation threshold for the run
(``fanfold.runtime.collector.GC_TUNED_THRESHOLD``), to compare policies side by side.

Run: ``.venv/bin/python bench/bench_gc.py [--n 10000] [--threshold 100000]``
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

import fanfold.runtime.collector as collector_module
from bench.cpuclock import CpuClock
from bench.workload import default_logging, fanfold_fanout


def measure(n: int, threshold: int | None = None) -> dict[str, Any]:
    """Per generation: collections, CPU seconds and CPU per logged step."""
    if threshold is not None:
        collector_module.GC_TUNED_THRESHOLD = threshold
    counts = [0, 0, 0]
    seconds = [0.0, 0.0, 0.0]
    started = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.thread_time()
        else:
            counts[info["generation"]] += 1
            seconds[info["generation"]] += time.thread_time() - started[0]

    with tempfile.TemporaryDirectory() as tmp, default_logging(Path(tmp)):
        gc.collect()
        gc.callbacks.append(timed)
        try:
            run = trio.run(
                lambda: fanfold_fanout(n, Path(tmp) / "gc.db", threaded=False), clock=CpuClock()
            )
        finally:
            gc.callbacks.remove(timed)
    return {
        "n": n,
        "threshold": collector_module.GC_TUNED_THRESHOLD,
        "steps": run.steps,
        "collections": counts,
        "seconds": seconds,
        "us_per_step": [s / run.steps * 1e6 for s in seconds],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=10000, help="sub-agents (default 10000)")
    parser.add_argument("--threshold", type=int, help="young-generation threshold")
    args = parser.parse_args()
    result = measure(args.n, args.threshold)
    print(f"N={result['n']} threshold={result['threshold']} steps={result['steps']}")
    for generation in range(3):
        print(
            f"  generation {generation}: {result['collections'][generation]:5d} collections,"
            f" {result['seconds'][generation] * 1e3:8.0f} ms,"
            f" {result['us_per_step'][generation]:6.1f} us per step"
        )


if __name__ == "__main__":
    main()
