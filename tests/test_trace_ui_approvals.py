"""A person's decisions from ``fanfold ui`` (issue 35): the POST routes write a row of
the log's decisions table as ``fanfold approve`` does, after the same checks, and
every refusal (token, Host, Origin, a form's body, an unknown or decided request, a
decision that does not fit) is one clear line with nothing written."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from approval_ui_helpers import HOSTILE_ARGUMENT, QUESTION, waiting_log
from trace_helpers import UI_TOKEN, ui_cookie

from fanfold.serve.ui_server import TraceServer, serve

pytest.importorskip("hypercorn", reason="fanfold ui needs the ui extra: pip install -e '.[ui]'")


@pytest.fixture
def log(tmp_path: Path) -> tuple[Path, str]:
    return waiting_log(tmp_path)  # a sync fixture: its own Trio loop


@pytest.fixture
async def server(log: tuple[Path, str]) -> AsyncIterator[tuple[str, Path, str]]:
    db, root = log
    async with trio.open_nursery() as nursery:
        (bind,) = await nursery.start(
            serve, TraceServer(db, token=UI_TOKEN, poll=0.05), "127.0.0.1", 0
        )
        yield bind, db, root
        nursery.cancel_scope.cancel()


def rows(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT request, kind, arguments, text, decided_by, state FROM decisions "
            "ORDER BY request"
        ).fetchall()


def ours(base: str) -> dict[str, str]:
    """The headers of the page's own fetch."""
    return {"origin": base, "sec-fetch-site": "same-origin"}


async def test_approve_deny_and_answer_from_the_page(server: tuple[str, Path, str]) -> None:
    base, db, root = server
    async with httpx.AsyncClient(base_url=base, cookies=ui_cookie(base)) as client:
        # The list counts the tree's open requests; the trace shows each one, and the
        # decided one with who decided, when, and the edited arguments.
        (tree,) = (await client.get("/api/trees")).json()
        assert tree["id"] == root and tree["requests"] == 3
        data = (await client.get(f"/api/trace/{root}")).json()
        requests = {a["id"]: a["requests"] for a in data["agents"]}
        done, waiting = requests[f"{root}.1"]
        assert not done["open"] and done["decision"]["by"] == "alice"
        assert done["decision"]["kind"] == "grant"
        assert json.loads(done["decision"]["arguments"]) == {"command": "echo edited"}
        assert waiting["open"] and waiting["decision"] is None and waiting["tool"] == "bash"
        assert waiting["rule"] == "the ask rule 'bash' of the run's ask rules"
        (hostile,) = requests[f"{root}.2"]
        assert json.loads(hostile["arguments"]) == {"command": HOSTILE_ARGUMENT}
        (question,) = requests[f"{root}.3"]
        assert question["question"] == QUESTION and question["choices"] == ["main", "dev"]
        page = await client.get(f"/trace/{root}")
        assert "<img" not in page.text and "<b>" not in page.text  # escaped data only

        before = rows(db)
        approve = await client.post(
            "/api/approve",
            json={"request": waiting["id"], "arguments": {"command": "echo one, edited"}},
            headers=ours(base),
        )
        assert approve.status_code == 200, approve.text
        assert approve.json() == {
            "request": waiting["id"],
            "kind": "grant",
            "written": True,
            "state": "new",  # no runtime holds the tree: the next resume takes it
        }
        deny = await client.post(
            "/api/deny", json={"request": hostile["id"], "reason": "not <that>"}, headers=ours(base)
        )
        answer = await client.post(
            "/api/answer", json={"request": question["id"], "text": "dev"}, headers=ours(base)
        )
        assert (deny.status_code, answer.status_code) == (200, 200)
        assert sorted(set(rows(db)) - set(before)) == [
            (waiting["id"], "grant", '{"command": "echo one, edited"}', "", "ui", "new"),
            (hostile["id"], "deny", None, "not <that>", "ui", "new"),
            (question["id"], "answer", None, "dev", "ui", "new"),
        ]
        # A second decision for the same request: the first one stands.
        again = await client.post(
            "/api/deny", json={"request": waiting["id"], "reason": "no"}, headers=ours(base)
        )
        assert again.status_code == 409 and "decided already" in again.text
        assert len(rows(db)) == len(before) + 3


async def test_a_decision_that_cannot_be_taken_writes_nothing(
    server: tuple[str, Path, str],
) -> None:
    base, db, root = server
    port = base.rsplit(":", 1)[1]
    request = f"{root}.2:2"
    before = rows(db)
    assert [r[0] for r in before] == [f"{root}.1:2"]  # alice's, applied
    grant = {"request": request}

    def clear(answer: httpx.Response, status: int, words: str) -> None:
        assert answer.status_code == status, (answer.status_code, answer.text)
        assert answer.headers["content-type"].startswith("text/plain")
        assert words in answer.text and "\n" not in answer.text

    async with httpx.AsyncClient(base_url=base) as bare:
        # No token, a wrong one, a token of another launch.
        clear(await bare.post("/api/approve", json=grant, headers=ours(base)), 403, "token")
        wrong = {f"fanfold-ui-{port}": "another-token-0123456789"}
        bare.cookies.update(wrong)
        clear(await bare.post("/api/approve", json=grant, headers=ours(base)), 403, "token")
    async with httpx.AsyncClient(base_url=base, cookies=ui_cookie(base)) as client:
        post = client.post
        # Another site's page, a rebound name, no Origin at all (not the page's fetch).
        for headers in (
            {"origin": "http://evil.example"},
            {"origin": f"http://localhost:{int(port) + 1}"},
            {"origin": base, "sec-fetch-site": "same-site"},
            {"origin": base, "host": f"evil.example:{port}"},
            {},
        ):
            answer = await post("/api/approve", json=grant, headers=headers)
            clear(answer, 403, "refused")
        # An HTML form's body (the one kind of cross-site POST without a preflight).
        form = await post(
            "/api/approve",
            content=f"request={request}",
            headers={**ours(base), "content-type": "application/x-www-form-urlencoded"},
        )
        clear(form, 415, "application/json")
        clear(
            await post(
                "/api/approve",
                content=b"{",
                headers={**ours(base), "content-type": "application/json"},
            ),
            400,
            "JSON",
        )
        # Unknown requests; a decided one; decisions that do not fit the request.
        for body, status, words in (
            ({"request": "nope:2"}, 404, "no open request"),
            ({"request": f"{root}.2:7"}, 404, "no open request"),
            ({"request": "not an id"}, 404, "no open request"),
            ({"request": f"{root}.1:2"}, 409, "decided already"),
            ({"request": request, "arguments": {"command": 3}}, 400, "command"),
            ({"request": request, "arguments": ["x"]}, 400, "JSON object"),
            ({"request": f"{root}.3:2"}, 400, "is a question"),
            ({}, 400, "naming its request"),
        ):
            clear(await post("/api/approve", json=body, headers=ours(base)), status, words)
        answer = await post(
            "/api/answer", json={"request": request, "text": "x"}, headers=ours(base)
        )
        clear(answer, 400, "asks for approval")
        empty = await post("/api/answer", json={"request": f"{root}.3:2"}, headers=ours(base))
        clear(empty, 400, "needs a text")
        # GET of a decision route, and other methods: not served.
        assert (await client.get("/api/approve")).status_code == 404
        assert (await client.put("/api/approve", json=grant, headers=ours(base))).status_code == 405
    assert rows(db) == before
