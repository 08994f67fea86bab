"""``fanfold trace``: the page's data from a real log, the HTML's escaping, the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from db_scenarios import Driver, cancelled_fan_out
from replay_helpers import edit, write
from trace_helpers import (
    EDITED_REPLY,
    HOSTILE,
    MARKS_SCRIPT,
    diverge,
    forked_with_edit,
    run_script,
)

from fanfold.cli import cli
from fanfold.db import Store
from fanfold.trace import build_trace, embed_json, render_html


@pytest.fixture(scope="module")
def marks_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return run_script(tmp_path_factory.mktemp("marks"), MARKS_SCRIPT)


@pytest.fixture(scope="module")
def trace(marks_log: tuple[Path, str]) -> dict[str, Any]:
    db, root = marks_log
    with Store.open(db, read_only=True) as store:
        data: dict[str, Any] = build_trace(store, root)
    return data


def agent(trace: dict[str, Any], suffix: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [a for a in trace["agents"] if a["id"] == trace["root"] + suffix]
    assert len(found) == 1
    return found[0]


def kinds(a: dict[str, Any]) -> list[str]:
    return [m["k"] for m in a["marks"]]


def run(*args: str | Path) -> Result:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def test_agents_come_in_tree_order_with_their_outcomes(trace: dict[str, Any]) -> None:
    ids = [a["id"] for a in trace["agents"]]
    root = trace["root"]
    assert ids == [root, f"{root}.1", f"{root}.2", f"{root}.3"]
    assert trace["agents"][0]["children"] == [1, 2, 3]
    assert [a["status"] for a in trace["agents"]] == ["idle", "completed", "completed", "failed"]
    assert agent(trace, ".3")["outcome"]["kind"] == "timed_out"
    assert agent(trace, ".2")["outcome"]["text"] == HOSTILE
    assert trace["agents"][0]["outcome"]["text"] == "final " + HOSTILE
    assert trace["divergence"] is None and trace["findings"] == []


def test_marks_show_model_calls_tools_retries_waits_and_deadlines(trace: dict[str, Any]) -> None:
    root = trace["agents"][0]
    assert kinds(root) == ["model", "wait", "model"]
    first_call = root["marks"][0]
    assert first_call["tokens"] == {"input": 100, "output": 10, "cached": 0}
    assert first_call["stop"] == "tool_use" and first_call["tools"] == ["spawn_agents"]
    assert first_call["t1"] > first_call["t0"] >= 0
    assert kinds(agent(trace, ".1")) == ["model", "tool", "model"]
    assert agent(trace, ".1")["marks"][1]["tool"] == "bash"
    retried = agent(trace, ".2")["marks"]
    assert [m["k"] for m in retried[:3]] == ["model", "retry", "model"]
    assert retried[0]["error"] == "rate_limit"
    assert retried[1]["error"] == "rate_limit"
    assert retried[2]["attempt"] == 2
    # The slow child's time limit fires while its model call runs: the call is aborted.
    slow = agent(trace, ".3")["marks"]
    assert [m["k"] for m in slow] == ["model", "deadline"]
    assert slow[0]["error"] == "aborted" and slow[0]["t1"] == slow[1]["t0"]
    assert slow[1]["label"] == "time limit (0.3 s)"
    # Every mark lies in its agent's lifetime, which lies in the trace.
    for a in trace["agents"]:
        assert 0 <= a["start"] <= a["end"] <= trace["duration"]
        for mark in a["marks"]:
            assert a["start"] <= mark["t0"] <= mark["t1"] <= a["end"], (a["id"], mark)


def test_child_outcomes_are_those_the_parent_received(trace: dict[str, Any]) -> None:
    received = {c["id"].rsplit(".", 1)[1]: c for c in trace["agents"][0]["child_outcomes"]}
    assert received["1"]["ok"] and received["1"]["text"] == "hi"
    assert received["2"]["text"] == HOSTILE
    assert not received["3"]["ok"] and received["3"]["kind"] == "timed_out"


def test_steps_replay_the_whole_tree_in_time_order(trace: dict[str, Any]) -> None:
    steps = trace["steps"]
    with_seq0 = [s for s in steps if s[1] == 0]
    assert len(with_seq0) == 4
    times = [s[2] for s in steps]
    assert times == sorted(times)
    assert all(s[7] for s in steps)  # every step replays identically
    assert steps[-1][0] == 0 and steps[-1][3] == "Idle"


def test_a_cancelled_tree_shows_its_cancels(tmp_path: Path) -> None:
    driver = Driver()
    cancelled_fan_out(driver)  # c spawns c.1 and c.2; c.1 finishes; the user cancels c
    write(tmp_path / "c.db", driver.steps)
    with Store.open(tmp_path / "c.db", read_only=True) as store:
        data = build_trace(store, "c")
    root, done, cancelled = data["agents"]
    assert (root["status"], done["status"], cancelled["status"]) == (
        "cancelled",
        "completed",
        "cancelled",
    )
    assert cancelled["outcome"]["reason"] == "parent"
    assert kinds(root) == ["model", "wait", "cancel", "cancel", "cancelling"]
    assert [m["label"] for m in root["marks"][2:4]] == [
        "cancel (user)",
        "cancel 1 sub-agent(s) (parent)",
    ]
    assert kinds(cancelled) == ["model", "cancel"]
    assert cancelled["marks"][0]["error"] == "aborted"


def test_a_log_that_fails_verify_names_its_first_divergence(tmp_path: Path) -> None:
    db, root = run_script(tmp_path, MARKS_SCRIPT)
    diverge(db, f"{root}.1", 2)
    with Store.open(db, read_only=True) as store:
        data = build_trace(store, root)
    found = data["divergence"]
    assert found is not None
    assert data["agents"][found["agent"]]["id"] == f"{root}.1"
    assert found["seq"] == 2
    # The added effect changes the step's content digest too (fingerprint format 5).
    assert "recorded and recomputed effects and state fingerprint differ" in found["headline"]
    assert '"call": 999' in found["recorded_effects"]
    assert '"call": 999' not in found["recomputed_effects"]
    step = data["steps"][found["step"]]
    assert (step[0], step[1], step[7]) == (found["agent"], 2, False)


def test_a_damaged_log_shows_the_steps_before_the_damage(tmp_path: Path) -> None:
    db, root = run_script(tmp_path, MARKS_SCRIPT)
    edit(
        db,
        f"UPDATE events SET payload = 'garbage' WHERE conversation_id = '{root}.2' AND seq = 1",
        sealed=False,
    )
    with Store.open(db, read_only=True) as store:
        data = build_trace(store, root)
    (finding,) = data["findings"]
    assert f"conversation {root}.2, seq 1" in finding
    assert [s[1] for s in data["steps"] if s[0] == 2] == [0]
    assert len(data["agents"]) == 4
    result = run("trace", root, "--db", db, "-o", tmp_path / "t.html")
    assert result.exit_code == 0 and "the log is damaged" in result.stdout


def test_embedded_json_cannot_close_its_script_block() -> None:
    text = embed_json({"t": HOSTILE})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"t": HOSTILE}


def test_the_page_holds_no_markup_from_the_log(trace: dict[str, Any]) -> None:
    page = render_html(trace)
    assert page.count("</script>") == 2  # the data block and the page's own script
    assert "<img" not in page and "<b>not bold" not in page
    assert "window.__pwned" in page  # the text is there, as escaped data
    script = page[page.rindex("<script>") :]
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script
    assert "eval(" not in script and "document.write" not in script
    # No network: nothing is loaded from anywhere, and the policy says so.
    assert not re.search(r"(src|href)=\"?https?:", page)
    assert "default-src 'none'" in page and "connect-src" not in page


def test_cli_writes_the_page(marks_log: tuple[Path, str], tmp_path: Path) -> None:
    db, root = marks_log
    out = tmp_path / "t.html"
    result = run("trace", root, "-o", out, "--db", db)
    assert result.exit_code == 0, result.output
    assert "4 agent(s)" in result.stdout
    assert out.read_text(encoding="utf-8").startswith("<!doctype html>")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "error: no conversation 'nope' in the database"),
        (["x", "-o", "/nonexistent-dir/t.html"], "error: cannot write /nonexistent-dir/t.html"),
    ],
)
def test_cli_errors_are_one_line(
    marks_log: tuple[Path, str], args: list[str], message: str
) -> None:
    db, root = marks_log
    args = [root if a == "x" else a for a in args]
    result = run("trace", *args, "--db", db)
    assert result.exit_code == 2
    assert result.stderr.strip().startswith(message), result.stderr


def test_cli_refuses_a_file_that_is_no_log(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_text("not a database")
    result = run("trace", "x", "--db", bad, "-o", tmp_path / "t.html")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1


def test_default_output_name_stays_here() -> None:
    from fanfold.cli.trace_command import default_output

    assert default_output("abc.1") == Path("trace-abc.1.html")
    assert default_output("../../etc/passwd") == Path("trace-_.._etc_passwd.html")
    assert default_output("..").parent == Path(".")


def test_a_refusal_gives_its_category_and_explanation_apart(tmp_path: Path) -> None:
    """Issue 22, item 15: the page's outcome of a refused agent (and the outcome its
    parent received) carries the refusal's category and explanation as fields, not
    only the error text with Anthropic's stop_details JSON in it."""
    details = json.dumps({"category": "cyber", "explanation": "Not with exploits."})
    refused = {"text": "", "stop_reason": "refusal", "stop_details": details}
    spawn = {"name": "spawn_agents", "arguments": {"tasks": [{"task": "declines"}]}}
    script = {
        "latency": 0,
        "agents": [
            {"match": {"path": "root"}, "replies": [{"tool_calls": [spawn]}, {"text": "ok"}]},
            {"match": {"path": "root/1"}, "replies": [refused]},
        ],
    }
    db, root = run_script(tmp_path, script)
    with Store.open(db, read_only=True) as store:
        data = build_trace(store, root)
    child = agent(data, ".1")
    assert child["outcome"]["kind"] == "refused"
    assert (child["outcome"]["category"], child["outcome"]["explanation"]) == (
        "cyber",
        "Not with exploits.",
    )
    (received,) = agent(data, "")["child_outcomes"]
    assert (received["category"], received["explanation"]) == ("cyber", "Not with exploits.")
    assert "category" not in agent(data, "")["outcome"]  # an answer is no refusal


