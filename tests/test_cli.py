"""The command line as a user runs it: run, ls, show, send, resume, Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fanfold.cli import cli
from fanfold.cli.display import printable
from fanfold.cli.worker_commands import EXIT_TIMEOUT
from fanfold.db import Store
from fanfold.statemachine import ErrorKind, Failed, Idle

FAST_SCRIPT: dict[str, Any] = {
    "latency": 0.01,
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                {
                    "tool_calls": [
                        {"name": "spawn_agents", "arguments": {"tasks": [{"task": "count"}]}}
                    ]
                },
                {"text": "the answer is {{last_tool_result}}"},
            ],
        },
        {
            "match": {"path": "root/1"},
            "replies": [
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo 42"}}]},
                {
                    "tool_calls": [
                        {"name": "submit_result", "arguments": {"result": "{{last_tool_result}}"}}
                    ]
                },
            ],
        },
    ],
}


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_run_ls_show_and_send(tmp_path: Path) -> None:
    runner = CliRunner()
    db = tmp_path / "cli.db"
    script = _write(tmp_path / "script.json", FAST_SCRIPT)
    result = runner.invoke(
        cli, ["run", "--db", str(db), "--script", str(script), "--cwd", str(tmp_path), "go"]
    )
    assert result.exit_code == 0, result.output
    assert "42" in result.output
    with Store.open(db) as store:
        (root,) = store.list_roots()
    listing = runner.invoke(cli, ["ls", "--db", str(db)])
    assert root.id in listing.output
    shown = runner.invoke(cli, ["show", root.id, "--db", str(db), "--json"])
    tree = json.loads(shown.output)
    assert tree["phase"] == "Idle"
    assert [(c["phase"], c["tool_calls"]) for c in tree["children"]] == [("Completed", 2)]
    assert "42" in tree["children"][0]["outcome"]
    again = runner.invoke(cli, ["send", root.id, "more?", "--db", str(db), "--script", str(script)])
    assert again.exit_code == 0, again.output
    assert "no scripted reply" in again.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show", "nope"], "no conversation 'nope'"),
        (["run"], "give a TASK or --file"),
        (["run", "--script", "missing.json", "x"], "cannot read script missing.json"),
        (["run", "--model", "gpt-4o", "x"], "no model provider is configured"),
        (["send", "nope", "hi"], "no conversation 'nope'"),
    ],
)
def test_bad_input_is_one_clear_line_without_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FANFOLD_CONFIG", raising=False)
    db = tmp_path / "cli.db"
    CliRunner().invoke(
        cli,
        ["run", "--db", str(db), "--script", str(_write(tmp_path / "s.json", FAST_SCRIPT)), "seed"],
    )
    result = CliRunner().invoke(cli, [*args, "--db", str(db)])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "command", [["ls"], ["show", "x"], ["run", "hi"], ["replay", "x", "--verify"]]
)
def test_a_db_that_is_not_a_fanfold_log_is_one_line_and_left_untouched(
    tmp_path: Path, command: list[str]
) -> None:
    import sqlite3

    garbage = tmp_path / "notes.db"
    garbage.write_text("not a database\n")
    foreign = tmp_path / "app.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE users (id INTEGER)")
    conn.commit()
    conn.close()
    foreign_bytes = foreign.read_bytes()
    for db, message in [
        (garbage, "is not an SQLite database"),
        (foreign, "is an SQLite database but not a fanfold log"),
    ]:
        result = CliRunner().invoke(cli, [*command, "--db", str(db)])
        assert result.exit_code == 2, result.output
        assert message in result.output
        assert "Traceback" not in result.output
    assert garbage.read_text() == "not a database\n"
    assert foreign.read_bytes() == foreign_bytes


def test_a_failing_disk_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    db = tmp_path / "cli.db"
    script = _write(tmp_path / "s.json", FAST_SCRIPT)
    assert (
        CliRunner().invoke(cli, ["run", "--db", str(db), "--script", str(script), "x"]).exit_code
        == 0
    )

    def full(self: Store, steps: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(Store, "append", full)
    result = CliRunner().invoke(cli, ["run", "--db", str(db), "--script", str(script), "y"])
    assert result.exit_code == 2, result.output
    assert "the event log could not be written or read: database or disk is full" in result.output
    assert "Traceback" not in result.output


def test_unreadable_task_files_and_log_places_are_one_line(tmp_path: Path) -> None:
    latin1 = tmp_path / "task.md"
    latin1.write_bytes(b"caf\xe9")
    result = CliRunner().invoke(cli, ["run", "--db", str(tmp_path / "a.db"), "--file", str(latin1)])
    assert (result.exit_code, "Traceback" in result.output) == (2, False), result.output
    assert "is not UTF-8 text" in result.output
    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder should be")
    result = CliRunner().invoke(cli, ["run", "--db", str(blocker / "sub" / "x.db"), "hi"])
    assert (result.exit_code, "Traceback" in result.output) == (2, False), result.output
    assert f"cannot write {blocker / 'sub'}" in result.output
    assert blocker.read_text() == "a file where a folder should be"


def _slow_bash_script(tmp_path: Path, pids: Path, *, root_answers: bool, rounds: int) -> Path:
    """A script: the root spawns sub-agents a and b; each runs ``rounds`` bash commands
    that write their pid to ``pids`` and sleep a minute, then answers "finished"."""
    slow = {"name": "bash", "arguments": {"command": f"echo $$ >> {pids}; sleep 60"}}
    spawn_two = {"name": "spawn_agents", "arguments": {"tasks": [{"task": "a"}, {"task": "b"}]}}
    root: list[dict[str, Any]] = [{"tool_calls": [spawn_two]}]
    if root_answers:
        root.append({"text": "all done"})
    child = [{"tool_calls": [slow]} for _ in range(rounds)] + [{"text": "finished"}]
    return _write(
        tmp_path / "slow.json",
        {
            "latency": 0.01,
            "agents": [
                {"match": {"path": "root"}, "replies": root},
                {"match": {"depth": 1}, "replies": child},
            ],
        },
    )


def _resume_a_crashed_tree(
    tmp_path: Path, db: Path, shells: list[int]
) -> tuple[subprocess.Popen[str], list[str]]:
    """Run a tree whose sub-agents run bash, SIGKILL it once they do (a crash), then
    start ``fanfold resume`` and return once its re-run bash commands have started.

    Every bash process group started goes into ``shells``, for the caller to clean up.
    Returns the resume process and the ``--db``/``--script`` options.
    """
    pids = tmp_path / "pids"
    script = _slow_bash_script(tmp_path, pids, root_answers=True, rounds=2)
    common = ["--db", str(db), "--script", str(script)]
    crashed = _cli_process("run", "--no-live", *common, "--cwd", str(tmp_path), "work")
    shells += _wait_for_pids(pids, 2)
    crashed.kill()  # SIGKILL: no clean-up at all, as a crash
    crashed.communicate(timeout=30)
    for shell in shells:
        # Each command's supervisor kills it when fanfold dies; should one still be
        # running, it is not the resumed runtime's.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell, signal.SIGKILL)
    resumed = _cli_process("resume", *common)
    shells += _wait_for_pids(pids, 2, skip=2)
    return resumed, common


# fanfold as a shell starts a command in the foreground: the stop signals at their
# default dispositions. An ignored disposition is inherited across exec, and the suite
# may itself run with some ignored (under nohup: SIGHUP; as a background job: SIGINT);
# fanfold keeps ignoring what it was started with ignored (as nohup asks), so a test
# sending it one of those would wait out its timeout.
FOREGROUND_FANFOLD = """
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
from fanfold.cli import main
main()
"""

# Runs ARGV with the signals listed in sys.argv[1] ignored, as nohup or a shell's
# background job would start it.
IGNORING = """
import os, signal, sys
for signum in sys.argv[1].split(","):
    signal.signal(int(signum), signal.SIG_IGN)
