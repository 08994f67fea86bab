"""The workers' lease table (``fanfold/worker/leases.py``) on the throwaway cluster."""

from __future__ import annotations

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
