"""``fanfold ui`` over loopback: Hypercorn's Trio worker serving the list, the trace
pages, their JSON, and server-sent events as a database changes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from db_scenarios import Driver, fan_out
from trace_helpers import HOSTILE, MARKS_SCRIPT, run_script

from fanfold.db import Store
from fanfold.trace.server import TraceServer, serve

pytest.importorskip("hypercorn", reason="fanfold ui needs the ui extra: pip install -e '.[ui]'")


@pytest.fixture
def marks_log(tmp_path: Path) -> tuple[Path, str]:
    # A sync fixture: `fanfold run` starts its own Trio loop, outside the test's.
    return run_script(tmp_path, MARKS_SCRIPT)


@pytest.fixture
async def server(marks_log: tuple[Path, str]) -> AsyncIterator[tuple[str, Path, str]]:
    db, root = marks_log
    async with trio.open_nursery() as nursery:
        (bind,) = await nursery.start(serve, TraceServer(db, poll=0.05), "127.0.0.1", 0)
        assert bind.startswith("http://127.0.0.1:")
        yield bind, db, root
        nursery.cancel_scope.cancel()


async def test_lists_trees_and_serves_their_pages(server: tuple[str, Path, str]) -> None:
    base, _, root = server
    async with httpx.AsyncClient(base_url=base) as client:
        trees = (await client.get("/api/trees")).json()
        assert [t["id"] for t in trees] == [root]
        assert trees[0]["agents"] == 4 and trees[0]["status"] == "idle"
        listing = await client.get("/")
        assert listing.status_code == 200
        assert listing.headers["x-content-type-options"] == "nosniff"
        assert "connect-src 'self'" in listing.text
        page = await client.get(f"/trace/{root}")
        assert page.status_code == 200 and page.text.startswith("<!doctype html>")
        assert "<img" not in page.text  # the hostile reply is escaped data here too
        assert f'"events":"/events/{root}"' in page.text
        data = (await client.get(f"/api/trace/{root}")).json()
        assert data["agents"][0]["outcome"]["text"] == "final " + HOSTILE
        missing = await client.get("/trace/nope%3Cscript%3E")
        assert missing.status_code == 404
        assert missing.headers["content-type"].startswith("text/plain")
        assert (await client.get("/elsewhere")).status_code == 404
        assert (await client.post("/api/trees")).status_code == 405


async def watching(lines: AsyncIterator[str]) -> None:
    """Wait for the stream's first comment: the server has read the version to compare."""
    with trio.fail_after(10):
        async for line in lines:
            if line == ": watching":
                return
    raise AssertionError("the stream ended")


async def next_event(lines: AsyncIterator[str]) -> str:
    with trio.fail_after(10):
        async for line in lines:
            if line.startswith("event: "):
                return line.removeprefix("event: ")
    raise AssertionError("the stream ended")


async def test_server_sent_events_follow_a_growing_tree(tmp_path: Path) -> None:
    driver = Driver()
    fan_out(driver)
    steps = driver.steps
    half = len(steps) // 2
    db = tmp_path / "live.db"
    with Store.open(db) as store:
        store.append(steps[:half])
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(serve, TraceServer(db, poll=0.05), "127.0.0.1", 0)
        async with (
            httpx.AsyncClient(base_url=base, timeout=10) as client,
            client.stream("GET", "/events/r") as stream,
        ):
            assert stream.headers["content-type"] == "text/event-stream"
            lines = stream.aiter_lines()
            await watching(lines)
            before = (await client.get("/api/trace/r")).json()
            with Store.open(db) as store:
                store.append(steps[half:])
            assert await next_event(lines) == "changed"
            after = (await client.get("/api/trace/r")).json()
            assert len(after["steps"]) == len(steps) > len(before["steps"])
            assert len(after["agents"]) == 4
            assert after["agents"][0]["status"] == "idle"
            assert before["agents"][0]["status"] == "running"
        nursery.cancel_scope.cancel()


