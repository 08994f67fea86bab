"""The HTTP half shared by the OpenAI and Anthropic providers.

``HttpProvider.complete`` sends one request (under Trio), streaming or not, over
fanfold's own HTTP/1.1 client (``fanfold.providers.http1``) or, for a proxy or a
client passed in, httpx, and turns every failure into a ``ProviderError``: transport
errors by exception type (both raise httpx's classes)
(connect/read/protocol errors -> NETWORK, httpx timeouts -> TIMEOUT, including a stalled
stream, which trips the read timeout), HTTP errors and in-stream errors through
``wire``'s one table, unreadable bodies -> MALFORMED_RESPONSE. A total deadline, if
configured, is a Trio cancel scope around the whole call.

Subclasses supply the wire format: the URL, headers, the request body, a parser for a
whole JSON reply and a ``StreamAssembler`` for a stream.
"""

from __future__ import annotations

import abc
import functools
import json
import socket
import ssl
import time
import urllib.request
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, ClassVar, Self

import httpx
import trio

from fanfold.providers.base import CallContext, ProviderError, StreamProgress
from fanfold.providers.http1 import (
    ConnectionPool,
    Exchange,
    InvalidHeader,
    Origin,
    Slots,
    request_head,
)
from fanfold.providers.settings import DEFAULT_SETTINGS as DEFAULT_SETTINGS
from fanfold.providers.settings import DEFAULT_TIMEOUTS as DEFAULT_TIMEOUTS
from fanfold.providers.settings import POOL_SIZE as POOL_SIZE
from fanfold.providers.settings import RequestSettings as RequestSettings
from fanfold.providers.settings import Timeouts as Timeouts
from fanfold.providers.settings import valid_api_key as valid_api_key
from fanfold.providers.wire import (
    IdentityMemo,
    Secret,
    SSEDecoder,
    billed,
    classify_http_error,
    fail,
    malformed,
    redact_error,
    snippet,
)
from fanfold.providers.wire import StreamAssembler as StreamAssembler
from fanfold.statemachine import ErrorKind, ModelReply, ModelRequest

USER_AGENT = "fanfold/0.1"


# One encoder for every request (``json.dumps`` with arguments builds one per call).
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def encode_json(body: Any) -> bytes:
    """``body`` as httpx's ``json=`` would send it (UTF-8, compact; NaN refused:
    ``ValueError``)."""
    return _ENCODE(body).encode()


@functools.cache
def default_ssl_context() -> ssl.SSLContext:
    """The verified TLS context all clients share (building one costs ~0.1 s)."""
    return httpx.create_ssl_context()


KEEP_ALIVE = 20
"""Idle connections a provider client keeps (httpx's default): httpcore checks every
idle connection of its pool (a ``poll`` each) whenever it assigns a request, so 100
kept alive cost more than the connects they save on loopback (bench/README.md)."""

_pool_slots: weakref.WeakKeyDictionary[httpx.AsyncClient, trio.CapacityLimiter] = (
    weakref.WeakKeyDictionary()
)


