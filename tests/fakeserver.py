"""A scriptable HTTP server on loopback, for provider and end-to-end tests.

Real sockets, real HTTP/1.1 (keep-alive, chunked streams), no network beyond
127.0.0.1. It runs in background threads, so Trio tests can call it with the real
httpx providers::

    from fakeserver import FakeServer, openai_completion

    with FakeServer() as server:
        server.enqueue(openai_completion(text="hello"))
        provider = OpenAIProvider(base_url=server.url + "/v1", model="m")
        reply = await provider.complete(request, context)
        assert server.requests[0].json["model"] == "m"

As a pytest fixture::

    @pytest.fixture
    def fake_server() -> Iterator[FakeServer]:
        with FakeServer() as server:
            yield server

Choosing the reply to a request
-------------------------------
1. Rules, in the order added by ``server.when(match, *replies, repeat=False)``: the
   first rule whose ``match`` accepts the request and still has replies answers with
   its next reply (with ``repeat=True`` its last reply answers forever).
   ``match`` is a ``str`` (a substring of the raw request body) or a predicate
   ``(RecordedRequest) -> bool``; helpers: ``path_is``, ``last_message_contains``,
   ``first_user_contains``, ``system_contains``.
2. Else the next reply of the FIFO queue filled by ``server.enqueue(*replies)``.
3. Else HTTP 400 ``{"error": {"message": "fakeserver: no scripted reply ..."}}``,
   which the providers classify as a fatal INVALID_REQUEST; the request is also kept
   in ``server.unmatched`` so a test can assert it is empty.

Every request is recorded in ``server.requests`` (``RecordedRequest``: method, path,
lower-cased headers, raw body, ``json``, ``text``), whatever it was answered with.

Replies
-------
- ``Json(body, status=200, headers={})``: a JSON body with Content-Length.
- ``Raw(body, status=200, content_type="text/plain", headers={})``: any bytes.
- ``Sse(body, status=200, headers={}, chunk_size=None, delay=0.0, cut_after=None,
  then="end")``: a ``text/event-stream`` body sent with chunked encoding, one chunk per
  event (or per ``chunk_size`` bytes), ``delay`` seconds apart. ``cut_after`` sends only
  that many bytes; ``then`` says how the body ends: ``"end"`` (properly), ``"drop"``
  (the socket is closed mid-body: the client sees a protocol error), ``"stall"`` (no
  more bytes until the server closes: the client's read timeout fires).
- ``Drop()``: read the request, close the connection without any response.
- ``Stall(seconds=None)``: read the request, send nothing (until the server closes).

Builders for realistic bodies: ``openai_completion``, ``openai_stream``,
``anthropic_message``, ``anthropic_stream``, ``openai_error``, ``anthropic_error``,
``sse_file`` (a recorded ``.sse`` fixture).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import attrs

from fanfold.statemachine import ToolCall

# ------------------------------------------------------------------ requests


@attrs.frozen
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    peer: tuple[str, int] = ("", 0)  # the client's address: one per connection

    @property
    def text(self) -> str:
        """The body as text."""
        return self.body.decode("utf-8", errors="replace")

    @property
    def json(self) -> Any:
        """The body parsed as JSON (None if it is not JSON)."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None


Match = str | Callable[[RecordedRequest], bool]


def path_is(path: str) -> Callable[[RecordedRequest], bool]:
    """Matches requests to ``path`` (query string ignored)."""
    return lambda request: request.path.split("?")[0] == path


def _messages(request: RecordedRequest) -> list[Any]:
    body = request.json
    messages = body.get("messages") if isinstance(body, dict) else None
    return messages if isinstance(messages, list) else []


def last_message_contains(text: str) -> Callable[[RecordedRequest], bool]:
    """Matches requests whose last message (any API) contains ``text``."""

    def match(request: RecordedRequest) -> bool:
        messages = _messages(request)
        return bool(messages) and text in json.dumps(messages[-1], ensure_ascii=False)

    return match


def first_user_contains(text: str) -> Callable[[RecordedRequest], bool]:
    """Matches requests whose first user message contains ``text`` (e.g. a sub-agent's
    task, which stays first in all its calls)."""

    def match(request: RecordedRequest) -> bool:
        for message in _messages(request):
            if isinstance(message, dict) and message.get("role") == "user":
                return text in json.dumps(message, ensure_ascii=False)
        return False

    return match


def system_contains(text: str) -> Callable[[RecordedRequest], bool]:
    """Matches requests whose system prompt (OpenAI system message or Anthropic
    ``system``) contains ``text``."""

    def match(request: RecordedRequest) -> bool:
        body = request.json
        if not isinstance(body, dict):
            return False
        if isinstance(body.get("system"), str) and text in body["system"]:
            return True
        return any(
            isinstance(m, dict) and m.get("role") == "system" and text in str(m.get("content"))
            for m in _messages(request)
        )

    return match


# ------------------------------------------------------------------ replies


@attrs.frozen
class Json:
    """A JSON reply."""

    body: Any
    status: int = 200
    headers: Mapping[str, str] = attrs.Factory(dict)


