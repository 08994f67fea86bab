"""Power loss, simulated from a real run's own writes and syncs (issue 32, item 1).

A power loss keeps what the disk was told to keep: every byte written before the last
``fdatasync``/``fsync`` of its file that returned, and nothing after it (the worst
case; a disk may keep more). The world outside keeps everything: a command that ran
has run. This module records one real ``fanfold run`` under strace (every ``pwrite64``
to the log's files, every sync, every marker a bash command appends), kills it with
SIGKILL before it closes the log (so the WAL is still there), and then, for any moment
of that run, builds the files a power loss at that moment would have left: the
database file (not written during the run: checked) and the WAL cut to the length it
had at its last completed sync. A copy at a moment is judged by:

- **lost**: a marker appended before the moment (its command ran) whose step (the
  ``ModelReplied`` that asked for the command) is not in the cut log: an
  acknowledged step lost, the command forgotten;
- **twice**: ``fanfold resume`` of the copy, with the markers appended before the
  moment, appends a marker that is already there: a command run twice.

The recorder checks its own model: the database file gets no write during the run
and the WAL is only appended to after a sync (no restart, no rewrite of a synced
frame), so the synced prefix of the final WAL is what the disk held at the moment.

Campaign (numbers in bench/README.md, "Power loss")::

    .venv/bin/python bench/power_loss.py --runs 4 --seed 1 --resumes 40

``tests/test_power_loss.py`` runs one recording with a handful of resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from contextlib import closing, suppress
from pathlib import Path

import attrs

DB = "x.db"
MARKERS = "markers.txt"


def script(children: int = 3, commands: int = 2) -> dict[str, object]:
    """The scripted tree: the root runs a command, fans out to ``children`` sub-agents
    that run ``commands`` commands each, runs a second command, then a last one that
    holds the run open (``$HOLD`` seconds) so the recorder can stop it before close.
    Every command appends its own token to ``$MARK`` first thing."""

    def bash(token: str, tail: str = "") -> dict[str, object]:
        return {
            "tool_calls": [
                {"name": "bash", "arguments": {"command": f'echo {token} >> "$MARK"{tail}'}}
            ]
        }

    child = {
        "match": {"path": "root/*"},
        "replies": [
            *(bash(f"{{{{task}}}}:{i}") for i in range(1, commands + 1)),
            {"tool_calls": [{"name": "submit_result", "arguments": {"result": "ok"}}]},
        ],
    }
    tasks = [{"task": f"c{i}"} for i in range(1, children + 1)]
    root = {
        "match": {"path": "root"},
        "replies": [
            bash("r:1"),
            {"tool_calls": [{"name": "spawn_agents", "arguments": {"tasks": tasks}}]},
            bash("r:2"),
            bash("r:end", "; sleep ${HOLD:-0}"),
            {"text": "done"},
        ],
    }
    return {"latency": 0.0, "agents": [root, child]}


@attrs.frozen
class Recording:
    """One recorded run: its folder, final WAL bytes, and the trace's moments."""

    folder: Path
    wal: bytes
    synced: list[int]
    """Per moment (index into the trace's events), the WAL length on stable storage."""
    marks: list[frozenset[str]]
    """Per moment, the markers appended before it."""
    wal_syncs: int
    db_syncs: int


class ModelBroken(Exception):
    """The run did something the simulation does not model (a write to the database
    file, a rewrite of synced WAL bytes): its cuts would not be what a disk holds."""


_LINE = re.compile(r"^(\d+) +(.*)$")
_CALL = re.compile(r"^(\w+)\((\d+)<([^>]*)>(.*)$")
_RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
_PWRITE = re.compile(r",\s*(\d+),\s*(\d+)\)\s*=\s*(-?\d+)")
_MARK = re.compile(r'^, "([^"\\]+)\\n", \d+')


def fanfold_command() -> list[str]:
    """The CLI of the interpreter running this (its venv's ``fanfold`` script)."""
    return [sys.executable, "-c", "import sys; from fanfold.cli import main; sys.exit(main())"]


