"""The benchmark's measurements other than the timed fan-out: CPU per step by component,
log bytes per step, replay speed, memory per waiting sub-agent."""

from __future__ import annotations

import gc
import os
import signal
import sqlite3
import tempfile
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import trio

from bench.cpuclock import CpuClock
from bench.workload import default_logging, fanfold_fanout, fanout_limits, fanout_script
from fanfold import replay
from fanfold.db import Store
from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import Limits, canonical_json
from fanfold.tools.registry import ToolSet

# ------------------------------------------------------------------ CPU by component

COMPONENTS = (
    "reducer",
    "encoding",
    "sqlite",
    "logging",
    "runtime",
    "provider+tools",
    "trio",
    "other",
)


def component(filename: str, name: str) -> str | None:
    """The component a Python frame belongs to; None for the standard library and
    other code that works for its caller (the caller's component then counts)."""
    path = filename.replace(os.sep, "/")
    for part, found in (
        ("fanfold/statemachine/", "reducer"),
        ("<Conversation.", "reducer"),  # attrs-generated methods of the state
        ("fanfold/db/codec", "encoding"),
        ("<fanfold.db.codec", "encoding"),  # the codec's generated emitters
        ("/json/", "encoding"),
        ("fanfold/db/", "sqlite"),
        ("sqlite_utils/", "sqlite"),
        ("/sqlite3/", "sqlite"),
        ("structlog/", "logging"),
        ("/logging/", "logging"),
        ("fanfold/runtime/", "runtime"),
        ("fanfold/providers/", "provider+tools"),
        ("fanfold/tools/", "provider+tools"),
        ("/trio/", "trio"),
        ("/outcome/", "trio"),
        ("bench/", "other"),
    ):
        if part in path:
            return found
    return None


class Sampler:
    """A CPU-time sampling profiler: ``ITIMER_PROF`` (process CPU time, so other
    processes on the machine do not skew it) interrupts the main thread, where the event
    loop runs; each sample goes to the innermost frame's component, or the nearest
    caller's for standard-library frames. Time in C (SQLite, JSON, the garbage
    collector) counts where Python called it. Resolution is the kernel's tick."""

    INTERVAL = 0.0005

    def __init__(self) -> None:
        self.samples: dict[str, int] = defaultdict(int)

    def _sample(self, signum: int, frame: FrameType | None) -> None:
        while frame is not None:
            found = component(frame.f_code.co_filename, frame.f_code.co_name)
            if found is not None:
                self.samples[found] += 1
                return
            frame = frame.f_back
        self.samples["other"] += 1

    @contextmanager
    def running(self) -> Iterator[Sampler]:
        previous = signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, self.INTERVAL, self.INTERVAL)
        try:
            yield self
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0, 0)
            signal.signal(signal.SIGPROF, previous)


def components(
    n: int, min_samples: int = 400, max_runs: int = 10, *, warm: bool = True
) -> dict[str, Any]:
    """CPU per logged step by component, for the fan-out of ``n`` on a durable file
    under the CPU clock with commits in the loop and default logging.

    Shares come from sampling (``Sampler``) over as many runs as it takes to collect
    ``min_samples`` (at most ``max_runs``), scaled to the CPU per step of an unsampled
    run. Garbage-collection time (from ``gc.callbacks``) is counted inside the
    components whose allocations triggered it and reported beside them, and so are
    the CPU clock's own reads of the thread's CPU time.
    """
    sampler = Sampler()
    runs = 0
    with tempfile.TemporaryDirectory() as tmp, default_logging(Path(tmp)):
        folder = Path(tmp)

        def once(name: str) -> tuple[Any, CpuClock]:
            gc.collect()
            clock = CpuClock()
            run = trio.run(lambda: fanfold_fanout(n, folder / name, threaded=False), clock=clock)
            (folder / name).unlink()
            return run, clock

        if warm:
            once("warm.db")
        plain, clock = once("plain.db")
        with sampler.running():
            while runs < max_runs and (runs == 0 or sum(sampler.samples.values()) < min_samples):
                once(f"sampled{runs}.db")
                runs += 1
    total = sum(sampler.samples.values()) or 1
    per_step = plain.process_cpu / plain.steps * 1e6
    return {
        "n": n,
        "steps": plain.steps,
        "cpu_us_per_step": per_step,
        "gc_us_per_step": plain.gc / plain.steps * 1e6,
        "clock_reads_per_step": clock.reads / plain.steps,
        "clock_us_per_step": clock.reads * read_cost() / plain.steps * 1e6,
        "samples": total,
        "sampled_runs": runs,
        "us_per_step": {c: per_step * sampler.samples.get(c, 0) / total for c in COMPONENTS},
    }


