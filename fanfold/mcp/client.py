"""MCP servers' tools as fanfold tools (``mcp__SERVER__TOOL``).

``McpHub`` owns the declared servers of a run (``fanfold.mcp.config``). A server is
started when a tree first needs it: ``discover()`` (before a tree starts, to list its
tools for the tree's recorded tool set) or the first call of one of its tools (a
resumed tree). It is then shared by every conversation of the runtime, restarted once
after it dies (an HTTP server: connected to again up to ``HTTP_RECONNECTS`` times,
with back-off), and stopped when the hub closes. A later death leaves its tools
answering error results that name the server and say why; the last lines of its
stderr go to the log and the user (``on_failure``), never into the model's context.

A stdio server runs under the ``bash`` tool's supervisor in serve mode
(``fanfold/tools/supervisor.py --serve``): its own session, every process it starts
killed when it exits or when fanfold goes away (the lifeline pipe reaches end-of-file
however fanfold dies, SIGKILL included). Its environment is fanfold's with secret-looking
variables removed (as for bash), plus its declared ``env``.

The transport is fanfold's own line reader (not the SDK's ``stdio_client``) for two
reasons: the process must be the supervisor's, and what it holds is bounded
(``MAX_MESSAGE``): a line past it is read on with its long strings cut as they stream
in (``fanfold.mcp.shrink``), so a 50 MB result arrives cut, as every result is, without
ending the connection; a line that is not JSON-RPC (a banner) is kept in the stderr tail
and skipped, up to ``MAX_NOISE_LINES`` per connection.
The session on top is the SDK's ``ClientSession``.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
import trio

from fanfold.logger import library_logger
from fanfold.mcp.config import ServerDeclaration, expand
from fanfold.mcp.shrink import Shrinker
from fanfold.providers.config import ConfigError
from fanfold.statemachine import ToolSpec
from fanfold.statemachine.messages import thawed_json
from fanfold.tools.output import HeadTailBuffer
from fanfold.tools.progress import BOARD, CURRENT_CALL
from fanfold.tools.schema import SchemaError, check_schema
from fanfold.tools.secrets import EnvPolicy
from fanfold.tools.tool import ToolOutput, valid_tool_name

__all__ = [
    "MAX_MESSAGE",
    "MAX_TOOLS",
    "McpHub",
    "McpServer",
    "McpTool",
    "mcp_tool_name",
    "served_privately",
    "split_tool_name",
]

SUPERVISOR = Path(__file__).resolve().parent.parent / "tools" / "supervisor.py"
MAX_MESSAGE = 8 * 1024 * 1024
"""Bytes one JSON-RPC message (one line) from a server may take."""
MAX_NOISE_LINES = 50
"""Lines that are not JSON-RPC (a banner, a stray print) a stdio server may write on
stdout per connection; each is kept in its stderr tail and skipped. One more ends the
connection: a server that never speaks JSON-RPC is refused with what it printed."""
MAX_TOOLS = 128
MAX_PROMPTS = 100
"""Prompts of one server ``fanfold tools`` names."""
"""Tools one server may offer; a server offering more is refused whole."""
MAX_OUTPUT_CHARS = 30_000
STDERR_TAIL = 2_000
SHUTDOWN_GRACE = 2.0
"""Seconds a server has to exit after its stdin closes, before it is killed."""
HTTP_RECONNECTS = 5
"""Times a Streamable HTTP or SSE server is connected to again after its connection
was lost, per run (a stdio server is restarted once): it may be back, restarted by
its user; each attempt counts, whether it connects or not."""
RECONNECT_BACKOFF = 0.5
"""Seconds after the loss before the first reconnection; doubled for each later one."""
MAX_RECONNECT_WAIT = 8.0
"""The longest wait before a reconnection."""
PREFIX = "mcp__"
UNDER_FANFOLD = "FANFOLD_MCP_PARENT"
"""Set in a stdio server's environment: a ``fanfold mcp`` seeing it starts no servers."""


def mcp_tool_name(server: str, tool: str) -> str:
    """The fanfold name of ``tool`` of ``server``: ``mcp__SERVER__TOOL`` (Claude Code's)."""
    return f"{PREFIX}{server}__{tool}"


def split_tool_name(name: str) -> tuple[str, str] | None:
    """(server, tool) of an ``mcp__SERVER__TOOL`` name; None for any other name.
    Server names never hold ``__`` (``fanfold.mcp.config``), so the split is unique."""
    if not name.startswith(PREFIX):
        return None
    server, sep, tool = name[len(PREFIX) :].partition("__")
    return (server, tool) if sep and server and tool else None


def served_privately(tool: Any) -> bool:
    """Whether ``tool`` is one of an agent file's server's (``private``): an MCP tool
    of such a server. The resource tools (``fanfold.mcp.resources``) serve the run's
    shared servers only."""
    server = getattr(tool, "server", None)
    return server is not None and bool(server.declaration.private)


