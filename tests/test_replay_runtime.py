"""Replay of logs the real runtime wrote: every live transition is reproduced, and a
fork continues through the runtime like any stored conversation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from runtime_helpers import open_runtime, reply, script, spawn, submit, think

from fanfold import replay
from fanfold.db import Store
from fanfold.db.provenance import UserKey
from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.statemachine import (
    AssistantMessage,
    Conversation,
    ConversationForked,
    Effect,
    Event,
    Idle,
    Limits,
    LlmRequesting,
    UserMessage,
)


@attrs.define
class Recorder:
    """The runtime's observer: every live transition, per conversation, in order."""

    seen: dict[str, list[tuple[Event, tuple[Effect, ...], Conversation]]] = attrs.field(
        factory=dict
    )

    def __call__(
        self, before: Conversation, after: Conversation, event: Event, effects: tuple[Effect, ...]
    ) -> None:
        self.seen.setdefault(after.id, []).append((event, effects, after))

    def last_states(self) -> dict[str, Conversation]:
        """The state each conversation was last seen in: the runtime's live states
        (conversations come to rest are unloaded, so ``running()`` no longer has them)."""
        return {cid: steps[-1][2] for cid, steps in self.seen.items()}


Drive = Callable[[Runtime, Path], Awaitable[str]]


async def _answer(runtime: Runtime, cwd: Path) -> str:
    root = await runtime.start("go", cwd=cwd)
    await runtime.wait(root)
    return root


async def _cancel_after_3s(runtime: Runtime, cwd: Path) -> str:
    root = await runtime.start("go", cwd=cwd)
    await trio.sleep(3.0)
    await runtime.cancel(root)
    await runtime.wait(root)
    return root


async def _error_then_again(runtime: Runtime, cwd: Path) -> str:
    root = await runtime.start("go", cwd=cwd)
    await runtime.wait(root)
    await runtime.send(root, "again")
    await runtime.wait(root)
    return root


RATE_LIMITED = {"kind": "rate_limit", "message": "slow down", "retry_after": 2.0}
DOWN = {"kind": "server_error", "message": "503", "retry_after": 1.0}
AUTH = {"kind": "auth", "message": "bad key"}

