"""Execution modes and permissions through the real runtime (scripted provider, real
log): each mode with a cancel, and with a restart in the middle."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from runtime_helpers import open_runtime, reply, script, spawn, submit, think

from fanfold.db import Step, Store
from fanfold.runtime import Runtime
from fanfold.statemachine import ErrorKind, Failed, Limits
from fanfold.statemachine.agent_defs import AgentDefinition
from fanfold.statemachine.permissions import Rule


def _spawn(mode: dict[str, Any], *tasks: str) -> tuple[str, dict[str, Any]]:
    return ("spawn_agents", {"tasks": [{"task": t} for t in tasks], **mode})


async def _run_until_cut(
    tmp_path: Path,
    provider: Any,
    cut: Callable[[Sequence[Step]], bool],
    drive: Callable[[Runtime], Awaitable[None]],
) -> None:
    """Run ``drive``; stop the runtime once a committed batch satisfies ``cut``,
    before any effect of that batch runs (as tests/test_runtime_restart.py does)."""
    async with open_runtime(tmp_path, provider) as runtime:
        append = runtime.store.append

        def cutting(steps: Sequence[Step]) -> Any:
            reported = append(steps)
            if cut(steps):
                runtime._nursery.cancel_scope.cancel()
            return reported

        runtime.writer._append = cutting
        await drive(runtime)
        await trio.sleep_forever()


def _tree(tmp_path: Path, root_id: str) -> dict[str, Any]:
    with Store.open(tmp_path / "log.db") as store:
        return {row.id: store.load_state(row.id) for row in store.tree(root_id)}


async def test_sequential_survives_a_restart_between_steps(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = script(
        1.0,
        root=[reply("", _spawn({"mode": "sequential"}, "one", "two", "three")), reply("done")],
        c1=[reply("", submit("first result"))],
        c2=[reply("", think(), latency=5.0), reply("", submit("second result"))],
        c3=[reply("", submit("third result"))],
    )

    async def drive(runtime: Runtime) -> None:
        await runtime.start("go", cwd=tmp_path)

    def second_started(steps: Sequence[Step]) -> bool:
        return any(s.conversation_id.endswith(".2") and s.seq == 0 for s in steps)

    await _run_until_cut(tmp_path, provider, second_started, drive)
    async with open_runtime(tmp_path, provider) as runtime:
        (root_id,) = [r for r in await runtime.resume() if "." not in r]
        result = await runtime.wait(root_id)
    assert result.phase == "Idle"
    states = _tree(tmp_path, root_id)
    children = [states[f"{root_id}.{n}"] for n in (1, 2, 3)]
    assert [c.phase.result for c in children] == ["first result", "second result", "third result"]
    assert "first result" in (children[1].task or "")
    assert "second result" in (children[2].task or "") and "first result" in (
        children[2].task or ""
    )


async def test_a_cancel_in_the_middle_of_a_sequence_leaves_the_rest_unstarted(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = script(
        1.0,
        root=[reply("", _spawn({"mode": "sequential"}, "one", "two"))],
        c1=[reply("", think(), latency=50.0)],
        c2=[reply("", submit("never"))],
    )
    async with open_runtime(tmp_path, provider) as runtime:
        root_id = await runtime.start("go", cwd=tmp_path)
        await trio.sleep(5.0)
        await runtime.cancel(root_id)
        result = await runtime.wait(root_id)
    assert result.phase == "Idle"
    states = _tree(tmp_path, root_id)
    assert set(states) == {root_id, f"{root_id}.1"}  # the second step was never created
    first = states[f"{root_id}.1"].phase
    assert isinstance(first, Failed) and first.kind is ErrorKind.CANCELLED


async def test_a_race_resumed_in_the_middle_cancels_its_loser(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    provider = script(
        1.0,
        root=[reply("", _spawn({"quorum": 1}, "quick", "slow")), reply("done")],
        c1=[reply("", think()), reply("", submit("quick won"))],
        c2=[reply("", think(), latency=500.0)],
    )

    async def drive(runtime: Runtime) -> None:
        await runtime.start("go", cwd=tmp_path)

    def both_running(steps: Sequence[Step]) -> bool:
        return any(s.conversation_id.endswith(".2") and s.seq == 0 for s in steps)

    await _run_until_cut(tmp_path, provider, both_running, drive)
    async with open_runtime(tmp_path, provider) as runtime:
        (root_id,) = [r for r in await runtime.resume() if "." not in r]
        result = await runtime.wait(root_id)
        # The loser is told to cancel; it acknowledges, and its outcome is absorbed.
        with trio.fail_after(100):
            while runtime.store.conversation(f"{root_id}.2").status != "failed":
                await trio.sleep(1.0)
    assert result.phase == "Idle"
    states = _tree(tmp_path, root_id)
    assert states[f"{root_id}.1"].phase.result == "quick won"
    loser = states[f"{root_id}.2"].phase
    assert isinstance(loser, Failed) and loser.kind is ErrorKind.CANCELLED
    assert states[root_id].written_off == (f"{root_id}.2",)


async def test_a_named_agents_refusal_is_in_the_log(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    reader = AgentDefinition("reader", "reads", allow=(Rule("read-only"),))
    provider = script(
        1.0,
        root=[
            reply("", ("spawn_agents", {"tasks": [{"task": "t", "agent": "reader"}]})),
            reply("done"),
        ],
        c1=[
            reply("", ("bash", {"command": "touch x"})),
            reply("", submit("{{last_tool_result}}")),
        ],
    )
    async with open_runtime(tmp_path, provider, limits=Limits()) as runtime:
        root_id = await runtime.start("go", cwd=tmp_path, agents=(reader,))
        await runtime.wait(root_id)
    child = _tree(tmp_path, root_id)[f"{root_id}.1"]
    assert not (tmp_path / "x").exists()
    assert child.refused_calls == 1 and child.agent == "reader"
    assert child.phase.result.startswith("bash refused: no allow rule of agent 'reader'")


async def test_a_full_context_child_plays_its_own_scripted_replies_and_counts_its_calls(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A child of context mode full is given its parent's replies and tool calls:
    the scripted provider once counted them as the child's rounds (it skipped the
    child's first reply, or answered "no scripted reply") and filled
    ``{{last_tool_result}}`` from the parent's tools, and `fanfold show` counted the
    parent's tool calls as the child's."""
    from fanfold.cli.display import tool_call_count

    provider = script(
        1.0,
        root=[
            reply("first I think", think("parent's thought")),
            reply("now I delegate", spawn({"task": "t", "context": "full"})),
            reply("done"),
        ],
        c1=[reply("", submit("its own tool results: [{{last_tool_result}}]"))],
    )
    async with open_runtime(tmp_path, provider, limits=Limits()) as runtime:
        root_id = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root_id)
    child = _tree(tmp_path, root_id)[f"{root_id}.1"]
    assert len(child.history) > 5  # the parent's conversation, then its own
    assert child.phase.result == "its own tool results: []"  # the parent's think is not
    assert child.rounds == 1
    assert tool_call_count(child) == 1  # submit_result, not the parent's think


