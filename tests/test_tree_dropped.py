"""A runtime whose tree was taken over drops that tree and goes on with the others
(issue 25: ``TreeTakenOver``, DESIGN.md "Per-tree claims (fencing epoch)").

The runtime-level test runs two runtimes on one PostgreSQL log (``pg_url``, a database
of the session's throwaway cluster); the writer's own rule is checked without a
database (an ``append`` that refuses a tree as a PostgreSQL log does).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from click.testing import CliRunner
from runtime_helpers import reply, spawn, submit

from fanfold.cli import cli
from fanfold.db import Step, TreeTakenOver, claim_unit, open_store
from fanfold.providers.base import CallContext, ProviderError
from fanfold.providers.scripted import ScriptedProvider
from fanfold.replay import verify
from fanfold.runtime import Runtime, TreeDropped
from fanfold.runtime.writer import LogWriter
from fanfold.statemachine import (
    ConversationCreated,
    ModelReply,
    ModelRequest,
    SubAgentFinished,
    start,
)

SCRIPT: dict[str, Any] = {
    "latency": 0.01,
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                reply("", spawn("count", "count again")),
                reply("the answer is {{last_tool_result}}"),
            ],
        },
        {"match": {"depth": 1}, "replies": [reply("", submit("3"))]},
    ],
}


class HeldChildren:
    """The script's replies, at once; every sub-agent's held until ``release`` is
    set. ``all_held`` is set once ``expected`` sub-agent calls wait."""

    def __init__(self, expected: int) -> None:
        self.script = ScriptedProvider(SCRIPT)
        self.release = trio.Event()
        self.all_held = trio.Event()
        self.expected = expected
        self.held = 0

    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply:
        _, outcome = self.script.reply_after(request, context)
        if context.depth > 0:
            self.held += 1
            if self.held == self.expected:
                self.all_held.set()
            await self.release.wait()
        if isinstance(outcome, ProviderError):
            raise outcome
        return outcome


@pytest.fixture
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's data folder (the key, a PostgreSQL log's JSON log), per test."""
    home = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    monkeypatch.delenv("FANFOLD_DB", raising=False)
    return home


