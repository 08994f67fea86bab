"""kill -9 campaign: crash real ``fanfold`` processes at random moments, resume, audit.

Each point is a fresh temporary folder with a real SQLite log and a working directory.
``fanfold run`` starts a scripted tree there (``bench/kill9_script.json``): the root
fans out to five sub-agents, which run real bash commands that take a while and start
background and daemonised processes (``cmd &``, ``(nohup cmd &)``, ``setsid cmd &``),
retry scripted model errors (``fail_first``), fail (``submit_error``), outlive their
time limit (a child timeout cancels one), and fan out again (two grandchildren).
Some points also send SIGINT (the CLI's clean cancel of the whole tree) just before
the kill. The process is killed with SIGKILL at a random moment; on some points the
first ``fanfold resume`` is killed again mid-recovery; then ``fanfold resume`` runs
until it ends. The phase the tree was in at each kill is read from the log afterwards.

``--workload mcp`` runs ``bench/kill9_mcp_script.json`` instead: its agents call tools
of two real MCP servers (``tests/mcp_test_server.py``, the SDK's server side over stdio,
declared in a configuration file the campaign writes and passes as ``$FANFOLD_CONFIG``):
``once``, whose ``count`` tool is not idempotent (a call in flight at a crash must be
recorded as interrupted and never sent again), and ``again``, the same server with
``count`` in ``idempotent_tools`` (re-sent on resume). ``count`` appends its call's
token to ``work/count`` first thing, then takes 0.3 s, so kills land with calls in
flight; one child's time limit cancels a ``slow`` call mid-flight; grandchildren share
the servers with a bash command.

Then, per point:

- lost outcomes: a sub-agent that was started (has a conversation) but whose outcome
  never reached its parent: no SubAgentFinished for it in the parent's log (and it
  was not written off), or no entry for it in the parent's fan-in result;
- duplicated outcomes: two SubAgentFinished for one child, or a child listed twice in
  a fan-in result;
- verify failures: ``fanfold replay ROOT --verify --tree`` exits non-zero;
- double executions: every bash command appends a token unique to its call to
  ``markers.txt`` first thing; a token seen twice is a command run twice; the same for
  the MCP ``count`` calls' tokens in ``count`` (the server appends each call's token),
  except that a call of the idempotent ``again`` server may be re-sent once per crash
  of its point: only executions beyond 1 + the point's kills count there;
- processes left running: every command names its long-lived processes after the
  point (``exec -a <point tag>...``); after the last resume has ended (and a short
  grace, ``--grace``), /proc is scanned for processes whose command line holds the
  point's tag or whose working directory is the point's (an MCP server and its supervisor
  run there). They are counted, listed and killed.

Run from the repository root with the project's venv::

    .venv/bin/python bench/kill9_campaign.py --points 200 --seed 1 --jobs 2 --json out.json

The goal is 0 lost, 0 duplicated, 0 verify failures, 0 double executions and 0
processes left running. The exit status is 0 when every count is 0, 1 otherwise.
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
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console
from rich.table import Table

from fanfold.db import Store
from fanfold.statemachine import (
    AwaitingRetry,
    CancellingSubAgents,
    CancelRequested,
    Conversation,
    LlmRequesting,
    SubAgentFinished,
    ToolExecuting,
    ToolResultMessage,
)

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "kill9_script.json"
MCP_SCRIPT = HERE / "kill9_mcp_script.json"
MCP_SERVER = HERE.parent / "tests" / "mcp_test_server.py"
WORKLOADS = {"bash": SCRIPT, "mcp": MCP_SCRIPT}
# The MCP workload's servers: two copies of the tests' server, run from the working
# directory (its tools write there); `again` declares `count` idempotent. The tokens of
# `count` calls name the server (`TASK:once:N`, `TASK:again:N`).
MCP_SERVERS = """\
[mcp_servers.once]
command = {python}
args = [{server}, "ok", "."]
env = {{ COUNT_SLEEP = "0.3" }}

