"""Terminal output of the command line: the consoles and printing that survives a
closed pipe."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    console: Console
    err_console: Console


def _consoles() -> dict[str, Console]:
    # ``console`` (stdout) and ``err_console`` (stderr) are made, with rich imported,
    # when first asked for: a command that prints nothing (``--help``) imports no rich.
    made = globals()
    if "console" not in made:
        from rich.console import Console

        made["console"] = Console()
        made["err_console"] = Console(stderr=True)
    return made


def __getattr__(name: str) -> Any:
    if name in ("console", "err_console"):
        return _consoles()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def hint(text: str, *, to: Console | None = None, style: str = "") -> None:
    """Print a line naming paths or a command to run next: plain text, never wrapped.

    rich wraps at the terminal's width (80 columns when piped); a command split across
    lines no longer pastes as one. ``to``: ``err_console`` unless given.
    """
    from rich.text import Text

    to = _consoles()["err_console"] if to is None else to
    to.print(Text(text, style=style), soft_wrap=True, highlight=False)


def say(message: RenderableType, to: Console | None = None) -> None:
    """Print (to ``err_console`` unless ``to`` is given), ignoring a terminal or pipe
    that has gone away (after SIGHUP, or a Ctrl-C that also stopped the program reading
    our output)."""
    where = _consoles()["err_console"] if to is None else to
    quietly(lambda: where.print(message))


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
