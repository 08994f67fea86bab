"""A loopback model server for ``bench/http_provider.py``: OpenAI Chat Completions
(``/v1/chat/completions``) and Anthropic Messages (``/v1/messages``), streaming or not.

The root (its first user message is "fan out") gets one ``spawn_agents`` call of N
tasks. Every other request is held open until the server ends (``hold``) or answered
after ``--child-latency`` seconds with ``submit_result``. Runs in its own process, so its
CPU and heap are not counted. Each reply goes out in one write with TCP_NODELAY: a
reply's headers and body in two writes under Nagle wait ~40 ms for the client's delayed
ACK (Python's ``http.server`` does this by default; see bench/README.md, issue 36).

Usage: python bench/http_hold_server.py PORT N [--child-latency S]
"""

from __future__ import annotations

import http.server
import json
import socket
import sys
import threading
import time
from typing import Any

PORT = int(sys.argv[1])
N = int(sys.argv[2])
LATENCY = float(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--child-latency" else None
HELD = 0
LOCK = threading.Lock()
SPAWN = {"tasks": [{"task": f"task {i}"} for i in range(N)]}
SUBMIT = {"result": "done"}


def _first_user_text(messages: list[Any]) -> str:
    for message in messages:
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return "".join(b.get("text", "") for b in content if isinstance(b, dict))
            return str(content)
    return ""


def _openai(call: dict[str, Any] | None, text: str | None, stream: bool) -> tuple[str, bytes]:
    usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    calls = [call] if call else []
    finish = "tool_calls" if calls else "stop"
    message = {"role": "assistant", "content": text, "tool_calls": calls or None}
    if not stream:
        body = {
            "id": "x",
            "object": "chat.completion",
            "model": "m",
            "usage": usage,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
        return "application/json", json.dumps(body).encode()
    delta = dict(message, tool_calls=[dict(c, index=i) for i, c in enumerate(calls)] or None)
    chunks = [
        {
            "id": "x",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        },
        {
            "id": "x",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
            "usage": usage,
        },
    ]
    data = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return "text/event-stream", data.encode()


def _anthropic(call: dict[str, Any] | None, text: str | None, stream: bool) -> tuple[str, bytes]:
    usage = {"input_tokens": 10, "output_tokens": 2}
    if call:
        block: dict[str, Any] = {
            "type": "tool_use",
            "id": call["id"],
            "name": call["name"],
            "input": call["input"],
        }
        stop = "tool_use"
    else:
        block = {"type": "text", "text": text or ""}
        stop = "end_turn"
    if not stream:
        body = {
            "id": "msg",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "content": [block],
            "stop_reason": stop,
            "usage": usage,
        }
        return "application/json", json.dumps(body).encode()
    start = dict(block, input={}) if call else dict(block, text="")
    events = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg",
                    "type": "message",
                    "role": "assistant",
                    "model": "m",
                    "content": [],
                    "stop_reason": None,
                    "usage": {"input_tokens": 10, "output_tokens": 0},
                },
            },
        ),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": start},
        ),
    ]
    if call:
        delta = {"type": "input_json_delta", "partial_json": json.dumps(call["input"])}
    else:
        delta = {"type": "text_delta", "text": text or ""}
    events += [
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop},
                "usage": {"output_tokens": 2},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    data = "".join(f"event: {name}\ndata: {json.dumps(e)}\n\n" for name, e in events)
    return "text/event-stream", data.encode()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:  # /held: how many requests are held now
        data = str(HELD).encode()
        self._send("text/plain", data)

    def do_POST(self) -> None:
        global HELD
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        messages = body.get("messages", [])
        anthropic = self.path.endswith("/messages")
        stream = bool(body.get("stream"))
        answered = any(m.get("role") == "tool" for m in messages) or any(
            isinstance(m.get("content"), list)
            and any(b.get("type") == "tool_result" for b in m["content"] if isinstance(b, dict))
            for m in messages
        )
        if _first_user_text(messages) == "fan out":
            spawn = {"name": "spawn_agents", "args": SPAWN}
            call, text = (None, "all done") if answered else (spawn, None)
        else:
            if LATENCY is None:
                with LOCK:
                    HELD += 1
                while True:
                    time.sleep(3600)
            time.sleep(LATENCY)
            call, text = {"name": "submit_result", "args": SUBMIT}, None
        wire: dict[str, Any] | None = None
        if call is not None:
            cid = f"c{time.monotonic_ns()}"
            if anthropic:
                wire = {"id": cid, "name": call["name"], "input": call["args"]}
            else:
                wire = {
                    "id": cid,
                    "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call["args"])},
                }
        kind, data = (_anthropic if anthropic else _openai)(wire, text, stream)
        self._send(kind, data)

    def _send(self, kind: str, data: bytes) -> None:
        head = (
            f"HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {len(data)}\r\n\r\n"
        ).encode()
        self.wfile.write(head + data)

    def log_message(self, *args: object) -> None:
        pass


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 4096
    address_family = socket.AF_INET


Server(("127.0.0.1", PORT), Handler).serve_forever()