[mcp_servers.again]
command = {python}
args = [{server}, "ok", "."]
env = {{ COUNT_SLEEP = "0.3" }}
idempotent_tools = ["count"]
"""

# Extra options of every `fanfold run`: the script's tree is two levels deep, and at most
# three children of one parent run at once (so the fourth and fifth wait in the queue).
RUN_OPTIONS = ("--max-depth", "2", "--max-concurrent", "3", "--no-live")

# The phases a kill can land in, read from the log after the kill, most specific first
# (a kill usually finds several at once: one child in a model call, another running
# bash...); the first that applies is the kill's phase in the summary.
# - cancellation: a cancel is under way (a parent waits for its children to acknowledge
#   one; a SIGINT was sent and the root has not come to rest; a cancelled child's
#   outcome has not reached its parent);
# - fan-in: a child has ended but its parent has not accepted its outcome yet, or a
#   parent has every outcome and its answer built on them is not recorded yet;
# - spawn: a parent started a child that is not created yet or not yet at work;
# - bash / mcp / tool: a conversation waits for a bash command / an MCP server's tool
#   (``mcp__SERVER__TOOL``) / another tool;
# - model: a conversation waits for a model reply (or a retry's back-off);
# - done: the root had come to rest (the process was about to exit);
# - startup: nothing logged yet; unreadable: the log could not be read (a finding).
PHASES = (
    "cancellation",
    "fan-in",
    "spawn",
    "bash",
    "mcp",
    "model",
    "tool",
    "done",
    "startup",
    "unreadable",
)

# The counts of the goal (all 0), in the order they are reported.
GOAL = ("lost", "duplicated", "verify_failures", "double_executions", "processes_left_running")

console = Console()

# The files whose growth shows a run at work (``log_size``).
LOG_FILES = ("db.log.jsonl", "db.sqlite-wal", "db.sqlite")


@attrs.frozen
class Settings:
    """What every point shares."""

    base: Path  # the campaign's temporary folder
    script: Path
    fanfold: tuple[str, ...]  # the command that runs the CLI
    env: dict[str, str]
    window: float  # seconds of work of an uninterrupted run, after its log starts
    grace: float  # seconds survivors are given to go away before they count
    timeout: float  # seconds a final resume (or replay) may take before it is killed
    keep: bool
    # The files whose growth starts a run's kill clock (``log_size``): any log for the
    # bash workload; for the MCP workload only the JSON log, whose first line is the
    # root's start. The run creates the SQLite log once its servers have started and
    # listed their tools, and then takes a second or more (under load) before the root
    # starts: a clock started at the SQLite file put a third of the kills there.
    clock_files: tuple[str, ...] = LOG_FILES


@attrs.frozen
class Plan:
    """What happens to one point, drawn from the campaign's seed before any point runs."""

    index: int
    tag: str
    kill_at: float  # fraction of the window after which the run is killed
    sigint: bool  # send SIGINT first (the clean cancel), then SIGKILL after sigint_lead
    sigint_lead: float  # seconds between the SIGINT and the SIGKILL
    kill_resume: bool  # also kill the first resume mid-recovery
    resume_kill_at: float  # fraction of the window after which that resume is killed

    @classmethod
    def draw(cls, index: int, seed: int, nonce: str) -> Plan:
        # One generator per point, seeded from the campaign's seed and the point's
        # index: a point does the same whatever the other points or --jobs do.
        rng = random.Random(f"{seed}:{index}")
        sigint = rng.random() < 0.25
        # A third of the kills land early, where the root spawns its children (a few
        # tens of milliseconds long); the rest anywhere in the run. A SIGINT's cancel
        # takes a few tens of milliseconds, so the kill follows it closely.
        early = rng.random() < 0.3
        return cls(
            index=index,
            tag=f"k9-{nonce}-p{index:05d}",
            kill_at=rng.uniform(0.0, 0.15) if early else rng.uniform(0.0, 1.05),
            sigint=sigint,
            sigint_lead=rng.uniform(0.0, 0.05) if sigint else 0.0,
            kill_resume=rng.random() < 0.35,
            resume_kill_at=rng.uniform(0.0, 0.8),
        )


# ------------------------------------------------------------------ processes


def fanfold_command() -> tuple[str, ...]:
    """The installed ``fanfold`` script next to this interpreter, else the module."""
    script = Path(sys.executable).with_name("fanfold")
    if script.exists():
        return (str(script),)
    return (sys.executable, "-c", "from fanfold.cli import main; main()")


def spawn(
    settings: Settings, point: Path, args: Sequence[str], name: str
) -> subprocess.Popen[bytes]:
    """Start ``fanfold ARGS`` in the point's folder, output to files named ``name``."""
    with open(point / f"{name}.out", "wb") as out, open(point / f"{name}.err", "wb") as err:
        return subprocess.Popen(
            [*settings.fanfold, *args],
            cwd=point,
            env=settings.env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )


