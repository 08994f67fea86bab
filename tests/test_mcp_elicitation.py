"""Issue 35 over ``fanfold mcp``, the host's side: a host whose client declares MCP
elicitation support is asked each request of a waiting delegation directly
(``elicitation/create``) and its user's answer is the decision; a host without it
gets the requests listed (``get_delegation_result``) as before, and the server's
``--approval-timeout`` denies a call nobody decides. Driven by the SDK's client over
a real stdio ``fanfold mcp`` subprocess, on a real SQLite file and a scripted model."""

from __future__ import annotations

import os
import shlex
import sqlite3
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import mcp_types as types
import trio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from test_mcp_approvals import TWO_ASKED
from test_mcp_server import _script, _structured

from fanfold.db import Store
from fanfold.statemachine import ToolResultMessage

pytestmark = pytest.mark.slow


@asynccontextmanager
async def _session(
    tmp_path: Path, script: Path, db: Path, *more: str, elicitation: Any = None
) -> AsyncIterator[ClientSession]:
    """A ``fanfold mcp`` subprocess over stdio; ``elicitation``: the client's
    elicitation callback (given: the client declares the capability)."""
    command = [sys.executable, "-c", "from fanfold.cli import main; main()"]
    command += ["mcp", "--script", str(script), "--db", str(db), "--cwd", str(tmp_path), *more]
    params = StdioServerParameters(
        command="sh", args=["-c", f"exec {shlex.join(command)}"], env=dict(os.environ)
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, elicitation_callback=elicitation) as session,
    ):
        await session.initialize()
        yield session


def _results(db: Path, root: str) -> list[str]:
    with Store.open(db, read_only=True) as store:
        state = store.load_state(root)
    return [m.result.content for m in state.history if isinstance(m, ToolResultMessage)]


async def test_a_host_with_elicitation_is_asked_and_its_answers_decide(tmp_path: Path) -> None:
    db = tmp_path / "e.db"
    script = _script(tmp_path, "asked.json", TWO_ASKED)
    asked: list[str] = []

    async def answer(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        message = params.message
        asked.append(message)
        assert isinstance(params, types.ElicitRequestFormParams)
        assert set(params.requested_schema["properties"]) == {"approve", "reason", "arguments"}
        if '"echo one"' in message:
            # Approved with edited arguments, once a form with bad JSON was put again
            # and arguments the tool's schema refuses were not taken.
            edits = {1: "{", 2: '{"command": 3}', 3: '{"command": "echo edited"}'}
            return types.ElicitResult(
                action="accept", content={"approve": True, "arguments": edits[len(asked)]}
            )
        if len(asked) == 4:  # the user puts the second off: left to the host's model
            return types.ElicitResult(action="cancel")
        return types.ElicitResult(action="accept", content={"approve": False, "reason": "not two"})

    async with _session(tmp_path, script, db, "--ask", "bash", elicitation=answer) as session:
        with trio.fail_after(60):
            first = _structured(await session.call_tool("delegate_task", {"task": "go"}))
            root = first["delegation_id"]
            # Put off: listed as without elicitation; the refused answer is reported.
            assert first["status"] == "running"
            (refused,) = first["not_taken"]
            assert refused.startswith(f"{root}:") and "command" in refused
            assert first["requests"][0]["arguments"] == {"command": "echo two"}
            # Waiting again asks again; the user denies it this time.
            done = _structured(
                await session.call_tool(
                    "get_delegation_result", {"delegation_id": root, "wait": True}
                )
            )
    assert done == {"delegation_id": root, "status": "completed", "result": "done"}
    assert len(asked) == 5 and "not JSON" in asked[1] and "not taken" in asked[2]
    assert '"echo two"' in asked[3]
    assert all("wants to run bash" in m and "request " in m for m in asked)
    results = _results(db, root)
    assert results[0].startswith("edited") and results[1] == "denied by the user: not two"
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT kind, decided_by, state FROM decisions ORDER BY at").fetchall()
    assert rows == [("grant", "mcp elicitation", "applied"), ("deny", "mcp elicitation", "applied")]


ONE_ASKED = {
    "latency": 0.0,
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo one"}}]},
                {"text": "done"},
            ],
        }
    ],
}


async def test_a_host_without_elicitation_gets_the_requests_and_the_approval_timeout_denies(
    tmp_path: Path,
) -> None:
    db = tmp_path / "n.db"
    script = _script(tmp_path, "one.json", ONE_ASKED)
    # No elicitation: the requests are listed; nobody decides, and the server's
    # --approval-timeout denies the call.
    async with _session(
        tmp_path, script, db, "--ask", "bash", "--approval-timeout", "1.5"
    ) as session:
        first = _structured(await session.call_tool("delegate_task", {"task": "go"}))
        root = first["delegation_id"]
        assert first["status"] == "running" and first["requests"][0]["tool"] == "bash"
        with trio.fail_after(60):
            while True:
                now = _structured(
                    await session.call_tool("get_delegation_result", {"delegation_id": root})
                )
                if now["status"] != "running":
                    break
                await trio.sleep(0.1)
    assert now == {"delegation_id": root, "status": "completed", "result": "done"}
    assert _results(db, root) == ["denied by the user: no decision within 1.5s (approval_timeout)"]


async def test_a_form_still_open_is_withdrawn_when_its_request_closes(tmp_path: Path) -> None:
    """In process, the service with a runtime: the host's user leaves the form open;
    the server's approval timeout denies the call, the elicitation is withdrawn (its
    request cancelled), and the foreground delegation answers."""
    from runtime_helpers import open_runtime, reply, script

    from fanfold.serve.mcp_server import DelegationLedger, DelegationService
    from fanfold.statemachine import Limits

    # 2 s: long enough that the form is open before the timeout under a loaded machine
    # (with 0.5 s the request closed before the form was put, at a load of 10).
    limits = Limits(approval_timeout=2.0)
    provider = script(0.0, root=[reply("", ("bash", {"command": "echo x"})), reply("done")])
    withdrawn: list[str] = []

    async def never(request: Any, last: str) -> Any:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            withdrawn.append(request.id)
            raise

    async with open_runtime(tmp_path, provider, limits=limits) as runtime:
        service = DelegationService(
            runtime,
            cwd=tmp_path,
            agents=(),
            limits=limits,
            system_prompt="",
            ledger=DelegationLedger(tmp_path / "log.db"),
            ask=("bash",),
        )
        with trio.fail_after(30):
            done = await service.delegate(None, "go", None, None, False, never)
    root = done["delegation_id"]
    assert done == {"delegation_id": root, "status": "completed", "result": "done"}
    assert len(withdrawn) == 1 and withdrawn[0].startswith(f"{root}:")
    assert _results(tmp_path / "log.db", root) == [
        "denied by the user: no decision within 2.0s (approval_timeout)"
    ]
