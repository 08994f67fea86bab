"""A log whose tree waits for people, for the web page's tests (issue 35): the root
delegated three tasks; root/1's first call was approved with edited arguments (by
"alice", through Python) and its second waits, root/2's call waits, root/3 asks a
question. No runtime holds the tree when the tests read it."""

from __future__ import annotations

from pathlib import Path

import trio
from runtime_helpers import open_runtime, reply, script, spawn

from fanfold.runtime import Runtime
from fanfold.runtime.approvals import PendingRequest
from fanfold.tools.ask_user import AskUserTool
from fanfold.tools.registry import ToolSet

HOSTILE_ARGUMENT = "echo '<img src=x onerror=alert(1)>'"
QUESTION = "Which <b>branch</b>?"


async def _pending(runtime: Runtime, count: int) -> list[PendingRequest]:
    with trio.fail_after(30):
        while len(runtime.pending()) < count:
            await trio.sleep(0.02)
    return sorted(runtime.pending(), key=lambda r: r.path)


async def _waiting_log(folder: Path) -> tuple[Path, str]:
    provider = script(
        0.0,
        root=[reply("", spawn("one", "two", "three")), reply("done")],
        c1=[
            reply("", ("bash", {"command": "echo zero"}), ("bash", {"command": "echo one"})),
            reply("", submit_call("one done")),
        ],
        c2=[reply("", ("bash", {"command": HOSTILE_ARGUMENT})), reply("", submit_call("two"))],
        c3=[
            reply(
                "", ("ask_user", {"question": "Which <b>branch</b>?", "choices": ["main", "dev"]})
            ),
            reply("", submit_call("three")),
        ],
    )
    async with open_runtime(folder, provider) as runtime:
        runtime.tools = ToolSet.default(extra=[AskUserTool()])
        root = await runtime.start("go", cwd=folder, ask=["bash"])
        first = next(r for r in await _pending(runtime, 3) if r.path == "root/1")
        await runtime.approve(first, {"command": "echo edited"}, by="alice")
        with trio.fail_after(30):
            while not any(r.path == "root/1" and r.call != first.call for r in runtime.pending()):
                await trio.sleep(0.02)
        await _pending(runtime, 3)
    return folder / "log.db", root


def submit_call(result: str) -> tuple[str, dict[str, str]]:
    return ("submit_result", {"result": result})


def waiting_log(folder: Path) -> tuple[Path, str]:
    """The log (``folder/log.db``) and its root's id; run in a fresh Trio loop."""
    return trio.run(_waiting_log, folder)