def log_size(point: Path, files: Sequence[str] = LOG_FILES) -> int:
    """Bytes of the point's JSON log and SQLite write-ahead log (or of ``files``): they
    grow as it works."""
    total = 0
    for name in files:
        with suppress(OSError):
            total += (point / name).stat().st_size
    return total


def wait_for_work(
    process: subprocess.Popen[bytes],
    point: Path,
    before: int,
    files: Sequence[str] = LOG_FILES,
    limit_s: float = 20.0,
) -> float:
    """Wait until the process has logged something in ``files`` (or ended, or
    ``limit_s`` passed); returns when, on the monotonic clock."""
    limit = time.monotonic() + limit_s
    while time.monotonic() < limit and process.poll() is None and log_size(point, files) <= before:
        time.sleep(0.005)
    return time.monotonic()


def kill(process: subprocess.Popen[bytes]) -> bool:
    """SIGKILL the process if it is still running and reap it; whether it was killed."""
    alive = process.poll() is None
    if alive:
        process.send_signal(signal.SIGKILL)
    process.wait()
    return alive


def finish(process: subprocess.Popen[bytes], timeout: float) -> int | None:
    """Wait for the process; kill it after ``timeout`` s (None: it hung)."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill(process)
        return None


def tail(path: Path, lines: int = 6) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ------------------------------------------------------------------ the log


@contextmanager
def reading(db: Path) -> Iterator[Store]:
    store = Store.open(db, read_only=True)
    try:
        yield store
    finally:
        store.close()


def kill_phase(db: Path, *, interrupted: bool) -> dict[str, Any]:
    """``{"phases": phases_at_kill(...)}``, or ``{"phases": ["unreadable"], "error": ...}``
    if the log cannot be read."""
    try:
        return {"phases": phases_at_kill(db, interrupted=interrupted)}
    except Exception as exc:  # a finding to report, not a reason to stop the campaign
        return {"phases": ["unreadable"], "error": f"{type(exc).__name__}: {exc}"}


def empty(db: Path) -> bool:
    """Whether the SQLite file holds no table yet (the run was killed creating it)."""
    with closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)) as conn:
        tables: int = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    return tables == 0


def phases_at_kill(db: Path, *, interrupted: bool) -> list[str]:
    """The phases the tree was in when it was killed, read from its log (see PHASES).

    ``interrupted``: a SIGINT was sent before the kill, so a cancel was under way if
    the root had not come to rest.
    """
    if not db.exists() or empty(db):
        return ["startup"]
    with reading(db) as store:
        roots = store.list_roots()
        if not roots:
            return ["startup"]
        rows = store.tree(roots[0].id)
        states = {row.id: store.load_state(row.id) for row in rows}
        root = states[roots[0].id]
        tags: set[str] = set()
        if root.at_rest:
            tags.add("done")
        elif interrupted:
            tags.add("cancellation")
        for row in rows:
            state = states[row.id]
            tags |= _phase_tags(state, rows=[r for r in rows if r.parent_id == row.id])
            if not state.at_rest and any(
                isinstance(e.event, CancelRequested) for e in store.events(row.id)
            ):
                tags.add("cancellation")
            if row.parent_id is not None and state.is_terminal:
                parent = states.get(row.parent_id)
                children = parent.children if parent is not None else None
                if children is not None and children.find_pending(row.id) is not None:
                    # Ended, but its outcome has not reached its parent yet.
                    tags.add("fan-in")
                    if getattr(state.phase, "reason", None) is not None:
                        tags.add("cancellation")
    return [phase for phase in PHASES if phase in tags] or ["done"]


def _phase_tags(state: Conversation, *, rows: Sequence[Any]) -> set[str]:
    tags: set[str] = set()
    phase = state.phase
    if isinstance(phase, CancellingSubAgents):
        tags.add("cancellation")
    if isinstance(phase, LlmRequesting | AwaitingRetry):
        tags.add("model")
        last = state.history[-1] if state.history else None
        if isinstance(last, ToolResultMessage) and last.result.name == "spawn_agents":
            tags.add("fan-in")  # all outcomes are in; the answer built on them is not
    if isinstance(phase, ToolExecuting):
        name = phase.current.name
        if name.startswith("mcp__"):
            tags.add("mcp")
        else:
            tags.add({"bash": "bash", "spawn_agents": "spawn"}.get(name, "tool"))
    children = state.children
    if children is not None:
        created = {row.id: row for row in rows}
        for pending in children.pending:
            row = created.get(pending.spec.id)
            if pending.started and (row is None or row.last_seq == 0):
                tags.add("spawn")  # spawned, not yet created or not yet at work
    return tags


def audit(db: Path) -> dict[str, Any]:
    """Lost and duplicated outcomes of the point's tree, and what is still unfinished."""
    result: dict[str, Any] = {
        "root": None,
        "root_phase": None,
        "conversations": 0,
        "unfinished": [],
        "lost": [],
        "duplicated": [],
        "stray": [],
        "written_off": [],
        "mcp_interrupted": [],
    }
    if not db.exists():
        return result
    with reading(db) as store:
        roots = store.list_roots()
        if not roots:
            return result
        root = roots[0]
        rows = store.tree(root.id)
        result["root"] = root.id
        result["conversations"] = len(rows)
        result["unfinished"] = [row.id for row in rows if row.status == "running"]
        for row in rows:
            kids = [r.id for r in rows if r.parent_id == row.id]
            state = store.load_state(row.id)
            if row.id == root.id:
                result["root_phase"] = type(state.phase).__name__
            result["mcp_interrupted"] += mcp_interrupted(state)
            if not kids:
                continue
            delivered = Counter(
                e.event.child_id
                for e in store.events(row.id)
                if isinstance(e.event, SubAgentFinished)
            )
            found = judge(
                kids,
                delivered,
                Counter(fan_in_ids(state)),
                written_off=state.written_off,
                ended=row.status != "running",
            )
            for key, ids in found.items():
                result[key] += ids
    return result


