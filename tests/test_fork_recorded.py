"""A what-if changes only what was edited (issue 34): a fork's conversations other
than the edited one and its ancestors take their recorded results from the source
(a sibling's bash still running at the fork moment keeps the result it had there),
``--rerun-siblings`` runs them live instead, and ``diff`` compares like with like."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
from click.testing import CliRunner, Result
from db_scenarios import Driver, fan_out
from replay_helpers import write

from fanfold import replay, testing
from fanfold.cli import cli
from fanfold.db import Store
from fanfold.db.codec import decode_event, encode_event
from fanfold.db.provenance import UserKey
from fanfold.replay.fork import fork_tree
from fanfold.statemachine import (
    CancelRequested,
    RuntimeResumed,
    ToolCall,
    ToolResultMessage,
    transition,
)
from fanfold.statemachine.transition import FORKED_TOOL_RESULT, INTERRUPTED_RESULT

# The root delegates two tasks. root/1 runs a quick command and submits; root/2's bash
# (a real subprocess) sleeps, so it is still running when root/1 takes its steps.
FAN_OUT = {
    "latency": 0.0,
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                {
                    "tool_calls": [
                        {
                            "name": "spawn_agents",
                            "arguments": {"tasks": [{"task": "quick"}, {"task": "slow"}]},
                        }
                    ]
                },
                {"text": "both done"},
            ],
        },
        {
            "match": {"path": "root/1"},
            "replies": [
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo one"}}]},
                {"tool_calls": [{"name": "submit_result", "arguments": {"result": "one"}}]},
            ],
        },
        {
            "match": {"path": "root/2"},
            "replies": [
                {
                    "tool_calls": [
                        {"name": "bash", "arguments": {"command": "sleep 1.5; echo slow-done"}}
                    ]
                },
                {"text": "slow finished"},
            ],
        },
    ],
}
for _agent in FAN_OUT["agents"]:  # type: ignore[attr-defined]
    for _reply in _agent["replies"]:
        _reply["usage"] = {"input_tokens": 100, "output_tokens": 20}
# root/1's second reply, given again as the edit: an edit that changes nothing.
SAME_REPLY = {"tool_calls": [{"name": "submit_result", "arguments": {"result": "one"}}]}


def run(*args: str | Path) -> Result:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


@pytest.fixture(scope="module")
def fanned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with ``log.db`` holding one finished FAN_OUT tree, and its script (run
    once: root/2's sleep takes 1.5 s); each test works on a copy (``copied``)."""
    folder = tmp_path_factory.mktemp("fan-out")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FANFOLD_KEY_FILE", str(tmp_path_factory.getbasetemp() / "provenance.key"))
        patch.setenv("FANFOLD_TRUST_FILE", str(folder / "trusted.json"))
        script = folder / "script.json"
        script.write_text(json.dumps(FAN_OUT))
        done = run("run", "--db", folder / "log.db", "--script", script, "--cwd", folder, "go")
    assert done.exit_code == 0, done.output
    return folder


def copied(folder: Path, template: Path) -> tuple[Path, str, Path]:
    for path in template.iterdir():
        if path.name.startswith(("log.db", "script.json")):
            shutil.copy2(path, folder / path.name)
    db = folder / "log.db"
    with Store.open(db) as store:
        (root,) = store.list_roots()
    return db, root.id, folder / "script.json"


def tool_results(db: Path, conversation_id: str) -> list[str]:
    with Store.open(db) as store:
        history = store.load_state(conversation_id).history
    return [m.result.content for m in history if isinstance(m, ToolResultMessage)]


# root/1's step awaiting its second reply (0: created, 1: its bash call, 2: its
# result); root/2's sleep is running then.
MOMENT = "2"


def fork_same_reply(tmp_path: Path, db: Path, root: str, script: Path, *extra: str) -> Result:
    reply = tmp_path / "reply.json"
    reply.write_text(json.dumps(SAME_REPLY))
    args: list[str | Path] = ["fork", root, "--agent", "1", "--at", MOMENT, "--id", "f"]
    return run(*args, "--reply", reply, *extra, "--continue", "--script", script, "--db", db)


def diff(db: Path, a: str, b: str) -> dict[str, Any]:
    shown = run("diff", a, b, "--json", "--db", db)
    assert shown.exit_code == 0, shown.output
    report: dict[str, Any] = json.loads(shown.stdout)
    return report


