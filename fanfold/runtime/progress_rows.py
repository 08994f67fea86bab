"""The latest progress of a runtime's tool calls, copied into the log's side table
``tool_progress`` for the trace page (``fanfold ui``, ``fanfold trace``), which reads
the log in another process and cannot see ``fanfold.tools.progress.BOARD``.

What is written, and when:

- Only calls of conversations this runtime has loaded (``owns``): the board is the
  process's, and another runtime of the process writes its own calls to its own log.
- A call's row holds its latest report only (``ToolProgress.describe()``, the count of
  reports, the time), replaced by the next; it is deleted when the call ends (the
  board forgets it: ``ProgressBoard.done``), and when the board made room for another
  call's report (it keeps at most ``MAX_CALLS``). So the table holds at most
  ``MAX_CALLS`` rows of this runtime's at once.
- Rate-limited: the reports that came in are written together, in one transaction
  on a worker thread, then nothing more is written for ``WRITE_INTERVAL`` seconds. A
  server sending 100,000 notifications a second costs two small transactions a
  second, whatever the number of calls.
- A runtime that closes deletes the rows it wrote (its calls are interrupted: there
  is no progress left to show). A runtime killed leaves its rows: the trace page shows
  progress only for a call whose ``RunTool`` has no result in the log, and only a
  report made after that call (re)started (``at``), so a stale row is never shown for
  a call that ended, nor for the same call re-issued by ``resume``.
- A write that fails (a disk full, a lost PostgreSQL connection) is logged once and
  recording stops for this runtime: progress is a view, never a reason to stop a run.

The table is no part of the log's facts: no event, no fingerprint, not read by
replay, verify or export.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from fanfold.db import DatabaseError, Store, ToolProgressRow
from fanfold.tools.progress import BOARD, ProgressBoard

__all__ = ["WRITE_INTERVAL", "ProgressRows"]

WRITE_INTERVAL = 0.5
"""Seconds between two writes of progress rows (at most two a second, all calls in one
transaction)."""


class ProgressRows:
    """Copies ``board``'s reports of the calls ``owns`` accepts into ``store``'s
    ``tool_progress`` table. Made in the runtime's Trio run, it watches the board at
    once; its writing task is started with ``start_soon`` when a report comes and ends
    when nothing is left to write (a runtime whose tools report nothing holds no task
    for it). ``close()`` before the store closes."""

    def __init__(
        self,
        store: Store,
        owns: Callable[[str], bool],
        logger: Any,
        clock: Callable[[], float],
        start_soon: Callable[[Callable[[], Awaitable[None]]], None],
        *,
        board: ProgressBoard = BOARD,
        interval: float = WRITE_INTERVAL,
    ) -> None:
        self._start_soon = start_soon
        self._store = store
        self._owns = owns
        self._logger = logger
        self._clock = clock
        self._board = board
        self._interval = interval
        self._dirty: set[tuple[str, int]] = set()  # changed since the last write
        self._written: set[tuple[str, int]] = set()  # rows in the table now
        self._token = trio.lowlevel.current_trio_token()  # the runtime's Trio run
        self._writing = False  # the writing task runs
        self._stopped = False
        self.writes = 0
        """Transactions written so far."""
        board.watch(self.changed)

    def changed(self, key: tuple[str, int]) -> None:
        """The board's watcher: ``key``'s latest report changed or went. Called by
        whoever reports, on any thread."""
        # Another runtime's call (maybe on another thread's Trio run): not ours to
        # write, and this runtime's Trio primitives are not touched for it.
        if self._stopped or not self._owns(key[0]):
            return
        try:
            here = trio.lowlevel.current_trio_token() is self._token
        except RuntimeError:  # not in a Trio run: a thread of a tool's own
            here = False
        if here:
            self._mark(key)
        else:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._mark, key)

    def _mark(self, key: tuple[str, int]) -> None:
        if self._stopped:
            return
        self._dirty.add(key)
        if not self._writing:
            self._writing = True
            self._start_soon(self._run)

    async def _run(self) -> None:
        """Write what changed, then wait ``interval`` (reports coming meanwhile wait
        in ``_dirty``: the rate limit), until nothing is left to write."""
        try:
            while self._dirty and not self._stopped:
                await self._write()
                await trio.sleep(self._interval)
        finally:
            self._writing = False

    async def _write(self) -> None:
        dirty, self._dirty = self._dirty, set()
        rows: list[ToolProgressRow] = []
        ended: list[tuple[str, int]] = []
        now = self._clock()
        for key in sorted(dirty):
            latest = self._board.get(*key)
            if latest is not None:
                rows.append(ToolProgressRow(key[0], key[1], latest.describe(), latest.count, now))
            elif key in self._written:
                ended.append(key)
        if not rows and not ended:
            return
        try:
            await trio.to_thread.run_sync(self._store.write_progress, rows, ended)
        except (DatabaseError, sqlite3.Error) as exc:
            self._stop(exc)
            return
        self.writes += 1
        self._written.difference_update(ended)
        self._written.update((r.conversation_id, r.call) for r in rows)

    def _stop(self, exc: BaseException) -> None:
        self._stopped = True
        self._board.unwatch(self.changed)
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        self._logger.warning("tool_progress_not_recorded", error=first)

    def close(self) -> None:
        """Delete the rows still written (the runtime closes: its calls are
        interrupted) and stop watching; the store must still be open."""
        self._board.unwatch(self.changed)
        written, self._written = sorted(self._written), set()
        if written and not self._stopped:
            try:
                self._store.write_progress((), written)
            except (DatabaseError, sqlite3.Error) as exc:
                self._stop(exc)
        self._stopped = True