def judge(
    kids: Sequence[str],
    delivered: Counter[str],
    listed: Counter[str],
    *,
    written_off: Sequence[str],
    ended: bool,
) -> dict[str, list[str]]:
    """What is wrong with the outcomes of one parent's started children ``kids``.

    ``delivered``: SubAgentFinished events per child id in the parent's log; ``listed``:
    entries per child id in its fan-in results; ``written_off``: children it gave up
    on (their failure is in the fan-in without an event); ``ended``: the parent is no
    longer running, so every outcome should have arrived.

    - lost: a child without a delivered outcome (unless written off) or without an
      entry in the fan-in, once the parent has ended;
    - duplicated: a child delivered or listed more than once;
    - stray: an outcome delivered for a child the parent never started.
    """
    lost = [
        kid
        for kid in kids
        if ended and ((delivered[kid] == 0 and kid not in written_off) or listed[kid] == 0)
    ]
    duplicated = sorted(
        {k for k, n in delivered.items() if n > 1} | {k for k, n in listed.items() if n > 1}
    )
    return {
        "lost": lost,
        "duplicated": duplicated,
        "stray": sorted(set(delivered) - set(kids)),
        "written_off": [kid for kid in kids if kid in written_off],
    }


def fan_in_ids(state: Conversation) -> list[str]:
    """The agent ids listed in the conversation's spawn_agents results, repeats kept."""
    ids: list[str] = []
    for message in state.history:
        if isinstance(message, ToolResultMessage) and message.result.name == "spawn_agents":
            try:
                payload = json.loads(message.result.content)
                ids += [str(entry["agent_id"]) for entry in payload["sub_agent_results"]]
            except (ValueError, KeyError, TypeError):
                continue
    return ids


def mcp_interrupted(state: Conversation) -> list[str]:
    """The MCP tools whose call this conversation recorded as interrupted (in flight
    at a crash, not re-sent)."""
    return [
        message.result.name
        for message in state.history
        if isinstance(message, ToolResultMessage)
        and message.result.name.startswith("mcp__")
        and message.result.is_error
        and message.result.content.startswith("interrupted:")
    ]


def tokens(path: Path) -> Counter[str]:
    """How often each whitespace-separated token appears in the file (none if absent)."""
    try:
        return Counter(path.read_text().split())
    except OSError:
        return Counter()


def double_executions(workdir: Path, *, crashes: int = 0) -> dict[str, int]:
    """Tokens written more than they may be: a bash call's (``markers.txt``) or a
    non-idempotent MCP call's (``count``, ``TASK:once:N``) more than once; an idempotent
    MCP call's (``TASK:again:N``) more than once plus once per crash of the point
    (``crashes``: each resume re-sends a call in flight at most once)."""
    found = {token: n for token, n in tokens(workdir / "markers.txt").items() if n > 1}
    for token, n in mcp_tokens(workdir).items():
        if n > 1 + (crashes if ":again:" in token else 0):
            found[token] = n
    return found