async def test_the_list_follows_sub_agents_of_a_running_tree(tmp_path: Path) -> None:
    driver = Driver()
    fan_out(driver)
    steps = driver.steps
    children = [i for i, s in enumerate(steps) if s.conversation_id == "r.1"]
    cut = children[1]  # r.1 has started; the root is waiting
    db = tmp_path / "live.db"
    with Store.open(db) as store:
        store.append(steps[:cut])
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(serve, TraceServer(db, poll=0.05), "127.0.0.1", 0)
        async with (
            httpx.AsyncClient(base_url=base, timeout=10) as client,
            client.stream("GET", "/events") as stream,
        ):
            lines = stream.aiter_lines()
            await watching(lines)
            assert steps[cut].conversation_id == "r.1"
            with Store.open(db) as store:
                store.append([steps[cut]])  # one step of a sub-agent, none of the root
            assert await next_event(lines) == "changed"
        nursery.cancel_scope.cancel()


async def test_the_list_follows_new_trees(marks_log: tuple[Path, str]) -> None:
    db, _ = marks_log
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(serve, TraceServer(db, poll=0.05), "127.0.0.1", 0)
        async with (
            httpx.AsyncClient(base_url=base, timeout=10) as client,
            client.stream("GET", "/events") as stream,
        ):
            lines = stream.aiter_lines()
            await watching(lines)
            driver = Driver()
            fan_out(driver, "another")
            with Store.open(db) as store:
                store.append(driver.steps)
            assert await next_event(lines) == "changed"
            trees = (await client.get("/api/trees")).json()
            assert "another" in {t["id"] for t in trees}
            assert len(json.dumps(trees)) > 0
        nursery.cancel_scope.cancel()


def test_a_port_in_use_or_an_unknown_host_is_one_line(marks_log: tuple[Path, str]) -> None:
    """`fanfold ui` on a port another program holds, or on a host that does not
    resolve, once printed a traceback: Hypercorn's OSError arrived wrapped in Trio's
    exception groups, past the command's `except OSError`."""
    import socket

    from click.testing import CliRunner

    from fanfold.cli import cli

    db, _ = marks_log
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["ui", "--db", str(db), "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert result.output == f"error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    unknown = CliRunner().invoke(cli, ["ui", "--db", str(db), "--host", "no-such-host.invalid"])
    assert unknown.exit_code == 2, unknown.output
    assert unknown.output.startswith("error: cannot listen on no-such-host.invalid:8765: ")
    assert len(unknown.output.splitlines()) == 1


def test_a_damaged_tree_never_takes_the_list_down(marks_log: tuple[Path, str]) -> None:
    """`fanfold ui`'s list once answered 500 for the whole database when one tree's
    snapshot was damaged (its tokens and cost come from it): no tree could be opened.
    Now the damaged tree's row has no tokens or cost, and the others are as before."""
    import sqlite3

    from click.testing import CliRunner

    from fanfold.cli import cli
    from fanfold.cli.ui_command import tree_summaries

    db, damaged = marks_log
    script = db.parent / "script.json"
    second = CliRunner().invoke(
        cli, ["run", "--no-live", "--db", str(db), "--script", str(script), "again"]
    )
    assert second.exit_code == 0, second.output
    with sqlite3.connect(db) as connection:
        connection.execute(
            "UPDATE conversations SET snapshot_json = '{bad' WHERE id = ?", (damaged,)
        )
    connection.close()
    with Store.open(db, read_only=True) as store:
        rows = {row["id"]: row for row in tree_summaries(store)}
    assert len(rows) == 2
    assert (rows[damaged]["tokens"], rows[damaged]["cost"]) == (None, None)
    (other,) = [row for key, row in rows.items() if key != damaged]
    assert isinstance(other["tokens"], int)


async def test_the_stream_reads_its_version_before_it_answers(tmp_path: Path) -> None:
    """A browser's EventSource opens when the headers arrive and the pages fetch their
    data again then; the version the stream compares with must already be read, or a
    change in between is never announced (the browser test saw a page stay stale)."""
    driver = Driver()
    fan_out(driver)
    db = tmp_path / "live.db"
    with Store.open(db) as store:
        store.append(driver.steps)
    reads: list[str | None] = []

    class Counting(TraceServer):
        def _version(self, tree: str | None) -> Any:
            reads.append(tree)
            return super()._version(tree)

    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(serve, Counting(db, poll=0.05), "127.0.0.1", 0)
        async with (
            httpx.AsyncClient(base_url=base, timeout=10) as client,
            client.stream("GET", "/events/r") as stream,
        ):
            assert stream.headers["content-type"] == "text/event-stream"
            assert reads[:1] == ["r"]
        nursery.cancel_scope.cancel()
