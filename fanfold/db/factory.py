"""``open_store``: the event log a target names, SQLite for a path and PostgreSQL for
a ``postgresql://`` or ``postgres://`` URL.

psycopg (the ``postgres`` extra) is imported only for a URL, so that ``import
fanfold`` and every run on SQLite load nothing of it.
"""

from __future__ import annotations

import os

from fanfold.db.errors import CannotOpen
from fanfold.db.store import Store
from fanfold.db.targets import URL_SCHEMES, display_target, is_postgres

__all__ = ["URL_SCHEMES", "DatabaseUrl", "display_target", "is_postgres", "open_store"]


class DatabaseUrl(str):
    """A PostgreSQL URL as the CLI carries it: its text (what ``str``, f-strings and
    ``repr`` show, and what a log line records) is the URL without the password
    (``display_target``); ``secret`` is the URL given, which only ``open_store`` reads.
    So no message that names the database can show the password by mistake."""

    secret: str

    def __new__(cls, url: str) -> DatabaseUrl:
        shown = super().__new__(cls, display_target(url))
        shown.secret = url
        return shown


def open_store(target: str | os.PathLike[str], *, read_only: bool = False) -> Store:
    """Open the log at ``target``: ``Store.open`` for a file path, ``PostgresStore.open``
    for a PostgreSQL URL. ``CannotOpen`` naming the ``postgres`` extra if psycopg is
    not installed."""
    if not is_postgres(target):
        return Store.open(target, read_only=read_only)
    try:
        from fanfold.db.postgres import PostgresStore
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in ("psycopg", "psycopg_binary"):
            raise
        raise CannotOpen(
            "a PostgreSQL log needs psycopg, which is not installed: install fanfold's "
            "`postgres` extra (pip install 'fanfold[postgres]')"
        ) from None
    url = target.secret if isinstance(target, DatabaseUrl) else str(target)
    return PostgresStore.open(url, read_only=read_only)
