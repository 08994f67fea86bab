"""The JSON log file of the commands that run models, and its level."""

from __future__ import annotations

import logging
from pathlib import Path

LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
_file_log_level = logging.INFO  # the JSON log's level, set by the group's --log-level


def set_file_level(name: str) -> None:
    """Set the JSON log's level from ``--log-level`` (one of ``LOG_LEVELS``)."""
    global _file_log_level
    _file_log_level = LOG_LEVELS[name.lower()]


def open_logs(path: Path, json_log: Path | None) -> None:
    """Create the database's folder and send the JSON log next to it (or to json_log)."""
    # Imported here: the group imports this module for LOG_LEVELS, and a command that
    # writes no log (--version, ls, show) must not import the runtime for it.
    from fanfold.cli.errors import CliError
    from fanfold.runtime.logging import configure

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        configure(
            json_file=json_log or path.with_suffix(".log.jsonl"),
            console=None,
            file_level=_file_log_level,
        )
    except OSError as exc:
        where = exc.filename or path
        raise CliError(
            f"cannot write {where}: {exc.strerror or exc} (choose another place with --db"
            + (")" if json_log else " or --json-log)")
        ) from None
