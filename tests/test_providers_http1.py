"""The HTTP providers' own HTTP/1.1 path (``fanfold.providers.http1``, issue 36) over real
loopback sockets: kept-alive connections reused, a connection the server closed
replaced, a request the server dropped on a reused connection sent again on a fresh
one, chunked and gzip bodies, TLS with a test CA (and certificates checked), a cancel
mid-stream closing its connection, a queue in front of the pool that never counts
against the connect timeout, and httpx serving a proxy from the environment."""

from __future__ import annotations

import datetime
import gzip
import ipaddress
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fakeserver import Drop, FakeServer, Sse, openai_completion, openai_stream

from fanfold.providers.anthropic import AnthropicProvider
from fanfold.providers.base import CallContext, ProviderError, StreamProgress
from fanfold.providers.http import Timeouts
from fanfold.providers.http1 import ConnectionPool, ResponseReader
from fanfold.providers.openai import OpenAIProvider
from fanfold.statemachine import ErrorKind, ModelRequest
from fanfold.statemachine.messages import UserMessage

REQUEST = ModelRequest("Be brief.", (UserMessage("hi"),), ())
TIMEOUTS = Timeouts(connect=2.0, read=2.0)


def context(on_progress: Any = None) -> CallContext:
    return CallContext("c", "c", "root", 0, None, 1, on_progress=on_progress)


def openai(url: str, pool: ConnectionPool, *, stream: bool = True) -> OpenAIProvider:
    return OpenAIProvider(
        base_url=url + "/v1", model="m", stream=stream, timeouts=TIMEOUTS, pool=pool
    )


@pytest.fixture(autouse=True)
def no_proxy_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy named in the environment sends the calls through httpx (see the last
    # test): these tests are about the providers' own path.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


# ------------------------------------------------------------------ keep-alive


async def test_calls_share_one_kept_alive_connection(server: FakeServer) -> None:
    for stream in (True, True, False, True, False):
        server.enqueue(openai_stream("ok") if stream else openai_completion("ok"))
    pool = ConnectionPool()
    provider = openai(server.url, pool)
    for stream in (True, True, False, True, False):
        provider.stream = stream
        assert (await provider.complete(REQUEST, context())).text == "ok"
    await pool.aclose()
    assert pool.connects == 1
    assert len({request.peer for request in server.requests}) == 1
    streamed = [r.headers["accept"] for r in server.requests]
    assert streamed == ["text/event-stream"] * 2 + ["application/json"] + [
        "text/event-stream",
        "application/json",
    ]


async def test_a_request_dropped_on_a_reused_connection_goes_again_on_a_fresh_one(
    server: FakeServer,
) -> None:
    """The server closes a kept-alive connection as the next request arrives (it read
    it, answered nothing): the call is sent once more on a new connection."""
    server.enqueue(openai_stream("one"), Drop(), openai_stream("two"))
    pool = ConnectionPool()
    provider = openai(server.url, pool)
    assert (await provider.complete(REQUEST, context())).text == "one"
    assert (await provider.complete(REQUEST, context())).text == "two"
    await pool.aclose()
    peers = [request.peer for request in server.requests]
    assert len(peers) == 3 and peers[0] == peers[1] != peers[2]
    assert pool.connects == 2


async def test_a_request_dropped_on_a_fresh_connection_is_a_network_error(
    server: FakeServer,
) -> None:
    server.enqueue(Drop(), openai_stream("not sent"))
    pool = ConnectionPool()
    with pytest.raises(ProviderError) as caught:
        await openai(server.url, pool).complete(REQUEST, context())
    assert caught.value.error.kind is ErrorKind.NETWORK
    assert len(server.requests) == 1  # never sent twice


async def test_a_request_larger_than_the_socket_buffer_is_sent_whole(server: FakeServer) -> None:
    """The request goes out in several writes (each waits for the socket to drain)."""
    big = "x" * (16 * 1024 * 1024)
    server.enqueue(openai_stream("read it"))
    pool = ConnectionPool()
    request = ModelRequest("Be brief.", (UserMessage(big),), ())
    assert (await openai(server.url, pool).complete(request, context())).text == "read it"
    await pool.aclose()
    assert server.requests[0].json["messages"][-1]["content"] == big


class RawServer:
    """Answers each request on a connection with the next of ``replies`` (whole HTTP
    responses), closing the connection after each when ``close`` is set."""

    def __init__(self, replies: list[bytes], *, close: bool = False) -> None:
        self.replies = list(replies)
        self.close = close
        self.connections = 0
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while self.replies:
                while b"\r\n\r\n" not in data:
                    more = conn.recv(65536)
                    if not more:
                        return
                    data += more
                head, _, data = data.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(data) < length:
                    data += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + data[:length])
                data = data[length:]
                conn.sendall(self.replies.pop(0))
                if self.close:
                    return

    def shut(self) -> None:
        self.sock.close()


