"""``fanfold ui``'s web application: the trace pages of a whole database, served live.

A plain ASGI application (no web framework) for Hypercorn's Trio worker: Trio is the
only async library. Every request opens the database read-only in a worker thread
(building a large tree's trace takes a second; the event loop stays free), so the
server never writes and can watch a database that a running ``fanfold run`` writes.

Routes (GET only):

- ``/``: the list of trees (status, duration, agents, tokens, cost); ``/api/trees``
  the same as JSON;
- ``/trace/ID``: the trace page of a tree, following it live; ``/api/trace/ID`` its
  data as JSON; ``?vs=OTHER`` shows the tree beside OTHER's (a fork's page shows its
  original without it);
- ``/events`` and ``/events/ID``: server-sent events, one ``changed`` event whenever
  the database (or that tree, or the progress of its tool calls in flight) changes,
  polled every ``poll`` seconds.

And three POST routes, a person's decisions (issue 35): ``/api/approve``,
``/api/deny`` and ``/api/answer``, each a JSON object naming the ``request`` (with
edited ``arguments``, a ``reason`` or the answer's ``text``). A decision is written as
``fanfold approve`` writes it: a row of the log's ``decisions`` table
(``fanfold.runtime.approvals.FileDecisions``), after the same check
(``check_decision``), with ``by`` "ui"; the runtime that holds the request takes it.
A fourth, ``/api/approve-all`` (the page's "Approve all" button), grants every open
approval request of ``{"requests": [ID, ...]}`` (those the page shows) in one
transaction. Those rows are the only thing the server ever writes.

Every answer carries ``X-Content-Type-Options: nosniff``; ids from the URL are only
ever looked up, never put in markup (pages embed them as escaped JSON data).

Every request, on every route and before anything is looked up, passes three checks
(DESIGN.md, "Security model"): its ``Host`` names this server (a loopback name, the
address the connection arrived at, or the ``--host`` given; with the port it arrived
on), so a page whose name was rebound to 127.0.0.1 is refused; it is not cross-site
(``Sec-Fetch-Site`` and ``Origin``); and it carries the per-launch token, in the query
(``?token=...``, the URL ``fanfold ui`` prints) or in the HttpOnly, SameSite=Strict
cookie that a query token sets. A refusal is a 403 with one plain line. A POST must
also carry an ``Origin`` naming this server and a JSON body (``Content-Type:
application/json``): an HTML form can send neither, and a cross-site script cannot
send that type without a preflight, which is never answered.
"""

from __future__ import annotations

import hmac
import json
import math
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import trio

from fanfold.db import DatabaseError, Store, UnknownConversation, open_store
from fanfold.loopback import (
    address,
    names_this_server,
    single_host_names_this_server,
)
from fanfold.runtime.approvals import (
    ANSWER,
    DENY,
    GRANT,
    AlreadyDecided,
    BadDecision,
    Decision,
    FileDecisions,
    PendingRequest,
    check_decision,
    closed_message,
    open_request,
    settle,
    split_request_id,
)
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


def open_request_counts(store: Store) -> dict[str, int]:
    """How many open requests for a person's decision each tree has (issue 35): one
    per conversation at most, read from the unfinished conversations' states."""
    counts: dict[str, int] = {}
    for row in store.unfinished():
        if row.phase != "ToolExecuting":
            continue
        request = open_request(store.load_state(row.id))
        if request is not None:
            counts[request.tree] = counts.get(request.tree, 0) + 1
    return counts


class DecisionRefused(Exception):
    """A decision the page sent that is not written: ``status`` and one plain line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


_DECIDE = {"/api/approve": GRANT, "/api/deny": DENY, "/api/answer": ANSWER}
APPROVE_ALL = "/api/approve-all"
"""The "approve all" button's route: ``{"requests": [ID, ...]}``."""
MAX_APPROVE_ALL = 10_000
"""The most requests one "approve all" names."""
_MAX_BODY = 256 * 1024  # edited arguments are a tool call's: large enough, bounded


# What a token may hold: it goes in a URL and a cookie as it is (token_urlsafe's
# alphabet, and "." and "~"), and is long enough not to be guessed.
_TOKEN_RE = re.compile(r"[A-Za-z0-9._~-]{16,256}")


class BadToken(ValueError):
    """A token given by the user (``--token``, ``FANFOLD_UI_TOKEN``) that cannot be
    used: too short, too long, or holding what a URL or a cookie cannot carry as is."""


def check_token(token: str) -> str:
    """``token`` if it can serve as ``fanfold ui``'s token, else :class:`BadToken`."""
    if not _TOKEN_RE.fullmatch(token):
        raise BadToken("a fanfold ui token needs 16 to 256 characters among A-Z a-z 0-9 . _ ~ -")
    return token


def _json_bytes(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=True, allow_nan=False).encode("ascii")


