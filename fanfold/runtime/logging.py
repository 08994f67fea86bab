"""structlog set-up: JSON lines to a file, a readable renderer on a terminal.

The reducer never logs. At the default level (info) the runtime writes lifecycle lines
(a conversation started, came to rest, ended) and one line per model call and per tool
call; at debug it adds a ``transition`` line per step, bound with ``conversation_id``,
``parent_id`` and ``depth``.

The chain is structlog's own, with no stdlib ``logging`` in between: a line is
rendered by ``_JsonLine`` and written by a ``WriteLogger`` to the file (flushed per
line, so a crash loses none). Through stdlib logging (a ``LogRecord``, handler
dispatch, ``ProcessorFormatter``) a line cost about 40 µs, a quarter of a step's CPU;
structlog's ``TimeStamper`` and ``JSONRenderer`` then took 17 of the 20 µs left
(``datetime`` formatting per line; ``json.dumps`` with a ``default`` builds an encoder
per call). ``_Timestamp`` formats the date and time once a second and ``_JsonLine``
keeps one C encoder: about 7 µs a line. ``bench/bench_logging.py`` measures them.
"""

from __future__ import annotations

import json
import json.encoder
import logging
import sys
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import IO, Any, TextIO

import structlog

_LEVELS = {
    "critical": logging.CRITICAL,
    "exception": logging.ERROR,
    "error": logging.ERROR,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
}

_file: IO[str] | None = None  # the JSON file of the last configure(), closed by the next


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
        now = time.time()
        second = int(now)
        if second != self._second:
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        event["timestamp"] = f"{self._prefix}.{int((now - second) * 1_000_000):06d}Z"
        return event


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
    global _file
    if _file is not None:
        _file.close()
        _file = None
    if json_file is not None:
        Path(json_file).parent.mkdir(parents=True, exist_ok=True)
        _file = open(json_file, "a", encoding="utf-8")  # noqa: SIM115  (kept open: the log)
    levels = [level for level, on in ((file_level, _file), (console_level, console)) if on]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _Timestamp(),
            structlog.processors.format_exc_info,
            _Route(console, console_level, file_level if _file is not None else None),
            _JsonLine(),
        ],
        logger_factory=(
            structlog.WriteLoggerFactory(file=_file)
            if _file is not None
            else structlog.ReturnLoggerFactory()
        ),
        wrapper_class=structlog.make_filtering_bound_logger(min(levels or [logging.CRITICAL])),
        cache_logger_on_first_use=False,
    )


class _Stderr:
    """The writer of ``library_logger``: each line to ``sys.stderr`` as it is when the
    line is written (as the stdlib's ``lastResort`` handler does), so a test or an
    application that swaps ``sys.stderr`` later still gets it."""

    def msg(self, message: str) -> None:
        stream = sys.stderr
        if stream is None:  # pythonw, a daemon: nowhere to write
            return
        stream.write(message + "\n")
        stream.flush()

    log = debug = info = warn = warning = err = error = critical = exception = fatal = msg


def library_logger() -> Any:
    """The logger a ``Runtime`` uses when it is given none.

    If structlog has been configured (by ``configure()``, as the CLI does, or by the
    application itself), fanfold's lines go where that configuration says:
    ``structlog.get_logger("fanfold")``. Otherwise fanfold is a library inside someone
    else's program, and structlog's own default (every level, debug included, printed
    to stdout) would write a ``transition`` line per step into that program's output:
    instead, as the stdlib's ``logging.lastResort`` does, warnings and above go to
    stderr and the rest is dropped (a filtering logger: nothing below a warning is
    even formatted, and the runtime skips the per-step logging work).
    """
    if structlog.is_configured():
        return structlog.get_logger("fanfold")
    return structlog.wrap_logger(
        _Stderr(),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    )


def quiet_logger() -> Any:
    """A logger that drops everything (for benchmarks and embedding)."""
    return structlog.wrap_logger(
        structlog.ReturnLogger(),
        wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
    )