def test_an_edit_that_changes_nothing_leaves_every_agent_the_same(
    tmp_path: Path, fanned: Path
) -> None:
    db, root, script = copied(tmp_path, fanned)
    # At the fork moment root/2's bash is running in the source (it finished later).
    with Store.open(db) as store:
        then = {}
        for step in replay.steps(store, root, tree=True):
            then[step.conversation_id] = step.after_state
            if (step.conversation_id, step.seq) == (f"{root}.1", int(MOMENT)):
                break
        assert type(then[f"{root}.2"].phase).__name__ == "ToolExecuting"
        shown = store.events(f"{root}.2")
        assert any(type(s.event).__name__ == "ToolFinished" for s in shown)
    done = fork_same_reply(tmp_path, db, root, script)
    assert done.exit_code == 0, done.output
    # The sibling keeps the result its bash had in the source: nothing restarted.
    assert tool_results(db, "f.2") == tool_results(db, f"{root}.2")
    assert "slow-done" in tool_results(db, "f.2")[0]
    assert not any(
        INTERRUPTED_RESULT in t or FORKED_TOOL_RESULT in t for t in tool_results(db, "f.2")
    )
    with Store.open(db) as store:
        row = store.conversation("f.2")
        # Copied at its source's last step (its recorded future), not at the moment.
        assert row.forked_at_seq == store.conversation(f"{root}.2").last_seq
        assert store.load_state("f.2").outcome == store.load_state(f"{root}.2").outcome
    report = diff(db, root, "f")
    assert [(a["path"], a["same"]) for a in report["agents"]] == [
        ("root", True),
        ("root/1", True),
        ("root/2", True),
    ]
    assert run("replay", "f", "--verify", "--tree", "--db", db).exit_code == 0


def test_diff_compares_whole_totals_of_tokens(tmp_path: Path, fanned: Path) -> None:
    db, root, script = copied(tmp_path, fanned)
    assert fork_same_reply(tmp_path, db, root, script).exit_code == 0
    report = diff(db, root, "f")
    tokens = {a["path"]: (a["a"]["tokens"], a["b"]["tokens"]) for a in report["agents"]}
    # The same calls (a fork's inherited ones included) count the same on each side:
    # the root's two calls, root/2's two (recorded); root/1's second reply was the
    # user's edit, no model call, so only its first counts in the fork.
    assert tokens == {"root": (240, 240), "root/1": (240, 120), "root/2": (240, 240)}
    assert "whole total" in report["tokens_compared"]
    shown = run("diff", root, "f", "--db", db).stdout
    assert "tokens and cost: each conversation's whole total" in shown


def test_rerun_siblings_runs_them_live_and_says_why_a_tool_has_no_result(
    tmp_path: Path, fanned: Path
) -> None:
    db, root, script = copied(tmp_path, fanned)
    done = fork_same_reply(tmp_path, db, root, script, "--rerun-siblings")
    assert done.exit_code == 0, done.output
    # The sibling went on live from the moment: its running bash was not run again,
    # and its result names the fork, not a restart that never happened.
    results = tool_results(db, "f.2")
    assert len(results) == 1 and FORKED_TOOL_RESULT in results[0], results
    assert "restarted" not in results[0]
    told = run("transcript", "f", "--agent", "2", "--db", db).stdout
    assert "the fork went on (no restart" in told and "runtime resumed" not in told
    with Store.open(db) as store:
        at = store.conversation("f.2").forked_at_seq
        assert at is not None and at < store.conversation(f"{root}.2").last_seq
    report = diff(db, root, "f")
    assert dict((a["path"], a["same"]) for a in report["agents"])["root/2"] is False
    assert run("replay", "f", "--verify", "--tree", "--db", db).exit_code == 0


def test_a_sibling_tool_the_source_never_finished_says_so(tmp_path: Path) -> None:
    # The source is killed (-9) while root/2's bash runs: its log holds no result of
    # that call. The fork cannot take one, does not run the call again, and its result
    # says that, where it used to speak of a restart that never happened.
    script_data: dict[str, Any] = json.loads(json.dumps(FAN_OUT))
    slow_call = script_data["agents"][2]["replies"][0]["tool_calls"][0]
    slow_call["arguments"]["command"] = "sleep 60; echo never"
    script = tmp_path / "script.json"
    script.write_text(json.dumps(script_data))
    db = tmp_path / "log.db"
    args = ["run", "--db", str(db), "--script", str(script), "--cwd", str(tmp_path), "go"]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from fanfold.cli import main; main()", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its bash too is killed with it
    )
    try:
        deadline = time.monotonic() + 60
        root = None
        while time.monotonic() < deadline and root is None:
            try:
                with Store.open(db, read_only=True) as store:
                    roots = store.list_roots()
                    if roots and store.exists(f"{roots[0].id}.2"):
                        state = store.load_state(f"{roots[0].id}.1")
                        running = store.load_state(f"{roots[0].id}.2").phase
                        if state.is_terminal and type(running).__name__ == "ToolExecuting":
                            root = roots[0].id
            except Exception:
                pass
            time.sleep(0.05)
        assert root is not None, "the source never reached root/2's running bash"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    done = fork_same_reply(tmp_path, db, root, script)
    assert done.exit_code == 0, done.output
    results = tool_results(db, "f.2")
    assert len(results) == 1 and FORKED_TOOL_RESULT in results[0], results
    assert "restarted" not in results[0] and "never" not in results[0]
    with Store.open(db) as store:
        assert store.load_state("f.2").outcome.result == "slow finished"  # type: ignore[union-attr]
        assert store.load_state("f").at_rest
    assert run("replay", "f", "--verify", "--tree", "--db", db).exit_code == 0


