"""fanfold's benchmark (issue 11): one command, a table of targets and a JSON record.

    .venv/bin/python -m bench [--quick] [--n 100,1000,10000] [--json out.json] [--no-peers]

Sections (see bench/README.md for what each measures and how):

- fan-out: a root spawns N sub-agents, each does 3 rounds of 50 ms and submits; ideal
  150 ms. Timed on the CPU clock (``bench.cpuclock``; commits in the event loop) and
  on the wall clock, beside plain Trio and LangGraph (the optional ``bench`` extra).
- CPU per logged step, and by component (cProfile shares, scaled).
- log bytes per step at 1, 40 and 200 rounds of one conversation.
- ``replay.verify`` events per CPU second.
- Python heap (and RSS) per waiting sub-agent.

Every run prints the table and, with ``--json``, writes every number measured with the
commit, date, load and versions, so that runs can be compared.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio
from rich.console import Console
from rich.table import Table

from bench import langgraph_peers, sections
from bench.cpuclock import CpuClock
from bench.workload import (
    IDEAL,
    Run,
    default_logging,
    fanfold_fanout,
    trio_event_fanout,
    trio_sleep_fanout,
)

SCHEMA = 1
ROOT = Path(__file__).resolve().parent.parent


def _commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "subject": git("log", "-1", "--format=%s") or None,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def environment() -> dict[str, Any]:
    """Where and what was measured."""
    return {
        "schema": SCHEMA,
        **_commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "load_average": list(os.getloadavg()),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "trio": trio.__version__,
        "sqlite": sqlite3.sqlite_version,
        "langgraph": langgraph_peers.version(),
    }


# ------------------------------------------------------------------ fan-out


def _median(runs: list[Run]) -> dict[str, Any]:
    """Medians over repeated runs (each field separately)."""

    def med(field: str) -> float:
        return statistics.median(float(getattr(r, field)) for r in runs)

    steps = runs[0].steps
    return {
        "elapsed_s": med("elapsed"),
        "ratio": med("elapsed") / IDEAL,
        "thread_cpu_s": med("thread_cpu"),
        "process_cpu_s": med("process_cpu"),
        "gc_s": med("gc"),
        "steps": steps,
        "runs": len(runs),
        **(
            {
                "process_cpu_us_per_step": med("process_cpu") / steps * 1e6,
                "thread_cpu_us_per_step": med("thread_cpu") / steps * 1e6,
                "gc_us_per_step": med("gc") / steps * 1e6,
            }
            if steps
            else {}
        ),
    }


def fanout(
    n: int, repeat: int, peers: bool, langgraph_max: int, say: Callable[[str], None]
) -> dict[str, Any]:
    """Every fan-out variant at size ``n``, ``repeat`` times each, interleaved (one of
    each, then again) so that a change in the machine's load hits all alike."""
    variants: dict[str, Callable[[Path], Run]] = {
        # CPU clock: commits in the loop, so the loop's CPU time includes them.
        "cpu/fanfold durable": lambda d: trio.run(
            lambda: fanfold_fanout(n, d / "cpu.db", threaded=False), clock=CpuClock()
        ),
        "cpu/fanfold durable, logging off": lambda d: trio.run(
            lambda: fanfold_fanout(n, d / "quiet.db", threaded=False, logging_on=False),
            clock=CpuClock(),
        ),
        "cpu/fanfold in memory": lambda d: trio.run(
            lambda: fanfold_fanout(n, ":memory:"), clock=CpuClock()
        ),
        "cpu/plain Trio, trio.sleep": lambda d: trio.run(trio_sleep_fanout, n, clock=CpuClock()),
        # Wall clock: the runtime as it runs by default (file commits in a worker thread).
        "wall/fanfold durable": lambda d: trio.run(fanfold_fanout, n, d / "wall.db"),
        "wall/fanfold in memory": lambda d: trio.run(fanfold_fanout, n, ":memory:"),
        "wall/plain Trio, trio.sleep": lambda d: trio.run(trio_sleep_fanout, n),
        "wall/plain Trio, shared Event per round": lambda d: trio.run(trio_event_fanout, n),
    }
    notes: list[str] = []
    if peers and langgraph_peers.AVAILABLE and n <= langgraph_max:
        variants.update(
            {
                "wall/LangGraph Send, no saver": lambda d: langgraph_peers.run(n, "send", None),
                "wall/LangGraph Send, SQLite saver": lambda d: langgraph_peers.run(
                    n, "send", d / "lg-send.db"
                ),
                "wall/LangGraph subgraphs, SQLite saver": lambda d: langgraph_peers.run(
                    n, "subgraphs", d / "lg-sub.db"
                ),
            }
        )
    elif not peers:
        notes.append("LangGraph peers skipped (--no-peers)")
    elif not langgraph_peers.AVAILABLE:
        notes.append("LangGraph peers skipped: not installed (pip install -e '.[bench]')")
    else:
        notes.append(f"LangGraph peers skipped at N = {n} (--langgraph-max {langgraph_max})")
    runs: dict[str, list[Run]] = {name: [] for name in variants}
    for attempt in range(repeat):
        for name, variant in variants.items():
            # Garbage left by the previous variant must not be collected inside this one.
            gc.collect()
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                # fanfold logs as the CLI sets it up (JSON lines to a file).
                with default_logging(folder):
                    runs[name].append(variant(folder))
            say(f"  N={n} run {attempt + 1}/{repeat} {name}: {runs[name][-1].elapsed:.3f} s")
    return {"n": n, "notes": notes, "variants": {name: _median(r) for name, r in runs.items()}}


