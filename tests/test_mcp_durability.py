"""A tool call in flight when the runtime stops is never sent again silently: it is
recorded as interrupted, unless its tool declares itself idempotent (an MCP server's
``idempotent_tools``), in which case it is run again on resume."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
from runtime_helpers import open_runtime

from fanfold.providers.scripted import ScriptedProvider
from fanfold.statemachine import ToolExecuting, ToolResultMessage, ToolSpec
from fanfold.tools.registry import ToolSet
from fanfold.tools.tool import ToolOutput

SCRIPT = {
    "agents": [
        {
            "replies": [
                {"text": "calling", "tool_calls": [{"name": "mcp__srv__act", "arguments": {}}]},
                {"text": "finished"},
            ]
        }
    ]
}


class CountingTool:
    """``mcp__srv__act``: counts its calls; the first blocks until cancelled."""

    def __init__(self, idempotent: bool, calls: list[str], block: bool) -> None:
        self.spec = ToolSpec.from_schema("mcp__srv__act", "acts", {"type": "object"})
        self.idempotent = idempotent
        self.calls = calls
        self.block = block

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        self.calls.append("call")
        if self.block:
            await trio.sleep_forever()
        return ToolOutput.ok("acted")


@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_call_in_flight_at_a_stop_is_interrupted_unless_idempotent(
    tmp_path: Path, idempotent: bool
) -> None:
    calls: list[str] = []
    provider = ScriptedProvider(SCRIPT)
    async with open_runtime(tmp_path, provider) as runtime:
        runtime.tools = ToolSet([CountingTool(idempotent, calls, block=True)])
        root = await runtime.start("go", cwd=tmp_path)
        with trio.fail_after(30):
            while not calls:
                await trio.sleep(0.01)
        assert isinstance(runtime.state(root).phase, ToolExecuting)
    # The runtime stopped with the call in flight (as after a crash: no result logged).
    async with open_runtime(tmp_path, ScriptedProvider(SCRIPT)) as runtime:
        runtime.tools = ToolSet([CountingTool(idempotent, calls, block=False)])
        await runtime.resume()
        await runtime.wait(root)
        results = [
            message.result
            for message in runtime.state(root).history
            if isinstance(message, ToolResultMessage)
        ]
    assert len(results) == 1
    if idempotent:
        assert calls == ["call", "call"]
        assert (results[0].content, results[0].is_error) == ("acted", False)
    else:
        assert calls == ["call"]
        assert results[0].is_error and results[0].content.startswith("interrupted:")
