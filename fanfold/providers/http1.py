"""HTTP/1.1 model calls on Trio, without httpx's machinery (issue 36).

The HTTP providers' own path for ``http://`` and ``https://`` URLs: a call takes an
idle connection of its origin (or opens one: TCP, then TLS with a verified context),
writes its request head (built once per provider) and body with one ``sendmsg``, and
reads the reply with ``ResponseReader``, a small sans-IO parser of HTTP/1.1 responses
(status line, headers, a body framed by Content-Length, chunked or the connection's
end); a reply read to its end gives the connection back for the next call. No httpx
``Request``/``Response``, no httpcore pool (which walked every connection and polled
each idle one's socket on each request and each release), no h11 state machine (whose
events cost ~250 Python calls a reply; bench/README.md): a call's cost is its own bytes
and its parse.

Failures are raised as the httpx exceptions httpx would raise for them
(``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``WriteTimeout``,
``RemoteProtocolError``, ``ReadError``, ``WriteError``, ``DecodingError``), so the
providers map them to ``ProviderError`` by one table whichever path made the call.
httpx's exception classes are all this module takes from httpx.

Timeouts are httpx's: ``connect`` for the TCP connect and the TLS handshake, ``read``
between two reads (and for each write). The wait for a slot (``ConnectionPool.slots``)
is no part of any of them. Cancellation (a total deadline, a cancelled conversation)
closes the connection the call was using; it is never reused half-read.

A kept-alive connection the server has closed meanwhile is found before it is used (a
non-blocking ``select`` of its socket: readable when idle means closed, or junk) and
dropped. If a reused connection breaks anyway before a single byte of the reply
arrived (the server closed it as the request went out), the call is sent once more on
a fresh connection: the server read at most a request it dropped unanswered.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import math
import os
import re
import select
import socket
import ssl
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Final

import httpx
import trio

from fanfold.providers.settings import POOL_SIZE

_log = logging.getLogger(__name__)

KEEP_ALIVE: Final = POOL_SIZE
"""Idle connections an ``ConnectionPool`` keeps (all origins together). Taking one is a pop
from its origin's list, so keeping many costs nothing per call."""

KEEP_ALIVE_EXPIRY: Final = 5.0
"""Seconds an idle connection is kept (httpx's default): servers close idle
connections after a few seconds, and one closed meanwhile would cost a retry."""

RECEIVE_BYTES: Final = 65536


class Origin:
    """Where one provider's calls go, and their request head, built once."""

    __slots__ = ("family", "head", "host", "key", "port", "tls", "url")

    def __init__(self, scheme: str, host: str, port: int, head: bytes, url: str) -> None:
        self.url = url
        """The URL for logs, without user, password, query or fragment."""
        self.tls = scheme == "https"
        self.host = host
        self.port = port
        self.key = (scheme, host, port)
        self.family = _ip_family(host)
        """``AF_INET``/``AF_INET6`` for an IP address literal (connected without name
        resolution), 0 for a host name."""
        self.head = head
        """The request's head without its Content-Length line and the blank line."""

    def __repr__(self) -> str:
        # Never the head: it holds the API key.
        return f"Origin({self.url!r})"


_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(rb"[\x21-\x7e\x80-\xff]([\t\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?")
_TARGET = re.compile(rb"[\x21-\x7e]+")


class InvalidHeader(ValueError):
    """A request header or target that cannot be sent (its text is not given: it may
    hold a key)."""


