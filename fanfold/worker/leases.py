"""Worker leases in PostgreSQL: who is alive, and who takes over a dead worker's trees.

DBOS 3.4's open-source library never notices a dead or frozen executor (DESIGN.md,
"Recovery: what DBOS does"). Each worker therefore holds a row of
``fanfold.workers``, its ``lease_until`` renewed every third of the lease, on the
server's clock (``now()``: the workers' clocks may differ). A worker that finds
another's lease expired claims the row in one statement (``UPDATE ... WHERE
lease_until < now() RETURNING``: of two workers looking at once, one gets it), then
re-enqueues the dead worker's PENDING workflows and deletes the row. If it dies in
between, its claim is a lease too and expires: a third worker claims the row again
(re-enqueueing a workflow twice is harmless: DBOS runs it once more at most, and the
tree's step resumes from fanfold's log).

A worker whose renewal finds its row claimed by another (it was frozen past its lease)
learns it was declared dead: it must stop its runtime at once (``Leases.renew``
returns False) — its trees are being resumed elsewhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from typing import Any

import psycopg

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS fanfold;
CREATE TABLE IF NOT EXISTS fanfold.workers (
    executor_id text PRIMARY KEY,
    lease_until timestamptz NOT NULL,
    taken_by text,
    started_at timestamptz NOT NULL DEFAULT now(),
    pid integer
);
ALTER TABLE fanfold.workers ADD COLUMN IF NOT EXISTS lease_s double precision;
CREATE TABLE IF NOT EXISTS fanfold.waiting_trees (
    root_id text PRIMARY KEY,
    generation integer NOT NULL,
    requests text[] NOT NULL,
    due_at double precision,
    parked_at timestamptz NOT NULL DEFAULT now()
);
"""
# (fanfold.waiting_trees: the trees that wait only for people, parking.py.)


