"""MCP progress on the trace page (issue 33, item 8): the runtime copies the latest
progress report of each of its tool calls in flight into the log's side table
``tool_progress`` (rate-limited, bounded, deleted when the call ends), and the trace
page (``fanfold ui``, ``fanfold trace``) shows it on a running call's mark, and nothing
for a call that ended. The table is no part of the log's facts: verify never reads it.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from runtime_helpers import reply

from fanfold.db import Store, ToolProgressRow, open_store
from fanfold.providers.scripted import ScriptedProvider
from fanfold.replay.verify import verify
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.runtime.progress_rows import WRITE_INTERVAL, ProgressRows
from fanfold.tools.progress import ProgressBoard
from fanfold.tools.registry import ToolSet
from fanfold.trace import build_trace, render_html
from fanfold.trace.build import _with_progress

SERVER = Path(__file__).with_name("mcp_notify_server.py")


class _Lines:
    """A logger that keeps what it is given (``level``, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        def log(event: str, **fields: Any) -> None:
            self.lines.append((level, event, fields))

        return log


def test_progress_rows_are_replaced_forgotten_and_read_by_conversation(log_target: str) -> None:
    """``Store.write_progress``/``progress_of`` on SQLite and PostgreSQL alike: a row per
    call, replaced by the next, deleted when the call ends, read back by conversation
    (a read-only open too)."""
    with open_store(log_target) as store:
        store.write_progress(
            [ToolProgressRow("c1", 1, "1/5", 1, 10.0), ToolProgressRow("c2", 4, "50%", 3, 11.0)]
        )
        store.write_progress([ToolProgressRow("c1", 1, "2/5, <b>x</b>", 2, 12.0)])
        assert store.progress_of(["c1"]) == {
            ("c1", 1): ToolProgressRow("c1", 1, "2/5, <b>x</b>", 2, 12.0)
        }
        store.write_progress([], [("c2", 4)])
        assert store.progress_of(["c1", "c2", "c3"]) == {
            ("c1", 1): ToolProgressRow("c1", 1, "2/5, <b>x</b>", 2, 12.0)
        }
    with open_store(log_target, read_only=True) as store:
        assert list(store.progress_of(["c1"])) == [("c1", 1)]
        assert store.progress_of([]) == {}


def test_a_log_older_than_the_progress_table_reads_as_no_progress(tmp_path: Path) -> None:
    """A read-only open of a log written before migration 6 (no table) shows no
    progress rather than failing; a read-write open adds the table."""
    db = tmp_path / "old.db"
    Store.open(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE tool_progress")
        conn.execute("DELETE FROM migrations WHERE version = 6")
    with Store.open(db, read_only=True) as store:
        assert store.progress_of(["c1"]) == {}
    with Store.open(db) as store:
        store.write_progress([ToolProgressRow("c1", 1, "1", 1, 1.0)])
        assert len(store.progress_of(["c1"])) == 1


async def test_progress_rows_follow_the_board_bounded_rate_limited_and_owned() -> None:
    """``ProgressRows`` over a real store: the latest report of each owned call, at most
    one write per interval however many reports, at most the board's limit of rows
    (a call the board dropped is deleted), another runtime's calls never, a call that
    ended deleted, everything deleted at close; its writing task ends when nothing is
    left to write; a store that fails stops it, logged."""
    store = Store.memory()
    board = ProgressBoard(limit=3)
    lines = _Lines()
    owned = {"a", "b", "c", "d", "e"}
    writes: list[float] = []
    write = store.write_progress

    def counted(*args: Any) -> None:
        writes.append(time.monotonic())
        write(*args)

    store.write_progress = counted  # type: ignore[method-assign,assignment]

    async def settle() -> None:
        await trio.sleep(0.35)  # past the interval: what is dirty is written

    async with trio.open_nursery() as nursery:
        rows = ProgressRows(
            store,
            owned.__contains__,
            lines,
            time.time,
            nursery.start_soon,
            board=board,
            interval=0.1,
        )
        assert not nursery.child_tasks  # no task until a report comes
        started = time.monotonic()
        for i in range(500):
            board.report(("a", 1), i + 1, 500, f"step {i + 1}")
            board.report(("other", 1), i, None, None)  # not this runtime's
            if i % 50 == 0:
                await trio.sleep(0.01)
        await settle()
        took = time.monotonic() - started
        ((key, row),) = store.progress_of(["a", "other"]).items()
        assert key == ("a", 1) and (row.text, row.reports) == ("500/500, step 500", 500)
        # 500 reports over `took` seconds: one write, then one per interval at most.
        assert 1 <= len(writes) <= 1 + took / 0.1
        for name in "bcde":  # five calls on a board of three: the oldest go
            board.report((name, 2), 1, None, name)
        await settle()
        assert sorted(store.progress_of(list(owned))) == [("c", 2), ("d", 2), ("e", 2)]
        board.done(("e", 2))
        await settle()
        assert sorted(store.progress_of(list(owned))) == [("c", 2), ("d", 2)]
        assert not nursery.child_tasks  # all written: its task ended
        rows.close()
        assert store.progress_of(list(owned)) == {}
        nursery.cancel_scope.cancel()
    # A store that fails: one warning, no exception, nothing more tried.
    store.close()
    async with trio.open_nursery() as nursery:
        ProgressRows(
            store,
            owned.__contains__,
            lines,
            time.time,
            nursery.start_soon,
            board=board,
            interval=0.01,
        )
        board.report(("a", 3), 1, None, None)
        await trio.sleep(0.1)
        board.report(("a", 3), 2, None, None)
        await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    warned = [f for _, event, f in lines.lines if event == "tool_progress_not_recorded"]
    assert len(warned) == 1 and "closed" in warned[0]["error"]


def test_a_report_shows_only_on_a_call_in_flight_and_made_since_it_started() -> None:
    """The page's rule: an open tool mark with a report made since it (re)started gets
    it; an ended call, a model call, or a report older than the mark (a row a killed
    runtime left, the call issued again by resume) gets none."""
    row = ToolProgressRow("c", 3, "2/5, step 2", 2, 100.0)
    progress = {("c", 3): row}
    marks = [
        {"k": "tool", "call": 3, "t0": 90.0, "t1": 120.0, "open": True},
        {"k": "tool", "call": 3, "t0": 101.0, "t1": 120.0, "open": True},  # re-issued later
        {"k": "tool", "call": 3, "t0": 90.0, "t1": 95.0},  # ended
        {"k": "model", "call": 3, "t0": 90.0, "t1": 120.0, "open": True},
    ]
    shown = list(_with_progress(iter(marks), "c", progress))
    assert shown[0]["progress"] == "2/5, step 2" and shown[0]["progress_reports"] == 2
    assert ["progress" in m for m in shown] == [True, False, False, False]
    assert list(_with_progress(iter(marks[:1]), "other", progress)) == marks[:1]


@pytest.mark.slow
async def test_the_trace_shows_a_running_mcp_calls_latest_progress_and_none_once_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real server process (over stdio) whose ``slow`` tool sends 300 progress
    notifications with markup in the message, then waits. While it waits, the trace of
    the log (read-only, as ``fanfold ui`` and ``fanfold trace`` read it) shows the
    latest report on the call's mark; the exported page carries the text escaped;
    the rows were written a few times, not 300. Once the call ended, the mark shows
    none and the row is gone; the tree verifies (the table is no fact of the log)."""
    pytest.importorskip("mcp")
    from fanfold.mcp.config import ServerDeclaration
    from fanfold.serve.ui_server import TraceServer

    writes: list[float] = []
    write = Store.write_progress

    def counted(self: Store, *args: Any) -> None:
        writes.append(time.monotonic())
        write(self, *args)

    monkeypatch.setattr(Store, "write_progress", counted)
    server = ServerDeclaration(
        "notes",
        "test",
        command=sys.executable,
        args=(str(SERVER), str(tmp_path)),
        env=(("PROGRESS", "300"),),
    )
    provider = ScriptedProvider(
        {
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [reply("", ("mcp__notes__slow", {})), reply("done")],
                }
            ]
        }
    )
    db = tmp_path / "log.db"
    ui = TraceServer(db, token="t" * 32)

    def trace(root: str) -> dict[str, Any]:
        with Store.open(db, read_only=True) as store:
            return build_trace(store, root)

    def rows(root: str) -> int:
        with Store.open(db, read_only=True) as store:
            return len(store.progress_of([root]))

    def tool_mark(data: dict[str, Any]) -> dict[str, Any]:
        marks = [m for m in data["agents"][0]["marks"] if m["k"] == "tool"]
        assert len(marks) <= 1
        return marks[0] if marks else {}

    async with Runtime.open(
        db, provider, ToolSet.default(), logger=quiet_logger(), mcp_servers=[server]
    ) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        version = await trio.to_thread.run_sync(ui._version, root)
        with trio.fail_after(30):
            while True:
                data = await trio.to_thread.run_sync(trace, root)
                if tool_mark(data).get("progress", "").startswith("300/300"):
                    break
                await trio.sleep(0.05)
        mark = tool_mark(data)
        assert mark["open"] and mark["progress_reports"] == 300
        assert mark["progress"] == "300/300, <img src=x onerror=alert(1)> step 300"
        assert (tmp_path / "reported").exists()
        # `fanfold ui` follows it: the tree's version changed with its progress alone.
        assert await trio.to_thread.run_sync(ui._version, root) != version
        # The exported page: the server's text is data, never markup.
        page = render_html(data)
        assert "onerror" in page and "<img" not in page
        assert "\\u003cimg src=x onerror=alert(1)\\u003e step 300" in page
        # 300 reports, written at most once per interval (plus the first).
        assert 1 <= len(writes) <= 2 + (writes[-1] - writes[0]) / WRITE_INTERVAL
        (tmp_path / "release").touch()
        assert (await runtime.wait(root)).text == "done"
        # Ended: the page shows none at once (whatever the table holds), and the
        # runtime deletes the row within an interval.
        assert "progress" not in tool_mark(await trio.to_thread.run_sync(trace, root))
        with trio.fail_after(10):
            while await trio.to_thread.run_sync(rows, root):
                await trio.sleep(0.05)
    with Store.open(db) as store:
        # A row a killed runtime would have left for the ended call: never shown.
        store.write_progress([ToolProgressRow(root, mark["call"], "9/9", 9, time.time())])
        assert all("progress" not in m for m in build_trace(store, root)["agents"][0]["marks"])
        assert verify(store, root, tree=True).ok