def test_steps_name_what_an_abort_stops(trace: dict[str, Any]) -> None:
    """Issue 22, item 18: an AbortCall in the page's steps names the timer or call its
    number was (`stops timer 'deadline of ...'`), as `replay --step` does."""
    aborts = [e for row in trace["steps"] for e in row[5] if e.startswith("AbortCall(")]
    assert aborts
    assert all(
        " stops timer '" in e or " stops model call" in e or " stops tool" in e for e in aborts
    )
    assert not any("issued before these steps" in e for e in aborts)


# ------------------------------------------------------------------ issue 24: side by side


@pytest.fixture(scope="module")
def forked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    return forked_with_edit(tmp_path_factory.mktemp("forked"))


def pair(data: dict[str, Any], path: str) -> dict[str, Any]:
    (found,) = [p for p in data["compare"]["agents"] if p["path"] == path]
    return dict(found)


def test_a_fork_names_its_original_and_is_compared_with_it(
    forked: tuple[Path, str, str],
) -> None:
    db, root, fork = forked
    with Store.open(db, read_only=True) as store:
        data = build_trace(store, fork)
        original = build_trace(store, root)
    assert data["fork"] == {
        "source": root,
        "seq": data["fork"]["seq"],
        "source_tree": root,
        "file": f"trace-{root}.html",
    }
    assert original["fork"] is None and original["compare"] is None
    compared = data["compare"]
    assert (compared["a"], compared["b"], compared["this"]) == (root, fork, "b")
    # root/1 said the same in both: counted, not repeated.
    same = pair(data, "root/1")
    assert same["parting"] is None and same["rows"] == [] and same["a_count"] == 2
    # root/2 parts at its reply: the task aligned before it, the second line marked.
    edited = pair(data, "root/2")
    assert (edited["parting"], edited["from"]) == (1, 0)
    task, reply = edited["rows"]
    assert task[2] is False and task[0][2] == task[1][2] == "b"
    assert reply[2] is True
    assert reply[0][1:] == ["assistant", "line one\nline two\nline three", [1]]
    assert reply[1][1:] == ["assistant", EDITED_REPLY, [1]]
    # The root parts at the fan-in result that carries the edited text: its JSON one
    # value a line, only root/2's result marked (the children's ids are no difference).
    root_pair = pair(data, "root")
    assert root_pair["parting"] == 2
    fan_in = root_pair["rows"][2]
    assert fan_in[2] is True and fan_in[0][1] == "tool_result"
    (marked,) = fan_in[1][3]
    assert fan_in[1][2].split("\n")[marked].strip().startswith('"result": "line one\\nline 2')
    assert f'"agent_id": "{fork}.2"' in fan_in[1][2]