class Leases:
    """One worker's view of ``fanfold.workers``, over its own connection.

    Every method is one short autocommitted statement or two; a lost connection (a
    PostgreSQL restart) is opened again on the next call. Blocking: call from a
    thread, not from the Trio loop.
    """

    def __init__(self, url: str, executor_id: str, lease: float) -> None:
        self.url = url
        self.executor_id = executor_id
        self.lease = lease
        self._conn: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
        return self._conn

    def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            cursor = self._connection().execute(sql, params)
            return cursor.fetchall() if cursor.description is not None else []
        except psycopg.OperationalError:
            # The server restarted or the connection broke: drop it, the next call
            # connects again (the caller decides whether this call is retried).
            self.close()
            raise

    def register(self, pid: int) -> None:
        """Create the table if needed and take this worker's row (a fresh lease).

        Called before DBOS is launched (a worker must hold a lease before it can
        claim a workflow, or a death right after the claim would orphan it), so the
        database may not exist yet: it is created as DBOS would create it.
        """
        try:
            conn = self._connection()
        except psycopg.OperationalError as exc:
            if "does not exist" not in str(exc):
                raise
            _create_database(self.url)
            conn = self._connection()
        with conn.transaction():
            # Two workers starting at once both run CREATE ... IF NOT EXISTS: one
            # lock makes the second wait instead of failing on the catalogue's key.
            conn.execute("SELECT pg_advisory_xact_lock(7303654721)")
            conn.execute(SCHEMA)
        self._execute(
            "INSERT INTO fanfold.workers (executor_id, lease_until, taken_by, pid, lease_s) "
            "VALUES (%s, now() + make_interval(secs => %s), NULL, %s, %s) "
            "ON CONFLICT (executor_id) DO UPDATE SET lease_until = EXCLUDED.lease_until, "
            "taken_by = NULL, pid = EXCLUDED.pid, started_at = now(), lease_s = EXCLUDED.lease_s",
            (self.executor_id, self.lease, pid, self.lease),
        )

    def renew(self) -> bool:
        """Push this worker's lease forward; False if another worker has claimed it
        (this one was taken for dead: it must stop running its trees)."""
        rows = self._execute(
            "UPDATE fanfold.workers SET lease_until = now() + make_interval(secs => %s) "
            "WHERE executor_id = %s AND taken_by IS NULL RETURNING 1",
            (self.lease, self.executor_id),
        )
        return bool(rows)

    def claim_expired(self) -> list[str]:
        """Claim the rows of workers whose lease expired (a claim is a lease of this
        worker's length); returns their executor ids.

        Not within a lease of the server's start (``pg_postmaster_start_time()``): no
        worker could renew while the server was away, so a lease that ran out during a
        restart says nothing about its worker. Claimed at once when the server came
        back, it pushed a healthy worker out (issue 32: a 3 s restart, leases of
        2.5 s, exit 3 for a worker that was only waiting for the server). Every worker
        gets its own lease (``lease_s``; a row without one, of an older worker, this
        worker's) from the server's return to renew; a worker that died meanwhile is
        claimed that much later. A lease ended by ``release`` has ``lease_s`` 0: its
        worker stopped and renews nothing, its work is taken at once."""
        rows = self._execute(
            "UPDATE fanfold.workers SET taken_by = %s, "
            "lease_until = now() + make_interval(secs => %s) "
            "WHERE executor_id <> %s AND lease_until < now() "
            "AND pg_postmaster_start_time() "
            "< now() - make_interval(secs => coalesce(lease_s, %s)) "
            "RETURNING executor_id",
            (self.executor_id, self.lease, self.executor_id, self.lease),
        )
        return sorted(str(r[0]) for r in rows)

    def forget(self, executor_id: str) -> None:
        """Delete a dead worker's row once its workflows are re-enqueued."""
        self._execute(
            "DELETE FROM fanfold.workers WHERE executor_id = %s AND taken_by = %s",
            (executor_id, self.executor_id),
        )

    def release(self) -> None:
        """End this worker's lease now (a stopping worker, drained or taken for dead):
        the next worker to look takes over what it leaves PENDING, without waiting for
        the lease to run out.

        The row is written whatever became of it: a worker whose lease was claimed
        (frozen, then woken) may have dequeued trees *after* the claimer re-enqueued
        its PENDING workflows and deleted its row; without a row of its own no worker
        would ever claim those again, and their trees would stay ``running`` for ever
        (seen in ``test_worker_crash.py``). Claiming a row twice is harmless: the
        claimer re-enqueues only what is still PENDING on this executor.
        """
        self._execute(
            "INSERT INTO fanfold.workers (executor_id, lease_until, taken_by, pid, lease_s) "
            "VALUES (%s, now() - interval '1 second', NULL, NULL, 0) "
            "ON CONFLICT (executor_id) DO UPDATE SET lease_until = EXCLUDED.lease_until, "
            "taken_by = NULL, lease_s = 0",
            (self.executor_id,),
        )

    def close(self) -> None:
        """Close the connection (the row stays: ``release`` ends the lease)."""
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


def _create_database(url: str) -> None:
    """``CREATE DATABASE`` the one ``url`` names, through the server's ``postgres``
    database; another worker creating it at the same moment is fine."""
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = conninfo_to_dict(url).get("dbname")
    if not name:
        raise psycopg.OperationalError("the URL names no database")
    with psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True) as conn:
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(str(name))))
        except psycopg.errors.DuplicateDatabase:
            pass
        except psycopg.errors.UniqueViolation:  # two CREATEs at once: the catalogue's key
            pass


# The advisory locks' first key: fanfold's trees (the second is a digest of the root id).
_TREE_LOCK_CLASS = 0x66616E66 - 2**31  # "fanf", as a signed 32-bit integer


