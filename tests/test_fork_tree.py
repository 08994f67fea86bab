"""Forking any step of any conversation of a tree (issue 24): the whole tree as it was
at that moment, continued by ``resume``, the source untouched."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import hypothesis
import pytest
from click.testing import CliRunner, Result
from db_scenarios import CHILD_PLANS, Driver, cancelled_fan_out, fan_out
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_helpers import write

from fanfold import replay, testing
from fanfold.cli import cli
from fanfold.db import Step, Store
from fanfold.db.provenance import UserKey
from fanfold.replay.fork import fork_tree
from fanfold.statemachine import (
    ConversationForked,
    ForkEdited,
    IllegalTransition,
    Limits,
    LimitsEdit,
    SystemPromptEdit,
    TaskEdit,
    ToolResultMessage,
    UserMessage,
    start,
    transition,
)
from fanfold.statemachine.control_tools import GRACE_PROMPT
from fanfold.statemachine.transition import limits_edit_problem

# A root delegates two tasks: root/1 runs a bash command then submits, root/2 answers.
TWO_CHILDREN = {
    "latency": 0.0,
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                {
                    "tool_calls": [
                        {
                            "name": "spawn_agents",
                            "arguments": {"tasks": [{"task": "a"}, {"task": "b"}]},
                        }
                    ]
                },
                {"text": "the answer is {{last_tool_result}}"},
            ],
        },
        {
            "match": {"path": "root/1"},
            "replies": [
                {
                    # Slower than root/2: its outcome is in before this call's step.
                    "latency": 0.5,
                    "tool_calls": [{"name": "bash", "arguments": {"command": "echo 42"}}],
                },
                {"tool_calls": [{"name": "submit_result", "arguments": {"result": "42"}}]},
            ],
        },
        {"match": {"path": "root/2"}, "replies": [{"text": "b done"}]},
    ],
}


def run(*args: str | Path) -> Result:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


@pytest.fixture(scope="module")
def two_children(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ``log.db`` with one finished TWO_CHILDREN tree and its script.

    Run once for the module (root/1's reply waits 0.5 s, and two dozen tests start from
    this tree); each test forks a copy of its own (``ran``). A module fixture is set up
    before the autouse ones of conftest, so it names the session's key file itself (the
    copies must verify under the key the tests run with) and a trust record of its own.
    """
    folder = tmp_path_factory.mktemp("two-children")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FANFOLD_KEY_FILE", str(tmp_path_factory.getbasetemp() / "provenance.key"))
        patch.setenv("FANFOLD_TRUST_FILE", str(folder / "trusted.json"))
        script = folder / "script.json"
        script.write_text(json.dumps(TWO_CHILDREN))
        done = run("run", "--db", folder / "log.db", "--script", script, "--cwd", folder, "go")
    assert done.exit_code == 0, done.output
    return folder


def ran(folder: Path, template: Path) -> tuple[Path, str, Path]:
    """A copy of ``template``'s log and script in ``folder`` (the tree's working
    directory stays the template's): the log, its root's id, the script."""
    for path in template.iterdir():
        if path.name.startswith(("log.db", "script.json")):
            shutil.copy2(path, folder / path.name)
    db = folder / "log.db"
    with Store.open(db) as store:
        (root,) = store.list_roots()
    return db, root.id, folder / "script.json"


