"""Issue 35 over ``fanfold mcp``: a delegation waiting for a person's decision lists
its open requests in ``get_delegation_result``, and ``approve_request`` /
``deny_request`` take the decision; driven by the SDK's client over a real stdio
subprocess, on a real SQLite file and a scripted model."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("mcp")

from test_mcp_server import _script, _server, _structured

from fanfold.db import Store
from fanfold.statemachine import ToolResultMessage

pytestmark = pytest.mark.slow

TWO_ASKED = {
    "latency": 0.0,
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                {
                    "tool_calls": [
                        {"name": "bash", "arguments": {"command": "echo one"}},
                        {"name": "bash", "arguments": {"command": "echo two"}},
                    ]
                },
                {"text": "done"},
            ],
        }
    ],
}


async def test_a_waiting_delegation_lists_its_requests_and_the_host_decides(
    tmp_path: Path,
) -> None:
    db = tmp_path / "a.db"
    script = _script(tmp_path, "asked.json", TWO_ASKED)
    async with _server(tmp_path, script, db, "--ask", "Bash(echo:*)") as session:
        # In the foreground too, the answer comes once the tree waits for a person.
        first = _structured(await session.call_tool("delegate_task", {"task": "go"}))
        root = first["delegation_id"]
        assert first["status"] == "running"
        (request,) = first["requests"]
        assert request["tool"] == "bash" and request["agent"] == "root"
        assert request["arguments"] == {"command": "echo one"}
        assert "bash(echo*)" in request["rule"]
        unknown = await session.call_tool("approve_request", {"request_id": "nope:1"})
        assert unknown.is_error and "no open request" in unknown.content[0].text  # type: ignore[union-attr]
        decided = _structured(
            await session.call_tool(
                "approve_request",
                {"request_id": request["request_id"], "arguments": {"command": "echo edited"}},
            )
        )
        assert decided["delegation_id"] == root
        # The round's second call asks next: wait returns once it waits again.
        waiting = _structured(
            await session.call_tool("get_delegation_result", {"delegation_id": root, "wait": True})
        )
        (second,) = waiting["requests"]
        assert second["arguments"] == {"command": "echo two"}
        again = await session.call_tool(
            "approve_request", {"request_id": request["request_id"]}
        )  # decided already: refused
        assert again.is_error
        wrong = await session.call_tool(
            "answer_request", {"request_id": second["request_id"], "text": "x"}
        )
        assert wrong.is_error and "asks for approval" in wrong.content[0].text  # type: ignore[union-attr]
        denied = await session.call_tool(
            "deny_request", {"request_id": second["request_id"], "reason": "not two"}
        )
        assert not denied.is_error, denied.content
        done = _structured(
            await session.call_tool("get_delegation_result", {"delegation_id": root, "wait": True})
        )
        assert done == {"delegation_id": root, "status": "completed", "result": "done"}
    with Store.open(db, read_only=True) as store:
        state = store.load_state(root)
    results = [m.result.content for m in state.history if isinstance(m, ToolResultMessage)]
    assert results[0].startswith("edited") and results[1] == "denied by the user: not two"