@attrs.frozen
class Raw:
    """Any bytes as the reply body."""

    body: bytes
    status: int = 200
    content_type: str = "text/plain"
    headers: Mapping[str, str] = attrs.Factory(dict)


@attrs.frozen
class Sse:
    """A server-sent-events stream (see the module docstring)."""

    body: str | bytes
    status: int = 200
    headers: Mapping[str, str] = attrs.Factory(dict)
    chunk_size: int | None = None
    delay: float = 0.0
    cut_after: int | None = None
    then: Literal["end", "drop", "stall"] = "end"


@attrs.frozen
class Drop:
    """Close the connection without answering."""


@attrs.frozen
class Stall:
    """Answer nothing for ``seconds`` (None: until the server closes)."""

    seconds: float | None = None


Reply = Json | Raw | Sse | Drop | Stall


@attrs.define
class _Rule:
    match: Match
    replies: deque[Reply]
    repeat: bool

    def accepts(self, request: RecordedRequest) -> bool:
        if not self.replies:
            return False
        if isinstance(self.match, str):
            return self.match in request.text
        return self.match(request)

    def take(self) -> Reply:
        if self.repeat and len(self.replies) == 1:
            return self.replies[0]
        return self.replies.popleft()


# ------------------------------------------------------------------ server


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    fake: FakeServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that time out or close early are part of the tests; stay quiet.
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30.0  # idle keep-alive connections end by themselves
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Send each write at once: Nagle + delayed ACKs would add ~40 ms per reply.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self._serve()

    def do_GET(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {key.lower(): value for key, value in self.headers.items()}
        peer = (str(self.client_address[0]), int(self.client_address[1]))
        request = RecordedRequest(self.command, self.path, headers, body, peer)
        fake = self.server.fake
        reply = fake._next_reply(request)
        match reply:
            case Json():
                data = json.dumps(reply.body).encode()
                self._head(reply.status, "application/json", reply.headers, len(data))
                self.wfile.write(data)
            case Raw():
                self._head(reply.status, reply.content_type, reply.headers, len(reply.body))
                self.wfile.write(reply.body)
            case Sse():
                self._stream(reply)
            case Drop():
                self._drop()
            case Stall():
                fake._closing.wait(reply.seconds)
                self.close_connection = True

    def _head(
        self, status: int, content_type: str, headers: Mapping[str, str], length: int | None
    ) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        for key, value in headers.items():
            self.send_header(key, value)
        if length is None:
            self.send_header("transfer-encoding", "chunked")
        else:
            self.send_header("content-length", str(length))
        self.end_headers()

    def _stream(self, reply: Sse) -> None:
        data = reply.body.encode() if isinstance(reply.body, str) else reply.body
        if reply.cut_after is not None:
            data = data[: reply.cut_after]
        self._head(reply.status, "text/event-stream", reply.headers, None)
        for i, chunk in enumerate(_chunks(data, reply.chunk_size)):
            if i and reply.delay:
                time.sleep(reply.delay)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        if reply.then == "end":
            self.wfile.write(b"0\r\n\r\n")
        elif reply.then == "drop":
            self._drop()
        else:
            self.server.fake._closing.wait()
            self.close_connection = True

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.connection.close()


def _chunks(data: bytes, size: int | None) -> Iterator[bytes]:
    if size is None:
        # One chunk per event, as real servers flush them.
        parts = data.split(b"\n\n")
        for i, part in enumerate(parts):
            chunk = part + (b"\n\n" if i < len(parts) - 1 else b"")
            if chunk:
                yield chunk
        return
    for start in range(0, len(data), size):
        yield data[start : start + size]


class FakeServer:
    """The scriptable loopback server; see the module docstring for the API."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._queue: deque[Reply] = deque()
        self._requests: list[RecordedRequest] = []
        self._unmatched: list[RecordedRequest] = []
        self._closing = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._started = False

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeServer:
        """Start serving (``with FakeServer()`` does this)."""
        if not self._started:
            self._started = True
            self._thread.start()
        return self

    def close(self) -> None:
        """Release stalled replies, stop serving and close the socket."""
        self._closing.set()
        if self._started:
            self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def enqueue(self, *replies: Reply) -> None:
        """Append replies to the FIFO queue used when no rule matches."""
        with self._lock:
            self._queue.extend(replies)

    def when(self, match: Match, *replies: Reply, repeat: bool = False) -> None:
        """Answer requests accepted by ``match`` with ``replies``, in order."""
        if not replies:
            raise ValueError("when() needs at least one reply")
        with self._lock:
            self._rules.append(_Rule(match, deque(replies), repeat))

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def unmatched(self) -> list[RecordedRequest]:
        """Requests that found no scripted reply (a copy)."""
        with self._lock:
            return list(self._unmatched)

    @property
    def pending(self) -> int:
        """Scripted replies not used yet (queue and non-repeating rules)."""
        with self._lock:
            rules = sum(len(rule.replies) for rule in self._rules if not rule.repeat)
            return len(self._queue) + rules

    def _next_reply(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self._requests.append(request)
            for rule in self._rules:
                if rule.accepts(request):
                    return rule.take()
            if self._queue:
                return self._queue.popleft()
            self._unmatched.append(request)
        message = f"fakeserver: no scripted reply for {request.method} {request.path}"
        return Json({"error": {"message": message, "type": "invalid_request_error"}}, 400)


# ------------------------------------------------------------------ builders


def sse_file(path: str | Path, **options: Any) -> Sse:
    """A recorded ``.sse`` body as a stream reply (``options`` go to ``Sse``)."""
    return Sse(Path(path).read_bytes(), **options)


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] if text else []


def _data(payload: Any) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def openai_completion(
    text: str = "",
    tool_calls: Sequence[ToolCall] = (),
    *,
    finish_reason: str | None = None,
    usage: tuple[int, int] = (10, 5),
    model: str = "fake-model",
) -> Json:
    """A non-streaming Chat Completions reply."""
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments_json},
            }
            for c in tool_calls
        ]
    return Json(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
                }
            ],
            "usage": {
                "prompt_tokens": usage[0],
                "completion_tokens": usage[1],
                "total_tokens": sum(usage),
            },
        }
    )


def openai_stream(
    text: str = "",
    tool_calls: Sequence[ToolCall] = (),
    *,
    finish_reason: str | None = None,
    usage: tuple[int, int] = (10, 5),
    model: str = "fake-model",
    piece: int = 4,
    **options: Any,
) -> Sse:
    """A Chat Completions stream shaped like OpenAI's: text and tool arguments in
    ``piece``-character deltas, then ``finish_reason``, a usage chunk and ``[DONE]``."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return _data(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": p}) for p in _pieces(text, piece)]
    for index, call in enumerate(tool_calls):
        first = {"index": index, "id": call.id, "type": "function"}
        out.append(
            chunk({"tool_calls": [{**first, "function": {"name": call.name, "arguments": ""}}]})
        )
        out += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]})
            for p in _pieces(call.arguments_json, piece)
        ]
    out.append(chunk({}, finish_reason or ("tool_calls" if tool_calls else "stop")))
    out.append(
        _data(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "model": model,
                "choices": [],
                "usage": {
                    "prompt_tokens": usage[0],
                    "completion_tokens": usage[1],
                    "total_tokens": sum(usage),
                },
            }
        )
    )
    out.append("data: [DONE]\n\n")
    return Sse("".join(out), **options)


