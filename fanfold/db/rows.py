"""The few ``sqlite_utils.Database`` calls the store makes on every open, on sqlite3 alone.

Importing sqlite_utils costs about as much as the rest of ``fanfold ls`` (0.43 G
instructions, issue 36). The store reads (``query``), asks which tables exist and
switches to WAL through this class; only a migration, which creates tables, imports
sqlite_utils (``fanfold.db.schema.migrate``). The store's connection is in autocommit
mode (``isolation_level=None``), so a statement runs as sqlite_utils would run it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any


class Rows:
    """An sqlite3 connection, read as ``sqlite_utils.Database`` reads it (rows as dicts)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def query(self, sql: str, params: Sequence[Any] = ()) -> Iterator[dict[str, Any]]:
        """Every row of the SELECT ``sql`` as a dict, column name -> value."""
        cursor = self.conn.execute(sql, params)
        keys = [d[0] for d in cursor.description or ()]
        return (dict(zip(keys, row, strict=True)) for row in cursor)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """Run one statement."""
        return self.conn.execute(sql, params)

    def table_names(self) -> list[str]:
        """The names of the database's tables."""
        rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return [row[0] for row in rows.fetchall()]

    def table(self, name: str) -> _Table:
        """A table by name (only ``exists()`` is asked of it)."""
        return _Table(self, name)

    def enable_wal(self) -> None:
        """Switch the database to write-ahead logging if it is not in it already."""
        if self.conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self.conn.execute("PRAGMA journal_mode=wal")


class _Table:
    def __init__(self, rows: Rows, name: str) -> None:
        self._rows = rows
        self.name = name

    def exists(self) -> bool:
        return self.name in self._rows.table_names()
