"""structlog set-up: JSON lines to a file, a readable renderer on a terminal.

The reducer never logs. At the default level (info) the runtime writes lifecycle lines
(a conversation started, came to rest, ended) and one line per model call and per tool
call; at debug it adds a ``transition`` line per step, bound with ``conversation_id``,
``parent_id`` and ``depth``.

The chain is structlog's own, with no stdlib ``logging`` in between: a line is
rendered by ``_JsonLine`` and written to the file by a ``_SinkLogger``. Through stdlib
logging (a ``LogRecord``, handler dispatch, ``ProcessorFormatter``) a line cost about
40 µs, a quarter of a step's CPU; structlog's ``TimeStamper`` and ``JSONRenderer`` then
took 17 of the 20 µs left (``datetime`` formatting per line; ``json.dumps`` with a
``default`` builds an encoder per call). ``_Timestamp`` formats the date and time once
a second and ``_JsonLine`` keeps one C encoder: about 7 µs a line.
``bench/bench_logging.py`` measures them.

Two more things made a line cost 107,000 instructions (callgrind), 15 % of a
sub-agent's in a fan-out (issue 21):

- structlog's dispatch: a bound method, ``_proxy_to_logger``, ``_process_event``, six
  processors called one by one, ``getattr`` of the writing method. The wrapper class
  that ``configure()`` installs (``_FileBoundLogger``) takes a shortcut for info and
  debug lines bound for the file alone: it builds the same event dictionary the chain
  would (context, keywords, ``event``, ``level``, ``timestamp``) and renders it with
  the same encoder. Anything else (a warning or an error, a line the console shows,
  ``exc_info``, positional arguments, a context variable bound with
  ``structlog.contextvars``, or a processor chain someone else configured since) goes
  through the chain, unchanged. A logger renders its bound context once, as the start
  of its lines, when its values are plain and no keyword overrides them. The lines are
  identical either way (``tests/test_runtime_logging.py``): 67,000 instructions now.
  (Then 62,000 for a ``model_call`` line, 2026-11-28, branch h21b: the record of
  context variables read once at ``configure()``, a key test without building a set;
  of those 62,000 the C encoder takes 32,000 and the timestamp 9,000.)
- a write and a flush per line: lines are buffered and written with one flush per
  engine round (``flush()``: once the round's batch is committed and its effects
  started, and before the engine waits), at once for a warning or an error, when the
  buffer holds ``_MAX_BUFFERED`` lines, when the runtime closes, at ``configure()``
  and at exit. A process killed with SIGKILL loses the lines of the round it was in;
  the SQLite log, not this file, is the record of what happened.

A line that cannot be written (a full disk, a quota, an I/O error: issue 32, item 8)
never stops the work: the database is the record. The first failure prints one line on
stderr (``warning: cannot write the JSON log ...``) and every later line is dropped
(a line cut by the failure may be left at the end of the file). The file is written
unbuffered, through ``os.write`` in effect, so no bytes wait in a Python buffer to fail
again when it closes.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import json.encoder
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import IO, Any, TextIO

import attrs
import structlog
import structlog.contextvars

# Where fanfold logs when it is given no logger: a module below the runtime, so the
# layers the runtime uses (the MCP client) log there too; named here as before.
from fanfold.logger import library_logger as library_logger
from fanfold.logger import quiet_logger as quiet_logger

_LEVELS = {
    "critical": logging.CRITICAL,
    "exception": logging.ERROR,
    "error": logging.ERROR,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
}

_file: _CreatedOnFirstLine | None = None  # the JSON file of the last configure()
_MAX_BUFFERED = 256  # lines held before they are written without waiting for flush()


class _Timestamp:
    """A processor adding ``timestamp``: UTC, ISO 8601 with microseconds and ``Z``
    (``2026-11-26T15:10:00.123456Z``), what ``TimeStamper(fmt="iso", utc=True)`` writes,
    with the date and time formatted once per second rather than per line."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(
        self, logger: Any, method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        event["timestamp"] = self.text()
        return event

    def text(self) -> str:
        """The timestamp of now."""
        now = time.time()
        second = int(now)
        if second != self._second:
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._prefix}.{int((now - second) * 1_000_000):06d}Z"