# ------------------------------------------------------------------ targets


@attrs.frozen
class Target:
    """One target of issue 11 beside its measured value."""

    name: str
    measured: float | None
    goal: str
    met: bool | None
    unit: str = ""


def targets(result: dict[str, Any]) -> list[Target]:
    """Every issue-11 target the run measured, met or not."""
    out: list[Target] = []
    fan = {f["n"]: f["variants"] for f in result["fanout"]}

    def get(n: int, variant: str, field: str) -> float | None:
        value = fan.get(n, {}).get(variant, {}).get(field)
        return None if value is None else float(value)

    for n, limit in ((100, 1.08), (1000, 1.5), (10000, 3.0)):
        ratio = get(n, "cpu/fanfold durable", "ratio")
        if ratio is not None:
            out.append(
                Target(f"CPU clock, durable, N={n}", ratio, f"<= {limit}x", ratio <= limit, "x")
            )
    per_step = {n: get(n, "cpu/fanfold durable", "process_cpu_us_per_step") for n in fan}
    for n in (100, 1000):
        value = per_step.get(n)
        if value is not None:
            out.append(Target(f"CPU per logged step, N={n}", value, "<= 15 us", value <= 15, "us"))
    if per_step.get(10000) is not None and per_step.get(1000) is not None:
        ratio = per_step[10000] / per_step[1000]  # type: ignore[operator]
        out.append(Target("CPU per step, N=10000 / N=1000", ratio, "<= 1.3x", ratio <= 1.3, "x"))
    ours = get(1000, "cpu/fanfold durable", "process_cpu_s")
    theirs = get(1000, "wall/LangGraph Send, SQLite saver", "process_cpu_s")
    if ours is not None and theirs is not None:
        share = ours / theirs
        out.append(
            Target(
                "CPU vs LangGraph Send + SQLite saver, N=1000",
                share,
                "<= 0.33x",
                share <= 1 / 3,
                "x",
            )
        )
    for row in result["log_bytes"]:
        value = row["payload_overhead_per_step"]
        out.append(
            Target(
                f"log bytes/step beyond content, {row['rounds']} rounds",
                value,
                "<= 400 B",
                value <= 400,
                "B",
            )
        )
    if result.get("replay"):
        value = result["replay"]["events_per_cpu_s"]
        out.append(
            Target(
                f"replay --verify, N={result['replay']['n']}",
                value,
                ">= 100,000 ev/CPU s",
                value >= 100_000,
                "ev/s",
            )
        )
    if result.get("memory"):
        value = result["memory"]["heap_bytes_per_child"]
        out.append(
            Target(
                f"heap per waiting sub-agent, N={result['memory']['n']}",
                value,
                "<= 5 KiB",
                value <= 5 * 1024,
                "B",
            )
        )
    return out


# ------------------------------------------------------------------ report


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "us":
        return f"{value:.1f} us"
    if unit == "B":
        return f"{value:,.0f} B"
    return f"{value:,.0f} {unit}"


