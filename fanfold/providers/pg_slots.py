"""A profile's call slots shared by every worker on one PostgreSQL (issue 25).

``max_concurrent_calls`` in one process is a ``trio.CapacityLimiter``
(``fanfold.providers.slots.LocalSlots``). Workers sharing a database share a
provider's rate limit, so they share the count: a table of slots,
``fanfold.model_slots(profile, slot, holder, lease_until)``, one row per slot.

- **Taking a slot** is one statement: the first free slot below the capacity (no
  holder, or a lease that has run out: a dead worker's slots come back by
  themselves) locked with ``FOR UPDATE SKIP LOCKED``, so two workers never take the
  same row and neither waits for the other's lock; one write.
- **Releasing** is one write, conditional on still being the holder (a slot taken
  over after this worker's lease ran out is not freed by it).
- **Leases**: every slot is taken for ``lease`` seconds; the worker renews all of
  its slots every third of that. A worker killed with kill -9, or frozen past its
  lease, loses them to the others after at most ``lease`` seconds.
- **Waiting**: of one process's calls waiting for a profile, only the first asks the
  database, every ``poll`` seconds (so 1,000 waiting children cost one query per
  poll, not 1,000); the others wait their turn in the process, first come first
  served. A slot freed in this process wakes its waiter at once.

Workers should configure a profile with the same capacity: a worker counts the
slots below its own capacity (one with 2 uses slots 0 and 1, one with 4 slots 0 to
3, so the total in flight is the larger).

Needs the ``postgres`` extra (psycopg 3); imported only by the commands that use a
PostgreSQL database, never by ``import fanfold``.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS fanfold;
CREATE TABLE IF NOT EXISTS fanfold.model_slots (
    profile text NOT NULL,
    slot integer NOT NULL,
    holder text,
    lease_until timestamptz,
    PRIMARY KEY (profile, slot)
);
"""

_ENSURE = """
INSERT INTO fanfold.model_slots (profile, slot)
SELECT %(profile)s, n FROM generate_series(0, %(capacity)s - 1) AS n
ON CONFLICT DO NOTHING
"""

_TAKE = """
WITH free AS (
    SELECT slot FROM fanfold.model_slots
    WHERE profile = %(profile)s AND slot < %(capacity)s
      AND (holder IS NULL OR lease_until < now())
    ORDER BY slot LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE fanfold.model_slots AS s
SET holder = %(holder)s, lease_until = now() + make_interval(secs => %(lease)s)
FROM free WHERE s.profile = %(profile)s AND s.slot = free.slot
RETURNING s.slot
"""

_RELEASE = """
UPDATE fanfold.model_slots SET holder = NULL, lease_until = NULL
WHERE profile = %(profile)s AND slot = %(slot)s AND holder = %(holder)s
"""

_RENEW = """
UPDATE fanfold.model_slots SET lease_until = now() + make_interval(secs => %(lease)s)
WHERE holder = %(holder)s
"""


def holder_name() -> str:
    """A name for this process's slots: host, pid and a random part (a pid is reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class PostgresSlots:
    """``CallSlots`` counted in a PostgreSQL table shared by every worker.

    Open with ``async with PostgresSlots.open(conninfo) as slots`` (creates the
    table if needed, renews this process's leases while open, frees its slots at
    the end), then give it to ``ProviderRouter(..., slots=slots)``.
    """

    def __init__(
        self, connection: Any, holder: str, *, lease: float = 15.0, poll: float = 0.05
    ) -> None:
        self._connection = connection
        self._lock = threading.Lock()  # one statement at a time on the connection
        self.holder = holder
        self.lease = lease
        self.poll = poll
        self._ensured: set[tuple[str, int]] = set()
        self._turns: dict[str, trio.Lock] = {}  # this process's queue per profile
        self._freed: dict[str, trio.Event] = {}

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        conninfo: str,
        *,
        holder: str | None = None,
        lease: float = 15.0,
        poll: float = 0.05,
    ) -> AsyncIterator[PostgresSlots]:
        import psycopg  # the postgres extra: only where a database URL is used

        connection = await trio.to_thread.run_sync(
            lambda: psycopg.connect(conninfo, autocommit=True)
        )
        slots = cls(connection, holder or holder_name(), lease=lease, poll=poll)
        try:
            await slots._run(SCHEMA, {})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(slots._renew_leases)
                try:
                    yield slots
                finally:
                    nursery.cancel_scope.cancel()
            with trio.CancelScope(shield=True):
                await slots._run(
                    "UPDATE fanfold.model_slots SET holder = NULL, lease_until = NULL"
                    " WHERE holder = %(holder)s",
                    {"holder": slots.holder},
                )
        finally:
            connection.close()

    def _execute(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self._lock, self._connection.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []

    async def _run(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        return await trio.to_thread.run_sync(self._execute, sql, params)

    async def _renew_leases(self) -> None:
        while True:
            await trio.sleep(self.lease / 3)
            await self._run(_RENEW, {"holder": self.holder, "lease": self.lease})

    async def _take(self, profile: str, capacity: int) -> int:
        if (profile, capacity) not in self._ensured:
            await self._run(_ENSURE, {"profile": profile, "capacity": capacity})
            self._ensured.add((profile, capacity))
        turn = self._turns.setdefault(profile, trio.Lock())
        params = {
            "profile": profile,
            "capacity": capacity,
            "holder": self.holder,
            "lease": self.lease,
        }
        async with turn:  # only the first waiter of this process asks the database
            while True:
                freed = self._freed.setdefault(profile, trio.Event())
                rows = await self._run(_TAKE, params)
                if rows:
                    return int(rows[0][0])
                with trio.move_on_after(self.poll):
                    await freed.wait()  # a slot this process freed, or the next poll

    async def _release(self, profile: str, slot: int) -> None:
        await self._run(_RELEASE, {"profile": profile, "slot": slot, "holder": self.holder})
        freed = self._freed.pop(profile, None)
        if freed is not None:
            freed.set()

    def in_use(self, profile: str) -> int:
        """How many of ``profile``'s slots any worker holds now (unexpired leases)."""
        rows = self._execute(
            "SELECT count(*) FROM fanfold.model_slots WHERE profile = %(profile)s"
            " AND holder IS NOT NULL AND lease_until >= now()",
            {"profile": profile},
        )
        return int(rows[0][0])

    @asynccontextmanager
    async def hold(self, profile: str, capacity: int) -> AsyncIterator[None]:
        slot = await self._take(profile, capacity)
        try:
            yield
        finally:
            # Shielded: a cancelled call still frees its slot (else it would stay
            # held until this process ends or its lease runs out).
            with trio.CancelScope(shield=True):
                await self._release(profile, slot)


@asynccontextmanager
async def shared_slots(provider: Any, conninfo: str) -> AsyncIterator[PostgresSlots | None]:
    """For a worker on a PostgreSQL database: if ``provider`` is a router with a
    profile that caps its calls (``max_concurrent_calls``), count its calls in the
    database's slot table, shared with every other worker, for as long as the block
    runs; otherwise nothing (None)."""
    config = getattr(provider, "config", None)
    capped = config is not None and any(
        p.max_concurrent_calls is not None for p in getattr(config, "profiles", ())
    )
    if not capped or not hasattr(provider, "slots"):
        yield None
        return
    local = provider.slots
    async with PostgresSlots.open(conninfo) as slots:
        provider.slots = slots
        try:
            yield slots
        finally:
            provider.slots = local