def test_a_sibling_keeps_its_record_until_a_live_parent_cancels_it(tmp_path: Path) -> None:
    # The source: c.2 runs a tool and has its result, then c.1 finishes, then the user
    # cancels the root, which cancels c.2. Forked at c.1's first step, c.2 keeps its
    # tool result (recorded after the moment) but not the cancel: its parent goes on
    # live, and only it can say whether c.2 is cancelled in the fork.
    driver = Driver()
    first, second = fan_out(driver, "c", ("result", "text"), finish=False)
    driver.reply(second, "looking", ToolCall.of("b", "bash", {"command": "ls"}))
    kept = driver.finish_tool(second, "README.md").seq
    driver.run_child(first, "result")
    driver.deliver_outcome(first)
    driver.feed("c", CancelRequested())
    for child in driver.deliver_cancels("c"):
        driver.deliver_outcome(child)
    db = tmp_path / "log.db"
    write(db, driver.steps)
    with Store.open(db) as store:
        assert store.load_state(second).is_terminal  # cancelled in the source
        fork = fork_tree(store, first, 0, new_id="f", key=UserKey.load())
        assert replay.verify(store, fork, tree=True).ok
        assert store.conversation("f.2").forked_at_seq == kept
        sibling = store.load_state("f.2")
        assert not sibling.is_terminal and "README.md" in str(sibling.history[-1])
        assert store.conversation("f.1").forked_at_seq == 0  # the picked one: the moment
        again = fork_tree(store, first, 0, new_id="g", key=UserKey.load(), rerun_siblings=True)
        # --rerun-siblings: c.2 did not exist yet at the moment; the resume makes it.
        assert [row.id for row in store.tree(again)] == ["g", "g.1"]


def test_a_forked_first_going_on_is_encoded_only_when_set_and_says_fork() -> None:
    # RuntimeResumed() is written as before (older logs byte for byte); the flag
    # round-trips; and the reducer gives the running tool the fork's text.
    assert encode_event(RuntimeResumed()) == encode_event(RuntimeResumed(forked=False))
    assert "forked" not in encode_event(RuntimeResumed())
    flagged = RuntimeResumed(("x",), forked=True)
    assert decode_event(encode_event(flagged)) == flagged
    driver = Driver()
    (child,) = fan_out(driver, "r", ("tool",), finish=False)
    driver.reply(child, "looking", ToolCall.of("b", "bash", {"command": "ls"}))
    running = driver.states[child]
    for event, text in ((flagged, FORKED_TOOL_RESULT), (RuntimeResumed(), INTERRUPTED_RESULT)):
        after, effects = transition(running, event)
        testing.check_transition(running, event, after, effects)
        assert [m.result.content for m in after.history if isinstance(m, ToolResultMessage)] == [
            text
        ]


def test_a_later_step_today_s_reducer_does_not_reproduce_ends_the_copy_there(
    tmp_path: Path,
) -> None:
    # A fork at an earlier moment is still made (as before recorded futures): the
    # sibling's copy stops before the step that diverges and goes on live from there.
    driver = Driver()
    first, second = fan_out(driver, "c", ("result", "text"), finish=False)
    replied = driver.reply(second, "looking", ToolCall.of("b", "bash", {"command": "ls"})).seq
    finished = driver.finish_tool(second, "README.md")
    driver.run_child(first, "result")
    steps = [
        attrs.evolve(s, state=attrs.evolve(s.state, rounds=99)) if s is finished else s
        for s in driver.steps
    ]
    db = tmp_path / "log.db"
    write(db, steps)
    with Store.open(db) as store:
        assert not replay.verify(store, "c", tree=True).ok
        fork = fork_tree(store, first, 0, new_id="f", key=UserKey.load())
        assert replay.verify(store, fork, tree=True).ok
        assert store.conversation("f.2").forked_at_seq == replied