os.execv(sys.argv[2], sys.argv[2:])
"""


def _cli_process(
    *args: str, code: str = FOREGROUND_FANFOLD, started_ignoring: tuple[int, ...] = ()
) -> subprocess.Popen[str]:
    """``fanfold ARGS`` in a real process, its output captured as text.

    ``code`` runs fanfold; ``started_ignoring`` starts it (through an exec) with those
    signals ignored, as the suite itself may be started.
    """
    argv = [sys.executable, "-c", code, *args]
    if started_ignoring:
        ignored = ",".join(str(int(s)) for s in started_ignoring)
        argv = [sys.executable, "-c", IGNORING, ignored, *argv]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_pids(pids: Path, count: int, skip: int = 0) -> list[int]:
    """The pids written to ``pids`` past the first ``skip``, once there are ``count``."""
    found: list[int] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(found) < count:
        lines = pids.read_text().split() if pids.exists() else []
        found = [int(line) for line in lines[skip:]]
        time.sleep(0.05)
    assert len(found) == count, "the sub-agents' bash commands never started"
    return found


def _live_in_group(pgid: int) -> list[int]:
    """Processes of process group ``pgid`` that are still alive (zombies count as dead)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # the process ended while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


NOHUP_IN_BACKGROUND = (signal.SIGINT, signal.SIGHUP)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize(
    ("signum", "code", "name", "suite_ignores"),
    [
        (signal.SIGINT, 130, "Ctrl-C", ()),
        (signal.SIGTERM, 143, "SIGTERM", ()),
        (signal.SIGHUP, 129, "SIGHUP", ()),
        # The suite started under nohup as a background job: the tests still give
        # fanfold the dispositions they rely on.
        (signal.SIGINT, 130, "Ctrl-C", NOHUP_IN_BACKGROUND),
        (signal.SIGHUP, 129, "SIGHUP", NOHUP_IN_BACKGROUND),
    ],
)
def test_a_stop_signal_cancels_every_sub_agent_records_it_and_exits_128_plus_signal(
    tmp_path: Path, signum: int, code: int, name: str, suite_ignores: tuple[int, ...]
) -> None:
    pids = tmp_path / "pids"
    script = _slow_bash_script(tmp_path, pids, root_answers=False, rounds=1)
    db = tmp_path / "stopped.db"
    proc = _cli_process(
        "run",
        "--no-live",
        "--db",
        str(db),
        "--script",
        str(script),
        "--cwd",
        str(tmp_path),
        "work",
        started_ignoring=suite_ignores,
    )
    shells: list[int] = []
    try:
        shells = _wait_for_pids(pids, 2)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
        # Each bash command ran in its own process group, killed by the clean cancel.
        left_behind = [_live_in_group(shell) for shell in shells]
    finally:
        proc.kill()
        for shell in shells:  # whatever the outcome, leave no sleep behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell, signal.SIGKILL)
    assert "Traceback" not in err
    assert proc.returncode == code, (out, err)
    assert f"cancelled by {name}" in out
    assert left_behind == [[], []]
    with Store.open(db) as store:
        (root,) = store.list_roots()
        assert isinstance(store.load_state(root.id).phase, Idle)
        children = store.children(root.id)
        assert len(children) == 2
        for child in children:
            phase = store.load_state(child.id).phase
            assert isinstance(phase, Failed)
            assert phase.kind is ErrorKind.CANCELLED
        assert store.unfinished() == []
    shown = CliRunner().invoke(cli, ["show", root.id, "--db", str(db), "--json"])
    tree = json.loads(shown.output)
    assert [tree["status"], *(c["status"] for c in tree["children"])] == [
        "idle",
        "failed",
        "failed",
    ]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_sigterm_stops_resume_cleanly_and_leaves_the_tree_resumable(tmp_path: Path) -> None:
    """A killed run leaves a tree whose sub-agents run bash; ``resume`` re-runs them;
    SIGTERM then stops the resume: exit 143, no bash left running, the tree still
    unfinished in the log, and a later resume takes it to the end."""
    db = tmp_path / "resumed.db"
    shells: list[int] = []
    try:
        resumed, common = _resume_a_crashed_tree(tmp_path, db, shells)
        resumed.send_signal(signal.SIGTERM)
        out, err = resumed.communicate(timeout=30)
        left_behind = [_live_in_group(shell) for shell in shells[2:]]
    finally:
        for shell in shells:  # whatever the outcome, leave no sleep behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell, signal.SIGKILL)
    assert "Traceback" not in err
    assert resumed.returncode == 143, (out, err)
    assert "stopped by SIGTERM" in err
    assert left_behind == [[], []]
    with Store.open(db) as store:
        (root,) = store.list_roots()
        assert {row.id for row in store.unfinished()} == {root.id, f"{root.id}.1", f"{root.id}.2"}
    # The second bash round was interrupted too: the next resume goes on from there.
    finished = CliRunner().invoke(cli, ["resume", *common])
    assert finished.exit_code == 0, finished.output
    with Store.open(db) as store:
        assert store.unfinished() == []
        assert isinstance(store.load_state(root.id).phase, Idle)


