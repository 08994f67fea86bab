"""How many model calls of a profile may be in flight at once (issue 25).

A provider's rate limit is shared by every call to it: a profile may set
``max_concurrent_calls``, and a call of that profile holds one of its slots while its
request runs (each attempt: a retry's wait holds none). Which calls run, how many
children run, when a call is retried stay the reducer's decisions; the slots only
make a call wait for its turn at the provider, as a connection pool would.

``LocalSlots`` counts the calls of this process (one ``trio.CapacityLimiter`` per
profile). Workers sharing a PostgreSQL database share one count through
``fanfold.providers.pg_slots.PostgresSlots`` (the ``postgres`` extra).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

import trio


class CallSlots(Protocol):
    """Where a profile's calls take their slots."""

    def hold(self, profile: str, capacity: int) -> AbstractAsyncContextManager[None]:
        """Wait for one of ``profile``'s ``capacity`` slots and hold it inside the
        block; released when the block ends, however it ends (a cancel included)."""
        ...


class LocalSlots:
    """The slots of one process: a capacity limiter per profile."""

    def __init__(self) -> None:
        self._limiters: dict[str, trio.CapacityLimiter] = {}

    def in_use(self, profile: str) -> int:
        """How many of ``profile``'s slots are held now."""
        limiter = self._limiters.get(profile)
        return 0 if limiter is None else limiter.borrowed_tokens

    @asynccontextmanager
    async def hold(self, profile: str, capacity: int) -> AsyncIterator[None]:
        limiter = self._limiters.get(profile)
        if limiter is None:
            limiter = self._limiters[profile] = trio.CapacityLimiter(capacity)
        elif limiter.total_tokens != capacity:
            limiter.total_tokens = capacity  # a configuration read again
        # A token of its own per call: the limiter refuses one borrower holding two,
        # and a task may well make calls one after another while another is held.
        borrower = object()
        await limiter.acquire_on_behalf_of(borrower)
        try:
            yield
        finally:
            limiter.release_on_behalf_of(borrower)
