"""``fanfold worker``, ``run --detach`` and ``wait`` with real processes (issue 25).

Worker processes share a DBOS queue in the throwaway PostgreSQL cluster
(``pg_cluster``) and fanfold's log in one SQLite file (the PostgreSQL log is another
piece of work). Two workers are started once for the module (a start costs seconds
under load); the tests run in order: trees shared by two workers, a kill -9 of one
in the middle of its trees (the other takes them over when its lease expires), then a
SIGTERM that drains the survivor into a fresh worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_cluster import NOT_INSTALLED, Cluster, alive, find_binaries, wait_gone
from runtime_helpers import reply, spawn, submit, think

pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")
if find_binaries() is None:
    pytest.skip(NOT_INSTALLED, allow_module_level=True)

pytestmark = pytest.mark.slow

CHILDREN = 3
LATENCY = 0.4  # per model call: a tree takes about 2 s, long enough to kill a worker in
# Seconds: a dead worker's trees move after at most this and a third. Short for the
# test, long enough that a worker starved of CPU on a loaded machine keeps it.
LEASE = 2.5


def _script() -> dict[str, Any]:
    return {
        "latency": LATENCY,
        "agents": [
            {
                "match": {"path": "root"},
                "replies": [
                    reply("", spawn(*(f"part {i}" for i in range(CHILDREN)))),
                    reply("all parts: {{last_tool_result}}"),
                ],
            },
            {"match": {"depth": 1}, "replies": [reply("", think()), reply("", submit("ok"))]},
        ],
    }


class Bench:
    """The module's folder, log, queue database and worker processes."""

    def __init__(self, folder: Path, cluster: Cluster, log: str) -> None:
        self.folder = folder
        self.url = cluster.url_for(f"fanfold_workers_{log}")
        # The log in the queue's own database (fanfold's tables beside DBOS's), or in
        # a file every worker of this machine opens.
        self.log = self.url if log == "postgresql" else str(folder / "log.db")
        self.script = folder / "script.json"
        self.script.write_text(json.dumps(_script()))
        self.env = {
            **os.environ,
            "FANFOLD_KEY_FILE": str(folder / "key"),
            "FANFOLD_TRUST_FILE": str(folder / "trust"),
            "FANFOLD_DBOS_DB": self.url,
            "XDG_DATA_HOME": str(folder / "data"),
        }
        self.workers: dict[str, tuple[subprocess.Popen[str], str]] = {}
        self.worker_args: tuple[str, ...] = ()
        """More options for every worker this bench starts."""

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", "from fanfold.cli import main; main()", *args],
            capture_output=True, text=True, env=self.env, cwd=self.folder, timeout=timeout,
        )  # fmt: skip

    def cli_many(self, *calls: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
        """Several CLI calls at once (each pays for its imports: seconds under load)."""
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", "from fanfold.cli import main; main()", *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=self.env,
                cwd=self.folder,
            )
            for args in calls
        ]
        done = []
        for args, proc in zip(calls, procs, strict=True):
            out, err = proc.communicate(timeout=120)
            done.append(subprocess.CompletedProcess(args, proc.returncode, out, err))
        return done

    def enqueue(self, n: int, prefix: str) -> list[str]:
        """Queue ``n`` trees from this process (what ``run --detach`` does, without a
        CLI start per tree: the kill and drain tests need them queued at once)."""
        from fanfold.worker.client import enqueue_tree
        from fanfold.worker.spec import TreeSpec

        return [
            enqueue_tree(self.url, TreeSpec(f"{prefix}{i}", f"task {i}", str(self.folder)))
            for i in range(n)
        ]

    def wait_all(self, ids: list[str], *, cli: int = 1) -> None:
        """``fanfold wait`` for the first ``cli`` trees (at once): each prints its answer,
        exit 0; the others through the same function in this process (a CLI start costs
        seconds under load)."""
        from fanfold.cli.worker_commands import wait_at_rest
        from fanfold.db import DatabaseUrl
        from fanfold.statemachine import Idle

        log = DatabaseUrl(self.log) if self.log.startswith("postgresql") else Path(self.log)
        for tree_id, done in zip(
            ids,
            self.cli_many(*(("wait", t, "--db", self.log, "--timeout", "90") for t in ids[:cli])),
            strict=False,
        ):
            assert done.returncode == 0, (tree_id, done.stderr)
            assert "all parts: " in done.stdout, done.stdout
            assert f"conversation: {tree_id}" in done.stdout + done.stderr
        for tree_id in ids[cli:]:
            state = wait_at_rest(log, tree_id, 90, lambda: None)
            assert isinstance(state.phase, Idle), (tree_id, state.phase)

    def start_workers(self, *names: str) -> None:
        """Start workers at once (each takes seconds to import and launch DBOS under
        load); return once each says it is ready."""
        started = {}
        for name in names:
            with open(self.folder / f"{name}.err", "w") as err:
                started[name] = subprocess.Popen(
                    [sys.executable, "-c", "from fanfold.cli import main; main()", "worker",
                     "--db", self.log, "--script", str(self.script), "--concurrency", "4",
                     "--lease", str(LEASE), "--poll", "0.05", *self.worker_args],
                    stdout=subprocess.PIPE, stderr=err, text=True, env=self.env,
                    cwd=self.folder,
                )  # fmt: skip
        for name, proc in started.items():
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if " ready " not in line:
                for other in started.values():
                    other.kill()
                    other.wait()
                raise AssertionError(f"{name}: {line!r} {self.err(name)}")
            self.workers[name] = (proc, line.split()[1])

    def err(self, name: str) -> str:
        """What worker ``name`` printed on stderr."""
        return (self.folder / f"{name}.err").read_text()

    def stop_all(self) -> None:
        for proc, _ in self.workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.workers.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def bench(pg_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    """Two workers on a PostgreSQL log, the queue in the same database."""
    bench = Bench(tmp_path_factory.mktemp("workers"), pg_cluster, "postgresql")
    try:
        bench.start_workers("w1", "w2")
        yield bench
    finally:
        bench.stop_all()


def _running_on(bench: Bench, executor: str, ids: list[str]) -> list[str]:
    """The trees among ``ids`` whose workflow DBOS has PENDING on ``executor``."""
    import psycopg

    with psycopg.connect(bench.url) as conn:
        rows = conn.execute(
            "SELECT workflow_uuid FROM dbos.workflow_status "
            "WHERE status = 'PENDING' AND executor_id = %s AND workflow_uuid = ANY(%s)",
            (executor, ids),
        ).fetchall()
    return sorted(r[0] for r in rows)


def _check_logs(bench: Bench, ids: list[str]) -> None:
    """Each tree: finished, every child's outcome accepted by the root once, and the
    log replays identically (``fanfold replay --verify --tree``)."""
    from fanfold.db import open_store
    from fanfold.statemachine.events import SubAgentFinished

    with open_store(bench.log, read_only=True) as store:
        for tree_id in ids:
            root = store.conversation(tree_id)
            assert root.status != "running", tree_id
            kids = store.children(tree_id)
            assert len(kids) == CHILDREN, (tree_id, kids)
            accepted = [
                e.event.child_id
                for e in store.events(tree_id)
                if isinstance(e.event, SubAgentFinished)
            ]
            assert sorted(accepted) == sorted(k.id for k in kids), (tree_id, accepted)
    # The CLI's verify on one tree (the others through the same function, in-process).
    from fanfold.replay import verify

    with open_store(bench.log, read_only=True) as store:
        for tree_id in ids[1:]:
            assert verify(store, tree_id, tree=True).ok, tree_id
    done = bench.cli("replay", ids[0], "--verify", "--tree", "--db", bench.log)
    assert done.returncode == 0, done.stdout + done.stderr


def test_two_workers_run_detached_trees_and_wait_prints_each_outcome(bench: Bench) -> None:
    detached = bench.cli_many(*(("run", "--detach", f"tree {i}") for i in range(2)))
    assert all(d.returncode == 0 for d in detached), [d.stderr for d in detached]
    ids = [d.stdout.strip() for d in detached]
    assert len(set(ids)) == 2 and all(len(i) == 12 for i in ids), ids
    bench.wait_all(ids, cli=len(ids))
    _check_logs(bench, ids)


def _wait_taken(bench: Bench, executor: str, ids: list[str]) -> list[str]:
    deadline = time.monotonic() + 60
    while not _running_on(bench, executor, ids):
        assert time.monotonic() < deadline, f"{executor} took none of the trees"
        time.sleep(0.05)
    time.sleep(LATENCY * 1.5)  # let it log some of their steps
    taken = _running_on(bench, executor, ids)
    assert taken
    return taken


def test_a_killed_workers_trees_are_finished_by_the_other(bench: Bench) -> None:
    ids = bench.enqueue(6, "kill-")
    proc, executor = bench.workers["w1"]
    taken = _wait_taken(bench, executor, ids)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    bench.wait_all(ids)
    _check_logs(bench, ids)
    # The survivor took them over and resumed them from the log (not from the start).
    w2_err = bench.err("w2")
    assert f"of worker {executor}" in w2_err, w2_err
    assert all(f"resumed tree {t}" in w2_err for t in taken), w2_err


def _running(bench: Bench, ids: list[str]) -> dict[str, int]:
    """The trees among ``ids`` still running in the log, each with its root's step count."""
    from fanfold.db import UnknownConversation, open_store

    running = {}
    with open_store(bench.log, read_only=True) as store:
        for t in ids:
            with contextlib.suppress(UnknownConversation):  # still queued
                if store.conversation(t).status == "running":
                    running[t] = len(store.events(t))
    return running


def _a_worker_with_trees(bench: Bench, ids: list[str]) -> str:
    """A live worker that has taken some of ``ids`` (which one DBOS decides)."""
    deadline = time.monotonic() + 60
    while True:
        for name in _live(bench):
            if _running_on(bench, bench.workers[name][1], ids):
                return name
        assert time.monotonic() < deadline, "no worker took the trees"
        time.sleep(0.05)


def test_sigterm_drains_a_worker_and_another_resumes_its_trees(bench: Bench) -> None:
    ids = bench.enqueue(3, "drain-")
    proc, executor = bench.workers[_a_worker_with_trees(bench, ids)]
    _wait_taken(bench, executor, ids)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    # Drained: it left its trees unfinished in the log, for another worker.
    left = _running(bench, ids)
    assert left
    bench.start_workers("w3", "w4")
    bench.wait_all(ids)
    _check_logs(bench, ids)
    took = "".join(bench.err(name) for name in bench.workers)
    assert f"of worker {executor}" in took, took
    assert all(f"resumed tree {t}" in took for t in left), took


def test_a_postgresql_restart_loses_no_tree(bench: Bench, pg_cluster: Cluster) -> None:
    ids = bench.enqueue(4, "restart-")
    deadline = time.monotonic() + 60
    while not _running(bench, ids):
        assert time.monotonic() < deadline, "no tree began"
        time.sleep(0.05)
    live = _live(bench)
    pg_cluster.restart()  # every session ended: DBOS's, the log's, the leases', the locks'
    bench.wait_all(ids)
    _check_logs(bench, ids)
    # No worker stopped: a commit in flight when the server went is asked back and
    # written again only if it did not land (``PostgresStore._write``).
    for name in live:
        assert bench.workers[name][0].poll() is None, bench.err(name)
    assert len(live) >= 2


def test_postgresql_down_longer_than_the_lease_pushes_no_worker_out(
    bench: Bench, pg_cluster: Cluster
) -> None:
    # Issue 32 item 10: the server away for longer than the workers' leases (a slow
    # restart). Nobody could renew meanwhile, so when it came back every lease had run
    # out, and the first worker to look claimed the others': a healthy worker pushed out
    # (exit 3), its trees taken over. Now each gets a lease from the server's return.
    ids = bench.enqueue(2, "down-")
    deadline = time.monotonic() + 60
    while not _running(bench, ids):
        assert time.monotonic() < deadline, "no tree began"
        time.sleep(0.05)
    live = _live(bench)
    said = {name: len(bench.err(name)) for name in live}
    pg_cluster.stop()
    time.sleep(LEASE + 1.0)
    pg_cluster.start()
    bench.wait_all(ids)
    _check_logs(bench, ids)
    for name in live:
        assert bench.workers[name][0].poll() is None, bench.err(name)
    since = "".join(bench.err(name)[said[name] :] for name in live)
    assert not any(f"of worker {bench.workers[name][1]}" in since for name in live), since
    assert "lease renewal failed" in since, since


def _live(bench: Bench) -> list[str]:
    return [name for name, (proc, _) in bench.workers.items() if proc.poll() is None]


def test_a_frozen_worker_is_fenced_and_its_trees_finish_once(bench: Bench) -> None:
    ids = bench.enqueue(6, "frozen-")
    frozen_name = _a_worker_with_trees(bench, ids)
    others = [name for name in _live(bench) if name != frozen_name]
    assert others

    def others_err() -> str:
        return "".join(bench.err(name) for name in others)

    proc, executor = bench.workers[frozen_name]
    taken = _wait_taken(bench, executor, ids)
    proc.send_signal(signal.SIGSTOP)
    try:
        frozen = {t: n for t, n in _running(bench, ids).items() if t in taken}
        assert frozen
        # Another worker claims the frozen one's lease and re-enqueues its trees...
        deadline = time.monotonic() + 60
        while f"of worker {executor}" not in others_err():
            assert time.monotonic() < deadline, others_err()
            time.sleep(0.1)
        time.sleep(LEASE)
        # ... but cannot resume them while the frozen process still holds the log: not
        # one step of theirs was written by anyone meanwhile.
        assert {t: n for t, n in _running(bench, ids).items() if t in frozen} == frozen
    finally:
        proc.send_signal(signal.SIGCONT)
    # Woken, it finds its lease taken, stops (exit 3), and another resumes its trees.
    assert proc.wait(timeout=60) == 3
    assert "lease was taken over" in bench.err(frozen_name)
    bench.wait_all(ids)
    _check_logs(bench, ids)
    assert all(f"resumed tree {t}" in others_err() for t in frozen), others_err()
    bench.stop_all()
    for name, (worker, _) in bench.workers.items():
        assert wait_gone(worker.pid), name
        assert not alive(worker.pid)


def test_on_a_log_file_two_workers_share_trees_and_one_survives_a_kill(
    pg_cluster: Cluster, tmp_path: Path
) -> None:
    # The log in a SQLite file the workers of one machine share, the queue in
    # PostgreSQL (--dbos-db): the same takeover, fenced by the same tree locks.
    bench = Bench(tmp_path, pg_cluster, "sqlite")
    try:
        bench.start_workers("w1", "w2")
        ids = bench.enqueue(6, "file-")
        proc, executor = bench.workers["w1"]
        taken = _wait_taken(bench, executor, ids)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        bench.wait_all(ids)
        _check_logs(bench, ids)
        assert all(f"resumed tree {t}" in bench.err("w2") for t in taken), bench.err("w2")
    finally:
        bench.stop_all()
    for name, (worker, _) in bench.workers.items():
        assert not alive(worker.pid), name