def print_report(result: dict[str, Any], console: Console) -> None:
    env = result["environment"]
    console.print(
        f"commit {(env['commit'] or '?')[:10]}{' (dirty)' if env['dirty'] else ''}, {env['date']}, "
        f"load {' '.join(f'{x:.2f}' for x in env['load_average'])} on {env['cpus']} CPUs, "
        f"Python {env['python']}, Trio {env['trio']}, SQLite {env['sqlite']}, "
        f"{env['langgraph'] or 'LangGraph absent'}"
    )
    table = Table(title="Targets (issue 11)")
    for column in ("target", "measured", "goal", ""):
        table.add_column(column, justify="right" if column == "measured" else "left")
    for t in result["targets"]:
        status = "[green]met[/]" if t["met"] else "[red]not met[/]"
        table.add_row(t["name"], _fmt(t["measured"], t["unit"]), t["goal"], status)
    console.print(table)

    names = list(dict.fromkeys(name for f in result["fanout"] for name in f["variants"]))
    fan = Table(
        title=f"Fan-out: median time / ideal {IDEAL * 1000:.0f} ms (process CPU per logged step)"
    )
    fan.add_column("variant")
    for f in result["fanout"]:
        fan.add_column(f"N={f['n']}", justify="right")
    for name in names:
        cells = []
        for f in result["fanout"]:
            v = f["variants"].get(name)
            if v is None:
                cells.append("-")
                continue
            cell = f"{v['ratio']:.2f}x"
            if "process_cpu_us_per_step" in v and name.startswith("cpu/fanfold"):
                cell += f" ({v['process_cpu_us_per_step']:.0f} us)"
            elif name.startswith("wall/LangGraph") or name.startswith("wall/fanfold"):
                cell += f" ({v['process_cpu_s'] * 1000:.0f} ms CPU)"
            cells.append(cell)
        fan.add_row(name, *cells)
    console.print(fan)
    for f in result["fanout"]:
        for note in f["notes"]:
            console.print(f"  N={f['n']}: {note}")

    for comp in result["components"]:
        t = Table(
            title=f"CPU per logged step by component, N={comp['n']} "
            f"(sampled shares of {comp['cpu_us_per_step']:.0f} us)"
        )
        t.add_column("component")
        t.add_column("us/step", justify="right")
        for name, value in comp["us_per_step"].items():
            t.add_row(name, f"{value:.1f}")
        t.add_row("gc (inside the above)", f"{comp['gc_us_per_step']:.1f}")
        t.add_row(
            f"CPU clock reads, {comp['clock_reads_per_step']:.1f}/step (inside the above)",
            f"{comp['clock_us_per_step']:.1f}",
        )
        console.print(t)

    t = Table(title="Log bytes per step (one conversation, think tool rounds)")
    for column in (
        "rounds",
        "steps",
        "new content",
        "payload/step beyond content",
        "pages/step beyond content",
        "2nd conversation, payload/step",
        "by part (payload/step)",
    ):
        t.add_column(column, justify="right")
    for row in result["log_bytes"]:
        parts = row.get("payload_per_step_by_part", {})
        second = row.get("second_payload_overhead_per_step")
        t.add_row(
            str(row["rounds"]),
            str(row["steps"]),
            f"{row['content_bytes']:,} B",
            f"{row['payload_overhead_per_step']:,.0f} B",
            f"{row['overhead_per_step']:,.0f} B",
            "-" if second is None else f"{second:,.0f} B",
            " ".join(f"{k} {v:,.0f}" for k, v in parts.items() if round(v)),
        )
    console.print(t)
    if result.get("replay"):
        r = result["replay"]
        console.print(
            f"replay --verify: {r['events']:,} events in {r['cpu_s']:.3f} CPU s = "
            f"{r['events_per_cpu_s']:,.0f} events/CPU s (N={r['n']})"
        )
    if result.get("memory"):
        m = result["memory"]
        console.print(
            f"waiting sub-agents (N={m['n']}): {m['heap_bytes_per_child']:,.0f} B of Python "
            f"heap each, RSS {m['rss_bytes_per_child']:,.0f} B each"
        )


# ------------------------------------------------------------------ main


def _sizes(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; print the table; return (and with --json write) the result."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--n",
        type=_sizes,
        default=None,
        help="fan-out sizes, comma-separated (default 100,1000,10000; --quick: 10)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="runs per variant below N=10000, median reported (default 3; --quick: 1); "
        "one run at N >= 10000",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the full result here")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: small sizes, one run each, short conversations",
    )
    parser.add_argument("--no-peers", action="store_true", help="skip LangGraph")
    parser.add_argument(
        "--langgraph-max",
        type=int,
        default=1000,
        help="largest N to run LangGraph at (default 1000)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    sizes = args.n or ([10] if args.quick else [100, 1000, 10000])
    repeat = args.repeat or (1 if args.quick else 3)
    rounds = (1, 5) if args.quick else (1, 40, 200)
    small = [n for n in sizes if n <= 1000] or [min(sizes)]
    # Wide enough for the tables when printed to a file or a pipe (README, CI logs).
    console = Console(width=None if sys.stdout.isatty() else 120)
    err = Console(stderr=True)

    def say(line: str) -> None:
        if not args.quiet:
            err.print(line, highlight=False)

    result: dict[str, Any] = {
        "environment": environment(),
        "arguments": vars(args) | {"json": str(args.json)},
    }
    say("warming up")
    with tempfile.TemporaryDirectory() as tmp:
        # Imports, first-use caches: not part of any measurement.
        trio.run(
            lambda: fanfold_fanout(10, Path(tmp) / "warm.db", threaded=False, logging_on=False)
        )
    result["fanout"] = []
    for n in sizes:
        say(f"fan-out N={n}")
        result["fanout"].append(
            fanout(n, 1 if n >= 10000 else repeat, not args.no_peers, args.langgraph_max, say)
        )
    say("CPU by component")
    result["components"] = [
        sections.components(n, max_runs=1 if args.quick else 10, warm=not args.quick)
        for n in (small if args.quick else [n for n in small if n >= 100] or small)
    ]
    say("log bytes")
    result["log_bytes"] = [sections.log_bytes(r) for r in rounds]
    say("replay")
    result["replay"] = sections.replay_speed(max(small), repeat)
    say("memory")
    result["memory"] = sections.memory(max(small))
    result["environment"]["load_average_end"] = list(os.getloadavg())
    result["targets"] = [attrs.asdict(t) for t in targets(result)]
    print_report(result, console)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        console.print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
