"""A ``fanfold worker`` whose tree was taken over drops that tree and keeps running
its others (issue 25; DESIGN.md, "Workers ... leases", "A tree taken over").

One real worker process on the ``pg_cluster`` (log and queue in one database,
``--concurrency 2``), started once for the module. In each test the test process
claims one of the worker's two trees in the log while their children wait for their
model (as another runtime's ``resume`` does): the worker's next commit of that tree
is refused and it drops it, and its other tree finishes there. What DBOS then records
of the dropped tree's workflow depends on who owns the workflow: the claimant outside
DBOS (the first test), or another execution of the workflow (the second).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from pg_cluster import NOT_INSTALLED, Cluster, find_binaries
from runtime_helpers import reply, spawn, submit, think

pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")
if find_binaries() is None:
    pytest.skip(NOT_INSTALLED, allow_module_level=True)

pytestmark = pytest.mark.slow

SCRIPT: dict[str, Any] = {
    "latency": 0.05,
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [reply("", spawn("a", "b")), reply("parts: {{last_tool_result}}")],
        },
        # The children's first reply comes 2 s after they start: the claim lands before.
        {
            "match": {"depth": 1},
            "replies": [reply("", think(), latency=2.0), reply("", submit("ok"))],
        },
    ],
}


def _until(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@attrs.define
class Worker:
    url: str
    folder: Path
    proc: subprocess.Popen[str]
    err: Path

    def said(self) -> str:
        return self.err.read_text()


@pytest.fixture(scope="module")
def worker(pg_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    """A worker holding at most two trees, its log and queue in a database of its own,
    its key file in the module's folder."""
    import psycopg

    folder = tmp_path_factory.mktemp("dropped")
    name = f"dropped_{os.getpid()}"
    with psycopg.connect(pg_cluster.conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = pg_cluster.url_for(name)
    script = folder / "script.json"
    script.write_text(json.dumps(SCRIPT))
    env = {
        "FANFOLD_KEY_FILE": str(folder / "key"),
        "FANFOLD_TRUST_FILE": str(folder / "trust"),
        "XDG_DATA_HOME": str(folder / "data"),
    }
    env = {**{k: v for k, v in os.environ.items() if k != "FANFOLD_DB"}, **env}
    err = folder / "worker.err"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from fanfold.cli import main; main()", "worker",
             "--db", url, "--dbos-db", url, "--script", str(script), "--concurrency", "2",
             "--lease", "2.5", "--poll", "0.05"],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
            cwd=folder,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert " ready " in line, (line, err.read_text())
        yield Worker(url, folder, proc, err)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with psycopg.connect(pg_cluster.conninfo, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def _start_two_and_claim_one(
    worker: Worker, prefix: str, *, requeue: bool
) -> tuple[str, str, dict[str, int]]:
    """Queue two trees; once all their children wait for the model, claim the first in
    the log from this process (``requeue``: first re-enqueue its workflow in DBOS, as a
    worker taking another's over does). Returns both ids and the taken tree's
    ``last_seq`` per conversation at the claim; returns once the worker dropped it."""
    from dbos import DBOSClient

    from fanfold.db import open_store
    from fanfold.db.postgres import PostgresStore
    from fanfold.worker.client import enqueue_tree
    from fanfold.worker.serialization import SERIALIZER
    from fanfold.worker.spec import APP_NAME, QUEUE, TreeSpec

    taken, kept = f"{prefix}a{os.getpid()}", f"{prefix}b{os.getpid()}"
    for root in (taken, kept):
        enqueue_tree(worker.url, TreeSpec(root, f"task {root}", str(worker.folder)))
    with open_store(worker.url) as claimant:
        assert isinstance(claimant, PostgresStore)

        def children_waiting() -> bool:
            rows = [r for root in (taken, kept) for r in claimant.tree(root)]
            return len(rows) == 6 and all(r.status.value == "running" for r in rows)

        _until("both trees' children", children_waiting)
        if requeue:
            client = DBOSClient(
                system_database_url=worker.url, application_name=APP_NAME, serializer=SERIALIZER
            )
            try:
                client.resume_workflow(taken, queue_name=QUEUE)
            finally:
                client.destroy()
        claimant.claim(taken)  # another runtime takes the tree over
        seqs = {r.id: r.last_seq for r in claimant.tree(taken)}
    said = f"tree {taken}: taken over by another runtime; dropped"
    _until("the worker to drop the tree", lambda: said in worker.said())
    return taken, kept, seqs


def _at_rest(worker: Worker, root: str) -> None:
    from fanfold.cli.worker_commands import wait_at_rest
    from fanfold.db import DatabaseUrl
    from fanfold.statemachine import Idle

    state = wait_at_rest(DatabaseUrl(worker.url), root, 60, lambda: None)
    assert isinstance(state.phase, Idle), (root, state.phase)


def _dbos_status(worker: Worker, root: str) -> str:
    import psycopg

    with psycopg.connect(worker.url) as conn:
        row = conn.execute(
            "SELECT status FROM dbos.workflow_status WHERE workflow_uuid = %s", (root,)
        ).fetchone()
    return "missing" if row is None else str(row[0])


def _check(worker: Worker, *roots: str) -> None:
    """Each tree at rest, each child's outcome in its parent's log once, replayed
    identically."""
    from fanfold.db import open_store
    from fanfold.replay import verify
    from fanfold.statemachine import SubAgentFinished

    with open_store(worker.url, read_only=True) as store:
        for root in roots:
            assert store.conversation(root).status.value == "idle", root
            outcomes = sorted(
                e.event.child_id
                for e in store.events(root)
                if isinstance(e.event, SubAgentFinished)
            )
            assert outcomes == [f"{root}.1", f"{root}.2"], (root, outcomes)
            assert verify(store, root, tree=True).ok, root


def test_a_worker_drops_a_tree_taken_over_and_keeps_running_the_others(worker: Worker) -> None:
    """The claim comes from outside DBOS (this process, as a program on the log would):
    the worker drops the tree, finishes its other tree and takes a new one; its
    execution still owned the workflow, so DBOS records the step's error (the tree is
    the claimant's, which goes on with it here)."""
    import trio

    from fanfold.db import open_store
    from fanfold.providers.scripted import ScriptedProvider
    from fanfold.runtime import Runtime, UserKey
    from fanfold.worker.client import enqueue_tree
    from fanfold.worker.spec import TreeSpec

    taken, kept, seqs = _start_two_and_claim_one(worker, "o", requeue=False)
    _at_rest(worker, kept)
    assert worker.proc.poll() is None, worker.said()  # still running
    later = f"ol{os.getpid()}"
    enqueue_tree(worker.url, TreeSpec(later, "a later task", str(worker.folder)))
    _at_rest(worker, later)
    assert worker.proc.poll() is None, worker.said()
    with open_store(worker.url, read_only=True) as store:
        # Nothing of the taken tree was written after the claim.
        assert {r.id: r.last_seq for r in store.tree(taken)} == seqs
    assert _dbos_status(worker, taken) == "ERROR"

    async def finish() -> None:
        # The claimant goes on with the tree from the log.
        key = UserKey.load(worker.folder / "key")  # the worker's: the tree is its user's
        async with Runtime.open(worker.url, ScriptedProvider(SCRIPT), [], key=key) as runtime:
            await runtime.resume([taken], claimed=True)
            await runtime.wait(taken)

    trio.run(finish)
    _check(worker, taken, kept, later)


def test_a_tree_dropped_for_another_execution_of_its_workflow_is_not_recorded_by_the_old(
    worker: Worker,
) -> None:
    """The tree's workflow was re-enqueued first (a takeover of a worker does this), so
    the execution that dequeues it next owns it in DBOS. The old execution drops the
    tree; DBOS does not record its error (it no longer owns the workflow) and the new
    execution (here, on this same worker once the old one let its slot go) resumes the
    tree from the log and finishes it: the workflow ends SUCCESS, nothing lost."""
    taken, kept, _ = _start_two_and_claim_one(worker, "r", requeue=True)
    _at_rest(worker, kept)
    _at_rest(worker, taken)
    assert f"resumed tree {taken}" in worker.said()
    _until("the workflow's outcome", lambda: _dbos_status(worker, taken) == "SUCCESS")
    assert worker.proc.poll() is None, worker.said()
    _check(worker, taken, kept)
