"""The logger fanfold writes to when it is given none (``library_logger``), and one that
drops everything (``quiet_logger``).

A module of its own below every layer that logs: the runtime, and the MCP client the
runtime uses, take their default logger from here. ``fanfold.runtime.logging`` (the
CLI's JSON-lines set-up, ``configure()``) names both as well.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


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