def tree_key(root_id: str) -> int:
    """A tree's lock key: 32 bits of a digest of its root id, signed (two trees whose
    keys meet only wait for each other)."""
    digest = hashlib.blake2b(root_id.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


class LocksLost(RuntimeError):
    """The lock connection was lost and another worker has taken one of its trees since:
    this worker must stop running them."""


class TreeLocks:
    """A worker's claim on each tree it runs: a session-level advisory lock per tree,
    on a connection of its own, held from before the tree starts or resumes until it
    is at rest.

    The database-wide rule of the log (``resume()`` refuses while another runtime has
    the log open) cannot tell a dead worker's trees from the live ones of the others,
    so with several workers a takeover would wait for ever. This lock can: a worker
    killed with ``kill -9`` has its connection, hence its locks, ended by the kernel
    and the server; a frozen one keeps them, so the worker that took its trees over
    waits until it wakes, finds its lease taken and stops (or dies).

    A lost lock connection (a PostgreSQL restart ends every session) loses every lock:
    the next use of the locks (``still_held``, every third of the lease, or a claim)
    connects again and takes each held tree's lock again. Nobody can have taken one
    meanwhile unless this worker's lease expired and was claimed (the lease is checked
    first); if one is held by another all the same, ``LocksLost``: the worker stops.
    Blocking: call from a thread.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: psycopg.Connection[Any] | None = None
        self._held: dict[str, int] = {}  # tree -> executions here holding it
        self._lock = threading.Lock()

    def _lock_tree(self, conn: psycopg.Connection[Any], root_id: str) -> bool:
        row = conn.execute(
            "SELECT pg_try_advisory_lock(%s, %s)", (_TREE_LOCK_CLASS, tree_key(root_id))
        ).fetchone()
        return bool(row is not None and row[0])

    def _connection(self, *, ping: bool = False) -> psycopg.Connection[Any]:
        """The lock connection, made again (and every held lock taken again) if it was
        lost. Raises OperationalError while the server is away, LocksLost if a held
        tree's lock is another's now."""
        if self._conn is not None and not self._conn.closed:
            if not ping:
                return self._conn
            try:
                self._conn.execute("SELECT 1")
                return self._conn
            except psycopg.OperationalError:
                pass
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None
        conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
        for root_id in sorted(self._held):
            if not self._lock_tree(conn, root_id):
                conn.close()
                raise LocksLost(f"tree {root_id} is another worker's now")
        self._conn = conn
        return conn

    def try_claim(self, root_id: str) -> bool:
        """Take the tree's lock if no other session holds it; True if taken (also if
        this worker holds it already: a second execution of the tree's workflow here)."""
        with self._lock:
            # Counted per execution: the lock goes only when the last one lets it go
            # (two executions here shared it, and the first to end released it while
            # the other still ran the tree).
            if root_id in self._held:
                self._held[root_id] += 1
                return True
            if self._lock_tree(self._connection(), root_id):
                self._held[root_id] = 1
                return True
            return False

    def release(self, root_id: str) -> None:
        """Let the tree go (it is at rest)."""
        with self._lock:
            if root_id not in self._held:
                return
            self._held[root_id] -= 1
            if self._held[root_id] > 0:
                return  # another execution here still runs it
            del self._held[root_id]
            if self._conn is not None and not self._conn.closed:
                with contextlib.suppress(psycopg.OperationalError):
                    self._conn.execute(
                        "SELECT pg_advisory_unlock(%s, %s)",
                        (_TREE_LOCK_CLASS, tree_key(root_id)),
                    )

    def still_held(self) -> bool:
        """Whether every held lock is still this worker's: the connection pinged, and
        if it was lost, made again with the locks taken again. True while the server
        is away (nobody can take them then either); False if one is another's."""
        with self._lock:
            try:
                self._connection(ping=True)
            except LocksLost:
                self._held.clear()
                return False
            except psycopg.OperationalError:
                return True
            return True

    def close(self) -> None:
        """End the connection: every claim goes with it."""
        with self._lock:
            self._held.clear()
            if self._conn is not None:
                try:
                    self._conn.close()
                finally:
                    self._conn = None
