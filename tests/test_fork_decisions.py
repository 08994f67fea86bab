"""Issue 35 in time travel: ``fanfold fork --approve/--deny`` forks a tree at the step
that asked and decides that request otherwise than the source did (a ``DecisionEdit``,
written with the fork), on a real SQLite log; the source is untouched."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fanfold.cli import cli
from fanfold.db import Store
from fanfold.replay.transcript import transcript
from fanfold.runtime.approvals import open_request
from fanfold.statemachine import DecisionEdit, ForkEdited, ToolResultMessage, transition

EXIT_WAITING = 75


def run(*args: object) -> Result:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def _script(path: Path, replies: list[dict[str, object]]) -> Path:
    path.write_text(
        json.dumps({"latency": 0.0, "agents": [{"match": {"path": "root"}, "replies": replies}]})
    )
    return path


def _seq_of(db: Path, conversation: str, event_type: str) -> int:
    conn = sqlite3.connect(db)
    try:
        row = conn.execute(
            "SELECT seq FROM events WHERE conversation_id = ? AND type = ?",
            (conversation, event_type),
        ).fetchone()
    finally:
        conn.close()
    assert row is not None, event_type
    return int(row[0])


def _results(db: Path, conversation: str) -> list[str]:
    with Store.open(db, read_only=True) as store:
        state = store.load_state(conversation)
    done = [m.result for m in state.history if isinstance(m, ToolResultMessage)]
    # A round still going on keeps its results in its phase until it ends.
    done += list(getattr(state.phase, "results", ()))
    return [result.content.split("\n")[0] for result in done]


def test_fork_decides_a_request_the_other_way(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    calls = [
        {"name": "bash", "arguments": {"command": "echo a | tee -a ran.txt"}},
        {"name": "bash", "arguments": {"command": "echo b | tee -a ran.txt"}},
    ]
    source = _script(tmp_path / "source.json", [{"tool_calls": calls}, {"text": "done"}])
    after = _script(tmp_path / "after.json", [{"text": "after"}] * 2)  # by round
    common: list[object] = ["--db", db]
    started = run(
        "run", "go", "--script", source, "--ask", "Bash(echo:*)", "--no-wait", "--cwd", tmp_path,
        *common,
    )  # fmt: skip
    assert started.exit_code == EXIT_WAITING, started.output
    with Store.open(db, read_only=True) as store:
        (row,) = store.unfinished()
        root = row.root_id
    # The source: the first call denied, the second approved.
    denied = run("deny", root, "--reason", "not a", "--continue", *common)
    assert denied.exit_code == EXIT_WAITING, denied.output
    approved = run("approve", root, "--continue", *common)
    assert approved.exit_code == 0, approved.output
    assert (tmp_path / "ran.txt").read_text() == "b\n"
    assert _results(db, root) == ["denied by the user: not a", "b"]
    source_events = _seq_of(db, root, "ApprovalGranted")

    # Fork 1: approve (with edited arguments) what the source denied. The edited call
    # runs once in the fork; the round's next call asks again, as in the source.
    at = _seq_of(db, root, "ApprovalDenied") - 1
    forked = run(
        "fork", root, "--at", at, "--id", "yes", "--approve",
        "--args", '{"command": "echo edited | tee -a ran.txt"}',
        "--continue", "--script", after, *common,
    )  # fmt: skip
    assert forked.exit_code == EXIT_WAITING, forked.output
    assert (tmp_path / "ran.txt").read_text() == "b\nedited\n"
    assert _results(db, "yes") == ["edited"]
    with Store.open(db, read_only=True) as store:
        waiting = open_request(store.load_state("yes"))
    assert waiting is not None and waiting.arguments() == calls[1]["arguments"]

    # Fork 2: deny what the source approved: it never runs; the model reads why.
    at = _seq_of(db, root, "ApprovalGranted") - 1
    forked = run(
        "fork", root, "--at", at, "--id", "no", "--deny", "changed my mind",
        "--continue", "--script", after, *common,
    )  # fmt: skip
    assert forked.exit_code == 0, forked.output
    assert (tmp_path / "ran.txt").read_text() == "b\nedited\n"
    assert _results(db, "no") == [
        "denied by the user: not a",
        "denied by the user: changed my mind",
    ]
    with Store.open(db, read_only=True) as store:
        assert store.load_state("no").history[-1].text == "after"  # type: ignore[union-attr]
        entries = transcript(store, "no").entries
    assert any(e.kind == "edit" and "denied in this fork" in e.label for e in entries)

    for tree in (root, "yes", "no"):
        assert run("replay", tree, "--verify", "--tree", *common).exit_code == 0
    assert _seq_of(db, root, "ApprovalGranted") == source_events  # the source untouched

    # Where no request is open, the edit is refused before anything is written.
    refused = run("fork", root, "--at", 0, "--deny", "x", "--continue", *common)
    assert refused.exit_code != 0 and "DecisionEdit is legal in" in refused.output
    wrong = run("fork", root, "--at", at, "--answer", "x", "--continue", *common)
    assert wrong.exit_code != 0 and "cannot edit" in wrong.output
    both = run("fork", root, "--at", at, "--deny", "x", "--approve", *common)
    assert both.exit_code != 0 and "one of --approve, --deny and --answer" in both.output


def test_a_decision_edit_is_the_decision_itself() -> None:
    """The reducer takes a DecisionEdit only where its request is open, as the
    decision it stands for (``sm_support.step`` checks fanfold.testing's properties:
    a granted call runs under its request's number, a denied one never runs)."""
    from sm_support import of_type, only, replied, step, tool
    from test_approvals_reducer import asking_root

    from fanfold.statemachine import ApprovalGranted, IllegalTransition, RunTool
    from fanfold.statemachine.effects import RequestApproval

    state = asking_root("Bash(git push:*)")
    state, effects = step(state, replied(state, tool("c1", command="git push origin main")))
    call = only(effects, RequestApproval).call
    edited = '{"command":"git push origin fix"}'
    granted, effects = step(state, ForkEdited(DecisionEdit(ApprovalGranted(call, edited, "fork"))))
    run = only(effects, RunTool)
    assert run.call == call and run.tool_call.arguments_json == edited
    assert open_request(granted) is None
    with pytest.raises(IllegalTransition, match="DecisionEdit is legal in"):
        transition(granted, ForkEdited(DecisionEdit(ApprovalGranted(call))))
    with pytest.raises(IllegalTransition):  # the wrong call number: as the decision
        transition(state, ForkEdited(DecisionEdit(ApprovalGranted(call + 5))))
    assert not of_type(effects, RequestApproval)
