"""Running asyncio coroutines from Trio: the loop thread behind asyncio function tools.

fanfold runs on Trio; an ``async def`` tool written against asyncio (``asyncio.sleep``,
``asyncio.gather``, aiohttp, asyncpg...) fails there at its first await with
"RuntimeError: no running event loop". Such a tool's coroutine runs instead on one
asyncio event loop, in one daemon thread that the first asyncio call starts and every
asyncio tool of the process shares (``asyncio.run_coroutine_threadsafe``). One shared,
long-lived loop, not one per call, because asyncio objects are bound to the loop that
made them: a tool module that keeps an ``aiohttp.ClientSession`` or a connection pool
between calls works only if every call runs on the same loop.

Cancellation crosses over: when the Trio call is cancelled (``fanfold cancel``, a tool
timeout, the runtime closing), the asyncio task is cancelled, so the coroutine sees
``asyncio.CancelledError`` at its current await, as it would under ``asyncio.timeout``.
The Trio side then waits, shielded, up to :data:`CANCEL_GRACE` seconds for the task to
finish its ``except``/``finally`` blocks, then lets go (a coroutine that swallows the
cancellation and goes on is abandoned, like a sync tool's thread). See DESIGN.md,
"Tools from outside".
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any

import trio

CANCEL_GRACE = 5.0
"""Seconds a cancelled Trio call waits for its asyncio task to end before letting go."""

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def asyncio_loop() -> asyncio.AbstractEventLoop:
    """The shared asyncio loop, started in its daemon thread on first use."""
    global _loop, _thread
    with _lock:
        if _loop is not None and _thread is not None and _thread.is_alive():
            return _loop
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            loop.run_forever()

        thread = threading.Thread(target=serve, name="fanfold-asyncio", daemon=True)
        thread.start()
        started.wait()
        _loop, _thread = loop, thread
        return loop


def _stop() -> None:
    """At exit: cancel what still runs on the loop and stop it, so no task is left
    pending when the interpreter tears down (a bounded wait: a thread stuck in a
    blocking call is left to die with the process)."""
    with _lock:
        loop, thread = _loop, _thread
    if loop is None or thread is None or not thread.is_alive():
        return

    async def cancel_all() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    with contextlib.suppress(Exception):  # best effort at exit
        asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout=2)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=2)


atexit.register(_stop)


async def run_on_asyncio(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coroutine`` on the shared asyncio loop and return its result (or raise
    its exception); a Trio cancellation cancels its asyncio task (module docstring)."""
    loop = asyncio_loop()
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    # The task, once the loop made it: only the loop's thread writes it, before the
    # cancel it may run (call_soon_threadsafe keeps the order), and Trio reads it
    # after ``done``.
    holder: list[asyncio.Task[Any]] = []

    def finished(_: asyncio.Task[Any]) -> None:
        # The Trio run may be gone: then nobody waits any more.
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    def start() -> None:
        task = loop.create_task(coroutine)
        task.add_done_callback(finished)
        holder.append(task)

    def cancel() -> None:
        for task in holder:
            task.cancel()

    # A task's own done callback, not run_coroutine_threadsafe's future: that future
    # says "done" the moment it is cancelled, before the coroutine has even seen its
    # CancelledError, and the grace below would wait for nothing.
    loop.call_soon_threadsafe(start)
    try:
        await done.wait()
    except trio.Cancelled:
        loop.call_soon_threadsafe(cancel)
        with trio.move_on_after(CANCEL_GRACE) as grace:
            grace.shield = True
            await done.wait()
        raise
    (task,) = holder
    if task.cancelled():  # by the coroutine itself, or by the loop's shutdown at exit
        raise RuntimeError("its asyncio task was cancelled")
    return task.result()