SCENARIOS: dict[str, tuple[ScriptedProvider, Limits, Drive]] = {
    "fan-out and fan-in": (
        script(
            1.0,
            root=[reply("delegating", spawn("a", "b", "c")), reply("all done")],
            c1=[reply("", think()), reply("", submit("result a"))],
            c2=[reply("", think()), reply("", submit("result b"))],
            c3=[reply("", think()), reply("", submit("result c"))],
        ),
        Limits(),
        _answer,
    ),
    "a child fails": (
        script(
            1.0,
            root=[reply("", spawn("ok", "broken")), reply("summary")],
            c1=[reply("", submit("one"))],
            c2=[reply("", ("submit_error", {"error": "cannot do it"}))],
        ),
        Limits(),
        _answer,
    ),
    "a child times out": (
        script(
            1.0,
            root=[reply("", spawn({"task": "slow", "timeout": 5}, "fast")), reply("done")],
            c1=[reply("", think(), latency=100.0)],
            c2=[reply("", submit("quick"))],
        ),
        Limits(),
        _answer,
    ),
    "cancel with children running": (
        script(
            1.0,
            root=[reply("", spawn("sleepy", "busy", "queued"))],
            c1=[reply("", think(), latency=50.0)],
            c2=[reply("", think()), reply("", think(), latency=500.0)],
            c3=[reply("", submit("never"))],
        ),
        Limits(max_concurrent=2),
        _cancel_after_3s,
    ),
    "retries then success": (
        script(1.0, root=[reply("finally", fail_first=[RATE_LIMITED, RATE_LIMITED])]),
        Limits(),
        _answer,
    ),
    "retries exhausted in a child": (
        script(
            1.0,
            root=[reply("", spawn("doomed", "fine")), reply("ok")],
            c1=[reply("never", fail_first=[DOWN, DOWN, DOWN])],
            c2=[reply("", submit("fine result"))],
        ),
        Limits(max_attempts=3),
        _answer,
    ),
    "an error, then a new turn": (
        script(1.0, root=[reply("no", fail_first=[AUTH]), reply("yes")]),
        Limits(),
        _error_then_again,
    ),
    "grace round past the round limit": (
        script(1.0, root=[reply("", think()), reply("", think()), reply("forced answer")]),
        Limits(max_rounds=2),
        _answer,
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_runtime_logs_replay_to_every_live_state_and_effect(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, name: str
) -> None:
    provider, limits, drive = SCENARIOS[name]
    recorder = Recorder()
    async with open_runtime(tmp_path, provider, limits=limits, observer=recorder) as runtime:
        root = await drive(runtime, tmp_path)
        live = recorder.last_states()
    with Store.open(tmp_path / "log.db") as store:
        report = replay.verify(store, root, tree=True)
        assert report.ok, report.summary()
        assert report.final_states() == live
        assert set(live) == set(recorder.seen)
        for cid, observed in recorder.seen.items():
            replayed = [(s.event, s.effects, s.after_state) for s in replay.steps(store, cid)]
            assert replayed == observed, cid
            assert all(s.matches for s in replay.steps(store, cid))
        # The interleaved tree holds every step once, in recorded-time order.
        walked = list(replay.steps(store, root, tree=True))
        assert len(walked) == report.events == sum(map(len, recorder.seen.values()))
        assert [s.at for s in walked] == sorted(s.at for s in walked)


async def test_a_fork_continues_with_a_new_message_and_the_source_is_untouched(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = script(1.0, root=[reply("first answer"), reply("second answer")])
    async with open_runtime(tmp_path, provider) as runtime:
        source = await runtime.start("one", cwd=tmp_path)
        await runtime.wait(source)
        await runtime.send(source, "two")
        await runtime.wait(source)
    with Store.open(tmp_path / "log.db") as store:
        before = store.raw_log(source)
        rest = [s.seq for s in replay.steps(store, source) if isinstance(s.after_state.phase, Idle)]
        assert rest == [0, 2, 4]
        # Seq 3 has a model call in flight: this user's own tree is forked whole there
        # (issue 24), a tree to be resumed; a tree from elsewhere too (issue 34), into
        # a tree that records no provider: it goes on with its user's.
        mid = replay.fork(store, source, 3, new_id="mid")
        assert isinstance(store.load_state(mid).phase, LlmRequesting)
        foreign = UserKey.generate()  # another user's
        theirs = replay.fork(store, source, 3, key=foreign, new_id="theirs")
        record = store.tree_record(theirs)
        assert record is not None and record.provider is None
        fork = replay.fork(store, source, 2, new_id="forked")
        row = store.conversation(fork)
        assert (row.forked_from, row.forked_at_seq, row.root_id) == (source, 2, fork)
        (first,) = store.events(fork)
        assert isinstance(first.event, ConversationForked)
        assert first.event.state == replay.state_at(store, source, 2)
    # The runtime picks the fork up from the log and goes on from the first answer, here
    # with another script: its next round delegates to a sub-agent.
    other = script(1.0, root=[reply("unused"), reply("", spawn("check it")), reply("checked")])
    recorder = Recorder()
    async with open_runtime(tmp_path, other, observer=recorder) as runtime:
        await runtime.send(fork, "something else")
        result = await runtime.wait(fork)
        forked_live = recorder.last_states()
    assert result.text == "checked"  # its 2nd round spawned a child, the 3rd answered
    with Store.open(tmp_path / "log.db") as store:
        history = store.load_state(fork).history
        assert [type(m).__name__ for m in history[:4]] == [
            "UserMessage",
            "AssistantMessage",
            "UserMessage",
            "AssistantMessage",
        ]
        assert history[2] == UserMessage("something else")
        assert isinstance(history[1], AssistantMessage) and history[1].text == "first answer"
        report = replay.verify(store, fork, tree=True)
        assert report.ok, report.summary()
        assert [r.conversation_id for r in report.results] == [fork, f"{fork}.1"]
        assert report.final_states() == forked_live
        # The source did not move.
        assert store.raw_log(source) == before
        assert replay.verify(store, source, tree=True).ok


async def test_verify_reads_a_log_while_the_runtime_writes_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = script(
        1.0,
        root=[reply("", spawn("a", "b")), reply("done")],
        c1=[reply("", think(), latency=5.0), reply("", submit("a"))],
        c2=[reply("", submit("b"))],
    )
    reports: list[Any] = []
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await trio.sleep(3.0)
        reports.append(replay.verify(runtime.store, root, tree=True))
        await runtime.wait(root)
    assert reports[0].ok, reports[0].summary()
    assert reports[0].result(root).final_state.phase.__class__.__name__ == "AwaitingSubAgents"


async def test_a_log_resumed_after_a_stop_replays(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Stopped mid-flight, resumed by a new runtime: RuntimeResumed and the re-issued
    effects replay like everything else."""
    provider = script(
        1.0,
        root=[reply("", spawn("a", "b")), reply("done")],
        c1=[reply("", think()), reply("", submit("a"))],
        c2=[reply("", submit("b"), latency=5.0)],
    )
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await trio.sleep(2.5)  # the root waits, r.1 is thinking, r.2 is calling the model
    recorder = Recorder()
    async with open_runtime(tmp_path, provider, observer=recorder) as runtime:
        resumed = await runtime.resume()
        await runtime.wait(root)
        live = recorder.last_states()
    assert root in resumed
    with Store.open(tmp_path / "log.db") as store:
        report = replay.verify(store, root, tree=True)
        assert report.ok, report.summary()
        assert {cid: report.final_states()[cid] for cid in live} == live
        kinds = [type(s.event).__name__ for s in replay.steps(store, root, tree=True)]
        assert kinds.count("RuntimeResumed") == len(resumed)