def events_of(db: Path, root: str) -> list[tuple[Any, ...]]:
    """Every stored event of the tree ``root``, as stored."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute(
            "SELECT conversation_id, seq, type, payload FROM events "
            "WHERE conversation_id = ? OR conversation_id LIKE ? ORDER BY conversation_id, seq",
            (root, f"{root}.%"),
        ).fetchall()
    finally:
        conn.close()


def show(db: Path, conversation_id: str) -> dict[str, Any]:
    shown = run("show", conversation_id, "--json", "--db", db)
    assert shown.exit_code == 0, shown.output
    node: dict[str, Any] = json.loads(shown.stdout)
    return node


def test_a_sub_agent_forked_mid_tool_forks_its_tree_and_resumes(
    tmp_path: Path, two_children: Path
) -> None:
    db, root, _ = ran(tmp_path, two_children)
    before = events_of(db, root)
    forked = run("fork", root, "--agent", "root/1", "--at", "1", "--id", "fk", "--db", db)
    assert forked.exit_code == 0, forked.output
    assert forked.stdout == "fk\n" and "fanfold resume --db" in forked.stderr
    assert run("replay", "fk", "--verify", "--tree", "--db", db).exit_code == 0
    # At that moment: the root waiting, root/1 running its bash call, root/2 finished
    # (its outcome accepted by the root at its seq 3).
    tree = show(db, "fk")
    assert tree["phase"] == "AwaitingSubAgents"
    first, second = tree["children"]
    assert (first["id"], first["phase"]) == ("fk.1", "ToolExecuting")
    assert (second["id"], second["phase"], second["outcome"]) == ("fk.2", "Completed", "b done")
    assert (tree["forked_from"], tree["forked_at_seq"]) == (root, 3)
    assert (first["forked_from"], first["forked_at_seq"]) == (f"{root}.1", 1)
    shown = run("show", "fk", "--db", db).stdout
    assert f"fork of {root}@3" in shown and f"fork of {root}.1@1" in shown
    listed = {r["id"]: r for r in json.loads(run("ls", "--json", "--db", db).stdout)}
    assert listed["fk"]["origin"] == "fork"
    assert (listed["fk"]["forked_from"], listed["fk"]["forked_at_seq"]) == (root, 3)
    told = run("transcript", "fk", "--agent", "1", "--db", db).stdout
    assert f"forked from: {root}.1@1" in told

    resumed = run("resume", "--db", db)
    assert resumed.exit_code == 0, resumed.output
    tree = show(db, "fk")
    assert tree["phase"] == "Idle" and tree["children"][0]["outcome"] == "42"
    assert '"agent_id":"fk.2","result":"b done"' in tree["outcome"]
    # The finished sibling ran nothing again; the source has not one event more.
    with Store.open(db) as store:
        assert store.conversation("fk.2").last_seq == 0
    assert events_of(db, root) == before


def test_a_root_forked_as_it_delegates_spawns_its_children_again(
    tmp_path: Path, two_children: Path
) -> None:
    db, root, _ = ran(tmp_path, two_children)
    before = events_of(db, root)
    # Seq 2: the model asked for two sub-agents; none existed yet at that moment. By
    # default they take their recorded runs from the source (the root had started them
    # before anything could change); --rerun-siblings makes them again, live.
    assert run("fork", root, "--at", "2", "--id", "fd", "--db", db).exit_code == 0
    assert [c["outcome"] for c in show(db, "fd")["children"]] == ["42", "b done"]
    forked = run("fork", root, "--at", "2", "--id", "fr", "--rerun-siblings", "--db", db)
    assert forked.exit_code == 0
    assert [c["id"] for c in show(db, "fr")["children"]] == []
    assert run("resume", "--db", db).exit_code == 0
    report = json.loads(run("diff", root, "fr", "--json", "--db", db).stdout)
    assert [(a["path"], a["same"]) for a in report["agents"]] == [
        ("root", True),
        ("root/1", True),
        ("root/2", True),
    ]
    assert events_of(db, root) == before


def test_a_tree_from_elsewhere_is_forked_at_any_step(tmp_path: Path, two_children: Path) -> None:
    # Issue 34: it was forked only at its root's rest; now at any step where no tool
    # call its log decided would start (test_fork_whatif.py has the refusals).
    db, root, _ = ran(tmp_path, two_children)
    exported = tmp_path / "tree.jsonl"
    assert run("export", root, "-o", exported, "--db", db).exit_code == 0
    other = tmp_path / "other.db"
    imported = run("import", exported, "--db", other).stdout.strip()
    sub = run("fork", imported, "--agent", "1", "--at", "1", "--id", "s", "--db", other)
    assert sub.exit_code == 0 and "was not written by this runtime" in sub.stderr
    mid = run("fork", imported, "--at", "2", "--id", "m", "--db", other)
    assert mid.exit_code == 0, mid.output
    assert [c["id"] for c in show(other, "s")["children"]] == ["s.1", "s.2"]
    unknown = run("fork", root, "--agent", "root/7", "--at", "0", "--db", db)
    assert unknown.exit_code == 2 and f"no agent 'root/7' in the tree of '{root}'" in unknown.stderr


def _fan_in_ids_as(history: Any, root: str, fork: str) -> tuple[Any, ...]:
    """``history`` with the agent ids of its fan-in results under ``fork``'s id."""
    return tuple(
        ToolResultMessage(
            attrs.evolve(
                m.result,
                content=m.result.content.replace(f'"agent_id":"{root}.', f'"agent_id":"{fork}.'),
            )
        )
        if isinstance(m, ToolResultMessage) and m.result.name == "spawn_agents"
        else m
        for m in history
    )


