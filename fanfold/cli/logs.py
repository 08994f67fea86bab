"""The JSON log file of the commands that run models, and its level."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fanfold.db import DatabaseUrl

LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
_file_log_level = logging.INFO  # the JSON log's level, set by the group's --log-level


def set_file_level(name: str) -> None:
    """Set the JSON log's level from ``--log-level`` (one of ``LOG_LEVELS``)."""
    global _file_log_level
    _file_log_level = LOG_LEVELS[name.lower()]


def open_logs(path: Path | DatabaseUrl, json_log: Path | None) -> None:
    """Create the database's folder and send the JSON log next to it (or to json_log;
    for a PostgreSQL log, to the user's data folder: ``beside_log``).
    ``--json-log`` may not name the database, its companions or the key file, nor a
    FIFO, socket or directory (appending to a FIFO would wait for a reader); a
    character device (``/dev/null``, ``/dev/stderr``) is fine."""
    # Imported here: the group imports this module for LOG_LEVELS, and a command that
    # writes no log (--version, ls, show) must not import the runtime for it.
    from fanfold.cli.database import beside_log, refuse_writing_over_the_log
    from fanfold.cli.errors import CliError
    from fanfold.regular_files import kind
    from fanfold.runtime.logging import configure

    if json_log is not None:
        refuse_writing_over_the_log(json_log, path, "--json-log")
        try:
            mode = os.stat(json_log).st_mode
        except OSError:
            mode = None
        if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):
            raise CliError(f"--json-log {json_log} is {kind(mode)}, not a regular file")
    default = (
        beside_log(path, ".log.jsonl")
        if not isinstance(path, Path)
        else Path(path).with_suffix(".log.jsonl")
    )
    try:
        default.parent.mkdir(parents=True, exist_ok=True)
        configure(
            json_file=json_log or default,
            console=None,
            file_level=_file_log_level,
        )
    except OSError as exc:
        where = exc.filename or path
        raise CliError(
            f"cannot write {where}: {exc.strerror or exc} (choose another place with --db"
            + (")" if json_log else " or --json-log)")
        ) from None
