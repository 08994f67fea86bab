"""The read timeouts of the providers' own HTTP/1.1 path (``http1.ReadTimer``, issue 36):
one Trio task per pool keeps every waiting read's deadline instead of a cancel scope
per socket wait. Over real loopback sockets, against a server that stalls mid-stream:
each timeout fires on time whatever the other waits of the pool (a short one is not
held behind a long one), the pool serves a later ``trio.run`` too, and a connection
whose read timed out is never reused."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import trio
from fakeserver import FakeServer, Sse, openai_stream

from fanfold.providers.base import CallContext, ProviderError
from fanfold.providers.http import Timeouts
from fanfold.providers.http1 import ConnectionPool
from fanfold.providers.openai import OpenAIProvider
from fanfold.statemachine import ErrorKind, ModelRequest
from fanfold.statemachine.messages import UserMessage

REQUEST = ModelRequest("Be brief.", (UserMessage("hi"),), ())


def context() -> CallContext:
    return CallContext("c", "c", "root", 0, None, 1)


def stalled() -> Sse:
    """A stream that sends its head and a few bytes, then nothing."""
    return Sse(openai_stream(text="never finished").body, cut_after=30, then="stall")


def provider(url: str, pool: ConnectionPool, read: float) -> OpenAIProvider:
    return OpenAIProvider(
        base_url=url + "/v1", model="m", timeouts=Timeouts(connect=2.0, read=read), pool=pool
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


async def _timed_out(call: OpenAIProvider) -> float:
    """Seconds until the call failed with TIMEOUT."""
    start = time.monotonic()
    with pytest.raises(ProviderError) as caught, trio.fail_after(10):  # never a hang
        await call.complete(REQUEST, context())
    assert caught.value.error.kind is ErrorKind.TIMEOUT, caught.value.error
    return time.monotonic() - start


async def test_a_short_read_timeout_fires_on_time_beside_a_long_one(server: FakeServer) -> None:
    """A call with a 30 s read timeout waits first; a call with 0.3 s on the same pool
    starts after: the timer's deadline moves forward for it (it fails after ~0.3 s,
    not after 30), and the long one is still waiting."""
    server.enqueue(stalled(), stalled(), openai_stream(text="fresh"))
    pool = ConnectionPool()
    slow_failed: list[BaseException] = []

    async def slow() -> None:
        try:
            await provider(server.url, pool, 30.0).complete(REQUEST, context())
        except ProviderError as exc:
            slow_failed.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow)
        await trio.sleep(0.3)  # the slow call is waiting on its socket
        elapsed = await _timed_out(provider(server.url, pool, 0.3))
        assert 0.25 <= elapsed < 5.0
        assert slow_failed == []
        # The connection whose read timed out was closed, not given back: the next
        # call opens a fresh one and reads its reply whole.
        reply = await provider(server.url, pool, 0.3).complete(REQUEST, context())
        assert reply.text == "fresh"
        assert pool.connects == 3
        nursery.cancel_scope.cancel()
    await pool.aclose()


def test_the_read_timer_serves_every_trio_run_the_pool_is_used_in() -> None:
    """A pool outlives a ``trio.run`` (its timer task does not): the next run's first
    wait starts a timer task of its own, so its timeouts fire too."""
    with FakeServer() as server:
        server.enqueue(stalled(), stalled())
        pool = ConnectionPool()
        call = provider(server.url, pool, 0.3)
        for _ in range(2):
            elapsed = trio.run(_timed_out, call)
            assert 0.25 <= elapsed < 5.0
        assert len(server.requests) == 2


async def test_idle_connections_expire_by_the_wall_clock(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keep-alive expiry is measured on the wall clock (how long the server saw the
    connection idle): a call right after the last reuses its connection, one after
    the expiry opens a new one."""
    import fanfold.providers.http1 as http1

    monkeypatch.setattr(http1, "KEEP_ALIVE_EXPIRY", 0.3)
    server.enqueue(openai_stream(text="a"), openai_stream(text="b"), openai_stream(text="c"))
    pool = ConnectionPool()
    call = provider(server.url, pool, 5.0)
    assert (await call.complete(REQUEST, context())).text == "a"
    assert (await call.complete(REQUEST, context())).text == "b"
    assert pool.connects == 1
    time.sleep(0.4)  # (no Trio sleep: the wall's time passes, not only Trio's)
    assert (await call.complete(REQUEST, context())).text == "c"
    assert pool.connects == 2
    await pool.aclose()


async def test_a_stream_answered_with_whole_json_is_read_as_json(server: FakeServer) -> None:
    """The reply's content-type, read once as the head is parsed: a server that ignores
    ``stream: true`` and sends one JSON reply is read as one (issue 36 dropped the
    per-call header lookup)."""
    from fakeserver import openai_completion

    server.enqueue(openai_completion("whole"), openai_stream(text="streamed"))
    pool = ConnectionPool()
    call = provider(server.url, pool, 5.0)
    assert call.stream
    assert (await call.complete(REQUEST, context())).text == "whole"
    assert (await call.complete(REQUEST, context())).text == "streamed"
    assert pool.connects == 1
    await pool.aclose()
