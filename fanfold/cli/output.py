"""Terminal output of the command line: the consoles and printing that survives a
closed pipe."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import suppress

from rich.console import Console, RenderableType
from rich.text import Text

console = Console()
err_console = Console(stderr=True)


def hint(text: str, *, to: Console = err_console, style: str = "") -> None:
    """Print a line naming paths or a command to run next: plain text, never wrapped.

    rich wraps at the terminal's width (80 columns when piped); a command split across
    lines no longer pastes as one.
    """
    to.print(Text(text, style=style), soft_wrap=True, highlight=False)


def say(message: RenderableType, to: Console = err_console) -> None:
    """Print, ignoring a terminal or pipe that has gone away (after SIGHUP, or a Ctrl-C
    that also stopped the program reading our output)."""
    quietly(lambda: to.print(message))


def quietly(action: Callable[[], object]) -> None:
    """Run ``action`` (terminal output), ignoring an output that has gone away: writes
    fail with OSError, and rich turns a broken pipe into SystemExit(1)."""
    with suppress(OSError, SystemExit):
        action()


def lenient_output() -> None:
    """Make stdout and stderr write what their encoding cannot as ``\\uNNNN`` escapes.

    The views escape what they show (``printable``), but a text the output's encoding
    cannot hold (any non-ASCII letter under an ASCII or Latin-1 locale, a lone
    surrogate a view forgot) must never turn into a traceback halfway through.
    """
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with suppress(ValueError, OSError):  # a closed or detached stream
                reconfigure(errors="backslashreplace")
