"""Issue 35 with real processes: `fanfold run` asking in a terminal (a pty) while
another process approves; kill -9 while waiting, then resume; a 100-child fan-out's
requests decided in random order from other processes, each call run once."""

from __future__ import annotations

import json
import os
import pty
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fanfold.cli.approvals import open_requests
from fanfold.db import Store
from fanfold.runtime.approvals import Decision, FileDecisions, PendingRequest
from fanfold.statemachine import ToolResultMessage

EXIT_WAITING = 75
CLI = [sys.executable, "-c", "from fanfold.cli import main; main()"]


def _cli(db: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args, "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def _script(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(data))
    return path


TOUCH = {
    "latency": 0.01,
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo x >> ran.txt"}}]},
                {"text": "done"},
            ],
        }
    ],
}


class _Terminal:
    """``fanfold run`` on a pseudo-terminal: its live view and its prompts."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        master, slave = pty.openpty()
        env = {**os.environ, "TERM": "xterm", "COLUMNS": "120", "LINES": "40"}
        self.process = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env, close_fds=True
        )
        os.close(slave)
        self.master = master
        self.output = b""

    def read_until(self, text: str, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while text.encode() not in self.output:
            if time.monotonic() > end:
                raise AssertionError(f"{text!r} not shown; output: {self.output[-2000:]!r}")
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.output += os.read(self.master, 65536)
                except OSError:  # the process ended: its side of the pty is closed
                    if self.process.poll() is not None:
                        raise AssertionError(
                            f"{text!r} not shown; exit {self.process.returncode}; "
                            f"output: {self.output[-2000:]!r}"
                        ) from None

    def wait(self, timeout: float = 60) -> int:
        end = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < end:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.output += os.read(self.master, 65536)
                except OSError:
                    break
        try:
            code = self.process.wait(timeout=max(1.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running; output: {self.output[-3000:]!r}") from None
        while select.select([self.master], [], [], 0.1)[0]:  # what it wrote last
            try:
                data = os.read(self.master, 65536)
            except OSError:
                break
            if not data:
                break
            self.output += data
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self.master)


def _tree_of_only_request(db: Path, *, cli: bool = False) -> dict[str, Any]:
    """The log's only open request, as `fanfold pending --json` lists it (``cli``:
    from the command itself; else from the function behind it, no process)."""
    if cli:
        listed = _cli(db, "pending", "--json")
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
    else:
        lines = [json.dumps(_listed(r)) for r, _ in open_requests(db)]
    assert len(lines) == 1, lines
    found: dict[str, Any] = json.loads(lines[0])
    return found


def _listed(request: PendingRequest) -> dict[str, Any]:
    return {
        "id": request.id,
        "tree": request.tree,
        "agent": request.path,
        "tool": request.tool,
        "arguments": json.loads(request.arguments_json),
    }


QUESTION_THEN_TOUCH = {
    "latency": 0.01,
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                {
                    "tool_calls": [
                        {
                            "name": "ask_user",
                            "arguments": {"question": "Which line?", "choices": ["w", "x"]},
                        }
                    ]
                },
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo x >> ran.txt"}}]},
                {"text": "done"},
            ],
        }
    ],
}


def test_run_in_a_terminal_asks_and_another_process_approves(tmp_path: Path) -> None:
    """A question answered at the prompt (a choice's number), then an approval
    request decided by another process while the prompt waits: the run drops its
    prompt and goes on to its answer."""
    db = tmp_path / "t.db"
    script = _script(tmp_path, QUESTION_THEN_TOUCH)
    argv = [*CLI, "run", "go", "--script", str(script), "--ask-user", "--ask", "Bash(echo:*)"]
    run = _Terminal([*argv, "--db", str(db)], tmp_path)
    try:
        run.read_until("answer (empty: decline): ")
        os.write(run.master, b"2\n")
        run.read_until("approve? [y]es / [n]o / [e]dit")
        assert not (tmp_path / "ran.txt").exists()
        request = _tree_of_only_request(db, cli=True)
        assert request["tool"] == "bash" and request["agent"] == "root"
        assert request["arguments"] == {"command": "echo x >> ran.txt"}
        approved = _cli(db, "approve", request["tree"])
        assert approved.returncode == 0, approved.stderr
        assert run.wait() == 0, run.output[-2000:]
        assert b"done" in run.output  # the turn went on to its answer
        # A second decision of the same request: a typed error, no traceback.
        again = _cli(db, "deny", request["id"], "--reason", "late")
        assert again.returncode == 2 and "Traceback" not in again.stderr
        assert "no open request" in again.stderr
    finally:
        run.close()
    assert (tmp_path / "ran.txt").read_text() == "x\n"
    with Store.open(db, read_only=True) as store:
        root = store.load_state(request["tree"])
    results = [m.result.content for m in root.history if isinstance(m, ToolResultMessage)]
    assert results[0] == "x"  # the second choice, picked by its number


def test_kill_9_while_waiting_then_resume(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    script = _script(tmp_path, TOUCH)
    run = _Terminal(
        [*CLI, "run", "go", "--script", str(script), "--ask", "Bash(echo:*)", "--db", str(db)],
        tmp_path,
    )
    try:
        run.read_until("approve? [y]es / [n]o / [e]dit")
        os.kill(run.process.pid, signal.SIGKILL)
        run.process.wait()
    finally:
        run.close()
    first = _tree_of_only_request(db)
    # Resumed while nobody decided: still waiting, the same request, nothing run.
    resumed = _cli(db, "resume", cwd=tmp_path)
    assert resumed.returncode == EXIT_WAITING, resumed.stdout + resumed.stderr
    assert first["id"] in resumed.stdout
    assert _tree_of_only_request(db) == first
    assert not (tmp_path / "ran.txt").exists()
    # Approved with edited arguments, and --continue goes on with the tree at once.
    edited = _cli(
        db, "approve", first["id"], "--args", '{"command": "echo y >> ran.txt"}', "--continue"
    )
    assert edited.returncode == 0, edited.stdout + edited.stderr
    assert (tmp_path / "ran.txt").read_text() == "y\n"  # run once, as edited
    assert open_requests(db) == []


FAN_OUT = 100


def test_a_fan_out_of_100_requests_decided_in_random_order(tmp_path: Path) -> None:
    children = {
        "match": {"depth": 1},
        "replies": [
            {
                "tool_calls": [
                    {"name": "bash", "arguments": {"command": "echo {{task}} >> calls.txt"}}
                ]
            },
            {"tool_calls": [{"name": "submit_result", "arguments": {"result": "ok"}}]},
        ],
    }
    tasks = [{"task": f"t{i}"} for i in range(FAN_OUT)]
    script = _script(
        tmp_path,
        {
            "latency": 0.0,
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [
                        {"tool_calls": [{"name": "spawn_agents", "arguments": {"tasks": tasks}}]},
                        {"text": "all done"},
                    ],
                },
                children,
            ],
        },
    )
    db = tmp_path / "t.db"
    started = _cli(
        db,
        "run",
        "go",
        "--script",
        str(script),
        "--ask",
        "Bash(echo:*)",
        "--max-tasks-per-call",
        str(FAN_OUT),
        "--max-concurrent",
        str(FAN_OUT),
        "--no-wait",
        "--no-live",
        cwd=tmp_path,
    )
    assert started.returncode == EXIT_WAITING, started.stdout[-2000:] + started.stderr
    requests = [_listed(r) for r, _ in open_requests(db)]
    assert len(requests) == FAN_OUT and len({r["id"] for r in requests}) == FAN_OUT
    assert not (tmp_path / "calls.txt").exists()
    order = random.Random(35).sample(requests, FAN_OUT)
    # One from the CLI (a denial naming tree and agent path), the others written to
    # the decisions table by this process as `fanfold approve` writes them, in
    # random order.
    denied = _cli(db, "deny", order[2]["tree"], order[2]["agent"], "--reason", "not this one")
    assert denied.returncode == 0, denied.stderr
    table = FileDecisions(db)
    for request in (*order[:2], *order[3:]):
        table.write(Decision(request["id"], "grant", None, "", "test", time.time()))
    resumed = _cli(db, "resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr
    ran = (tmp_path / "calls.txt").read_text().split()
    # Child root/K was given task t(K-1); the denied one's never ran.
    denied_task = f"t{int(order[2]['agent'].split('/')[1]) - 1}"
    assert sorted(ran) == sorted(f"t{i}" for i in range(FAN_OUT) if f"t{i}" != denied_task)
    assert len(ran) == len(set(ran)) == FAN_OUT - 1  # each call run once
    with Store.open(db, read_only=True) as store:
        child = store.load_state(order[2]["id"].rsplit(":", 1)[0])
    results = [m.result.content for m in child.history if isinstance(m, ToolResultMessage)]
    assert "denied by the user: not this one" in results
    assert all(table.state_of(r["id"]) == "applied" for r in requests)
