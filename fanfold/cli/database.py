"""Which event log a command uses: ``--db``, ``$FANFOLD_DB`` or the default.

Each is a file path (the SQLite log) or a ``postgresql://``/``postgres://`` URL (the
PostgreSQL log, the ``postgres`` extra), carried as a ``DatabaseUrl``: its text, which
is what any message shows, has no password."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeAlias, TypeVar

import click

from fanfold.cli.errors import CliError
from fanfold.regular_files import is_special, open_output, same_file

# fanfold.db (the codec, the reducer's types, sqlite_utils) is imported by the functions
# that open or name a log, not here: a command's `--help` needs none of it.
if TYPE_CHECKING:
    from fanfold.db import DatabaseUrl, Store

T = TypeVar("T")


Target: TypeAlias = "Path | DatabaseUrl"
"""A log a command names: an SQLite file, or a PostgreSQL database."""


def data_dir() -> Path:
    """fanfold's folder in the user's data directory (the default log, the key)."""
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "fanfold"


def as_target(text: str) -> Target:
    """``--db`` or ``$FANFOLD_DB`` as given: a URL, else a file path. Any other URL
    (``postgresq://``, ``postgresql+psycopg://``) is a CliError naming its scheme only:
    taken as a file name, it would be echoed whole, password included."""
    from fanfold.db import DatabaseUrl, is_postgres

    if is_postgres(text):
        return DatabaseUrl(text)
    scheme, sep, _ = text.partition("://")
    if sep and scheme and all(c.isalnum() or c in "+-." for c in scheme):
        raise CliError(
            f"--db / $FANFOLD_DB: {scheme}:// URLs are not supported; give a file path, or "
            "a postgresql:// (or postgres://) URL"
        )
    return Path(text)


def default_db() -> Target:
    env = os.environ.get("FANFOLD_DB")
    if env:
        return as_target(env)
    return data_dir() / "fanfold.db"


class _DbType(click.ParamType):  # type: ignore[type-arg]
    """A file path (not a directory) or a PostgreSQL URL."""

    name = "path|url"
    _file = click.Path(dir_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from fanfold.db import DatabaseUrl

        if isinstance(value, str):
            target = as_target(value)
            if isinstance(target, DatabaseUrl):
                return target
        return self._file.convert(value, param, ctx)


db_option = click.option(
    "--db",
    type=_DbType(),
    default=None,
    # One sentence: the rest (PostgreSQL, passwords, the JSON logs beside a file) is
    # `fanfold help database`, written once instead of under every command.
    help="The event log, a file or a postgresql:// URL (default: $FANFOLD_DB, else "
    "~/.local/share/fanfold/fanfold.db); see `fanfold help database`.",
)


def db_path(db: Target | None, *, must_exist: bool = True) -> Target:
    """The database the user chose (``--db``, ``$FANFOLD_DB`` or the default)."""
    from fanfold.db import DatabaseUrl

    path = db or default_db()
    if isinstance(path, DatabaseUrl):
        return path  # whether it holds a log, opening says
    if must_exist and not path.exists():
        raise CliError(f"no database at {path} (run `fanfold run` first, or pass --db)")
    return path


def open_store(db: Target | None, *, must_exist: bool = True, read_only: bool = False) -> Store:
    """Open the chosen database; with ``must_exist=False`` create it (and its folder).

    Commands that only read open it ``read_only``: they write nothing (no migration, no
    switch to WAL), so a log on read-only media or someone else's can be inspected.
    """
    from fanfold.db import open_store as open_log

    path = db_path(db, must_exist=must_exist)
    if read_only:
        return open_log(path, read_only=True)
    if not must_exist and isinstance(path, Path):
        path.parent.mkdir(parents=True, exist_ok=True)
    return open_log(path)


def beside_log(db: Target, suffix: str) -> Path:
    """A file that belongs with log ``db``: ``<db><suffix>`` beside an SQLite file; for
    a PostgreSQL log (no folder of its own), in ``data_dir()``, named by a digest of the
    URL without its password (``fanfold-pg-<digest><suffix>``)."""
    if isinstance(db, Path):
        return db.with_name(db.name + suffix)
    digest = hashlib.sha256(str(db).encode()).hexdigest()[:16]
    return data_dir() / f"fanfold-pg-{digest}{suffix}"


LOG_COMPANIONS = ("", "-wal", "-shm", "-journal", "-runtimes", "-committed", ".mcp-delegations")
"""Suffixes of the database's own files (SQLite's and the runtimes' lock file)."""


def protected_files(db: Target | None) -> list[tuple[Path, str, str]]:
    """The files no output option may write over, each with what it is and what
    writing over it destroys: the event log and its companions, the provenance key
    file (overwritten, every tree becomes foreign and no unfinished one can be
    resumed) and the trust record."""
    from fanfold.db.provenance import default_key_path
    from fanfold.trust import default_trust_path

    path = db or default_db()
    found = []
    if isinstance(path, Path):  # a PostgreSQL log has no files here
        for suffix in LOG_COMPANIONS:
            what = f"the event log {path}" + (f"'s {suffix[1:]} file" if suffix else "")
            found.append((path.with_name(path.name + suffix), what, "the log"))
    key = default_key_path()
    found.append((key, f"the provenance key file {key} (it proves which trees are yours)", "it"))
    trusted = default_trust_path()
    found.append((trusted, f"the trust record {trusted}", "it"))
    return found


def refuse_writing_over_the_log(output: Path, db: Target | None, option: str = "-o") -> None:
    """A CliError if ``output`` is one of ``protected_files``: a slip of ``-o``
    (``fanfold trace ID -o fanfold.db``, ``-o ~/.local/share/fanfold/provenance.key``)
    would destroy it. The same path, or the same file by another name (a link)."""
    for own, what, lost in protected_files(db):
        if same_file(output, own):
            raise CliError(
                f"{option} {output} is {what}; writing there would destroy {lost}: "
                "choose another file"
            )


def write_output(output: Path, write: Callable[[TextIO], T]) -> T:
    """Run ``write`` on ``output`` opened for text: a new or regular file through a
    temporary file next to it and a rename, so it is never left half-written;
    a character device (``/dev/stdout``) or a FIFO that a process reads is written
    as it is, never replaced. A FIFO nobody reads, a directory or a socket: CliError
    at once, never a wait. Call ``refuse_writing_over_the_log`` first."""
    if is_special(output) or output.is_symlink():
        try:
            with open_output(output) as out:
                return write(out)
        except OSError as exc:
            raise _cannot_write(output, exc) from None
    directory = output.parent if str(output.parent) else Path(".")
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{output.name}.", dir=directory)
    except OSError as exc:
        raise _cannot_write(output, exc) from None
    try:
        # mkstemp makes the file private (0600); give it the mode a plain open would:
        # the old file's if there is one, else 0666 less the umask.
        os.chmod(temp, _mode_for(output))
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            result = write(out)
        os.replace(temp, output)
    except BaseException as exc:
        Path(temp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _cannot_write(output, exc) from None
        raise
    return result


def _mode_for(output: Path) -> int:
    try:
        return stat.S_IMODE(output.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _cannot_write(output: Path, exc: OSError) -> CliError:
    # The OSError names the temporary file, which the user never asked for and which
    # is gone by now: name the file they did ask for.
    return CliError(" ".join(f"cannot write {output}: {exc.strerror or exc}".split()))
