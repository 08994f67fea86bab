"""The replay commands: exit codes, readable output, one-line errors, no tracebacks."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from db_scenarios import Driver, fan_out
from replay_helpers import FifoReader, as_format_5, edit, write

from fanfold.cli import cli
from fanfold.db import SCHEMA_VERSION, Store
from fanfold.statemachine import AbortCall, Conversation, StartTimer, TimerFired, ToolFinished

REDUCER = importlib.import_module("fanfold.statemachine.transition")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    driver = Driver(snapshot_every=2)
    fan_out(driver)  # r: 0 created ... 6 answered; r.1 ran bash (its seq 2 is ToolFinished)
    path = tmp_path / "log.db"
    write(path, driver.steps)
    return path


def run(*args: str | Path) -> Result:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def one_error_line(result: Result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


# ------------------------------------------------------------------ --verify


def test_verify_identical_exits_0(db: Path) -> None:
    result = run("replay", "r", "--verify", "--db", db)
    assert result.exit_code == 0, result.output
    assert "identical: 7 event(s) of 1 conversation(s) replayed" in result.stdout
    assert "events/s" in result.stdout
    tree = run("replay", "r", "--verify", "--tree", "--db", db)
    assert tree.exit_code == 0
    assert "of 4 conversation(s)" in tree.stdout


def test_verify_divergence_exits_1_with_a_diff_and_the_seq(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = REDUCER._on_tool_finished

    def changed(state: Conversation, event: ToolFinished) -> Any:
        after, effects = original(state, event)
        return after, (*effects, AbortCall(999))

    as_format_5(db)  # effect rows to compare with, as logs before the events-only log
    monkeypatch.setattr(REDUCER, "_on_tool_finished", changed)
    result = run("replay", "r", "--verify", "--tree", "--db", db)
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert "conversation r.1, seq 2 (ToolFinished): recorded and recomputed effects differ" in out
    assert "--- recorded" in out and "+++ recomputed" in out
    assert '"type": "AbortCall"' in out and '"call": 999' in out
    assert "the log and the reducer diverge" in out
    # Without --tree the root alone replays identically.
    assert run("replay", "r", "--verify", "--db", db).exit_code == 0


def test_verify_divergence_of_an_events_only_log_exits_1_naming_the_seq(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = REDUCER._on_tool_finished

    def changed(state: Conversation, event: ToolFinished) -> Any:
        after, effects = original(state, event)
        return after, (*effects, AbortCall(999))

    monkeypatch.setattr(REDUCER, "_on_tool_finished", changed)
    result = run("replay", "r", "--verify", "--tree", "--db", db)
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert (
        "conversation r.1, seq 2 (ToolFinished): recorded and recomputed state fingerprint" in out
    )
    assert "content digest (the step's event and its effects, every field)" in out
    assert "the log and the reducer diverge" in out


def test_verify_of_a_damaged_log_exits_2_naming_the_seq(db: Path) -> None:
    edit(
        db,
        "DELETE FROM effects WHERE conversation_id = 'r' AND seq = 3",
        "DELETE FROM events WHERE conversation_id = 'r' AND seq = 3",
    )
    result = run("replay", "r", "--verify", "--db", db)
    assert result.exit_code == 2
    assert "error: conversation r, seq 3: event 3 is missing" in result.stderr
    assert "the log is damaged" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["replay", "nope", "--verify"], "no conversation 'nope' in the database"),
        (["replay", "r"], "give --verify or --step"),
        (["replay", "r", "--verify", "--step"], "give one of --verify and --step"),
        (["replay", "r", "--verify", "--at", "1"], "--at and --until go with --step"),
        (["replay", "r", "--at", "1", "--until", "2"], "give one of --at and --until"),
        (["replay", "r", "--at", "99"], "has no event 99: its events are 0 to 6"),
        (["fork", "r", "--agent", "root/9", "--at", "0"], "no agent 'root/9' in the tree"),
        (["replay", "r", "--agent", "root/9", "--verify"], "no agent 'root/9' in the tree"),
        (["export", "nope"], "no conversation 'nope'"),
    ],
)
def test_user_errors_are_one_line(db: Path, args: list[str], message: str) -> None:
    line = one_error_line(run(*args, "--db", db))
    assert message in line


def test_missing_and_broken_databases_are_one_line(tmp_path: Path) -> None:
    assert "no database at" in one_error_line(
        run("replay", "r", "--verify", "--db", tmp_path / "none.db")
    )
    junk = tmp_path / "junk.db"
    junk.write_text("this is not SQLite, but it is long enough to look like a file " * 20)
    assert "is not an SQLite database" in one_error_line(
        run("replay", "r", "--verify", "--db", junk)
    )
    assert "is not an SQLite database" in one_error_line(run("import", junk, "--db", junk))


# ------------------------------------------------------------------ --step


def test_step_shows_each_transition(db: Path) -> None:
    result = run("replay", "r", "--step", "--db", db)
    assert result.exit_code == 0, result.output
    out = result.stdout
    for seq in range(7):
        assert f"seq {seq} " in out
    assert "UserMessaged(text='review this repository')" in out
    assert "Idle → LlmRequesting" in out
    assert "LlmRequesting → AwaitingSubAgents" in out
    assert "SpawnSubAgent(child_id='r.1'" in out
    assert "state: AwaitingSubAgents" in out


def test_until_and_at(db: Path) -> None:
    until = run("replay", "r", "--until", "1", "--db", db).stdout
    assert "seq 1 " in until and "seq 2 " not in until
    at = run("replay", "r", "--step", "--at", "2", "--db", db)
    assert at.exit_code == 0, at.output
    assert "seq 2 " in at.stdout and "seq 1 " not in at.stdout
    state = json.loads(at.stdout[at.stdout.index("{") :])
    assert state["type"] == "Conversation" and state["phase"]["type"] == "AwaitingSubAgents"


def test_tree_interleaves_the_children(db: Path) -> None:
    out = run("replay", "r", "--step", "--tree", "--db", db).stdout
    order = [line.split()[0:3:2] for line in out.splitlines() if " seq " in line[:20]]
    assert order[:4] == [["r", "0"], ["r", "1"], ["r", "2"], ["r.1", "0"]]
    assert len(order) == 7 + 4 + 4 + 2  # r, r.1 (tool), r.2 (retry), r.3 (error)


def test_step_shows_where_the_reducer_diverges(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = REDUCER._on_tool_finished
    monkeypatch.setattr(REDUCER, "_on_tool_finished", lambda s, e: (original(s, e)[0], ()))
    out = run("replay", "r.1", "--step", "--db", db).stdout
    assert "✗ the reducer does not reproduce this step" in out
    assert "conversation r.1, seq 2 (ToolFinished)" in out


def test_step_through_a_damaged_log_stops_with_one_error(db: Path) -> None:
    edit(db, "UPDATE events SET payload = 'x' WHERE conversation_id = 'r' AND seq = 2")
    result = run("replay", "r", "--step", "--db", db)
    assert "seq 1 " in result.stdout
    assert "conversation r, seq 2: event 2 cannot be read" in one_error_line(result)


# ------------------------------------------------------------------ fork, export, import


def test_fork_prints_the_new_id_and_how_to_continue(db: Path) -> None:
    result = run("fork", "r", "--at", "6", "--db", db)
    assert result.exit_code == 0, result.output
    fork = result.stdout.strip()
    assert f"fanfold send {fork}" in result.stderr
    with Store.open(db) as store:
        assert store.conversation(fork).forked_from == "r"
    named = run("fork", "r", "--at", "0", "--id", "mine", "--db", db)
    assert named.stdout.strip() == "mine"
    assert run("replay", "mine", "--verify", "--db", db).exit_code == 0


def test_export_import_verify(db: Path, tmp_path: Path) -> None:
    exported = run("export", "r.2", "--db", db)
    assert exported.exit_code == 0
    assert json.loads(exported.stdout.splitlines()[0])["root_id"] == "r"
    out = tmp_path / "r.jsonl"
    assert run("export", "r", "-o", out, "--db", db).exit_code == 0
    assert out.read_text() == exported.stdout
    other = tmp_path / "sub" / "other.db"
    imported = run("import", out, "--db", other)
    assert imported.exit_code == 0, imported.output
    assert imported.stdout.strip() == "r"
    assert "fanfold replay r --verify --tree" in imported.stderr
    assert run("replay", "r", "--verify", "--tree", "--db", other).exit_code == 0
    again = one_error_line(run("import", out, "--db", other))
    assert "conversation 'r' already exists in this database" in again


def test_export_errors_name_the_output_not_a_temporary_file(db: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for output, reason in [
        (tmp_path / "missing" / "r.jsonl", "No such file or directory"),
        (blocker / "r.jsonl", "Not a directory"),
    ]:
        line = one_error_line(run("export", "r", "-o", output, "--db", db))
        assert line == f"error: cannot write {output}: {reason}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "log.db", "log.db-committed"]


def test_import_errors_are_one_line(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    assert "No such file" in one_error_line(run("import", tmp_path / "none.jsonl", "--db", other))
    assert not other.exists()
    bad = tmp_path / "bad.jsonl"
    header = {
        "record": "header",
        "format": "fanfold-log",
        "format_version": 1,
        "event_schema_version": 99,
        "root_id": "r",
        "conversations": 0,
        "steps": 0,
    }
    bad.write_text(json.dumps(header) + "\n")
    line = one_error_line(run("import", bad, "--db", other))
    assert "event schema version 99" in line and f"versions 1 to {SCHEMA_VERSION}" in line


def test_export_writes_through_links_fifos_and_devices_and_never_replaces_them(
    db: Path, tmp_path: Path
) -> None:
    """A new or regular file is written whole (temporary file and rename) with the
    mode a plain open gives; anything else at the path is written as it is."""
    expected = run("export", "r", "--db", db).stdout
    target = tmp_path / "target.jsonl"
    target.write_text("old")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    assert run("export", "r", "-o", link, "--db", db).exit_code == 0
    assert link.is_symlink() and target.read_text() == expected
    fresh = tmp_path / "fresh.jsonl"
    assert run("export", "r", "-o", fresh, "--db", db).exit_code == 0
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask
    fresh.chmod(0o640)
    assert run("export", "r", "-o", fresh, "--db", db).exit_code == 0
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o640  # an existing file keeps its mode
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # Written only with a reader already on the other end (issue 22, item 7: a FIFO
    # nobody reads is refused at once, never waited on).
    reader = FifoReader(fifo)
    assert run("export", "r", "-o", fifo, "--db", db).exit_code == 0
    assert reader.join() == expected and stat.S_ISFIFO(fifo.stat().st_mode)
    assert run("export", "r", "-o", "-", "--db", db).stdout == expected
    assert not (Path.cwd() / "-").exists()


def test_export_into_a_pipe_closed_early_ends_quietly(db: Path) -> None:
    """``fanfold export r | head -1``: the reader stops early; no error, no traceback."""
    done = subprocess.run(
        f"{sys.executable} -c 'from fanfold.cli import main; main()' export r --db {db}"
        " | head -c 10",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout == '{"record":'
    assert done.stderr == ""


def test_export_and_trace_never_write_over_the_log(db: Path, tmp_path: Path) -> None:
    """`fanfold trace r -o log.db` (a slip of -o) once replaced the database with the
    HTML page, and `export -o log.db` with JSON Lines: the log was gone."""
    before = db.read_bytes()
    (tmp_path / "log.db-runtimes").touch()
    os.link(db, tmp_path / "hard.db")
    for output in (db, tmp_path / "log.db-wal", tmp_path / "log.db-runtimes", tmp_path / "hard.db"):
        for command in (["trace", "r"], ["export", "r"]):
            result = run(*command, "-o", output, "--db", db)
            line = one_error_line(result)
            assert "writing there would destroy the log" in line, (command, output, line)
    assert db.read_bytes() == before
    assert not (tmp_path / "log.db-wal").exists()
    assert run("trace", "r", "-o", tmp_path / "r.html", "--db", db).exit_code == 0


def test_a_binary_file_is_refused_with_its_line_and_byte(db: Path, tmp_path: Path) -> None:
    """Issue 22, item 17: importing a binary file said only "'utf-8' codec can't
    decode byte 0xf0 in position 40" (a position in some buffer, no line)."""
    exported = run("export", "r", "--db", db).stdout.encode()
    first, rest = exported.split(b"\n", 1)
    third = rest.index(b"\n") + len(first) + 2  # where line 3 starts
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(exported[:third] + b'{"record": "st\xffep"}\n' + exported[third:])
    other = tmp_path / "other.db"
    line = one_error_line(run("import", broken, "--db", other))
    assert line == (
        "error: line 3: byte 15 (0xff) is not UTF-8 text: not an export of a fanfold log; "
        "nothing was imported"
    )
    binary = tmp_path / "python.jsonl"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(128, 256)))
    line = one_error_line(run("import", binary, "--db", other))
    assert line.startswith("error: line 1: byte 9 (0x80) is not UTF-8 text")
    with Store.open(other) as store:
        assert store.list_roots() == []


