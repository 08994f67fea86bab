"""Errors shown to a CLI user: one line, a typed exit status, never a traceback."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from fanfold.cli.text import printable

# What this module names is imported where it is used, never here: every command's
# module imports this one, and `--help`, `ls` and `show` must not import the runtime,
# the providers, Trio or httpx (tests/test_cli_startup.py checks what they import).


class CliError(click.ClickException):
    """An error shown to the user as one line, exit code 2, no traceback."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        from rich.text import Text

        from fanfold.cli.output import err_console

        # Plain text (no markup: "[Errno 2]" must survive), one line at any width.
        err_console.print(
            Text.assemble(("error: ", "red"), printable(self.message)),
            soft_wrap=True,
            highlight=False,
        )


# fanfold's typed errors that a user sees as one line: (defining module, class name).
# Looked up only among the modules already imported, never imported to classify an
# exception: an instance of a class whose module was never imported cannot exist. So
# the one-line errors cost a command nothing it did not import itself.
_USER_ERROR_CLASSES = (
    ("fanfold.providers.script_schema", "ScriptError"),
    ("fanfold.providers.profiles", "ConfigError"),
    ("fanfold.db.errors", "DatabaseError"),  # UnknownConversation is one
    ("fanfold.runtime.runtime", "NotRunning"),
    ("fanfold.runtime.presence", "DatabaseInUse"),
    ("fanfold.statemachine.errors", "IllegalTransition"),
)


def user_error_types() -> tuple[type[BaseException], ...]:
    """The exception types ``user_errors`` shows as one line (those of fanfold's that
    any imported module defines, and ``FileNotFoundError``, ``ValueError``)."""
    found: list[type[BaseException]] = [FileNotFoundError, ValueError]
    for module_name, name in _USER_ERROR_CLASSES:
        module = sys.modules.get(module_name)
        if module is not None:
            found.append(getattr(module, name))
    return tuple(found)


def _sqlite_errors() -> tuple[type[BaseException], ...]:
    # sqlite3's errors, if sqlite3 was imported (else there can be none).
    sqlite3 = sys.modules.get("sqlite3")
    return () if sqlite3 is None else (sqlite3.DatabaseError,)


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        leaves += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return leaves


@contextmanager
def user_errors(db: Path | str | None = None) -> Iterator[None]:
    """Turn fanfold's typed errors into one-line CLI errors (exit code 2).

    Errors raised inside the runtime arrive wrapped in Trio's exception groups; a group
    made only of user errors is unwrapped, anything else propagates (a bug). SQLite's
    own errors (a damaged file: "database disk image is malformed", a full disk, a
    lock held too long) are one line too, naming the database ``db`` if given.
    """
    try:
        yield
    except BaseException as exc:
        users, sqlite_errors = user_error_types(), _sqlite_errors()
        if isinstance(exc, users):
            raise CliError(str(exc)) from None
        if isinstance(exc, sqlite_errors):
            raise CliError(sqlite_message(exc, db)) from None
        if isinstance(exc, MemoryError | RuntimeError):
            if not exhausted(exc):
                raise
            raise CliError(exhausted_message(exc, db)) from None
        if not isinstance(exc, BaseExceptionGroup):
            raise
        leaves = _leaves(exc)
        if leaves and all(isinstance(leaf, users) for leaf in leaves):
            raise CliError(str(leaves[0])) from None
        if leaves and all(isinstance(leaf, sqlite_errors) for leaf in leaves):
            raise CliError(sqlite_message(leaves[0], db)) from None
        # Out of memory or threads: the cause of whatever else failed with it (the
        # tasks the failure cancelled).
        for leaf in leaves:
            if exhausted(leaf):
                raise CliError(exhausted_message(leaf, db)) from None
        raise


def exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` says the process ran out of memory or of threads (a ``ulimit
    -v`` too low for a thread's stack: "can't start new thread")."""
    if isinstance(exc, MemoryError):
        return True
    return isinstance(exc, RuntimeError) and "can't start new thread" in str(exc)


def exhausted_message(exc: BaseException, db: Path | str | None = None) -> str:
    """One line for running out of memory or threads (``exhausted``): the run stopped,
    and what it committed is in the log for ``fanfold resume``."""
    what = "a thread" if isinstance(exc, RuntimeError) else "memory"
    where = f" ({db})" if db is not None else ""
    return (
        f"out of memory: could not get {what} ({type(exc).__name__}: "
        f"{str(exc) or 'no details'}); a memory limit (ulimit -v) may be too low. The "
        f"log{where} keeps every committed step: `fanfold resume` goes on from there"
    )


def sqlite_message(exc: BaseException, db: Path | str | None = None) -> str:
    """One line for an error SQLite raised reading or writing the log ``db``."""
    import sqlite3

    where = f" {db}" if db is not None else ""
    if str(exc).startswith("Could not decode to UTF-8"):
        # Python's sqlite3 could not read a text column: the bytes SQLite holds there
        # are not UTF-8 (fanfold writes ASCII-only JSON), a damaged row rather than a
        # failed read or write. SQLite's message quotes the whole value: left out.
        column = str(exc).split(" with text ", 1)[0].removeprefix("Could not decode to UTF-8")
        return (
            f"the event log{where} is damaged: a row holds text that is not UTF-8 "
            f"({column.strip() or 'a column'}); fanfold writes only UTF-8, so the row was "
            "changed outside fanfold"
        )
    if (
        isinstance(db, Path)
        and not isinstance(exc, sqlite3.OperationalError)
        and "malformed" in str(exc)
    ):
        from fanfold.db.store import read_again

        misread = read_again(str(db))
        if misread is not None:
            return misread
    if str(exc).startswith(("no such table", "no such column")):
        # A table or column fanfold made is gone: the file was changed by hand.
        return f"the event log{where} is damaged: {exc} (not fanfold's tables any more)"
    if not isinstance(exc, sqlite3.OperationalError):
        # The file itself is damaged (a flipped byte, a truncated copy): SQLite says
        # "database disk image is malformed" or "file is not a database".
        return f"the event log{where} is damaged: {exc} (SQLite cannot read it)"
    # The environment failed under the log (disk full, read-only file, a lock held by
    # another program past the busy timeout). The transaction was rolled back, so the
    # log holds everything up to the last committed step.
    return (
        f"the event log could not be written or read: {exc} "
        f"({where.strip() + ': ' if where else ''}everything up to the last committed step "
        "is kept)"
    )
