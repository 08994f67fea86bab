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
from trace_helpers import (
    HOSTILE,
    MARKS_SCRIPT,
    UI_TOKEN,
    forked_with_edit,
    run_script,
    ui_cookie,
)

from fanfold.db import Store
from fanfold.serve.ui_server import TraceServer, serve

pytest.importorskip("hypercorn", reason="fanfold ui needs the ui extra: pip install -e '.[ui]'")


@pytest.fixture
def marks_log(tmp_path: Path) -> tuple[Path, str]:
    # A sync fixture: `fanfold run` starts its own Trio loop, outside the test's.
    return run_script(tmp_path, MARKS_SCRIPT)


@pytest.fixture
async def server(marks_log: tuple[Path, str]) -> AsyncIterator[tuple[str, Path, str]]:
    db, root = marks_log
    async with trio.open_nursery() as nursery:
        (bind,) = await nursery.start(
            serve, TraceServer(db, token=UI_TOKEN, poll=0.05), "127.0.0.1", 0
        )
        assert bind.startswith("http://127.0.0.1:")
        yield bind, db, root
        nursery.cancel_scope.cancel()


async def test_lists_trees_and_serves_their_pages(server: tuple[str, Path, str]) -> None:
    base, _, root = server
    async with httpx.AsyncClient(base_url=base, cookies=ui_cookie(base)) as client:
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
        (base,) = await nursery.start(
            serve, TraceServer(db, token=UI_TOKEN, poll=0.05), "127.0.0.1", 0
        )
        async with (
            httpx.AsyncClient(base_url=base, cookies=ui_cookie(base), timeout=10) as client,
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
        (base,) = await nursery.start(
            serve, TraceServer(db, token=UI_TOKEN, poll=0.05), "127.0.0.1", 0
        )
        async with (
            httpx.AsyncClient(base_url=base, cookies=ui_cookie(base), timeout=10) as client,
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
        (base,) = await nursery.start(
            serve, TraceServer(db, token=UI_TOKEN, poll=0.05), "127.0.0.1", 0
        )
        async with (
            httpx.AsyncClient(base_url=base, cookies=ui_cookie(base), timeout=10) as client,
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
        (base,) = await nursery.start(
            serve, Counting(db, token=UI_TOKEN, poll=0.05), "127.0.0.1", 0
        )
        async with (
            httpx.AsyncClient(base_url=base, cookies=ui_cookie(base), timeout=10) as client,
            client.stream("GET", "/events/r") as stream,
        ):
            assert stream.headers["content-type"] == "text/event-stream"
            assert reads[:1] == ["r"]
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------------- access
# `fanfold ui` once answered any request that reached the port: a page whose name was
# rebound to 127.0.0.1 (DNS rebinding) read every tree and every prompt and reply.


def routes(root: str) -> list[str]:
    """Every route, and paths that are none (a refusal must come before a 404)."""
    return [
        "/",
        "/api/trees",
        f"/trace/{root}",
        f"/api/trace/{root}",
        "/events",
        f"/events/{root}",
        "/page.js",
        "/list.js",
        "/elsewhere",
    ]


def refused(answer: httpx.Response, why: str) -> None:
    assert answer.status_code == 403, (answer.request.url, answer.status_code)
    assert answer.headers["content-type"].startswith("text/plain")
    assert answer.text.startswith("refused: ") and why in answer.text
    assert "\n" not in answer.text and len(answer.text) < 100  # one line, no data


async def test_a_wrong_host_is_refused_on_every_route(server: tuple[str, Path, str]) -> None:
    base, _, root = server
    port = base.rsplit(":", 1)[1]
    wrong = [
        f"evil.example:{port}",  # a rebound name
        f"localhost.evil.example:{port}",
        f"127.0.0.1.evil.example:{port}",
        "127.0.0.1:1",  # our name, another port
        "127.0.0.1",  # port 80 implied
        "",
        "127.0.0.1:8765 x",
    ]
    async with httpx.AsyncClient(base_url=base, cookies=ui_cookie(base)) as client:
        for path in routes(root):
            for host in wrong:
                answer = await client.get(path, headers={"host": host})
                refused(answer, "Host")
            # Even with the token in the query.
            answer = await client.get(
                path, params={"token": UI_TOKEN}, headers={"host": f"evil.example:{port}"}
            )
            refused(answer, "Host")
        # The names of this server pass, with the same cookie.
        for host in (
            f"127.0.0.1:{port}",
            f"localhost:{port}",
            f"LocalHost:{port}",
            f"[::1]:{port}",
        ):
            answer = await client.get("/api/trees", headers={"host": host})
            assert answer.status_code == 200, host
            assert [t["id"] for t in answer.json()] == [root]


async def test_a_missing_or_repeated_host_is_refused(marks_log: tuple[Path, str]) -> None:
    """Straight through the ASGI interface: HTTP/1.0 needs no Host, and a client can
    send two."""
    db, _ = marks_log
    app = TraceServer(db, token=UI_TOKEN)
    cookie = f"fanfold-ui-8765={UI_TOKEN}".encode()
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    for hosts in ([], [b"127.0.0.1:8765", b"evil.example:8765"], [b"127.0.0.1:8765"]):
        sent.clear()

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        scope = {
            "type": "http",
            "method": "GET",
            "path": "/api/trees",
            "query_string": b"",
            "server": ("127.0.0.1", 8765),
            "headers": [(b"cookie", cookie)] + [(b"host", h) for h in hosts],
        }
        await app(scope, receive, send)
        assert sent[0]["status"] == (200 if len(hosts) == 1 else 403), hosts


async def test_the_host_listened_on_is_accepted(marks_log: tuple[Path, str]) -> None:
    db, root = marks_log
    app = TraceServer(db, token=UI_TOKEN, hosts=("devbox.lan",), poll=0.05)
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(serve, app, "127.0.0.1", 0)
        port = base.rsplit(":", 1)[1]
        async with httpx.AsyncClient(base_url=base, cookies=ui_cookie(base)) as client:
            good = await client.get("/api/trees", headers={"host": f"devbox.lan:{port}"})
            assert good.status_code == 200 and good.json()[0]["id"] == root
            bad = await client.get("/api/trees", headers={"host": f"other.lan:{port}"})
            refused(bad, "Host")
        nursery.cancel_scope.cancel()


async def test_no_token_or_a_wrong_one_is_refused(server: tuple[str, Path, str]) -> None:
    base, _, root = server
    port = base.rsplit(":", 1)[1]
    wrong = UI_TOKEN[:-1] + ("x" if UI_TOKEN[-1] != "x" else "y")
    async with httpx.AsyncClient(base_url=base) as client:
        for path in routes(root):
            refused(await client.get(path), "token")
            refused(await client.get(path, params={"token": wrong}), "token")
            refused(await client.get(path, params={"token": ""}), "token")
            refused(await client.get(path, params={"token": UI_TOKEN + "x"}), "token")
            refused(await client.get(path, params={"token": "é" * 5}), "token")
            refused(
                await client.get(path, headers={"cookie": f"fanfold-ui-{port}={wrong}"}), "token"
            )
            # The right token under another port's cookie is another server's.
            refused(await client.get(path, headers={"cookie": f"fanfold-ui-1={UI_TOKEN}"}), "token")
            refused(await client.get(path, headers={"cookie": f"x=1; fanfold-ui-{port}"}), "token")
            assert (await client.head(path)).status_code == 403
        # Whatever the method: no token, no 405 either.
        refused(await client.post("/api/trees"), "token")


async def test_the_token_in_the_query_sets_the_cookie(server: tuple[str, Path, str]) -> None:
    base, _, root = server
    port = base.rsplit(":", 1)[1]
    async with httpx.AsyncClient(base_url=base) as client:
        # A page: the cookie, and the same page again without the token in its URL.
        first = await client.get(f"/trace/{root}", params={"token": UI_TOKEN})
        assert first.status_code == 303
        assert first.headers["location"] == f"/trace/{root}"
        cookie = first.headers["set-cookie"]
        assert cookie.startswith(f"fanfold-ui-{port}={UI_TOKEN};")
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
        # The client keeps the cookie (as a browser does); every route then works.
        assert client.cookies[f"fanfold-ui-{port}"] == UI_TOKEN
        page = await client.get(f"/trace/{root}")
        assert page.status_code == 200 and page.text.startswith("<!doctype html>")
        assert (await client.get("/")).status_code == 200
        assert (await client.get(f"/api/trace/{root}")).json()["root"] == root
        async with client.stream("GET", f"/events/{root}") as stream:
            assert stream.status_code == 200
            await watching(stream.aiter_lines())
        assert (await client.get("/elsewhere")).status_code == 404
        assert (await client.post("/api/trees")).status_code == 405
    async with httpx.AsyncClient(base_url=base) as script:
        # The JSON answers at once, for a script that does not follow redirects.
        trees = await script.get("/api/trees", params={"token": UI_TOKEN})
        assert trees.status_code == 200 and trees.json()[0]["id"] == root
        assert trees.headers["set-cookie"].startswith(f"fanfold-ui-{port}={UI_TOKEN};")
        # The redirect stays on this server ("//host" would leave it).
        away = await script.get(f"{base}//evil.example/", params={"token": UI_TOKEN})
        assert away.status_code == 303 and away.headers["location"] == "/evil.example/"
        # A backslash too: browsers read "/\host" as "//host".
        away = await script.get(f"{base}/%5Cevil.example/", params={"token": UI_TOKEN})
        assert away.status_code == 303 and away.headers["location"] == "/%5Cevil.example/"


async def test_cross_site_requests_are_refused(server: tuple[str, Path, str]) -> None:
    base, _, root = server
    port = base.rsplit(":", 1)[1]
    async with httpx.AsyncClient(base_url=base, cookies=ui_cookie(base)) as client:
        for path in ("/", "/api/trees", f"/api/trace/{root}", f"/events/{root}"):
            for headers in (
                {"origin": "http://evil.example"},
                {"origin": f"http://evil.example:{port}"},
                {"origin": f"http://localhost:{int(port) + 1}"},  # another local server
                {"origin": f"https://127.0.0.1:{port}"},
                {"origin": "null"},
                {"sec-fetch-site": "cross-site"},
                {"sec-fetch-site": "same-site"},
                {"sec-fetch-site": "same-origin", "origin": "http://evil.example"},
            ):
                refused(await client.get(path, headers=headers), "cross-site")
        # A state-changing method from another site: refused before anything else.
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            answer = await client.request(
                method, "/api/trees", headers={"origin": "http://evil.example"}
            )
            refused(answer, "cross-site")
        # The pages' own requests, and an address opened from the terminal.
        for headers in (
            {"sec-fetch-site": "same-origin", "origin": f"http://127.0.0.1:{port}"},
            {"sec-fetch-site": "same-origin"},
            {"sec-fetch-site": "none"},
        ):
            answer = await client.get("/api/trees", headers=headers)
            assert answer.status_code == 200 and answer.json()[0]["id"] == root


def test_the_command_prints_the_only_copy_of_a_fresh_token(
    marks_log: tuple[Path, str], tmp_path: Path
) -> None:
    """`fanfold ui` itself: a token per launch, in the URL it prints and nowhere else
    in its output; the URL opens the pages, a rebound name is refused."""
    import os
    import re
    import signal
    import subprocess
    import sys

    db, root = marks_log
    cli = [sys.executable, "-c", "from fanfold.cli import main; main()"]
    urls = []
    for env in ({}, {"FANFOLD_UI_TOKEN": UI_TOKEN}):
        process = subprocess.Popen(
            [*cli, "ui", "--db", str(db), "--port", "0", "--poll", "0.05"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "40", **env},
        )
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            match = re.fullmatch(
                r"fanfold ui: (http://127\.0\.0\.1:\d+)/\?token=([\w-]+) \(Ctrl-C to stop\)\n",
                line,
            )
            assert match is not None, line
            base, token = match.groups()
            urls.append(token)
            with httpx.Client(base_url=base) as client:
                opened = client.get("/", params={"token": token}, follow_redirects=True)
                assert opened.status_code == 200 and str(opened.url) == base + "/"
                assert client.get("/api/trees").json()[0]["id"] == root
                port = base.rsplit(":", 1)[1]
                rebound = client.get("/api/trees", headers={"host": f"evil.example:{port}"})
                assert rebound.status_code == 403
            with httpx.Client(base_url=base) as stranger:
                assert stranger.get("/api/trees").status_code == 403
        finally:
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
        assert token not in out + err
    fresh, given = urls
    assert len(fresh) >= 43 and fresh != UI_TOKEN
    assert given == UI_TOKEN


def test_a_token_that_cannot_serve_is_one_line(marks_log: tuple[Path, str]) -> None:
    from click.testing import CliRunner

    from fanfold.cli import cli

    db, _ = marks_log
    for token in ("short", "x" * 15, "with space in it 0123", "semi;colon0123456789"):
        result = CliRunner().invoke(cli, ["ui", "--db", str(db), "--token", token])
        assert result.exit_code == 2, result.output
        assert result.output.startswith("error: --token / FANFOLD_UI_TOKEN: ")
        assert len(result.output.splitlines()) == 1
    result = CliRunner().invoke(cli, ["ui", "--db", str(db)], env={"FANFOLD_UI_TOKEN": "bad"})
    assert result.exit_code == 2 and "FANFOLD_UI_TOKEN" in result.output


@pytest.fixture
def forked_log(tmp_path: Path) -> tuple[Path, str, str]:
    return forked_with_edit(tmp_path)  # a sync fixture, as marks_log


async def test_a_fork_and_a_tree_beside_another(forked_log: tuple[Path, str, str]) -> None:
    """Issue 24: a fork's page and data carry the comparison with its original; any
    tree's beside another with ``?vs=``, which the token's redirect keeps."""
    db, root, fork = forked_log
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(serve, TraceServer(db, token=UI_TOKEN), "127.0.0.1", 0)
        async with httpx.AsyncClient(base_url=base, cookies=ui_cookie(base)) as client:
            data = (await client.get(f"/api/trace/{fork}")).json()
            assert data["fork"]["source_tree"] == root
            assert data["compare"]["b"] == fork
            beside = (await client.get(f"/api/trace/{root}", params={"vs": fork})).json()
            assert (beside["compare"]["a"], beside["compare"]["b"]) == (root, fork)
            page = await client.get(f"/trace/{root}", params={"vs": fork})
            # The live page fetches the same comparison when the tree changes.
            assert f'"data":"/api/trace/{root}?vs={fork}"' in page.text
            unknown = await client.get(f"/trace/{root}", params={"vs": "nope"})
            assert unknown.status_code == 404
        async with httpx.AsyncClient(base_url=base) as browser:
            first = await browser.get(f"/trace/{root}", params={"token": UI_TOKEN, "vs": fork})
            assert first.status_code == 303
            assert first.headers["location"] == f"/trace/{root}?vs={fork}"
        nursery.cancel_scope.cancel()
