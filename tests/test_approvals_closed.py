"""Issue 35: a decision that comes just as its request is closed (a cancel, a
timeout) ends in a definite recorded state, ``stale: the request was closed before
your decision: WHY``, and whoever decided is told so (the runtime's API, ``fanfold
approve`` with a non-zero status, the web page's POST). Before, such a row stayed
``new`` for ever and the CLI said "approved".

Both orders of the race, deterministically, on a real SQLite file: the row written
and then the cancel committed before the runtime's next read of the table (the
runtime that closes the request marks the row); the cancel committed and then the
row written (its writer finds the request closed and marks it)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner
from runtime_helpers import open_runtime, reply, script

import fanfold.cli.approvals as cli_approvals
import fanfold.serve.ui_server as trace_server
from fanfold.cli import cli
from fanfold.db import Store
from fanfold.runtime import Runtime
from fanfold.runtime.approvals import (
    CLOSED_BEFORE,
    Decision,
    FileDecisions,
    PendingRequest,
    RequestClosed,
    settle,
)
from fanfold.serve.ui_server import DecisionRefused, TraceServer

CANCELLED = "cancelled: the conversation was cancelled while this call waited"
UI_TOKEN = "t" * 32


def _provider() -> Any:
    return script(0.0, root=[reply("", ("bash", {"command": "echo x"})), reply("done")])


async def _request(runtime: Runtime) -> PendingRequest:
    with trio.fail_after(20):
        while not runtime.pending():
            await trio.sleep(0.01)
    return runtime.pending()[0]


def _state(db: Path, request: str) -> str | None:
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT state FROM decisions WHERE request = ?", (request,)).fetchone()
    return None if row is None else str(row[0])


async def test_a_row_written_before_the_cancel_is_marked_stale_by_the_runtime(
    tmp_path: Path,
) -> None:
    db = tmp_path / "log.db"
    async with open_runtime(tmp_path, _provider()) as runtime:
        # The table is read once when the request opens, then not for an hour: the
        # row below is never read before the cancel (the race, made certain).
        runtime.decision_poll = 3600.0
        root = await runtime.start("go", cwd=tmp_path, ask=["bash"])
        request = await _request(runtime)
        FileDecisions(db).write(Decision(request.id, "grant", None, "", "cli:someone", 0.0))
        await runtime.cancel(root)
        await runtime.wait(root)
        with trio.fail_after(20):
            while _state(db, request.id) == "new":
                await trio.sleep(0.01)
        mark = _state(db, request.id)
        assert mark is not None and mark.startswith(f"stale: {CLOSED_BEFORE}{CANCELLED}")
        # The Python API tells the truth too.
        with pytest.raises(RequestClosed, match=f"^{CLOSED_BEFORE}{CANCELLED}"):
            await runtime.approve(request)
        # Nothing ran.
        with Store.open(db, read_only=True) as store:
            assert settle(store, FileDecisions(db), request) == mark


async def _cancelled_after_a_look(tmp_path: Path) -> tuple[list[Any], PendingRequest]:
    """A tree whose request was open when ``fanfold approve`` looked (the look is
    returned) and then cancelled before it wrote its row."""
    async with open_runtime(tmp_path, _provider()) as runtime:
        root = await runtime.start("go", cwd=tmp_path, ask=["bash"])
        request = await _request(runtime)
        look = await trio.to_thread.run_sync(cli_approvals.open_requests, tmp_path / "log.db")
        await runtime.cancel(root)
        await runtime.wait(root)
    return look, request


def test_fanfold_approve_after_the_cancel_says_so_and_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "log.db"
    look, request = trio.run(_cancelled_after_a_look, tmp_path)
    assert [r.id for r, _ in look] == [request.id]
    # ``approve`` sees the log as it was before the cancel, and writes after it.
    monkeypatch.setattr(cli_approvals, "open_requests", lambda path: look)
    result = CliRunner().invoke(cli, ["approve", request.id, "--db", str(db)])
    assert result.exit_code == 2, result.output
    assert "approved" not in result.output
    assert f"{request.id}: {CLOSED_BEFORE}{CANCELLED}" in " ".join(result.output.split())
    mark = _state(db, request.id)
    assert mark is not None and mark.startswith(f"stale: {CLOSED_BEFORE}{CANCELLED}")


def test_the_web_page_is_told_when_the_cancel_comes_between_its_look_and_its_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "log.db"

    async def waiting() -> tuple[str, PendingRequest]:
        async with open_runtime(tmp_path, _provider()) as runtime:
            root = await runtime.start("go", cwd=tmp_path, ask=["bash"])
            return root, await _request(runtime)

    root, request = trio.run(waiting)

    async def cancel() -> None:
        async with open_runtime(tmp_path, _provider()) as runtime:
            await runtime.resume([root])
            await runtime.cancel(root)
            await runtime.wait(root)

    class CancelFirst(FileDecisions):
        def write(self, decision: Decision) -> None:
            trio.run(cancel)  # another process's cancel, committed between look and write
            super().write(decision)

    monkeypatch.setattr(trace_server, "FileDecisions", CancelFirst)
    server = TraceServer(db, token=UI_TOKEN)
    with pytest.raises(DecisionRefused) as refused:
        server._decide("grant", {"request": request.id})
    assert refused.value.status == 409
    assert str(refused.value).startswith(f"{CLOSED_BEFORE}{CANCELLED}")
    mark = _state(db, request.id)
    assert mark is not None and mark.startswith(f"stale: {CLOSED_BEFORE}{CANCELLED}")


async def test_a_decision_applied_but_not_yet_marked_is_not_called_stale(tmp_path: Path) -> None:
    """Between the decision's event's commit and the runtime's mark, the request is
    closed and the row still new: ``settle`` finds the event and says applied."""
    db = tmp_path / "log.db"
    async with open_runtime(tmp_path, _provider()) as runtime:
        root = await runtime.start("go", cwd=tmp_path, ask=["bash"])
        request = await _request(runtime)
        await runtime.approve(request)
        await runtime.wait(root)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE decisions SET state = 'new' WHERE request = ?", (request.id,))
    with Store.open(db, read_only=True) as store:
        assert settle(store, FileDecisions(db), request) == "applied"
    assert _state(db, request.id) == "new"  # left for the runtime's own mark