class ServerUnavailable(Exception):
    """The server cannot be used; the message names it and says why.

    ``message`` is what the model is told (an error result); ``str()`` adds the last
    lines of the server's stderr (``stderr``), for the user (a problem line, the log):
    a traceback there may be another call's, and is no business of the model's."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(f"{message}; its stderr ends: {stderr}" if stderr else message)
        self.message = message
        self.stderr = stderr


class McpTool:
    """One tool of an MCP server, as a fanfold ``Tool``."""

    def __init__(
        self,
        server: McpServer,
        tool: str,
        spec: ToolSpec,
    ) -> None:
        self.server = server
        self.tool = tool
        self.spec = spec
        self.read_only = spec.read_only
        """The server's ``readOnlyHint`` (in the spec, as recorded): its own claim
        (``read-only`` rules take it)."""
        self.idempotent = tool in server.declaration.idempotent_tools
        """Declared in the user's configuration (``idempotent_tools``), never taken
        from the server: a call in flight at a crash is re-sent only then."""

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        # A plain copy: the client library may change what it sends, and ``args`` are
        # the call's kept arguments, read-only (ToolCall.arguments).
        return await self.server.call(self.tool, thawed_json(args))


class McpServer:
    """One declared server: started on first use, shared, restarted once."""

    def __init__(self, declaration: ServerDeclaration, hub: McpHub) -> None:
        self.declaration = declaration
        self.name = declaration.name
        self.hub = hub
        self.session: Any = None
        self.starts = 0
        self.failure: str | None = None
        """Why the last connection ended (it died, exit status, a broken message)."""
        self.stderr = HeadTailBuffer(STDERR_TAIL)
        self.problem: str | None = None
        """Why ``discover`` offers none of its tools (waits for trust, failed)."""
        self.left_out: list[str] = []
        """Its tools ``discover`` left out, each with why."""
        self.http_errors = 0
        """HTTP error statuses a Streamable HTTP server answered (counted, so that a
        call can tell whether one came while it waited)."""
        self.http_error: str | None = None
        """The last of them, ``HTTP 503 Service Unavailable``."""
        self.noise_lines = 0
        """Lines on the current connection's stdout that were not JSON-RPC (skipped)."""
        self.first_noise: str | None = None
        self.lost_at: float | None = None
        """When (``trio.current_time``) the last connection was lost or failed: an
        HTTP reconnection waits out its back-off from then."""
        self._reported: set[str] = set()
        self.capabilities: Any = None
        """What the server declared at ``initialize`` (``resources``, ``prompts``...)."""
        self.prompts: list[str] = []
        """Its prompts as ``discover`` listed them (``name(arg, ...)``), for
        ``fanfold tools``: MCP prompts are the user's, never offered to the model."""
        self.notes = ServerNotes(self)
        """Its log notifications (to fanfold's log, bounded) and its calls' progress."""
        self._lock = trio.Lock()
        self._wake: trio.Event | None = None

    # -- lifecycle

    def _unavailable(self, what: str) -> ServerUnavailable:
        return ServerUnavailable(f"MCP server {self.name!r} {what}", self.stderr_tail())

    def _failed(self, tool: str, exc: ServerUnavailable) -> ToolOutput:
        """The error result of a call the server could not answer: its message only.
        The server's stderr tail goes to fanfold's log (a ``mcp_call_failed``
        warning) and, once per distinct failure, to the hub's ``on_failure`` (the
        CLI's yellow line), never into the model's context."""
        # fanfold's logger (the CLI's JSON log; stderr in a program that configured
        # none, never its stdout).
        library_logger().warning(
            "mcp_call_failed", server=self.name, tool=tool, error=exc.message, stderr=exc.stderr
        )
        said = str(exc)
        if self.hub.on_failure is not None and said not in self._reported:
            self._reported.add(said)
            self.hub.on_failure(said)
        return ToolOutput.error(exc.message)

    def stderr_tail(self) -> str:
        text = self.stderr.text().strip()
        return " | ".join(line for line in text.splitlines()[-8:] if line.strip())[-600:]

    async def ensure(self) -> Any:
        """The live session, starting (or restarting, once) the server; raises
        ``ServerUnavailable``."""
        async with self._lock:
            if self.session is not None:
                return self.session
            if self.declaration.needs_trust:
                raise ServerUnavailable(
                    f"MCP server {self.name!r} is declared by the project "
                    f"({self.declaration.source}) and not trusted: run "
                    f"`fanfold trust {self.declaration.source}` if you trust it"
                )
            if self.hub.closed:
                raise ServerUnavailable(f"MCP server {self.name!r}: fanfold is shutting down")
            http = self.declaration.command is None
            if not http and self.starts >= 2:
                why = self.failure or "stopped"
                raise self._unavailable(f"{why}, and was restarted once already")
            if http and self.starts > HTTP_RECONNECTS:
                why = self.failure or "stopped"
                raise self._unavailable(
                    f"{why}, and was reconnected {HTTP_RECONNECTS} times already"
                )
            if http and self.starts and self.lost_at is not None:
                # An HTTP server is someone else's process: it may be back in a moment
                # (restarted, redeployed). Each reconnection waits longer after the
                # loss, so the bounded attempts span some seconds, not one burst.
                wait = min(RECONNECT_BACKOFF * 2 ** (self.starts - 1), MAX_RECONNECT_WAIT)
                await trio.sleep_until(self.lost_at + wait)
            self.starts += 1
            timeout = self.declaration.startup_timeout
            http_errors = self.http_errors
            try:
                with trio.fail_after(timeout):
                    await self.hub.nursery.start(self._serve)
            except trio.TooSlowError:
                self.lost_at = trio.current_time()
                self.failure = f"did not answer initialize within {timeout:g} s"
                if self.noise_lines:
                    self.failure += (
                        f"; it wrote {self.noise_lines} line(s) on stdout that are not "
                        f"JSON-RPC, the first: {self.first_noise!r}"
                    )
                raise self._unavailable(self.failure) from None
            except ServerUnavailable:
                self.lost_at = trio.current_time()
                raise
            except Exception as exc:  # the SDK's MCPError, a closed stream, OSError
                self.lost_at = trio.current_time()
                status = f"answered {self.http_error}: " if self.http_errors > http_errors else ""
                self.failure = self.failure or f"failed to start: {status}{_one_line(exc)}"
                raise self._unavailable(self.failure) from None
            return self.session

    async def _serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from mcp.client.session import ClientSession

        wake = self._wake = trio.Event()
        self.failure = None
        self.noise_lines, self.first_noise = 0, None
        started = False
        session: Any = None
        try:
            with trio.CancelScope() as goodbye:
                async with (
                    self._transport(wake) as (read, write),
                    ClientSession(
                        read,
                        write,
                        logging_callback=self.notes.log,
                        message_handler=self.notes.message,
                    ) as session,
                ):
                    await session.initialize()
                    self.capabilities = session.server_capabilities
                    self.session = session
                    started = True
                    task_status.started()
                    await wake.wait()
                    if self.session is session:
                        self.session = None
                    # Closing says goodbye: over Streamable HTTP the SDK's DELETE of the
                    # session, which a hung server would hold for the HTTP client's
                    # 300 s read timeout (and fanfold's exit with it). It gets the
                    # grace a stdio server gets to exit; a stdio server's own stop is
                    # shielded inside (``_stop``: stdin closed, then killed).
                    goodbye.deadline = trio.current_time() + SHUTDOWN_GRACE
        except Exception as exc:
            # Before the start, the caller reports it; after, a connection that ends
            # badly (the SDK raising on a broken stream) must not take the runtime
            # down with it: the reason is kept for the next call's error result.
            if not started:
                raise
            if self._wake is wake:  # (not if a newer connection has replaced this one)
                self.failure = self.failure or f"ended: {_one_line(exc)}"
        finally:
            self.lost_at = trio.current_time()
            # A connection dropped by a call (``_lost``) may still be saying goodbye
            # when the next call has started a new one: only our own session is ours
            # to clear.
            if session is None or self.session is session:
                self.session = None

    def _transport(self, wake: trio.Event) -> Any:
        if self.declaration.command is not None:
            return self._stdio(wake)
        return self._http(wake)

    @asynccontextmanager
    async def _http(self, wake: trio.Event) -> AsyncIterator[tuple[Any, Any]]:
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        headers = self._expanded(self.declaration.headers, "headers")
        client = create_mcp_http_client(headers=headers)

        async def on_response(response: Any) -> None:
            # The SDK turns a status of 400 or more into "Server returned an error
            # response" without the status; the call's error result names it.
            if response.status_code >= 400:
                self.http_errors += 1
                self.http_error = f"HTTP {response.status_code} {response.reason_phrase}".strip()

        hooks = dict(client.event_hooks)
        hooks["response"] = [*hooks.get("response", []), on_response]
        client.event_hooks = hooks
        if self.declaration.sse:
            from mcp.client.sse import sse_client

            # The SDK's HTTP+SSE client (``type = "sse"``), on the same HTTP client:
            # it opens (and closes) the client it is given.
            def same_client(headers: Any = None, timeout: Any = None, auth: Any = None) -> Any:
                return client

            url = self.declaration.url or ""
            async with sse_client(url, httpx_client_factory=same_client) as (read, write):
                yield read, write
            return
        async with (
            client,
            streamable_http_client(self.declaration.url or "", http_client=client) as (
                read,
                write,
            ),
        ):
            yield read, write

    def _expanded(self, pairs: Iterable[tuple[str, str]], key: str) -> dict[str, str]:
        where = f"{self.declaration.source}: mcp server {self.name}: {key}"
        try:
            return {k: expand(v, self.hub.environ, f"{where}.{k}") for k, v in pairs}
        except ConfigError as exc:
            self.failure = str(exc)
            raise ServerUnavailable(f"MCP server {self.name!r}: {exc}") from None

    @asynccontextmanager
    async def _stdio(self, wake: trio.Event) -> AsyncIterator[tuple[Any, Any]]:
        from mcp.shared.message import SessionMessage

        declaration = self.declaration
        env = self.hub.env_policy.command_env(self.hub.environ)
        env.update(self._expanded(declaration.env, "env"))
        # A `fanfold mcp` started as a server of this one starts no servers of its own:
        # a project whose .mcp.json names fanfold itself would otherwise chain them.
        env[UNDER_FANFOLD] = "1"
        cwd = Path(self.hub.cwd, declaration.cwd) if declaration.cwd else Path(self.hub.cwd)
        lifeline_r, lifeline_w = os.pipe()
        status_r, status_w = os.pipe()
        argv = [sys.executable, "-I", "-S", str(SUPERVISOR), "--serve", str(lifeline_r)]
        argv += [str(status_w), declaration.command or "", *declaration.args]
        try:
            process = await trio.lowlevel.open_process(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(lifeline_r, status_w),
                env=env,
                cwd=str(cwd),
            )
        except OSError as exc:
            for fd in (lifeline_r, lifeline_w, status_r, status_w):
                os.close(fd)
            self.failure = f"cannot be started: {exc.strerror or exc}"
            raise ServerUnavailable(f"MCP server {self.name!r} {self.failure}") from None
        os.close(lifeline_r)
        os.close(status_w)
        assert process.stdin and process.stdout and process.stderr
        read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)
        stdout, stdin, stderr = process.stdout, process.stdin, process.stderr

        async def reader() -> None:
            buffer = bytearray()
            # A line past MAX_MESSAGE is read on through a Shrinker (its long strings
            # cut as they stream in) or, if even its structure is too large, drained
            # to its end: neither ends the connection (_deliver).
            long_line: Shrinker | _Drain | None = None
            try:
                async with read_send:
                    while True:
                        chunk = bytes(await stdout.receive_some(65536))
                        if not chunk:
                            break
                        if long_line is not None:
                            end = chunk.find(b"\n")
                            long_line.feed(chunk if end < 0 else chunk[:end])
                            if isinstance(long_line, Shrinker) and long_line.size() > MAX_MESSAGE:
                                long_line = _Drain(long_line.text()[:4096], long_line.size())
                            if end < 0:
                                continue
                            if not await self._deliver(long_line, read_send):
                                return
                            long_line = None
                            chunk = chunk[end + 1 :]
                        buffer += chunk
                        while (end := buffer.find(b"\n")) >= 0:
                            line = bytes(buffer[:end])
                            del buffer[: end + 1]
                            if not await self._deliver(line, read_send):
                                return
                        if len(buffer) > MAX_MESSAGE:
                            long_line = Shrinker()
                            long_line.feed(bytes(buffer))
                            buffer.clear()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, trio.ClosedResourceError):
                pass
            finally:
                if self.failure is None:
                    self.failure = "died"
                wake.set()

        async def writer() -> None:
            try:
                async with write_recv:
                    async for message in write_recv:
                        data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                        await stdin.send_all(data.encode() + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                self.failure = self.failure or "died"
                wake.set()

        async def errors() -> None:
            try:
                while chunk := await stderr.receive_some(65536):
                    self.stderr.feed(chunk)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                nursery.start_soon(writer)
                nursery.start_soon(errors)
                try:
                    yield read_recv, write_send
                finally:
                    with trio.CancelScope(shield=True):
                        await _stop(process, lifeline_w)
                    nursery.cancel_scope.cancel()
        finally:
            report = _report(status_r)
            os.close(status_r)
            if report.get("end") == "error" and report.get("error"):
                # The supervisor could not start the command: say what it said
                # ("cannot start nope: No such file or directory"), not "died".
                self.failure = report["error"]
            elif self.failure == "died" and ("code" in report or "signal" in report):
                how = (
                    f"signal {report['signal']}"
                    if "signal" in report
                    else f"status {report['code']}"
                )
                self.failure = f"exited ({how})"

    async def _deliver(self, line: bytes | Shrinker | _Drain, read_send: Any) -> bool:
        """Hand one line from a stdio server's stdout to the session; False when the
        connection must end (``self.failure`` says why).

        A line over ``MAX_MESSAGE`` arrives with its long strings cut (``Shrinker``:
        a result of a few MB, whose text the SDK's servers send twice, reaches the
        model cut to its head and tail as any result is); one whose structure alone is
        too large is answered, for its request, with an error in its place. Neither
        ends the connection: a result's size is not a broken server. A line that is
        not JSON-RPC (a banner, a print) is kept in the stderr tail and skipped, up to
        ``MAX_NOISE_LINES`` per connection."""
        import mcp_types
        from mcp.shared.message import SessionMessage

        if isinstance(line, _Drain):
            return await self._refuse_oversized(line, read_send)
        if isinstance(line, Shrinker):
            line = line.text()
        line = line.strip()
        if not line:
            return True
        if len(line) > MAX_MESSAGE:
            shrinker = Shrinker()
            shrinker.feed(line)
            line = shrinker.text()
            if len(line) > MAX_MESSAGE:
                return await self._refuse_oversized(_Drain(line[:4096], len(line)), read_send)
        try:
            message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValueError:
            self.noise_lines += 1
            shown = line[:200].decode("utf-8", "backslashreplace")
            self.first_noise = self.first_noise or shown[:80]
            self.stderr.feed(f"(on stdout, not JSON-RPC) {shown}\n".encode())
            if self.noise_lines > MAX_NOISE_LINES:
                self.failure = (
                    f"wrote {self.noise_lines} lines that are not JSON-RPC "
                    f"(the first: {self.first_noise!r})"
                )
                return False
            return True
        await read_send.send(SessionMessage(message))
        return True

    async def _refuse_oversized(self, drained: _Drain, read_send: Any) -> bool:
        """Answer the request of a message too large to read, even cut, with an error
        in its place (its id is in its first bytes, where JSON-RPC writes it)."""
        import mcp_types
        from mcp.shared.message import SessionMessage

        found = _ID.search(drained.head)
        why = (
            f"answered with a message larger than {MAX_MESSAGE // (1024 * 1024)} MiB even with "
            f"its long texts cut ({drained.size} bytes or more): not read"
        )
        if found is None:
            self.stderr.feed(f"(on stdout) a message without an id: {why}\n".encode())
            return True
        error = f'{{"jsonrpc":"2.0","id":{found.group(1).decode()},"error":'
        error += json.dumps({"code": -32603, "message": why}) + "}"
        message = mcp_types.jsonrpc_message_adapter.validate_json(error, by_name=False)
        await read_send.send(SessionMessage(message))
        return True

    async def stop(self) -> None:
        """Ask the server to stop (its task closes the session and the process)."""
        if self._wake is not None:
            self._wake.set()

    async def _lost(self, session: Any) -> None:
        """Drop ``session``, whose connection is gone, if it is still the live one."""
        async with self._lock:
            if self.session is session:
                self.session = None
                await self.stop()

    # -- calls

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutput:
        """Call ``tool``; every failure is an error result naming the server. Its
        progress notifications go to ``BOARD`` while it runs (``CURRENT_CALL``)."""
        key = CURRENT_CALL.get()
        try:
            return await self._call(tool, arguments, key)
        finally:
            if key is not None:
                # One line in fanfold's log per call that reported progress: its
                # latest report and how many came (never one line per report).
                last = BOARD.get(*key)
                if last is not None:
                    self.hub.logger.info(
                        "mcp_progress",
                        server=self.name,
                        tool=tool,
                        conversation_id=key[0],
                        call=key[1],
                        progress=last.describe(),
                        reports=last.count,
                    )
                BOARD.done(key)
            self.notes.flush()

    async def _call(
        self, tool: str, arguments: dict[str, Any], key: tuple[str, int] | None
    ) -> ToolOutput:
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        try:
            session = await self.ensure()
        except ServerUnavailable as exc:
            return self._failed(tool, exc)
        timeout = self.declaration.timeout
        http_errors = self.http_errors
        progress = None if key is None else self.notes.progress_callback(key)
        with trio.move_on_after(timeout) as scope:
            try:
                result = await session.call_tool(tool, arguments, progress_callback=progress)
            except MCPError as exc:
                if self.session is None or self.failure is not None:
                    why = self.failure or "closed the connection"
                    return self._failed(tool, self._unavailable(f"{why} during the call"))
                if exc.code == CONNECTION_CLOSED:
                    # The SDK's word for a connection gone under the call: over
                    # Streamable HTTP a server that died (its stream ended without an
                    # answer, or nothing listens any more). Over stdio end-of-file says
                    # so first (above); here nothing else would, and the session would
                    # answer "Connection closed" to every later call without ever
                    # reconnecting. It is dropped: the next call connects again, once,
                    # as a restarted stdio server would be.
                    self.failure = f"closed the connection ({_one_line(exc)})"
                    await self._lost(session)
                    return self._failed(tool, self._unavailable(f"{self.failure} during the call"))
                status = f"answered {self.http_error}: " if self.http_errors > http_errors else ""
                return ToolOutput.error(f"MCP server {self.name!r}: {status}{_one_line(exc)}")
            except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                why = self.failure or _one_line(exc)
                return self._failed(tool, self._unavailable(f"{why} during the call"))
            except Exception as exc:  # an answer the SDK cannot read (pydantic, ...)
                return ToolOutput.error(
                    f"MCP server {self.name!r}: {tool} answered with something that is not "
                    f"a tool result: {_one_line(exc)}"
                )
        if scope.cancelled_caught:
            return ToolOutput.error(
                f"MCP server {self.name!r}: {tool} timed out after {timeout:g} s "
                "(the server was told to cancel it)"
            )
        return _output(result)

    @property
    def has_resources(self) -> bool:
        """Whether the server declared the ``resources`` capability (once started)."""
        return self.capabilities is not None and self.capabilities.resources is not None

    async def request(self, work: Any, what: str) -> ToolOutput:
        """``await work(session)`` (a ``resources/...`` request) under the server's
        call timeout; every failure is an error result naming the server."""
        from mcp.shared.exceptions import MCPError

        try:
            session = await self.ensure()
        except ServerUnavailable as exc:
            return ToolOutput.error(str(exc))
        timeout = self.declaration.timeout
        with trio.move_on_after(timeout):
            try:
                output: ToolOutput = await work(session)
                return output
            except MCPError as exc:
                if self.session is None or self.failure is not None:
                    why = self.failure or "closed the connection"
                    return ToolOutput.error(str(self._unavailable(f"{why} during {what}")))
                return ToolOutput.error(f"MCP server {self.name!r}: {what}: {_one_line(exc)}")
            except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                why = self.failure or _one_line(exc)
                return ToolOutput.error(str(self._unavailable(f"{why} during {what}")))
            except Exception as exc:  # an answer the SDK cannot read (pydantic, ...)
                return ToolOutput.error(
                    f"MCP server {self.name!r}: {what} answered with something that is not "
                    f"its result: {_one_line(exc)}"
                )
        return ToolOutput.error(f"MCP server {self.name!r}: {what} timed out after {timeout:g} s")

    async def list_prompts(self) -> list[str]:
        """Its prompts (``name(arg, arg?)``, the first ``MAX_PROMPTS``) if it declares
        the ``prompts`` capability; for ``fanfold tools``, never for the model."""
        if self.capabilities is None or self.capabilities.prompts is None:
            return []
        session = await self.ensure()
        with trio.move_on_after(self.declaration.startup_timeout):
            page = await session.list_prompts()
            names = []
            for prompt in page.prompts[:MAX_PROMPTS]:
                arguments = [
                    f"{a.name}{'' if a.required else '?'}" for a in (prompt.arguments or [])
                ]
                names.append(f"{prompt.name}({', '.join(arguments)})"[:200])
            return names
        return []

    async def list_tools(self) -> list[Any]:
        """The server's tools (every page); raises ``ServerUnavailable``."""
        import mcp_types

        session = await self.ensure()
        tools: list[Any] = []
        cursor: str | None = None
        with trio.fail_after(self.declaration.startup_timeout):
            while True:
                params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await session.list_tools(params=params)
                # The limit counts what is offered: the declaration's include_tools
                # and exclude_tools choose first.
                tools += [t for t in page.tools if self.declaration.offers(str(t.name))]
                if len(tools) > MAX_TOOLS:
                    raise ServerUnavailable(
                        f"MCP server {self.name!r} offers more than {MAX_TOOLS} tools: refused "
                        "(a tool list that long would fill the model's context; choose its "
                        "tools with include_tools or exclude_tools)"
                    )
                cursor = page.next_cursor
                if not cursor:
                    return tools


LOG_BURST = 20
"""Log notifications of one server written to fanfold's log per ``LOG_WINDOW``; the
rest are counted, and the next line written says how many were dropped."""
LOG_WINDOW = 1.0
MAX_LOG_CHARS = 1000
"""Characters of one log notification's data written to fanfold's log."""
_LOG_LEVELS = {
    "debug": "debug",
    "info": "info",
    "notice": "info",
    "warning": "warning",
    "error": "error",
    "critical": "error",
    "alert": "error",
    "emergency": "error",
}


# C0 and C1 controls, DEL, and the bidirectional-text and line/paragraph separators
# (as fanfold.cli.display.printable takes them out of what a terminal shows).
_UNPRINTABLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]"
)


