"""``run --detach`` on a queue that is not ready (issue 32 item 11, the workers' part).

DBOS's client never creates or migrates DBOS's tables: a worker's ``DBOS.launch`` does.
A detach right after workers started on an empty database met the tables half
migrated and printed DBOS's raw ``UndefinedColumn creator_xid``; on a database not
created yet, DBOS's client retried its connection for ever (12 clients hung for 60 s).
Now a detach waits (a bounded time) while a worker sets the database up, and otherwise
says in one line why it cannot queue. No worker process here: the test plays the
migrating worker with DBOS's own migration functions and its lock.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")

import psycopg
import sqlalchemy as sa
from dbos._migration import ensure_dbos_schema, run_dbos_migrations

from fanfold.cli import cli
from fanfold.worker.client import QueueNotReady, enqueue_tree
from fanfold.worker.spec import TreeSpec

# DBOS 3.4's advisory lock around its migrations, and the migration that adds the
# column the detach did not find.
MIGRATION_LOCK = 1234567890
CREATOR_XID = 123


def _migrate(url: str) -> None:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        ensure_dbos_schema(engine, "dbos")
        run_dbos_migrations(engine, "dbos", False)
    finally:
        engine.dispose()


def _enqueue_in_thread(url: str, spec: TreeSpec) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["id"] = enqueue_tree(url, spec)
        except BaseException as exc:  # reported by the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_detach_waits_for_a_worker_migrating_the_queue(pg_url: str, tmp_path: Path) -> None:
    _migrate(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # Half migrated: as a worker's DBOS leaves it between two migrations.
        conn.execute("ALTER TABLE dbos.workflow_status DROP COLUMN creator_xid")
        conn.execute("UPDATE dbos.dbos_migrations SET version = %s", (CREATOR_XID - 1,))
        # Nobody migrating: said at once, in one line.
        with pytest.raises(QueueNotReady, match=f"DBOS schema version {CREATOR_XID - 1}"):
            enqueue_tree(pg_url, TreeSpec("t-behind", "task", str(tmp_path)))
        # A worker migrating (DBOS's lock held): the detach waits for it.
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        thread, out = _enqueue_in_thread(pg_url, TreeSpec("t-waits", "task", str(tmp_path)))
        time.sleep(1.0)
        assert thread.is_alive(), out  # before: UndefinedColumn creator_xid, at once
        _migrate(pg_url)  # the worker's DBOS finishes
        conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
        thread.join(20)
        assert out == {"id": "t-waits"}, out
        row = conn.execute(
            "SELECT status, queue_name FROM dbos.workflow_status WHERE workflow_uuid = 't-waits'"
        ).fetchone()
    assert row == ("ENQUEUED", "fanfold.trees")


def test_a_detach_waits_no_longer_than_its_bound(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))  # migrating for ever
        started = time.monotonic()
        with pytest.raises(QueueNotReady, match="still setting up that database after 1 s"):
            enqueue_tree(pg_url, TreeSpec("t-bound", "task", str(tmp_path)), wait=1.0)
        assert time.monotonic() - started < 5


def test_a_detach_to_a_database_not_created_yet_says_so_at_once(
    pg_url: str, tmp_path: Path
) -> None:
    # Before: DBOS's client retried the connection for ever (backing off up to 60 s).
    url = pg_url.rsplit("/", 1)[0] + "/no_such_database"
    out: dict[str, Any] = {}

    def run() -> None:
        out["done"] = CliRunner().invoke(cli, ["run", "--detach", "--dbos-db", url, "x"])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "run --detach hung on a database not created"
    done = out["done"]
    assert done.exit_code == 2, done.output
    assert done.output.strip().splitlines() == [
        "error: could not queue the tree: no worker has set up that database yet "
        "(start `fanfold worker` on it first)"
    ], done.output
