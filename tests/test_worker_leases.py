"""The workers' lease table (``fanfold/worker/leases.py``) on the throwaway cluster."""

from __future__ import annotations

from typing import Any

import pytest
from pg_cluster import NOT_INSTALLED, Cluster, find_binaries

pytest.importorskip("psycopg", reason="needs the postgres extra: pip install '.[postgres]'")
if find_binaries() is None:
    pytest.skip(NOT_INSTALLED, allow_module_level=True)


def test_a_worker_taken_for_dead_leaves_a_row_to_claim_when_it_stops(
    pg_cluster: Cluster,
) -> None:
    # Found by test_worker_crash.py: a frozen worker, woken after another claimed its
    # lease, re-enqueued its workflows and deleted its row, dequeued one of them again
    # before it noticed; it then stopped, and nobody ever claimed that executor again.
    from fanfold.worker.leases import Leases

    url = pg_cluster.url_for("fanfold_leases")
    frozen = Leases(url, "frozen", 0.0)  # a lease already over: taken for dead
    other = Leases(url, "other", 30.0)
    try:
        frozen.register(1)
        other.register(2)
        assert other.claim_expired() == ["frozen"]
        other.forget("frozen")  # its PENDING workflows re-enqueued, its row gone
        assert not frozen.renew()  # woken: its lease is not its own any more
        frozen.release()  # stopping (after DBOS stopped dequeuing)
        # What it took meanwhile is still PENDING on its executor: another claims it.
        assert other.claim_expired() == ["frozen"]
        other.forget("frozen")
        # A drained worker's release is claimed at once as before.
        drained = Leases(url, "drained", 30.0)
        drained.register(3)
        assert other.claim_expired() == []
        drained.release()
        assert other.claim_expired() == ["drained"]
        drained.close()
    finally:
        frozen.close()
        other.close()


def test_a_tree_whose_resume_meets_a_lost_log_is_resumed_once_it_is_back() -> None:
    # Found by test_worker_crash.py: a takeover's resume ran into the PostgreSQL
    # restart (LogUnavailable while reading the tree); raised out of the step, DBOS
    # recorded the workflow ERROR for good and the tree stayed running in the log.
    pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")
    import trio

    from fanfold.db import LogUnavailable
    from fanfold.worker.dbos_worker import _Host
    from fanfold.worker.spec import TreeSpec

    class Store:
        def conversation(self, _id: str) -> object:
            return object()  # in the log: a resume

    class Runtime:
        store = Store()
        resumes = 0

        async def resume(self, roots: list[str], *, claimed: bool) -> None:
            self.resumes += 1
            if self.resumes == 1:
                raise LogUnavailable("the PostgreSQL log postgresql://h/db is unavailable")

        async def wait(self, _root: str) -> Any:
            return type("Rest", (), {"phase": "idle"})()

    class Locks:
        released: list[str] = []

        def try_claim(self, _root: str) -> bool:
            return True

        def release(self, root: str) -> None:
            self.released.append(root)

    said: list[str] = []

    async def main() -> dict[str, Any]:
        fake: Any = (Runtime(), Locks())
        host = _Host(
            fake[0], trio.lowlevel.current_trio_token(), lambda _s: fake, lambda _c: (),
            "", said.append, fake[1],
        )  # fmt: skip
        out = await host.run_to_rest(TreeSpec("t1", "task", "/x"))
        assert fake[0].resumes == 2
        return out

    assert trio.run(main) == {"root_id": "t1", "phase": "idle", "resumed": True}
    assert said == ["tree t1: the log is unavailable; retrying", "resumed tree t1"]
    assert Locks.released == ["t1"]


def test_a_trees_lock_is_held_until_the_last_execution_here_lets_it_go(pg_url: str) -> None:
    # Two executions of one tree's workflow in one worker (its own re-enqueued workflow
    # dequeued again before it noticed) share the lock: the first to end let it go
    # while the other still ran the tree.
    from fanfold.worker.leases import TreeLocks

    here, other = TreeLocks(pg_url), TreeLocks(pg_url)
    try:
        assert here.try_claim("tree-1") and here.try_claim("tree-1")
        here.release("tree-1")  # the first execution ends
        assert not other.try_claim("tree-1")  # still held for the second
        here.release("tree-1")
        assert other.try_claim("tree-1")
    finally:
        here.close()
        other.close()


def test_the_admission_asks_a_lost_log_again_until_it_is_back() -> None:
    # The admission step asks whether the log holds the tree: a PostgreSQL restart at
    # that moment, raised out of the step, would end the workflow in ERROR for good.
    pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")
    import trio

    from fanfold.db import LogUnavailable, UnknownConversation
    from fanfold.worker.dbos_worker import _Host

    class Store:
        asked = 0

        def conversation(self, root: str) -> object:
            self.asked += 1
            if self.asked < 3:
                raise LogUnavailable("the PostgreSQL log postgresql://h/db is unavailable")
            raise UnknownConversation(root)

    class Runtime:
        store = Store()

    async def main() -> bool:
        fake: Any = Runtime()
        host = _Host(
            fake, trio.lowlevel.current_trio_token(), lambda _s: fake, lambda _c: (),
            "", lambda _t: None, fake,
        )  # fmt: skip
        return await host.known("t1")

    assert trio.run(main) is False
    assert Runtime.store.asked == 3


