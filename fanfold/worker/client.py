"""``fanfold run --detach``: put a tree on the workers' queue (a DBOS client, no runtime).

The queue's tables are DBOS's, created and migrated by DBOS when a worker launches
(``DBOS.launch``); a client never migrates them. So a detach first makes sure they are
there at the version this DBOS writes (``wait_for_queue``): a detach right after
workers started on an empty database met them half migrated (``UndefinedColumn
creator_xid``, DBOS's error as it was), and a database not created yet made DBOS's
client retry its connection for ever (12 clients hung for 60 s and more). Now it waits,
for at most ``DETACH_WAIT`` seconds, while a worker is setting the database up, and
otherwise says in one line why it cannot queue (``QueueNotReady``).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from dbos import DBOSClient, EnqueueOptions

from fanfold.worker.serialization import SERIALIZER, refuse_pickle
from fanfold.worker.spec import APP_NAME, APP_VERSION, QUEUE, WORKFLOW, TreeSpec

DETACH_WAIT = 30.0
"""Seconds a detach waits at most for workers setting the database up."""

_POLL = 0.2

# DBOS 3.4 takes this advisory lock around its schema migrations
# (``dbos/_sys_db_postgres.py``, ``MIGRATION_LOCK_ID``): held, a worker is migrating.
_DBOS_MIGRATION_LOCK = 1234567890


class QueueNotReady(Exception):
    """The workers' queue cannot take a tree now; the message is one line, for a user."""


def _latest_version() -> int:
    # The number of DBOS's migrations: the version its client writes rows for.
    from dbos._migration import get_dbos_migrations

    return len(get_dbos_migrations("dbos", False))


def _state(conn: psycopg.Connection[Any]) -> tuple[int | None, bool, bool]:
    """(DBOS's schema version, None if it has no tables yet; whether a migration holds
    DBOS's lock; whether a worker holds a live lease)."""
    row = conn.execute("SELECT to_regclass('dbos.dbos_migrations') IS NOT NULL").fetchone()
    version: int | None = None
    if row is not None and row[0]:
        found = conn.execute("SELECT max(version) FROM dbos.dbos_migrations").fetchone()
        version = int(found[0]) if found is not None and found[0] is not None else 0
    locked = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND classid = 0 AND objid = %s AND objsubid = 1)",
        (_DBOS_MIGRATION_LOCK,),
    ).fetchone()
    alive = False
    if conn.execute("SELECT to_regclass('fanfold.workers') IS NOT NULL").fetchone() == (True,):
        live = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM fanfold.workers WHERE lease_until > now())"
        ).fetchone()
        alive = bool(live is not None and live[0])
    return version, bool(locked is not None and locked[0]), alive


def wait_for_queue(system_url: str, wait: float = DETACH_WAIT) -> None:
    """Return once DBOS's tables in ``system_url`` are at the version this DBOS writes.

    While a worker sets them up (DBOS's migration lock held, or a worker alive whose
    DBOS has not migrated yet: it registers its lease before it launches DBOS), wait, up
    to ``wait`` seconds. Raises ``QueueNotReady`` (one line) when the server does not
    answer, when no worker has set the database up, when its tables are of another DBOS
    and nobody migrates them, or when ``wait`` ran out.
    """
    latest = _latest_version()
    deadline = time.monotonic() + wait
    while True:
        try:
            with psycopg.connect(system_url, autocommit=True, connect_timeout=10) as conn:
                version, migrating, alive = _state(conn)
        except psycopg.OperationalError as exc:
            text = str(exc)
            if "does not exist" in text and "database" in text:
                raise QueueNotReady(
                    "no worker has set up that database yet (start `fanfold worker` on it first)"
                ) from None
            # Unreachable (a wrong URL, the server down): said at once, as before; only
            # a worker known to be setting the database up is waited for.
            lines = text.strip().splitlines()
            raise QueueNotReady(
                f"the database did not answer: {lines[0] if lines else type(exc).__name__}"
            ) from None
        else:
            if version is not None and version >= latest:
                return
            if not migrating and not alive:
                if version is None:
                    raise QueueNotReady(
                        "no worker has set up that database yet (start `fanfold worker` on "
                        "it first)"
                    )
                raise QueueNotReady(
                    f"the workers' queue in that database is at DBOS schema version "
                    f"{version}, and this fanfold writes version {latest}: start a worker "
                    "of this version on it (it migrates the schema)"
                )
        if time.monotonic() >= deadline:
            raise QueueNotReady(f"a worker is still setting up that database after {wait:g} s")
        time.sleep(_POLL)


def enqueue_tree(system_url: str, spec: TreeSpec, *, wait: float = DETACH_WAIT) -> str:
    """Enqueue ``spec`` as the tree workflow whose id is its root id; returns that id.

    DBOS keeps one workflow per id: enqueueing the same id again returns the existing
    one (the first spec stands). Waits for the queue first (``wait_for_queue``); raises
    ``QueueNotReady`` if it is not ready in ``wait`` seconds. DBOS's client is told not
    to retry a lost connection (it would, for ever): the error is raised instead."""
    wait_for_queue(system_url, wait)
    refuse_pickle()  # this client reads nothing back, but never a pickle if it did
    client = DBOSClient(
        system_database_url=system_url,
        application_name=APP_NAME,
        serializer=SERIALIZER,
        retry_connection_errors=False,
    )
    try:
        options: EnqueueOptions = {
            "workflow_name": WORKFLOW,
            "queue_name": QUEUE,
            "workflow_id": spec.root_id,
            "app_version": APP_VERSION,
        }
        return str(client.enqueue(options, spec.to_input()).get_workflow_id())
    finally:
        client.destroy()