def _descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        for child, parent in parents.items():
            if parent == current:
                found.append(child)
                frontier.append(child)
    return found


def record(folder: Path, *, children: int = 3, commands: int = 2, timeout: float = 60) -> Recording:
    """Run the scripted tree in ``folder`` under strace and stop it (SIGKILL, before
    the log is closed) once its last command ran; parse the trace."""
    from fanfold.db import Store

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "s.json").write_text(json.dumps(script(children, commands)))
    db = folder / DB
    Store.open(db).close()  # created, migrated and checkpointed before the recording
    markers = folder / MARKERS
    trace = folder / "trace.txt"
    env = {**os.environ, "MARK": str(markers), "HOLD": "60"}
    command = [
        "strace", "-f", "--seccomp-bpf", "-qq", "-y", "-s", "64", "-o", str(trace),
        "-e", "trace=pwrite64,write,fdatasync,fsync,ftruncate",
        *fanfold_command(), "run", "go", "--script", str(folder / "s.json"),
        "--db", str(db), "--no-live", "--cwd", str(folder),
    ]  # fmt: skip
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=open(folder / "run.err", "w"),  # noqa: SIM115
    )
    deadline = time.monotonic() + timeout
    try:
        while "r:end" not in (markers.read_text() if markers.exists() else ""):
            if proc.poll() is not None:
                raise RuntimeError(f"the run ended early: {(folder / 'run.err').read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError("the run did not reach its last command")
            time.sleep(0.05)
    finally:
        for pid in _descendants(proc.pid):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)
    wal = (folder / f"{DB}-wal").read_bytes()
    return parse(folder, trace.read_text(), wal)


def parse(folder: Path, text: str, wal: bytes) -> Recording:
    """The moments of a trace: before each event, what was synced and marked."""
    wal_name, db_name = str(folder / f"{DB}-wal"), str(folder / DB)
    end = 0  # the WAL's length so far (appends only, checked)
    synced = 0
    # pid -> (call, path, WAL length at entry, arguments before the call was interrupted)
    pending: dict[str, tuple[str, str, int, str]] = {}
    marks: set[str] = set()
    moments_synced, moments_marks = [0], [frozenset[str]()]
    wal_syncs = db_syncs = 0
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        pid, rest = match.groups()
        resumed = _RESUMED.match(rest)
        if resumed:
            _name, tail = resumed.groups()
            if pid not in pending:
                continue
            call, path, at_entry, before = pending.pop(pid)
            args = before + tail
        else:
            call_match = _CALL.match(rest)
            if call_match is None:
                continue
            call, _, path, args = call_match.groups()
            at_entry = end
            if args.endswith("<unfinished ...>"):
                pending[pid] = (call, path, end, args.removesuffix("<unfinished ...>").rstrip())
                if call == "write" and path.endswith(MARKERS):
                    mark = _MARK.match(args)
                    if mark:
                        marks.add(mark.group(1))  # started: the command ran
                        moments_synced.append(synced)
                        moments_marks.append(frozenset(marks))
                continue
        if call == "pwrite64" and path in (wal_name, db_name):
            found = _PWRITE.search(args)
            if found is None:
                raise ModelBroken(f"unparsed write: {line}")
            length, offset, _result = map(int, found.groups())
            if path == db_name:
                raise ModelBroken(f"the database file was written during the run: {line}")
            if offset < synced:
                raise ModelBroken(f"a synced part of the WAL was rewritten: {line}")
            end = max(end, offset + length)
        elif call == "ftruncate" and path == wal_name:
            raise ModelBroken(f"the WAL was truncated during the run: {line}")
        elif call in ("fdatasync", "fsync") and path in (wal_name, db_name):
            if args.rstrip().endswith("= 0"):
                if path == wal_name:
                    wal_syncs += 1
                    synced = max(synced, at_entry)
                else:
                    db_syncs += 1
        elif call == "write" and path.endswith(MARKERS) and not resumed:
            mark = _MARK.match(args)
            if mark:
                marks.add(mark.group(1))
        else:
            continue
        moments_synced.append(synced)
        moments_marks.append(frozenset(marks))
    if end > len(wal):
        raise ModelBroken(f"the WAL is {len(wal)} bytes, the trace wrote {end}")
    return Recording(folder, wal, moments_synced, moments_marks, wal_syncs, db_syncs)