# No spaces: rich may wrap lines at a space, never inside a word this short.
HOSTILE = "\x1b[2J\x1b]0;pwned\x07[red]not-markup[/red]\x9b2K"


def test_model_text_reaches_the_terminal_printable_never_as_escapes_or_markup(
    tmp_path: Path,
) -> None:
    script = _write(
        tmp_path / "hostile.json",
        {
            "latency": 0.01,
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [
                        {
                            "tool_calls": [
                                {
                                    "name": "spawn_agents",
                                    "arguments": {"tasks": [{"task": f"task {HOSTILE}"}]},
                                }
                            ]
                        },
                        {"text": f"answer {HOSTILE}\r\nsecond line\roverwritten?"},
                    ],
                },
                {
                    "match": {"path": "root/1"},
                    "replies": [
                        {
                            "tool_calls": [
                                {"name": "submit_result", "arguments": {"result": HOSTILE}}
                            ]
                        }
                    ],
                },
            ],
        },
    )
    db = tmp_path / "hostile.db"
    runner = CliRunner()
    ran = runner.invoke(cli, ["run", "--no-live", "--db", str(db), "--script", str(script), "go"])
    assert ran.exit_code == 0, ran.output
    with Store.open(db) as store:
        (root,) = store.list_roots()
    shown = runner.invoke(cli, ["show", root.id, "--db", str(db)])
    assert shown.exit_code == 0, shown.output
    visible = r"\x1b[2J\x1b]0;pwned\x07[red]not-markup[/red]\x9b2K"
    # run: the tree's task and outcome lines, then the answer (its CRLF a plain newline,
    # a lone CR shown, not obeyed).
    assert ran.output.count(visible) == 3, ran.output
    assert f"answer {visible}\nsecond line\\x0doverwritten?" in ran.output
    # show: the child's task and outcome, and the root's answer.
    assert shown.output.count(visible) == 3, shown.output
    for output in (ran.output, shown.output):
        assert not any(c in output for c in "\x1b\x07\r\x9b"), repr(output)