def _moments(store: Store, root: str) -> list[tuple[str, int]]:
    return [(s.conversation_id, s.seq) for s in replay.steps(store, root, tree=True)]


LIMIT_FIELDS = [field.name for field in attrs.fields(Limits)]


@settings(max_examples=20, deadline=None)
@given(
    plans=st.lists(st.sampled_from(CHILD_PLANS), min_size=1, max_size=3),
    finish=st.booleans(),
    cancelled=st.booleans(),
    pick=st.integers(min_value=0),
    new_limits=testing.limits(),
    field=st.sampled_from(LIMIT_FIELDS),
    rerun=st.booleans(),
)
def test_a_fork_at_any_step_verifies_and_loses_no_outcome(
    plans: list[Any],
    finish: bool,
    cancelled: bool,
    pick: int,
    new_limits: Limits,
    field: str,
    rerun: bool,
) -> None:
    driver = Driver(snapshot_every=2)
    root = "c" if cancelled else "r"
    if cancelled:
        cancelled_fan_out(driver, root)
    else:
        fan_out(driver, root, plans, finish=finish)
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "log.db"
        write(db, driver.steps)
        with Store.open(db) as store:
            moments = _moments(store, root)
            cid, seq = moments[pick % len(moments)]
            before = events_of(db, root)
            fork = fork_tree(store, cid, seq, new_id="f", key=UserKey.load(), rerun_siblings=rerun)
            assert replay.verify(store, fork, tree=True).ok
            # Each conversation created by then is in the fork, in its state then
            # (rerun: every one; else the picked one and its ancestors, the others
            # in their state at a later step of the source, never an earlier one).
            then: dict[str, Any] = {}
            for step in replay.steps(store, root, tree=True):
                then[step.conversation_id] = (step.seq, step.after_state)
                if (step.conversation_id, step.seq) == (cid, seq):
                    break
            chain, up = {cid}, then[cid][1].parent_id
            while up is not None:
                chain.add(up)
                up = then[up][1].parent_id
            copied = {row.id for row in store.tree(fork)}
            assert {"f" + c[len(root) :] for c in then} <= copied
            if rerun:
                assert copied == {"f" + c[len(root) :] for c in then}
            for row in store.tree(fork):
                forked = store.load_state(row.id)
                testing.check_invariants(forked)
                source_id = root + row.id[1:]
                at = row.forked_at_seq
                assert at is not None
                source = replay.state_at(store, source_id, at)
                if source_id in then and (rerun or source_id in chain):
                    assert at == then[source_id][0]
                elif source_id in then:
                    assert at >= then[source_id][0]
                assert forked.outcome == source.outcome  # finished ones keep theirs
                assert (forked.phase == source.phase) or source.children is not None
                # As recorded, but that a fan-in result names the fork's agents.
                assert forked.history == _fan_in_ids_as(source.history, root, "f")
            # The picked conversation goes on with one of its limits changed, if the
            # new value admits it as it is: the step keeps every invariant, and the
            # fork with it in its log still verifies.
            edited_id = "f" + cid[len(root) :]
            picked = store.load_state(edited_id)
            limits = attrs.evolve(picked.limits, **{field: getattr(new_limits, field)})
            admitted = not picked.is_terminal and limits_edit_problem(picked, limits) is None
            hypothesis.event("limits edit admitted" if admitted else "no limits edit")
            if admitted:
                event = ForkEdited(LimitsEdit(limits))
                after, effects = transition(picked, event)
                testing.check_transition(picked, event, after, effects)
                seq = store.conversation(edited_id).last_seq + 1
                store.append([Step(edited_id, seq, event, effects, after, time.time())])
                assert replay.verify(store, fork, tree=True).ok
        assert events_of(db, root) == before  # nothing written to the source