def distinct(recording: Recording) -> list[int]:
    """The first moment of each distinct (synced length, markers) state: the moments
    between are the same power loss."""
    seen: set[tuple[int, frozenset[str]]] = set()
    found = []
    for moment, state in enumerate(zip(recording.synced, recording.marks, strict=True)):
        if state not in seen:
            seen.add(state)
            found.append(moment)
    return found


def cut(recording: Recording, moment: int, target: Path) -> frozenset[str]:
    """Write in ``target`` the files a power loss at ``moment`` leaves; return the
    markers appended before it (also written to ``target``'s markers file)."""
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(recording.folder / DB, target / DB)
    length = recording.synced[moment]
    if length:
        (target / f"{DB}-wal").write_bytes(recording.wal[:length])
    marks = recording.marks[moment]
    (target / MARKERS).write_text("".join(f"{m}\n" for m in sorted(marks)))
    shutil.copyfile(recording.folder / "s.json", target / "s.json")
    return marks


def lost(target: Path, marks: frozenset[str]) -> list[str]:
    """The markers in ``marks`` whose command's step is not in the log in ``target``."""
    with closing(sqlite3.connect(target / DB)) as conn:
        try:
            rows = conn.execute("SELECT payload FROM events WHERE type = 'ModelReplied'")
            text = "\n".join(row[0] for row in rows)
        except sqlite3.OperationalError:
            text = ""  # no events table: nothing of the run
    return sorted(m for m in marks if f"echo {m} >>" not in text)


def resume(target: Path, timeout: float = 120) -> tuple[int, list[str]]:
    """``fanfold resume`` the copy in ``target``; its exit status and the markers
    appended more than once."""
    env = {**os.environ, "MARK": str(target / MARKERS)}
    env.pop("HOLD", None)
    done = subprocess.run(
        [
            *fanfold_command(),
            "resume",
            "--script",
            str(target / "s.json"),
            "--db",
            str(target / DB),
        ],
        env=env,
        cwd=target,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    counts = Counter((target / MARKERS).read_text().split())
    return done.returncode, sorted(m for m, n in counts.items() if n > 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4, help="recorded runs (default 4)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--children", type=int, default=6)
    parser.add_argument("--resumes", type=int, default=40, help="moments resumed, in all")
    parser.add_argument("--folder", type=Path, default=Path("/tmp/fanfold-power-loss"))
    parser.add_argument("--json", type=Path, help="write the counts here")
    options = parser.parse_args()
    rng = random.Random(options.seed)
    shutil.rmtree(options.folder, ignore_errors=True)
    totals = Counter[str]()
    for run in range(options.runs):
        recording = record(options.folder / f"run{run}", children=options.children)
        moments = range(len(recording.synced))
        totals["moments"] += len(moments)
        totals["wal_syncs"] += recording.wal_syncs
        for moment in moments:
            target = options.folder / f"run{run}" / f"cut{moment}"
            marks = cut(recording, moment, target)
            missing = lost(target, marks)
            totals["commands_ran"] += len(marks)
            totals["lost"] += len(missing)
            totals["moments_with_loss"] += bool(missing)
        per_run = max(1, options.resumes // options.runs)
        for moment in rng.sample(list(moments), min(per_run, len(moments))):
            target = options.folder / f"run{run}" / f"resume{moment}"
            cut(recording, moment, target)
            code, twice = resume(target)
            totals["resumed"] += 1
            totals["resume_failed"] += code != 0
            totals["twice"] += len(twice)
        print(f"run {run}: {dict(totals)}", flush=True)
    print(json.dumps(dict(totals)))
    if options.json:
        options.json.write_text(json.dumps(dict(totals), indent=1))
    return 0 if totals["lost"] == totals["twice"] == totals["resume_failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
