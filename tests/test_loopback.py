"""``fanfold ui`` and ``fanfold mcp --http`` answer the same ``Host`` headers: one
set of rules (``fanfold.loopback``), so that a DNS-rebinding page that one refuses
the other refuses too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from fanfold.serve.mcp_http import Guard
from fanfold.serve.ui_server import TraceServer

TOKEN = "t" * 32
PORT = 8123


def _scope(hosts: list[str], extra: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "GET",
        "path": "/mcp",
        "query_string": f"token={TOKEN}".encode(),
        "headers": [(b"host", h.encode()) for h in hosts] + extra,
        "server": ("127.0.0.1", PORT),
    }


def _mcp_answers(hosts: list[str]) -> bool:
    reached: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(True)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        pass

    guard = Guard(app, TOKEN)
    scope = _scope(hosts, [(b"authorization", f"Bearer {TOKEN}".encode())])
    trio.run(guard, scope, receive, send)
    return bool(reached)


def _ui_answers(hosts: list[str], tmp_path: Path) -> bool:
    server = TraceServer(tmp_path / "x.db", token=TOKEN)
    return server._refusal(_scope(hosts, [])) is None


@pytest.mark.parametrize(
    ("hosts", "answered"),
    [
        ([f"127.0.0.1:{PORT}"], True),
        ([f"localhost:{PORT}"], True),
        ([f"LOCALHOST:{PORT}"], True),  # host names are case-insensitive
        ([f"[::0001]:{PORT}"], True),  # ::1, written another way
        ([f"evil.example:{PORT}"], False),
        ([f"127.0.0.1:{PORT + 1}"], False),
        ([], False),
        # Two Host headers: refused, whichever of them a framework would read
        # (`fanfold mcp --http` read the last one).
        ([f"evil.example:{PORT}", f"127.0.0.1:{PORT}"], False),
        ([f"127.0.0.1:{PORT}", f"evil.example:{PORT}"], False),
    ],
)
def test_ui_and_mcp_http_answer_the_same_host_headers(
    hosts: list[str], answered: bool, tmp_path: Path
) -> None:
    assert _ui_answers(hosts, tmp_path) is answered
    assert _mcp_answers(hosts) is answered
