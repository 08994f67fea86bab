"""``fanfold.db.rows.Rows``: the sqlite_utils calls a store makes on every open, on
sqlite3 alone (issue 36), give what sqlite_utils gives on the same log."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlite_utils import Database

from fanfold.db import Store
from fanfold.db.rows import Rows


def test_rows_read_a_log_as_sqlite_utils_reads_it(tmp_path: Path) -> None:
    Store.open(tmp_path / "log.db").close()  # created and migrated (sqlite_utils)
    conn = sqlite3.connect(tmp_path / "log.db", isolation_level=None)
    rows, full = Rows(conn), Database(conn)
    assert sorted(rows.table_names()) == sorted(full.table_names())
    assert "migrations" in rows.table_names()
    for name in ("migrations", "meta", "blobs", "no_such_table"):
        assert rows.table(name).exists() == full.table(name).exists()
    for sql, params in [
        ("SELECT * FROM migrations ORDER BY version", []),
        ("SELECT key, value FROM meta WHERE key = ?", ["event_schema_version"]),
        ("SELECT * FROM conversations", []),
    ]:
        assert list(rows.query(sql, params)) == list(full.query(sql, params))
    assert next(rows.query("SELECT version FROM migrations")) == {"version": 1}
    conn.close()


def test_enable_wal_switches_a_new_database_once(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "new.db", isolation_level=None)
    rows = Rows(conn)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    rows.enable_wal()
    rows.enable_wal()  # already in WAL: nothing to do
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