def test_an_export_with_a_byte_order_mark_imports(db: Path, tmp_path: Path) -> None:
    """Issue 22, item 17: an export saved by an editor that writes a UTF-8 byte-order
    mark was refused ("line 1: not valid JSON"). The mark is ignored; the sha256
    recorded is the file's own, mark included. From stdin too."""
    exported = run("export", "r", "--db", db).stdout.encode()
    marked = tmp_path / "marked.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + exported)
    other = tmp_path / "other.db"
    imported = run("import", marked, "--db", other)
    assert imported.exit_code == 0, imported.output
    assert imported.stdout.strip() == "r"
    with Store.open(other) as store:
        record = store.tree_record("r")
        assert record is not None
        assert record.source_sha256 == hashlib.sha256(marked.read_bytes()).hexdigest()
    assert run("replay", "r", "--verify", "--tree", "--db", other).exit_code == 0
    piped = CliRunner().invoke(
        cli, ["import", "-", "--db", str(tmp_path / "piped.db")], input=marked.read_bytes()
    )
    assert piped.exit_code == 0, piped.output


def test_step_names_the_timer_an_abort_stops_and_a_timer_that_fires(tmp_path: Path) -> None:
    """Issue 22, item 18: the end of a child's deadline backstop (its parent's timer,
    stopped when the child reports) was shown as `AbortCall(call=1)`, which reads like
    a model call being aborted. The reducer numbers calls and timers from one counter
    and AbortCall stops either: the step view names what the number was, with --at
    too, and a TimerFired says which timer ran out."""
    spawn = {"name": "spawn_agents", "arguments": {"tasks": [{"task": "a", "timeout": 60}]}}
    script = tmp_path / "s.json"
    script.write_text(
        json.dumps(
            {
                "latency": 0,
                "agents": [
                    {
                        "match": {"path": "root"},
                        "replies": [{"tool_calls": [spawn]}, {"text": "done"}],
                    },
                    {
                        "match": {"path": "root/1"},
                        "replies": [
                            {
                                "tool_calls": [
                                    {"name": "submit_result", "arguments": {"result": "x"}}
                                ]
                            }
                        ],
                    },
                ],
            }
        )
    )
    db = tmp_path / "timers.db"
    assert run("run", "--no-live", "--script", script, "--db", db, "go").exit_code == 0
    with Store.open(db) as store:
        (root,) = store.list_roots()
    stepped = run("replay", root.id, "--step", "--tree", "--db", db).stdout
    parent = f"AbortCall(call=1) stops timer 'deadline of {root.id}.1' (90 s)"
    assert parent in stepped
    assert "AbortCall(call=0) stops timer 'time limit' (60 s)" in stepped  # the child's
    # --at replays the steps before it (unseen) to know the number.
    at = run("replay", root.id, "--at", "3", "--db", db).stdout
    assert parent in at and "seq 2" not in at
    # A timer that fires, and a number the steps shown never issued.
    from fanfold.replay import render

    numbers = render.Numbers()
    numbers.learn("c", (StartTimer(0, 60.0, "time limit"),))
    assert numbers.describe("c", TimerFired(0)) == (
        "TimerFired(timer=0): timer 'time limit' (60 s) ran out"
    )
    assert numbers.describe("c", AbortCall(7)) == (
        "AbortCall(call=7) stops a number issued before these steps"
    )