def read_cost() -> float:
    """Seconds of CPU one ``time.thread_time()`` call takes here (a system call)."""
    started = time.thread_time()
    for _ in range(20_000):
        time.thread_time()
    return (time.thread_time() - started) / 20_001


# ------------------------------------------------------------------ log bytes per step

TASK = "Check the repository step by step."


def rounds_script(rounds: int) -> tuple[ScriptedProvider, int]:
    """One conversation, ``rounds`` model rounds each calling ``think`` (output "ok"),
    then a text answer. Also returns the bytes of new content the conversation adds:
    the task, every reply's text, every tool call's arguments and output."""
    replies: list[dict[str, Any]] = []
    content = len(TASK.encode())
    for i in range(rounds):
        text = f"Round {i}: looking at the next file."
        arguments = {"thought": f"file {i} looks fine, next one"}
        replies.append({"text": text, "tool_calls": [{"name": "think", "arguments": arguments}]})
        content += len(text.encode()) + len(canonical_json(arguments).encode()) + len(b"ok")
    replies.append({"text": "Everything checked."})
    content += len(b"Everything checked.")
    script = {"latency": 0, "agents": [{"match": {"path": "root"}, "replies": replies}]}
    return ScriptedProvider(script), content


def _used_bytes(database: Path) -> tuple[int, int]:
    """Bytes of pages in use (tables and indexes) and of payload, by SQLite's dbstat."""
    with sqlite3.connect(database) as conn:
        pages, payload = conn.execute("SELECT sum(pgsize), sum(payload) FROM dbstat").fetchone()
    conn.close()
    return int(pages), int(payload)


def _payload_by_part(database: Path) -> dict[str, int]:
    """Payload bytes by part of the log: the events, effects, conversations (the rows
    and their snapshots), blobs tables, and every index together."""
    parts: dict[str, int] = defaultdict(int)
    with sqlite3.connect(database) as conn:
        for name, payload in conn.execute("SELECT name, sum(payload) FROM dbstat GROUP BY name"):
            part = name if name in ("events", "effects", "conversations", "blobs") else "other"
            if name.startswith(("sqlite_autoindex_", "idx_")):
                part = "indexes"
            parts[part] += int(payload)
    conn.close()
    return dict(parts)


async def _conversation(database: Path, provider: ScriptedProvider | None, rounds: int) -> int:
    limits = Limits(max_rounds=rounds + 1)
    async with Runtime.open(
        database,
        provider or ScriptedProvider({"agents": []}),
        ToolSet.default(),
        limits=limits,
        logger=quiet_logger(),
        threaded_writes=False,
    ) as runtime:
        if provider is not None:
            result = await runtime.wait(await runtime.start(TASK, limits=limits))
            assert result.text == "Everything checked.", result
        return runtime.writer.statistics().steps


def log_bytes(rounds: int) -> dict[str, Any]:
    """Database bytes per logged step of a conversation of ``rounds`` tool rounds,
    beyond an empty database, minus the new content (text, arguments, tool output).

    Also the same conversation run a second time into the same database
    (``second_payload_overhead_per_step``): what each further conversation adds, once
    the values a database stores once (its blobs: tool schemas, prompts) are there;
    and the payload per step of each part of the log for the first one."""
    with tempfile.TemporaryDirectory() as tmp:
        empty, full = Path(tmp) / "empty.db", Path(tmp) / "full.db"
        trio.run(_conversation, empty, None, rounds, clock=CpuClock())
        provider, content = rounds_script(rounds)
        steps = trio.run(_conversation, full, provider, rounds, clock=CpuClock())
        (pages0, payload0), (pages, payload) = _used_bytes(empty), _used_bytes(full)
        before, after = _payload_by_part(empty), _payload_by_part(full)
        again, _ = rounds_script(rounds)
        trio.run(_conversation, full, again, rounds, clock=CpuClock())
        _, payload2 = _used_bytes(full)
    parts = {
        part: (after.get(part, 0) - before.get(part, 0)) / steps
        for part in ("events", "effects", "conversations", "blobs", "indexes", "other")
    }
    return {
        "second_payload_overhead_per_step": (payload2 - payload - content) / steps,
        "payload_per_step_by_part": parts,
        "rounds": rounds,
        "steps": steps,
        "content_bytes": content,
        "pages_bytes": pages - pages0,
        "payload_bytes": payload - payload0,
        "overhead_per_step": (pages - pages0 - content) / steps,
        "payload_overhead_per_step": (payload - payload0 - content) / steps,
    }