# ------------------------------------------------------------------ edits (--continue)

# The fork's continuation: replies are per place and round (round 1 is the first).
GO_ON = {
    "latency": 0.0,
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [{"text": "unused"}, {"text": "root says {{last_tool_result}}"}],
        },
        {
            "match": {"path": "root/1"},
            "replies": [
                {"text": "unused"},
                {
                    "tool_calls": [
                        {"name": "submit_result", "arguments": {"result": "{{last_tool_result}}"}}
                    ]
                },
            ],
        },
        {"match": {"path": "root/2"}, "replies": [{"text": "b again"}]},
    ],
}


def roots(db: Path) -> list[str]:
    with Store.open(db) as store:
        return [row.id for row in store.list_roots()]


def go_on_script(folder: Path) -> Path:
    script = folder / "go_on.json"
    script.write_text(json.dumps(GO_ON))
    return script


def test_an_edited_reply_runs_its_tool_live_in_the_fork(tmp_path: Path, two_children: Path) -> None:
    db, root, _ = ran(tmp_path, two_children)
    before = events_of(db, root)
    reply = tmp_path / "reply.json"
    calls = [{"name": "bash", "arguments": {"command": "echo 99"}}]
    reply.write_text(json.dumps({"text": "edited", "tool_calls": calls}))
    args: list[str | Path] = [
        "fork",
        root,
        "--agent",
        "1",
        "--at",
        "0",
        "--id",
        "e",
        "--reply",
        reply,
    ]
    done = run(*args, "--continue", "--script", go_on_script(tmp_path), "--db", db)
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith("e\n") and "resuming" in done.stdout
    with Store.open(db) as store:
        child = store.load_state("e.1")
        assert child.outcome is not None and child.outcome.result.startswith("99")  # type: ignore[union-attr]
        # The sibling, started by the root before the moment, keeps its recorded run.
        assert store.load_state("e.2").outcome.result == "b done"  # type: ignore[union-attr]
    assert run("replay", "e", "--verify", "--tree", "--db", db).exit_code == 0
    told = run("transcript", "e", "--agent", "1", "--db", db).stdout
    assert "seq 1 · edit: the awaited model reply given by the user" in told
    assert "tool call: bash edit_0" in told
    page = tmp_path / "trace.html"
    assert run("trace", "e", "-o", page, "--db", db).exit_code == 0
    assert "fork went on, edited (ReplyEdit)" in page.read_text(encoding="utf-8")
    assert events_of(db, root) == before


def test_an_edited_tool_result_and_an_edited_task(tmp_path: Path, two_children: Path) -> None:
    db, root, _ = ran(tmp_path, two_children)
    result = tmp_path / "result.txt"
    result.write_text("edited result")
    script = go_on_script(tmp_path)
    # Seq 1 of root/1: its bash call (call_0_0, as the scripted provider numbers it) runs.
    args = ["--agent", "1", "--at", "1", "--tool-result", f"call_0_0={result}"]
    done = run("fork", root, *args, "--id", "t", "--continue", "--script", script, "--db", db)
    assert done.exit_code == 0, done.output
    with Store.open(db) as store:
        assert store.load_state("t.1").outcome.result == "edited result"  # type: ignore[union-attr]
    args = ["--agent", "2", "--at", "0", "--task", "the other task"]
    done = run("fork", root, *args, "--id", "k", "--continue", "--script", script, "--db", db)
    assert done.exit_code == 0, done.output
    with Store.open(db) as store:
        second = store.load_state("k.2")
        assert second.task == "the other task" and UserMessage("the other task") in second.history
    for fork in ("t", "k"):
        assert run("replay", fork, "--verify", "--tree", "--db", db).exit_code == 0