class TraceServer:
    """The ASGI application of ``fanfold ui`` over the database at ``db``.

    ``token``: the secret every request must carry (``check_token``'s rules; a fresh
    ``new_token()`` for each launch). ``hosts``: names besides the loopback ones and
    the connection's own address that a ``Host`` header may give (the ``--host``
    listened on).
    """

    def __init__(
        self,
        db: Path | str,
        *,
        token: str,
        hosts: tuple[str, ...] = (),
        summaries: Summaries = default_summaries,
        poll: float = 0.5,
    ) -> None:
        self.db = db
        self.token = check_token(token)
        self.hosts = frozenset(address(h.lower().strip("[]")) for h in hosts)
        self.summaries = summaries
        self.poll = poll

    # ------------------------------------------------------------------ reading

    def _read(self, work: Callable[[Store], Any]) -> Any:
        with open_store(self.db, read_only=True) as store:
            return work(store)

    async def read(self, work: Callable[[Store], Any]) -> Any:
        return await trio.to_thread.run_sync(self._read, work)

    def _summaries(self, store: Store) -> list[dict[str, Any]]:
        rows = self.summaries(store)
        counts = open_request_counts(store)
        for row in rows:
            row["requests"] = counts.get(row["id"], 0)
        return rows

    def _decide(self, kind: str, body: Any) -> dict[str, Any]:
        """Write the decision ``body`` asks for (a worker thread); DecisionRefused
        says why not, and then nothing was written."""
        if not isinstance(body, dict) or not isinstance(body.get("request"), str):
            raise DecisionRefused(400, "a decision is a JSON object naming its request")
        request_id = body["request"]
        arguments: str | None = None
        text = ""
        if kind == GRANT and body.get("arguments") is not None:
            if not isinstance(body["arguments"], dict):
                raise DecisionRefused(400, "edited arguments must be a JSON object")
            arguments = json.dumps(body["arguments"], ensure_ascii=False)
        elif kind == DENY:
            text = body.get("reason", "")
        elif kind == ANSWER:
            text = body.get("text", "")
        if not isinstance(text, str):
            raise DecisionRefused(400, "a reason or an answer is a string")
        if kind == ANSWER and not text.strip():
            raise DecisionRefused(400, "an answer needs a text (to decline, deny the request)")
        if kind == DENY and not text.strip():
            text = "no reason given"  # the model reads it: never an empty result
        split = split_request_id(request_id)
        if split is None:
            raise DecisionRefused(404, "no open request with this id")
        if isinstance(self.db, str) and "://" in self.db:
            raise DecisionRefused(400, "decisions from the web page need an SQLite log for now")
        with open_store(self.db, read_only=True) as store:
            try:
                state = store.load_state(split[0])
            except UnknownConversation:
                raise DecisionRefused(404, "no open request with this id") from None
        request = open_request(state)
        table = FileDecisions(self.db)
        if request is None or request.id != request_id:
            if _decided(self.db, request_id):
                raise DecisionRefused(409, f"request {request_id} was decided already")
            raise DecisionRefused(
                404,
                f"no open request {request_id} (never asked, or ended by a cancel or a timeout)",
            )
        try:
            check_decision(state, request, kind, arguments)
            table.write(Decision(request_id, kind, arguments, text, "ui", time.time()))
        except BadDecision as exc:
            raise DecisionRefused(400, str(exc)) from None
        except AlreadyDecided as exc:
            raise DecisionRefused(409, str(exc)) from None
        # A cancel or a timeout committed between our look and our write: the row is
        # marked stale (``settle``) and the person told, never "written".
        with open_store(self.db, read_only=True) as store:
            mark = settle(store, table, request)
        message = closed_message(mark)
        if message is not None:
            raise DecisionRefused(409, message)
        return {"request": request_id, "kind": kind, "written": True, "state": mark}

    def _decide_all(self, body: Any) -> dict[str, Any]:
        """ "Approve all" (a worker thread): grant each request ``body["requests"]``
        names (the open ones the page shows: never one asked after the person
        looked) that is still an open approval request, in one transaction, as
        ``fanfold approve --all`` does. Returns what became of each; DecisionRefused
        when none could be approved (then nothing was written)."""
        ids = body.get("requests") if isinstance(body, dict) else None
        if (
            not isinstance(ids, list)
            or not ids
            or len(ids) > MAX_APPROVE_ALL
            or not all(isinstance(i, str) for i in ids)
        ):
            raise DecisionRefused(
                400, f"approve all names its requests: a list of 1 to {MAX_APPROVE_ALL} ids"
            )
        if isinstance(self.db, str) and "://" in self.db:
            raise DecisionRefused(400, "decisions from the web page need an SQLite log for now")
        chosen: list[PendingRequest] = []
        not_open: list[str] = []
        with open_store(self.db, read_only=True) as store:
            for request_id in dict.fromkeys(ids):
                split = split_request_id(request_id)
                try:
                    state = None if split is None else store.load_state(split[0])
                except UnknownConversation:
                    state = None
                request = None if state is None else open_request(state)
                if request is None or request.id != request_id or request.is_question:
                    not_open.append(request_id)  # closed, unknown, or a question
                else:
                    chosen.append(request)
        if not chosen:
            raise DecisionRefused(404, "none of these is an open request for approval")
        now = time.time()
        table = FileDecisions(self.db)
        taken = table.write_many([Decision(r.id, GRANT, None, "", "ui", now) for r in chosen])
        written = [r for r in chosen if r.id not in taken]
        closed: dict[str, str] = {}
        with open_store(self.db, read_only=True) as store:
            for request in written:
                message = closed_message(settle(store, table, request))
                if message is not None:
                    closed[request.id] = message
        return {
            "approved": [r.id for r in written if r.id not in closed],
            "closed": closed,
            "decided_already": taken,
            "not_open": not_open,
        }

    def _version(self, tree: str | None) -> Any:
        def version(store: Store) -> Any:
            if tree is None:
                # The roots, and every conversation still running (a root waiting for
                # its sub-agents has no events of its own while they work).
                roots = [(r.id, r.updated_at, r.status.value) for r in store.list_roots()]
                return roots, [(r.id, r.last_seq) for r in store.unfinished()]
            rows = store.tree(tree)
            # And the progress of its tool calls in flight (a side table, no step):
            # a new report shows without waiting for the next step.
            progress = store.progress_of([r.id for r in rows])
            return [(r.id, r.last_seq, r.status.value) for r in rows], sorted(
                (key, p.reports) for key, p in progress.items()
            )

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
        refused = self._refusal(scope)
        if refused is not None:
            await self._plain(send, 403, refused)
            return
        path = scope["path"]  # ASGI gives it percent-decoded
        if scope["method"] == "POST" and (path in _DECIDE or path == APPROVE_ALL):
            await self._post(scope, _DECIDE.get(path, APPROVE_ALL), receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            await self._plain(send, 405, "only GET is served (and POST of a decision)")
            return
        query = self._query_token(scope)
        if query is not None:
            # The token from the printed URL goes into the cookie. A page is sent again
            # without it (303), so it stays out of the address bar and the history; the
            # JSON and the event stream answer at once (a script need not follow).
            cookie = self._cookie_header(scope)
            if not (path.startswith("/api/") or path == "/events" or path.startswith("/events/")):
                # One leading slash: "//host" would send the browser elsewhere. The
                # query's other parameters (``vs``) go on; the token does not.
                kept = urlencode([(k, v) for k, v in _query(scope) if k != "token"])
                where = "/" + quote(path.lstrip("/")) + ("?" + kept if kept else "")
                await self._redirect(send, where, cookie)
                return
            send = _with_header(send, cookie)
        vs = next((v for k, v in reversed(_query(scope)) if k == "vs"), None)
        try:
            await self._route(path, vs, receive, send)
        except UnknownConversation as exc:
            await self._plain(send, 404, str(exc))
        except DatabaseError as exc:
            await self._plain(send, 500, str(exc))

    async def _post(self, scope: Scope, kind: str, receive: Receive, send: Send) -> None:
        """A decision from the page: checked as every request is (``_refusal``), then
        a same-origin ``Origin`` and a JSON body are required (CSRF: a form sends
        neither; a cross-site script cannot send JSON without a preflight)."""
        headers = _headers(scope)
        origins = headers.get("origin", [])
        if len(origins) != 1:
            await self._plain(send, 403, "refused: a decision must come from this server's page")
            return
        types = headers.get("content-type", [])
        if len(types) != 1 or types[0].split(";")[0].strip().lower() != "application/json":
            await self._plain(send, 415, "a decision is sent as application/json")
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > _MAX_BODY:
                await self._plain(send, 413, "a decision's body is too large")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        try:
            body = json.loads(b"".join(chunks).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            await self._plain(send, 400, "a decision is a JSON object")
            return
        try:
            decide = self._decide_all if kind == APPROVE_ALL else partial(self._decide, kind)
            answer = await trio.to_thread.run_sync(decide, body)
        except DecisionRefused as exc:
            await self._plain(send, exc.status, str(exc))
            return
        except DatabaseError as exc:
            await self._plain(send, 500, str(exc))
            return
        await self._answer(send, 200, "application/json", _json_bytes(answer))

    # ------------------------------------------------------------------ access

    def _refusal(self, scope: Scope) -> str | None:
        """Why this request is refused (one line for a 403), or None: a ``Host`` that
        is not this server's, a cross-site request, or no valid token."""
        headers = _headers(scope)
        server = scope.get("server")
        port = server[1] if server else None
        if not single_host_names_this_server(headers.get("host", []), server, self.hosts):
            return "refused: the Host header does not name this server"
        # A browser says where a request comes from: "same-origin" for the pages' own
        # fetches and event streams, "none" for an address typed or opened from the
        # terminal. "same-site" is refused too: another server on localhost is that.
        if any(s not in ("same-origin", "none") for s in headers.get("sec-fetch-site", [])):
            return "refused: a cross-site request"
        for origin in headers.get("origin", []):
            scheme, _, authority = origin.partition("://")
            if scheme != "http" or not self._our_host(authority, scope):
                return "refused: a cross-site request"
        given = self._query_token(scope) or self._cookie_token(headers, port)
        if given is None or not hmac.compare_digest(
            given.encode("utf-8", "replace"), self.token.encode()
        ):
            return "refused: open the URL with the token that fanfold ui printed"
        return None

    def _our_host(self, host: str, scope: Scope) -> bool:
        return names_this_server(host, scope.get("server"), self.hosts)

    def _query_token(self, scope: Scope) -> str | None:
        values = [v for k, v in _query(scope) if k == "token"]
        return values[-1] if values else None

    def _cookie_name(self, port: int | None) -> str:
        # Cookies ignore ports: two servers on one machine must not overwrite each
        # other's token.
        return f"fanfold-ui-{port or 0}"

    def _cookie_token(self, headers: dict[str, list[str]], port: int | None) -> str | None:
        name = self._cookie_name(port)
        found = None
        for header in headers.get("cookie", []):
            for part in header.split(";"):
                key, sep, value = part.strip().partition("=")
                if sep and key == name:
                    found = value
        return found

    def _cookie_header(self, scope: Scope) -> tuple[bytes, bytes]:
        server = scope.get("server")
        name = self._cookie_name(server[1] if server else None)
        value = f"{name}={self.token}; Path=/; HttpOnly; SameSite=Strict"
        return b"set-cookie", value.encode()

    async def _redirect(self, send: Send, location: str, cookie: tuple[bytes, bytes]) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [
                    (b"location", location.encode("ascii")),
                    (b"content-length", b"0"),
                    (b"cache-control", b"no-store"),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    cookie,
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    # ------------------------------------------------------------------ routes

    async def _route(self, path: str, vs: str | None, receive: Receive, send: Send) -> None:
        if path == "/":
            rows = await self.read(self._summaries)
            page = render_page(
                "fanfold trees",
                "list.js",
                {"trees-data": {"db": str(self.db), "trees": rows}},
                _LIST_BODY,
                live=True,
            )
            await self._answer(send, 200, "text/html; charset=utf-8", page.encode())
        elif path == "/api/trees":
            rows = await self.read(self._summaries)
            await self._answer(send, 200, "application/json", _json_bytes(rows))
        elif path.startswith("/trace/"):
            tree = path.removeprefix("/trace/")
            data = await self.read(lambda store: build_trace(store, tree, vs=vs))
            safe = quote(tree, safe="")
            also = "?" + urlencode({"vs": vs}) if vs is not None else ""
            live = {"events": f"/events/{safe}", "data": f"/api/trace/{safe}{also}"}
            page = render_html(data, live=live)
            await self._answer(send, 200, "text/html; charset=utf-8", page.encode())
        elif path.startswith("/api/trace/"):
            tree = path.removeprefix("/api/trace/")
            data = await self.read(lambda store: build_trace(store, tree, vs=vs))
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


def _decided(db: Path | str, request: str) -> bool:
    """Whether the log's decisions table has a row for ``request`` (read only: a log
    without the table has none)."""
    uri = Path(db).resolve().as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=30)
    except sqlite3.Error:
        return False
    try:
        row = conn.execute("SELECT 1 FROM decisions WHERE request = ?", (request,)).fetchone()
    except sqlite3.Error:
        return False
    finally:
        conn.close()
    return row is not None


def _query(scope: Scope) -> list[tuple[str, str]]:
    """The request's query parameters, in order."""
    raw: bytes = scope.get("query_string", b"")
    return parse_qsl(raw.decode("latin-1"))


def _headers(scope: Scope) -> dict[str, list[str]]:
    """The request's headers by lower-case name (ASGI gives them lower-cased)."""
    found: dict[str, list[str]] = {}
    for name, value in scope.get("headers", []):
        found.setdefault(name.decode("latin-1"), []).append(value.decode("latin-1"))
    return found


def _with_header(send: Send, header: tuple[bytes, bytes]) -> Send:
    """``send`` adding ``header`` to the response's start."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), header]}
        await send(message)

    return sending


def finite(value: float | None) -> float | None:
    """``value`` unless it is NaN or infinite (JSON cannot hold those)."""
    return value if value is not None and math.isfinite(value) else None
