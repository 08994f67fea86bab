"""Issue 25's benchmark: trees per second and CPU per step with 1, 2 and 4 workers.

Not a feature: nothing in ``fanfold`` imports this. ``python -m bench.bench_workers``
starts a throwaway PostgreSQL cluster (``tests/pg_cluster.py``, fsync on unless
``--no-fsync``) and, for each model latency L and worker count N (and each repeat, the
points interleaved so that the machine's changing load spreads over all of them):

- a fresh database of the cluster, fanfold's log and DBOS's queue in it (one URL, the
  common case);
- N ``fanfold worker`` processes (``--script`` with latency L, ``--concurrency C``,
  ``--poll P``); the URL, which holds the cluster's password, reaches them through
  ``$FANFOLD_DB``, never their command line;
- once every worker has said it is ready: a warm-up of N x C trees (outside the
  window: a worker's first trees pay for what it loads lazily), then ``--idle`` seconds
  of the idle workers measured (CPU per second of the workers and of PostgreSQL: DBOS's
  polls and the lease renewals, a cost that grows with wall time, not with steps);
- T trees enqueued from this process through
  one ``DBOSClient`` with the options ``fanfold run --detach`` uses
  (``fanfold.worker.client.enqueue_tree`` makes a client per call: a CLI start or a
  client per tree would put the driver's own cost into PostgreSQL's numbers);
- waits until every root is at rest by reading fanfold's log (what ``fanfold wait``
  reads), every 0.2 s, then stops the workers (SIGTERM).

Each tree is a scripted fan-out: the root spawns ``--children`` children (no latency;
in ``spawn_agents`` calls of at most 10 tasks, the reducer's default
``max_tasks_per_call``, all in one reply: one step), each child does ``--rounds``
model rounds of L seconds (``think`` calls, then ``submit_result``), the root
answers. ``--all-at-once`` sets the trees' ``max_concurrent`` to ``--children`` (the
reducer's default is 10: the rest of a fan-out queues), the big fan-out that
placement spreads over workers (``fanfold/runtime/placement.py``).

Placement: ``--spread-at``, ``--chunk-size`` and ``--chunk-concurrency`` go to every
worker of a point; each takes a comma list, and the lists (one value repeated)
name the variants measured side by side, e.g. ``--spread-at 100000,32,32
--chunk-size 16,16,64`` is placement off, chunks of 16 and chunks of 64. A point
reports how its children were spread: the chunks (``dbos.workflow_status`` rows of
the ``fanfold.chunk`` workflow) by the worker that ran them (``executor_id``), and
the share of the children run by their tree's own worker (an unplaced child runs
there; a placed one where its chunk ran). Measured over the window from the first enqueue
to the last root at rest: wall time, trees per second, CPU seconds of the workers
(utime+stime of each worker process and its reaped children, ``/proc``) and of
PostgreSQL (the postmaster's process tree: the live backends and what the postmaster
reaped of the ended ones), steps (the T trees' rows of fanfold's ``events``), write
transactions (transaction ids assigned: ``pg_snapshot_xmax`` of a snapshot, which
assigns none) and commits (``pg_stat_database.xact_commit`` of the point's database,
reads included; PostgreSQL 15's statistics reach that view up to a second late, so
this one is approximate), and the load average.

Beside them, the same trees on SQLite in one process (``backend sqlite``): a child
process of this one runs a single ``Runtime`` over a new SQLite file (its JSON log
beside it, as ``fanfold run``), warms up with C trees, then starts the T trees with at
most C at a time (what one worker holds; a new one as soon as one ends), and in a
second point all T at once (what one process does without a queue); its process CPU
is the worker CPU there, and there is no PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from pg_cluster import Cluster  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")
WAIT_POLL = 0.2


@attrs.frozen
class Settings:
    """One benchmark's sizes (``trees`` per latency)."""

    workers: tuple[int, ...] = (1, 2, 4)
    latencies: tuple[float, ...] = (0.05, 2.0)
    trees: tuple[int, ...] = (48, 32)
    children: int = 8
    rounds: int = 3
    concurrency: int = 8
    poll: float = 0.05
    repeats: int = 2
    idle: float = 2.0
    warm: bool = True
    sqlite: bool = True
    timeout: float = 300.0
    all_at_once: bool = False
    """The trees' ``max_concurrent`` is ``children`` (else the reducer's default)."""
    warm_per_worker: int | None = None
    """Warm-up trees per worker (None: ``concurrency``)."""
    placements: tuple[Placing, ...] = ()
    """Placement variants measured side by side (none: the workers' defaults)."""