def test_json_that_cannot_be_spread_is_shown_as_it_is() -> None:
    from fanfold.replay.compare import Said
    from fanfold.trace.build import _spread

    deep = "x: " + "[" * 100_000 + "]" * 100_000
    for text in (deep, "x: {not json", "x: plain"):
        item = Said(1, "tool_result", text, text)
        assert _spread(item) == item
    spread = _spread(Said(1, "tool_call", 'f {"a":[1,2]}', 'f {"a":[1,2]}'))
    assert spread is not None and spread.text == 'f\n{\n "a": [\n  1,\n  2\n ]\n}'


def test_trace_vs_puts_any_two_trees_side_by_side(
    forked: tuple[Path, str, str], tmp_path: Path
) -> None:
    db, root, fork = forked
    with Store.open(db, read_only=True) as store:
        data = build_trace(store, root, vs=fork)
    compared = data["compare"]
    assert (compared["a"], compared["b"], compared["this"]) == (root, fork, "a")
    assert pair(data, "root/2")["parting"] == 1
    page = tmp_path / "vs.html"
    written = run("trace", root, "--vs", fork, "--db", db, "-o", page)
    assert written.exit_code == 0, written.output
    assert f"; beside {fork}: 2 agent(s) part (press c on the page)" in written.stdout
    assert '"this":"a"' in page.read_text(encoding="utf-8")
    unknown = run("trace", root, "--vs", "nope", "--db", db, "-o", "-")
    assert unknown.exit_code != 0
    assert unknown.output.strip() == "error: no conversation 'nope' in the database"


def test_a_damaged_original_leaves_the_fork_page_standing(tmp_path: Path) -> None:
    db, root, fork = forked_with_edit(tmp_path)
    edit(
        db,
        f"UPDATE events SET payload = 'garbage' WHERE conversation_id = '{root}.2' AND seq = 1",
        sealed=False,
    )
    with Store.open(db, read_only=True) as store:
        data = build_trace(store, fork)
    assert data["compare"]["agents"] == []
    assert f"conversation {root}.2, seq 1" in data["compare"]["error"]
    assert len(data["agents"]) == 3 and data["findings"] == []
    result = run("trace", fork, "--db", db, "-o", tmp_path / "f.html")
    assert result.exit_code == 0, result.output
    said = result.stdout
    assert f"; not beside {root}: " in said and f"conversation {root}.2, seq 1" in said


def test_the_side_by_side_data_holds_no_markup(forked: tuple[Path, str, str]) -> None:
    db, _, fork = forked
    with Store.open(db, read_only=True) as store:
        page = render_html(build_trace(store, fork))
    assert HOSTILE in EDITED_REPLY
    assert page.count("</script>") == 2
    assert "<img" not in page and "<b>not bold" not in page
    assert "window.__pwned" in page  # there, as escaped data