def mcp_tokens(workdir: Path) -> Counter[str]:
    """How often the MCP servers received each ``count`` call (its token's lines)."""
    return Counter({t: n for t, n in tokens(workdir / "count").items() if ":" in t})


def mcp_summary(workdir: Path, interrupted: Sequence[str]) -> dict[str, int]:
    """The MCP calls of a point: received by a server (distinct tokens), re-sent to the
    idempotent server after a crash, and recorded as interrupted."""
    received = mcp_tokens(workdir)
    return {
        "received": len(received),
        "resent": sum(n - 1 for t, n in received.items() if ":again:" in t),
        "interrupted": len(interrupted),
    }


# ------------------------------------------------------------------ survivors


def survivors(tag: str, workdir: Path) -> list[dict[str, Any]]:
    """Live processes started by the point's bash commands: their command line holds
    the point's tag, or their working directory is (inside) the point's."""
    pattern = re.compile(re.escape(tag) + r"(?![0-9])")
    where = str(workdir)
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                state = stat.read().rsplit(b")", 1)[1].split()[0]
            if state in (b"Z", b"X"):
                continue  # a zombie runs nothing; its parent has yet to reap it
            with open(f"/proc/{entry.name}/cmdline", "rb") as file:
                cmdline = file.read().replace(b"\0", b" ").decode(errors="replace").strip()
            try:
                cwd = os.readlink(f"/proc/{entry.name}/cwd")
            except OSError:
                cwd = ""
        except (OSError, IndexError):
            continue  # gone meanwhile
        if pattern.search(cmdline) or cwd == where or cwd.startswith(where + "/"):
            found.append({"pid": int(entry.name), "kind": kind(tag, cmdline), "cmdline": cmdline})
    return found


def kind(tag: str, cmdline: str) -> str:
    """Which of the script's processes this is: the last part of the name a command
    gave it (``bg``, ``nohup``, ``setsid``, ``long``), ``mcp-server`` and
    ``mcp-supervisor`` for an MCP server and its supervisor, ``shell`` for a bash running
    a command of the script, ``other`` for anything else in the working directory."""
    name = cmdline.split(" ", 1)[0]
    if name.startswith(tag + "."):
        return name.rsplit(".", 1)[-1]
    if "supervisor.py --serve" in cmdline:
        return "mcp-supervisor"
    if MCP_SERVER.name in cmdline:
        return "mcp-server"
    return "shell" if tag in cmdline else "other"


def reap_survivors(tag: str, workdir: Path, grace: float) -> list[dict[str, Any]]:
    """Survivors still there after ``grace`` seconds; each is then killed."""
    limit = time.monotonic() + grace
    found = survivors(tag, workdir)
    while found and time.monotonic() < limit:
        time.sleep(0.05)
        found = survivors(tag, workdir)
    for process in found:
        with suppress(OSError):
            os.kill(process["pid"], signal.SIGKILL)
    return found


# ------------------------------------------------------------------ one point