@attrs.frozen
class Placing:
    """The placement options a point's workers get (None: the worker's default)."""

    spread_at: int | None = None
    chunk_size: int | None = None
    chunk_concurrency: int | None = None

    def argv(self) -> list[str]:
        """The worker's options for it."""
        out: list[str] = []
        for flag, value in (
            ("--spread-at", self.spread_at),
            ("--chunk-size", self.chunk_size),
            ("--chunk-concurrency", self.chunk_concurrency),
        ):
            if value is not None:
                out += [flag, str(value)]
        return out

    def label(self) -> str:
        """Short name in a table: ``spread/chunk/chunk-concurrency``, ``-`` a default."""
        return "/".join(
            "-" if v is None else str(v)
            for v in (self.spread_at, self.chunk_size, self.chunk_concurrency)
        )


def script(latency: float, children: int, rounds: int) -> dict[str, Any]:
    """The scripted fan-out every worker (and the SQLite run) answers with."""
    think = {"name": "think", "arguments": {"thought": "working"}}
    submit = {"name": "submit_result", "arguments": {"result": "done"}}
    # Calls of at most 10 tasks (the reducer's default ``max_tasks_per_call``, which a
    # detached tree cannot change), all in one reply: every spawn is in one step.
    spawns = [
        {
            "name": "spawn_agents",
            "arguments": {
                "tasks": [{"task": f"part {i}"} for i in range(start, min(start + 10, children))]
            },
        }
        for start in range(0, children, 10)
    ]
    child = [{"tool_calls": [think]} for _ in range(rounds - 1)] + [{"tool_calls": [submit]}]
    return {
        "latency": latency,
        "agents": [
            {
                "match": {"path": "root"},
                "replies": [
                    {"latency": 0, "tool_calls": spawns},
                    {"latency": 0, "text": "all done"},
                ],
            },
            {"match": {"depth": 1}, "replies": child},
        ],
    }


# -- CPU from /proc ------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, utime+stime+cutime+cstime in seconds) of ``pid``; None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name (which may hold spaces and parentheses).
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is the state (field 3 of proc(5)); utime is field 14.
    ppid = int(fields[1])
    ticks = sum(int(f) for f in fields[11:15])
    return ppid, ticks / _TICK


def tree_cpu(roots: Sequence[int]) -> float:
    """CPU seconds of the processes ``roots`` and all their live descendants, each with
    what it reaped of its ended children (a backend that ended inside the window is
    in the postmaster's cutime+cstime, one still running in its own)."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _stat(int(entry))
            if found is not None:
                stats[int(entry)] = found
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo, seen = 0.0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        total += stats[pid][1]
        todo.extend(children.get(pid, ()))
    return total


# -- one PostgreSQL point ------------------------------------------------------------


class Workers:
    """N ``fanfold worker`` processes on one database."""

    def __init__(
        self,
        folder: Path,
        url: str,
        script_file: Path,
        settings: Settings,
        placing: Placing | None = None,
    ) -> None:
        self.folder = folder
        self.env = {
            **os.environ,
            # The password travels in the environment, never on a command line (which
            # every local user can read in /proc).
            "FANFOLD_DB": url,
            "FANFOLD_KEY_FILE": str(folder / "key"),
            "FANFOLD_TRUST_FILE": str(folder / "trust"),
            "XDG_DATA_HOME": str(folder / "data"),
        }
        self.env.pop("FANFOLD_DBOS_DB", None)
        self.script_file = script_file
        self.settings = settings
        self.placing = placing or Placing()
        self.procs: list[subprocess.Popen[str]] = []
        self.argv: list[str] = []

    def start(self, n: int) -> None:
        """Start ``n`` workers at once; return when each has printed its ready line."""
        argv = [
            sys.executable, "-c", "from fanfold.cli import main; main()", "worker",
            "--script", str(self.script_file), "--concurrency", str(self.settings.concurrency),
            "--poll", str(self.settings.poll), *self.placing.argv(),
        ]  # fmt: skip
        self.argv = argv
        for i in range(n):
            with open(self.folder / f"w{i}.err", "w") as err:
                self.procs.append(
                    subprocess.Popen(
                        argv,
                        stdout=subprocess.PIPE,
                        stderr=err,
                        text=True,
                        env=self.env,
                        cwd=self.folder,
                    )
                )
        for i, proc in enumerate(self.procs):
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if " ready " not in line:
                raise RuntimeError(
                    f"worker {i} did not start: {line!r}\n"
                    + (self.folder / f"w{i}.err").read_text()[-2000:]
                )

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> list[int | None]:
        """SIGTERM (a drain), then their exit codes; a worker still there after 60 s is
        killed."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=60))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes.append(None)
        return codes


