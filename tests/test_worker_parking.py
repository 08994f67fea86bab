"""Issue 35 on workers, with real ``fanfold worker`` processes (``--concurrency 1``) on
a PostgreSQL log and queue: a detached tree waiting only for a person lets its worker
go (the worker runs another tree meanwhile), and the decision written later takes it
back to completion; ``run --detach --ask`` carries its rules to the worker, and the
tree's approval timeout still fires while no worker holds it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_cluster import NOT_INSTALLED, Cluster, find_binaries

pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")
if find_binaries() is None:
    pytest.skip(NOT_INSTALLED, allow_module_level=True)

import psycopg

from fanfold.cli.approvals import open_requests
from fanfold.cli.worker_commands import wait_at_rest
from fanfold.db import DatabaseUrl
from fanfold.runtime.approvals import Decision, PendingRequest, PgDecisions
from fanfold.statemachine import Conversation, Idle, ToolResultMessage

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-c", "from fanfold.cli import main; main()"]

TOOLS = '''
import fanfold


@fanfold.tool(needs_approval=True)
def deploy(service: str) -> str:
    """Deploy a service.

    Args:
        service: the service's name.
    """
    return f"deployed {service}"


TOOLS = [deploy]
'''

SCRIPT = {
    "latency": 0.01,
    "agents": [
        {
            "match": {"task": "*deploy*"},
            "replies": [
                {"tool_calls": [{"name": "deploy", "arguments": {"service": "api"}}]},
                {"text": "deploy done"},
            ],
        },
        {
            "match": {"task": "*push*"},
            "replies": [
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo x >> ran.txt"}}]},
                {"text": "push done"},
            ],
        },
        {"match": {"task": "*"}, "replies": [{"text": "hello back"}]},
    ],
}


class Bench:
    """One worker holding at most one tree at a time, its folder, log and queue."""

    def __init__(self, folder: Path, url: str) -> None:
        self.folder, self.url = folder, url
        (folder / "mytools.py").write_text(TOOLS)
        (folder / "script.json").write_text(json.dumps(SCRIPT))
        self.env = {
            **os.environ,
            "FANFOLD_KEY_FILE": str(folder / "key"),
            "FANFOLD_TRUST_FILE": str(folder / "trust"),
            "XDG_DATA_HOME": str(folder / "data"),
        }
        self.err = folder / "worker.err"
        self.worker = self.start_worker(self.err)

    def start_worker(self, err_file: Path) -> subprocess.Popen[str]:
        """A ``fanfold worker`` with one slot on this bench's log and queue, ready."""
        with open(err_file, "w") as err:
            worker = subprocess.Popen(
                [*CLI, "worker", "--db", self.url, "--script", "script.json",
                 "--concurrency", "1", "--poll", "0.05",
                 "--tools", str(self.folder / "mytools.py") + ":TOOLS"],
                stdout=subprocess.PIPE, stderr=err, text=True, env=self.env, cwd=self.folder,
            )  # fmt: skip
        assert worker.stdout is not None
        line = worker.stdout.readline()
        assert " ready " in line, (line, err_file.read_text())
        return worker

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args], capture_output=True, text=True, env=self.env, cwd=self.folder,
            timeout=120,
        )  # fmt: skip

    def until(self, what: Callable[[], Any], timeout: float = 60) -> Any:
        end = time.monotonic() + timeout
        while not (found := what()):
            if time.monotonic() > end or self.worker.poll() is not None:
                raise AssertionError(f"not in {timeout} s; worker: {self.err.read_text()[-3000:]}")
            time.sleep(0.1)
        return found

    def requests(self, tree: str) -> list[PendingRequest]:
        return [r for r, _ in open_requests(DatabaseUrl(self.url)) if r.tree == tree]

    def at_rest(self, tree: str, timeout: float = 60) -> Conversation:
        return wait_at_rest(DatabaseUrl(self.url), tree, timeout, lambda: None)

    def workflow(self, workflow_id: str) -> tuple[str, Any] | None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT status, output FROM dbos.workflow_status WHERE workflow_uuid = %s",
                (workflow_id,),
            ).fetchone()
        return None if row is None else (row[0], row[1])

    def waiting_trees(self) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(
                "SELECT root_id, generation, requests, due_at FROM fanfold.waiting_trees"
            ).fetchall()

    def close(self) -> None:
        if self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait()


