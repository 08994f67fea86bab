"""Trees that wait only for people, let go by the worker that ran them (issue 35).

A detached tree whose every live agent waits on an approval or a question holds no
worker: the worker's step unloads it from the runtime (``Runtime.unload_tree``), writes
a row of ``fanfold.waiting_trees`` in the queue's database (made with the workers'
table, ``leases.SCHEMA``) (its open requests and the
earliest time one of its timers is due), and ends; the workflow ends, the worker's slot
and the tree's lock go. Every worker looks at the rows now and then (``due``): a row one
of whose requests has a decision written (``fanfold approve``, anywhere), or whose due
time has come (an approval timeout, a time limit), gets a wake workflow on the trees'
queue (``wake:ROOT:GENERATION``: DBOS keeps one workflow per id, so two workers
enqueueing the same wake make one). The worker that dequeues it resumes the tree from
the log, which re-issues the requests and the timers (downtime counted), applies the
decision, and runs the tree on: to rest (the row goes), or to the next wait (the row
again, its generation one more). DESIGN.md, "A human in the loop", "On workers".
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Any

import attrs
import psycopg


@attrs.frozen
class WaitingTree:
    """A row of ``fanfold.waiting_trees``."""

    root_id: str
    generation: int
    """How many times the tree was let go: a wake names the one it ends."""
    requests: tuple[str, ...]
    due_at: float | None
    """Seconds since the epoch when its earliest timer is due; None: none."""


class Parking:
    """``fanfold.waiting_trees`` over a connection of its own (made again once if it
    was lost); each method one autocommitted statement. Blocking: call from a thread."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            for attempt in (0, 1):
                try:
                    if self._conn is None or self._conn.closed:
                        self._conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
                    cursor = self._conn.execute(sql, params)
                    return cursor.fetchall() if cursor.description is not None else []
                except psycopg.OperationalError:
                    self._drop()
                    if attempt:
                        raise
        raise AssertionError("unreachable")

    def park(self, root_id: str, requests: Sequence[str], due_at: float | None) -> int:
        """Record tree ``root_id`` as let go, waiting on ``requests``; returns its
        generation (1 the first time, one more each time after)."""
        rows = self._execute(
            "INSERT INTO fanfold.waiting_trees (root_id, generation, requests, due_at) "
            "VALUES (%s, 1, %s, %s) ON CONFLICT (root_id) DO UPDATE SET "
            "generation = fanfold.waiting_trees.generation + 1, "
            "requests = EXCLUDED.requests, due_at = EXCLUDED.due_at, parked_at = now() "
            "RETURNING generation",
            (root_id, list(requests), due_at),
        )
        return int(rows[0][0])

    def generation(self, root_id: str) -> int | None:
        """The generation of tree ``root_id``'s row; None: it has none."""
        rows = self._execute(
            "SELECT generation FROM fanfold.waiting_trees WHERE root_id = %s", (root_id,)
        )
        return int(rows[0][0]) if rows else None

    def done(self, root_id: str) -> None:
        """Tree ``root_id`` is at rest: it waits for nobody."""
        self._execute("DELETE FROM fanfold.waiting_trees WHERE root_id = %s", (root_id,))

    def waiting(self) -> list[WaitingTree]:
        """Every tree let go, oldest first."""
        rows = self._execute(
            "SELECT root_id, generation, requests, due_at FROM fanfold.waiting_trees "
            "ORDER BY parked_at"
        )
        return [WaitingTree(r[0], int(r[1]), tuple(r[2]), r[3]) for r in rows]

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
        self._conn = None

    def close(self) -> None:
        with self._lock:
            self._drop()


def due(
    trees: Sequence[WaitingTree], decided: set[str], now: float | None = None
) -> list[WaitingTree]:
    """Of ``trees``, those to wake: a request of it decided (``decided``: the requests
    whose decision is written and not applied yet), or its due time come."""
    at = time.time() if now is None else now
    return [
        tree
        for tree in trees
        if (tree.due_at is not None and tree.due_at <= at) or decided.intersection(tree.requests)
    ]


def wake_id(root_id: str, generation: int) -> str:
    """The wake workflow's id for a tree's generation."""
    return f"wake:{root_id}:{generation}"