def _fallback(value: Any) -> Any:
    """What a value JSON cannot hold is written as: its ``__structlog__()`` if it has
    one, else its ``repr`` (as structlog's ``JSONRenderer`` does)."""
    method = getattr(value, "__structlog__", None)
    return method() if method is not None else repr(value)


class _JsonLine:
    """The renderer: an event as one line of compact JSON (ASCII, non-finite numbers as
    ``NaN``/``Infinity`` like ``json.dumps``), through one C encoder made once."""

    def __init__(self) -> None:
        encoder = getattr(json.encoder, "c_make_encoder", None)
        if encoder is None:  # pragma: no cover - CPython always has the C encoder
            self._encode: Callable[[Any], str] = json.JSONEncoder(
                separators=(",", ":"), default=_fallback
            ).encode
        else:
            make = encoder(
                None,  # no check for circular references: an event is a flat mapping
                _fallback,
                json.encoder.encode_basestring_ascii,
                None,  # no indentation
                ":",
                ",",
                False,  # keys in the order the event has them
                False,  # a key JSON cannot hold is an error, as in json.dumps
                True,  # NaN and infinities written as json.dumps writes them
            )
            self._encode = lambda event: "".join(make(event, 0))

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
        return self._encode(event)


class _Route:
    """A processor that shows events at ``console_level`` and above on the console
    (rendered for people) and passes on to the JSON file only those at ``file_level``
    and above (dropping the rest)."""

    def __init__(self, console: TextIO | None, console_level: int, file_level: int | None):
        self.console = console
        self.console_level = console_level
        self.file_level = file_level
        self.render = structlog.dev.ConsoleRenderer(colors=console is not None and console.isatty())

    def __call__(
        self, logger: Any, method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        level = _LEVELS.get(method, logging.INFO)
        if self.console is not None and level >= self.console_level:
            self.console.write(str(self.render(logger, method, dict(event))) + "\n")
            self.console.flush()
        if self.file_level is None or level < self.file_level:
            raise structlog.DropEvent
        return event


class _CreatedOnFirstLine:
    """The JSON log file, opened for appending once it is first written to (issue
    32.14): a command that stops before it logs a line (an option, a script or a
    configuration that does not pass its checks) leaves no empty log behind. A file that
    exists already is opened at once; for one to be created, whether its folder takes
    it is checked at once (``OSError`` naming the folder), so a place that cannot hold
    the log is still refused before anything runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path)
        self._file: IO[bytes] | None = None
        if path.exists():
            self._open()
        elif not os.access(path.parent, os.W_OK | os.X_OK):
            folder = path.parent
            code = errno.EACCES
            with contextlib.suppress(OSError):
                if os.statvfs(folder).f_flag & os.ST_RDONLY:
                    code = errno.EROFS
            raise OSError(code, os.strerror(code), str(folder))

    def _open(self) -> IO[bytes]:
        if self._file is None:
            # Unbuffered: each write is one system call, so nothing is left in a buffer
            # to fail again at close after a full disk.
            self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115  (kept open)
        return self._file

    def write(self, data: memoryview) -> int | None:
        """Write what the file takes of ``data`` (an unbuffered file may take part)."""
        return self._open().write(data)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class _Sink:
    """The JSON file's lines not written yet: buffered, then written together
    (``flush``). Safe to use from several threads. After a write fails, lines are
    dropped (``failed``): one warning, and the run goes on."""

    def __init__(self, file: _CreatedOnFirstLine) -> None:
        self.file = file
        self.lines: list[str] = []
        self.lock = threading.Lock()
        self.failed = False

    def add(self, line: str) -> None:
        with self.lock:
            lines = self.lines
            lines.append(line)
            if len(lines) < _MAX_BUFFERED:
                return
        self.flush()

    def flush(self) -> None:
        with self.lock:
            lines = self.lines
            if not lines:
                return
            self.lines = []
            if self.failed:
                return  # dropped: the file could not be written
            lines.append("")
            data = memoryview("\n".join(lines).encode("utf-8", "backslashreplace"))
            try:
                while data:  # an unbuffered file may take part of it
                    written = self.file.write(data)
                    if not written:  # None: a non-blocking file that would block
                        raise BlockingIOError(errno.EAGAIN, "the file took no bytes")
                    data = data[written:]
            except OSError as exc:
                self.failed = True
                _warn(f"cannot write the JSON log {self.file.name}: {exc.strerror or exc}")


def _warn(text: str) -> None:
    """One line on stderr: the JSON log's lines are dropped from here on."""
    stream = sys.stderr
    if stream is None:  # pythonw, a daemon: nowhere to write
        return
    with contextlib.suppress(OSError, ValueError):
        stream.write(
            f"warning: {text}; its lines are dropped from here on (the run goes on: the "
            "database is the record)\n"
        )
        stream.flush()


class _SinkLogger:
    """The logger structlog's chain writes to: a line at info or below is buffered in
    the sink, a warning or an error is written at once with everything before it."""

    def __init__(self, sink: _Sink) -> None:
        self.sink = sink

    def msg(self, message: str) -> None:
        self.sink.add(message)

    def urgent(self, message: str) -> None:
        self.sink.add(message)
        self.sink.flush()

    log = debug = info = msg
    warn = warning = err = error = critical = exception = fatal = urgent


@attrs.frozen
class _Shortcut:
    """What ``_FileBoundLogger`` needs to render a line itself: the processor chain
    ``configure()`` installed (the shortcut applies only to loggers bound with it),
    its timestamp and renderer, and the levels (as ``_LEVELS`` numbers) the shortcut
    takes: ``low`` up to below ``high`` (at ``high`` the console shows it)."""

    processors: list[Any]
    stamp: _Timestamp
    render: _JsonLine
    low: int
    high: int
    length: int
    contextvars: dict[Any, Any] | None
    """``structlog.contextvars``' own record of the variables ever bound (the chain's
    ``merge_contextvars`` must see every line once it holds any); None if this
    structlog keeps none, and then the shortcut is never taken."""


_shortcut: _Shortcut | None = None  # set by configure() when the JSON file is written


_UNSET: Any = object()
_PLAIN = frozenset({str, int, float, bool, type(None)})
_RESERVED = frozenset({"event", "level", "timestamp", "exc_info"})
_ascii = json.encoder.encode_basestring_ascii


def _line_head(context: dict[str, Any], render: _JsonLine) -> tuple[str, frozenset[str]] | None:
    """A bound context rendered as the start of a line (``{"a":1,``) and the keys a
    line's keywords must not use to start with it (the context's own, and those the
    chain sets or reads); None if the context holds a value whose text could change
    between lines (only plain values are rendered once) or one of those keys."""
    if any(type(value) not in _PLAIN for value in context.values()) or context.keys() & _RESERVED:
        return None
    text = render(None, "", context)
    return (text[:-1] + "," if len(text) > 2 else "{"), frozenset(context) | _RESERVED


def _file_bound_logger(min_level: int) -> type[Any]:
    """structlog's filtering bound logger for ``min_level``, with info and debug lines
    for the file alone rendered without the processor chain (see the module's text)."""
    base: Any = structlog.make_filtering_bound_logger(min_level)

    def shortcut(self: Any, level: int, name: str, event: Any, args: Any, kw: Any) -> bool:
        cut = _shortcut
        if (
            cut is None
            or args
            or self._processors is not cut.processors
            # The same list may have been changed in place: structlog.testing's
            # capture_logs swaps its content for a capturing processor.
            or len(self._processors) != cut.length
            or self._processors[-1] is not cut.render
            or not cut.low <= level < cut.high
            or type(self._logger) is not _SinkLogger
            or (bound := cut.contextvars) is None
            or bound
        ):
            return False
        head = getattr(self, "_line_head", _UNSET)
        if head is _UNSET:
            head = _line_head(self._context, cut.render)
            with contextlib.suppress(AttributeError):  # a structlog with __slots__
                self._line_head = head
        if head is not None and type(event) is str and head[1].isdisjoint(kw):
            # The bound context rendered once per logger (the chain renders it again
            # for every line): the same text, as no keyword overrides it.
            rest = cut.render(None, name, kw)
            rest = rest[1:-1] + "," if len(rest) > 2 else ""
            self._logger.sink.add(
                f'{head[0]}{rest}"event":{_ascii(event)},"level":"{name}",'
                f'"timestamp":"{cut.stamp.text()}"}}'
            )
            return True
        line = self._context.copy()
        line.update(kw)
        if "exc_info" in line:
            return False
        # What the chain does: merge_contextvars (nothing bound), add_log_level,
        # _Timestamp, format_exc_info (no exc_info), _Route (file only), _JsonLine.
        line["event"] = event
        line["level"] = name
        cut.stamp(None, name, line)
        self._logger.sink.add(cut.render(None, name, line))
        return True

    class _FileBoundLogger(base):  # type: ignore[misc]
        def info(self, event: Any = None, *args: Any, **kw: Any) -> Any:
            if not shortcut(self, logging.INFO, "info", event, args, kw):
                return base.info(self, event, *args, **kw)
            return None

        if min_level <= logging.DEBUG:

            def debug(self, event: Any = None, *args: Any, **kw: Any) -> Any:
                if not shortcut(self, logging.DEBUG, "debug", event, args, kw):
                    return base.debug(self, event, *args, **kw)
                return None

    _FileBoundLogger.__name__ = _FileBoundLogger.__qualname__ = "FileBoundLogger"
    return _FileBoundLogger


def flush() -> None:
    """Write the JSON file's buffered lines (the engine calls it once per round)."""
    sink = _sink
    if sink is not None and sink.lines:
        sink.flush()


_sink: _Sink | None = None  # the buffered lines of ``_file``


def configure(
    *,
    json_file: str | Path | None = None,
    console: TextIO | None = sys.stderr,
    console_level: int = logging.WARNING,
    file_level: int = logging.INFO,
) -> None:
    """Route fanfold's structlog output: JSON to ``json_file``, human text to ``console``.

    Events below both levels cost almost nothing (a filtering bound logger).
    """
    global _file, _sink, _shortcut
    _shortcut = None
    if _file is not None:
        flush()
        _file.close()
        _file = None
        _sink = None
    if json_file is not None:
        Path(json_file).parent.mkdir(parents=True, exist_ok=True)
        # Unbuffered (each flush() is one write, and nothing is left in a buffer to
        # fail again at close after a full disk), and created at its first line.
        _file = _CreatedOnFirstLine(Path(json_file))
        _sink = _Sink(_file)
    levels = [level for level, on in ((file_level, _file), (console_level, console)) if on]
    stamp, render = _Timestamp(), _JsonLine()
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        stamp,
        structlog.processors.format_exc_info,
        _Route(console, console_level, file_level if _file is not None else None),
        render,
    ]
    min_level = min(levels or [logging.CRITICAL])
    structlog.configure(
        processors=processors,
        logger_factory=(
            _SinkFactory(_sink) if _sink is not None else structlog.ReturnLoggerFactory()
        ),
        wrapper_class=_file_bound_logger(min_level),
        cache_logger_on_first_use=False,
    )
    if _sink is not None:
        # The shortcut takes the lines that go to the file and not to the console.
        high = console_level if console is not None else logging.CRITICAL + 1
        known = getattr(structlog.contextvars, "_CONTEXT_VARS", None)
        _shortcut = _Shortcut(
            processors,
            stamp,
            render,
            file_level,
            high,
            len(processors),
            known if isinstance(known, dict) else None,
        )


class _SinkFactory:
    """structlog's logger factory for the JSON file: one ``_SinkLogger`` for all."""

    def __init__(self, sink: _Sink) -> None:
        self.logger = _SinkLogger(sink)

    def __call__(self, *args: Any) -> _SinkLogger:
        return self.logger


@atexit.register
def _flush_at_exit() -> None:
    flush()
