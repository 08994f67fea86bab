"""``fanfold mcp``: delegation served over MCP, driven by the SDK's own client over a
real stdio subprocess, on a real SQLite file and a scripted model."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner

pytest.importorskip("mcp")

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from fanfold.cli import cli
from fanfold.db import Store
from fanfold.statemachine import ToolResultMessage

pytestmark = pytest.mark.slow

FAST = {"agents": [{"match": {"path": "root"}, "replies": [{"text": "the answer is 42"}]}]}
SLOW_ROOT = {
    "agents": [
        {"match": {"path": "root"}, "replies": [{"text": "too late", "latency": 600}]},
    ]
}
SLOW_CHILDREN = {
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                {
                    "text": "splitting",
                    "tool_calls": [
                        {
                            "name": "spawn_agents",
                            "arguments": {"tasks": [{"task": "part one"}, {"task": "part two"}]},
                        }
                    ],
                },
                {"text": "joined"},
            ],
        },
        {"match": {"depth": 1}, "replies": [{"text": "never", "latency": 600}]},
    ]
}


def _script(tmp_path: Path, name: str, script: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(script), encoding="utf-8")
    return path


@asynccontextmanager
async def _server(
    tmp_path: Path, script: Path, db: Path, *more: str
) -> AsyncIterator[ClientSession]:
    """A ``fanfold mcp`` subprocess over stdio, its pid written to tmp_path/pid (the
    shell execs it, so the pid is the server's); ``more``: further options."""
    command = [sys.executable, "-c", "from fanfold.cli import main; main()"]
    command += ["mcp", "--script", str(script), "--db", str(db), "--cwd", str(tmp_path), *more]
    pidfile = tmp_path / "pid"
    shell = f"echo $$ > {shlex.quote(str(pidfile))}; exec {shlex.join(command)}"
    params = StdioServerParameters(command="sh", args=["-c", shell], env=dict(os.environ))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def _until_at_rest(db: Path, root_id: str) -> None:
    """Wait (bounded, not timed) until the tree's root is no longer running."""
    with trio.fail_after(60):
        while True:
            with Store.open(db, read_only=True) as store:
                if store.conversation(root_id).status != "running":
                    return
            await trio.sleep(0.05)


def _structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def test_tools_listed_and_a_foreground_delegation_answers(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    async with _server(tmp_path, _script(tmp_path, "fast.json", FAST), db) as session:
        names = {t.name for t in (await session.list_tools()).tools}
        assert names == {
            "delegate_task",
            "list_sub_agents",
            "get_delegation_result",
            "approve_request",
            "deny_request",
            "answer_request",
        }
        agents = _structured(await session.call_tool("list_sub_agents", {}))["result"]
        assert "explorer" in {a["name"] for a in agents}
        answer = _structured(await session.call_tool("delegate_task", {"task": "compute"}))
        assert answer["status"] == "completed"
        assert answer["result"] == "the answer is 42"
        unknown = await session.call_tool("delegate_task", {"task": "x", "agent": "nobody"})
        assert unknown.is_error
        assert "no agent named 'nobody'" in unknown.content[0].text  # type: ignore[union-attr]
    # The delegation is an ordinary tree: `fanfold ls` lists it.
    listed = CliRunner().invoke(cli, ["ls", "--db", str(db)])
    assert answer["delegation_id"] in listed.output


async def test_a_delegated_tree_calls_the_python_tools_given_with_tools(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(
        "import fanfold\n\n\n@fanfold.tool\ndef note(text: str) -> str:\n"
        '    """Note it.\n\n    Args:\n        text: What.\n    """\n'
        '    return "noted " + text\n'
    )
    calls = {
        "agents": [
            {
                "match": {"path": "root"},
                "replies": [
                    {"tool_calls": [{"name": "note", "arguments": {"text": "hi"}}]},
                    {"text": "done"},
                ],
            }
        ]
    }
    db = tmp_path / "p.db"
    script = _script(tmp_path, "calls.json", calls)
    ref = f"{tmp_path / 'mytools.py'}:note"
    async with _server(tmp_path, script, db, "--tools", ref) as session:
        answer = _structured(await session.call_tool("delegate_task", {"task": "note it"}))
    assert answer["status"] == "completed", answer
    with Store.open(db, read_only=True) as store:
        state = store.load_state(answer["delegation_id"])
    results = [m.result for m in state.history if isinstance(m, ToolResultMessage)]
    assert [(r.content, r.is_error) for r in results] == [("noted hi", False)]


async def test_background_delegation_and_its_result(tmp_path: Path) -> None:
    db = tmp_path / "b.db"
    async with _server(tmp_path, _script(tmp_path, "fast.json", FAST), db) as session:
        started = _structured(
            await session.call_tool("delegate_task", {"task": "compute", "background": True})
        )
        assert started["status"] == "running"
        done = _structured(
            await session.call_tool(
                "get_delegation_result", {"delegation_id": started["delegation_id"], "wait": True}
            )
        )
        assert done == {
            "delegation_id": started["delegation_id"],
            "status": "completed",
            "result": "the answer is 42",
        }
        stranger = await session.call_tool("get_delegation_result", {"delegation_id": "abc"})
        assert stranger.is_error


async def test_cancelling_the_request_cancels_the_tree_and_its_children(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    script = _script(tmp_path, "slow.json", SLOW_CHILDREN)
    async with _server(tmp_path, script, db) as session:
        with trio.move_on_after(3) as scope:
            await session.call_tool("delegate_task", {"task": "split it"})
        assert scope.cancelled_caught
        ledger = (tmp_path / "c.db.mcp-delegations").read_text().split()
        assert len(ledger) == 1
        root_id = ledger[0]
        await _until_at_rest(db, root_id)
        with Store.open(db, read_only=True) as store:
            assert store.last_turn(root_id).outcome == "cancelled"  # type: ignore[union-attr]
            children = store.children(root_id)
            assert len(children) == 2
            assert all(c.status == "failed" for c in children)
            kinds = {type(e.event).__name__ for e in store.events(root_id)}
        assert "CancelRequested" in kinds


async def test_a_delegation_survives_a_kill_and_resumes_at_restart(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    async with _server(tmp_path, _script(tmp_path, "slow.json", SLOW_ROOT), db) as session:
        started = _structured(
            await session.call_tool("delegate_task", {"task": "compute", "background": True})
        )
        os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
    root_id = started["delegation_id"]
    with Store.open(db, read_only=True) as store:
        assert store.conversation(root_id).status == "running"
    async with _server(tmp_path, _script(tmp_path, "fast.json", FAST), db) as session:
        done = _structured(
            await session.call_tool(
                "get_delegation_result", {"delegation_id": root_id, "wait": True}
            )
        )
    assert done["status"] == "completed"
    assert done["result"] == "the answer is 42"


async def test_a_delegation_runs_as_its_agent_definition(tmp_path: Path) -> None:
    """The root of ``delegate_task(agent=...)`` gets the definition's rules, prompt and
    caps, as a sub-agent spawned as it would: the read-only explorer has no bash."""
    from runtime_helpers import open_runtime

    from fanfold.agents import load_agents
    from fanfold.providers.scripted import ScriptedProvider
    from fanfold.serve.mcp_server import DelegationLedger, DelegationService
    from fanfold.statemachine import Limits

    agents = load_agents(tmp_path).agents
    explorer = next(a for a in agents if a.name == "explorer")
    async with open_runtime(tmp_path, ScriptedProvider(FAST)) as runtime:
        service = DelegationService(
            runtime,
            cwd=tmp_path,
            agents=agents,
            limits=Limits(),
            system_prompt="base prompt",
            ledger=DelegationLedger(tmp_path / "log.db"),
        )
        answer = await service.delegate("explorer", "look", "some context", 500, False)
        state = runtime.state(answer["delegation_id"])
    names = {t.name for t in state.tools}
    assert "bash" not in names and "write_file" not in names
    assert "read_file" in names
    assert state.permissions is not None
    assert explorer.prompt.strip()[:40] in state.system_prompt
    assert state.limits.max_tokens == 500
    assert state.agent == "explorer"
    assert "some context" in state.history[0].text  # type: ignore[union-attr]


async def test_streamable_http_needs_the_token_and_our_host(tmp_path: Path) -> None:
    """``fanfold mcp --http``: the SDK's HTTP client with the bearer token delegates;
    without it (or naming another host) the request is refused with one line."""
    import httpx
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    token = "t" * 32
    script = _script(tmp_path, "fast.json", FAST)
    command = [sys.executable, "-c", "from fanfold.cli import main; main()", "mcp", "--http"]
    command += ["--script", str(script), "--db", str(tmp_path / "h.db"), "--cwd", str(tmp_path)]
    env = {**os.environ, "FANFOLD_MCP_TOKEN": token}
    async with trio.open_nursery() as nursery:
        process = await nursery.start(
            lambda task_status: trio.run_process(
                command, env=env, stderr=subprocess.PIPE, task_status=task_status
            )
        )
        url = ""
        with trio.fail_after(60):
            buffer = b""
            while "/mcp" not in url:
                buffer += await process.stderr.receive_some()
                for line in buffer.decode(errors="replace").splitlines():
                    if line.startswith("fanfold mcp: ") and line.endswith("/mcp"):
                        url = line.removeprefix("fanfold mcp: ")
        assert "bearer token" not in buffer.decode()  # taken from the environment: not shown
        async with httpx.AsyncClient() as plain:
            refused = await plain.post(url, json={})
            assert refused.status_code == 401
            assert refused.text == "refused: no or a wrong bearer token\n"
            port = url.rsplit(":", 1)[1].removesuffix("/mcp")
            foreign = await plain.post(
                url,
                json={},
                headers={"Host": f"evil.example:{port}", "Authorization": f"Bearer {token}"},
            )
            assert foreign.status_code == 403
        client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with (
            client,
            streamable_http_client(url, http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            answer = _structured(await session.call_tool("delegate_task", {"task": "compute"}))
        assert answer["result"] == "the answer is 42"
        process.terminate()


def test_a_host_going_away_mid_delegation_cancels_the_tree(tmp_path: Path) -> None:
    """The host closes the server's stdin while a foreground delegation runs: the
    server records the tree's cancel before it exits."""
    script = _script(tmp_path, "slow.json", SLOW_ROOT)
    db = tmp_path / "e.db"
    command = [sys.executable, "-c", "from fanfold.cli import main; main()", "mcp"]
    command += ["--script", str(script), "--db", str(db), "--cwd", str(tmp_path)]
    server = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert server.stdin is not None and server.stdout is not None

    def send(message: dict[str, Any]) -> None:
        assert server.stdin is not None
        server.stdin.write((json.dumps(message) + "\n").encode())
        server.stdin.flush()

    params = {"protocolVersion": "2025-06-18", "capabilities": {}}
    params["clientInfo"] = {"name": "raw", "version": "1"}
    send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})
    assert b'"id":1' in server.stdout.readline()
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    call = {"name": "delegate_task", "arguments": {"task": "x"}}
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
    ledger = tmp_path / "e.db.mcp-delegations"
    deadline = time.monotonic() + 60
    while not ledger.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    server.stdin.close()
    assert server.wait(timeout=60) == 0
    (root_id,) = ledger.read_text().split()
    with Store.open(db, read_only=True) as store:
        assert store.last_turn(root_id).outcome == "cancelled"  # type: ignore[union-attr]


def test_a_fanfold_mcp_started_by_a_fanfold_starts_no_servers(tmp_path: Path) -> None:
    """A project whose .mcp.json names `fanfold mcp` would start copies without end:
    one started as another fanfold's server (``UNDER_FANFOLD`` set) starts none."""
    from fanfold.mcp.client import UNDER_FANFOLD
    from fanfold.trust import TrustStore

    script = _script(tmp_path, "fast.json", FAST)
    started = tmp_path / "started"
    server = f"open({str(started)!r}, 'w')"
    (tmp_path / ".mcp.json").write_text(
        json.dumps({"mcpServers": {"s": {"command": sys.executable, "args": ["-c", server]}}})
    )
    # Trusted, so that only UNDER_FANFOLD keeps it from starting.
    TrustStore(tmp_path / "trusted.json").trust(tmp_path / ".mcp.json")
    command = [sys.executable, "-c", "from fanfold.cli import main; main()", "mcp"]
    command += ["--script", str(script), "--db", str(tmp_path / "u.db"), "--cwd", str(tmp_path)]
    done = subprocess.run(
        command,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            UNDER_FANFOLD: "1",
            "HOME": str(tmp_path),
            "FANFOLD_TRUST_FILE": str(tmp_path / "trusted.json"),
        },
    )
    assert done.returncode == 0, done.stderr
    assert "not starting MCP servers of its own" in done.stderr
    assert not started.exists()