def _escaped(found: re.Match[str]) -> str:
    return found.group().encode("unicode_escape").decode("ascii")


class ServerNotes:
    """What a server says besides answers: ``notifications/message`` (its log: into
    fanfold's structlog log, ``mcp_server_log``, at most ``LOG_BURST`` lines per
    ``LOG_WINDOW`` per server, never into the model's context),
    ``notifications/progress`` (the latest per call, on ``fanfold.tools.progress.BOARD``
    for the live view) and ``notifications/tools/list_changed`` (counted in
    ``tools_changed``: the server's tools are listed anew after the tool call it came
    with, and every conversation is given a ``ToolsChanged``; see
    ``ServedTools.tool_changes`` and DESIGN.md "MCP beyond tools")."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.tools_changed = 0
        """``notifications/tools/list_changed`` received (all connections)."""
        self.tools_listed = 0
        """``tools_changed`` when its tools were last listed (``McpHub.changed``)."""
        self.logged = 0
        self.dropped = 0
        """Log notifications not written (over the rate), since the last line written."""
        self._window_start = -math.inf
        self._in_window = 0

    async def log(self, params: Any) -> None:
        """A ``notifications/message``: one line of fanfold's log, rate-limited."""
        now = trio.current_time()
        if now - self._window_start >= LOG_WINDOW:
            self._window_start, self._in_window = now, 0
        if self._in_window >= LOG_BURST:
            self.dropped += 1
            return
        self._in_window += 1
        self.logged += 1
        data = params.data
        text = data if isinstance(data, str) else json.dumps(data, default=str)
        level = _LOG_LEVELS.get(str(params.level), "info")
        fields: dict[str, Any] = {"server": self.server.name, "level_mcp": str(params.level)}
        if params.logger:
            fields["logger_mcp"] = str(params.logger)[:100]
        if self.dropped:
            fields["dropped"], self.dropped = self.dropped, 0
        # A warning or an error reaches the terminal too (the console renderer writes
        # strings as they are): the server's text never carries a control character
        # there (an escape sequence could clear the screen or fake a line).
        text = _UNPRINTABLE.sub(_escaped, text[:MAX_LOG_CHARS])
        getattr(self.server.hub.logger, level)("mcp_server_log", text=text, **fields)

    async def message(self, message: Any) -> None:
        """Every notification the session surfaces (and transport errors)."""
        import mcp_types

        if isinstance(message, mcp_types.ToolListChangedNotification):
            self.tools_changed += 1

    def flush(self) -> None:
        """Say how many log notifications were dropped, if any (at a call's end)."""
        if self.dropped:
            self.server.hub.logger.info(
                "mcp_server_log_dropped", server=self.server.name, dropped=self.dropped
            )
            self.dropped = 0

    def progress_callback(self, key: tuple[str, int]) -> Any:
        """The SDK's ``progress_callback`` for the call ``key``: each report replaces
        the call's last on the board (a dictionary store: bounded however many come)."""

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            BOARD.report(key, progress, total, message)

        return on_progress


