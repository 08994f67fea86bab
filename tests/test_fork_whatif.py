"""What-ifs on trees from elsewhere and what a fork says about itself (issue 34).

An imported fork keeps its lineage through export and import; a fork's copies name
the fork's agents; an imported tree is forked at any step into a tree of the
receiver's; ``replay --agent``; ``ls`` and ``diff`` name the forked agent, its seq and
the edit. Real SQLite files and the CLI, from the two-children tree of
``test_fork_tree`` (run once per module).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from db_scenarios import BASH, Driver
from replay_helpers import write
from runtime_helpers import open_runtime
from test_fork_tree import events_of, go_on_script, ran, run, show, two_children
from test_mcp_durability import SCRIPT, CountingTool

from fanfold import replay
from fanfold.db import Store
from fanfold.providers.scripted import ScriptedProvider
from fanfold.statemachine import (
    ConversationCreated,
    ToolCall,
    ToolExecuting,
    ToolResultMessage,
    UserMessaged,
)
from fanfold.statemachine.transition import FORKED_TOOL_RESULT
from fanfold.tools.registry import ToolSet

__all__ = ["two_children"]  # the module fixture, used here by name


def export(db: Path, conversation_id: str, out: Path) -> bytes:
    done = run("export", conversation_id, "-o", out, "--db", db)
    assert done.exit_code == 0, done.output
    return out.read_bytes()


def imported(db: Path, file: Path) -> str:
    done = run("import", file, "--db", db)
    assert done.exit_code == 0, done.output
    return done.stdout.strip()


def diff_json(db: Path, a: str, b: str) -> dict[str, Any]:
    done = run("diff", a, b, "--json", "--db", db)
    assert done.exit_code == 0, done.output
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def listed(db: Path) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in json.loads(run("ls", "--json", "--db", db).stdout)}


def test_an_imported_fork_keeps_its_lineage_through_export_and_import(
    tmp_path: Path, two_children: Path
) -> None:
    db, root, _ = ran(tmp_path, two_children)
    args = ["--agent", "1", "--at", "1", "--id", "fk", "--continue"]
    done = run("fork", root, *args, "--script", go_on_script(tmp_path), "--db", db)
    assert done.exit_code == 0, done.output
    fork_file = export(db, "fk", tmp_path / "fork.jsonl")
    export(db, root, tmp_path / "source.jsonl")
    # The fork comes in first, its source later (or never): its rows cannot link to a
    # source that is not there, yet it goes on naming it.
    other = tmp_path / "other.db"
    assert imported(other, tmp_path / "fork.jsonl") == "fk"
    alone = tmp_path / "alone.db"
    imported(alone, tmp_path / "fork.jsonl")
    assert imported(other, tmp_path / "source.jsonl") == root
    for where in (other, alone):
        assert export(where, "fk", tmp_path / "again.jsonl") == fork_file
        shown = run("show", "fk", "--db", where).stdout
        assert f"fork of {root}@3" in shown and f"fork of {root}.1@1" in shown
        assert (show(where, "fk")["forked_from"], show(where, "fk")["forked_at_seq"]) == (root, 3)
        item = listed(where)["fk"]
        assert (item["forked_from"], item["forked_at_seq"]) == (root, 3)
        told = run("transcript", "fk", "--agent", "1", "--db", where).stdout
        assert f"forked from: {root}.1@1" in told
    # The same two trees, the same numbers, in both databases.
    assert diff_json(other, root, "fk") == diff_json(db, root, "fk")
    with Store.open(other) as store:
        row = store.conversation("fk")
        assert (row.forked_from, row.forked_at_seq) == (None, 3)  # no key to a later import


def test_a_forks_records_name_the_forks_agents(tmp_path: Path, two_children: Path) -> None:
    db, root, _ = ran(tmp_path, two_children)
    # The root's step after its fan-in: both children finished before it, and the
    # result naming them is in its history as the model's next call waits.
    with Store.open(db) as store:
        seq = next(
            step.seq
            for step in replay.steps(store, root)
            if not step.after_state.at_rest
            and any(
                isinstance(m, ToolResultMessage) and m.result.name == "spawn_agents"
                for m in step.after_state.history
            )
        )
    assert run("fork", root, "--at", str(seq), "--id", "fi", "--db", db).exit_code == 0
    with Store.open(db) as store:
        (fan_in,) = [
            json.loads(m.result.content)
            for m in store.load_state("fi").history
            if isinstance(m, ToolResultMessage) and m.result.name == "spawn_agents"
        ]
        assert [e["agent_id"] for e in fan_in["sub_agent_results"]] == ["fi.1", "fi.2"]
        assert [c.id for c in store.children("fi")] == ["fi.1", "fi.2"]
    told = run("transcript", "fi", "--json", "--db", db).stdout
    assert '\\"agent_id\\":\\"fi.1\\"' in told and f'\\"agent_id\\":\\"{root}.1\\"' not in told
    assert run("replay", "fi", "--verify", "--tree", "--db", db).exit_code == 0
    # As far as the fork goes, the same as its source for diff (ids compared as <root>):
    # they part only where the source's next reply is and the unresumed fork has none.
    parting = diff_json(db, root, "fi")["agents"][0]["parting"]
    assert parting["b"] is None and parting["a"]["kind"] == "assistant", parting


def test_replay_takes_an_agent_as_transcript_and_fork_do(
    tmp_path: Path, two_children: Path
) -> None:
    db, root, _ = ran(tmp_path, two_children)
    stepped = run("replay", root, "--agent", "root/1", "--at", "1", "--db", db)
    assert stepped.exit_code == 0, stepped.output
    assert "seq 1" in stepped.stdout and "ToolExecuting" in stepped.stdout
    assert stepped.stdout == run("replay", f"{root}.1", "--at", "1", "--db", db).stdout
    verified = run("replay", root, "--agent", "2", "--verify", "--db", db)
    assert verified.exit_code == 0 and "identical" in verified.stdout
    unknown = run("replay", root, "--agent", "root/7", "--verify", "--db", db)
    assert unknown.exit_code == 2 and f"no agent 'root/7' in the tree of '{root}'" in unknown.stderr


def test_ls_and_diff_name_the_forked_agent_its_seq_and_the_edit(
    tmp_path: Path, two_children: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, root, _ = ran(tmp_path, two_children)
    reply = tmp_path / "reply.json"
    reply.write_text(
        json.dumps({"tool_calls": [{"name": "bash", "arguments": {"command": "echo 9"}}]})
    )
    args: list[str | Path] = ["--agent", "1", "--at", "0", "--id", "a0", "--reply", reply]
    args.append("--continue")
    done = run("fork", root, *args, "--script", go_on_script(tmp_path), "--db", db)
    assert done.exit_code == 0, done.output
    assert run("fork", root, "--agent", "1", "--at", "1", "--id", "a1", "--db", db).exit_code == 0
    items = listed(db)
    assert (items["a0"]["forked_agent"], items["a0"]["forked_agent_seq"]) == ("root/1", 0)
    assert (items["a1"]["forked_agent"], items["a1"]["forked_agent_seq"]) == ("root/1", 1)
    assert items["a0"]["edit"] == "reply: calls bash" and items["a1"]["edit"] is None
    from fanfold.cli import output

    monkeypatch.setattr(output.console, "width", 250)
    lines = {
        line.split("│")[1].strip(): line
        for line in run("ls", "--db", db).stdout.splitlines()
        if "│" in line
    }
    assert "root/1@0, edit reply: calls bash" in lines["a0"]
    assert "root/1@1" in lines["a1"] and "edit" not in lines["a1"]
    report = diff_json(db, root, "a0")
    assert report["a_fork"] is None
    assert report["b_fork"] == {
        "source": root,
        "source_seq": items["a0"]["forked_at_seq"],
        "agent": "root/1",
        "agent_seq": 0,
        "edit": "reply: calls bash",
    }
    said = run("diff", root, "a0", "--db", db).stdout
    assert "B is a fork of" in said and "made at root/1 seq 0, edited: reply: calls bash" in said


def test_an_imported_tree_is_forked_at_a_sub_agent_and_goes_on_here(
    tmp_path: Path, two_children: Path
) -> None:
    db, root, _ = ran(tmp_path, two_children)
    export(db, root, tmp_path / "bug.jsonl")
    other = tmp_path / "other.db"
    assert imported(other, tmp_path / "bug.jsonl") == root
    before = events_of(other, root)
    script = go_on_script(tmp_path)
    # root/1 at seq 1: its recorded `echo 42` was running. The fork goes on with this
    # user's script; the recorded call is not run again (the fork's own result).
    args: list[str | Path] = ["--agent", "1", "--at", "1", "--id", "w", "--continue"]
    args += ["--script", script]
    done = run("fork", root, *args, "--db", other)
    assert done.exit_code == 0, done.output
    assert "was not written by this runtime" in done.stderr
    # A what-if: root/1's first reply replaced; its tool runs live, here.
    reply = tmp_path / "reply.json"
    calls = [{"name": "bash", "arguments": {"command": "echo 77"}}]
    reply.write_text(json.dumps({"tool_calls": calls}))
    args = ["--agent", "1", "--at", "0", "--id", "v", "--reply", reply, "--continue"]
    done = run("fork", root, *args, "--script", script, "--db", other)
    assert done.exit_code == 0, done.output
    with Store.open(other) as store:
        interrupted = store.load_state("w.1").outcome
        assert interrupted is not None and FORKED_TOOL_RESULT in interrupted.result  # type: ignore[union-attr]
        assert "42" not in interrupted.result  # type: ignore[union-attr]
        edited = store.load_state("v.1").outcome
        assert edited is not None and edited.result.startswith("77")  # type: ignore[union-attr]
        record = store.tree_record(root)
        assert record is not None and record.origin.value == "imported"  # still inert
    for fork in ("w", "v"):
        assert run("replay", fork, "--verify", "--tree", "--db", other).exit_code == 0
    assert events_of(other, root) == before
    refused = run("send", root, "more", "--script", script, "--db", other)
    assert refused.exit_code != 0  # the import itself is never continued


def test_a_fork_of_a_tree_from_elsewhere_never_starts_a_call_its_log_decided(
    tmp_path: Path,
) -> None:
    # Two calls in one reply, written without a mark (a log from elsewhere): going on
    # from the first one's step would run the second with no model asked.
    driver = Driver()
    driver.create(ConversationCreated("x", cwd=str(tmp_path), tools=(BASH,)))
    driver.feed("x", UserMessaged("go"))
    first = ToolCall.of("x-b1", "bash", {"command": "true"})
    second = ToolCall.of("x-b2", "bash", {"command": "touch planted"})
    driver.reply("x", "two calls", first, second)
    db = tmp_path / "log.db"
    write(db, driver.steps)
    with Store.open(db) as store:
        last = store.conversation("x").last_seq
    refused = run("fork", "x", "--at", str(last), "--db", db)
    assert refused.exit_code == 2
    assert "its log decided and has no result for: root bash (x-b2)" in refused.stderr
    # The step before the reply (the model's call awaited) forks, into a tree of this
    # user's that records no provider: it goes on only with one this user names.
    assert run("fork", "x", "--at", str(last - 1), "--id", "y", "--db", db).exit_code == 0
    with Store.open(db) as store:
        record = store.tree_record("y")
        assert record is not None and record.provider is None and record.mark is not None
        assert sorted(r.id for r in store.list_roots()) == ["x", "y"]


async def test_a_forks_running_call_is_never_run_again_even_if_idempotent(tmp_path: Path) -> None:
    # A tool that declares a second call harmless is run again after a crash; in a
    # fork its running call is the source's (maybe a tree from elsewhere): never again.
    calls: list[str] = []
    async with open_runtime(tmp_path, ScriptedProvider(SCRIPT)) as runtime:
        runtime.tools = ToolSet([CountingTool(True, calls, block=False)])
        root = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root)
        (running,) = [
            s.seq
            for s in replay.steps(runtime.store, root)
            if isinstance(s.after_state.phase, ToolExecuting)
        ]
        assert calls == ["call"]
        fork = await runtime.fork(root, running, new_id="g", go_on=True)
        await runtime.wait(fork)
        (result,) = [
            m.result for m in runtime.state(fork).history if isinstance(m, ToolResultMessage)
        ]
    assert calls == ["call"]
    assert result.is_error and result.content == FORKED_TOOL_RESULT
