"""Connections to an IP address literal on the providers' own HTTP/1.1 path (issue
36): one non-blocking ``connect``, not ``trio.open_tcp_stream``'s resolution and happy
eyeballs. Real loopback sockets: the connection carries the options Trio's streams set
(TCP_NODELAY), IPv6 literals connect, a refused connection says so, and a connect that
never completes (a full listen backlog) is the connect timeout."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import trio
from fakeserver import FakeServer, openai_stream

from fanfold.providers.base import CallContext, ProviderError
from fanfold.providers.http import Timeouts
from fanfold.providers.http1 import ConnectionPool, _ip_family
from fanfold.providers.openai import OpenAIProvider
from fanfold.statemachine import ErrorKind, ModelRequest
from fanfold.statemachine.messages import UserMessage

REQUEST = ModelRequest("Be brief.", (UserMessage("hi"),), ())


def context() -> CallContext:
    return CallContext("c", "c", "root", 0, None, 1)


def provider(url: str, pool: ConnectionPool, connect: float = 2.0) -> OpenAIProvider:
    return OpenAIProvider(
        base_url=url + "/v1", model="m", timeouts=Timeouts(connect=connect, read=5.0), pool=pool
    )


@pytest.fixture(autouse=True)
def no_proxy_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


def test_address_literals_are_told_from_host_names() -> None:
    assert _ip_family("127.0.0.1") == socket.AF_INET
    assert _ip_family("::1") == socket.AF_INET6
    assert _ip_family("localhost") == 0
    assert _ip_family("api.openai.com") == 0


async def test_a_connection_to_an_address_has_no_delay_and_is_reused(server: FakeServer) -> None:
    server.enqueue(openai_stream(text="one"), openai_stream(text="two"))
    pool = ConnectionPool()
    call = provider(server.url, pool)
    assert (await call.complete(REQUEST, context())).text == "one"
    (idle,) = [conn for conns in pool._idle.values() for conn in conns]
    assert idle.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    assert (await call.complete(REQUEST, context())).text == "two"
    assert pool.connects == 1
    await pool.aclose()


async def test_an_ipv6_address_connects() -> None:
    try:
        listener = socket.create_server(("::1", 0), family=socket.AF_INET6)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    port = listener.getsockname()[1]
    pool = ConnectionPool()
    try:
        origin = provider(f"http://[::1]:{port}", pool)._origin()
        assert origin is not None and origin.family == socket.AF_INET6
        conn = await pool._connect(origin, 2.0)
        accepted, peer = listener.accept()
        accepted.close()
        conn.sock.close()
        assert peer[0] == "::1"
    finally:
        listener.close()


async def test_a_refused_address_says_connection_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ProviderError) as caught:
        await provider(f"http://127.0.0.1:{port}", ConnectionPool()).complete(REQUEST, context())
    assert caught.value.error.kind is ErrorKind.NETWORK
    assert "connection refused" in caught.value.error.message


async def test_a_connect_that_never_completes_is_the_connect_timeout() -> None:
    # A listener that accepts nothing, its backlog filled: the kernel drops the next
    # SYN, so the connect waits (and retries) until the timeout.
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(8):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        with pytest.raises(ProviderError) as caught, trio.fail_after(10):
            pool = ConnectionPool()
            await provider(f"http://127.0.0.1:{port}", pool, connect=0.3).complete(
                REQUEST, context()
            )
        assert caught.value.error.kind is ErrorKind.TIMEOUT
        assert "could not connect within 0.3s" in caught.value.error.message
        assert pool.connects == 0
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