class McpHub:
    """The MCP servers of one runtime (open it with ``McpHub.open``)."""

    def __init__(
        self,
        declarations: Iterable[ServerDeclaration],
        nursery: trio.Nursery,
        *,
        cwd: str | Path,
        env_policy: EnvPolicy,
        environ: Mapping[str, str],
    ) -> None:
        self.nursery = nursery
        self.cwd = str(cwd)
        self.env_policy = env_policy
        self.environ = environ
        self.closed = False
        from fanfold.logger import library_logger

        self.logger: Any = library_logger()
        """Where servers' log notifications go (``ServerNotes``)."""
        self.servers = {d.name: McpServer(d, self) for d in declarations}
        self.on_failure: Callable[[str], None] | None = None
        """Called with each distinct failure of a call (the server's message and the
        last lines of its stderr), for the user: the CLI prints it as a yellow line.
        The model's error result holds the message alone."""

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        declarations: Iterable[ServerDeclaration],
        *,
        cwd: str | Path = ".",
        env_policy: EnvPolicy | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> AsyncIterator[McpHub]:
        """A hub over ``declarations``; nothing starts until a tool is needed. On exit
        every server is stopped (stdin closed, then killed with all it started)."""
        async with trio.open_nursery() as nursery:
            hub = cls(
                declarations,
                nursery,
                cwd=cwd,
                env_policy=env_policy or EnvPolicy(),
                environ=os.environ if environ is None else environ,
            )
            try:
                yield hub
            finally:
                hub.closed = True
                for server in hub.servers.values():
                    await server.stop()

    async def discover(self) -> tuple[list[McpTool], list[str]]:
        """Start every server that may start and list its tools. Returns the tools and
        the problems (a server waiting for trust, failing to start, a tool left out),
        one line each."""
        # Servers start side by side (each start is seconds: the interpreter, the SDK,
        # initialize), and their answers are put together in declaration order.
        listed: dict[str, list[Any] | str] = {}

        async def one(server: McpServer) -> None:
            try:
                server.notes.tools_listed = server.notes.tools_changed
                listed[server.name] = await server.list_tools()
                try:
                    server.prompts = await server.list_prompts()
                except Exception as exc:  # prompts are only shown: a failure is a note
                    server.prompts = [f"(prompts/list failed: {_one_line(exc)})"]
            except (ServerUnavailable, trio.TooSlowError) as exc:
                listed[server.name] = (
                    str(exc) or f"MCP server {server.name!r}: tools/list timed out"
                )
                await server.stop()
            except Exception as exc:  # an SDK error answering tools/list
                listed[server.name] = (
                    f"MCP server {server.name!r}: tools/list failed: {_one_line(exc)}"
                )

        async with trio.open_nursery() as nursery:
            for server in self.servers.values():
                if not server.declaration.needs_trust:
                    nursery.start_soon(one, server)
        tools: list[McpTool] = []
        problems: list[str] = []
        for server in self.servers.values():
            if server.declaration.needs_trust:
                server.problem = _trust_problem(server)
                problems.append(server.problem)
                continue
            answer = listed[server.name]
            if isinstance(answer, str):
                server.problem = answer
                problems.append(answer)
                continue
            _take_listed(server, answer, tools, problems)
        return tools, problems

    def changed(self) -> list[McpServer]:
        """The servers that sent ``notifications/tools/list_changed`` since their tools
        were last listed."""
        return [s for s in self.servers.values() if s.notes.tools_changed > s.notes.tools_listed]

    async def relist(self, server: McpServer) -> tuple[list[McpTool], list[str]]:
        """``server``'s tools listed again (it said they changed), and the problems."""
        server.notes.tools_listed = server.notes.tools_changed
        try:
            answer = await server.list_tools()
        except (ServerUnavailable, trio.TooSlowError) as exc:
            return [], [str(exc) or f"MCP server {server.name!r}: tools/list timed out"]
        except Exception as exc:  # an SDK error answering tools/list
            return [], [f"MCP server {server.name!r}: tools/list failed: {_one_line(exc)}"]
        tools: list[McpTool] = []
        problems: list[str] = []
        server.left_out = []
        _take_listed(server, answer, tools, problems)
        return tools, problems

    def resource_tools(self) -> list[Any]:
        """``list_mcp_resources`` and ``read_mcp_resource`` (``fanfold.mcp.resources``)
        if, after ``discover``, a started server shared by the run offers resources."""
        from fanfold.mcp.resources import resource_tools

        return list(resource_tools(self))

    def tools_for(self, specs: Iterable[ToolSpec]) -> list[Any]:
        """Tools for recorded specs (a resumed tree): their servers start on the
        first call. Specs of servers not declared here are left out; the resource
        tools' specs give those tools (over the servers declared here)."""
        from fanfold.mcp.resources import ResourceTool
        from fanfold.statemachine.permissions import MCP_RESOURCE_TOOLS

        made: list[Any] = []
        for spec in specs:
            if spec.name in MCP_RESOURCE_TOOLS:
                made.append(ResourceTool(self, spec))
                continue
            split = split_tool_name(spec.name)
            if split is None or split[0] not in self.servers:
                continue
            made.append(McpTool(self.servers[split[0]], split[1], spec))
        return made