def test_show_prints_the_root_answer_and_children_in_spawn_order(tmp_path: Path) -> None:
    tasks = [{"task": f"job {n}"} for n in range(1, 11)]
    script = _write(
        tmp_path / "ten.json",
        {
            "latency": 0.01,
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [
                        {"tool_calls": [{"name": "spawn_agents", "arguments": {"tasks": tasks}}]},
                        {"text": "all ten done\nsecond line of the answer"},
                    ],
                },
                {
                    "match": {"depth": 1},
                    "replies": [
                        {"tool_calls": [{"name": "submit_result", "arguments": {"result": "ok"}}]}
                    ],
                },
            ],
        },
    )
    runner = CliRunner()
    db = tmp_path / "ten.db"
    assert (
        runner.invoke(cli, ["run", "--db", str(db), "--script", str(script), "go"]).exit_code == 0
    )
    with Store.open(db) as store:
        (root,) = store.list_roots()
    # The log's creation order is not the spawn order (with a concurrency limit, queued
    # children are created as slots free up; even without one it varies): to be sure,
    # write the children last-spawned first.
    export = tmp_path / "ten.jsonl"
    assert (
        runner.invoke(cli, ["export", root.id, "-o", str(export), "--db", str(db)]).exit_code == 0
    )
    lines = export.read_text().splitlines()
    kids = [line for line in lines if json.loads(line).get("parent_id") == root.id]
    assert len(kids) == 10
    start = lines.index(kids[0])
    lines[start : start + 10] = sorted(
        kids, key=lambda line: -int(json.loads(line)["id"].rpartition(".")[2])
    )
    export.write_text("\n".join(lines) + "\n")
    other = tmp_path / "reversed.db"
    imported = runner.invoke(cli, ["import", str(export), "--db", str(other)])
    assert imported.exit_code == 0, imported.output
    with Store.open(other) as store:
        assert [c.id for c in store.children(root.id)][:2] == [f"{root.id}.10", f"{root.id}.9"]

    spawned = [f"{root.id}.{n}" for n in range(1, 11)]
    as_json = json.loads(runner.invoke(cli, ["show", root.id, "--db", str(other), "--json"]).output)
    assert [c["id"] for c in as_json["children"]] == spawned
    assert as_json["outcome"] == "all ten done\nsecond line of the answer"
    shown = runner.invoke(cli, ["show", root.id, "--db", str(other)]).output
    positions = [shown.index(f"Sub-agent {child}:") for child in spawned]
    assert positions == sorted(positions), shown
    assert shown.rstrip().endswith("all ten done\nsecond line of the answer"), shown


def test_send_to_a_sub_agent_says_so_and_names_the_root(tmp_path: Path) -> None:
    runner = CliRunner()
    db = tmp_path / "cli.db"
    script = _write(tmp_path / "script.json", FAST_SCRIPT)
    assert (
        runner.invoke(cli, ["run", "--db", str(db), "--script", str(script), "go"]).exit_code == 0
    )
    with Store.open(db) as store:
        (root,) = store.list_roots()
        (child,) = store.children(root.id)
    result = runner.invoke(cli, ["send", child.id, "hi", "--db", str(db), "--script", str(script)])
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"error: {child.id} is a sub-agent, and sub-agents cannot take user messages; "
        f"send to its root conversation instead: fanfold send {root.id} TEXT --db {db}\n"
    )
    with Store.open(db) as store:
        assert store.conversation(child.id).last_seq == child.last_seq
        assert store.conversation(root.id).last_seq == root.last_seq


