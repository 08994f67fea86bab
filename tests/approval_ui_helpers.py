"""A log whose tree waits for people, for the web page's tests (issue 35): the root
delegated three tasks; root/1's first call was approved with edited arguments (by
"alice", through Python) and its second waits, root/2's call waits, root/3 asks a
question. No runtime holds the tree when the tests read it."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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


def _provider() -> object:
    return script(
        0.0,
        root=[reply("", spawn("one", "two", "three")), reply("done")],
        c1=[
            reply("", ("bash", {"command": "echo zero"}), ("bash", {"command": "echo one"})),
            reply("", submit_call("one done")),
        ],
        c2=[reply("", ("bash", {"command": HOSTILE_ARGUMENT})), reply("", submit_call("two"))],
        c3=[
            reply("", ("ask_user", {"question": QUESTION, "choices": ["main", "dev"]})),
            reply("", submit_call("three")),
        ],
    )


async def _waiting_tree(runtime: Runtime, folder: Path) -> str:
    runtime.tools = ToolSet.default(extra=[AskUserTool()])
    root = await runtime.start("go", cwd=folder, ask=["bash"])
    first = next(r for r in await _pending(runtime, 3) if r.path == "root/1")
    await runtime.approve(first, {"command": "echo edited"}, by="alice")
    with trio.fail_after(30):
        while not any(r.path == "root/1" and r.call != first.call for r in runtime.pending()):
            await trio.sleep(0.02)
    await _pending(runtime, 3)
    return root


async def _waiting_log(folder: Path) -> tuple[Path, str]:
    async with open_runtime(folder, _provider()) as runtime:
        root = await _waiting_tree(runtime, folder)
    return folder / "log.db", root


@contextmanager
def held_waiting_log(folder: Path) -> Iterator[tuple[Path, str]]:
    """The same tree, held by a runtime running in a thread (as a `fanfold run` in
    another terminal holds it) until the block ends: decisions written to the log's
    table are taken within its poll, and the tree goes on."""
    ready: queue.Queue[tuple[str, trio.lowlevel.TrioToken, trio.Event]] = queue.Queue()
    failed: list[BaseException] = []

    async def hold() -> None:
        async with open_runtime(folder, _provider()) as runtime:
            root = await _waiting_tree(runtime, folder)
            stop = trio.Event()
            ready.put((root, trio.lowlevel.current_trio_token(), stop))
            await stop.wait()

    def main() -> None:
        try:
            trio.run(hold)
        except BaseException as exc:  # reported by the waiting test
            failed.append(exc)
            ready.put(("", None, None))  # type: ignore[arg-type]

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    root, token, stop = ready.get(timeout=60)
    if failed:
        raise failed[0]
    try:
        yield folder / "log.db", root
    finally:
        trio.from_thread.run_sync(stop.set, trio_token=token)
        thread.join(timeout=30)


def submit_call(result: str) -> tuple[str, dict[str, str]]:
    return ("submit_result", {"result": result})


def waiting_log(folder: Path) -> tuple[Path, str]:
    """The log (``folder/log.db``) and its root's id; run in a fresh Trio loop."""
    return trio.run(_waiting_log, folder)
