"""What a writer of the workers' queue can make a worker do (issue 32, item 13).

Whoever can write to DBOS's system database chooses a queued tree's input. One real
worker (its log a SQLite file, its queue in the throwaway PostgreSQL cluster) is
given inputs a queue writer could write: a pickled input that would create a proof
file when unpickled, folders outside the worker's (relative, missing, with a NUL), a
root id naming another workflow's tree or a tree run outside the queue. Each is
refused with its reason and runs nothing; a tree in an allowed folder runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_cluster import NOT_INSTALLED, Cluster, find_binaries

pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")
if find_binaries() is None:
    pytest.skip(NOT_INSTALLED, allow_module_level=True)

SCRIPT = {"latency": 0.01, "agents": [{"match": {"path": "root"}, "replies": [{"text": "done"}]}]}


class Worker:
    """One worker process on a log file, its queue in PostgreSQL."""

    def __init__(self, folder: Path, cluster: Cluster) -> None:
        self.folder = folder
        self.home = folder / "home"  # the worker's own folder: the default --allow-cwd
        (self.home / "sub").mkdir(parents=True)
        self.url = cluster.url_for("fanfold_queue_writer")
        self.log = folder / "log.db"
        self.script = folder / "script.json"
        self.script.write_text(json.dumps(SCRIPT))
        self.env = {
            **os.environ,
            "FANFOLD_KEY_FILE": str(folder / "key"),
            "FANFOLD_TRUST_FILE": str(folder / "trust"),
            "XDG_DATA_HOME": str(folder / "data"),
        }
        self.err = folder / "worker.err"
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "from fanfold.cli import main; main()", "worker",
                 "--db", str(self.log), "--dbos-db", self.url, "--script", str(self.script),
                 "--poll", "0.05"],
                stdout=subprocess.PIPE, stderr=err, text=True, env=self.env, cwd=self.home,
            )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if " ready " not in line:
            self.stop()
            raise AssertionError(f"{line!r} {self.err.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def enqueue(self, workflow_id: str, data: Any, *, pickled: bool = False) -> None:
        """Put ``data`` on the trees' queue as workflow ``workflow_id``, as any writer
        of the system database can: in DBOS's portable JSON, or pickled (DBOS's
        default serializer)."""
        from dbos import DBOSClient, DBOSPortableJSONSerializer, EnqueueOptions

        from fanfold.worker.spec import APP_NAME, APP_VERSION, QUEUE, WORKFLOW

        if pickled:
            client = DBOSClient(system_database_url=self.url, application_name=APP_NAME)
        else:
            client = DBOSClient(
                system_database_url=self.url,
                application_name=APP_NAME,
                serializer=DBOSPortableJSONSerializer(),
            )
        try:
            options: EnqueueOptions = {
                "workflow_name": WORKFLOW,
                "queue_name": QUEUE,
                "workflow_id": workflow_id,
                "app_version": APP_VERSION,
            }
            client.enqueue(options, data)
        finally:
            client.destroy()

    def ended(self, workflow_id: str) -> tuple[str, str | None]:
        """The workflow's status and output (JSON text), once it has ended."""
        import psycopg

        deadline = time.monotonic() + 60
        while True:
            with psycopg.connect(self.url) as conn:
                row = conn.execute(
                    "SELECT s.status, o.output FROM dbos.workflow_status s LEFT JOIN "
                    "dbos.workflow_output o USING (workflow_uuid) WHERE s.workflow_uuid = %s",
                    (workflow_id,),
                ).fetchone()
            if (row is not None and row[0] == "ERROR") or (row is not None and row[1] is not None):
                return row[0], row[1]
            assert time.monotonic() < deadline, (workflow_id, row, self.err.read_text())
            time.sleep(0.05)

    def roots(self) -> set[str]:
        from fanfold.db import Store

        if not self.log.exists():
            return set()
        with Store.open(self.log) as store:
            return {row.id for row in store.list_roots()}


@pytest.fixture(scope="module")
def worker(pg_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    started = Worker(tmp_path_factory.mktemp("queue-writer"), pg_cluster)
    try:
        yield started
    finally:
        started.stop()


def _spec(root_id: str, cwd: str) -> dict[str, Any]:
    from fanfold.worker.spec import TreeSpec

    return TreeSpec(root_id, "a task", cwd).to_input()


class _Proof:
    """Unpickled, it creates the file ``path`` (any code could run instead)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def test_a_pickled_input_is_refused_never_unpickled(worker: Worker) -> None:
    proof = worker.folder / "proof"
    worker.enqueue("pickled1", _Proof(proof), pickled=True)
    status, _ = worker.ended("pickled1")
    assert not proof.exists(), "the worker unpickled the queue writer's input"
    assert status == "ERROR"
    assert "pickled1" not in worker.roots()
    assert worker.proc.poll() is None  # the worker goes on


@pytest.mark.parametrize(
    ("workflow_id", "cwd", "reason"),
    [
        ("outside1", "/", "outside the folders this worker runs trees in"),
        ("relative1", "sub", "an absolute path"),
        ("missing1", "/nonexistent/folder", "is not a folder on this worker"),
        ("nul1", "/tmp\0/x", "NUL"),
    ],
)
def test_a_tree_outside_the_allowed_folders_is_refused(
    worker: Worker, workflow_id: str, cwd: str, reason: str
) -> None:
    worker.enqueue(workflow_id, _spec(workflow_id, cwd))
    status, output = worker.ended(workflow_id)
    assert status == "SUCCESS"
    assert output is not None and reason in json.loads(output)["error"], output
    assert workflow_id not in worker.roots()  # nothing started, nothing in the log


def test_a_tree_inside_runs_and_no_other_workflow_may_take_it_over(worker: Worker) -> None:
    inside = str(worker.home / "sub")
    worker.enqueue("good1", _spec("good1", inside))
    status, output = worker.ended("good1")
    assert (status, json.loads(output or "{}").get("phase")) == ("SUCCESS", "Idle"), output
    assert "good1" in worker.roots()
    # Another workflow naming that tree: it would resume (take over) it.
    worker.enqueue("evil1", _spec("good1", inside))
    status, output = worker.ended("evil1")
    assert status == "SUCCESS" and "is not the workflow's id" in (output or ""), output
    # A tree run outside the queue, then a workflow of its id.
    done = subprocess.run(
        [sys.executable, "-c", "from fanfold.cli import main; main()", "run", "--db",
         str(worker.log), "--script", str(worker.script), "--no-live", "local"],
        capture_output=True, text=True, env=worker.env, cwd=worker.home, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (local,) = worker.roots() - {"good1"}
    worker.enqueue(local, _spec(local, inside))
    status, output = worker.ended(local)
    assert status == "SUCCESS" and "the log holds" in (output or ""), output
    assert '"resumed": true' not in (output or "")
