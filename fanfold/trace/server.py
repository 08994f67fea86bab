"""``fanfold ui``'s web application: the trace pages of a whole database, served live.

A plain ASGI application (no web framework) for Hypercorn's Trio worker: Trio is the
only async library. Every request opens the database read-only in a worker thread
(building a large tree's trace takes a second; the event loop stays free), so the
server never writes and can watch a database that a running ``fanfold run`` writes.

Routes (GET only):

- ``/``: the list of trees (status, duration, agents, tokens, cost); ``/api/trees``
  the same as JSON;
- ``/trace/ID``: the trace page of a tree, following it live; ``/api/trace/ID`` its
  data as JSON;
- ``/events`` and ``/events/ID``: server-sent events, one ``changed`` event whenever
  the database (or that tree) changes, polled every ``poll`` seconds.

Every answer carries ``X-Content-Type-Options: nosniff``; ids from the URL are only
ever looked up, never put in markup (pages embed them as escaped JSON data).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import trio

from fanfold.db import DatabaseError, Store, UnknownConversation
from fanfold.trace.build import build_trace
from fanfold.trace.html import render_html, render_page

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Summaries = Callable[[Store], list[dict[str, Any]]]

_LIST_BODY = """<header id="summary"><h1>fanfold trees</h1>
<span class="stat" id="db"></span></header>
<main style="display:block;overflow:auto;padding:8px 12px">
<table id="trees" class="marks" aria-label="conversation trees"></table>
</main>"""


def default_summaries(store: Store) -> list[dict[str, Any]]:
    """One row per root conversation: what ``fanfold ls`` shows, and the tree's size."""
    rows = []
    for root in store.list_roots():
        tree = store.tree(root.id)
        rows.append(
            {
                "id": root.id,
                "status": root.status.value,
                "task": root.task or "",
                "created_at": root.created_at,
                "duration": max(r.updated_at for r in tree) - root.created_at,
                "agents": len(tree),
                "running": sum(1 for r in tree if r.status.value == "running"),
                "tokens": None,
                "cost": None,
            }
        )
    return rows


def _json_bytes(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=True, allow_nan=False).encode("ascii")


class TraceServer:
    """The ASGI application of ``fanfold ui`` over the database at ``db``."""

    def __init__(
        self, db: Path, *, summaries: Summaries = default_summaries, poll: float = 0.5
    ) -> None:
        self.db = db
        self.summaries = summaries
        self.poll = poll

    # ------------------------------------------------------------------ reading

    def _read(self, work: Callable[[Store], Any]) -> Any:
        with Store.open(self.db, read_only=True) as store:
            return work(store)

    async def read(self, work: Callable[[Store], Any]) -> Any:
        return await trio.to_thread.run_sync(self._read, work)

    def _version(self, tree: str | None) -> Any:
        def version(store: Store) -> Any:
            if tree is None:
                # The roots, and every conversation still running (a root waiting for
                # its sub-agents has no events of its own while they work).
                roots = [(r.id, r.updated_at, r.status.value) for r in store.list_roots()]
                return roots, [(r.id, r.last_seq) for r in store.unfinished()]
            return [(r.id, r.last_seq, r.status.value) for r in store.tree(tree)]

        return self._read(version)

    # ------------------------------------------------------------------ ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["method"] not in ("GET", "HEAD"):
            await self._plain(send, 405, "only GET is served")
            return
        path = scope["path"]  # ASGI gives it percent-decoded
        try:
            await self._route(path, receive, send)
        except UnknownConversation as exc:
            await self._plain(send, 404, str(exc))
        except DatabaseError as exc:
            await self._plain(send, 500, str(exc))

    async def _route(self, path: str, receive: Receive, send: Send) -> None:
        if path == "/":
            rows = await self.read(self.summaries)
            page = render_page(
                "fanfold trees",
                "list.js",
                {"trees-data": {"db": str(self.db), "trees": rows}},
                _LIST_BODY,
                live=True,
            )
            await self._answer(send, 200, "text/html; charset=utf-8", page.encode())
        elif path == "/api/trees":
            rows = await self.read(self.summaries)
            await self._answer(send, 200, "application/json", _json_bytes(rows))
        elif path.startswith("/trace/"):
            tree = path.removeprefix("/trace/")
            data = await self.read(lambda store: build_trace(store, tree))
            safe = quote(tree, safe="")
            live = {"events": f"/events/{safe}", "data": f"/api/trace/{safe}"}
            page = render_html(data, live=live)
            await self._answer(send, 200, "text/html; charset=utf-8", page.encode())
        elif path.startswith("/api/trace/"):
            tree = path.removeprefix("/api/trace/")
            data = await self.read(lambda store: build_trace(store, tree))
            await self._answer(send, 200, "application/json", _json_bytes(data))
        elif path == "/events" or path.startswith("/events/"):
            watched = path.removeprefix("/events/") if path != "/events" else None
            if watched is not None:
                await self.read(lambda store: store.conversation(watched))  # 404 if unknown
            await self._events(watched, receive, send)
        else:
            await self._plain(send, 404, "not found")

    async def _events(self, tree: str | None, receive: Receive, send: Send) -> None:
        """Server-sent events: ``changed`` each time the version read differs, until
        the client goes away.

        The version to compare with is read before the response starts: a browser's
        ``EventSource`` opens when the headers arrive, and the pages fetch their data
        again then, so a change made between the page's first read and the stream
        is never missed (it once was: the page stayed stale until the next change).
        """
        seen = await trio.to_thread.run_sync(self._version, tree)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-store"),
                    (b"x-content-type-options", b"nosniff"),
                ],
            }
        )
        async with trio.open_nursery() as nursery:

            async def disconnected() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(disconnected)
            await send({"type": "http.response.body", "body": b": watching\n\n", "more_body": True})
            count = 0
            while True:
                await trio.sleep(self.poll)
                now = await trio.to_thread.run_sync(self._version, tree)
                if now != seen:
                    seen = now
                    count += 1
                    body = f"event: changed\nid: {count}\ndata: {count}\n\n".encode()
                    await send({"type": "http.response.body", "body": body, "more_body": True})

    async def _plain(self, send: Send, status: int, text: str) -> None:
        await self._answer(send, status, "text/plain; charset=utf-8", text.encode())

    async def _answer(self, send: Send, status: int, kind: str, body: bytes) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", kind.encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-store"),
                    (b"x-content-type-options", b"nosniff"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


async def serve(
    app: TraceServer,
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` with Hypercorn's Trio worker (the ``ui`` extra); reports the bound
    addresses (``http://127.0.0.1:PORT``) through ``task_status``."""
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 1.0
    asgi: Any = app  # Hypercorn's ASGI types are protocols of its own; the app fits them
    await hypercorn_serve(asgi, config, task_status=task_status)


def finite(value: float | None) -> float | None:
    """``value`` unless it is NaN or infinite (JSON cannot hold those)."""
    return value if value is not None and math.isfinite(value) else None
