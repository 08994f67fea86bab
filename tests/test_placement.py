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
from typing import TYPE_CHECKING, Any

import pytest
import trio

from fanfold import replay
from fanfold.db import open_store
from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.placement import PlacementError, PlacementSettings
from fanfold.statemachine import ChildFailed, ErrorKind, SubAgentFinished

if TYPE_CHECKING:
    import psycopg
else:
    psycopg = pytest.importorskip("psycopg", reason="the postgres extra is not installed")


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
        self.gone: set[str] = set()  # chunks whose workflow ended (``ended``)
        self.asked: list[list[str]] = []

    def enqueue(self, chunks: Sequence[tuple[str, str]]) -> None:
        for chunk, _root in chunks:
            self.enqueued.append(chunk)
            trio.from_thread.run_sync(self.send.send_nowait, chunk)

    def ended(self, chunks: Sequence[str]) -> list[str]:
        self.asked.append(list(chunks))
        return [c for c in chunks if c in self.gone]


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


async def _served_fan_out(
    tree: Runtime, queue: _Queue, runners: Sequence[Runtime], ran: dict[str, Any], tmp: Path
) -> tuple[str, str]:
    """Start a fan-out on ``tree`` while ``runners`` run its chunks; return its root and
    the phase it came to rest in."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve_chunks, queue, runners, ran)
        root = await tree.start("fan out", cwd=tmp)
        with trio.fail_after(30):
            result = await tree.wait(root)
        nursery.cancel_scope.cancel()
    return root, result.phase


def _claims(url: str) -> dict[str, tuple[str, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT root_id, owner, epoch FROM fanfold.claims").fetchall()
    return {unit: (owner, epoch) for unit, owner, epoch in rows}


def _outcomes_in_parent(url: str, parent: str) -> list[str]:
    with open_store(url, read_only=True) as store:
        return [
            s.event.child_id for s in store.events(parent) if isinstance(s.event, SubAgentFinished)
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
        root, phase = await _served_fan_out(a, queue, [b, c], ran, tmp_path)
        assert phase == "Idle"
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


async def test_a_runtime_running_its_own_trees_chunks_takes_each_outcome_once(
    pg_url: str, tmp_path: Path
) -> None:
    # One worker that took both the tree and its chunks: a child's outcome reaches its
    # parent through the parent's watch only, not also in the process (that second
    # delivery stopped the worker: DuplicateChildOutcome, seen in test_worker_crash.py).
    provider = ScriptedProvider(_fan_out(10))
    queue = _Queue()
    ran: dict[str, Any] = {}
    async with Runtime.open(pg_url, provider, []) as a:
        a.use_placement(queue, SETTINGS)
        root, phase = await _served_fan_out(a, queue, [a], ran, tmp_path)
        assert phase == "Idle"
        assert len(ran) == 4
    _check_tree(pg_url, root, 10)


async def test_a_small_fan_out_runs_where_its_parent_runs(pg_url: str, tmp_path: Path) -> None:
    queue = _Queue()
    async with Runtime.open(pg_url, ScriptedProvider(_fan_out(4)), []) as a:
        a.use_placement(queue, SETTINGS)
        root = await a.start("fan out", cwd=tmp_path)
        await a.wait(root)
    assert queue.enqueued == []  # 4 is not more than spread_at
    _check_tree(pg_url, root, 4)


async def test_a_cancel_reaches_placed_children_queued_or_running(
    pg_url: str, tmp_path: Path
) -> None:
    # Children that would wait an hour for their model: only a cancel ends them.
    provider = ScriptedProvider(_fan_out(7, child_latency=3600))
    queue = _Queue()
    ran: dict[str, Any] = {}
    async with (
        Runtime.open(pg_url, provider, []) as a,
        Runtime.open(pg_url, provider, []) as b,
    ):
        a.use_placement(queue, SETTINGS)
        b.use_placement(queue, SETTINGS)
        root = await a.start("fan out", cwd=tmp_path)
        # The first chunk runs before the cancel; the others are still queued then.
        first = await queue.receive.receive()
        assert b.placement is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(b.placement.run_chunk, first)
            with trio.fail_after(30):
                while not {f"{root}.1", f"{root}.2", f"{root}.3"} <= set(b.loaded_ids()):
                    await trio.sleep(0.02)
            await a.cancel(root)
            ran[first] = True
            nursery.start_soon(_serve_chunks, queue, [b], ran)
            with trio.fail_after(30):
                result = await a.wait(root)
            nursery.cancel_scope.cancel()
        assert result.phase == "Idle"  # a cancelled turn ends; the root takes more
        assert set(ran) == {first, f"chunk:{root}.4:6", f"chunk:{root}.7:7"}
    with open_store(pg_url, read_only=True) as store:
        for i in range(1, 8):
            child = store.load_state(f"{root}.{i}")
            assert child.at_rest
            assert isinstance(child.outcome, ChildFailed), i
            assert child.outcome.kind == ErrorKind.CANCELLED, i
    _check_tree(pg_url, root, 7)


async def test_a_chunk_taken_over_from_a_stopped_runtime_finishes_once(
    pg_url: str, tmp_path: Path
) -> None:
    provider = ScriptedProvider(_fan_out(6, child_latency=0.3))
    queue = _Queue()
    async with Runtime.open(pg_url, provider, []) as a:
        a.use_placement(queue, SETTINGS)
        root = await a.start("fan out", cwd=tmp_path)
        chunks = [await queue.receive.receive(), await queue.receive.receive()]
        # Runtime b takes the first chunk and stops with its children mid-call (as a
        # worker killed or drained would).
        async with Runtime.open(pg_url, provider, []) as b:
            b.use_placement(queue, SETTINGS)
            assert b.placement is not None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(b.placement.run_chunk, chunks[0])
                with trio.fail_after(30):
                    while not {f"{root}.1", f"{root}.2"} <= set(b.loaded_ids()):
                        await trio.sleep(0.02)
                nursery.cancel_scope.cancel()
            late = b.store
        # Runtime c runs both chunks: the first resumed from the log, under a new claim.
        async with Runtime.open(pg_url, provider, []) as c:
            c.use_placement(queue, SETTINGS)
            assert c.placement is not None
            async with trio.open_nursery() as nursery:
                for chunk in chunks:
                    nursery.start_soon(c.placement.run_chunk, chunk)
                with trio.fail_after(30):
                    result = await a.wait(root)
        assert result.phase == "Idle"
        owner_c = c.store.owner  # type: ignore[attr-defined]
    claims = _claims(pg_url)
    # b's claim (epoch 1), then c's: b's store, had it written again, was fenced.
    assert claims[chunks[0]] == (owner_c, 2)
    assert late.owner != owner_c  # type: ignore[attr-defined]
    with open_store(pg_url, read_only=True) as store:
        resumed = [type(s.event).__name__ for s in store.events(f"{root}.1")]
    assert "RuntimeResumed" in resumed
    _check_tree(pg_url, root, 6)


async def test_a_restarted_tree_watches_its_placed_children_and_takes_each_outcome_once(
    pg_url: str, tmp_path: Path
) -> None:
    # The second chunk's children are slower: at the restart the first chunk's are at
    # rest and the second's still running (the restart's re-delivery of the ended ones
    # and the watch of the placed ones met there: each outcome was delivered twice).
    script = _fan_out(6, child_latency=0.3)
    slower = json.loads(json.dumps(script["agents"][1]))
    slower["match"] = {"task": "item [345]"}
    slower["replies"][0]["latency"] = 2.0
    script["agents"].insert(1, slower)
    provider = ScriptedProvider(script)
    queue = _Queue()
    async with Runtime.open(pg_url, provider, []) as b:
        b.use_placement(queue, SETTINGS)
        assert b.placement is not None
        async with trio.open_nursery() as chunks:
            # The tree's runtime stops while its chunks run elsewhere.
            async with Runtime.open(pg_url, provider, []) as a:
                a.use_placement(queue, SETTINGS)
                root = await a.start("fan out", cwd=tmp_path)
                for _ in range(2):
                    chunks.start_soon(b.placement.run_chunk, await queue.receive.receive())
            # Meanwhile the first chunk finishes; then another runtime resumes the tree.
            with trio.fail_after(30):
                while (
                    len(
                        await trio.to_thread.run_sync(
                            b.store.at_rest_among,  # type: ignore[attr-defined]
                            [f"{root}.{i}" for i in range(1, 4)],
                        )
                    )
                    < 3
                ):
                    await trio.sleep(0.05)
            async with Runtime.open(pg_url, provider, []) as a2:
                a2.use_placement(queue, SETTINGS)
                assert (
                    await trio.to_thread.run_sync(
                        b.store.at_rest_among,  # type: ignore[attr-defined]
                        [f"{root}.{i}" for i in range(4, 7)],
                    )
                    == []
                )
                resumed = await a2.resume([root], claimed=True)
                assert resumed == [root]  # not the placed children: the chunks' runtime runs them
                with trio.fail_after(30):
                    result = await a2.wait(root)
                assert result.phase == "Idle"
    # The chunks were enqueued again (the same ids: DBOS keeps the first).
    assert len(queue.enqueued) == 4
    _check_tree(pg_url, root, 6)


async def test_resume_without_placement_takes_the_chunks_back(pg_url: str, tmp_path: Path) -> None:
    provider = ScriptedProvider(_fan_out(6, child_latency=0.3))
    queue = _Queue()
    async with Runtime.open(pg_url, provider, []) as a:
        a.use_placement(queue, SETTINGS)
        root = await a.start("fan out", cwd=tmp_path)
        first = await queue.receive.receive()
        async with Runtime.open(pg_url, provider, []) as b:
            b.use_placement(queue, SETTINGS)
            assert b.placement is not None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(b.placement.run_chunk, first)
                with trio.fail_after(30):
                    while f"{root}.1" not in b.loaded_ids():
                        await trio.sleep(0.02)
                nursery.cancel_scope.cancel()
            late = b.store
    # `fanfold resume` (no workers): every unfinished conversation of the tree, the
    # placed ones too, runs here; the chunk's previous runtime is fenced.
    async with Runtime.open(pg_url, provider, []) as alone:
        resumed = await alone.resume([root])
        assert root in resumed and f"{root}.1" in resumed
        with trio.fail_after(30):
            assert (await alone.wait(root)).phase == "Idle"
    claims = _claims(pg_url)
    assert claims[first][0] != late.owner  # type: ignore[attr-defined]
    _check_tree(pg_url, root, 6)


async def test_a_chunk_whose_rows_are_not_a_parents_spawns_is_refused(
    pg_url: str, tmp_path: Path
) -> None:
    provider = ScriptedProvider(_fan_out(5))
    queue = _Queue()
    async with Runtime.open(pg_url, provider, []) as a:
        a.use_placement(queue, SETTINGS)
        with pytest.raises(PlacementError, match="no chunk"):
            assert a.placement is not None
            await a.placement.run_chunk("chunk:nothing.1:3")
        root = await a.start("fan out", cwd=tmp_path)
        chunk = await queue.receive.receive()
        second = await queue.receive.receive()
        with psycopg.connect(pg_url) as conn:
            # Another child's spawn in the first chunk's row: refused, nothing created.
            other = conn.execute(
                "SELECT effect FROM fanfold.placements WHERE child_id = %s", (f"{root}.4",)
            ).fetchone()
            assert other is not None
            conn.execute(
                "UPDATE fanfold.placements SET effect = %s WHERE child_id = %s",
                (other[0], f"{root}.1"),
            )
            conn.execute(
                "UPDATE fanfold.placements SET effect = %s WHERE chunk_id = %s",
                ('{"not": "a spawn"}', second),
            )
        placement = a.placement
        assert placement is not None
        with pytest.raises(PlacementError, match=r"row for '.*\.1' is not a spawn"):
            await placement.run_chunk(chunk)
        with pytest.raises(PlacementError, match="is not a spawn"):
            await placement.run_chunk(second)
        with open_store(pg_url, read_only=True) as store:
            assert [row.id for row in store.tree(root)] == [root]
        await a.cancel(root)


async def test_a_runtime_whose_chunk_is_taken_drops_that_chunk_and_runs_its_others(
    pg_url: str, tmp_path: Path
) -> None:
    from fanfold.runtime import TreeDropped

    provider = ScriptedProvider(_fan_out(6, child_latency=0.5))
    queue = _Queue()
    async with (
        Runtime.open(pg_url, provider, []) as a,
        Runtime.open(pg_url, provider, []) as b,
        Runtime.open(pg_url, provider, []) as c,
    ):
        for runtime in (a, b, c):
            runtime.use_placement(queue, SETTINGS)
        assert b.placement is not None and c.placement is not None
        root = await a.start("fan out", cwd=tmp_path)
        first, second = await queue.receive.receive(), await queue.receive.receive()
        outcome: dict[str, BaseException | list[str]] = {}

        async def run(placement: Any, chunk: str, key: str) -> None:
            try:
                outcome[key] = await placement.run_chunk(chunk)
            except TreeDropped as exc:
                outcome[key] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, b.placement, first, "b1")
            nursery.start_soon(run, b.placement, second, "b2")
            with trio.fail_after(30):
                while f"{root}.1" not in b.loaded_ids():
                    await trio.sleep(0.02)
            # c claims the first chunk while b runs it (as a claim from outside the
            # workers would): b's next commit of it is refused and b drops it.
            nursery.start_soon(run, c.placement, first, "c1")
            with trio.fail_after(30):
                result = await a.wait(root)
        assert result.phase == "Idle"
    assert isinstance(outcome["b1"], TreeDropped), outcome
    assert outcome["b2"] == [f"{root}.4", f"{root}.5", f"{root}.6"]
    assert outcome["c1"] == [f"{root}.1", f"{root}.2", f"{root}.3"]
    _check_tree(pg_url, root, 6)


async def test_a_chunk_no_worker_will_run_is_taken_back_by_its_parents_runtime(
    pg_url: str, tmp_path: Path
) -> None:
    # A worker that cannot run a chunk (the tree is not under its key, or it lacks the
    # tree's tools) ends its workflow with the reason: its children must not leave
    # their parent waiting for ever. The parent's runtime asks the queue which chunks
    # of children still due have ended, and runs those children itself.
    provider = ScriptedProvider(_fan_out(6, child_latency=0.3))
    queue = _Queue()
    settings = PlacementSettings(spread_at=4, chunk=3, poll=0.05, orphans_every=2)
    async with (
        Runtime.open(pg_url, provider, []) as a,
        Runtime.open(pg_url, provider, []) as b,
    ):
        a.use_placement(queue, settings)
        b.use_placement(queue, settings)
        assert b.placement is not None
        root = await a.start("fan out", cwd=tmp_path)
        first, second = await queue.receive.receive(), await queue.receive.receive()
        async with trio.open_nursery() as nursery:
            # b runs the first chunk; the second ends unrun (a worker refused it), and
            # so does the first, later, its run cut short mid-flight.
            nursery.start_soon(b.placement.run_chunk, first)
            queue.gone.add(second)
            with trio.fail_after(30):
                while f"{root}.1" not in b.loaded_ids():
                    await trio.sleep(0.02)
            nursery.cancel_scope.cancel()
        queue.gone.add(first)
        with trio.fail_after(30):
            result = await a.wait(root)
        assert result.phase == "Idle"
        assert any(second in asked for asked in queue.asked)
    claims = _claims(pg_url)
    owner_a = a.store.owner  # type: ignore[attr-defined]
    assert claims[second][0] == owner_a and claims[first] == (owner_a, 2)
    _check_tree(pg_url, root, 6)


async def test_outcomes_read_together_reach_their_parent_in_one_commit(
    pg_url: str, tmp_path: Path
) -> None:
    # The tree's runtime reads its placed children's outcomes every second: all ten
    # children (chunks on another runtime, 50 ms each) are at rest by its first read
    # after the placement. Their outcomes are then delivered together and the parent's
    # ten steps committed as one batch; delivered one by one, each read of a child's
    # state let the parent commit alone (a transaction per outcome: with 128 children
    # 128 write transactions and 1.3 s of fan-in, bench/README.md).
    provider = ScriptedProvider(_fan_out(10))
    queue = _Queue()
    ran: dict[str, Any] = {}
    async with (
        Runtime.open(pg_url, provider, []) as a,
        Runtime.open(pg_url, provider, []) as b,
    ):
        # The poll's reads alone (no notification wakes it at each child's end:
        # test_placement_notify.py).
        a.use_placement(queue, PlacementSettings(spread_at=4, chunk=3, poll=1.0, listen=False))
        b.use_placement(queue, SETTINGS)
        root, phase = await _served_fan_out(a, queue, [b], ran, tmp_path)
        assert phase == "Idle"
        assert len(ran) == 4
    _check_tree(pg_url, root, 10)
    with psycopg.connect(pg_url) as conn:
        commits = conn.execute(
            "SELECT count(DISTINCT xmin::text) FROM fanfold.events "
            "WHERE conversation_id = %s AND type = 'SubAgentFinished'",
            (root,),
        ).fetchone()
    # One read found them all (two if a child came to rest just after it).
    assert commits is not None and commits[0] <= 2, commits


async def test_a_cancel_reaches_children_taken_back_before_or_after_it(
    pg_url: str, tmp_path: Path
) -> None:
    # Children that would wait an hour: only a cancel ends them. The first chunk is
    # taken back before the parent is cancelled (the cancel must reach its children
    # in the process, not a row nobody reads), the second after (the rows written
    # while it was placed must reach them).
    provider = ScriptedProvider(_fan_out(6, child_latency=3600))
    queue = _Queue()
    settings = PlacementSettings(spread_at=4, chunk=3, poll=0.05, orphans_every=2)
    async with Runtime.open(pg_url, provider, []) as a:
        a.use_placement(queue, settings)
        root = await a.start("fan out", cwd=tmp_path)
        first, second = await queue.receive.receive(), await queue.receive.receive()
        queue.gone.add(first)
        with trio.fail_after(30):
            while f"{root}.1" not in a.loaded_ids():
                await trio.sleep(0.02)
        await a.cancel(root)
        queue.gone.add(second)
        with trio.fail_after(30):
            result = await a.wait(root)
        assert result.phase == "Idle"
    with open_store(pg_url, read_only=True) as store:
        for i in range(1, 7):
            child = store.load_state(f"{root}.{i}")
            assert isinstance(child.outcome, ChildFailed), i
            assert child.outcome.kind == ErrorKind.CANCELLED, i
    _check_tree(pg_url, root, 6)


async def test_a_chunk_taken_over_by_its_trees_runtime_delivers_the_outcomes_its_runner_left(
    pg_url: str, tmp_path: Path
) -> None:
    # Issue 32 item 3. Runtime b runs both chunks; two children of the first and the
    # whole second come to rest there, then b stops (as a worker killed) with the third
    # child mid-call. The tree's runtime, whose watch has not read the log since (its
    # poll is long), takes the first chunk over (a worker whose takeover re-enqueued the
    # dead one's chunk dequeues it). The outcomes the runner left in the log must reach
    # the parent: the chunk's runner here left them to the watch, and the watch's
    # delivery was swallowed as the chunk runner's own (``forwards``): the root never
    # ended (77 and 196 of 1,500 outcomes lost in the run).
    script = _fan_out(6)
    slow = json.loads(json.dumps(script["agents"][1]))
    slow["match"] = {"task": "item 2"}
    slow["replies"][0]["latency"] = 2.0
    script["agents"].insert(1, slow)
    provider = ScriptedProvider(script)
    queue = _Queue()
    async with Runtime.open(pg_url, provider, []) as a:
        # The tree's watch reads the log only when woken: by a placement, a chunk run
        # here, or an outcome of a child run here.
        a.use_placement(queue, PlacementSettings(spread_at=4, chunk=3, poll=60.0))
        assert a.placement is not None
        root = await a.start("fan out", cwd=tmp_path)
        first, second = await queue.receive.receive(), await queue.receive.receive()
        async with Runtime.open(pg_url, provider, []) as b:
            b.use_placement(queue, SETTINGS)
            assert b.placement is not None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(b.placement.run_chunk, first)
                nursery.start_soon(b.placement.run_chunk, second)
                ended = [f"{root}.{i}" for i in (1, 2, 4, 5, 6)]
                with trio.fail_after(30):
                    while len(await trio.to_thread.run_sync(b.store.at_rest_among, ended)) < 5:  # type: ignore[attr-defined]
                        await trio.sleep(0.02)
                nursery.cancel_scope.cancel()
        assert a.placement.watched  # none delivered yet: the watch slept
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.placement.run_chunk, first)
            with trio.fail_after(20):
                result = await a.wait(root)
        assert result.phase == "Idle"
        assert a.placement.watched == {}
    with open_store(pg_url, read_only=True) as store:
        resumed = [type(s.event).__name__ for s in store.events(f"{root}.3")]
    assert "RuntimeResumed" in resumed  # the third child was mid-call when b stopped
    _check_tree(pg_url, root, 6)