async def test_a_path_rule_holds_through_a_symbolic_link(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """`write_file(docs/**)` is matched on the path as spelled (the reducer does no
    I/O): through `docs/link -> ../src` a writer once wrote `src/evil.py`. The runtime
    now checks the path its links lead to as well; a link that stays inside `docs/`
    is still followed."""
    (tmp_path / "src").mkdir()
    (tmp_path / "docs" / "inner").mkdir(parents=True)
    (tmp_path / "docs" / "link").symlink_to("../src")
    (tmp_path / "docs" / "same").symlink_to("inner")
    writer = AgentDefinition(
        "writer", "writes docs", allow=(Rule("read-only"), Rule("write_file", "docs/**"))
    )
    provider = script(
        1.0,
        root=[reply("", spawn({"task": "t", "agent": "writer"})), reply("done")],
        c1=[
            reply(
                "",
                ("write_file", {"path": "docs/link/evil.py", "content": "x"}),
                ("write_file", {"path": "docs/same/fine.md", "content": "y"}),
            ),
            reply("", submit("{{last_tool_result}}")),
        ],
    )
    async with open_runtime(tmp_path, provider, limits=Limits()) as runtime:
        root_id = await runtime.start("go", cwd=tmp_path, agents=(writer,))
        await runtime.wait(root_id)
    assert not (tmp_path / "src" / "evil.py").exists()
    assert (tmp_path / "docs" / "inner" / "fine.md").read_text() == "y"
    child = _tree(tmp_path, root_id)[f"{root_id}.1"]
    results = [m.result for m in child.history if type(m).__name__ == "ToolResultMessage"]
    refused = next(r for r in results if r.is_error)
    assert refused.content.startswith("write_file refused: no allow rule of agent 'writer'")
    assert refused.content.endswith(
        "'docs/link/evil.py' leads to 'src/evil.py' through a symbolic link"
    )


def _summary_script(latency: float, summary: dict[str, Any], **agents: Any) -> Any:
    """``runtime_helpers.script`` with a scripted reply to the root's summary call."""
    from fanfold.providers.scripted import ScriptedProvider

    entries = [
        {"match": {"path": "root"}, "replies": agents.pop("root"), "summary": summary},
        *(
            {"match": {"path": "root/" + key[1:]}, "replies": replies}
            for key, replies in agents.items()
        ),
    ]
    return ScriptedProvider({"latency": latency, "agents": entries})


async def test_summary_children_start_with_the_recorded_summary_and_replay(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    from fanfold.replay import verify
    from fanfold.statemachine import UserMessage
    from fanfold.statemachine.delegation import SUMMARY_HEADER

    provider = _summary_script(
        1.0,
        # Its first attempt is rate limited: retried after the hinted 3 s.
        {
            "text": "The user wants X; a.py is broken.",
            "fail_first": [{"kind": "rate_limit", "message": "slow", "retry_after": 3.0}],
            "usage": {"input_tokens": 400, "output_tokens": 30},
        },
        root=[
            reply("Looking first.", think("a.py is broken")),
            reply("Delegating.", spawn({"task": "fix a.py", "context": "summary"}, "plain")),
            reply("done"),
        ],
        c1=[reply("", submit("fixed with: {{task}}"))],
        c2=[reply("", submit("plain done"))],
    )
    async with open_runtime(tmp_path, provider, limits=Limits()) as runtime:
        root_id = await runtime.start("go", cwd=tmp_path)
        result = await runtime.wait(root_id)
    assert result.phase == "Idle"
    states = _tree(tmp_path, root_id)
    summarised, plain = states[f"{root_id}.1"], states[f"{root_id}.2"]
    briefing = UserMessage(SUMMARY_HEADER + "The user wants X; a.py is broken.")
    assert summarised.history[:2] == (briefing, UserMessage("fix a.py"))
    assert plain.history[0] == UserMessage("plain")
    # The summary's tokens are the root's (one call's 430, beside its three rounds).
    root = states[root_id]
    assert root.rounds == 3 and root.usage_input >= 400
    with Store.open(tmp_path / "log.db") as store:
        report = verify(store, root_id, tree=True)
        assert report.ok, report
        kinds = [type(e.event).__name__ for e in store.events(root_id)]
    # Call, rate limited, retry timer, call again, the summary: all in the root's log.
    assert kinds.count("ModelFailed") == 1 and kinds.count("ModelReplied") == 4


@pytest.mark.parametrize("cut_at", [2, 3])
async def test_a_restart_while_the_summary_is_made_asks_again_and_a_cancel_stops_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, cut_at: int
) -> None:
    """Stopped when the summary was asked for (seq 2: the call in flight) or made
    (seq 3: the child not yet spawned): resumed, the tree finishes the same way."""
    summary = {"text": "S", "latency": 50.0}
    root_replies = [reply("", spawn({"task": "t", "context": "summary"})), reply("done")]
    provider = _summary_script(
        1.0, summary, root=root_replies, c1=[reply("", submit("got {{task}}"))]
    )

    async def drive(runtime: Runtime) -> None:
        await runtime.start("go", cwd=tmp_path)

    def summary_asked(steps: Sequence[Step]) -> bool:
        return any(s.conversation_id.count(".") == 0 and s.seq == cut_at for s in steps)

    await _run_until_cut(tmp_path, provider, summary_asked, drive)
    if cut_at == 2:
        # Stopped while the summary was made: `show` lists the child as queued.
        shown = _show_json(tmp_path / "log.db")
        assert shown["queued"] == [
            {
                "id": shown["id"] + ".1",
                "task": "t",
                "waiting_for": "the summary of its parent's conversation",
            }
        ]
    async with open_runtime(tmp_path, provider) as runtime:
        (root_id,) = [r for r in await runtime.resume() if "." not in r]
        result = await runtime.wait(root_id)
    assert result.phase == "Idle"
    states = _tree(tmp_path, root_id)
    assert states[f"{root_id}.1"].phase.result == "got t"
    with Store.open(tmp_path / "log.db") as store:
        assert verify_ok(store, root_id)
        kinds = [type(e.event).__name__ for e in store.events(root_id)]
    assert kinds[cut_at + 1] == "RuntimeResumed"
    assert kinds.count("ModelReplied") == 3  # spawn, the summary (answered once), done

    # Cancelled while the summary is made: the call is aborted, the child never exists.
    cancelled = tmp_path / "cancelled"
    cancelled.mkdir()
    provider = _summary_script(1.0, summary, root=root_replies, c1=[])
    async with open_runtime(cancelled, provider) as runtime:
        root_id = await runtime.start("go", cwd=cancelled)
        await trio.sleep(10.0)
        await runtime.cancel(root_id)
        result = await runtime.wait(root_id)
    assert result.phase == "Idle"
    assert set(_tree(cancelled, root_id)) == {root_id}


def verify_ok(store: Store, root_id: str) -> bool:
    from fanfold.replay import verify

    return verify(store, root_id, tree=True).ok


def _show_json(db: Path) -> dict[str, Any]:
    """`fanfold show --json` of the one tree in ``db``."""
    import json

    from click.testing import CliRunner

    from fanfold.cli import cli

    with Store.open(db) as store:
        (root,) = store.list_roots()
    result = CliRunner().invoke(cli, ["show", root.id, "--db", str(db), "--json"])
    assert result.exit_code == 0, result.output
    shown: dict[str, Any] = json.loads(result.output)
    return shown
