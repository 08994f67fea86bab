"""Issue 25's prototype: how DBOS Transact and fanfold's Trio runtime meet, measured.

Not a feature: nothing in ``fanfold`` imports this. A DBOS workflow (a synchronous
function, run by DBOS in a thread of its executor pool) runs a fanfold Trio runtime
with ``trio.run`` for one tree, through the public API only (``Runtime.open`` with the
scripted provider, the SQLite log: one file per tree in a folder every worker sees).
DBOS's system tables live in a throwaway PostgreSQL cluster (``tests/pg_cluster.py``).

    .venv/bin/python -m bench.dbos_spike [--json out.json] [--quick]

Parts (each prints a table; ``--json`` writes every number):

- ``overhead``: in one worker process, a no-op workflow called directly and through a
  queue, and a one-conversation tree (no latency) run by ``trio.run`` with and without
  a DBOS workflow around it: wall and CPU per call, PostgreSQL write transactions
  (transaction ids consumed) per call.
- ``throughput``: M fan-out trees (a root, C children of 3 rounds at 50 ms) enqueued on
  a DBOS queue shared by 1 and then 2 worker processes: trees per second, CPU per tree
  of the workers and of PostgreSQL.
- ``units``: the two distribution units of the issue on the same fan-outs: a tree per
  workflow (the children run in the tree's own Trio runtime) against a conversation per
  workflow (the parent workflow enqueues one workflow per child on a second queue and
  waits for their results; each child runs as its own one-conversation tree).
- ``recovery``: two workers, one killed with SIGKILL in the middle of its trees; what
  DBOS does with that worker's workflows (nothing, until a process with its executor id
  starts again or someone re-enqueues them), and how long each way takes to finish them.

The worker processes are this module run as ``python -m bench.dbos_spike worker ...``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio
from dbos import DBOS, DBOSClient, DBOSConfig, EnqueueOptions

from bench.workload import fanout_limits, fanout_script
from fanfold.db.provenance import UserKey
from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import Limits
from fanfold.tools.registry import ToolSet

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from pg_cluster import Cluster  # noqa: E402

APP = "fanfold-spike"
VERSION = "spike-1"  # one application version for every worker: recovery is by version
TREES = "trees"
CHILDREN = "children"
OVERHEAD = "overhead"
# How often a waiting result is polled (DBOS's default is a second; queues are polled at
# the workers' --poll, 50 ms by default).
POLL = 0.05

# -- the workflows (registered at import, in every process) -----------------------------


def _conversation_script(latency: float) -> ScriptedProvider:
    """One conversation as its own tree: thinks twice, then answers (a fan-out child's
    three rounds and two tool calls)."""
    think = {"name": "think", "arguments": {"thought": "working"}}
    return ScriptedProvider(
        {
            "latency": latency,
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [
                        {"tool_calls": [think]},
                        {"tool_calls": [think]},
                        {"text": "done"},
                    ],
                }
            ],
        }
    )


async def _run_tree(
    database: Path, children: int, latency: float, note: tuple[str, str] | None = None
) -> dict[str, Any]:
    """Start the tree in ``database``, or resume it if an earlier execution of the same
    workflow started it there (fanfold's log, not DBOS, knows how far it got).
    ``note``: (folder, name) to record this execution under, once it knows which."""
    if children:
        provider, limits = fanout_script(children, child_latency=latency), fanout_limits(children)
    else:
        provider, limits = _conversation_script(latency), Limits()
    async with Runtime.open(
        database, provider, ToolSet.default(), limits=limits, logger=quiet_logger()
    ) as runtime:
        roots = runtime.store.list_roots()
        if note is not None:
            _note_execution(*note, resumed=bool(roots))
        if roots:
            root = roots[0].id
            await runtime.resume([root])
        else:
            root = await runtime.start("fan out" if children else "think", limits=limits)
        result = await runtime.wait(root)
        outcomes = sum(1 for _ in runtime.store.children(root))
    return {"root": root, "text": result.text, "resumed": bool(roots), "children": outcomes}


async def _run_tree_again(database: Path) -> None:
    """A new one-conversation tree in a database that may hold others (the cost of a
    runtime and a tree without that of making a new SQLite file)."""
    provider = _conversation_script(0.0)
    async with Runtime.open(
        database, provider, ToolSet.default(), limits=Limits(), logger=quiet_logger()
    ) as runtime:
        await runtime.wait(await runtime.start("think"))


def _note_execution(folder: str, name: str, *, resumed: bool) -> None:
    """One line per execution of a tree (append-only): which process ran it when, and
    whether the log already held the tree (``resumed``)."""
    line = json.dumps(
        {
            "name": name,
            "executor": DBOS.executor_id,
            "pid": os.getpid(),
            "at": time.time(),
            "resumed": resumed,
        }
    )
    with open(Path(folder) / "executions.jsonl", "a") as out:
        out.write(line + "\n")


@DBOS.step(name="fanfold.run_tree")
def run_tree_step(folder: str, name: str, children: int, latency: float) -> dict[str, Any]:
    """The whole tree as one DBOS step: its own Trio loop in DBOS's worker thread."""
    database = Path(folder) / f"{name}.db"
    return trio.run(_run_tree, database, children, latency, (folder, name))


@DBOS.workflow(name="fanfold.tree")
def tree_workflow(folder: str, name: str, children: int, latency: float) -> dict[str, Any]:
    """A tree per workflow."""
    out = run_tree_step(folder, name, children, latency)
    out["executor"] = DBOS.executor_id
    return out


@DBOS.workflow(name="fanfold.conversation")
def conversation_workflow(folder: str, name: str, latency: float) -> dict[str, Any]:
    """A conversation per workflow: one child, run as a one-conversation tree."""
    out = run_tree_step(folder, name, 0, latency)
    out["executor"] = DBOS.executor_id
    return out


@DBOS.workflow(name="fanfold.parent")
def parent_workflow(folder: str, name: str, children: int, latency: float) -> dict[str, Any]:
    """The parent of a conversation-per-workflow fan-out: enqueue every child on the
    children's queue (durably: the enqueues are steps of this workflow), then collect
    each child's result (durably too: a recovered parent does not enqueue twice)."""
    queue = DBOS.retrieve_queue(CHILDREN)
    assert queue is not None
    handles = [
        queue.enqueue(conversation_workflow, folder, f"{name}.{i}", latency)
        for i in range(children)
    ]
    results = [handle.get_result(polling_interval_sec=POLL) for handle in handles]
    executors = sorted({r["executor"] for r in results})
    return {"children": len(results), "child_executors": executors, "executor": DBOS.executor_id}


CHUNK = 5  # children per chunk workflow (fanfold.chunked)


@DBOS.workflow(name="fanfold.chunked")
def chunked_workflow(folder: str, name: str, children: int, latency: float) -> dict[str, Any]:
    """The middle way: the fan-out's children in chunks of CHUNK, each chunk a subtree
    workflow on the children's queue (here a fan-out tree of CHUNK children of its
    own: the parent conversation's side is not prototyped)."""
    queue = DBOS.retrieve_queue(CHILDREN)
    assert queue is not None
    handles = [
        queue.enqueue(tree_workflow, folder, f"{name}.{i}", min(CHUNK, children - i), latency)
        for i in range(0, children, CHUNK)
    ]
    results = [handle.get_result(polling_interval_sec=POLL) for handle in handles]
    executors = sorted({r["executor"] for r in results})
    return {"children": children, "child_executors": executors, "executor": DBOS.executor_id}


# The other arrangement: one Trio loop and one Runtime per worker process, hosted by a
# thread of its own; a workflow's thread hands its tree to that loop and blocks until
# the tree is at rest. (Throughput only: a re-run would start a second tree, since the
# per-process SQLite file is not where another worker would look.)
_SHARED: dict[str, Any] = {}


def _host_shared_runtime(database: Path, children: int, latency: float) -> None:
    ready = threading.Event()

    async def host() -> None:
        limits = fanout_limits(children)
        async with Runtime.open(
            database,
            fanout_script(children, child_latency=latency),
            ToolSet.default(),
            limits=limits,
            logger=quiet_logger(),
        ) as runtime:
            _SHARED.update(runtime=runtime, token=trio.lowlevel.current_trio_token(), limits=limits)
            ready.set()
            await trio.sleep_forever()

    threading.Thread(target=trio.run, args=(host,), daemon=True, name="fanfold-trio").start()
    ready.wait()


@DBOS.step(name="fanfold.run_tree_shared")
def run_shared_step(folder: str, name: str) -> dict[str, Any]:
    """The tree in the process's one runtime: this thread waits for it."""
    runtime: Runtime = _SHARED["runtime"]
    _note_execution(folder, name, resumed=False)

    async def start_and_wait() -> dict[str, Any]:
        root = await runtime.start("fan out", limits=_SHARED["limits"])
        result = await runtime.wait(root)
        return {"root": root, "text": result.text, "resumed": False}

    out: dict[str, Any] = trio.from_thread.run(start_and_wait, trio_token=_SHARED["token"])
    return out


@DBOS.workflow(name="fanfold.tree_shared")
def tree_shared_workflow(folder: str, name: str, children: int, latency: float) -> dict[str, Any]:
    """A tree per workflow, run in the worker's shared runtime."""
    out = run_shared_step(folder, name)
    out["executor"] = DBOS.executor_id
    return out


@DBOS.workflow(name="fanfold.noop")
def noop_workflow(x: int) -> int:
    """Nothing: the engine's own cost per workflow."""
    return x


# -- worker processes ---------------------------------------------------------------


def worker_main(args: argparse.Namespace) -> None:
    """A worker: DBOS launched with the queues, until its stdin closes (or SIGTERM)."""
    config: DBOSConfig = {
        "name": APP,
        "system_database_url": args.url,
        "executor_id": args.executor,
        "application_version": VERSION,
        "log_level": "WARNING",
        "notification_listener_polling_interval_sec": 0.05,
    }
    DBOS(config=config)
    DBOS.launch()
    # Queues are rows of the system database in DBOS 3: registered once it is up.
    DBOS.register_queue(TREES, worker_concurrency=args.concurrency, polling_interval_sec=args.poll)
    DBOS.register_queue(
        CHILDREN, worker_concurrency=args.child_concurrency, polling_interval_sec=args.poll
    )
    DBOS.register_queue(OVERHEAD, worker_concurrency=1, polling_interval_sec=args.poll)
    if args.shared_children:
        folder = Path(args.folder)
        _host_shared_runtime(folder / f"{args.executor}.db", args.shared_children, args.latency)
    if args.overhead:
        print(json.dumps(overhead(args)), flush=True)
    else:
        print("ready", flush=True)
        sys.stdin.read()
    DBOS.destroy()


def _cpu() -> float:
    return time.process_time()


def _xid(conninfo: str) -> int:
    import psycopg

    with psycopg.connect(conninfo) as connection:
        row = connection.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
        assert row is not None
        return int(row[0])


def _measure(conninfo: str, n: int, call: Any) -> dict[str, float]:
    before_xid = _xid(conninfo)
    wall0, cpu0 = time.perf_counter(), _cpu()
    for i in range(n):
        call(i)
    wall, cpu = time.perf_counter() - wall0, _cpu() - cpu0
    writes = _xid(conninfo) - before_xid - 1  # the second probe's own transaction id
    return {"n": n, "wall_ms": 1000 * wall / n, "cpu_ms": 1000 * cpu / n, "writes": writes / n}


def overhead(args: argparse.Namespace) -> dict[str, Any]:
    """Per-call costs, measured inside a launched worker (see the module docstring)."""
    folder = Path(args.folder)
    n = args.n
    queue = DBOS.retrieve_queue(OVERHEAD)
    assert queue is not None

    def plain_tree(i: int) -> None:
        trio.run(_run_tree, folder / f"plain{i}.db", 0, 0.0)

    def reused_file_tree(i: int) -> None:
        trio.run(_run_tree_again, folder / "reused.db")

    def workflow_tree(i: int) -> None:
        conversation_workflow(str(folder), f"wf{i}", 0.0)

    out: dict[str, Any] = {}
    noop_workflow(-1)  # warm: first call registers and connects
    out["noop workflow, direct call"] = _measure(args.conninfo, n, noop_workflow)
    out["noop workflow, through a queue"] = _measure(
        args.conninfo,
        max(10, n // 10),
        lambda i: queue.enqueue(noop_workflow, i).get_result(polling_interval_sec=POLL),
    )
    plain_tree(-1)
    out["one-conversation tree, trio.run alone"] = _measure(args.conninfo, n // 4, plain_tree)
    trio.run(_run_tree_again, folder / "reused.db")
    out["one-conversation tree, trio.run alone, one file for all"] = _measure(
        args.conninfo, n // 4, reused_file_tree
    )
    out["one-conversation tree, in a DBOS workflow"] = _measure(
        args.conninfo, n // 4, workflow_tree
    )
    return out


# -- the driver ----------------------------------------------------------------------


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a live process, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _server_pids(cluster: Cluster) -> list[int]:
    """The postmaster and its children (the backends, the writer, the WAL writer ...)."""
    top = cluster.postmaster_pid()
    if top is None:
        return []
    pids = [top]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == top:
                pids.append(int(entry.name))
    return pids


def _server_cpu(cluster: Cluster) -> float:
    """CPU of the server's processes now alive (backends that ended are not counted:
    every client here keeps its pool open for the whole measurement)."""
    return sum(_proc_cpu(pid) for pid in _server_pids(cluster))


class Workers:
    """Worker processes of one run, started with their executor ids."""

    def __init__(self, cluster: Cluster, url: str, folder: Path, env: dict[str, str]) -> None:
        self.cluster, self.url, self.folder, self.env = cluster, url, folder, env
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def start(
        self,
        executor: str,
        *,
        concurrency: int = 8,
        child_concurrency: int = 32,
        poll: float = 0.05,
        shared: tuple[int, float] | None = None,
    ) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.dbos_spike", "worker", "--url", self.url,
             "--folder", str(self.folder), "--executor", executor,
             "--concurrency", str(concurrency), "--child-concurrency", str(child_concurrency),
             "--poll", str(poll),
             *(["--shared-children", str(shared[0]), "--latency", str(shared[1])]
               if shared else [])],
            cwd=REPO, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "ready":
            proc.kill()
            raise RuntimeError(f"worker {executor} did not start: {line!r}")
        self.procs[executor] = proc
        return proc

    def cpu(self) -> float:
        return sum(_proc_cpu(p.pid) for p in self.procs.values() if p.poll() is None)

    def kill(self, executor: str) -> None:
        proc = self.procs.pop(executor)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


@contextmanager
def run_folder(root: Path, name: str, cluster: Cluster) -> Iterator[tuple[Path, str]]:
    """A fresh folder for the trees' SQLite files and a fresh DBOS system database."""
    folder = root / name
    folder.mkdir(parents=True)
    yield folder, cluster.url_for(f"spike_{name}")


def _conninfo(cluster: Cluster, url: str) -> str:
    """psycopg's connection string for the database a URL of this cluster names."""
    return cluster.conninfo_for(url.rsplit("/", 1)[1])


def _client(url: str) -> DBOSClient:
    return DBOSClient(system_database_url=url, application_name=APP)


def _enqueue(client: DBOSClient, workflow: str, queue: str, wid: str, *args: Any) -> str:
    options: EnqueueOptions = {
        "workflow_name": workflow,
        "queue_name": queue,
        "workflow_id": wid,
        "app_version": VERSION,
    }
    return client.enqueue(options, *args).get_workflow_id()


def _batch(
    cluster: Cluster,
    workers: Workers,
    client: DBOSClient,
    jobs: Sequence[tuple[str, str, tuple[Any, ...]]],
) -> dict[str, Any]:
    """Enqueue every (workflow, id, args) on the trees queue, wait for all results."""
    cpu_workers0, cpu_server0 = workers.cpu(), _server_cpu(cluster)
    xid0 = _xid(_conninfo(cluster, workers.url))
    wall0 = time.perf_counter()
    ids = [_enqueue(client, workflow, TREES, wid, *args) for workflow, wid, args in jobs]
    results: list[dict[str, Any]] = [
        client.retrieve_workflow(wid).get_result(polling_interval_sec=POLL) for wid in ids
    ]
    wall = time.perf_counter() - wall0
    return {
        "wall_s": wall,
        "results": results,
        "worker_cpu_s": workers.cpu() - cpu_workers0,
        "server_cpu_s": _server_cpu(cluster) - cpu_server0,
        "writes": _xid(_conninfo(cluster, workers.url)) - xid0 - 1,
    }


def part_overhead(cluster: Cluster, root: Path, env: dict[str, str], n: int) -> dict[str, Any]:
    with run_folder(root, "overhead", cluster) as (folder, url):
        done = subprocess.run(
            [sys.executable, "-m", "bench.dbos_spike", "worker", "--overhead", "--url", url,
             "--folder", str(folder), "--executor", "o1", "--conninfo",
             _conninfo(cluster, url), "--n", str(n), "--poll", "0.05"],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            check=False, timeout=900,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"the overhead worker failed:\n{done.stderr[-3000:]}")
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def part_throughput(
    cluster: Cluster, root: Path, env: dict[str, str], trees: int, children: int,
    latency: float, concurrency: int,
) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = {}
    for count, (arrangement, workflow) in itertools.product(
        (1, 2), (("trio.run per workflow", "fanfold.tree"),
                 ("one runtime per worker", "fanfold.tree_shared")),
    ):  # fmt: skip
        shared = (children, latency) if workflow == "fanfold.tree_shared" else None
        tag = "s" if shared else "r"
        with run_folder(root, f"throughput{count}{tag}", cluster) as (folder, url):
            workers = Workers(cluster, url, folder, env)
            try:
                for i in range(count):
                    workers.start(f"w{i + 1}", concurrency=concurrency, shared=shared)
                client = _client(url)
                # Warm: a full round of trees per worker first (imports, pools, the
                # runtime's first gc.freeze).
                _batch(cluster, workers, client, [
                    (workflow, f"warm{i}", (str(folder), f"warm{i}", children, latency))
                    for i in range(count * concurrency)
                ])  # fmt: skip
                got = _batch(cluster, workers, client, [
                    (workflow, f"t{i}", (str(folder), f"t{i}", children, latency))
                    for i in range(trees)
                ])  # fmt: skip
                client.destroy()
            finally:
                workers.stop_all()
        by_executor: dict[str, int] = {}
        for result in got["results"]:
            by_executor[result["executor"]] = by_executor.get(result["executor"], 0) + 1
        assert all(r["text"] == "all done" for r in got["results"]), got["results"][:3]
        out[f"{arrangement}, {count} worker(s)"] = {
            "trees": trees,
            "trees_per_s": trees / got["wall_s"],
            "wall_s": got["wall_s"],
            "worker_cpu_ms_per_tree": 1000 * got["worker_cpu_s"] / trees,
            "server_cpu_ms_per_tree": 1000 * got["server_cpu_s"] / trees,
            "writes_per_tree": got["writes"] / trees,
            "trees_by_executor": by_executor,
        }
    return out


def part_units(
    cluster: Cluster, root: Path, env: dict[str, str], fanouts: int, children: int,
    latency: float,
) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = {}
    for count in (1, 2):
        for unit, workflow in (("tree per workflow", "fanfold.tree"),
                               ("conversation per workflow", "fanfold.parent"),
                               (f"chunk of {CHUNK} children per workflow", "fanfold.chunked"),
                               ):  # fmt: skip
            name = f"units{count}{workflow.rsplit('.', 1)[1]}"
            with run_folder(root, name, cluster) as (folder, url):
                workers = Workers(cluster, url, folder, env)
                try:
                    for i in range(count):
                        workers.start(f"w{i + 1}", concurrency=fanouts, child_concurrency=64)
                    client = _client(url)
                    _batch(cluster, workers, client, [
                        (workflow, f"warm{i}", (str(folder), f"warm{i}", 2, latency))
                        for i in range(count)
                    ])  # fmt: skip
                    got = _batch(cluster, workers, client, [
                        (workflow, f"f{i}", (str(folder), f"f{i}", children, latency))
                        for i in range(fanouts)
                    ])  # fmt: skip
                    client.destroy()
                finally:
                    workers.stop_all()
            spread = sorted(
                {e for r in got["results"] for e in r.get("child_executors", [r["executor"]])}
            )
            n = fanouts * children
            out[f"{unit}, {count} worker(s)"] = {
                "fanouts": fanouts,
                "children": children,
                "wall_s": got["wall_s"],
                "children_per_s": n / got["wall_s"],
                "worker_cpu_ms_per_child": 1000 * got["worker_cpu_s"] / n,
                "server_cpu_ms_per_child": 1000 * got["server_cpu_s"] / n,
                "writes_per_child": got["writes"] / n,
                "children_ran_on": spread,
            }
    return out


def _statuses(client: DBOSClient, prefix: str) -> dict[str, tuple[str, str | None, int]]:
    """workflow id -> (status, executor, recovery attempts) for ids starting with prefix."""
    return {
        s.workflow_id: (s.status, s.executor_id, int(s.recovery_attempts or 0))
        for s in client.list_workflows(workflow_id_prefix=prefix)
    }


def _wait_done(client: DBOSClient, ids: Sequence[str], timeout: float) -> float | None:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        statuses = {s.workflow_id: s.status for s in client.list_workflows(workflow_ids=list(ids))}
        if all(statuses.get(i) == "SUCCESS" for i in ids):
            return time.perf_counter() - start
        time.sleep(0.05)
    return None


def _wait_begun(folder: Path, executor: str, prefix: str, count: int) -> None:
    """Wait until ``executor`` has begun ``count`` trees whose names start with
    ``prefix`` (their executions are noted once their runtime has opened the log)."""
    record = folder / "executions.jsonl"
    deadline = time.perf_counter() + 120
    while time.perf_counter() < deadline:
        lines = record.read_text().splitlines() if record.exists() else []
        begun = {
            r["name"]
            for r in map(json.loads, lines)
            if r["executor"] == executor and r["name"].startswith(prefix)
        }
        if len(begun) >= count:
            return
        time.sleep(0.02)
    raise RuntimeError(f"{executor} began fewer than {count} {prefix}* trees in 120 s")


def _verify_trees(folder: Path, names: Sequence[str], children: int) -> dict[str, Any]:
    """Each tree's log: finished once, every child's outcome accepted once, and
    ``replay.verify`` reproduces every recorded step."""
    from fanfold.db import Store
    from fanfold.replay import verify

    bad: list[str] = []
    for name in names:
        store = Store.open(folder / f"{name}.db", read_only=True)
        try:
            (root,) = store.list_roots()
            report = verify(store, root.id, tree=True)
            kids = store.children(root.id)
            ok = report.ok
            if not ok or len(kids) != children or root.status == "running":
                bad.append(f"{name}: verify={ok} children={len(kids)} status={root.status}")
        finally:
            store.close()
    return {"trees": len(names), "bad": bad}


def part_recovery(
    cluster: Cluster, root: Path, env: dict[str, str], trees: int, children: int,
    latency: float, observe: float,
) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = {}
    with run_folder(root, "recovery", cluster) as (folder, url):
        workers = Workers(cluster, url, folder, env)
        workers.start("w1", concurrency=4)  # the first launch creates the system database
        client = _client(url)
        try:
            workers.start("w2", concurrency=4)
            names = [f"r{i}" for i in range(trees)]
            for name in names:
                _enqueue(client, "fanfold.tree", TREES, name, str(folder), name, children, latency)
            # Kill w1 once it has begun trees and had time to log some of their steps.
            _wait_begun(folder, "w1", "r", 2)
            time.sleep(latency * 1.5)
            mine = sorted(w for w, s in _statuses(client, "r").items()
                          if s[0] == "PENDING" and s[1] == "w1")  # fmt: skip
            killed_at = time.perf_counter()
            workers.kill("w1")
            # What DBOS does on its own: the other worker takes the enqueued trees; w1's
            # stay PENDING on w1.
            others = [n for n in names if n not in mine]
            others_done = _wait_done(client, others, timeout=120)
            time.sleep(observe)
            after = _statuses(client, "r")
            out["sigkill of w1"] = {
                "trees": trees,
                "pending_on_w1_when_killed": len(mine),
                "others_finished_by_w2_after_s": others_done,
                "observed_for_s": (time.perf_counter() - killed_at),
                "still_pending_on_w1": sorted(w for w in mine if after[w][0] == "PENDING"),
            }
            # Way 1, DBOS's own: a process with the dead one's executor id starts.
            restart_at = time.perf_counter()
            workers.start("w1", concurrency=4)
            started = time.perf_counter() - restart_at
            done = _wait_done(client, mine, timeout=120)
            statuses = _statuses(client, "r")
            out["restart with executor id w1"] = {
                "process_start_s": started,
                "finished_after_start_s": done,
                "ran_on": sorted({statuses[w][1] or "" for w in mine}),
                "recovery_attempts": sorted({statuses[w][2] for w in mine}),
            }
            # Way 2, fanfold's to add (DBOS open source has no dead-executor detection
            # without Conductor): another process re-enqueues the dead one's workflows.
            names2 = [f"s{i}" for i in range(trees)]
            for name in names2:
                _enqueue(client, "fanfold.tree", TREES, name, str(folder), name, children, latency)
            _wait_begun(folder, "w2", "s", 2)
            time.sleep(latency * 1.5)
            mine2 = sorted(w for w, s in _statuses(client, "s").items()
                           if s[0] == "PENDING" and s[1] == "w2")  # fmt: skip
            workers.kill("w2")
            for wid in mine2:
                client.resume_workflow(wid)
            done2 = _wait_done(client, names2, timeout=120)
            statuses = _statuses(client, "s")
            out["re-enqueue w2's workflows (client.resume_workflow)"] = {
                "pending_on_w2_when_killed": len(mine2),
                "all_finished_after_s": done2,
                "ran_on": sorted({statuses[w][1] or "" for w in mine2}),
            }
        finally:
            client.destroy()
            workers.stop_all()
        executions: dict[str, list[dict[str, Any]]] = {}
        for line in (folder / "executions.jsonl").read_text().splitlines():
            record = json.loads(line)
            executions.setdefault(record["name"], []).append(record)
        out["executions"] = {
            "trees": len(executions),
            "run_more_than_once": {
                name: [f"{r['executor']}{' (resumed)' if r['resumed'] else ''}" for r in runs]
                for name, runs in sorted(executions.items())
                if len(runs) > 1
            },
        }
        out["logs"] = _verify_trees(folder, names + names2, children)
    return out


def _outcome(client: DBOSClient, wid: str) -> str:
    """A finished workflow's result in a few words, or the error it ended with."""
    try:
        result: dict[str, Any] = client.retrieve_workflow(wid).get_result(polling_interval_sec=POLL)
    except Exception as error:
        leaves: list[BaseException] = [error]
        while isinstance(leaves[0], BaseExceptionGroup):
            leaves = list(leaves[0].exceptions)
        return f"{type(error).__name__} of {type(leaves[0]).__name__}: {str(leaves[0])[:200]}"
    return f"ok on {result.get('executor')}"


def part_frozen(
    cluster: Cluster, root: Path, env: dict[str, str], trees: int, children: int,
    latency: float,
) -> dict[str, Any]:  # fmt: skip
    """A worker frozen (SIGSTOP) while it runs trees; its workflows re-enqueued (as a
    lease that expired would have them) and taken by the other; then it wakes."""
    out: dict[str, Any] = {}
    with run_folder(root, "frozen", cluster) as (folder, url):
        workers = Workers(cluster, url, folder, env)
        w1 = workers.start("w1", concurrency=4)
        client = _client(url)
        try:
            workers.start("w2", concurrency=4)
            names = [f"z{i}" for i in range(trees)]
            for name in names:
                _enqueue(client, "fanfold.tree", TREES, name, str(folder), name, children, latency)
            _wait_begun(folder, "w1", "z", 2)
            time.sleep(latency * 1.5)
            mine = sorted(w for w, s in _statuses(client, "z").items()
                          if s[0] == "PENDING" and s[1] == "w1")  # fmt: skip
            w1.send_signal(signal.SIGSTOP)
            for wid in mine:
                client.resume_workflow(wid)
            deadline = time.perf_counter() + 60
            while time.perf_counter() < deadline:
                statuses = _statuses(client, "z")
                if all(statuses[w][0] not in ("ENQUEUED", "PENDING") for w in mine):
                    break
                time.sleep(0.05)
            out["while w1 is frozen"] = {
                "frozen_with_pending": len(mine),
                "statuses": {w: list(_statuses(client, "z")[w]) for w in mine},
                "outcomes": {w: _outcome(client, w) for w in mine},
            }
            w1.send_signal(signal.SIGCONT)
            _wait_done(client, [n for n in names if n not in mine], timeout=60)
            time.sleep(max(3.0, 8 * latency))  # let the woken worker finish what it had
            out["after w1 wakes"] = {
                "statuses": {w: list(_statuses(client, "z")[w]) for w in mine},
                "outcomes": {w: _outcome(client, w) for w in mine},
            }
        finally:
            w1.send_signal(signal.SIGCONT)  # never leave a stopped process behind
            client.destroy()
            workers.stop_all()
        executions: dict[str, list[str]] = {}
        for line in (folder / "executions.jsonl").read_text().splitlines():
            record = json.loads(line)
            executions.setdefault(record["name"], []).append(
                f"{record['executor']}{' (resumed)' if record['resumed'] else ''}"
            )
        out["executions of the frozen worker's trees"] = {w: executions[w] for w in mine}
        out["logs"] = _verify_trees(folder, names, children)
    return out


def part_pgrestart(
    cluster: Cluster, root: Path, env: dict[str, str], trees: int, children: int,
    latency: float,
) -> dict[str, Any]:  # fmt: skip
    """PostgreSQL restarted (``pg_ctl restart -m fast``: every connection is ended) while
    two workers run trees: what DBOS's connection handling makes of it."""
    out: dict[str, Any] = {}
    with run_folder(root, "pgrestart", cluster) as (folder, url):
        workers = Workers(cluster, url, folder, env)
        workers.start("w1", concurrency=4)
        client = _client(url)
        try:
            workers.start("w2", concurrency=4)
            names = [f"p{i}" for i in range(trees)]
            start = time.perf_counter()
            for name in names:
                _enqueue(client, "fanfold.tree", TREES, name, str(folder), name, children, latency)
            while sum(s[0] == "PENDING" for s in _statuses(client, "p").values()) < 4:
                time.sleep(0.02)
            time.sleep(latency * 1.5)
            pending = sum(s[0] == "PENDING" for s in _statuses(client, "p").values())
            restarted_at = time.perf_counter()
            cluster.restart()
            restart_s = time.perf_counter() - restarted_at
            done = _wait_done(client, names, timeout=180)
            statuses = _statuses(client, "p")
            out["restart while trees run"] = {
                "trees": trees,
                "pending_at_restart": pending,
                "restart_s": restart_s,
                "all_succeeded_after_restart_s": None if done is None else done + restart_s,
                "total_s": time.perf_counter() - start,
                "not_succeeded": {
                    w: [*s, _outcome(client, w)] for w, s in statuses.items() if s[0] != "SUCCESS"
                },
                "workers_alive": sorted(e for e, p in workers.procs.items() if p.poll() is None),
            }
        finally:
            client.destroy()
            workers.stop_all()
        runs: dict[str, int] = {}
        for line in (folder / "executions.jsonl").read_text().splitlines():
            name = json.loads(line)["name"]
            runs[name] = runs.get(name, 0) + 1
        out["executions"] = {"run_more_than_once": {n: c for n, c in runs.items() if c > 1}}
        out["logs"] = _verify_trees(folder, names, children)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dbos_spike")
    sub = parser.add_subparsers(dest="command")
    worker = sub.add_parser("worker")
    worker.add_argument("--url", required=True)
    worker.add_argument("--folder", required=True)
    worker.add_argument("--executor", required=True)
    worker.add_argument("--concurrency", type=int, default=8)
    worker.add_argument("--child-concurrency", type=int, default=32)
    worker.add_argument("--poll", type=float, default=0.05)
    worker.add_argument("--overhead", action="store_true")
    worker.add_argument("--conninfo", default="")
    worker.add_argument("--n", type=int, default=200)
    worker.add_argument("--shared-children", type=int, default=0)
    worker.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--parts", default="overhead,throughput,units,recovery,frozen,pgrestart")
    parser.add_argument("--no-fsync", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "worker":
        worker_main(args)
        return

    import shutil
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix="fanfold-spike-"))
    try:
        _run_parts(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run_parts(args: argparse.Namespace, scratch: Path) -> None:
    env = {**os.environ, "FANFOLD_KEY_FILE": str(scratch / "provenance.key")}
    UserKey.load(scratch / "provenance.key")  # made once, before workers race to make it
    quick = args.quick
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "quick": quick,
                               "load": os.getloadavg(), "fsync": not args.no_fsync}  # fmt: skip
    parts = args.parts.split(",")
    with Cluster.create(fsync=not args.no_fsync) as cluster:
        if "overhead" in parts:
            results["overhead"] = part_overhead(cluster, scratch, env, 40 if quick else 200)
            _print("overhead (per call)", results["overhead"])
        if "throughput" in parts:
            results["throughput"] = part_throughput(
                cluster, scratch, env, trees=16 if quick else 200, children=3, latency=0.05,
                concurrency=8,
            )  # fmt: skip
            _print("throughput: fan-outs of 3 children, 3 rounds of 50 ms", results["throughput"])
        if "units" in parts:
            results["units"] = part_units(
                cluster, scratch, env, fanouts=2 if quick else 4, children=20, latency=0.05
            )
            _print("units: fan-outs of 20 children, 3 rounds of 50 ms", results["units"])
        if "recovery" in parts:
            results["recovery"] = part_recovery(
                cluster, scratch, env, trees=8, children=3, latency=0.5 if not quick else 0.3,
                observe=5.0 if not quick else 1.0,
            )  # fmt: skip
            _print("recovery: SIGKILL of a worker", results["recovery"])
        if "pgrestart" in parts:
            results["pgrestart"] = part_pgrestart(
                cluster, scratch, env, trees=8, children=3, latency=0.5 if not quick else 0.3
            )
            _print("pgrestart: PostgreSQL restarted under two workers", results["pgrestart"])
        if "frozen" in parts:
            results["frozen"] = part_frozen(
                cluster, scratch, env, trees=8, children=3, latency=0.5 if not quick else 0.3
            )
            _print("frozen: SIGSTOP of a worker, its workflows re-enqueued", results["frozen"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


def _print(title: str, part: dict[str, Any]) -> None:
    print(f"\n== {title}")
    for key, value in part.items():
        if isinstance(value, dict):
            shown = ", ".join(f"{k}={_fmt(v)}" for k, v in value.items() if k != "results")
        else:
            shown = _fmt(value)
        print(f"  {key}: {shown}")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


if __name__ == "__main__":
    main()
