"""LISTEN/NOTIFY for placement (issue 36): a placed child's end and a cancel asked of
placed children wake the runtime waiting for them at once, not at its next poll.

Every runtime here polls every 5 s, so a wake well under that is the notification's
(on the code before it, each of these waits took a whole poll). With notifications
off, or the listener's connection cut, the poll still delivers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio
from test_placement import _check_tree, _fan_out, _Queue, _serve_chunks, _served_fan_out

from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.placement import PlacementSettings

if TYPE_CHECKING:
    import psycopg
else:
    psycopg = pytest.importorskip("psycopg", reason="the postgres extra is not installed")

SLOW_POLL = PlacementSettings(spread_at=4, chunk=3, poll=5.0)
FAST = 2.5  # seconds: half the poll


async def _fan_out_timed(url: str, tmp: Path, settings: PlacementSettings) -> float:
    provider = ScriptedProvider(_fan_out(5))
    queue = _Queue()
    ran: dict[str, Any] = {}
    async with Runtime.open(url, provider, []) as a, Runtime.open(url, provider, []) as b:
        a.use_placement(queue, settings)
        b.use_placement(queue, settings)
        await trio.sleep(0.3)  # the listeners connected
        started = time.monotonic()
        root, phase = await _served_fan_out(a, queue, [b], ran, tmp)
        took = time.monotonic() - started
        assert phase == "Idle"
        assert len(ran) == 2
    _check_tree(url, root, 5)
    return took


async def test_a_placed_childs_end_wakes_its_parent_before_the_poll(
    pg_url: str, tmp_path: Path
) -> None:
    took = await _fan_out_timed(pg_url, tmp_path, SLOW_POLL)
    assert took < FAST, took


async def test_without_notifications_the_poll_still_delivers(pg_url: str, tmp_path: Path) -> None:
    quiet = PlacementSettings(spread_at=4, chunk=3, poll=0.3, listen=False)
    took = await _fan_out_timed(pg_url, tmp_path, quiet)
    assert took >= 0.3, took  # at least one poll: nothing else woke the parent


async def test_a_listener_whose_connection_is_cut_connects_again(
    pg_url: str, tmp_path: Path
) -> None:
    provider = ScriptedProvider(_fan_out(5))
    queue = _Queue()
    ran: dict[str, Any] = {}
    async with Runtime.open(pg_url, provider, []) as a, Runtime.open(pg_url, provider, []) as b:
        a.use_placement(queue, SLOW_POLL)
        b.use_placement(queue, SLOW_POLL)
        await trio.sleep(0.3)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            cut = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE query = 'LISTEN fanfold_placement' AND datname = current_database()"
            ).fetchone()
        assert cut is not None and cut[0] == 2, cut
        await trio.sleep(1.5)  # LISTEN_RETRY_S, and the new LISTEN
        started = time.monotonic()
        root, phase = await _served_fan_out(a, queue, [b], ran, tmp_path)
        assert time.monotonic() - started < FAST
        assert phase == "Idle"
    _check_tree(pg_url, root, 5)


async def test_a_cancel_wakes_the_runtime_running_the_chunk_before_the_poll(
    pg_url: str, tmp_path: Path
) -> None:
    # Children that would wait an hour for their model: only the cancel ends them, and
    # their chunk's runtime reads it at once only if notified.
    provider = ScriptedProvider(_fan_out(5, child_latency=3600))
    queue = _Queue()
    ran: dict[str, Any] = {}
    async with Runtime.open(pg_url, provider, []) as a, Runtime.open(pg_url, provider, []) as b:
        a.use_placement(queue, SLOW_POLL)
        b.use_placement(queue, SLOW_POLL)
        root = await a.start("fan out", cwd=tmp_path)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve_chunks, queue, [b], ran)
            with trio.fail_after(30):
                while {f"{root}.{i}" for i in range(1, 6)} - set(b.loaded_ids()):
                    await trio.sleep(0.02)
            await trio.sleep(0.2)  # the chunks' first reads of their cancels are done
            started = time.monotonic()
            await a.cancel(root)
            with trio.fail_after(30):
                result = await a.wait(root)
            took = time.monotonic() - started
            nursery.cancel_scope.cancel()
        assert result.phase == "Idle"
    assert took < FAST, took
    _check_tree(pg_url, root, 5)