def _trust_problem(server: McpServer) -> str:
    source = server.declaration.source
    return (
        f"MCP server {server.name!r} waits for trust: declared by the project in {source}; "
        f"run `fanfold trust {source}` if you trust it"
    )


def _take_listed(server: McpServer, answer: Any, tools: list[McpTool], problems: list[str]) -> None:
    """``server``'s listed tools into ``tools``; each left out (a bad schema, a second
    tool of one name) into ``problems`` and ``server.left_out``. Shared by ``discover``
    and ``relist``, so a tool list read again is held to the same rules."""
    seen: set[str] = set()
    for tool in answer:
        if str(tool.name) in seen:
            # Two tools of one name: the first is kept, as the server listed them (a
            # tool set takes a name once: this failed every run).
            twice = (
                f"MCP server {server.name!r}: tool {str(tool.name)[:80]!r} left out: "
                "the server offers another tool of that name (the first is kept)"
            )
            server.left_out.append(twice)
            problems.append(twice)
            continue
        seen.add(str(tool.name))
        made = _tool(server, tool)
        if isinstance(made, str):
            server.left_out.append(made)
            problems.append(made)
        else:
            tools.append(made)


def _tool(server: McpServer, tool: Any) -> McpTool | str:
    name = mcp_tool_name(server.name, str(tool.name))
    if not valid_tool_name(name):
        return (
            f"MCP server {server.name!r}: tool {str(tool.name)[:80]!r} left out: {name[:100]!r} "
            "is not a name a model can call (1-64 letters, digits, '_' or '-')"
        )
    # The schema as the server gave it (pydantic's ``$defs``/``$ref``/``anyOf``,
    # ``format``, ``pattern``...): what the model is offered and what the call's
    # arguments are checked against; only a schema that is not valid JSON Schema, or
    # not an object's (MCP's rule for a tool's input), is refused.
    schema = tool.input_schema
    try:
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise SchemaError("its input schema is not an object schema")
        check_schema(schema, "its input schema")
    except SchemaError as exc:
        return f"MCP server {server.name!r}: tool {tool.name!r} left out: {exc}"
    description = (tool.description or "").strip() or f"{tool.name} (MCP server {server.name})"
    annotations = getattr(tool, "annotations", None)
    read_only = bool(annotations is not None and annotations.read_only_hint)
    # ``ask_tools`` in the server's declaration: every call waits for a person (issue 35).
    asks = server.declaration.asks(str(tool.name))
    spec = ToolSpec.from_schema(
        name, description[:4000], schema, read_only=read_only, needs_approval=asks
    )
    return McpTool(server, str(tool.name), spec)