def run_point(settings: Settings, plan: Plan) -> dict[str, Any]:
    point = settings.base / f"p{plan.index:05d}"
    workdir = point / "work"
    workdir.mkdir(parents=True)
    db = point / "db.sqlite"
    started = time.monotonic()
    record: dict[str, Any] = {"point": plan.index, "tag": plan.tag, "plan": attrs.asdict(plan)}
    kills: list[dict[str, Any]] = []

    # 1. The run, killed at a random moment (after a SIGINT on some points).
    run = spawn(
        settings,
        point,
        [
            "run",
            plan.tag,
            "--script",
            str(settings.script),
            "--cwd",
            str(workdir),
            "--db",
            str(db),
            *RUN_OPTIONS,
        ],
        "run",
    )
    at = wait_for_work(run, point, 0, settings.clock_files, settings.timeout)
    sigint_sent = False
    if plan.sigint:
        time.sleep(max(0.0, plan.kill_at * settings.window - plan.sigint_lead))
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
            sigint_sent = True
        time.sleep(plan.sigint_lead)
    else:
        time.sleep(plan.kill_at * settings.window)
    if kill(run):
        kills.append(
            {
                "process": "run",
                "after": round(time.monotonic() - at, 3),
                **kill_phase(db, interrupted=sigint_sent),
            }
        )
    record["run_exit"] = run.returncode
    # Ended on its own with a failure: not killed, and not the 130 of a SIGINT's cancel
    # (nor -2, a SIGINT that arrived after the tree had ended and the process was exiting).
    record["run_failed"] = run.returncode not in (
        0,
        -signal.SIGKILL,
        -signal.SIGINT,
        128 + signal.SIGINT,
    )
    if record["run_failed"]:
        record["run_error"] = tail(point / "run.err")
    record["sigint_sent"] = sigint_sent

    # 2. On some points, the first resume is killed mid-recovery.
    if plan.kill_resume and db.exists():
        before = log_size(point)
        resume = spawn(
            settings,
            point,
            ["resume", "--script", str(settings.script), "--db", str(db)],
            "resume-killed",
        )
        at = wait_for_work(resume, point, before)
        time.sleep(plan.resume_kill_at * settings.window)
        if kill(resume):
            kills.append(
                {
                    "process": "resume",
                    "after": round(time.monotonic() - at, 3),
                    **kill_phase(db, interrupted=False),
                }
            )

    # 3. Resume until it ends with exit status 0 (a few tries at most).
    resumes: list[int | None] = []
    if db.exists():
        for attempt in range(3):
            name = f"resume-{attempt}"
            code = finish(
                spawn(
                    settings,
                    point,
                    ["resume", "--script", str(settings.script), "--db", str(db)],
                    name,
                ),
                settings.timeout,
            )
            resumes.append(code)
            if code == 0:
                break
            record.setdefault("resume_errors", []).append(tail(point / f"{name}.err"))
    record["resumes"] = resumes
    record["resume_failed"] = bool(resumes) and resumes[-1] != 0

    # 4. The audit: outcomes, replay verification, double executions, survivors.
    try:
        found = audit(db)
    except Exception as exc:  # a log the store cannot read is a finding, not a crash
        found = {
            "root": None,
            "unfinished": [],
            "lost": [],
            "duplicated": [],
            "stray": [],
            "written_off": [],
            "mcp_interrupted": [],
            "audit_error": f"{type(exc).__name__}: {exc}",
        }
    record.update(found)
    record["verify_failed"] = False
    if found.get("root"):
        replay = spawn(
            settings,
            point,
            ["replay", found["root"], "--verify", "--tree", "--db", str(db)],
            "replay",
        )
        code = finish(replay, settings.timeout)
        record["verify_exit"] = code
        if code != 0:
            record["verify_failed"] = True
            record["verify_output"] = tail(point / "replay.out") + tail(point / "replay.err")
    elif "audit_error" in found:
        record["verify_failed"] = True
    record["double_executed"] = double_executions(workdir, crashes=len(kills))
    record["mcp"] = mcp_summary(workdir, found["mcp_interrupted"])
    record["left_running"] = reap_survivors(plan.tag, workdir, settings.grace)
    record["kills"] = kills
    record["seconds"] = round(time.monotonic() - started, 2)
    if not settings.keep and not failed(record):
        shutil.rmtree(point, ignore_errors=True)
    return record


def failed(record: dict[str, Any]) -> bool:
    """Whether the point found anything but leftover processes (its folder is kept)."""
    return bool(
        record["lost"]
        or record["duplicated"]
        or record["verify_failed"]
        or record["double_executed"]
        or record["unfinished"]
        or record["resume_failed"]
        or record["run_failed"]
        or record.get("audit_error")
    )


# ------------------------------------------------------------------ the campaign


def calibrate(settings: Settings) -> tuple[float, list[dict[str, Any]]]:
    """Seconds of work of one uninterrupted run of the script, from its first log
    write until its tree came to rest (the window kill moments are drawn from), and the
    processes it left running (no kill involved)."""
    point = settings.base / "calibration"
    workdir = point / "work"
    workdir.mkdir(parents=True)
    run = spawn(
        settings,
        point,
        [
            "run",
            "k9-calibration",
            "--script",
            str(settings.script),
            "--cwd",
            str(workdir),
            "--db",
            str(point / "db.sqlite"),
            *RUN_OPTIONS,
        ],
        "run",
    )
    wait_for_work(run, point, 0, settings.clock_files, settings.timeout)
    at = time.time()
    code = finish(run, settings.timeout)
    left = reap_survivors("k9-calibration", workdir, settings.grace)
    if code != 0:
        raise SystemExit(f"the calibration run failed (exit {code}): {tail(point / 'run.err')}")
    with reading(point / "db.sqlite") as store:
        (root,) = store.list_roots()
    # Until the root came to rest (its row's last update), not until the process exit:
    # the interpreter's exit takes a few tenths of a second more, and kills there find
    # nothing to recover.
    window = max(root.updated_at - at, 0.1)
    return window, left