def test_next_step_hints_are_never_wrapped_so_their_commands_copy_whole(tmp_path: Path) -> None:
    runner = CliRunner()
    folder = tmp_path / ("a-long-folder-name-" * 4)
    folder.mkdir()
    db = folder / "cli.db"
    script = _write(tmp_path / "script.json", FAST_SCRIPT)
    ran = runner.invoke(cli, ["run", "--db", str(db), "--script", str(script), "go"])
    assert ran.exit_code == 0, ran.output
    with Store.open(db) as store:
        (root,) = store.list_roots()
    lines = ran.output.splitlines()
    assert f"inspect it with: fanfold show {root.id} --db {db}" in lines, ran.output
    assert f"conversation: {root.id}  database: {db}" in lines, ran.output
    assert f"model: scripted ({script}); log: {db}" in lines, ran.output
    forked = runner.invoke(cli, ["fork", root.id, "--at", "0", "--db", str(db)])
    assert forked.exit_code == 0, forked.output
    new_id = forked.stdout.strip()
    assert f"  fanfold send {new_id} 'your message' --db {db}" in forked.output.splitlines()
    export = folder / "tree.jsonl"
    assert (
        runner.invoke(cli, ["export", root.id, "-o", str(export), "--db", str(db)]).exit_code == 0
    )
    other = folder / "other.db"
    imported = runner.invoke(cli, ["import", str(export), "--db", str(other)])
    assert imported.exit_code == 0, imported.output
    assert (
        f"  fanfold replay {root.id} --verify --tree --db {other}" in imported.output.splitlines()
    )


def test_max_tokens_is_the_budget_of_the_whole_tree(tmp_path: Path) -> None:
    """``--max-tokens``: each sub-agent runs on a share of it, and the root's state
    counts what the sub-agents used."""
    spawn_three = {
        "name": "spawn_agents",
        "arguments": {"tasks": [{"task": "a"}, {"task": "b"}, {"task": "c"}]},
    }
    script = _write(
        tmp_path / "budget.json",
        {
            "latency": 0.01,
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [
                        {
                            "tool_calls": [spawn_three],
                            "usage": {"input_tokens": 90, "output_tokens": 10},
                        },
                        {"text": "done"},
                    ],
                },
                {
                    "match": {"depth": 1},
                    "replies": [
                        {
                            "tool_calls": [
                                {"name": "submit_result", "arguments": {"result": "ok"}}
                            ],
                            "usage": {"input_tokens": 30, "output_tokens": 20},
                        }
                    ],
                },
            ],
        },
    )
    db = tmp_path / "budget.db"
    result = CliRunner().invoke(
        cli,
        [
            "run",
            "--no-live",
            "--db",
            str(db),
            "--script",
            str(script),
            "--max-tokens",
            "1000",
            "go",
        ],
    )
    assert result.exit_code == 0, result.output
    with Store.open(db) as store:
        (root,) = store.list_roots()
        state = store.load_state(root.id)
        shares = [store.load_state(c.id).limits.max_tokens for c in store.children(root.id)]
    assert state.limits.max_tokens == 1000
    assert shares == [225, 225, 225]  # (1000 - 100) split between 3 children and the root
    assert (state.usage.total, state.usage_children) == (100, 150)
    shown = CliRunner().invoke(cli, ["show", root.id, "--db", str(db)])
    text = " ".join(shown.output.split())  # as if unwrapped
    assert "100 tokens, 250 with sub-agents of a 1000 budget" in text
    assert "50 tokens of a 225 budget" in text
    tree = json.loads(CliRunner().invoke(cli, ["show", root.id, "--db", str(db), "--json"]).output)
    assert (tree["tokens"], tree["tree_tokens"], tree["max_tokens"]) == (100, 250, 1000)
    assert [c["max_tokens"] for c in tree["children"]] == [225, 225, 225]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_ctrl_c_with_the_output_reader_gone_still_exits_130_without_a_traceback(
    tmp_path: Path,
) -> None:
    """``fanfold run ... | cat`` and Ctrl-C: the terminal sends SIGINT to both, so the
    reader of our output is gone when the cancel is reported (a broken pipe)."""
    pids = tmp_path / "pids"
    script = _slow_bash_script(tmp_path, pids, root_answers=False, rounds=1)
    db = tmp_path / "piped.db"
    proc = _cli_process(
        "run", "--db", str(db), "--script", str(script), "--cwd", str(tmp_path), "w"
    )
    shells: list[int] = []
    try:
        shells = _wait_for_pids(pids, 2)
        assert proc.stdout is not None
        proc.stdout.close()  # the reader exits with the Ctrl-C
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        assert proc.stderr is not None
        err = proc.stderr.read()
        left_behind = [_live_in_group(shell) for shell in shells]
    finally:
        proc.kill()
        for shell in shells:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell, signal.SIGKILL)
    assert "Traceback" not in err, err
    assert proc.returncode == 130, err
    assert left_behind == [[], []]
    with Store.open(db) as store:
        assert store.unfinished() == []


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_during_resume_shutdown_does_not_cut_it_short(
    tmp_path: Path, signum: int
) -> None:
    """Two signals 1 ms apart: the first stops the resume, the second arrives while the
    runtime shuts down; it must neither abort the shutdown nor change the exit."""
    db = tmp_path / "twice.db"
    shells: list[int] = []
    try:
        resumed, _ = _resume_a_crashed_tree(tmp_path, db, shells)
        resumed.send_signal(signum)
        time.sleep(0.001)
        resumed.send_signal(signum)
        out, err = resumed.communicate(timeout=30)
        left_behind = [_live_in_group(shell) for shell in shells[2:]]
    finally:
        for shell in shells:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell, signal.SIGKILL)
    assert "Traceback" not in err and "Aborted" not in err, err
    assert resumed.returncode == 128 + signum, (out, err)
    assert "stopped by" in err
    assert left_behind == [[], []]
    with Store.open(db) as store:
        assert len(store.unfinished()) == 3  # still resumable