def _enqueue(url: str, roots: list[str], cwd: str, limits: dict[str, int] | None = None) -> None:
    """What ``run --detach`` does for each tree, through one client."""
    from dbos import DBOSClient, EnqueueOptions

    from fanfold.worker.serialization import SERIALIZER
    from fanfold.worker.spec import APP_NAME, APP_VERSION, QUEUE, WORKFLOW, TreeSpec

    # JSON, as run --detach writes: a worker refuses a pickled input.
    client = DBOSClient(system_database_url=url, application_name=APP_NAME, serializer=SERIALIZER)
    try:
        for root in roots:
            options: EnqueueOptions = {
                "workflow_name": WORKFLOW,
                "queue_name": QUEUE,
                "workflow_id": root,
                "app_version": APP_VERSION,
            }
            spec = TreeSpec(root, f"tree {root}", cwd, limits=tuple(sorted((limits or {}).items())))
            client.enqueue(options, spec.to_input())
    finally:
        client.destroy()


def _counters(conn: Any, database: str) -> tuple[int, int]:
    """(next transaction id, xact_commit of ``database``)."""
    xid = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()[0]
    commits = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,)
    ).fetchone()[0]
    return int(xid), int(commits)


def postgres_point(
    cluster: Cluster,
    settings: Settings,
    n: int,
    latency: float,
    trees: int,
    tag: str,
    placing: Placing | None = None,
) -> dict[str, Any]:
    """One point: ``n`` workers, ``trees`` trees at ``latency``; the measured numbers."""
    placing = placing or Placing()
    limits = {"max_concurrent": settings.children} if settings.all_at_once else {}
    import psycopg

    database = f"bench_{tag}"
    with psycopg.connect(cluster.url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    url = cluster.url_for(database)
    with tempfile.TemporaryDirectory(prefix="fanfold-bench-workers-") as tmp:
        folder = Path(tmp)
        script_file = folder / "script.json"
        script_file.write_text(json.dumps(script(latency, settings.children, settings.rounds)))
        workers = Workers(folder, url, script_file, settings, placing)
        try:
            workers.start(n)
            roots = [f"{tag}t{i}" for i in range(trees)]
            with psycopg.connect(url, autocommit=True) as conn:
                postmaster = cluster.postmaster_pid()
                assert postmaster is not None
                if settings.warm:
                    # A full load of trees first (C per worker), outside the window: a
                    # worker's first trees pay for what it loads lazily, which a short
                    # point would count N times.
                    per_worker = settings.warm_per_worker or settings.concurrency
                    warm = [f"{tag}w{i}" for i in range(n * per_worker)]
                    _enqueue(url, warm, str(folder), limits)
                    _wait_at_rest(conn, warm, workers, settings.timeout, f"{tag} warm-up")
                # What the idle workers cost (DBOS's queue polls, lease renewals) and
                # PostgreSQL with them, per second: a part of every point's CPU that
                # grows with its wall time, not with its steps.
                idle_w0, idle_pg0 = tree_cpu(workers.pids()), tree_cpu([postmaster])
                idle_t0 = time.monotonic()
                time.sleep(settings.idle)
                idle_s = time.monotonic() - idle_t0
                idle_w = (tree_cpu(workers.pids()) - idle_w0) / idle_s
                idle_pg = (tree_cpu([postmaster]) - idle_pg0) / idle_s
                load_before = os.getloadavg()[0]
                xid0, commits0 = _counters(conn, database)
                rows0 = _table_rows(conn)
                wcpu0, pgcpu0 = tree_cpu(workers.pids()), tree_cpu([postmaster])
                t0 = time.monotonic()
                _enqueue(url, roots, str(folder), limits)
                statuses = _wait_at_rest(conn, roots, workers, settings.timeout, tag)
                wall = time.monotonic() - t0
                wcpu1, pgcpu1 = tree_cpu(workers.pids()), tree_cpu([postmaster])
                xid1, commits1 = _counters(conn, database)
                load_after = os.getloadavg()[0]
                steps = _one(
                    conn,
                    "SELECT count(*) FROM fanfold.events e JOIN fanfold.conversations c "
                    "ON c.id = e.conversation_id WHERE c.root_id = ANY(%s)",
                    (roots,),
                )
                ran_on = _one(
                    conn,
                    "SELECT count(DISTINCT executor_id) FROM dbos.workflow_status "
                    "WHERE workflow_uuid = ANY(%s)",
                    (roots,),
                )
                spread = _spread(conn, roots)
        finally:
            codes = workers.stop()
            # DBOS doubles a queue's polling interval each time a poll meets another
            # worker's claim (a serialization error), and says so on stderr.
            contention = sum(
                (folder / f"w{i}.err").read_text(errors="replace").count("Contention detected")
                for i in range(len(workers.procs))
            )
    # Rows written per table over the window (inserts + updates + deletes, from the
    # statistics, read once the workers have stopped: a backend flushes its counts
    # when it ends). The drain after the window adds little: nothing runs then.
    with psycopg.connect(url, autocommit=True) as conn:
        time.sleep(0.5)
        rows1 = _table_rows(conn)
    table_rows = {t: rows1[t] - rows0.get(t, 0) for t in rows1 if rows1[t] != rows0.get(t, 0)}
    with psycopg.connect(cluster.url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
    return {
        "backend": "postgresql",
        "workers": n,
        "at_once": n * settings.concurrency,
        "latency": latency,
        "trees": trees,
        "wall": wall,
        "trees_per_s": trees / wall,
        "worker_cpu": wcpu1 - wcpu0,
        "children": trees * settings.children,
        "children_per_s": trees * settings.children / wall,
        "placing": attrs.asdict(placing),
        **spread,
        "table_rows": table_rows,
        "pg_cpu": pgcpu1 - pgcpu0,
        "idle_worker_cpu_per_s": idle_w,
        "idle_pg_cpu_per_s": idle_pg,
        "steps": int(steps),
        "write_xacts": xid1 - xid0,  # the enqueues included: run --detach writes them
        "commits": commits1 - commits0,
        "statuses": sorted(set(statuses.values())),
        "ran_on_workers": int(ran_on),
        "contention_warnings": contention,
        "worker_exit_codes": codes,
        "worker_argv": [workers.argv for _ in workers.procs],
        "load": [round(load_before, 2), round(load_after, 2)],
    }


def _wait_at_rest(
    conn: Any, roots: list[str], workers: Workers, timeout: float, what: str
) -> dict[str, str]:
    """Read fanfold's log every ``WAIT_POLL`` seconds until every root is in it and none
    is running (what ``fanfold wait`` reads); their statuses then."""
    start = time.monotonic()
    while True:
        statuses: dict[str, str] = {}
        if _has_log(conn):
            rows = conn.execute(
                "SELECT id, status FROM fanfold.conversations WHERE id = ANY(%s)", (roots,)
            ).fetchall()
            statuses = {r[0]: r[1] for r in rows}
        if len(statuses) == len(roots) and "running" not in statuses.values():
            return statuses
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"{what}: not every tree at rest: {statuses}")
        if any(p.poll() is not None for p in workers.procs):
            raise RuntimeError(f"{what}: a worker ended during the run")
        time.sleep(WAIT_POLL)


def _spread(conn: Any, roots: list[str]) -> dict[str, Any]:
    """How the children of ``roots`` were spread over the workers: chunks per worker
    (DBOS's ``executor_id`` of each chunk's workflow), children placed, the share run
    by their tree's own worker, and the outcomes each root received."""
    children = _one(
        conn,
        "SELECT count(*) FROM fanfold.conversations WHERE root_id = ANY(%s) "
        "AND parent_id IS NOT NULL",
        (roots,),
    )
    has_placements = _one(conn, "SELECT to_regclass('fanfold.placements') IS NOT NULL")
    by_worker: dict[str, int] = {}
    placed = elsewhere = 0
    if has_placements:
        rows = conn.execute(
            "SELECT w.executor_id, count(DISTINCT p.chunk_id), count(*), "
            "count(*) FILTER (WHERE w.executor_id IS DISTINCT FROM t.executor_id) "
            "FROM fanfold.placements p "
            "LEFT JOIN dbos.workflow_status w ON w.workflow_uuid = p.chunk_id "
            "LEFT JOIN dbos.workflow_status t ON t.workflow_uuid = p.root_id "
            "WHERE p.root_id = ANY(%s) GROUP BY w.executor_id",
            (roots,),
        ).fetchall()
        for executor, chunks, kids, away in rows:
            by_worker[str(executor)] = int(chunks)
            placed += int(kids)
            elsewhere += int(away)
    # Each root's outcomes from its children (its SubAgentFinished events): one per
    # child, never none, never two.
    delivered = _one(
        conn,
        "SELECT count(*) FROM fanfold.events WHERE conversation_id = ANY(%s) "
        "AND type = 'SubAgentFinished'",
        (roots,),
    )
    # Where a fan-out's wall time goes (the steps' times in the log, per tree): from
    # the root's spawning step (its first ModelReplied) to its first child's first
    # step, the children's span, and from the last child's last step to the root's.
    timing = conn.execute(
        "WITH r AS (SELECT conversation_id AS id, "
        "min(at) FILTER (WHERE type = 'ModelReplied') AS spawn, max(at) AS done "
        "FROM fanfold.events WHERE conversation_id = ANY(%s) GROUP BY 1), "
        "k AS (SELECT c.root_id AS id, min(e.at) AS first, max(e.at) AS last "
        "FROM fanfold.conversations c JOIN fanfold.events e ON e.conversation_id = c.id "
        "WHERE c.root_id = ANY(%s) AND c.parent_id IS NOT NULL GROUP BY 1) "
        "SELECT k.first - r.spawn, k.last - k.first, r.done - k.last FROM r JOIN k USING (id)",
        (roots, roots),
    ).fetchall()
    return {
        "children_run": int(children),
        "children_placed": placed,
        "own_worker_share": (int(children) - elsewhere) / max(int(children), 1),
        "chunks_by_worker": sorted(by_worker.values(), reverse=True),
        "outcomes_delivered": int(delivered),
        # Medians over the trees, seconds.
        "spawn_to_first_child": _median([t[0] for t in timing]),
        "children_span": _median([t[1] for t in timing]),
        "last_child_to_root": _median([t[2] for t in timing]),
    }


def _table_rows(conn: Any) -> dict[str, int]:
    """Rows inserted, updated and deleted so far in each table (the statistics)."""
    rows = conn.execute(
        "SELECT schemaname || '.' || relname, n_tup_ins + n_tup_upd + n_tup_del "
        "FROM pg_stat_user_tables"
    ).fetchall()
    return {str(name): int(count) for name, count in rows}


def _median(values: list[Any]) -> float | None:
    return float(statistics.median(values)) if values else None


def _one(conn: Any, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """The first column of the first row of ``sql``."""
    return conn.execute(sql, params).fetchone()[0]


def _has_log(conn: Any) -> bool:
    """Whether fanfold's tables exist yet (the first worker creates them)."""
    row = conn.execute("SELECT to_regclass('fanfold.conversations') IS NOT NULL").fetchone()
    return bool(row[0])


# -- the SQLite point (in a child process) -------------------------------------------


def sqlite_run(
    latency: float,
    trees: int,
    children: int,
    rounds: int,
    at_once: int,
    warm: bool = True,
    all_at_once: bool = False,
) -> dict[str, Any]:
    """The same trees in this process: one ``Runtime`` over a new SQLite file, at most
    ``at_once`` trees running, a new one started as soon as one ends."""
    import sqlite3

    import trio

    from fanfold.providers.scripted import ScriptedProvider
    from fanfold.runtime import Runtime
    from fanfold.statemachine import Limits
    from fanfold.tools.registry import ToolSet

    limits = Limits(max_concurrent=children) if all_at_once else None

    measured: dict[str, float] = {}

    async def main(path: Path) -> None:
        provider = ScriptedProvider(script(latency, children, rounds))
        async with Runtime.open(path, provider, ToolSet.default()) as runtime:

            async def batch(prefix: str, count: int) -> None:
                slots = trio.Semaphore(at_once)

                async def one(i: int) -> None:
                    async with slots:
                        root = await runtime.start(
                            f"tree {i}", conversation_id=f"{prefix}{i}", limits=limits
                        )
                        await runtime.wait(root)

                async with trio.open_nursery() as nursery:
                    for i in range(count):
                        nursery.start_soon(one, i)

            if warm:
                # As the workers are: one full load of trees first, outside the window.
                await batch("w", at_once)
            measured["load"] = os.getloadavg()[0]
            cpu0, t0 = time.process_time(), time.monotonic()
            await batch("t", trees)
            measured["wall"] = time.monotonic() - t0
            measured["cpu"] = time.process_time() - cpu0

    with tempfile.TemporaryDirectory(prefix="fanfold-bench-sqlite-") as tmp:
        path = Path(tmp) / "log.db"
        # The JSON log beside the file, as ``fanfold run`` (and a worker) writes it.
        from fanfold.cli.logs import open_logs

        open_logs(path, None)
        trio.run(main, path)
        wall, cpu, load_before = measured["wall"], measured["cpu"], measured["load"]
        load_after = os.getloadavg()[0]
        with sqlite3.connect(path) as conn:
            steps = conn.execute(
                "SELECT count(*) FROM events e JOIN conversations c "
                "ON c.id = e.conversation_id WHERE c.root_id LIKE 't%'"
            ).fetchone()[0]
            statuses = [r[0] for r in conn.execute(
                "SELECT DISTINCT status FROM conversations "
                "WHERE parent_id IS NULL AND id LIKE 't%'")]  # fmt: skip
    return {
        "backend": "sqlite",
        "workers": 1,
        "at_once": at_once,
        "latency": latency,
        "trees": trees,
        "wall": wall,
        "trees_per_s": trees / wall,
        "children": trees * children,
        "children_per_s": trees * children / wall,
        "worker_cpu": cpu,
        "pg_cpu": 0.0,
        "idle_worker_cpu_per_s": 0.0,
        "idle_pg_cpu_per_s": 0.0,
        "steps": int(steps),
        "write_xacts": None,
        "commits": None,
        "statuses": sorted(statuses),
        "ran_on_workers": 1,
        "contention_warnings": 0,
        "worker_exit_codes": [0],
        "load": [round(load_before, 2), round(load_after, 2)],
    }


def sqlite_point(settings: Settings, latency: float, trees: int, at_once: int) -> dict[str, Any]:
    """``sqlite_run`` in a fresh process (nothing of DBOS or psycopg loaded in it)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_workers", "--sqlite-child",
         json.dumps([latency, trees, settings.children, settings.rounds, at_once, settings.warm,
                     settings.all_at_once])],
        cwd=REPO, capture_output=True, text=True, timeout=settings.timeout, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the SQLite run failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- the whole benchmark -------------------------------------------------------------


def measure(cluster: Cluster, settings: Settings, say: Any = print) -> list[dict[str, Any]]:
    """Every point, repeats interleaved; each result has ``repeat``."""
    results: list[dict[str, Any]] = []
    for repeat in range(settings.repeats):
        for latency, trees in zip(settings.latencies, settings.trees, strict=True):
            # SQLite: C trees at once (what one worker holds), then all T at once (what
            # one process can do without a queue).
            points: list[tuple[str, int]] = []
            if settings.sqlite:
                points += [("sqlite", settings.concurrency), ("sqlite", trees)]
            # Each worker count with each placement variant in turn (the variants of one
            # worker count side by side).
            variants = settings.placements or (Placing(),)
            points += [("postgresql", n) for n in settings.workers]
            for backend, n in points:
                for v, placing in enumerate(variants if backend == "postgresql" else (None,)):
                    tag = f"r{repeat}l{int(latency * 1000)}n{n}"
                    if backend == "sqlite":
                        result = sqlite_point(settings, latency, trees, n)
                    else:
                        tag += f"p{v}" if settings.placements else ""
                        result = postgres_point(cluster, settings, n, latency, trees, tag, placing)
                    result["repeat"] = repeat
                    results.append(result)
                    say(placement_row(result) if settings.placements else row(result))
    return results


def per_step(result: dict[str, Any]) -> tuple[float, float]:
    """(worker, PostgreSQL) CPU milliseconds per step."""
    steps = max(result["steps"], 1)
    return 1000 * result["worker_cpu"] / steps, 1000 * result["pg_cpu"] / steps


def busy_per_step(result: dict[str, Any]) -> float:
    """Worker + PostgreSQL CPU milliseconds per step, less what the same processes
    spent idle for as long (the idle rate measured before the point, times its wall)."""
    idle = (result["idle_worker_cpu_per_s"] + result["idle_pg_cpu_per_s"]) * result["wall"]
    busy = float(result["worker_cpu"] + result["pg_cpu"] - idle)
    return 1000 * busy / max(int(result["steps"]), 1)


HEADER = (
    "| backend | workers | at once | L | trees | wall s | trees/s | worker CPU s | PG CPU s "
    "| steps | worker ms/step | PG ms/step | idle CPU s/s | busy ms/step | write xacts/tree "
    "| commits/tree | load |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def row(r: dict[str, Any]) -> str:
    """One markdown table row."""
    w, p = per_step(r)
    xacts = "-" if r["write_xacts"] is None else f"{r['write_xacts'] / r['trees']:.1f}"
    commits = "-" if r["commits"] is None else f"{r['commits'] / r['trees']:.1f}"
    return (
        f"| {r['backend']} | {r['workers']} | {r['at_once']} | {r['latency']:g} | {r['trees']} "
        f"| {r['wall']:.2f} | {r['trees_per_s']:.2f} | {r['worker_cpu']:.2f} "
        f"| {r['pg_cpu']:.2f} | {r['steps']} | {w:.2f} | {p:.2f} "
        f"| {r['idle_worker_cpu_per_s'] + r['idle_pg_cpu_per_s']:.3f} | {busy_per_step(r):.2f} "
        f"| {xacts} | {commits} "
        f"| {r['load'][0]:.1f}-{r['load'][1]:.1f} |"
    )


def summary(results: list[dict[str, Any]]) -> str:
    """Per latency: median trees/s and CPU per step of each backend and worker count,
    as ratios to one PostgreSQL worker."""
    lines = [
        "| L | backend, workers, trees at once | median trees/s | x 1 worker "
        "| median CPU ms/step (worker + PG) | median busy ms/step |",
        "|---|---|---|---|---|---|",
    ]
    for latency in sorted({r["latency"] for r in results}):
        here = [r for r in results if r["latency"] == latency]
        keys = sorted(
            {(r["backend"], r["workers"], r["at_once"]) for r in here},
            key=lambda k: (k[0] != "sqlite", k[1], k[2]),
        )
        base = [
            r["trees_per_s"] for r in here if r["backend"] == "postgresql" and r["workers"] == 1
        ]
        base_tps = statistics.median(base) if base else None
        for backend, n, at_once in keys:
            mine = [
                r
                for r in here
                if (r["backend"], r["workers"], r["at_once"]) == (backend, n, at_once)
            ]
            tps = statistics.median(r["trees_per_s"] for r in mine)
            cpu = statistics.median(sum(per_step(r)) for r in mine)
            busy = statistics.median(busy_per_step(r) for r in mine)
            ratio = f"{tps / base_tps:.2f}" if base_tps else "-"
            lines.append(
                f"| {latency:g} | {backend}, {n}, {at_once} | {tps:.2f} | {ratio} "
                f"| {cpu:.2f} | {busy:.2f} |"
            )
    return "\n".join(lines)


PLACEMENT_HEADER = (
    "| spread/chunk/chunk conc. | workers | L | trees x children | wall s | trees/s "
    "| children/s | worker ms/step | PG ms/step | busy ms/step | write xacts/tree "
    "| chunks by worker | own worker's share | outcomes/children | first child, children, "
    "fan-in s | load |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def placement_row(r: dict[str, Any]) -> str:
    """One markdown table row of a placement point (a PostgreSQL one)."""
    if r["backend"] != "postgresql":
        return row(r)
    w, p = per_step(r)
    label = Placing(**r["placing"]).label()
    return (
        f"| {label} | {r['workers']} | {r['latency']:g} "
        f"| {r['trees']} x {r['children'] // max(r['trees'], 1)} | {r['wall']:.2f} "
        f"| {r['trees_per_s']:.2f} | {r['children_per_s']:.1f} | {w:.2f} | {p:.2f} "
        f"| {busy_per_step(r):.2f} | {r['write_xacts'] / r['trees']:.1f} "
        f"| {' '.join(str(c) for c in r['chunks_by_worker']) or '-'} "
        f"| {r['own_worker_share']:.2f} | {r['outcomes_delivered']}/{r['children_run']} "
        f"| {_seconds(r['spawn_to_first_child'])}, {_seconds(r['children_span'])}, "
        f"{_seconds(r['last_child_to_root'])} | {r['load'][0]:.1f}-{r['load'][1]:.1f} |"
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def placement_summary(results: list[dict[str, Any]]) -> str:
    """Per latency and worker count: each placement variant's medians, its wall time
    as a ratio to the first variant's (placement off, when listed first)."""
    lines = [
        "| L | workers | spread/chunk/chunk conc. | median wall s | x first variant "
        "| median children/s | median CPU ms/step (worker + PG) | median write xacts/tree "
        "| median own worker's share |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    pg = [r for r in results if r["backend"] == "postgresql"]
    for latency in sorted({r["latency"] for r in pg}):
        for n in sorted({r["workers"] for r in pg}):
            here = [r for r in pg if r["latency"] == latency and r["workers"] == n]
            labels: list[str] = []
            for r in here:
                label = Placing(**r["placing"]).label()
                if label not in labels:
                    labels.append(label)
            first: float | None = None
            for label in labels:
                mine = [r for r in here if Placing(**r["placing"]).label() == label]
                wall = statistics.median(r["wall"] for r in mine)
                first = wall if first is None else first
                cps = statistics.median(r["children_per_s"] for r in mine)
                cpu = statistics.median(sum(per_step(r)) for r in mine)
                xacts = statistics.median(r["write_xacts"] / r["trees"] for r in mine)
                own = statistics.median(r["own_worker_share"] for r in mine)
                lines.append(
                    f"| {latency:g} | {n} | {label} | {wall:.2f} | {wall / first:.2f} "
                    f"| {cps:.1f} | {cpu:.2f} | {xacts:.1f} | {own:.2f} |"
                )
    return "\n".join(lines)


def _ints(text: str | None) -> list[int | None]:
    """A comma list of integers (``None``: not given)."""
    return [None] if text is None else [int(x) for x in text.split(",")]


def placings(spread_at: str | None, chunk: str | None, conc: str | None) -> tuple[Placing, ...]:
    """The placement variants of the three comma lists (a one-value list repeats);
    none when no list is given."""
    if spread_at is None and chunk is None and conc is None:
        return ()
    lists = [_ints(spread_at), _ints(chunk), _ints(conc)]
    count = max(len(x) for x in lists)
    if any(len(x) not in (1, count) for x in lists):
        raise SystemExit("--spread-at, --chunk-size, --chunk-concurrency: lists of one length")
    return tuple(Placing(*(x[i] if len(x) > 1 else x[0] for x in lists)) for i in range(count))


@contextmanager
def cluster_for(fsync: bool) -> Iterator[Cluster]:
    """A throwaway cluster for the whole benchmark."""
    cluster = Cluster.create(fsync=fsync)
    try:
        yield cluster
    finally:
        cluster.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m bench.bench_workers [--quick] [--json FILE] ...``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4", help="worker counts (default 1,2,4)")
    parser.add_argument("--latency", default="0.05,2", help="model latencies, seconds")
    parser.add_argument("--trees", default="48,32", help="trees per latency (default 48,32)")
    parser.add_argument("--children", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="model rounds per child")
    parser.add_argument("--concurrency", type=int, default=8, help="trees per worker at once")
    parser.add_argument("--poll", type=float, default=0.05, help="the workers' --poll")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--idle", type=float, default=2.0, help="seconds of idle workers measured")
    parser.add_argument("--no-sqlite", action="store_true", help="skip the SQLite points")
    parser.add_argument("--no-warm", action="store_true", help="no warm-up trees")
    parser.add_argument("--no-fsync", action="store_true", help="the cluster without fsync")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument(
        "--spread-at", default=None, help="the workers' --spread-at (a comma list: variants)"
    )
    parser.add_argument(
        "--chunk-size", default=None, help="the workers' --chunk-size (a comma list: variants)"
    )
    parser.add_argument(
        "--chunk-concurrency",
        default=None,
        help="the workers' --chunk-concurrency (a comma list: variants)",
    )
    parser.add_argument(
        "--all-at-once",
        action="store_true",
        help="the trees' max_concurrent is --children (a big fan-out, all children at once)",
    )
    parser.add_argument(
        "--warm-per-worker",
        type=int,
        default=None,
        help="warm-up trees per worker (default: --concurrency)",
    )
    parser.add_argument("--sqlite-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sqlite_child is not None:
        latency, trees, children, rounds, at_once, warm, all_at_once = json.loads(args.sqlite_child)
        print(json.dumps(sqlite_run(latency, trees, children, rounds, at_once, warm, all_at_once)))
        return 0
    settings = Settings(
        workers=tuple(int(x) for x in args.workers.split(",")),
        latencies=tuple(float(x) for x in args.latency.split(",")),
        trees=tuple(int(x) for x in args.trees.split(",")),
        children=args.children,
        rounds=args.rounds,
        concurrency=args.concurrency,
        poll=args.poll,
        repeats=args.repeats,
        idle=args.idle,
        warm=not args.no_warm,
        sqlite=not args.no_sqlite,
        all_at_once=args.all_at_once,
        warm_per_worker=args.warm_per_worker,
        placements=placings(args.spread_at, args.chunk_size, args.chunk_concurrency),
    )
    # SIGTERM (and SIGINT, which a shell's background job ignores) end the run through
    # its finally blocks: the workers stopped, the cluster removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"load average {os.getloadavg()}, {os.cpu_count()} cores, fsync {not args.no_fsync}")
    print(PLACEMENT_HEADER if settings.placements else HEADER)
    with cluster_for(not args.no_fsync) as cluster:
        results = measure(cluster, settings)
    print()
    print(summary(results))
    if settings.placements:
        print()
        print(placement_summary(results))
    if args.json is not None:
        args.json.write_text(
            json.dumps({"settings": attrs.asdict(settings), "results": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
