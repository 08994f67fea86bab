"""Placement of a big fan-out's children in chunks (issue 25, ``fanfold/runtime/placement.py``).

Runtimes in one process on one PostgreSQL log (the session's ``pg_cluster``): the
tree's runtime places its children, other runtimes run the chunks (as ``fanfold
worker``s do, each a DBOS workflow; here the test hands each enqueued chunk to a
runtime). ``test_worker_dbos.py`` runs the same with worker processes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from fanfold import replay
from fanfold.db import TreeTakenOver, open_store
from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.placement import PlacementError, PlacementSettings
from fanfold.statemachine import CancelReason, SubAgentFinished


def _fan_out(n: int, child_latency: float = 0.05) -> dict[str, Any]:
    return {
        "latency": 0.0,
        "agents": [
            {
                "match": {"path": "root"},
                "replies": [
                    {
                        "tool_calls": [
                            {
                                "name": "spawn_agents",
                                "arguments": {
                                    "tasks": [{"task": f"item {i}"} for i in range(n)],
                                },
                            }
                        ]
                    },
                    {"text": "done: {{last_tool_result}}"},
                ],
            },
            {
                "match": {"depth": 1},
                "replies": [
                    {
                        "latency": child_latency,
                        "tool_calls": [
                            {"name": "submit_result", "arguments": {"result": "{{task}}"}}
                        ],
                    }
                ],
            },
        ],
    }


class _Queue:
    """A placer whose queue is a Trio channel the test reads."""

    def __init__(self) -> None:
        self.send, self.receive = trio.open_memory_channel[str](1000)
        self.enqueued: list[str] = []

    def enqueue(self, chunks: Sequence[tuple[str, str]]) -> None:
        for chunk, _root in chunks:
            self.enqueued.append(chunk)
            trio.from_thread.run_sync(self.send.send_nowait, chunk)


SETTINGS = PlacementSettings(spread_at=4, chunk=3, poll=0.05)


async def _serve_chunks(queue: _Queue, runtimes: Sequence[Runtime], ran: dict[str, Any]) -> None:
    """Hand each enqueued chunk to the next runtime in turn (as a queue's workers take
    them), each running it to rest."""
    turn = 0
    async with trio.open_nursery() as nursery:
        async for chunk in queue.receive:
            runtime = runtimes[turn % len(runtimes)]
            turn += 1
            ran[chunk] = runtime.store.owner  # type: ignore[attr-defined]
            placement = runtime.placement
            assert placement is not None
            nursery.start_soon(placement.run_chunk, chunk)


def _claims(url: str) -> dict[str, tuple[str, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT root_id, owner, epoch FROM fanfold.claims").fetchall()
    return {unit: (owner, epoch) for unit, owner, epoch in rows}


def _outcomes_in_parent(url: str, parent: str) -> list[str]:
    with open_store(url, read_only=True) as store:
        return [
            s.event.child_id
            for s in store.events(parent)
            if isinstance(s.event, SubAgentFinished)
        ]


def _check_tree(url: str, root: str, children: int) -> None:
    """Every child's outcome once in the root's log; the tree verifies."""
    got = _outcomes_in_parent(url, root)
    assert sorted(got) == sorted(f"{root}.{i}" for i in range(1, children + 1))
    assert len(got) == len(set(got))
    with open_store(url, read_only=True) as store:
        for row in store.tree(root):
            assert replay.verify(store, row.id).ok, row.id


async def test_a_big_fan_out_runs_in_chunks_on_other_runtimes(pg_url: str, tmp_path: Path) -> None:
    provider = ScriptedProvider(_fan_out(10))
    queue = _Queue()
    ran: dict[str, Any] = {}
    async with (
        Runtime.open(pg_url, provider, []) as a,
        Runtime.open(pg_url, provider, []) as b,
        Runtime.open(pg_url, provider, []) as c,
    ):
        for runtime in (a, b, c):
            runtime.use_placement(queue, SETTINGS)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve_chunks, queue, [b, c], ran)
            root = await a.start("fan out", cwd=tmp_path)
            result = await a.wait(root)
            nursery.cancel_scope.cancel()
        assert result.phase == "Idle"
        # 10 children in chunks of 3: 4 chunks, none of the children run by the tree's
        # runtime, each chunk's conversations claimed by the runtime that ran it.
        assert queue.enqueued == [
            f"chunk:{root}.1:3",
            f"chunk:{root}.4:6",
            f"chunk:{root}.7:9",
            f"chunk:{root}.10:10",
        ]
        claims = _claims(pg_url)
        for chunk, owner in ran.items():
            assert claims[chunk] == (owner, 1)
        assert {owner for owner in ran.values()} == {
            b.store.owner,  # type: ignore[attr-defined]
            c.store.owner,  # type: ignore[attr-defined]
        }
        assert claims[root][0] == a.store.owner  # type: ignore[attr-defined]
    _check_tree(pg_url, root, 10)
    with open_store(pg_url, read_only=True) as store:
        answer = store.load_state(root).history[-1].text  # type: ignore[union-attr]
    for i in range(10):
        assert f"item {i}" in answer


async def test_a_small_fan_out_runs_where_its_parent_runs(pg_url: str, tmp_path: Path) -> None:
    queue = _Queue()
    async with Runtime.open(pg_url, ScriptedProvider(_fan_out(4)), []) as a:
        a.use_placement(queue, SETTINGS)
        root = await a.start("fan out", cwd=tmp_path)
        await a.wait(root)
    assert queue.enqueued == []  # 4 is not more than spread_at
    _check_tree(pg_url, root, 4)