def _output(result: Any) -> ToolOutput:
    """A ``CallToolResult`` as a tool result: text, structured content as JSON,
    other blocks as short placeholders, capped like every tool's output."""
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            size = len(block.data) * 3 // 4
            parts.append(f"[{kind}: {block.mime_type}, about {size} bytes, not shown]")
        elif kind == "resource":
            text = getattr(block.resource, "text", None)
            parts.append(text if text is not None else f"[resource {block.resource.uri}: binary]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {block.uri}]")
        else:
            parts.append(f"[{kind or 'unknown'} content, not shown]")
    structured = result.structured_content
    if structured is not None and not _carried(parts, structured):
        parts.append(json.dumps(structured, ensure_ascii=False, sort_keys=True))
    text = "\n".join(parts)
    if len(text) > MAX_OUTPUT_CHARS:
        buffer = HeadTailBuffer(MAX_OUTPUT_CHARS)
        buffer.feed(text.encode())
        text = buffer.text()
    return ToolOutput(text, bool(result.is_error))


def _carried(parts: list[str], structured: Any) -> bool:
    """Whether the text blocks already say what ``structured`` does: the same JSON, or
    the SDK's wrapping of a plain return value (``{"result": <the text>}``)."""
    text = "\n".join(parts)
    candidates = [structured]
    if isinstance(structured, dict) and set(structured) == {"result"}:
        candidates.append(structured["result"])
    try:
        parsed: Any = json.loads(text)
    except ValueError:
        parsed = _NOTHING
    return any(c in (text, parsed) for c in candidates)