def test_a_new_system_prompt_for_a_root_at_rest_is_recorded_at_once(
    tmp_path: Path, two_children: Path
) -> None:
    db, root, _ = ran(tmp_path, two_children)
    prompt = tmp_path / "prompt.md"
    prompt.write_text("be terse \x1b[2J")
    done = run("fork", root, "--at", "5", "--id", "p", "--system-file", prompt, "--db", db)
    assert done.exit_code == 0, done.output
    with Store.open(db) as store:
        assert store.load_state("p").system_prompt == "be terse \x1b[2J"
        assert store.conversation("p").last_seq == 1
    assert run("replay", "p", "--verify", "--db", db).exit_code == 0
    told = run("transcript", "p", "--db", db).stdout
    assert "edit: the system prompt replaced" in told and "be terse \\x1b[2J" in told


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agent", "1", "--at", "1", "--task", "x", "--continue"], "TaskEdit is legal in"),
        (["--agent", "1", "--at", "1", "--reply", "R", "--continue"], "ReplyEdit is legal in"),
        (["--agent", "1", "--at", "0", "--reply", "R"], "goes on: add --continue"),
        (["--at", "5", "--task", "x", "--system-file", "R"], "give at most one edit"),
        (["--at", "5", "--tool-result", "nofile"], "--tool-result takes CALL=FILE"),
        (["--at", "5", "--script", "R"], "go with --continue"),
        (["--at", "5", "--limit", "max_rounds=nan"], "max_rounds: must be an integer"),
        (["--at", "5", "--limit", "retry_cap=inf"], "retry_cap: must be a finite number"),
        (["--at", "5", "--limit", "retry_cap=1e308"], "retry_cap: must be <= 3600"),
        (["--at", "5", "--limit", "max_rounds=10000000"], "must be from 1 to 10000"),
        (["--at", "5", "--limit", "max_turns=10"], "max_turns: unknown limit"),
        (["--at", "5", "--limit", "max_rounds"], "--limit takes KEY=VALUE"),
        (["--at", "5", "--limits", "J"], "max_rounds: must be an integer, got nan"),
        (["--at", "5", "--limit", "max_rounds=3", "--task", "x"], "give at most one edit"),
        (
            ["--at", "2", "--limit", "max_rounds=5", "--continue"],
            "max_rounds cannot change while this round's spawn_agents calls stand",
        ),
    ],
)
def test_an_edit_that_does_not_fit_is_one_line_and_writes_nothing(
    tmp_path: Path, two_children: Path, args: list[str], message: str
) -> None:
    db, root, _ = ran(tmp_path, two_children)
    reply = tmp_path / "reply.txt"
    reply.write_text("hello")
    limits = tmp_path / "limits.json"
    limits.write_text('{"max_rounds": NaN}')
    args = [str(reply) if a == "R" else str(limits) if a == "J" else a for a in args]
    before = roots(db)
    refused = run("fork", root, *args, "--db", db)
    assert refused.exit_code == 2, refused.output
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], refused.stderr
    assert roots(db) == before


