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