def totals(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    phases: Counter[str] = Counter()
    for record in records:
        for k in record["kills"]:
            phases[k["phases"][0]] += 1
    tagged: Counter[str] = Counter(
        tag for record in records for k in record["kills"] for tag in k["phases"]
    )
    return {
        "points": len(records),
        "kills": sum(len(r["kills"]) for r in records),
        "kills_of_resume": sum(1 for r in records for k in r["kills"] if k["process"] == "resume"),
        "sigints": sum(1 for r in records if r["sigint_sent"]),
        "lost": sum(len(r["lost"]) for r in records),
        "duplicated": sum(len(r["duplicated"]) for r in records),
        "verify_failures": sum(1 for r in records if r["verify_failed"]),
        "double_executions": sum(n - 1 for r in records for n in r["double_executed"].values()),
        "processes_left_running": sum(len(r["left_running"]) for r in records),
        "points_with_processes_left": sum(1 for r in records if r["left_running"]),
        "unfinished": sum(1 for r in records if r["unfinished"]),
        "resume_failures": sum(1 for r in records if r["resume_failed"]),
        "run_failures": sum(1 for r in records if r["run_failed"]),
        "no_tree": sum(1 for r in records if r["root"] is None),
        "stray_outcomes": sum(len(r["stray"]) for r in records),
        "written_off": sum(len(r["written_off"]) for r in records),
        "mcp_calls_received": sum(r["mcp"]["received"] for r in records),
        "mcp_resent_idempotent": sum(r["mcp"]["resent"] for r in records),
        "mcp_interrupted": sum(r["mcp"]["interrupted"] for r in records),
        "left_running_by_kind": dict(
            Counter(p["kind"] for r in records for p in r["left_running"]).most_common()
        ),
        "kill_phase": dict(sorted(phases.items(), key=lambda kv: PHASES.index(kv[0]))),
        "kills_seen_in_phase": dict(sorted(tagged.items(), key=lambda kv: PHASES.index(kv[0]))),
    }


def show(report: dict[str, Any]) -> None:
    summary, about = report["totals"], report["campaign"]
    table = Table(title="kill -9 campaign", show_header=True)
    table.add_column("count")
    table.add_column("value", justify="right")
    for key in ("points", "kills", "kills_of_resume", "sigints"):
        table.add_row(key, str(summary[key]))
    for key in GOAL:
        value = summary[key]
        table.add_row(
            f"[bold]{key}[/bold] (goal 0)", f"[{'green' if value == 0 else 'red'}]{value}"
        )
    for key in (
        "points_with_processes_left",
        "unfinished",
        "resume_failures",
        "run_failures",
        "no_tree",
        "stray_outcomes",
        "written_off",
        "mcp_calls_received",
        "mcp_resent_idempotent",
        "mcp_interrupted",
    ):
        table.add_row(key, str(summary[key]))
    kinds = ", ".join(f"{k} {n}" for k, n in summary["left_running_by_kind"].items())
    table.add_row("processes left, by kind", kinds or "-")
    if about["calibration_left_running"] is not None:
        table.add_row("left by the run without kill", str(len(about["calibration_left_running"])))
    table.add_row("wall time", f"{about['wall_time_s']:.1f} s (window {about['window_s']:.2f} s)")
    console.print(table)
    phases = Table(title="kills by phase of the tree", show_header=True)
    phases.add_column("phase")
    phases.add_column("first phase", justify="right")
    phases.add_column("among phases", justify="right")
    for phase in PHASES:
        first = summary["kill_phase"].get(phase, 0)
        seen = summary["kills_seen_in_phase"].get(phase, 0)
        if first or seen:
            phases.add_row(phase, str(first), str(seen))
    console.print(phases)


def campaign(
    args: argparse.Namespace, progress: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    nonce = f"{random.Random(args.seed).randrange(16**6):06x}{os.getpid() % 4096:03x}"
    base = Path(tempfile.mkdtemp(prefix="fanfold-kill9-"))
    env = dict(os.environ)
    env["FANFOLD_KEY_FILE"] = str(base / "fanfold.key")
    env.pop("FANFOLD_DB", None)
    # Hundreds of CLI processes: let them share compiled bytecode (kept in the campaign's
    # folder, not in the source tree) even where the environment turns caching off. A
    # prefix the caller chose is kept (the test suite's, already warm: a fresh one
    # compiles every module the processes import, the libraries' too, once per campaign).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("PYTHONPYCACHEPREFIX", str(base / "pycache"))
    if args.workload == "mcp":
        # The user's configuration file for every run and resume of the campaign: its
        # servers start as they are (no trust record needed, as for a user's own file).
        config = base / "mcp.toml"
        config.write_text(
            MCP_SERVERS.format(
                python=json.dumps(sys.executable), server=json.dumps(str(MCP_SERVER))
            )
        )
        env["FANFOLD_CONFIG"] = str(config)
    script = args.script or WORKLOADS[args.workload]
    clock = ("db.log.jsonl",) if args.workload == "mcp" else LOG_FILES
    settings = Settings(
        base=base,
        script=Path(script).resolve(),
        fanfold=fanfold_command(),
        env=env,
        window=0.0,
        grace=args.grace,
        timeout=args.timeout,
        keep=args.keep,
        clock_files=clock,
    )
    started = time.monotonic()
    calibration: list[dict[str, Any]] | None = None
    if args.window:
        window = args.window
    else:
        window, calibration = calibrate(settings)
    settings = attrs.evolve(settings, window=window)
    plans = [Plan.draw(i, args.seed, nonce) for i in range(args.points)]
    lock = threading.Lock()

    def one(plan: Plan) -> dict[str, Any]:
        record = run_point(settings, plan)
        with lock:
            progress(record)
        return record

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        records = list(pool.map(one, plans))
    wall = time.monotonic() - started
    kept = any(failed(r) for r in records) or args.keep
    if not kept:
        shutil.rmtree(base, ignore_errors=True)
    return {
        "campaign": {
            "points": args.points,
            "seed": args.seed,
            "workload": args.workload,
            "jobs": args.jobs,
            "script": str(settings.script),
            "window_s": round(window, 3),
            # Left running by the uninterrupted calibration run (None: --window given).
            "calibration_left_running": calibration,
            "grace_s": args.grace,
            "folder": str(base) if kept else None,
            "wall_time_s": round(wall, 1),
        },
        "totals": totals(records),
        "points": records,
    }


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--points", type=int, default=200, help="points to run (default 200)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the kill moments")
    parser.add_argument("--jobs", type=int, default=1, help="points run at once")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="bash",
        help="bash: the tree of bash commands (default); mcp: agents calling MCP servers' tools",
    )
    parser.add_argument(
        "--script", default=None, help="scripted provider script (default: the workload's)"
    )
    parser.add_argument(
        "--window",
        type=float,
        default=0.0,
        help="seconds of work of a run (default: measured by one uninterrupted run first)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=1.0,
        help="seconds left processes get to go away after the last resume (default 1)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds a resume or replay may take before it counts as hung (default 120)",
    )
    parser.add_argument("--keep", action="store_true", help="keep every point's folder")
    parser.add_argument("--quiet", action="store_true", help="no line per point")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.points < 1 or args.jobs < 1:
        raise SystemExit("--points and --jobs must be at least 1")

    def progress(record: dict[str, Any]) -> None:
        if args.quiet:
            return
        phases = (
            ",".join(
                k["phases"][0] + ("(resume)" if k["process"] == "resume" else "")
                for k in record["kills"]
            )
            or "no kill"
        )
        flags = [f"{key}={len(record[key])}" for key in ("lost", "duplicated") if record[key]]
        if record["verify_failed"]:
            flags.append("VERIFY FAILED")
        if record["double_executed"]:
            flags.append(f"double={len(record['double_executed'])}")
        if record["left_running"]:
            flags.append(f"left={len(record['left_running'])}")
        if record["unfinished"] or record["resume_failed"]:
            flags.append("UNFINISHED")
        if record["run_failed"]:
            flags.append("RUN FAILED")
        console.print(
            f"point {record['point']:4d}  {record['seconds']:5.1f} s  kill: {phases:28s} "
            + (" ".join(flags) or "ok"),
            highlight=False,
        )

    report = campaign(args, progress)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    show(report)
    if report["campaign"]["folder"]:
        console.print(f"folders of failed points kept in {report['campaign']['folder']}")
    return 0 if all(report["totals"][key] == 0 for key in GOAL) else 1


if __name__ == "__main__":
    sys.exit(main())
