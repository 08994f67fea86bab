"""A profile's call slots shared through PostgreSQL (``fanfold.providers.pg_slots``):
two "workers" (two slot tables' clients with their own holders, as two processes
would have) never have more calls of a profile in flight than its capacity, a
cancelled call frees its slot, and a dead worker's slots come back when its lease
runs out. A real PostgreSQL (the ``pg_cluster`` fixture), real time."""

from __future__ import annotations

import pytest
import trio
from pg_cluster import Cluster

pytest.importorskip("psycopg", reason="the postgres extra is not installed")

from fanfold.providers.base import CallContext
from fanfold.providers.config import Config, Profile, ProviderRouter
from fanfold.providers.pg_slots import PostgresSlots
from fanfold.statemachine import ModelReply, ModelRequest, UserMessage

REQUEST = ModelRequest("", (UserMessage("hi"),), ())


class InFlight:
    """Calls in flight across every worker of the test."""

    def __init__(self) -> None:
        self.now = self.most = self.calls = 0


class Counting:
    def __init__(self, shared: InFlight, latency: float) -> None:
        self.shared, self.latency = shared, latency

    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply:
        self.shared.now += 1
        self.shared.calls += 1
        self.shared.most = max(self.shared.most, self.shared.now)
        try:
            await trio.sleep(self.latency)
            return ModelReply(text="ok")
        finally:
            self.shared.now -= 1


def _router(slots: PostgresSlots | None, provider: Counting, cap: int = 2) -> ProviderRouter:
    config = Config((Profile("offline", "scripted", max_concurrent_calls=cap),), default="offline")
    return ProviderRouter(config, scripted=provider, slots=slots)


def _ctx(n: int) -> CallContext:
    return CallContext(f"c{n}", "r", "root", 0, None, n)


@pytest.fixture
def database(pg_cluster: Cluster, request: pytest.FixtureRequest) -> str:
    """A fresh database per test: the slot table starts empty."""
    import psycopg

    name = "slots_" + request.node.name.lower().replace("[", "_").replace("]", "")[:40]
    with psycopg.connect(pg_cluster.conninfo, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        connection.execute(f'CREATE DATABASE "{name}"')
    return pg_cluster.conninfo_for(name)


async def test_two_workers_share_a_profiles_slots(database: str) -> None:
    shared = InFlight()
    async with (
        PostgresSlots.open(database, holder="w1") as one,
        PostgresSlots.open(database, holder="w2") as two,
    ):
        routers = [_router(one, Counting(shared, 0.2)), _router(two, Counting(shared, 0.2))]
        async with trio.open_nursery() as nursery:
            for n in range(10):
                nursery.start_soon(routers[n % 2].complete, REQUEST, _ctx(n))
        assert one.in_use("offline") == 0
        for router in routers:
            await router.aclose()
    assert shared.calls == 10
    assert shared.most == 2


async def test_without_the_shared_table_the_two_would_run_four(database: str) -> None:
    # The same two workers counting each in its own process (the local default):
    # what the shared table prevents.
    shared = InFlight()
    routers = [
        ProviderRouter(
            Config((Profile("offline", "scripted", max_concurrent_calls=2),), default="offline"),
            scripted=Counting(shared, 0.2),
        )
        for _ in range(2)
    ]
    async with trio.open_nursery() as nursery:
        for n in range(10):
            nursery.start_soon(routers[n % 2].complete, REQUEST, _ctx(n))
    assert shared.most == 4


async def test_a_cancelled_call_frees_its_slot(database: str) -> None:
    shared = InFlight()
    async with PostgresSlots.open(database, holder="w1") as slots:
        router = _router(slots, Counting(shared, 60.0), cap=1)
        with trio.move_on_after(0.5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(router.complete, REQUEST, _ctx(1))
                nursery.start_soon(router.complete, REQUEST, _ctx(2))
        assert slots.in_use("offline") == 0
        assert shared.calls == 1  # the second never got the slot
        await router.aclose()


async def test_a_dead_workers_slot_comes_back_when_its_lease_runs_out(database: str) -> None:
    from fanfold.providers.pg_slots import _ENSURE, _TAKE

    shared = InFlight()
    async with PostgresSlots.open(database, holder="alive") as alive:
        # Another worker took the only slot for 0.6 s and died (kill -9): it never
        # releases it nor renews its lease.
        await alive._run(_ENSURE, {"profile": "offline", "capacity": 1})
        dead = {"profile": "offline", "capacity": 1, "holder": "dead", "lease": 0.6}
        assert await alive._run(_TAKE, dead) == [(0,)]
        assert alive.in_use("offline") == 1
        router = _router(alive, Counting(shared, 0.0), cap=1)
        with trio.fail_after(30):
            await router.complete(REQUEST, _ctx(1))  # once the lease has run out
        await router.aclose()
    assert shared.calls == 1


def test_nothing_of_this_is_imported_by_fanfold() -> None:
    import subprocess
    import sys

    code = "import fanfold, fanfold.providers.config, sys; print('psycopg' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def test_a_worker_shares_its_routers_slots_only_where_a_profile_caps_calls(
    database: str,
) -> None:
    from fanfold.providers.pg_slots import shared_slots
    from fanfold.providers.slots import LocalSlots

    capped = _router(None, Counting(InFlight(), 0.0))
    local: object = capped.slots
    assert isinstance(local, LocalSlots)
    async with shared_slots(capped, database) as slots:
        assert isinstance(slots, PostgresSlots) and capped.slots is slots
        await capped.complete(REQUEST, _ctx(1))
    assert capped.slots is local  # type: ignore[comparison-overlap]  # given back
    plain = ProviderRouter(
        Config((Profile("offline", "scripted"),), default="offline"),
        scripted=Counting(InFlight(), 0.0),
    )
    async with shared_slots(plain, database) as none:
        assert none is None and isinstance(plain.slots, LocalSlots)
    for router in (capped, plain):
        await router.aclose()
