"""``fanfold mcp --http``: the MCP server over Streamable HTTP on a loopback port.

The SDK's Starlette application, served by Hypercorn's Trio worker (as ``fanfold ui``
is), behind ``Guard``: before anything else, every request must name this server in
its one ``Host`` (a loopback name with the port it arrived on, ``fanfold.loopback``'s
rules, ``fanfold ui``'s: a page whose name was rebound to 127.0.0.1 is refused) and carry the bearer
token (``Authorization: Bearer ...``, compared in constant time). A refusal is a 403
(foreign host) or a 401 (no or a wrong token) with one plain line. The server listens
on 127.0.0.1 only: delegation runs tools on this machine.
"""

from __future__ import annotations

import hmac
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

from fanfold.loopback import single_host_names_this_server

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PATH = "/mcp"


class Guard:
    """An ASGI middleware refusing foreign hosts and requests without the token."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan
            return
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", ())}
        # fanfold ui's rules, from one place: exactly one Host header, naming this
        # server (two Host headers are refused, whichever one a framework would read).
        hosts = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == b"host"]
        if not single_host_names_this_server(hosts, scope.get("server")):
            await _refuse(send, 403, "refused: the Host header does not name this server")
            return
        given = headers.get("authorization", b"")
        expected = b"Bearer " + self._token
        if not hmac.compare_digest(given, expected):
            await _refuse(send, 401, "refused: no or a wrong bearer token")
            return
        await self.app(scope, receive, send)


async def _refuse(send: Send, status: int, line: str) -> None:
    body = (line + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def serve_http(
    server: Any,
    port: int,
    token: str,
    *,
    show_token: bool,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``server`` (an SDK ``MCPServer``) on 127.0.0.1:``port`` until cancelled.
    Prints the endpoint (and the token when ``show_token``) to stderr."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    app = Guard(server.streamable_http_app(streamable_http_path=PATH), token)
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None  # the token travels in a header; nothing logs requests

    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(serve, app, config)
        for bind in binds:
            print(f"fanfold mcp: {bind}{PATH}", file=sys.stderr, flush=True)
        if show_token:
            print(f"bearer token: {token}", file=sys.stderr, flush=True)
        task_status.started(binds)