def _json_reply(body: bytes, headers: bytes = b"", chunks: int = 0) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + headers
    if not chunks:
        return head + b"content-length: %d\r\n\r\n" % len(body) + body
    size = len(body) // chunks + 1
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts)
    return head + b"transfer-encoding: chunked\r\n\r\n" + framed + b"0\r\n\r\n"


COMPLETION = json.dumps(openai_completion("hello there").body).encode()


async def test_a_kept_alive_connection_the_server_closed_is_replaced() -> None:
    raw = RawServer([_json_reply(COMPLETION)] * 2, close=True)
    pool = ConnectionPool()
    provider = openai(raw.url, pool, stream=False)
    try:
        assert (await provider.complete(REQUEST, context())).text == "hello there"
        await trio.sleep(0.2)  # the server's FIN arrives
        assert (await provider.complete(REQUEST, context())).text == "hello there"
    finally:
        raw.shut()
        await pool.aclose()
    assert raw.connections == 2 and len(raw.requests) == 2
    assert pool.connects == 2


async def test_a_reply_sent_before_the_request_was_read_is_the_error() -> None:
    """A server answers 413 after the request's head and closes without reading its
    body: the write fails, and the reply that came is the call's error (as httpx's)."""
    error = json.dumps({"error": {"message": "too large", "type": "invalid_request_error"}})
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(error), error.encode())
            )
            time.sleep(0.3)  # then closes with the body unread

    threading.Thread(target=serve, daemon=True).start()
    pool = ConnectionPool()
    provider = openai(f"http://127.0.0.1:{listener.getsockname()[1]}", pool, stream=False)
    request = ModelRequest("", (UserMessage("x" * 16_000_000),), ())
    try:
        with pytest.raises(ProviderError) as caught:
            await provider.complete(request, context())
    finally:
        listener.close()
        await pool.aclose()
    assert "HTTP 413" in caught.value.error.message and "too large" in caught.value.error.message


async def test_a_reply_cut_inside_a_chunk_size_line_fails_at_once() -> None:
    raw = RawServer(
        [
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n5"
        ],
        close=True,
    )
    pool = ConnectionPool()
    try:
        with trio.fail_after(5):
            with pytest.raises(ProviderError) as caught:
                await openai(raw.url, pool, stream=False).complete(REQUEST, context())
    finally:
        raw.shut()
        await pool.aclose()
    assert caught.value.error.kind is ErrorKind.NETWORK


@pytest.mark.parametrize("encoding", ["identity", "gzip"])
async def test_a_chunked_whole_reply_is_read(encoding: str) -> None:
    body = COMPLETION if encoding == "identity" else gzip.compress(COMPLETION)
    headers = b"" if encoding == "identity" else b"content-encoding: gzip\r\n"
    raw = RawServer([_json_reply(body, headers, chunks=3)] * 2)
    pool = ConnectionPool()
    provider = openai(raw.url, pool, stream=False)
    try:
        for _ in range(2):
            assert (await provider.complete(REQUEST, context())).text == "hello there"
    finally:
        raw.shut()
        await pool.aclose()
    assert raw.connections == 1  # the chunked body read to its end: reused
    assert b"accept-encoding: gzip, deflate" in raw.requests[0]


# ------------------------------------------------------------------ cancellation


async def test_a_call_cancelled_mid_stream_closes_its_connection(server: FakeServer) -> None:
    slow = openai_stream("a long answer in many pieces", piece=2)
    server.enqueue(Sse(slow.body, delay=0.2), openai_stream("next"))
    pool = ConnectionPool()
    provider = openai(server.url, pool)
    with trio.CancelScope() as scope:

        def cancel(progress: StreamProgress) -> None:
            scope.cancel()

        await provider.complete(REQUEST, context(on_progress=cancel))
    assert scope.cancelled_caught
    assert pool._idle_count == 0  # nothing half-read kept
    assert (await provider.complete(REQUEST, context())).text == "next"
    await pool.aclose()
    assert pool.connects == 2
    assert server.requests[0].peer != server.requests[1].peer