def test_a_limits_edit_goes_on_under_the_new_limits(tmp_path: Path, two_children: Path) -> None:
    db, root, script = ran(tmp_path, two_children)
    before = events_of(db, root)
    # root/1 before its first reply, allowed one round: its second is the grace round.
    args = ["--agent", "1", "--at", "0", "--limit", "max_rounds=1", "--limit", "max_tokens=none"]
    done = run("fork", root, *args, "--id", "l", "--continue", "--script", script, "--db", db)
    assert done.exit_code == 0, done.output
    with Store.open(db) as store:
        child = store.load_state("l.1")
        assert child.limits.max_rounds == 1 and child.limits.max_tokens is None
        assert child.outcome is not None and child.outcome.result == "42"  # type: ignore[union-attr]
        source = store.load_state(f"{root}.1")
        assert source.limits.max_rounds == 20  # the source keeps its own
        assert any(UserMessage(GRACE_PROMPT) == m for m in child.history)
        assert not any(UserMessage(GRACE_PROMPT) == m for m in source.history)
    assert run("replay", "l", "--verify", "--tree", "--db", db).exit_code == 0
    told = run("transcript", "l", "--agent", "1", "--db", db).stdout
    assert "edit: the limits replaced" in told and "max_rounds = 1" in told
    assert events_of(db, root) == before


def test_a_limits_file_for_a_root_at_rest_is_recorded_at_once(
    tmp_path: Path, two_children: Path
) -> None:
    db, root, _ = ran(tmp_path, two_children)
    limits = tmp_path / "limits.toml"
    limits.write_text('max_rounds = 3\nchild_timeout = "none"\ncontext_modes = ["task_only"]\n')
    args: list[str | Path] = ["--at", "5", "--limits", limits, "--limit", "max_rounds=4"]
    done = run("fork", root, *args, "--id", "m", "--db", db)
    assert done.exit_code == 0, done.output
    with Store.open(db) as store:
        state = store.load_state("m")
        assert (state.limits.max_rounds, state.limits.child_timeout) == (4, None)
        assert state.limits.context_modes == ("task_only",)
        assert store.conversation("m").last_seq == 1
    assert run("replay", "m", "--verify", "--db", db).exit_code == 0


def _slow_then(result_latency: float) -> dict[str, Any]:
    """The continuation after root/1's edited reply: its next reply takes
    ``result_latency`` seconds (a kill lands while it is awaited)."""
    script: dict[str, Any] = json.loads(json.dumps(GO_ON))
    submit = script["agents"][1]["replies"][1]
    submit["latency"] = result_latency
    return script


def test_a_killed_continuation_of_an_edited_fork_resumes_like_any_tree(
    tmp_path: Path, two_children: Path
) -> None:
    db, root, _ = ran(tmp_path, two_children)
    before = events_of(db, root)
    runs = tmp_path / "runs.txt"
    reply = tmp_path / "reply.json"
    command = f"echo edited >> {runs}; echo 99"
    reply.write_text(
        json.dumps({"tool_calls": [{"name": "bash", "arguments": {"command": command}}]})
    )
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(_slow_then(60.0)))
    args = ["fork", root, "--agent", "1", "--at", "0", "--id", "e", "--reply", str(reply)]
    args += ["--continue", "--script", str(slow), "--db", str(db)]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from fanfold.cli import main; main()", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Wait until the edited tool has run and root/1 awaits its (slow) next reply.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with Store.open(db, read_only=True) as store:
                    if store.exists("e.1") and store.conversation("e.1").last_seq >= 2:
                        break
            except Exception:
                pass
            time.sleep(0.05)
        else:
            pytest.fail("the fork's continuation never reached root/1's next call")
        proc.kill()
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -9
    with Store.open(db) as store:
        assert not store.load_state("e").at_rest  # left unfinished by the kill
    resumed = run("resume", "--script", go_on_script(tmp_path), "--db", db)
    assert resumed.exit_code == 0, resumed.output
    with Store.open(db) as store:
        assert store.load_state("e.1").outcome.result.startswith("99")  # type: ignore[union-attr]
        assert store.load_state("e").at_rest
    assert run("replay", "e", "--verify", "--tree", "--db", db).exit_code == 0
    assert runs.read_text().split() == ["edited"]  # the edited tool ran once, in the fork
    assert events_of(db, root) == before