def new_client(pool: int = POOL_SIZE) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` as the providers want it: no redirects, shared TLS setup,
    ``pool`` connections, ``KEEP_ALIVE`` of them kept alive."""
    return httpx.AsyncClient(
        headers={"user-agent": USER_AGENT},
        follow_redirects=False,
        verify=default_ssl_context(),
        limits=httpx.Limits(max_connections=pool, max_keepalive_connections=KEEP_ALIVE),
    )


def pool_slots(client: httpx.AsyncClient) -> trio.CapacityLimiter:
    """The slots of ``client``: ``POOL_SIZE`` calls at once, shared by every provider
    using the client. A call holds one from before its request is built until its
    reply is read, so a call waiting its turn holds no request body (issue 36: 46 KiB
    per waiting call before) and httpcore never queues one (a client made elsewhere
    with a smaller pool still works: its calls then wait in httpcore too)."""
    slots = _pool_slots.get(client)
    if slots is None:
        slots = _pool_slots[client] = trio.CapacityLimiter(POOL_SIZE)
    return slots


def proxy_in_environment() -> bool:
    """True if the environment names a proxy for HTTP(S) (``HTTP_PROXY``, ``HTTPS_PROXY``,
    ``ALL_PROXY``, either case): httpx then makes the calls, as it honours them."""
    proxies = urllib.request.getproxies_environment()
    return any(scheme in proxies for scheme in ("http", "https", "all"))


def http1_origin(url: str, headers: list[tuple[bytes, bytes]]) -> Origin | None:
    """Where ``url`` is, for ``ConnectionPool``, with ``headers`` built into its request head;
    None if the own HTTP/1.1 path cannot serve it: not ``http``/``https``, a user or password in
    the URL (httpx sends them as Basic authentication), or not a URL (httpx then says
    why, as before). Raises ``InvalidHeader`` for a header it cannot send."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError):
        return None
    scheme = parsed.scheme
    if scheme not in ("http", "https") or parsed.userinfo or not parsed.raw_host:
        return None
    port = parsed.port or (443 if scheme == "https" else 80)
    head = request_head(parsed.raw_path, [(b"host", parsed.netloc), *headers])
    shown = str(parsed.copy_with(query=None, fragment=None))
    return Origin(scheme, parsed.raw_host.decode("ascii"), port, head, shown)


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc``, its causes and contexts, and the members of exception groups among them."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo and len(seen) < 50:  # bounded: a cycle or a huge group is no concern here
        current = todo.pop()
        if any(current is s for s in seen):
            continue
        seen.append(current)
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                todo.append(linked)
    return seen


def _connect_failure(api: str, where: str, exc: httpx.ConnectError) -> ProviderError:
    """A failed connection, saying why (refused, unknown host...) and to what."""
    causes = _causes(exc)
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        why = "connection refused (is the server running, on this port?)"
    elif any(isinstance(c, socket.gaierror) for c in causes):
        why = "the host name could not be resolved"
    else:
        why = f"could not connect: {snippet(str(exc)) or 'no details'}"
    return fail(ErrorKind.NETWORK, f"{api}: {why} at {where}")


def _transport_error(
    api: str, exc: Exception, timeouts: Timeouts, where: str = ""
) -> ProviderError:
    """The ProviderError for a transport failure. ``where``: the profile and the URL
    (without credentials or query) the call went to, for the messages that need it."""
    if isinstance(exc, httpx.ConnectError) and where:
        return _connect_failure(api, where, exc)
    detail = f"{api}: {type(exc).__name__}: {snippet(str(exc)) or 'no details'}"
    if isinstance(exc, httpx.ConnectTimeout):
        return fail(ErrorKind.TIMEOUT, f"{api}: could not connect within {timeouts.connect}s")
    if isinstance(exc, httpx.ReadTimeout):
        return fail(ErrorKind.TIMEOUT, f"{api}: no data from the server for {timeouts.read}s")
    if isinstance(exc, httpx.TimeoutException):
        return fail(ErrorKind.TIMEOUT, detail)
    if isinstance(exc, httpx.LocalProtocolError):
        # Its text may quote a header, and headers hold the key: leave it out.
        return fail(
            ErrorKind.INVALID_REQUEST,
            f"{api}: the request could not be sent (invalid header or body)",
        )
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return fail(ErrorKind.INVALID_REQUEST, detail)
    if isinstance(exc, httpx.DecodingError):
        return fail(ErrorKind.MALFORMED_RESPONSE, detail)
    if isinstance(exc, httpx.TooManyRedirects):
        return fail(ErrorKind.INVALID_REQUEST, detail)
    return fail(ErrorKind.NETWORK, detail)


class Body:
    """A request body in parts (the tool list's bytes shared between requests),
    sent with a Content-Length: only the parts of its own are a call's."""

    __slots__ = ("length", "parts")

    def __init__(self, parts: tuple[bytes, ...]) -> None:
        self.parts = parts
        self.length = sum(map(len, parts))

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part

    def joined(self) -> bytes:
        """The whole body."""
        return b"".join(self.parts)


_TOOL_BYTES: dict[tuple[str, tuple[Any, ...], bool, int | None], bytes] = {}
_TOOL_BYTES_KEPT = 64
_SEEN_TOOL_BYTES = IdentityMemo()

DRAIN_SECONDS = 0.25
DRAIN_BYTES = 65536


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    """Read what is left of a stream whose reply is complete (the body's end after
    ``[DONE]`` or ``message_stop``), so its connection goes back to the pool.

    A response closed before its end closes its connection: every streamed call then
    opened a new one (a TCP connect, and a TLS handshake on https; issue 36: 640
    connects for 600 calls). At most ``DRAIN_BYTES`` within ``DRAIN_SECONDS``: a
    server that sends more, holds the stream open or breaks it loses its connection
    as before, and the reply stands.
    """
    read = 0
    with trio.move_on_after(DRAIN_SECONDS):
        try:
            async for chunk in chunks:
                read += len(chunk)
                if read > DRAIN_BYTES:
                    return
        except httpx.HTTPError:
            return


JSON_HEADERS = {"content-type": "application/json", "accept": "application/json"}
"""The headers every request of both APIs carries (a provider's ``headers`` adds its own)."""


class HttpProvider(abc.ABC):
    """A ``Provider`` over HTTP. One instance may serve many concurrent calls.

    ``request.model`` (if set) picks the model for a call; otherwise ``model`` does.
    Calls go over fanfold's own HTTP/1.1 client (``fanfold.providers.http1``), through ``pool`` if
    given (shared; the caller closes it) or the provider's own. httpx makes them instead
    when the caller passes ``client`` (an ``httpx.AsyncClient``, shared, the caller
    closes it), when the environment names a proxy, or for a URL it cannot serve (see
    ``http1_origin``); the provider then opens its own client on first use. ``aclose()``
    (or ``async with``) closes what the provider opened. Timeouts are applied per
    request, so a shared pool or client is fine.
    """

    api: ClassVar[str]

    default_base_url: ClassVar[str]
    """The API root a provider made without ``base_url`` calls."""

    calls_at_once: int = POOL_SIZE
    """``LimitsCallsAtOnce``: the client's pool (``new_client``)."""

    description_limit: int | None = None
    """The longest tool description this provider's server takes (characters), or
    None: part of the key of the shared tool bytes, since it changes them."""

    def __init__(
        self,
        *,
        base_url: str | None = None,
        model: str | None,
        api_key: str | Secret | None = None,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        stream: bool = True,
        max_tokens: int | None = None,
        temperature: float | None = None,
        settings: RequestSettings = DEFAULT_SETTINGS,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
        profile: str | None = None,
        pool: ConnectionPool | None = None,
    ) -> None:
        self.base_url = (self.default_base_url if base_url is None else base_url).rstrip("/")
        self.profile = profile
        self.model = model
        if isinstance(api_key, str):
            api_key = Secret(api_key) if api_key else None
        if api_key is not None and not valid_api_key(api_key.reveal()):
            # Never show the value: it is a secret even when it is a broken one.
            raise ValueError("api_key must be printable ASCII without spaces (it goes in a header)")
        self._api_key = api_key
        self.timeouts = timeouts
        self.stream = stream
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.settings = settings
        self._client = client
        self._owns_client = client is None
        self._clock = clock
        self._pool = pool
        self._owns_pool = pool is None
        # The own HTTP/1.1 path's origin and request head (built on the first call), or False:
        # this provider's calls go through httpx (``_origin``).
        self._http1: Origin | bool | None = None
        self._http1_stream = stream

    def __repr__(self) -> str:
        key = "set" if self._api_key is not None else "none"
        return (
            f"{type(self).__name__}(base_url={self.base_url!r}, model={self.model!r}, "
            f"stream={self.stream!r}, api_key={key})"
        )

    # ---------------------------------------------------------------- wire format

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The endpoint to POST to."""

    @abc.abstractmethod
    def headers(self, api_key: str | None) -> dict[str, str]:
        """Request headers (authentication included)."""

    @abc.abstractmethod
    def body(self, request: ModelRequest, model: str, stream: bool) -> dict[str, Any]:
        """The JSON request body."""

    @abc.abstractmethod
    def parse_reply(self, data: Any) -> ModelReply:
        """A whole JSON reply as a ModelReply (raises ProviderError)."""

    @abc.abstractmethod
    def assembler(self) -> StreamAssembler:
        """A fresh assembler for one streamed reply."""

    # ---------------------------------------------------------------- calls

    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply:
        """Call the model; return its reply or raise ``ProviderError`` (redacted)."""
        secrets = [self._api_key.reveal()] if self._api_key is not None else []
        try:
            origin = self._origin()
        except InvalidHeader:
            # Its text may quote a header, and headers hold the key: leave it out.
            error = fail(
                ErrorKind.INVALID_REQUEST,
                f"{self.api}: the request could not be sent (invalid header or body)",
            ).error
            raise ProviderError(redact_error(error, secrets)) from None
        client: httpx.AsyncClient | None = None
        pool: ConnectionPool | None = None
        slots: trio.CapacityLimiter | Slots
        if origin is None:
            client = self._get_client()
            slots = pool_slots(client)
        else:
            pool = self._get_pool()
            slots = pool.slots
        # A token of its own per call (a task may make calls one after another).
        borrower = object()
        try:
            # A free slot is taken at once (no trip through the scheduler: the call
            # waits on its socket soon enough); else the call queues for one.
            slots.acquire_on_behalf_of_nowait(borrower)
        except trio.WouldBlock:
            await slots.acquire_on_behalf_of(borrower)
        try:
            model = request.model or self.model
            if not model:
                raise fail(ErrorKind.INVALID_REQUEST, f"{self.api}: no model configured")
            try:
                # Encoded at once, the dict dropped: only the bytes live while the
                # call waits for its reply.
                content = self._encoded(request, self.body(request, model, self.stream))
            except ValueError as exc:  # history or tool schemas fanfold cannot send
                raise fail(ErrorKind.INVALID_REQUEST, f"{self.api}: {exc}") from None
            total = self.timeouts.total
            reply: ModelReply | None = None
            if total is None:  # no timer (a cancel scope is a cost of each call)
                reply = await self._send(client, pool, origin, content, context)
            else:
                with trio.move_on_after(total):
                    reply = await self._send(client, pool, origin, content, context)
            if reply is None:
                raise fail(ErrorKind.TIMEOUT, f"{self.api}: no complete reply within {total}s")
            return reply
        except ProviderError as exc:
            raise ProviderError(redact_error(exc.error, secrets)) from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            error = _transport_error(self.api, exc, self.timeouts, self._where()).error
            raise ProviderError(redact_error(error, secrets)) from None
        finally:
            slots.release_on_behalf_of(borrower)

    def _send(
        self,
        client: httpx.AsyncClient | None,
        pool: ConnectionPool | None,
        origin: Origin | None,
        content: Body,
        context: CallContext,
    ) -> Awaitable[ModelReply]:
        if client is not None:
            return self._call(client, content, context)
        assert pool is not None and origin is not None
        return self._call_http1(pool, origin, content, context)

    def _headers(self) -> dict[str, str]:
        """The request's headers but its length: the provider's own (authentication
        included), then the profile's extra ones (never replacing one of those)."""
        key = self._api_key.reveal() if self._api_key is not None else None
        headers = self.headers(key)
        own = {name.lower() for name in headers}
        # The provider's own headers (authentication included) always win.
        headers.update(
            (name, value) for name, value in self.settings.extra_headers if name.lower() not in own
        )
        headers.setdefault("content-type", "application/json")
        if self.stream:
            headers["accept"] = "text/event-stream"
        return headers

    def _origin(self) -> Origin | None:
        """The own HTTP/1.1 path's origin and request head (built once), or None for httpx."""
        if self._http1 is not None and self._http1_stream is not self.stream:
            self._http1 = None  # ``stream`` changed since: the Accept header differs
        if self._http1 is None:
            self._http1_stream = self.stream
            if self._client is not None or proxy_in_environment():
                self._http1 = False
            else:
                # As httpx's client sends them (its defaults first, then the call's).
                headers = [
                    (b"user-agent", USER_AGENT.encode()),
                    (b"accept-encoding", b"gzip, deflate"),
                    (b"connection", b"keep-alive"),
                ]
                given = {name.lower(): value for name, value in self._headers().items()}
                headers = [(name, value) for name, value in headers if name.decode() not in given]
                try:
                    headers.extend(
                        (name.encode("ascii"), value.encode("latin-1"))
                        for name, value in given.items()
                    )
                except UnicodeEncodeError:
                    raise InvalidHeader("invalid header") from None
                self._http1 = http1_origin(self.url, headers) or False
        return self._http1 if isinstance(self._http1, Origin) else None

    def _get_pool(self) -> ConnectionPool:
        if self._pool is None:
            self._pool = ConnectionPool()
            self._owns_pool = True
        return self._pool

    async def _call_http1(
        self, pool: ConnectionPool, origin: Origin, content: Body, context: CallContext
    ) -> ModelReply:
        timeouts = self.timeouts
        exchange = await pool.send(
            origin, content.parts, content.length, timeouts.connect, timeouts.read
        )
        try:
            status = exchange.status
            if not self.stream:
                data = await exchange.read_all()
                self._check_reply(status, data, exchange.header_map)
                reply = self._parse_json(data)
                chars = len(reply.text) + sum(len(call.arguments_json) for call in reply.tool_calls)
                self._progress(context, chars, reply.usage.output_tokens or None)
                return reply
            if status != 200:
                self._check_reply(status, await exchange.read_all(), exchange.header_map)
            if "json" in exchange.content_type:
                # The server ignored stream=true and sent one JSON reply.
                return self._parse_json(await exchange.read_all())
            assembler = self.assembler()
            try:
                return await self._assemble_http1(exchange, assembler, context)
            except ProviderError as exc:
                raise ProviderError(billed(exc.error, assembler.usage)) from None
            except httpx.HTTPError as exc:
                # A stream that breaks after its usage chunk was billed all the same.
                error = _transport_error(self.api, exc, self.timeouts, self._where()).error
                raise ProviderError(billed(error, assembler.usage)) from None
        finally:
            exchange.release()

    async def _assemble_http1(
        self, exchange: Exchange, assembler: StreamAssembler, context: CallContext
    ) -> ModelReply:
        decoder = SSEDecoder()
        reported: tuple[int, int | None] = (0, None)

        def feed(chunk: bytes) -> bool:
            nonlocal reported
            for event in decoder.feed(chunk):
                assembler.feed(event)
                if assembler.done:
                    break
            progress = (assembler.output_chars, assembler.output_tokens)
            if progress != reported:
                reported = progress
                self._progress(context, *progress)
            return assembler.done

        ended = await exchange.read_into(feed)
        if assembler.done:
            reply = assembler.finish()
            if not ended:
                await exchange.drain(DRAIN_BYTES, DRAIN_SECONDS)
            return reply
        for event in decoder.finish():
            if not assembler.done:
                assembler.feed(event)
        return assembler.finish()

    async def _call(
        self, client: httpx.AsyncClient, content: Body, context: CallContext
    ) -> ModelReply:
        headers = self._headers()
        headers["content-length"] = str(content.length)
        timeout = self.timeouts.for_httpx()
        if not self.stream:
            response = await client.post(
                self.url, content=content, headers=headers, timeout=timeout
            )
            self._check_status(response)
            reply = self._parse_json(response.content)
            chars = len(reply.text) + sum(len(call.arguments_json) for call in reply.tool_calls)
            self._progress(context, chars, reply.usage.output_tokens or None)
            return reply
        async with client.stream(
            "POST", self.url, content=content, headers=headers, timeout=timeout
        ) as response:
            if response.status_code != 200:
                await response.aread()
                self._check_status(response)
            if "json" in response.headers.get("content-type", ""):
                # The server ignored stream=true and sent one JSON reply.
                return self._parse_json(await response.aread())
            return await self._read_stream(response, context)

    def _encoded(self, request: ModelRequest, body: dict[str, Any]) -> Body:
        """``body`` encoded, its tool list as the bytes every request offering the same
        tools shares (encoded once per tool set: ``_TOOL_BYTES``)."""
        tools = body.pop("tools", None)
        head = encode_json(body)
        if tools is None:
            return Body((head,))
        extra = (self.api, tools[-1].get("cache_control") is not None, self.description_limit)
        shared = _SEEN_TOOL_BYTES.get(request.tools, extra)
        if shared is None:
            shared = self._tool_bytes(request, extra, tools)
            _SEEN_TOOL_BYTES.put(request.tools, extra, shared)
        # "tools" goes last: JSON objects have no order.
        return Body((head[:-1] + b',"tools":', shared, b"}"))

    def _tool_bytes(
        self, request: ModelRequest, extra: tuple[str, bool, int | None], tools: Any
    ) -> bytes:
        key = (extra[0], request.tools, extra[1], extra[2])
        shared = _TOOL_BYTES.get(key)
        if shared is None:
            shared = encode_json(tools)
            if len(_TOOL_BYTES) >= _TOOL_BYTES_KEPT:
                del _TOOL_BYTES[next(iter(_TOOL_BYTES))]
            _TOOL_BYTES[key] = shared
        return shared

    async def _read_stream(self, response: httpx.Response, context: CallContext) -> ModelReply:
        assembler = self.assembler()
        try:
            return await self._assemble(response, assembler, context)
        except ProviderError as exc:
            raise ProviderError(billed(exc.error, assembler.usage)) from None
        except httpx.HTTPError as exc:
            # A stream that breaks after its usage chunk was billed all the same.
            error = _transport_error(self.api, exc, self.timeouts, self._where()).error
            raise ProviderError(billed(error, assembler.usage)) from None

    async def _assemble(
        self, response: httpx.Response, assembler: StreamAssembler, context: CallContext
    ) -> ModelReply:
        decoder = SSEDecoder()
        reported: tuple[int, int | None] = (0, None)
        chunks = response.aiter_bytes()
        async for chunk in chunks:
            for event in decoder.feed(chunk):
                assembler.feed(event)
                if assembler.done:
                    break
            progress = (assembler.output_chars, assembler.output_tokens)
            if progress != reported:
                reported = progress
                self._progress(context, *progress)
            if assembler.done:
                reply = assembler.finish()
                await _drain(chunks)
                return reply
        for event in decoder.finish():
            if not assembler.done:
                assembler.feed(event)
        return assembler.finish()

    def _where(self) -> str:
        """``profile 'x', http://host:port/path``: where calls go, for error messages.
        The URL loses any user, password, query and fragment (they may hold a key)."""
        try:
            url = httpx.URL(self.url)
            shown = str(url.copy_with(username=None, password=None, query=None, fragment=None))
        except (httpx.InvalidURL, ValueError, TypeError):
            shown = "(an invalid URL)"
        profile = f"profile {self.profile!r}, " if self.profile is not None else ""
        return profile + snippet(shown)

    def _progress(self, context: CallContext, chars: int, tokens: int | None) -> None:
        if context.on_progress is not None:
            context.on_progress(StreamProgress(context.conversation_id, chars, tokens))

    def _check_status(self, response: httpx.Response) -> None:
        self._check_reply(response.status_code, response.content, lambda: response.headers)

    def _check_reply(
        self, status: int, content: bytes, headers: Callable[[], Mapping[str, str]]
    ) -> None:
        if status == 200:
            return
        if 200 <= status < 300:
            raise malformed(f"{self.api}: unexpected HTTP {status}")
        error = classify_http_error(self.api, status, content, headers(), self._clock())
        raise ProviderError(error)

    def _parse_json(self, content: bytes) -> ModelReply:
        try:
            data = json.loads(content)
        except (ValueError, RecursionError):  # RecursionError: nested too deeply
            text = content.decode("utf-8", errors="replace")
            raise malformed(f"{self.api}: reply is not JSON: {snippet(text)}") from None
        return self.parse_reply(data)

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = new_client()
            self._owns_client = True
        return self._client

    async def aclose(self) -> None:
        """Close the provider's own HTTP client and connections (a client or pool passed
        in is left open)."""
        if self._client is not None and self._owns_client:
            await self._client.aclose()
            self._client = None
        if self._pool is not None and self._owns_pool:
            await self._pool.aclose()
            self._pool = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
