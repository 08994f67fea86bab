"""``fanfold diff``: two trees side by side, from a real log file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result
from db_scenarios import BASH, Driver, fan_out
from replay_helpers import write

from fanfold.cli import cli
from fanfold.statemachine import ConversationCreated, ToolCall, UserMessaged

HOSTILE = "x\x1b]0;pwned\x07 \x1b[2J\u202e\rover"


def run(*args: str | Path) -> Result:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def diff_json(db: Path, a: str, b: str) -> dict[str, Any]:
    result = run("diff", a, b, "--json", "--db", db)
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def logged(tmp_path: Path, *build: Any) -> Path:
    driver = Driver(snapshot_every=3)
    for make in build:
        make(driver)
    path = tmp_path / "log.db"
    write(path, driver.steps)
    return path


def test_two_runs_of_one_task_are_the_same_whatever_their_ids(tmp_path: Path) -> None:
    # The fan-in result names the children by id (r.1 / s.1): not a difference.
    db = logged(tmp_path, lambda d: fan_out(d, "r"), lambda d: fan_out(d, "s"))
    report = diff_json(db, "r", "s")
    assert (report["a"], report["b"]) == ("r", "s")
    assert [a["path"] for a in report["agents"]] == ["root", "root/1", "root/2", "root/3"]
    assert all(a["same"] and a["parting"] is None for a in report["agents"]), report
    assert report["agents"][0]["a"]["rounds"] == report["agents"][0]["b"]["rounds"] == 2


def test_a_changed_sub_agent_parts_at_its_first_different_step(tmp_path: Path) -> None:
    db = logged(
        tmp_path,
        lambda d: fan_out(d, "r", ("tool", "retry", "error")),
        lambda d: fan_out(d, "s", ("tool", "retry", "result")),
    )
    agents = {a["path"]: a for a in diff_json(db, "r", "s")["agents"]}
    assert agents["root/1"]["same"] and agents["root/2"]["same"]
    third = agents["root/3"]
    assert third["parting"] == {
        "index": 1,
        "a": {"seq": 1, "kind": "tool_call", "text": 'submit_error {"error":"no"}'},
        "b": {"seq": 1, "kind": "tool_call", "text": 'submit_result {"result":"3"}'},
    }
    assert (third["a"]["phase"], third["b"]["phase"]) == ("Failed", "Completed")
    root = agents["root"]["parting"]
    assert root["a"]["kind"] == "tool_result" and root["a"]["seq"] == root["b"]["seq"] == 5
    out = run("diff", "r", "s", "--db", db).stdout
    assert "Failed → Completed" in out
    assert "root/3 parts at item 1:" in out
    assert 'A seq 1 tool_call: submit_error {"error":"no"}' in out
    assert 'B seq 1 tool_call: submit_result {"result":"3"}' in out


def test_an_original_and_its_fork(tmp_path: Path) -> None:
    db = logged(tmp_path, lambda d: fan_out(d, "r"))
    assert run("fork", "r", "--at", "6", "--id", "f", "--db", db).exit_code == 0
    agents = diff_json(db, "r", "f")["agents"]
    # The fork holds the root's history: the same, and it has no sub-agent trees.
    assert agents[0]["path"] == "root" and agents[0]["same"]
    assert [(a["path"], a["b"]) for a in agents[1:]] == [
        ("root/1", None),
        ("root/2", None),
        ("root/3", None),
    ]
    out = run("diff", "r", "f", "--db", db).stdout
    assert out.count("only in A") == 3


def test_one_that_stops_earlier_and_recorded_text_is_escaped(tmp_path: Path) -> None:
    def conversation(d: Driver, cid: str, said: str, *, more: bool) -> None:
        d.create(ConversationCreated(cid, cwd="/work", tools=(BASH,)))
        d.feed(cid, UserMessaged("go"))
        d.reply(cid, said, ToolCall.of(f"{cid}-b", "bash", {"command": said}))
        d.finish_tool(cid, said)
        if more:
            d.reply(cid, "done")

    db = logged(
        tmp_path,
        lambda d: conversation(d, "a", HOSTILE, more=True),
        lambda d: conversation(d, "b", HOSTILE, more=False),
        lambda d: conversation(d, "c", "plain", more=True),
    )
    parting = diff_json(db, "a", "b")["agents"][0]["parting"]
    assert parting["b"] is None and parting["a"]["text"] == "done"
    assert "(nothing: it ends before)" in run("diff", "a", "b", "--db", db).stdout
    for args in (["a", "c"], ["a", "c", "--json"]):
        out = run("diff", *args, "--db", db).stdout
        for raw in ("\x1b", "\x07", "\u202e", "\r"):
            assert raw not in out, (raw, out)
    shown = run("diff", "a", "c", "--db", db).stdout
    assert "\\x1b]0;pwned\\x07" in shown
    parting = diff_json(db, "a", "c")["agents"][0]["parting"]
    assert parting["a"]["text"] == HOSTILE and parting["b"]["text"] == "plain"


def test_an_unknown_tree_is_one_line(tmp_path: Path) -> None:
    db = logged(tmp_path, lambda d: fan_out(d, "r"))
    result = run("diff", "r", "nope", "--db", db)
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == ["error: no conversation 'nope' in the database"], result.stderr


def test_differing_lines_are_those_the_other_side_lacks() -> None:
    """What the trace page's side-by-side view marks (issue 24): lines compared as the
    items are, so a tree's own id in a line is not a difference."""
    from fanfold.replay.compare import Said, differing_lines

    def item(text: str, key: str | None = None) -> Said:
        return Said(1, "assistant", text, key if key is not None else text)

    a = item("one\ntwo\nthree")
    assert differing_lines(a, item("one\n2\nthree")) == ([1], [1])
    assert differing_lines(a, item("one\ntwo\nthree\nfour")) == ([], [3])
    assert differing_lines(item("r.1 said\nx"), item("s.1 said\ny", "r.1 said\ny")) == ([1], [1])
    # A key whose line count the id changed: the text's lines are compared.
    assert differing_lines(item("a\nb"), item("a\nc", "a")) == ([1], [1])
