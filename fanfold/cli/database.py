"""Which event log a command uses: ``--db``, ``$FANFOLD_DB`` or the default."""

from __future__ import annotations

import os
from pathlib import Path

import click

from fanfold.cli.errors import CliError
from fanfold.db import Store


def default_db() -> Path:
    env = os.environ.get("FANFOLD_DB")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "fanfold" / "fanfold.db"


db_option = click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="SQLite event log (default: $FANFOLD_DB or ~/.local/share/fanfold/fanfold.db).",
)


def db_path(db: Path | None, *, must_exist: bool = True) -> Path:
    """The database the user chose (``--db``, ``$FANFOLD_DB`` or the default)."""
    path = db or default_db()
    if must_exist and not path.exists():
        raise CliError(f"no database at {path} (run `fanfold run` first, or pass --db)")
    return path


def open_store(db: Path | None, *, must_exist: bool = True, read_only: bool = False) -> Store:
    """Open the chosen database; with ``must_exist=False`` create it (and its folder).

    Commands that only read open it ``read_only``: they write nothing (no migration, no
    switch to WAL), so a log on read-only media or someone else's can be inspected.
    """
    path = db_path(db, must_exist=must_exist)
    if read_only:
        return Store.open(path, read_only=True)
    if not must_exist:
        path.parent.mkdir(parents=True, exist_ok=True)
    return Store.open(path)


LOG_COMPANIONS = ("", "-wal", "-shm", "-journal", "-runtimes", ".mcp-delegations")
"""Suffixes of the database's own files (SQLite's and the runtimes' lock file)."""


def refuse_writing_over_the_log(output: Path, db: Path | None) -> None:
    """A CliError if ``output`` is the database file or one of its companions: a
    slip of ``-o`` (``fanfold trace ID -o fanfold.db``) would replace the log."""
    path = db or default_db()
    try:
        target = output.resolve()
        base = path.resolve()
    except (OSError, RuntimeError):  # a symbolic link loop: it is no database either
        return
    for suffix in LOG_COMPANIONS:
        own = base.with_name(base.name + suffix)
        same = target == own
        if not same and output.exists() and own.exists():
            try:
                same = os.path.samefile(output, own)  # a hard link
            except OSError:
                same = False
        if same:
            what = f"the event log {path}" + (f"'s {suffix[1:]} file" if suffix else "")
            raise CliError(
                f"-o {output} is {what}; writing there would destroy the log: choose another file"
            )