async def test_a_runtime_drops_a_tree_taken_over_and_goes_on_with_the_others(
    tmp_path: Path, pg_url: str, data_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runtime A runs two trees, their children waiting for the model. Runtime B claims
    one (``resume([root], claimed=True)``: a takeover), its children waiting in B too.
    When the children's replies reach A, its batch holds steps of both trees and is
    refused whole (``TreeTakenOver``): A drops the taken tree (its waiter hears
    ``TreeDropped``, and so does a later ``wait``), writes the other tree's steps again
    alone, finishes that tree, and starts another; B finishes the taken one. Each
    child's outcome is in its parent's log once; both trees replay identically."""
    from fanfold.db.postgres import PostgresStore

    batches: list[tuple[str, list[str], str]] = []  # owner, trees, written or refused
    append = PostgresStore.append

    def recorded(store: PostgresStore, steps: Sequence[Step]) -> list[tuple[int, int]]:
        trees = sorted({claim_unit(step.state, {}) for step in steps})
        try:
            written = append(store, steps)
        except TreeTakenOver:
            batches.append((store.owner, trees, "refused"))
            raise
        batches.append((store.owner, trees, "written"))
        return written

    monkeypatch.setattr(PostgresStore, "append", recorded)
    held = HeldChildren(expected=4)
    dropped: list[BaseException] = []

    async def wait_for(runtime: Runtime, root: str) -> None:
        try:
            await runtime.wait(root)
        except TreeDropped as exc:
            dropped.append(exc)

    async with Runtime.open(pg_url, held, []) as a, trio.open_nursery() as nursery:
        taken = await a.start("one", cwd=tmp_path)
        kept = await a.start("two", cwd=tmp_path)
        await held.all_held.wait()  # both trees' children wait for their model in A
        nursery.start_soon(wait_for, a, taken)  # as a worker's workflow thread waits
        in_b = HeldChildren(expected=2)
        async with Runtime.open(pg_url, in_b, []) as b:
            resumed = await b.resume([taken], claimed=True)
            assert sorted(resumed) == [taken, f"{taken}.1", f"{taken}.2"]
            await in_b.all_held.wait()  # B's children wait for their model too
            held.release.set()
            assert (await a.wait(kept)).text.startswith("the answer is {")
            assert [type(e) for e in dropped] == [TreeDropped]
            assert isinstance(dropped[0], TreeTakenOver) and dropped[0].root_id == taken
            assert isinstance(dropped[0].__cause__, TreeTakenOver)
            assert not [s for s in a.running() if s.root_id == taken]
            with pytest.raises(TreeDropped):
                await a.wait(f"{taken}.1")  # running in the log, and not A's any more
            in_b.release.set()
            assert (await b.wait(taken)).text.startswith("the answer is {")
        # A goes on taking new work.
        third = await a.start("three", cwd=tmp_path)
        assert (await a.wait(third)).text.startswith("the answer is {")
        a_owner = a.store.owner  # type: ignore[attr-defined]

    # A's batch of the four replies was refused whole, then written without the taken
    # tree's steps; nothing of A's was written for that tree after B claimed it.
    mine = [(trees, outcome) for owner, trees, outcome in batches if owner == a_owner]
    refused = mine.index((sorted([taken, kept]), "refused"))
    assert mine[refused + 1] == ([kept], "written")
    assert all(taken not in trees for trees, outcome in mine[refused + 1 :] if outcome == "written")
    with open_store(pg_url, read_only=True) as store:
        for root in (taken, kept, third):
            assert store.conversation(root).status.value == "idle"
            outcomes = [
                e.event.child_id
                for e in store.events(root)
                if isinstance(e.event, SubAgentFinished)
            ]
            assert sorted(outcomes) == [f"{root}.1", f"{root}.2"], (root, outcomes)
            assert verify(store, root, tree=True).ok, root
    for root in (taken, kept):
        done = CliRunner().invoke(cli, ["replay", root, "--verify", "--tree", "--db", pg_url])
        assert done.exit_code == 0, done.output


def _step(root: str) -> Step:
    """The creation step of a root ``root`` (its own tree, its claim unit)."""
    created = ConversationCreated(conversation_id=root, cwd="/", task="t")
    state, effects = start(created)
    return Step(root, 0, created, effects, state, 0.0)


async def test_the_writer_writes_a_refused_batch_again_without_the_taken_tree() -> None:
    """The writer's rule, without a database: a batch refused for tree ``x`` is
    written again without every submission holding a step of ``x`` (each told
    through ``on_drop``, its ``on_commit`` never called), and what was queued for the
    next batch meanwhile loses ``x``'s too; with nobody to tell (``taken_over`` None)
    the refusal propagates as before."""
    x, y, z = _step("x"), _step("y"), _step("z")
    written: list[list[str]] = []
    told: list[str] = []
    writer: LogWriter

    def append(steps: Sequence[Step]) -> list[tuple[int, int]]:
        ids = [s.conversation_id for s in steps]
        if "x" in ids:
            writer.submit([x], lambda _: told.append("next x committed"), told_drop("next x"))
            raise TreeTakenOver("x", "tree 'x' was taken over")
        written.append(ids)
        return [(1, 0)] * len(steps)

    def told_drop(name: str) -> Any:
        return lambda taken: told.append(f"{name} dropped ({taken.root_id})")

    writer = LogWriter(append, threaded=False)
    writer.taken_over = lambda taken: told.append(f"taken over: {taken.root_id}")
    writer.submit([y], lambda r: told.append(f"y committed {list(r)}"), told_drop("y"))
    writer.submit([x], lambda _: told.append("x committed"), told_drop("x"))
    writer.submit([z], lambda r: told.append(f"z committed {list(r)}"))
    await writer.write_batch()
    assert written == [["y", "z"]]
    assert told == [
        "taken over: x",
        "x dropped (x)",
        "next x dropped (x)",
        "y committed [(1, 0)]",
        "z committed [(1, 0)]",
    ]
    assert not writer.pending
    assert writer.statistics().steps == 2

    # ``commit`` of a dropped tree raises TreeDropped; without ``taken_over`` the
    # refusal stops the writer's caller, as it always did.
    heard: list[BaseException] = []

    async def commit_x() -> None:
        try:
            await writer.commit(x)
        except TreeDropped as exc:
            heard.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(commit_x)
        await trio.testing.wait_all_tasks_blocked()
        await writer.write_batch()
    assert [type(e) for e in heard] == [TreeDropped]
    bare = LogWriter(append, threaded=False)
    bare.submit([x], lambda _: None)
    with pytest.raises(TreeTakenOver):
        await bare.write_batch()

    # A refusal naming a tree the batch does not hold is not written again (it would
    # be refused for ever): it propagates.
    def refuse_w(steps: Sequence[Step]) -> list[tuple[int, int]]:
        raise TreeTakenOver("w", "tree 'w' was taken over")

    odd = LogWriter(refuse_w, threaded=False)
    odd.taken_over = lambda taken: None
    odd.submit([y], lambda _: None)
    with pytest.raises(TreeTakenOver):
        await odd.write_batch()