async def test_calls_queued_for_the_pool_never_hit_the_connect_timeout(
    server: FakeServer,
) -> None:
    for _ in range(6):
        slow = openai_stream(text="ok", piece=1)
        server.enqueue(Sse(slow.body, chunk_size=len(slow.body) // 2 + 1, delay=0.5))
    pool = ConnectionPool()
    pool.slots.total_tokens = 2
    provider = OpenAIProvider(
        base_url=server.url + "/v1",
        model="m",
        timeouts=Timeouts(connect=0.2, read=5.0),
        pool=pool,
    )
    replies: list[str] = []

    async def one() -> None:
        replies.append((await provider.complete(REQUEST, context())).text)

    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(one)
    await pool.aclose()
    assert replies == ["ok"] * 6
    assert pool.connects == 2


# ------------------------------------------------------------------ TLS


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A test CA, and a certificate it signed for 127.0.0.1 and localhost."""
    now = datetime.datetime.now(datetime.UTC)

    def name(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("fanfold test CA"))
        .issuer_name(name("fanfold test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_file, cert_file, key_file = (directory / n for n in ("ca.pem", "cert.pem", "key.pem"))
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_file, cert_file, key_file


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[FakeServer, Path]]:
    ca_file, cert_file, key_file = _certificates(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    fake = FakeServer()
    server = fake._server  # the test wraps its socket in TLS
    server.socket = context.wrap_socket(server.socket, server_side=True)
    with fake:
        yield fake, ca_file


@pytest.mark.parametrize("stream", [True, False])
async def test_tls_with_a_trusted_ca_streams_and_reuses_the_connection(
    tls_server: tuple[FakeServer, Path], stream: bool
) -> None:
    server, ca_file = tls_server
    for _ in range(2):
        server.enqueue(openai_stream("secure") if stream else openai_completion("secure"))
    pool = ConnectionPool(ssl.create_default_context(cafile=str(ca_file)))
    url = server.url.replace("http://127.0.0.1", "https://localhost")
    provider = OpenAIProvider(
        base_url=url + "/v1", model="m", stream=stream, timeouts=TIMEOUTS, pool=pool
    )
    for _ in range(2):
        assert (await provider.complete(REQUEST, context())).text == "secure"
    await pool.aclose()
    assert pool.connects == 1
    assert server.requests[0].headers["host"] == url.removeprefix("https://")


async def test_tls_certificates_are_checked_by_default(
    tls_server: tuple[FakeServer, Path],
) -> None:
    server, _ = tls_server
    server.enqueue(openai_stream("never"))
    url = server.url.replace("http://", "https://")
    provider = AnthropicProvider(base_url=url, model="m", timeouts=TIMEOUTS)
    async with provider:
        with pytest.raises(ProviderError) as caught:
            await provider.complete(REQUEST, context())
    assert caught.value.error.kind is ErrorKind.NETWORK
    assert "CERTIFICATE_VERIFY_FAILED" in caught.value.error.message
    assert server.requests == []


# ------------------------------------------------------------------ httpx where the own path cannot


async def test_a_proxy_in_the_environment_is_used(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", server.url)
    server.enqueue(openai_stream("via the proxy"))
    provider = OpenAIProvider(base_url="http://model.invalid/v1", model="m", timeouts=TIMEOUTS)
    async with provider:
        assert (await provider.complete(REQUEST, context())).text == "via the proxy"
    assert server.requests[0].path == "http://model.invalid/v1/chat/completions"


# ------------------------------------------------------------------ the response parser


def _read(
    data: bytes, *, split: int | None = None, eof: bool = False
) -> tuple[ResponseReader, bytes]:
    """``data`` fed whole (or in pieces of ``split`` bytes), head and body read."""
    reader = ResponseReader()
    pieces = [data] if split is None else [data[i : i + split] for i in range(0, len(data), split)]
    got_head = False
    body: list[bytes] = []
    done = False
    for piece in pieces:
        reader.feed(piece)
        if not got_head:
            got_head = reader.head()
        if got_head and not done:
            parts, done = reader.body()
            body.extend(parts)
    if eof:
        reader.feed(b"")
        if not got_head:
            got_head = reader.head()
        parts, done = reader.body()
        body.extend(parts)
    assert got_head and done
    return reader, b"".join(body)


CHUNKED = (
    b"HTTP/1.1 100 Continue\r\n\r\n"
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Folded: a\r\n  b\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
    b"5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\n"
)


@pytest.mark.parametrize("split", [None, 1, 2, 7])
def test_parser_reads_a_chunked_reply_however_it_is_cut(split: int | None) -> None:
    reader, body = _read(CHUNKED, split=split)
    assert reader.status == 200
    assert (b"content-type", b"text/event-stream") in reader.headers
    assert (b"x-folded", b"a b") in reader.headers
    assert body == b"hello 0123456789"
    assert reader.reusable


def test_parser_keep_alive_rules() -> None:
    whole = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    assert _read(whole)[0].reusable
    assert not _read(whole.replace(b"1.1", b"1.0"))[0].reusable
    assert not _read(whole.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))[0].reusable
    assert not _read(whole + b"junk")[0].reusable  # bytes nobody asked for
    to_close, body = _read(b"HTTP/1.1 200 OK\r\n\r\nuntil the end", eof=True)
    assert body == b"until the end" and not to_close.reusable
    assert _read(b"HTTP/1.1 204 No Content\r\n\r\n")[0].reusable


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nabc",  # cut body
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab",  # cut chunk
        b"HTTP/1.1 200 OK\r\ncontent-type: x",  # cut head
        b"",  # nothing at all
        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab",
        b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabXX0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nbad name: x\r\n\r\n",
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx: " + b"y" * 70000 + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5",  # cut in a size line
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r",  # cut in a CRLF
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\nx: y",  # cut in trailers
    ],
)
def test_parser_refuses_malformed_or_cut_replies(data: bytes) -> None:
    reader = ResponseReader()
    reader.feed(data)
    reader.feed(b"")
    with pytest.raises(httpx.RemoteProtocolError):
        assert reader.head()
        for _ in range(3):  # the connection ended: no more bytes will come
            assert not reader.body()[1]
