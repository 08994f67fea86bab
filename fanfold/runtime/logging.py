"""structlog set-up: JSON lines to a file, a readable renderer on a terminal.

The reducer never logs. At the default level (info) the runtime writes lifecycle lines
(a conversation started, came to rest, ended) and one line per model call and per tool
call; at debug it adds a ``transition`` line per step, bound with ``conversation_id``,
``parent_id`` and ``depth``.

The chain is structlog's own, with no stdlib ``logging`` in between: a line is
rendered by ``JSONRenderer`` and written by a ``WriteLogger`` to the file (flushed per
line, so a crash loses none). Through stdlib logging (a ``LogRecord``, handler
dispatch, ``ProcessorFormatter``) a line cost about 40 µs, a quarter of a step's CPU;
``bench/bench_logging.py`` measures both.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
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
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _Route(console, console_level, file_level if _file is not None else None),
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=(
            structlog.WriteLoggerFactory(file=_file)
            if _file is not None
            else structlog.ReturnLoggerFactory()
        ),
        wrapper_class=structlog.make_filtering_bound_logger(min(levels or [logging.CRITICAL])),
        cache_logger_on_first_use=False,
    )


def quiet_logger() -> Any:
    """A logger that drops everything (for benchmarks and embedding)."""
    return structlog.wrap_logger(
        structlog.ReturnLogger(),
        wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
    )
