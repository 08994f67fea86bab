"""The trace page's "Approve all" (issue 35): one POST, ``/api/approve-all``, grants
every open approval request the page names, in one transaction, as ``fanfold approve
--all`` does; behind the same token, Host, Origin and Content-Type checks as a single
decision, and a refused one writes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from approval_ui_helpers import waiting_log
from test_trace_ui_approvals import ours, rows
from trace_helpers import UI_TOKEN, ui_cookie

from fanfold.serve.ui_server import MAX_APPROVE_ALL, TraceServer, serve

pytest.importorskip("hypercorn", reason="fanfold ui needs the ui extra: pip install -e '.[ui]'")


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[str, Path, str]]:
    db, root = await trio.to_thread.run_sync(waiting_log, tmp_path)  # its own Trio loop
    async with trio.open_nursery() as nursery:
        (bind,) = await nursery.start(
            serve, TraceServer(db, token=UI_TOKEN, poll=0.05), "127.0.0.1", 0
        )
        yield bind, db, root
        nursery.cancel_scope.cancel()


async def test_approve_all_grants_every_open_approval_named(
    server: tuple[str, Path, str],
) -> None:
    base, db, root = server
    before = rows(db)
    async with httpx.AsyncClient(base_url=base, cookies=ui_cookie(base)) as client:
        data = (await client.get(f"/api/trace/{root}")).json()
        shown = [r for a in data["agents"] for r in a["requests"]]
        calls = sorted(r["id"] for r in shown if r["open"] and r["question"] is None)
        (question,) = [r["id"] for r in shown if r["open"] and r["question"] is not None]
        (alices,) = [r["id"] for r in shown if not r["open"]]
        assert len(calls) == 2
        body = {"requests": [*calls, question, alices, "nope:1", calls[0]]}
        answer = await client.post("/api/approve-all", json=body, headers=ours(base))
        assert answer.status_code == 200, answer.text
        assert answer.json() == {
            "approved": calls,
            "closed": {},
            "decided_already": [],
            # A question is answered, not approved; the others are not open.
            "not_open": [question, alices, "nope:1"],
        }
        assert sorted(set(rows(db)) - set(before)) == [
            (calls[0], "grant", None, "", "ui", "new"),
            (calls[1], "grant", None, "", "ui", "new"),
        ]
        again = await client.post("/api/approve-all", json={"requests": calls}, headers=ours(base))
        assert again.json()["decided_already"] == calls and again.json()["approved"] == []
    assert len(rows(db)) == len(before) + 2


async def test_a_refused_approve_all_writes_nothing(server: tuple[str, Path, str]) -> None:
    base, db, root = server
    port = base.rsplit(":", 1)[1]
    body = {"requests": [f"{root}.2:2"]}
    before = rows(db)

    def clear(answer: httpx.Response, status: int, words: str) -> None:
        assert answer.status_code == status, (answer.status_code, answer.text)
        assert words in answer.text and "\n" not in answer.text

    async with httpx.AsyncClient(base_url=base) as bare:
        clear(await bare.post("/api/approve-all", json=body, headers=ours(base)), 403, "token")
    async with httpx.AsyncClient(base_url=base, cookies=ui_cookie(base)) as client:
        post = client.post
        for headers in (
            {"origin": "http://evil.example"},
            {"origin": base, "sec-fetch-site": "cross-site"},
            {"origin": base, "host": f"evil.example:{port}"},
            {},
        ):
            clear(await post("/api/approve-all", json=body, headers=headers), 403, "refused")
        form = await post(
            "/api/approve-all",
            content=f"requests={root}.2:2",
            headers={**ours(base), "content-type": "application/x-www-form-urlencoded"},
        )
        clear(form, 415, "application/json")
        bads: list[dict[str, Any]] = [
            {},
            {"requests": []},
            {"requests": f"{root}.2:2"},
            {"requests": [3]},
            {"requests": ["x"] * (MAX_APPROVE_ALL + 1)},
        ]
        for bad in bads:
            clear(await post("/api/approve-all", json=bad, headers=ours(base)), 400, "a list")
        only_closed = {"requests": [f"{root}.1:2", f"{root}.3:2"]}  # alice's, a question
        clear(await post("/api/approve-all", json=only_closed, headers=ours(base)), 404, "none")
        assert (await client.get("/api/approve-all")).status_code == 404
    assert rows(db) == before