# fanfold, with a stop signal arriving as the runtime has just shut down, before the
# signal receiver closes: the signal is caught, and its hand-over to the receiver
# (a Trio callback) runs only after the receiver has closed.
SIGNAL_AS_THE_RUNTIME_CLOSES = (
    """
import signal, sys
from contextlib import asynccontextmanager
from fanfold.runtime import Runtime

signum = int(sys.argv.pop(1))
open_runtime = Runtime.open

@asynccontextmanager
async def open_then_signal(*args, **kwargs):
    async with open_runtime(*args, **kwargs) as runtime:
        yield runtime
    signal.raise_signal(signum)

Runtime.open = open_then_signal
"""
    + FOREGROUND_FANFOLD
)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_caught_as_the_runtime_closes_neither_aborts_nor_kills(
    tmp_path: Path, signum: int
) -> None:
    """The race behind a second Ctrl-C printing "Aborted!" (exit 1) at the end of a
    clean stop, made certain: the late signal used to be raised again with the real
    handlers back (KeyboardInterrupt; SIGTERM and SIGHUP killed the process)."""
    script = _write(tmp_path / "fast.json", FAST_SCRIPT)
    db = tmp_path / "late.db"
    common = ["--db", str(db), "--script", str(script)]
    ran = _cli_process(
        str(signum),
        "run",
        "--no-live",
        *common,
        "--cwd",
        str(tmp_path),
        "go",
        code=SIGNAL_AS_THE_RUNTIME_CLOSES,
    )
    out, err = ran.communicate(timeout=60)
    assert (ran.returncode, "Aborted" in err, "Traceback" in err) == (0, False, False), err
    assert "the answer is" in out  # the turn had finished: that is what is reported
    resumed = _cli_process(str(signum), "resume", *common, code=SIGNAL_AS_THE_RUNTIME_CLOSES)
    out, err = resumed.communicate(timeout=60)
    assert (resumed.returncode, "Aborted" in err, "Traceback" in err) == (0, False, False), err
    assert "nothing to resume" in out


def test_show_gives_no_answer_for_a_turn_that_was_cancelled(tmp_path: Path) -> None:
    """A second turn cancelled before it answered: the first turn's answer is not
    shown as the answer."""
    script = _write(
        tmp_path / "two.json",
        {
            "latency": 0.01,
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [{"text": "FIRST ANSWER"}, {"text": "never", "latency": 60}],
                }
            ],
        },
    )
    db = tmp_path / "two.db"
    common = ["--db", str(db), "--script", str(script)]
    assert CliRunner().invoke(cli, ["run", *common, "go"]).exit_code == 0
    with Store.open(db) as store:
        (root,) = store.list_roots()
    sent = _cli_process("send", root.id, "more", "--no-live", *common)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until the second turn's model call is logged
        with Store.open(db, read_only=True) as store:
            if store.conversation(root.id).status == "running":
                break
        time.sleep(0.05)
    sent.send_signal(signal.SIGINT)
    out, err = sent.communicate(timeout=30)
    assert sent.returncode == 130, (out, err)
    shown = CliRunner().invoke(cli, ["show", root.id, "--db", str(db)])
    assert "FIRST ANSWER" not in shown.output
    assert (
        json.loads(CliRunner().invoke(cli, ["show", root.id, "--db", str(db), "--json"]).output)[
            "outcome"
        ]
        == ""
    )