def anthropic_message(
    text: str = "",
    tool_calls: Sequence[ToolCall] = (),
    *,
    stop_reason: str | None = None,
    usage: tuple[int, int] = (10, 5),
    model: str = "fake-model",
) -> Json:
    """A non-streaming Messages API reply."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": json.loads(c.arguments_json)}
        for c in tool_calls
    ]
    return Json(
        {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason or ("tool_use" if tool_calls else "end_turn"),
            "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
        }
    )


def anthropic_stream(
    text: str = "",
    tool_calls: Sequence[ToolCall] = (),
    *,
    stop_reason: str | None = None,
    usage: tuple[int, int] = (10, 5),
    model: str = "fake-model",
    piece: int = 4,
    **options: Any,
) -> Sse:
    """A Messages API stream shaped like Anthropic's (with ``event:`` lines and a ping)."""

    def event(name: str, payload: dict[str, Any]) -> str:
        return f"event: {name}\ndata: {json.dumps({'type': name, **payload})}\n\n"

    out = [
        event(
            "message_start",
            {
                "message": {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": usage[0], "output_tokens": 1},
                }
            },
        ),
        event("ping", {}),
    ]
    index = 0
    if text:
        out.append(
            event(
                "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
            )
        )
        out += [
            event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": p}})
            for p in _pieces(text, piece)
        ]
        out.append(event("content_block_stop", {"index": 0}))
        index = 1
    for call in tool_calls:
        block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        out.append(event("content_block_start", {"index": index, "content_block": block}))
        out += [
            event(
                "content_block_delta",
                {"index": index, "delta": {"type": "input_json_delta", "partial_json": p}},
            )
            for p in ["", *_pieces(call.arguments_json, piece)]
        ]
        out.append(event("content_block_stop", {"index": index}))
        index += 1
    out.append(
        event(
            "message_delta",
            {
                "delta": {
                    "stop_reason": stop_reason or ("tool_use" if tool_calls else "end_turn"),
                    "stop_sequence": None,
                },
                "usage": {"output_tokens": usage[1]},
            },
        )
    )
    out.append(event("message_stop", {}))
    return Sse("".join(out), **options)


def openai_error(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Json:
    """An OpenAI-shaped error reply."""
    error = {"message": message, "type": type, "param": None, "code": code}
    return Json({"error": error}, status, dict(headers or {}))


def anthropic_error(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",
    headers: Mapping[str, str] | None = None,
) -> Json:
    """An Anthropic-shaped error reply."""
    body = {"type": "error", "error": {"type": type, "message": message}, "request_id": "req_fake"}
    return Json(body, status, dict(headers or {}))
