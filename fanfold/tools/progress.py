"""Progress that tools report while they run (MCP's ``notifications/progress``), for
the live view: the latest report of each call in flight, nothing else.

A report is about one tool call of one conversation: the runtime sets ``CURRENT_CALL``
(conversation id, call number) around the call, so a tool that learns of progress (an
MCP server's notification, on the call's own task) knows whose it is. ``BOARD`` keeps
the latest report per call in flight, overwritten by the next and dropped when the
call ends; it holds at most ``MAX_CALLS`` calls (the oldest report goes first), so a
server sending 100,000 notifications costs a dictionary store each and no memory
that grows. Nothing here reaches the event log or the model's context: progress is a
view of a moment, and the call's result is the record. A runtime watches the board
(``watch``) and copies its own calls' latest reports into the log's side table
``tool_progress``, rate-limited, for the trace page (``fanfold.runtime.progress_rows``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextvars import ContextVar

import attrs

__all__ = ["BOARD", "CURRENT_CALL", "MAX_CALLS", "ProgressBoard", "ToolProgress"]

CURRENT_CALL: ContextVar[tuple[str, int] | None] = ContextVar("fanfold_tool_call", default=None)
"""(conversation id, call number) of the tool call running on this task, if any."""

MAX_CALLS = 1024
"""Calls whose latest report ``ProgressBoard`` keeps at once."""

MAX_MESSAGE = 200
"""Characters of a report's message kept."""


@attrs.frozen
class ToolProgress:
    """One report: ``progress`` so far, of ``total`` if known, and a short message."""

    progress: float
    total: float | None = None
    message: str | None = None
    count: int = 1
    """Reports received for this call so far."""

    def describe(self) -> str:
        """``3/5, step 3`` (or ``3``, or ``60%``): what the live view shows."""
        done = _number(self.progress)
        if self.total is not None and self.total > 0:
            text = f"{done}%" if self.total == 100 else f"{done}/{_number(self.total)}"
        else:
            text = done
        if self.message:
            text += f", {self.message}"
        return text


def _number(value: float) -> str:
    if not math.isfinite(value):
        return "?"
    return str(int(value)) if value == int(value) else f"{value:.3g}"


class ProgressBoard:
    """The latest ``ToolProgress`` per call in flight (bounded by ``MAX_CALLS``)."""

    def __init__(self, limit: int = MAX_CALLS) -> None:
        self._latest: dict[tuple[str, int], ToolProgress] = {}
        self._limit = limit
        self._watchers: list[Callable[[tuple[str, int]], None]] = []

    def watch(self, watcher: Callable[[tuple[str, int]], None]) -> None:
        """Call ``watcher(key)`` whenever a call's latest report changes or goes (it
        ended, or made room for another's): it reads ``get`` for what is there now."""
        self._watchers.append(watcher)

    def unwatch(self, watcher: Callable[[tuple[str, int]], None]) -> None:
        """Stop calling ``watcher`` (nothing if it was not watching)."""
        if watcher in self._watchers:
            self._watchers.remove(watcher)

    def _changed(self, key: tuple[str, int]) -> None:
        for watcher in tuple(self._watchers):
            watcher(key)

    def report(
        self, key: tuple[str, int], progress: float, total: float | None, message: str | None
    ) -> None:
        """Keep this report as ``key``'s latest (replacing the one before)."""
        before = self._latest.pop(key, None)
        if before is None and len(self._latest) >= self._limit:
            # The oldest call's report goes (dicts keep insertion order; a report
            # re-inserts its call at the end).
            oldest = next(iter(self._latest))
            self._latest.pop(oldest)
            self._changed(oldest)
        text = None if message is None else " ".join(str(message).split())[:MAX_MESSAGE]
        count = 1 if before is None else before.count + 1
        self._latest[key] = ToolProgress(progress, total, text or None, count)
        self._changed(key)

    def get(self, conversation_id: str, call: int) -> ToolProgress | None:
        """The latest report of that call, if it is in flight and reported any."""
        return self._latest.get((conversation_id, call))

    def done(self, key: tuple[str, int]) -> None:
        """The call ended: its reports go."""
        if self._latest.pop(key, None) is not None:
            self._changed(key)

    def __len__(self) -> int:
        return len(self._latest)


BOARD = ProgressBoard()
"""The process's board: MCP calls report into it, ``fanfold run``'s live view reads it."""
