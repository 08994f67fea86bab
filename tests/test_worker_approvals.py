"""Issue 35 on a worker: a tree the worker's host runs (``_Host.run_to_rest``, what a
DBOS workflow's step calls) on a PostgreSQL log waits for a decision, and a decision
written from elsewhere (another connection to the database's decisions table, as
``fanfold approve --db postgresql://...`` on another machine) reaches it there.
In process: no DBOS launch, the host's own code path on a real PostgreSQL database."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from runtime_helpers import reply, script

import fanfold
from fanfold.runtime import Runtime
from fanfold.runtime.approvals import Decision, PgDecisions
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import Limits, ToolResultMessage
from fanfold.tools.registry import ToolSet

pytest.importorskip("dbos")


@fanfold.tool(needs_approval=True)
def deploy(service: str) -> str:
    """Deploy a service.

    Args:
        service: the service's name.
    """
    return f"deployed {service}"


async def test_a_worker_holding_a_waiting_tree_takes_a_decision_written_elsewhere(
    pg_url: str, tmp_path: Path
) -> None:
    from fanfold.worker.dbos_worker import _Host
    from fanfold.worker.leases import TreeLocks
    from fanfold.worker.spec import TreeSpec

    provider = script(0.0, root=[reply("", ("deploy", {"service": "api"})), reply("done")])
    said: list[str] = []
    async with Runtime.open(
        pg_url,
        provider,
        ToolSet.default(extra=[deploy]),
        limits=Limits(),
        logger=quiet_logger(),
        threaded_writes=False,
    ) as runtime:
        runtime.decision_poll = 0.05
        locks = TreeLocks(pg_url)
        host = _Host(
            runtime, trio.lowlevel.current_trio_token(), lambda spec: Limits(), lambda cwd: (),
            "", said.append, locks,
        )  # fmt: skip
        spec = TreeSpec("a1b2c3d4e5f6", "deploy the api", str(tmp_path))
        outcome: list[dict[str, object]] = []

        async def step() -> None:
            outcome.append(await host.run_to_rest(spec))

        table = PgDecisions(pg_url)  # a connection of its own: "elsewhere"
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(step)
                with trio.fail_after(20):
                    while not runtime.pending():
                        await trio.sleep(0.01)
                (request,) = runtime.pending()
                assert request.tree == spec.root_id and request.tool == "deploy"
                # While it waits, this host (given no parking table) holds the
                # workflow's slot; a worker's lets the tree go (test_worker_parking.py).
                assert outcome == []
                await trio.to_thread.run_sync(
                    table.write,
                    Decision(request.id, "grant", '{"service":"web"}', "", "cli:elsewhere", 0.0),
                )
        finally:
            table.close()
        assert outcome == [{"root_id": spec.root_id, "phase": "Idle", "resumed": False}]
        state = runtime.state(spec.root_id)
        results = [m.result.content for m in state.history if isinstance(m, ToolResultMessage)]
        assert results == ["deployed web"]
        # At rest: the tree's lock is let go (another worker could claim it now).
        other = TreeLocks(pg_url)
        try:
            assert await trio.to_thread.run_sync(other.try_claim, spec.root_id)
        finally:
            other.close()
        locks.close()