def request_head(target: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    """``POST target`` with ``headers`` (and Content-Length added per call), as bytes.

    Validated once (names are tokens, values visible characters with inner spaces,
    the target visible ASCII: else ``InvalidHeader``), so that each call needs only its
    length added."""
    if not _TARGET.fullmatch(target):
        raise InvalidHeader("invalid request target")
    lines = [b"POST " + target + b" HTTP/1.1\r\n"]
    for name, value in headers:
        if not _TOKEN.fullmatch(name) or (value and not _FIELD_VALUE.fullmatch(value)):
            raise InvalidHeader("invalid header")
        lines.append(name + b": " + value + b"\r\n")
    return b"".join(lines)


MAX_HEAD_BYTES: Final = 65536
"""The longest response head (status line and headers) read."""

_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _TO_CLOSE, _DONE = range(8)


class ResponseReader:
    """Reads HTTP/1.1 responses from a connection's bytes (sans-IO, one after another).

    ``feed`` the bytes read (b'' at the connection's end); ``head()`` gives the
    status and headers once they are in (None: more bytes needed; 1xx responses are
    skipped); then ``body()`` gives the body's bytes in as they came, and whether it
    ended. Malformed or cut input raises ``httpx.RemoteProtocolError``."""

    __slots__ = (
        "_buffer",
        "_eof",
        "_left",
        "_state",
        "coded",
        "content_type",
        "headers",
        "keep_alive",
        "status",
    )

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._eof = False
        self._state = _HEAD
        self._left = 0
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        """The reply's headers, names in lower case."""
        self.keep_alive = False
        self.content_type = b""
        """The reply's (first) ``content-type``, b'' if none."""
        self.coded = False
        """True if the reply has a ``content-encoding`` header."""

    def feed(self, data: bytes) -> None:
        """Bytes read from the connection; b'' when it ended."""
        if data:
            self._buffer += data
        else:
            self._eof = True

    @property
    def received(self) -> bool:
        """True once any byte of a response arrived."""
        return bool(self._buffer) or self._state != _HEAD

    @property
    def reusable(self) -> bool:
        """True if the response was read to its end and the connection may take the
        next request (kept alive, nothing more sent)."""
        return self._state == _DONE and self.keep_alive and not self._buffer and not self._eof

    def next_cycle(self) -> None:
        """Ready for the next response on the same connection."""
        self._state = _HEAD
        self.headers = []
        self.status = 0

    def head(self) -> bool:
        """True once the status and headers are read (``status``, ``headers``)."""
        buffer = self._buffer
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    raise httpx.RemoteProtocolError("the response head is too long")
                if self._eof:
                    if buffer:
                        raise httpx.RemoteProtocolError(
                            "peer closed connection in the middle of the response head"
                        )
                    raise httpx.RemoteProtocolError(
                        "Server disconnected without sending a response."
                    )
                return False
            if end > MAX_HEAD_BYTES:
                raise httpx.RemoteProtocolError("the response head is too long")
            lines = bytes(buffer[:end]).split(b"\r\n")
            del buffer[: end + 4]
            if not self._parse(lines):
                return True
            # 1xx: an interim response, the real one follows.

    def _parse(self, lines: list[bytes]) -> bool:
        """Read a head; True if it was an interim (1xx) response."""
        version, _, rest = lines[0].partition(b" ")
        code = rest[:3]
        if (
            version not in (b"HTTP/1.1", b"HTTP/1.0")
            or len(code) != 3
            or not code.isdigit()
            or rest[3:4] not in (b"", b" ")
        ):
            raise httpx.RemoteProtocolError("malformed response status line")
        status = int(code)
        headers: list[tuple[bytes, bytes]] = []
        for line in lines[1:]:
            if line[:1] in (b" ", b"\t"):  # obsolete line folding: part of the last value
                if not headers:
                    raise httpx.RemoteProtocolError("malformed response header")
                name, value = headers[-1]
                headers[-1] = (name, (value + b" " + line.strip(b" \t")).strip(b" "))
                continue
            name, colon, value = line.partition(b":")
            if not colon or not _TOKEN.fullmatch(name):
                raise httpx.RemoteProtocolError("malformed response header")
            headers.append((name.lower(), value.strip(b" \t")))
        if 100 <= status < 200:
            if status == 101:
                raise httpx.RemoteProtocolError("the server switched protocols")
            return True
        self.status = status
        self.headers = headers
        connection = b""
        length: bytes | None = None
        chunked = False
        content_type: bytes | None = None
        coded = False
        for name, value in headers:
            if name == b"content-type":
                if content_type is None:
                    content_type = value
            elif name == b"content-encoding":
                coded = True
            elif name == b"connection":
                connection += b"," + value.lower()
            elif name == b"content-length":
                for item in value.split(b","):
                    item = item.strip(b" \t")
                    if not item.isdigit() or len(item) > 18 or (length not in (None, item)):
                        raise httpx.RemoteProtocolError("malformed or conflicting content-length")
                    length = item
            elif name == b"transfer-encoding":
                if value.strip(b" \t").lower() != b"chunked" or chunked:
                    raise httpx.RemoteProtocolError("unsupported transfer-encoding")
                chunked = True
        self.content_type = content_type or b""
        self.coded = coded
        self.keep_alive = version == b"HTTP/1.1"
        if connection:
            tokens = {token.strip(b" \t") for token in connection.split(b",")}
            self.keep_alive = self.keep_alive and b"close" not in tokens
        if status in (204, 304):
            self._state = _DONE
        elif chunked:
            self._state = _CHUNK_SIZE
        elif length is not None:
            self._left = int(length)
            self._state = _LENGTH if self._left else _DONE
        else:
            self._state = _TO_CLOSE
            self.keep_alive = False
        return False

    def body(self) -> tuple[list[bytes], bool]:
        """The body's pieces read since the last call (a chunk of a chunked body
        each: a stream's events are taken as they were sent), and True once it
        ended."""
        buffer = self._buffer
        parts: list[bytes] = []
        while True:
            state = self._state
            if state == _DONE:
                break
            if state in (_LENGTH, _CHUNK_DATA):
                if not buffer:
                    break
                take = buffer[: self._left]
                del buffer[: len(take)]
                parts.append(bytes(take))
                self._left -= len(take)
                if not self._left:
                    self._state = _DONE if state == _LENGTH else _CHUNK_END
            elif state == _TO_CLOSE:
                if buffer:
                    parts.append(bytes(buffer))
                    buffer.clear()
                if self._eof:
                    self._state = _DONE
                break
            elif state == _CHUNK_END:
                if len(buffer) < 2:
                    break
                if buffer[:2] != b"\r\n":
                    raise httpx.RemoteProtocolError("malformed chunked body")
                del buffer[:2]
                self._state = _CHUNK_SIZE
            else:  # _CHUNK_SIZE, _TRAILER: a line
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > 4096:
                        raise httpx.RemoteProtocolError("malformed chunked body")
                    break
                line = bytes(buffer[:end])
                del buffer[: end + 2]
                if state == _TRAILER:
                    if not line:
                        self._state = _DONE
                    continue
                size = line.split(b";", 1)[0].strip(b" \t")
                if not size or len(size) > 16 or size.strip(b"0123456789abcdefABCDEF"):
                    raise httpx.RemoteProtocolError("malformed chunked body")
                self._left = int(size, 16)
                self._state = _CHUNK_DATA if self._left else _TRAILER
        done = self._state == _DONE
        if not done and self._eof:  # all read that could be: no more will come
            raise httpx.RemoteProtocolError(
                "peer closed connection without sending complete message body"
            )
        return parts, done


class _Connection:
    """One connection: a non-blocking socket read and written directly (plain TCP: no
    Trio stream, and a timer only when a read or write has to wait), or a
    ``trio.SSLStream`` over it (TLS)."""

    __slots__ = ("deadline", "idle_since", "reader", "sock", "timed_out", "tls")

    def __init__(
        self,
        sock: socket.socket | trio.socket.SocketType,
        tls: trio.SSLStream[trio.SocketStream] | None,
    ) -> None:
        self.sock = sock
        self.tls = tls
        self.reader = ResponseReader()
        self.idle_since = 0.0
        self.deadline = 0.0
        """When the read it waits for is due (``ReadTimer``)."""
        self.timed_out = False
        """True once ``ReadTimer`` woke its read: the connection is done for."""

    def usable(self, now: float) -> bool:
        """True if this idle connection may take a request: not expired, and its
        socket has nothing to read (a closed connection reads as EOF)."""
        if now - self.idle_since > KEEP_ALIVE_EXPIRY:
            return False
        try:
            readable, _, _ = select.select((self.sock,), (), (), 0)
        except (OSError, ValueError):
            return False
        return not readable  # readable: EOF, or bytes nobody asked for

    async def send_all(self, parts: Sequence[bytes], timeout: float) -> None:
        """Write ``parts`` (plain TCP: one ``sendmsg`` of them all, no copy joining
        them); ``httpx.WriteTimeout`` if a write waits ``timeout`` s; ``OSError`` or
        ``trio.BrokenResourceError`` if the connection broke."""
        if self.tls is not None:
            with trio.move_on_after(timeout) as scope:
                await self.tls.send_all(b"".join(parts))
            if scope.cancelled_caught:
                raise httpx.WriteTimeout(f"could not send the request within {timeout}s")
            return
        sock = self.sock
        assert isinstance(sock, socket.socket)
        try:
            sent = sock.sendmsg(parts)
        except BlockingIOError:
            sent = 0
        if sent == sum(map(len, parts)):  # all of it at once: the usual case
            # No checkpoint here: the call reads its reply next, and that read is one.
            return
        left = list(parts)
        while left:
            while left and sent >= len(left[0]):
                sent -= len(left.pop(0))
            if left:
                left[0] = left[0][sent:]
                with trio.move_on_after(timeout) as scope:
                    await trio.lowlevel.wait_writable(sock)
                if scope.cancelled_caught:
                    raise httpx.WriteTimeout(f"could not send the request within {timeout}s")
                try:
                    sent = sock.sendmsg(left)
                except BlockingIOError:
                    sent = 0
        await trio.lowlevel.checkpoint_if_cancelled()

    async def receive(self, timeout: float) -> bytes:
        """Bytes read (b'' at EOF); ``httpx.ReadTimeout`` if nothing came within
        ``timeout`` s; ``OSError`` or ``trio.BrokenResourceError`` if it broke."""
        if self.tls is not None:
            with trio.move_on_after(timeout):
                return bytes(await self.tls.receive_some(RECEIVE_BYTES))
            raise httpx.ReadTimeout(f"no data from the server for {timeout}s")
        sock = self.sock
        assert isinstance(sock, socket.socket)
        while True:
            try:
                data = sock.recv(RECEIVE_BYTES)
            except BlockingIOError:
                pass
            else:
                await trio.lowlevel.checkpoint_if_cancelled()
                return data
            with trio.move_on_after(timeout) as scope:
                await trio.lowlevel.wait_readable(sock)
            if scope.cancelled_caught:
                raise httpx.ReadTimeout(f"no data from the server for {timeout}s")


class ReadTimer:
    """The read timeouts of a pool's plain-TCP waits: one Trio task for all of them.

    A cancel scope per socket wait (``trio.move_on_after``) cost ~40 Python calls of
    Trio's deadline bookkeeping per wait, about a tenth of a model call's cost on this
    path (bench/README.md, issue 36). Here a waiting read is an entry in a dict of its
    timeout's waits (``waits[read]``, insertion order is deadline order: one timeout,
    one clock), taken out when the wait ends. One system task sleeps until the
    earliest deadline among the dicts' first entries; a read still waiting then is
    marked ``timed_out`` and woken with ``trio.lowlevel.notify_closing`` on its socket
    (its wait raises ``ClosedResourceError``, which the reader turns into
    ``httpx.ReadTimeout``; the connection is closed after, never reused). Deadlines are
    Trio's clock's (a mock clock too). A deadline is never late: a dict that fills
    from empty moves the task's deadline forward if it must (``first_wait``); later
    entries of a dict are due after its first."""

    __slots__ = ("_scope", "_token", "waits")

    def __init__(self) -> None:
        self.waits: dict[float, dict[int, _Connection]] = {}
        """Waiting reads by their timeout, then by ``id`` of their connection."""
        self._scope: trio.CancelScope | None = None
        self._token: trio.lowlevel.TrioToken | None = None

    def first_wait(self, read: float) -> dict[int, _Connection]:
        """The (empty) dict of waits for timeout ``read``, with the task running in
        this Trio run and due no later than a wait starting now."""
        group = self.waits.get(read)
        if group is None:
            group = self.waits[read] = {}
        token = trio.lowlevel.current_trio_token()
        if self._token is not token:  # first wait of this run (a pool can outlive one)
            self._token = token
            self._scope = None
            trio.lowlevel.spawn_system_task(self._run, name="fanfold http read timer")
        elif self._scope is not None:
            deadline = trio.current_time() + read
            if deadline < self._scope.deadline:
                self._scope.deadline = deadline
        return group

    async def _run(self) -> None:
        token = self._token
        while True:
            with trio.CancelScope(deadline=self._sweep()) as scope:
                if self._token is not token:
                    return  # a later run's task took over
                self._scope = scope
                await trio.sleep_forever()

    def _sweep(self) -> float:
        """Wake the reads that are due; the earliest deadline left (or inf)."""
        now = trio.current_time()
        earliest = math.inf
        for group in self.waits.values():
            while group:
                key = next(iter(group))
                conn = group[key]
                if conn.deadline > now:
                    earliest = min(earliest, conn.deadline)
                    break
                del group[key]
                conn.timed_out = True
                # Wakes the wait (ClosedResourceError); the socket stays open until
                # the call closes its connection. (Never an error out of here: one
                # would crash the whole Trio run, this being a system task.)
                with contextlib.suppress(OSError, ValueError):  # closed meanwhile
                    trio.lowlevel.notify_closing(conn.sock)
        return earliest


def _ip_family(host: str) -> int:
    """The address family of an IP address literal; 0 for a host name."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return 0
    return socket.AF_INET6 if address.version == 6 else socket.AF_INET


async def _connect_address(origin: Origin) -> socket.socket:
    """A plain TCP connection to an IP address literal (a local model server's
    ``127.0.0.1``, say): one non-blocking ``connect`` and a wait for it, where
    ``trio.open_tcp_stream`` (made for host names: resolution, happy eyeballs, a
    nursery) costs ~340 Python calls a connection. The socket options Trio's
    ``SocketStream`` sets are set; failures are ``httpx.ConnectError`` carrying the
    ``OSError`` (``ConnectionRefusedError`` for a refused one) as its cause."""
    sock = socket.socket(origin.family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if hasattr(socket, "TCP_NOTSENT_LOWAT"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, 2**14)
        error = sock.connect_ex((origin.host, origin.port))
        if error == errno.EINPROGRESS:
            await trio.lowlevel.wait_writable(sock)
            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        else:
            await trio.lowlevel.checkpoint()
        if error:
            failure = OSError(error, os.strerror(error))
            raise httpx.ConnectError(str(failure)) from failure
    except OSError as exc:
        sock.close()
        raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
    except BaseException:
        # (A cancel or the connect timeout, which ``_connect``'s scope turns into
        # ``ConnectTimeout``: Trio forgets the socket's wait before it is closed.)
        trio.lowlevel.notify_closing(sock)
        sock.close()
        raise
    return sock


def _close(conn: _Connection) -> None:
    # Closing the socket closes the connection whatever the stream over it (TLS: no
    # close_notify, as httpcore does for a connection dropped from its pool).
    trio.lowlevel.notify_closing(conn.sock)
    conn.sock.close()


class Slots:
    """``total_tokens`` calls at once, the others queued in the order they came: what
    ``trio.CapacityLimiter`` does for ``HttpProvider.complete`` (same method names),
    without its bookkeeping (~6 Python calls a call): a free slot is a counter, a freed
    one goes straight to the first waiter. A call holds one slot (its ``borrower``
    names it, as the limiter's API asks: not checked)."""

    __slots__ = ("_lot", "_waiting", "borrowed_tokens", "total_tokens")

    def __init__(self, total: int) -> None:
        self.total_tokens = total
        self.borrowed_tokens = 0
        self._waiting = 0
        self._lot = trio.lowlevel.ParkingLot()

    def acquire_on_behalf_of_nowait(self, borrower: object) -> None:
        """Take a free slot, or raise ``trio.WouldBlock`` (none free, or calls queued)."""
        if self.borrowed_tokens < self.total_tokens and not self._waiting:
            self.borrowed_tokens += 1
            return
        raise trio.WouldBlock

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        """Take a slot, waiting in line for one if none is free."""
        if self.borrowed_tokens < self.total_tokens and not self._waiting:
            self.borrowed_tokens += 1
            try:
                await trio.lowlevel.checkpoint()
            except BaseException:
                self.release_on_behalf_of(borrower)
                raise
            return
        self._waiting += 1
        try:
            await self._lot.park()  # woken by ``release``, its slot handed over
        except BaseException:
            self._waiting -= 1  # cancelled in line: it was never handed one
            raise

    def release_on_behalf_of(self, borrower: object) -> None:
        """Give the slot back: to the first call in line if there is one."""
        if self._waiting and self.borrowed_tokens <= self.total_tokens:
            self._waiting -= 1
            self._lot.unpark()
        else:
            self.borrowed_tokens -= 1


class ConnectionPool:
    """Connections for the HTTP providers' calls, shared by every provider using it.

    ``slots``: ``POOL_SIZE`` calls at once; a call holds one from before its request
    is built until its reply is read (``HttpProvider.complete``), so no call ever waits
    inside the pool and the pool never holds more than ``POOL_SIZE`` connections.
    """

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.slots = Slots(POOL_SIZE)
        self.read_timer = ReadTimer()
        self._ssl_context = ssl_context
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._idle_count = 0
        self.connects = 0
        """Connections opened so far (tests and benchmarks read it)."""

    def _context(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            from fanfold.providers.http import default_ssl_context

            self._ssl_context = default_ssl_context()
        return self._ssl_context

    def _take_idle(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin.key)
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            self._idle_count -= 1
            if conn.usable(now):
                return conn
            _close(conn)
        return None

    def _give_back(self, origin: Origin, conn: _Connection) -> None:
        if self._idle_count >= KEEP_ALIVE:
            _close(conn)
            return
        # The wall's clock, not Trio's: how long the server saw it idle (and one C
        # call, where Trio's clock is three Python calls).
        conn.idle_since = time.monotonic()
        self._idle.setdefault(origin.key, []).append(conn)
        self._idle_count += 1

    async def _connect(self, origin: Origin, timeout: float) -> _Connection:
        with trio.move_on_after(timeout) as scope:
            if origin.family and not origin.tls:
                sock = await _connect_address(origin)
                self.connects += 1
                _log.debug("connected to %s:%d (http)", origin.host, origin.port)
                return _Connection(sock, None)
            try:
                tcp = await trio.open_tcp_stream(origin.host, origin.port)
            except OSError as exc:
                raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
            if not origin.tls:
                # The socket itself, without Trio's stream and socket wrappers: reads
                # and writes try the socket first and wait only when they must.
                sock = socket.socket(fileno=tcp.socket.detach())
                self.connects += 1
                _log.debug("connected to %s:%d (http)", origin.host, origin.port)
                return _Connection(sock, None)
            tls = trio.SSLStream(
                tcp, self._context(), server_hostname=origin.host, https_compatible=True
            )
            try:
                await tls.do_handshake()
            except trio.BrokenResourceError as exc:
                tcp.socket.close()
                cause = exc.__cause__ or exc
                raise httpx.ConnectError(str(cause) or type(cause).__name__) from cause
            except BaseException:
                tcp.socket.close()
                raise
            self.connects += 1
            _log.debug("connected to %s:%d (https)", origin.host, origin.port)
            return _Connection(tcp.socket, tls)
        assert scope.cancelled_caught
        raise httpx.ConnectTimeout(f"no connection within {timeout}s")

    async def send(
        self,
        origin: Origin,
        body: tuple[bytes, ...],
        length: int,
        connect: float,
        read: float,
    ) -> Exchange:
        """Send one POST of ``body`` (``length`` bytes in parts) to ``origin`` and read
        the reply's status and headers. Raises httpx's exceptions (see the module)."""
        # The parts as they are (the tool list's bytes are shared between calls): no
        # copy of the whole request lives while the call waits for its reply.
        parts = (origin.head, b"content-length: %d\r\n\r\n" % length, *body)
        conn = self._take_idle(origin)
        reused = conn is not None
        while True:
            if conn is None:
                conn = await self._connect(origin, connect)
            exchange = Exchange(self, origin, conn, read)
            # (The request and its reply's head in this frame, not in one more
            # coroutine: a waiting call's frames are most of its heap.)
            reader = conn.reader
            try:
                unsent: Exception | None = None
                try:
                    await conn.send_all(parts, read)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    if reused:
                        raise _Stale from None
                    # A server may answer before reading the whole request (a 413, a
                    # 401) and close: its reply is read if it came, as httpcore does.
                    unsent = exc
                try:
                    while not reader.head():
                        await exchange.receive(stale=reused and not reader.received)
                except httpx.TransportError:
                    if unsent is None:
                        raise
                    detail = str(unsent.__cause__ or unsent) or "write failed"
                    raise httpx.WriteError(detail) from unsent
                if _log.isEnabledFor(logging.DEBUG):
                    _log.debug("HTTP Request: POST %s %d", origin.url, reader.status)
                exchange.status = reader.status
                exchange.headers = reader.headers
                exchange.content_type = reader.content_type.decode("latin-1")
                if reader.coded:
                    exchange.set_decoder()
            except _Stale:
                # A reused connection closed under the request: once more on a new one.
                exchange.abandon()
                conn = None
                reused = False
                continue
            except BaseException:
                exchange.abandon()
                raise
            return exchange

    async def aclose(self) -> None:
        """Close every idle connection (calls in progress close theirs when done)."""
        for idle in self._idle.values():
            for conn in idle:
                _close(conn)
        self._idle.clear()
        self._idle_count = 0
        await trio.lowlevel.checkpoint()


class _Stale(Exception):
    """A reused connection broke before any byte of the reply arrived."""


class Exchange:
    """One request and its reply on one connection: the status and headers once
    ``ConnectionPool.send`` returns, then the body (``read_all``, ``read_into``); ``release``
    (always, in a ``finally``) gives the connection back if the reply was read to its
    end, and closes it otherwise."""

    __slots__ = (
        "_conn",
        "_decoder",
        "_origin",
        "_pool",
        "_read",
        "content_type",
        "headers",
        "status",
    )

    def __init__(
        self, pool: ConnectionPool, origin: Origin, conn: _Connection, read: float
    ) -> None:
        self._pool = pool
        self._origin = origin
        self._conn: _Connection | None = conn
        self._read = read
        self._decoder: zlib._Decompress | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        """The reply's headers, names in lower case."""
        self.content_type = ""
        """The reply's ``content-type`` ('' if none)."""

    def set_decoder(self) -> None:
        """Decode the body as its ``content-encoding`` says (gzip, deflate)."""
        for name, value in self.headers:
            if name == b"content-encoding":
                coding = value.strip().lower()
                if coding in (b"gzip", b"x-gzip"):
                    self._decoder = zlib.decompressobj(zlib.MAX_WBITS | 16)
                elif coding == b"deflate":
                    self._decoder = zlib.decompressobj()
                # Any other coding passes through undecoded, as httpx lets it.

    def header(self, name: bytes) -> str:
        """The value of the reply's header ``name`` (lower case), or ''."""
        for key, value in self.headers:
            if key == name:
                return value.decode("latin-1")
        return ""

    def header_map(self) -> dict[str, str]:
        """The reply's headers by lower-case name (repeated ones joined by ', ')."""
        found: dict[str, str] = {}
        for key, value in self.headers:
            name = key.decode("latin-1")
            text = value.decode("latin-1")
            found[name] = f"{found[name]}, {text}" if name in found else text
        return found

    async def receive(self, stale: bool = False) -> None:
        """Read what the server sent next into the connection's reader, within the
        read timeout. ``stale``: no byte of the reply came yet on a reused connection,
        so a connection that broke or ended raises ``_Stale``."""
        conn = self._conn
        assert conn is not None
        try:
            if conn.tls is not None:
                data = await conn.receive(self._read)
            else:
                # Plain TCP: the socket first, and only to wait a read deadline in the
                # pool's ``ReadTimer`` (no cancel scope per wait; no coroutine more on
                # the stack of a waiting call).
                sock = conn.sock
                assert isinstance(sock, socket.socket)
                waited = False
                while True:
                    try:
                        data = sock.recv(RECEIVE_BYTES)
                        break
                    except BlockingIOError:
                        pass
                    read = self._read
                    timer = self._pool.read_timer
                    group = timer.waits.get(read)
                    if not group:
                        group = timer.first_wait(read)
                    conn.deadline = trio.current_time() + read
                    conn.timed_out = False
                    key = id(conn)
                    group[key] = conn
                    try:
                        await trio.lowlevel.wait_readable(sock)
                    except trio.ClosedResourceError:
                        if conn.timed_out:  # the timer woke it: nothing came in time
                            raise httpx.ReadTimeout(
                                f"no data from the server for {read}s"
                            ) from None
                        raise
                    finally:
                        group.pop(key, None)
                    waited = True
                if not waited:  # a wait is a checkpoint; without one, check here
                    await trio.lowlevel.checkpoint_if_cancelled()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            if stale:
                raise _Stale from None
            raise httpx.ReadError(str(exc.__cause__ or exc) or "read failed") from exc
        if not data and stale:
            raise _Stale
        conn.reader.feed(data)

    def _decoded(self, data: bytes) -> bytes:
        if self._decoder is None:
            return data
        try:
            return self._decoder.decompress(data)
        except zlib.error as exc:
            raise httpx.DecodingError(str(exc)) from None

    async def read_all(self) -> bytes:
        """The reply's whole body."""
        parts: list[bytes] = []

        def keep(chunk: bytes) -> bool:
            parts.append(chunk)
            return False

        await self.read_into(keep)
        return b"".join(parts)

    async def read_into(self, feed: Callable[[bytes], bool | None]) -> bool:
        """Feed the body's bytes to ``feed`` (as they come, in pieces) until it returns
        True (then False is returned: the body is not read to its end) or the body
        ends (True)."""
        conn = self._conn
        assert conn is not None
        reader = conn.reader
        while True:
            parts, done = reader.body()
            for data in parts:
                if feed(self._decoded(data)):
                    if done and data is parts[-1] and self._decoder is None:
                        # Stopped at the body's very end (a stream's last event):
                        # read to its end all the same, no ``drain`` needed.
                        self._finished()
                        return True
                    return False
            if done:
                if self._decoder is not None:
                    tail = self._decoder.flush()
                    if tail:
                        feed(tail)
                self._finished()
                return True
            await self.receive()

    async def drain(self, max_bytes: int, seconds: float) -> None:
        """Read the rest of a body nobody needs (so the connection is reused): at most
        ``max_bytes`` within ``seconds``, else the connection is closed at release."""
        read = 0

        def count(chunk: bytes) -> bool:
            nonlocal read
            read += len(chunk)
            return read > max_bytes

        conn = self._conn
        if conn is None:
            return
        try:
            # Usually the body's end came with its last event: no timer for that.
            parts, done = conn.reader.body()
            if any(count(data) for data in parts):
                return
            if done:
                self._finished()
                return
            with trio.move_on_after(seconds):
                await self.read_into(count)
        except httpx.HTTPError:
            return

    def _finished(self) -> None:
        conn = self._conn
        if conn is None:
            return
        reader = conn.reader
        # (``reader.reusable``, written out: once per call.)
        if reader._state == _DONE and reader.keep_alive and not reader._buffer and not reader._eof:
            reader.next_cycle()
            self._conn = None
            self._pool._give_back(self._origin, conn)

    def abandon(self) -> None:
        """Close the connection unless it went back to the pool."""
        if self._conn is not None:
            _close(self._conn)
            self._conn = None

    def release(self) -> None:
        """Done with this exchange: the connection is back in the pool if its reply
        was read to the end, else closed."""
        if self._conn is not None:  # (``abandon``, written out: once per call)
            _close(self._conn)
            self._conn = None
