"""The database schema as numbered migrations, applied when a Store opens.

Rules:

- A migration is never edited once released; changes come as a new migration with
  the next version. Migrations therefore spell out their values (the status names)
  instead of importing them from code that may change.
- Applied versions are recorded in the ``migrations`` table, each in the same
  transaction as the migration itself. A database with a version this code does not
  know is refused (``SchemaError``): it was written by a newer fanfold.
- ``meta.event_schema_version`` is the newest codec ``SCHEMA_VERSION`` whose
  documents the database may hold; a database holding newer ones is refused.
  ``meta.instance_id`` (migration 2) is the database's random identity, named by the
  provenance marks of its trees (``fanfold.db.provenance``).
- A read-only open cannot migrate: it needs every migration except those in
  ``READERS_DO_WITHOUT``, which only add what readers never read.
- Tables are STRICT: SQLite enforces every column's type. Value constraints (the
  status names) are not in the schema: sqlite-utils cannot declare CHECK constraints,
  and a trigger doing the same made the per-step UPDATE of ``conversations``
  2.5-5 times slower. ``Store`` writes statuses only from the ``Status`` enum.
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from fanfold.db.errors import SchemaError
from fanfold.db.versions import SCHEMA_VERSION

# sqlite_utils (0.43 G instructions to import) creates the tables: it is imported when a
# migration is applied, not by every open that finds the schema current (issue 36).
if TYPE_CHECKING:
    from sqlite_utils import Database

    from fanfold.db.rows import Rows


@attrs.frozen
class Migration:
    """One schema change: ``apply`` runs inside the transaction that records it."""

    version: int
    name: str
    apply: Callable[[Database], None]


def _v1_initial(db: Database) -> None:
    db.table("meta").create({"key": str, "value": str}, pk="key", not_null={"value"}, strict=True)
    db.table("conversations").create(
        {
            "id": str,
            "parent_id": str,
            "root_id": str,
            "depth": int,
            "task": str,
            "user_initiated": int,
            "created_at": float,
            "updated_at": float,
            "phase": str,
            "status": str,
            "last_seq": int,
            "snapshot_json": str,
            "snapshot_seq": int,
            "forked_from": str,
            "forked_at_seq": int,
        },
        pk="id",
        not_null={
            "root_id",
            "depth",
            "user_initiated",
            "created_at",
            "updated_at",
            "phase",
            "status",
            "last_seq",
        },
        foreign_keys=[
            ("parent_id", "conversations", "id"),
            ("root_id", "conversations", "id"),
            ("forked_from", "conversations", "id"),
        ],
        strict=True,
    )
    table = db.table("conversations")
    table.create_index(["parent_id"])
    table.create_index(["root_id"])
    table.create_index(["user_initiated", "created_at"])
    table.create_index(["status"])
    db.table("events").create(
        {
            "conversation_id": str,
            "seq": int,
            "type": str,
            "payload": str,
            "fingerprint": str,
            "at": float,
        },
        pk=("conversation_id", "seq"),
        not_null={"type", "payload", "fingerprint", "at"},
        foreign_keys=[("conversation_id", "conversations", "id")],
        strict=True,
    )
    db.table("effects").create(
        {"conversation_id": str, "seq": int, "idx": int, "type": str, "payload": str},
        pk=("conversation_id", "seq", "idx"),
        not_null={"type", "payload"},
        foreign_keys=[(("conversation_id", "seq"), "events", ("conversation_id", "seq"))],
        strict=True,
    )


def _v2_provenance(db: Database) -> None:
    # One row per tree (keyed by its root), not columns on ``conversations``: the
    # record belongs to the tree, it is written once (and its provider description on
    # a new turn), while conversation rows are rewritten on every step; and a tree
    # written before this migration simply has no row, which reads as "no provenance".
    db.table("trees").create(
        {
            "root_id": str,
            "origin": str,  # 'runtime' | 'imported'
            "mark": str,  # HMAC of (instance id, root id) under the user's key; NULL: none
            "provider": str,  # JSON: the provider configuration (paths, digests; no keys)
            "source": str,  # imported: the file's name
            "source_sha256": str,  # imported: the file's sha256
            "imported_at": float,
        },
        pk="root_id",
        not_null={"origin"},
        foreign_keys=[("root_id", "conversations", "id")],
        strict=True,
    )
    # The database's own random identity, which provenance marks name: a mark made for
    # one database does not verify in another.
    db.execute(
        "INSERT INTO meta (key, value) VALUES ('instance_id', ?) ON CONFLICT (key) DO NOTHING",
        [secrets.token_hex(16)],
    )


def _v3_checksums(db: Database) -> None:
    # A CRC-32 per row (``fanfold.db.checksum``) so that damage which still decodes is
    # reported as damage. Rows written before this migration keep NULL: not checked.
    db.execute("ALTER TABLE events ADD COLUMN checksum INTEGER")
    db.execute("ALTER TABLE effects ADD COLUMN checksum INTEGER")
    db.execute("ALTER TABLE conversations ADD COLUMN snapshot_checksum INTEGER")


def _v4_blobs(db: Database) -> None:
    # Large values repeated across conversations (tool sets, system prompts), stored
    # once per database by content: documents name them {"blob": "<sha256>"}
    # (``fanfold.db.codec``, "Blobs"). The key is the sha256 of the body, which every
    # reader checks: no separate checksum. Never updated or deleted.
    db.table("blobs").create(
        {"sha256": str, "body": str},
        pk="sha256",
        not_null={"body"},
        strict=True,
    )


def _v5_events_only(db: Database) -> None:
    # The events-only log: steps written from now on store their event alone, no
    # ``effects`` rows (replay re-derives them), and a version-6 fingerprint. Nothing
    # in the tables changes: rows written before keep their effects and are read as
    # they are, so a log is never half-migrated (there is nothing to convert). The
    # migration's number is what matters: a fanfold that does not know the format
    # refuses the database ("newer schema") rather than misreading its steps.
    del db


def _v6_tool_progress(db: Database) -> None:
    # The latest progress report (MCP's ``notifications/progress``) of each tool call in
    # flight, for the trace page (``fanfold ui``, ``fanfold trace``), which reads the log
    # in another process. A side table, not the event log: a report is no reducer fact,
    # replay and verify never read it, and export copies none of it. The runtime writes
    # a call's row at most twice a second and deletes it when the call ends
    # (``fanfold.runtime.progress_rows``); a row left by a runtime that died is never
    # shown for a call that has ended, nor for one started again after it (``at``).
    db.table("tool_progress").create(
        {"conversation_id": str, "call": int, "text": str, "reports": int, "at": float},
        pk=("conversation_id", "call"),
        not_null={"text", "reports", "at"},
        strict=True,
    )


def _v7_last_turn(db: Database) -> None:
    # The outcome of each conversation's latest finished turn (its ``TurnFinished``
    # effect's: 'answered', 'cancelled', 'error', 'completed', 'failed'), written with
    # the step that produced it, so that a listing (``fanfold ls``: "idle (cancelled)")
    # reads it instead of folding the conversation's events through the reducer. NULL:
    # not recorded (no turn finished since this migration, imported rows): readers
    # find it by replay, as before. A copy of the reducer's output, never read by
    # replay or verify.
    db.execute("ALTER TABLE conversations ADD COLUMN last_turn TEXT")


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema", _v1_initial),
    Migration(2, "tree provenance", _v2_provenance),
    Migration(3, "row checksums", _v3_checksums),
    Migration(4, "content-addressed blobs", _v4_blobs),
    Migration(5, "events-only log", _v5_events_only),
    Migration(6, "tool progress side table", _v6_tool_progress),
    Migration(7, "last turn's outcome", _v7_last_turn),
)
LATEST_VERSION = MIGRATIONS[-1].version

READERS_DO_WITHOUT = frozenset({2, 3, 4, 5, 6, 7})
"""Migrations a read-only open may find missing: they only add what readers never
read (tree provenance matters to the runtime, which opens read-write and migrates)
or can do without (a log without the row checksums is read unchecked; a log without
the blobs table was written before any document named a blob; a log without the
events-only format holds effects for every step; a log without the tool progress
table shows no progress; a log without the last turn's outcome has it found by
replay)."""


def _applied_versions(db: Rows | Database) -> set[int]:
    if not db.table("migrations").exists():
        return set()
    return {row["version"] for row in db.query("SELECT version FROM migrations")}


def _event_schema_version(db: Rows | Database) -> int | None:
    if not db.table("meta").exists():
        return None
    rows = list(db.query("SELECT value FROM meta WHERE key = 'event_schema_version'"))
    return int(rows[0]["value"]) if rows else None


def _up_to_date(db: Rows | Database) -> bool:
    applied = _applied_versions(db)
    newest = max(applied, default=0)
    if newest > LATEST_VERSION:
        raise SchemaError(
            f"the database has schema version {newest}, newer than this fanfold knows "
            f"({LATEST_VERSION}); upgrade fanfold to open it"
        )
    events = _event_schema_version(db)
    if events is not None and events > SCHEMA_VERSION:
        raise SchemaError(
            f"the database holds events of schema version {events}, newer than this "
            f"fanfold reads ({SCHEMA_VERSION}); upgrade fanfold to open it"
        )
    return applied == {m.version for m in MIGRATIONS} and events == SCHEMA_VERSION


def check_current(db: Rows | Database) -> None:
    """Raise SchemaError unless this fanfold can read the database as it is (for a
    read-only open, which cannot migrate): every migration applied, and no document
    newer than the codec reads (older ones decode as they are)."""
    _up_to_date(db)  # raises if anything is newer
    needed = {m.version for m in MIGRATIONS} - READERS_DO_WITHOUT
    if not needed <= _applied_versions(db):
        raise SchemaError(
            "the database was written by an older fanfold and needs a migration, which a "
            "read-only open cannot apply; any fanfold command that writes to it (run, "
            "send, fork, import) migrates it first"
        )


def migrate(db: Rows | Database) -> list[int]:
    """Apply every pending migration; returns the versions applied (often none).

    Safe to call from several processes at once: the work happens under
    ``BEGIN IMMEDIATE``, and whoever gets the write lock second finds nothing to do.
    """
    if _up_to_date(db):
        return []
    from sqlite_utils import Database

    conn: sqlite3.Connection = db.conn
    db = Database(conn)
    conn.execute("BEGIN IMMEDIATE")
    try:
        _up_to_date(db)  # re-check under the write lock: raises if the file got newer
        if not db.table("migrations").exists():
            db.table("migrations").create(
                {"version": int, "name": str, "applied_at": float},
                pk="version",
                not_null={"name", "applied_at"},
                strict=True,
            )
        applied = _applied_versions(db)
        done = []
        for migration in MIGRATIONS:
            if migration.version in applied:
                continue
            migration.apply(db)
            db.execute(
                "INSERT INTO migrations (version, name, applied_at) VALUES (?, ?, ?)",
                [migration.version, migration.name, time.time()],
            )
            done.append(migration.version)
        db.execute(
            "INSERT INTO meta (key, value) VALUES ('event_schema_version', ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [str(SCHEMA_VERSION)],
        )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return done