# ------------------------------------------------------------------ replay speed


def replay_speed(n: int, repeat: int) -> dict[str, Any]:
    """``replay.verify`` of a whole fan-out tree of ``n`` children, events per CPU
    second of the process (best of ``repeat``)."""
    with tempfile.TemporaryDirectory() as tmp:
        database = Path(tmp) / "bench.db"

        async def write() -> str:
            limits = fanout_limits(n)
            async with Runtime.open(
                database,
                fanout_script(n),
                ToolSet.default(),
                limits=limits,
                logger=quiet_logger(),
                threaded_writes=False,
            ) as runtime:
                root = await runtime.start("fan out", limits=limits)
                await runtime.wait(root)
                return root

        root = trio.run(write, clock=CpuClock())
        best, events = float("inf"), 0
        with Store.open(database) as store:
            for _ in range(repeat):
                started = time.process_time()
                report = replay.verify(store, root, tree=True)
                best = min(best, time.process_time() - started)
                assert report.ok, report.summary()
                events = report.events
    return {"n": n, "events": events, "cpu_s": best, "events_per_cpu_s": events / best}


# ------------------------------------------------------------------ memory per waiting child


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _calls_in_flight(runtime: Runtime) -> int:
    """How many conversations of ``runtime`` have a model call started and not ended.

    Read from the runtime's conversations (private: this is a benchmark) rather than by
    wrapping the provider, whose coroutine frame per call would be counted as the
    children's heap. A call is started once it waits on its timer (a provider that
    ``RepliesAtOnce``, as the scripted one) or once its worker awaits the provider."""
    return sum(1 for actor in runtime._actors.values() if actor._call and actor._call.started)


def memory(n: int) -> dict[str, Any]:
    """Python heap (tracemalloc) and RSS per sub-agent while ``n`` children all wait on
    a model call (an hour of scripted latency), durable log on a file. The heap is
    measured in one run, RSS in an earlier one without tracemalloc (which adds its own).
    RSS is only indicative: it moves in whole pages and with what the allocator kept.

    Measured once all ``n`` children's calls are in flight (not when their state
    says a call is due: until the writer has committed their creation the calls have
    not started, and the heap then holds the batch being written instead)."""

    async def measure(database: Path, traced: bool) -> tuple[int, int]:
        limits = fanout_limits(n)
        async with Runtime.open(
            database,
            fanout_script(n, child_latency=3600),
            ToolSet.default(),
            limits=limits,
            logger=quiet_logger(),
        ) as runtime:
            gc.collect()
            before = tracemalloc.get_traced_memory()[0] if traced else _rss()
            await runtime.start("fan out", limits=limits)
            with trio.fail_after(600):
                # The root's own call has returned (it spawned them); every call
                # in flight is a child's.
                while _calls_in_flight(runtime) < n:
                    await trio.sleep(0.05)
            gc.collect()
            after = tracemalloc.get_traced_memory()[0] if traced else _rss()
            return before, after

    with tempfile.TemporaryDirectory() as tmp:
        # RSS first: after a run, the allocator reuses the memory freed by the last one.
        rss0, rss1 = trio.run(measure, Path(tmp) / "rss.db", False)
        tracemalloc.start()
        try:
            heap0, heap1 = trio.run(measure, Path(tmp) / "heap.db", True)
        finally:
            tracemalloc.stop()
    return {
        "n": n,
        "heap_bytes_per_child": (heap1 - heap0) / n,
        "rss_bytes_per_child": (rss1 - rss0) / n,
    }