def _running_root(db: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    """``fanfold run ARGS`` in a process, once its root's model call is logged (the
    tree ``running``): the process and the root's id."""
    before = set()
    if db.exists():
        with Store.open(db, read_only=True) as store:
            before = {row.id for row in store.list_roots()}
    process = _cli_process("run", "--no-live", "--db", str(db), *args)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception), Store.open(db, read_only=True) as store:
            new = [row for row in store.list_roots() if row.id not in before]
            if new and new[0].status == "running":
                return process, new[0].id
        time.sleep(0.05)
    process.kill()
    pytest.fail("the run never logged its model call")


def test_ls_tells_a_killed_run_from_a_live_one_and_a_cancelled_turn_from_an_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32.14: a tree whose process was killed was listed ``running`` like a live
    one, with no hint to resume it; a root cancelled by Ctrl-C was ``idle`` like an
    answered one."""
    script = _write(
        tmp_path / "slow.json",
        {
            "latency": 0.01,
            "agents": [{"match": {"path": "root"}, "replies": [{"text": "late", "latency": 60}]}],
        },
    )
    db = tmp_path / "ls.db"
    common = ["--script", str(script), "--cwd", str(tmp_path)]
    fast = ["--script", str(_write(tmp_path / "fast.json", FAST_SCRIPT)), "--cwd", str(tmp_path)]
    assert CliRunner().invoke(cli, ["run", "--db", str(db), *fast, "answered"]).exit_code == 0

    # The console's width is fixed when it is made (rich reads COLUMNS then: an earlier
    # test may have made it), so set it: a status must not wrap in its cell.
    from fanfold.cli import output

    monkeypatch.setattr(output.console, "width", 250)

    def statuses() -> dict[str, str]:
        listed = CliRunner().invoke(cli, ["ls", "--db", str(db)])
        assert listed.exit_code == 0, listed.output
        return {
            cells[1]: cells[2]
            for line in listed.output.splitlines()
            if len(cells := [c.strip() for c in line.split("│")]) > 3
        }

    live, cancelled = _running_root(db, *common, "to cancel")
    assert statuses()[cancelled] == "running"  # its runtime is alive
    # `wait` on a tree in the log but not at rest gives up after its timeout (exit 124).
    waited = CliRunner().invoke(cli, ["wait", cancelled, "--db", str(db), "--timeout", "0.3"])
    assert waited.exit_code == EXIT_TIMEOUT, waited.output
    assert f"{cancelled} was not at rest after 0.3 s" in waited.output
    live.send_signal(signal.SIGINT)
    out, err = live.communicate(timeout=30)
    assert live.returncode == 130, (out, err)
    killed, orphan = _running_root(db, *common, "to kill")
    killed.kill()
    killed.communicate(timeout=30)
    shown = statuses()
    assert shown[cancelled] == "idle (cancelled)", shown
    assert shown[orphan] == "running (no runtime: fanfold resume)"
    assert list(shown.values()).count("idle") == 1  # the answered root
    as_json = json.loads(CliRunner().invoke(cli, ["ls", "--json", "--db", str(db)]).output)
    by_id = {item["id"]: item for item in as_json}
    assert (by_id[cancelled]["status"], by_id[cancelled]["last_turn"]) == ("idle", "cancelled")
    assert (by_id[orphan]["status"], by_id[orphan]["runtime_open"]) == ("running", False)


def test_a_run_that_cannot_start_a_thread_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Issue 32.14: under a memory limit too low for a thread's stack (``ulimit -v``),
    ``run`` ended in a traceback ("can't start new thread"). Made certain here: each
    thread's stack is as large as the stack limit (glibc's default), 1 GB, under a
    700 MB address-space limit, so every thread the run starts fails, and nothing else."""
    import resource

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_STACK, (1 << 30, 1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (700 << 20, 700 << 20))

    script = _write(tmp_path / "s.json", FAST_SCRIPT)
    args = ["run", "--no-live", "--db", str(tmp_path / "t.db"), "--script", str(script), "go"]
    done = subprocess.run(
        [sys.executable, "-c", "from fanfold.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=limits,
    )
    assert (done.returncode, "Traceback" in done.stderr) == (2, False), done.stderr
    hint, line = done.stderr.strip().splitlines()  # "model: ...; log: ...", the error
    assert hint.startswith("model: scripted")
    assert line.startswith("error: out of memory: could not get a thread"), line
    assert "can't start new thread" in line and "fanfold resume" in line


def test_printable_escapes_terminal_and_bidirectional_controls_and_keeps_the_rest() -> None:
    assert printable("ok\tline\r\nnext\u00e9") == "ok\tline\nnext\u00e9"
    assert printable("a\x1b[2Jb\x9b\x07\rc") == "a\\x1b[2Jb\\x9b\\x07\\x0dc"
    assert printable("user\u202egnp.exe") == "user\\u202egnp.exe"  # shown in order
    assert printable("\u2066x\u2069\u200f") == "\\u2066x\\u2069\\u200f"


def test_the_roots_system_prompt_comes_from_the_options_or_the_config(tmp_path: Path) -> None:
    """Issue 12, system prompts: `--system` or `--system-file` (not both), else the
    config's `system_prompt`; sub-agents are told the sub-agent prompt, their role.
    What each model was told is in its state (and so in the log and in replay)."""
    from fanfold.db import Store
    from fanfold.statemachine import SUB_AGENT_PROMPT

    script = _write(tmp_path / "s.json", FAST_SCRIPT)
    runner = CliRunner()

    def told(*options: str) -> tuple[str, list[str]]:
        db = tmp_path / f"db{len(list(tmp_path.glob('db*')))}.db"
        args = ["run", "--no-live", "--db", str(db), *options, "--cwd", str(tmp_path), "go"]
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, result.output
        with Store.open(db) as store:
            (row,) = store.list_roots()
            children = [c.id for c in store.children(row.id)]
            return (
                store.load_state(row.id).system_prompt,
                [store.load_state(c).system_prompt for c in children],
            )

    root, children = told("--script", str(script), "--system", "Answer in French.")
    assert root == "Answer in French." and children and set(children) == {SUB_AGENT_PROMPT}
    prompt_file = tmp_path / "prompt.md"
    prompt_file.write_text("Be terse.\nCite files.\n", encoding="utf-8")
    assert told("--script", str(script), "--system-file", str(prompt_file))[0] == (
        "Be terse.\nCite files.\n"
    )
    twice = ["--system", "a", "--system-file", str(prompt_file)]
    both = runner.invoke(
        cli, ["run", "--db", str(tmp_path / "x.db"), "--script", str(script), *twice, "go"]
    )
    assert both.exit_code == 2 and "not both" in both.output
    config = tmp_path / "fanfold.toml"
    config.write_text(
        'system_prompt = "From the config."\n[profiles.offline]\nprovider = "scripted"\n',
        encoding="utf-8",
    )
    assert told("--config", str(config))[0] == "From the config."
    assert told("--config", str(config), "--system", "Given.")[0] == "Given."


def test_run_timeout_ends_a_turn_that_outlives_it_in_error(tmp_path: Path) -> None:
    # A child that takes a minute, a turn limit of half a second (real time: the CLI
    # runs on the wall clock): the run ends at once, in error, the child cancelled.
    slow = {
        "latency": 0.01,
        "agents": [
            {
                "match": {"path": "root"},
                "replies": [
                    {
                        "tool_calls": [
                            {"name": "spawn_agents", "arguments": {"tasks": [{"task": "x"}]}}
                        ]
                    },
                    {"text": "never"},
                ],
            },
            {"match": {"path": "root/1"}, "replies": [{"text": "late", "latency": 60.0}]},
        ],
    }
    db = tmp_path / "cli.db"
    script = _write(tmp_path / "slow.json", slow)
    args = ["run", "--db", str(db), "--script", str(script), "--no-live", "--timeout", "0.5"]
    result = CliRunner().invoke(cli, [*args, "--cwd", str(tmp_path), "go"])
    assert result.exit_code == 1, result.output
    assert "time limit of 0.5s reached" in result.output
    with Store.open(db) as store:
        (root,) = store.list_roots()
        assert store.load_state(root.id).timeout == 0.5
        (child,) = store.children(root.id)
        assert child.status != "running"
    for bad in ("0", "-1", "nan", "inf", "1e12"):
        refused = CliRunner().invoke(cli, [*args[:-1], bad, "go"])
        assert refused.exit_code == 2 and "--timeout" in refused.output, bad