# ``fanfold fork`` in a process that kills itself (SIGKILL) the moment the fork goes
# on: after ``fork_at`` wrote the fork, before its resume delivered anything.
_KILLED_AS_IT_GOES_ON = """
import os, signal, sys
import fanfold.cli.resume_command as resume_command
def _killed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
resume_command._resume_main = _killed
from fanfold.cli import main
sys.argv[0] = "fanfold"
main()
"""


def test_a_fork_killed_before_its_edit_ran_resumes_with_the_edit(
    tmp_path: Path, two_children: Path
) -> None:
    # Issue 32.2: the fork was written first and its edit recorded only once the fork
    # ran; a kill between left a fork that ``resume`` ran unedited (the reply the user
    # replaced ran its command). The fork and its edit are one transaction now.
    db, root, _ = ran(tmp_path, two_children)
    before = events_of(db, root)
    runs = tmp_path / "runs.txt"
    reply = tmp_path / "reply.json"
    edited = f"echo edited >> {runs}; echo 99"
    reply.write_text(
        json.dumps({"tool_calls": [{"name": "bash", "arguments": {"command": edited}}]})
    )
    args = ["fork", root, "--agent", "1", "--at", "0", "--id", "e", "--reply", str(reply)]
    args += ["--continue", "--script", str(go_on_script(tmp_path)), "--db", str(db)]
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_AS_IT_GOES_ON, *map(str, args)],
        capture_output=True,
        timeout=120,
    )
    assert killed.returncode == -9, killed.stderr
    # The model, asked again on resume, would answer with the original command.
    script: dict[str, Any] = json.loads(json.dumps(GO_ON))
    original = {"name": "bash", "arguments": {"command": f"echo original >> {runs}; echo 1"}}
    script["agents"][1]["replies"][0] = {"tool_calls": [original]}
    again = tmp_path / "again.json"
    again.write_text(json.dumps(script))
    resumed = run("resume", "--script", again, "--db", db)
    assert resumed.exit_code == 0, resumed.output
    assert runs.read_text().split() == ["edited"]  # the edit's reply ran, never the original
    with Store.open(db) as store:
        assert store.load_state("e.1").outcome.result.startswith("99")  # type: ignore[union-attr]
        assert store.load_state("e").at_rest
    assert run("replay", "e", "--verify", "--tree", "--db", db).exit_code == 0
    assert events_of(db, root) == before


def test_a_fork_carrying_an_edit_its_state_refuses_is_refused_by_the_reducer(
    tmp_path: Path, two_children: Path
) -> None:
    # The edit waits in the fork's ConversationForked: ``start`` checks it fits, so no
    # log can hold a fork whose resume would then fail on its edit.
    db, root, _ = ran(tmp_path, two_children)
    before = roots(db)
    with Store.open(db) as store:
        with pytest.raises(IllegalTransition, match="its edit does not fit its state"):
            fork_tree(store, f"{root}.1", 1, new_id="x", key=UserKey.load(), edit=TaskEdit("t"))
        state = store.load_state(root)
        with pytest.raises(IllegalTransition, match="takes its edit as a ForkEdited"):
            start(ConversationForked("y", root, 5, state, SystemPromptEdit("p")))
    assert roots(db) == before


def test_an_enum_value_equal_to_the_root_id_is_not_renamed(tmp_path: Path) -> None:
    # A root named "cancelled", whose cancelled children fail with ErrorKind.CANCELLED
    # (a StrEnum, so a str): only ids are renamed, never a value that spells one.
    driver = Driver()
    cancelled_fan_out(driver, "cancelled")
    db = tmp_path / "log.db"
    write(db, driver.steps)
    with Store.open(db) as store:
        last = store.conversation("cancelled.2").last_seq
        fork = fork_tree(store, "cancelled.2", last, new_id="f", key=UserKey.load())
        assert replay.verify(store, fork, tree=True).ok
        outcome = store.load_state("f.2").outcome
        assert outcome is not None and outcome == store.load_state("cancelled.2").outcome