@pytest.fixture(scope="module")
def bench(pg_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    name = "fanfold_parking"
    with psycopg.connect(pg_cluster.conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    bench = Bench(tmp_path_factory.mktemp("parking"), pg_cluster.url_for(name))
    try:
        yield bench
    finally:
        bench.close()


def _results(state: Conversation) -> list[str]:
    history = state.history
    return [m.result.content.split("\n")[0] for m in history if isinstance(m, ToolResultMessage)]


def test_a_tree_waiting_for_a_person_frees_its_worker_and_the_decision_finishes_it(
    bench: Bench,
) -> None:
    from fanfold.worker.client import enqueue_tree
    from fanfold.worker.spec import TreeSpec

    folder = str(bench.folder)
    enqueue_tree(bench.url, TreeSpec("deploy1", "deploy the api", folder))
    (request,) = bench.until(lambda: bench.requests("deploy1"))
    assert request.tool == "deploy"
    # Its worker's one slot is free: another tree runs to the end meanwhile (on main
    # the waiting tree's step held it, and this one never started).
    enqueue_tree(bench.url, TreeSpec("hello1", "say hello", folder))
    other = bench.at_rest("hello1", 60)
    assert isinstance(other.phase, Idle)
    # The waiting tree's workflow ended (its step let the tree go) and the queue's
    # database says what it waits for.
    status, _ = bench.until(lambda: bench.workflow("deploy1"))
    assert status == "SUCCESS"
    ((root, generation, requests, due_at),) = bench.waiting_trees()
    assert (root, generation, requests, due_at) == ("deploy1", 1, [request.id], None)
    # `fanfold wait` says what the tree waits for, rather than waiting in silence.
    waited = bench.cli("wait", "deploy1", "--db", bench.url, "--timeout", "2")
    assert waited.returncode != 0
    assert "deploy1 waits for a person: 1 open request(s)" in " ".join(waited.stderr.split())
    # The decision, written as `fanfold approve --db postgresql://...` would from
    # anywhere, takes it back on a worker, which runs the edited call once.
    table = PgDecisions(bench.url)
    try:
        table.write(Decision(request.id, "grant", '{"service":"web"}', "", "test", time.time()))
    finally:
        table.close()
    state = bench.at_rest("deploy1", 60)
    assert isinstance(state.phase, Idle)
    assert _results(state) == ["deployed web"]
    assert bench.waiting_trees() == []
    woken = bench.workflow(f"wake:deploy1:{generation}")
    assert woken is not None and woken[0] == "SUCCESS"


def test_run_detach_ask_carries_the_rules_and_the_approval_timeout_fires_unheld(
    bench: Bench,
) -> None:
    done = bench.cli(
        "run", "--detach", "push the branch", "--ask", "Bash(echo x:*)",
        "--approval-timeout", "2", "--db", bench.url, "--cwd", str(bench.folder),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    tree = done.stdout.strip()
    (request,) = bench.until(lambda: bench.requests(tree))
    assert request.tool == "bash"
    assert request.rule == "the ask rule 'bash(echo x*)' of the run's ask rules"
    # Nobody decides: the approval timeout denies it, though no worker held the tree
    # while it waited (its workflow ended; it was taken back when due).
    state = bench.at_rest(tree, 60)
    assert isinstance(state.phase, Idle)
    assert _results(state) == ["denied by the user: no decision within 2.0s (approval_timeout)"]
    assert not (bench.folder / "ran.txt").exists()
    status, _ = bench.until(lambda: bench.workflow(tree))
    assert status == "SUCCESS"
    assert bench.workflow(f"wake:{tree}:1") is not None


def test_a_tree_on_two_workers_is_approved_from_a_third_process(bench: Bench) -> None:
    """The issue's case: two workers serve the queue, a detached tree asks, and
    `fanfold approve --db postgresql://...` in a process of its own decides; whichever
    worker takes the tree back runs the call once."""
    from fanfold.worker.client import enqueue_tree
    from fanfold.worker.spec import TreeSpec

    second = bench.start_worker(bench.folder / "worker2.err")
    try:
        enqueue_tree(bench.url, TreeSpec("deploy2", "deploy the api", str(bench.folder)))
        (request,) = bench.until(lambda: bench.requests("deploy2"))
        done = bench.cli("approve", request.id, "--db", bench.url)
        assert done.returncode == 0, done.stdout + done.stderr
        state = bench.at_rest("deploy2", 60)
        assert isinstance(state.phase, Idle)
        assert _results(state) == ["deployed api"]
        assert bench.requests("deploy2") == []
    finally:
        second.send_signal(signal.SIGTERM)
        try:
            second.wait(timeout=60)
        except subprocess.TimeoutExpired:
            second.kill()
            second.wait()
