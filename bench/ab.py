"""A/B of the fan-out between source trees: CPU per logged step on the CPU clock.

    .venv/bin/python bench/ab.py /path/to/before,/path/to/after --n 100,1000 --repeat 5

Each tree's fan-out (``bench.workload.fanfold_fanout``: durable file, default logging,
commits in the loop) runs in a fresh subprocess whose working directory is that tree, so
its own ``fanfold`` package is imported (checked). The trees alternate run by run (the
order flips every round), so a change in the machine's load hits both alike. A process
runs the fan-out twice and reports the second run (warm caches, as a long-lived runtime
has them). Prints medians of the CPU-clock ratio, the process CPU per logged step and
the collector's share.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence

_CHILD = r"""
import gc, json, sys, tempfile
from pathlib import Path
sys.path.insert(0, ".")
import trio, fanfold
assert fanfold.__file__.startswith(sys.argv[2]), fanfold.__file__
from bench.cpuclock import CpuClock
from bench.workload import default_logging, fanfold_fanout
n = int(sys.argv[1])
with tempfile.TemporaryDirectory() as tmp, default_logging(Path(tmp)):
    for i in range(2):
        gc.collect()
        run = trio.run(
            lambda: fanfold_fanout(n, Path(tmp) / f"x{i}.db", threaded=False), clock=CpuClock()
        )
print(json.dumps({"ratio": run.ratio, "cpu": run.process_cpu / run.steps * 1e6,
                  "gc": run.gc / run.steps * 1e6}))
"""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("trees", help="source trees, comma-separated")
    parser.add_argument("--n", default="100,1000", help="fan-out sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=5, help="runs per tree and size")
    args = parser.parse_args(argv)
    trees = args.trees.split(",")
    sizes = [int(n) for n in args.n.split(",")]
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for round_ in range(args.repeat):
        for n in sizes:
            for tree in trees if round_ % 2 == 0 else trees[::-1]:
                done = subprocess.run(
                    [sys.executable, "-c", _CHILD, str(n), tree],
                    cwd=tree,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if done.returncode:
                    print(done.stderr, file=sys.stderr)
                    continue
                results.setdefault((tree, n), []).append(
                    json.loads(done.stdout.strip().splitlines()[-1])
                )
    for (tree, n), runs in sorted(results.items(), key=lambda item: (item[0][1], item[0][0])):
        ratio = statistics.median(r["ratio"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        gc = statistics.median(r["gc"] for r in runs)
        print(
            f"{tree:30s} N={n:6d} ratio={ratio:6.2f}x cpu/step={cpu:7.1f} us"
            f" gc={gc:5.1f} us ({len(runs)} runs)"
        )


if __name__ == "__main__":
    main()