_NOTHING = object()


async def _stop(process: trio.Process, lifeline_w: int) -> None:
    """Close the server's stdin and give it ``SHUTDOWN_GRACE``; then close the
    lifeline: the supervisor kills it and everything it started."""
    assert process.stdin is not None
    with suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await process.stdin.aclose()
    with trio.move_on_after(SHUTDOWN_GRACE):
        await process.wait()
    os.close(lifeline_w)
    with trio.move_on_after(SHUTDOWN_GRACE * 2):
        await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()


class _Drain:
    """A line too large to read even cut: its first bytes (for its id) and its size,
    the rest dropped as it streams in."""

    def __init__(self, head: bytes, size: int) -> None:
        self.head = head
        self.size = size

    def feed(self, data: bytes) -> None:
        self.size += len(data)


# A JSON-RPC message's id, written before its result or error (as the SDK's servers
# write it): a number or a string.
_ID = re.compile(
    rb'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")'
)


def _report(status_r: int) -> dict[str, str]:
    """The supervisor's ``key=value`` report, if it wrote one (it has exited)."""
    os.set_blocking(status_r, False)
    try:
        line = os.read(status_r, 4096).decode("utf-8", "replace")
    except OSError:
        return {}
    fields = (field.partition("=") for field in line.strip().split("\t"))
    return {key: value for key, _, value in fields if key}


def _one_line(exc: BaseException) -> str:
    # A nursery's (or the SDK's task group's) wrapping of one error says nothing
    # ("Exceptions from Trio nursery (1 sub-exception)"): the error inside does.
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]