def test_a_renewal_cut_off_for_less_than_the_lease_keeps_the_lease(pg_url: str) -> None:
    # Issue 32 item 10. Every renewal of a worker's lease fails from just after one
    # succeeded until 0.78 of the lease later (the server away: a restart, a network
    # cut), so the renewals due at one and two thirds of it fail. A renewal that failed
    # was tried again only a third of the lease later: the next came at the very end of
    # the lease, where another worker watching it took the worker for dead (exit 3 in
    # the crash test). Now a failed renewal is tried again at once and often: the lease
    # is renewed with time to spare as soon as the server answers, and never claimed.
    pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")
    import time

    import psycopg
    import trio

    from fanfold.worker.dbos_worker import WorkerSettings, _keep_lease
    from fanfold.worker.leases import Leases, TreeLocks

    lease = 4.0
    tries: list[tuple[float, bool]] = []  # (monotonic time, renewed) of each renewal

    def cut() -> bool:
        return bool(tries) and time.monotonic() < tries[0][0] + lease * 0.78

    class CutOff(Leases):
        def renew(self) -> bool:
            at = time.monotonic()
            if cut():
                tries.append((at, False))
                raise psycopg.OperationalError("connection failed: server closed the connection")
            renewed = super().renew()
            tries.append((at, renewed))
            return renewed

    worker = CutOff(pg_url, "worker", lease)
    other = Leases(pg_url, "other", 30.0)
    locks = TreeLocks(pg_url)
    claimed: list[str] = []
    said: list[str] = []
    lost = trio.Event()

    async def main() -> None:
        settings = WorkerSettings(log=pg_url, system_url=pg_url, executor_id="worker", lease=lease)

        async def watch() -> None:  # another worker, looking for expired leases
            while True:
                if not cut():
                    claimed.extend(await trio.to_thread.run_sync(other.claim_expired))
                await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            launched = trio.Event()  # not set: this worker claims nobody's lease here
            nursery.start_soon(_keep_lease, worker, locks, settings, said.append, lost, launched)
            nursery.start_soon(watch)
            await trio.sleep(lease * 1.1)
            nursery.cancel_scope.cancel()

    try:
        worker.register(1)
        other.register(2)
        trio.run(main)
    finally:
        worker.close()
        other.close()
        locks.close()
    first = tries[0][0]
    failed = [at for at, renewed in tries if not renewed]
    assert len(failed) >= 2, tries  # the cut met the renewals due at 1/3 and 2/3
    after = min((at for at, renewed in tries if renewed and at > failed[-1]), default=first + 99)
    # Renewed before the lease ran out, with time to spare (the cut ended at 0.78 of
    # it): before, the first renewal after the cut came at the lease's end or later.
    assert after - first < lease * 0.95, (after - first, tries)
    assert claimed == [] and not lost.is_set(), (claimed, said)
    assert said[0].startswith("lease renewal failed (OperationalError)"), said


def test_a_lease_that_ran_out_while_the_server_was_down_gets_a_lease_to_renew(
    pg_cluster: Cluster,
) -> None:
    # Issue 32 item 10. PostgreSQL restarted: no worker could renew while it was away,
    # so leases ran out. A worker looking for expired leases right after the restart
    # claimed them all and pushed the healthy workers out (exit 3). Now a lease that
    # ran out is claimed only a lease (its own) after the server's start: a healthy
    # worker renews meanwhile and keeps it; a dead one is claimed then.
    import time

    from fanfold.worker.leases import Leases

    url = pg_cluster.url_for("fanfold_leases_restart")
    lease = 2.0
    healthy, dead, looking = (Leases(url, n, lease) for n in ("healthy", "dead", "looking"))
    try:
        for n, leases in enumerate((healthy, dead, looking)):
            leases.register(n)
        for leases in (healthy, dead):
            leases._execute(  # ran out during the restart below
                "UPDATE fanfold.workers SET lease_until = now() - interval '1 second'"
                " WHERE executor_id = %s",
                (leases.executor_id,),
            )
        for leases in (healthy, dead, looking):
            leases.close()
        pg_cluster.restart()
        assert looking.claim_expired() == []
        assert healthy.renew()  # back, it renews (within a lease of the server's start)
        time.sleep(lease + 0.2)
        assert healthy.renew()
        assert looking.claim_expired() == ["dead"]
        assert healthy.renew()
    finally:
        for leases in (healthy, dead, looking):
            leases.close()
