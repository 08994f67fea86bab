"""``PostgresStore``: fanfold's event log in PostgreSQL (issue 25), the same log as
``Store``'s SQLite file.

Imported only for a ``postgresql://`` or ``postgres://`` URL (``fanfold.db.open_store``):
psycopg is the ``postgres`` extra, and nothing of it is loaded by ``import fanfold`` or
a run on SQLite.

What it is: a subclass of ``Store`` that keeps every query, every row and every value
of the SQLite log (same tables and columns, same stored texts, checksums and
fingerprints: a tree verifies identically on either store, and ``export``/``import``
moves trees between them) and replaces what is SQLite's own:

- **The connection**: one psycopg 3 synchronous connection in autocommit mode, on
  which ``Store``'s explicit ``BEGIN``/``COMMIT``/``ROLLBACK`` run as they do on
  SQLite; ``_PgConnection`` gives it the few ``sqlite3.Connection`` methods the
  queries use, turning ``?`` placeholders into psycopg's. Guarded by the store's lock
  like the SQLite connection, so the runtime's writer thread may use it.
- **The schema**: the tables live in the ``fanfold`` schema (``search_path`` is set
  per connection), beside DBOS's ``dbos`` schema in the same database. It is created
  on first open, in one transaction under an advisory lock (several workers may open
  a new database at once), with its own numbered migrations (``PG_MIGRATIONS``).
  SQLite's implicit ``rowid`` is an identity column ``rowid`` on the tables whose
  write order is read (conversations, events, blobs).
- **Transactions**: a write is ``BEGIN`` (READ COMMITTED). Another writer cannot
  slip between the sequence check and the commit unnoticed: each conversation's
  ``UPDATE`` names the ``last_seq`` it expects (a concurrent one waits for the other
  transaction, then sees its row and matches nothing), and two inserts of one
  ``(conversation, seq)`` collide on the key; either way the batch is rolled back and
  checked against the rows, and a step that is no longer next is ``SequenceError``.
  A read is ``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY``: its statements see
  one snapshot, as SQLite's read transaction does.
- **Per-tree claims** (``claims``: owner, epoch): a store's first batch of a tree
  claims it; every later batch must still hold the claim (``TreeTakenOver``
  otherwise), so a runtime another one took a tree from (a frozen worker that wakes)
  writes nothing more of it, whichever conversation (``_fence``).
- **Blobs** are read incrementally by ``rowid`` as on SQLite. An identity is handed
  out at insert, not at commit, so two writers could commit blob 11 before blob 10 and
  a reader that saw 11 would never read 10; a transaction that inserts blobs
  therefore first takes a lock on the table (``SHARE ROW EXCLUSIVE``, which only other
  blob writers wait for), so blobs commit in the order of their ids. New blobs are
  rare (a tree's tool set and prompts, once per database).
- **Errors**: a lost connection, a refused login, a missing database are
  ``LogUnavailable`` (a ``DatabaseError``: one line for a CLI user), whose message
  names the database by its URL without the password (``display_target``), and never
  holds the password even where the server's message would.
- **A lost connection** is replaced before a transaction's ``BEGIN`` or a lone read
  (for up to ``RECONNECT_S``). A write it cuts short is tried again (up to
  ``LOST_WRITES`` times): an ``append`` batch only after the log says it did not
  land (``_write``, ``_landed``: every event row of the batch stored as sent, or
  none), the writes that are the same twice (a claim, a provider record, a
  snapshot) at once. ``append`` returns only once its batch is known committed.
- **No file-level damage check**: ``damage()`` is None (PostgreSQL has no
  ``integrity_check``; its own page checksums, where the cluster enables them, raise
  errors on read). Row checksums are checked as on SQLite.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, TypeVar, cast

import psycopg
from psycopg import sql as pgsql
from psycopg.rows import dict_row

from fanfold.db.codec import SCHEMA_VERSION, column_text
from fanfold.db.errors import (
    DatabaseError,
    EmptyLog,
    LogUnavailable,
    ReadOnlyStore,
    SchemaError,
    TreeTakenOver,
)
from fanfold.db.records import Status, claim_unit
from fanfold.db.store import Store, _Prepared, _status_text
from fanfold.db.targets import display_target, without_password

if TYPE_CHECKING:
    from fanfold.db.records import Step

_T = TypeVar("_T")

SCHEMA = "fanfold"
"""The PostgreSQL schema that holds fanfold's tables."""

CONNECT_TIMEOUT_S = 10
"""How long opening waits for the server (unless the URL says ``connect_timeout``)."""

RECONNECT_S = 30.0
"""How long a store tries to connect again after its connection was lost (a server
restart, a network cut) before the statement fails with ``LogUnavailable``."""

LOST_WRITES = 3
"""How many times one write (an ``append`` batch, a claim, a provider record, a
snapshot) is tried again after its connection was lost inside its transaction, before
``LogUnavailable`` stops the caller (each time after up to ``RECONNECT_S``)."""

NOTIFY_CHANNEL = "fanfold_placement"
"""The channel a placed child's end and a cancel asked of placed children are notified
on (``PostgresStore.listen``; fanfold/runtime/placement.py)."""
LISTEN_STOP_S = 0.5
"""How long a listener waits for a notification before it looks at its stop flag."""
LISTEN_RETRY_S = 1.0
"""How long a listener whose connection was lost waits before it connects again."""

_LOCK_KEY = 0x66616E666F6C64  # "fanfold": the advisory lock that serialises migration
_RUNTIMES_KEY = 0x66616E666F6C64 + 1  # held shared by every runtime on the log (Presence)

# The schema of SQLite's log after its migration 5 (the events-only log), in
# PostgreSQL's types: TEXT for str, BIGINT for int (a CRC-32 is unsigned 32-bit),
# DOUBLE PRECISION for float (a Python float round-trips exactly). A migration is never
# edited once released; changes come as a new one, as for SQLite (``schema.py``).
_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE conversations (
    rowid BIGINT GENERATED ALWAYS AS IDENTITY,
    id TEXT PRIMARY KEY,
    parent_id TEXT REFERENCES conversations (id),
    root_id TEXT NOT NULL REFERENCES conversations (id),
    depth BIGINT NOT NULL,
    task TEXT,
    user_initiated BIGINT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    phase TEXT NOT NULL,
    status TEXT NOT NULL,
    last_seq BIGINT NOT NULL,
    snapshot_json TEXT,
    snapshot_seq BIGINT,
    forked_from TEXT REFERENCES conversations (id),
    forked_at_seq BIGINT,
    snapshot_checksum BIGINT
);
CREATE INDEX conversations_parent_id ON conversations (parent_id);
CREATE INDEX conversations_root_id ON conversations (root_id, rowid);
CREATE INDEX conversations_user_initiated ON conversations (user_initiated, created_at);
CREATE INDEX conversations_status ON conversations (status);
CREATE TABLE events (
    rowid BIGINT GENERATED ALWAYS AS IDENTITY,
    conversation_id TEXT NOT NULL REFERENCES conversations (id),
    seq BIGINT NOT NULL,
    type TEXT NOT NULL,
    payload TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    checksum BIGINT,
    PRIMARY KEY (conversation_id, seq)
);
CREATE TABLE effects (
    conversation_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    idx BIGINT NOT NULL,
    type TEXT NOT NULL,
    payload TEXT NOT NULL,
    checksum BIGINT,
    PRIMARY KEY (conversation_id, seq, idx),
    FOREIGN KEY (conversation_id, seq) REFERENCES events (conversation_id, seq)
);
CREATE TABLE trees (
    root_id TEXT PRIMARY KEY REFERENCES conversations (id),
    origin TEXT NOT NULL,
    mark TEXT,
    provider TEXT,
    source TEXT,
    source_sha256 TEXT,
    imported_at DOUBLE PRECISION
);
CREATE TABLE blobs (
    rowid BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    sha256 TEXT PRIMARY KEY,
    body TEXT NOT NULL
);
"""

# Who runs each tree now (issue 25's fencing): the owner (a runtime's store) and an
# epoch raised by every new claim. Not a foreign key: a tree's claim is taken in the
# transaction that creates its root, before the root's row. Not exported: it is the
# state of a database's workers, not of the tree.
_V2 = """
CREATE TABLE claims (
    root_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    epoch BIGINT NOT NULL
);
"""

# Where a big fan-out's children run (issue 25's placement of chunks): each placed
# child's chunk (a unit of distribution with its own claim) and the ``SpawnSubAgent``
# its parent issued, in the codec's text; and the cancels a parent sent to children
# running elsewhere. Not exported: like the claims, the state of a database's workers.
_V3 = """
CREATE TABLE placements (
    child_id TEXT PRIMARY KEY,
    chunk_id TEXT NOT NULL,
    root_id TEXT NOT NULL,
    parent_id TEXT NOT NULL,
    effect TEXT NOT NULL
);
CREATE INDEX placements_by_chunk ON placements (chunk_id);
CREATE INDEX placements_by_root ON placements (root_id);
CREATE TABLE cancels (
    conversation_id TEXT PRIMARY KEY,
    reason TEXT NOT NULL
);
"""

# The latest progress report of each tool call in flight (SQLite's migration 6, the
# same table): for the trace page only, never read by replay or verify, not exported.
_V4 = """
CREATE TABLE tool_progress (
    conversation_id TEXT NOT NULL,
    call BIGINT NOT NULL,
    text TEXT NOT NULL,
    reports BIGINT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (conversation_id, call)
);
"""

PG_MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (1, "the events-only log (SQLite's migrations 1 to 5)", _V1),
    (2, "per-tree claims (owner, epoch)", _V2),
    (3, "placements of children in chunks, and their cancels", _V3),
    (4, "tool progress side table", _V4),
)
PG_LATEST = PG_MIGRATIONS[-1][0]

PG_READERS_DO_WITHOUT = frozenset({2, 3, 4})
"""Migrations a read-only open may find missing: the claims and placements matter to
writers (runtimes) only; without the tool progress table a trace shows no progress."""


class _Scrubbed:
    """Turns psycopg's errors into fanfold's, naming the database by ``shown`` and
    with the password (if any) cut out of every message."""

    def __init__(self, url: str) -> None:
        self.shown = display_target(url)
        self._url = url

    def text(self, exc: BaseException) -> str:
        return without_password(" ".join(str(exc).split()), self._url)

    def unavailable(self, exc: BaseException) -> LogUnavailable:
        return LogUnavailable(f"the PostgreSQL log {self.shown} is unavailable: {self.text(exc)}")


class _PgConnection:
    """The part of ``sqlite3.Connection`` that ``Store``'s queries use, over psycopg.

    ``?`` placeholders become ``%s`` (and a literal ``%`` becomes ``%%``); rows are
    tuples. A psycopg error other than a broken key (which ``Store`` catches as its
    ``_integrity_errors``) becomes a fanfold error: ``LogUnavailable`` for the
    connection or the server (``OperationalError``), ``SchemaError`` for a table or
    column fanfold made that is missing (changed by hand), else ``DatabaseError``.
    """

    def __init__(self, conn: psycopg.Connection[Any], scrub: _Scrubbed) -> None:
        self.raw = conn
        self._scrub = scrub
        self._sql: dict[str, str] = {}

    def _convert(self, query: str) -> str:
        converted = self._sql.get(query)
        if converted is None:
            converted = self._sql[query] = query.replace("%", "%%").replace("?", "%s")
        return converted

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except psycopg.IntegrityError:
            raise
        except psycopg.OperationalError as exc:
            raise self._scrub.unavailable(exc) from None
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as exc:
            raise SchemaError(
                f"the PostgreSQL log {self._scrub.shown} is damaged: {self._scrub.text(exc)} "
                "(not fanfold's tables any more)"
            ) from None
        except psycopg.Error as exc:
            raise DatabaseError(
                f"the PostgreSQL log {self._scrub.shown} refused: {self._scrub.text(exc)}"
            ) from None

    def execute(self, query: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        with self._errors():
            return self.raw.execute(self._convert(query), tuple(params))

    def executemany(self, query: str, rows: Sequence[Sequence[Any]]) -> psycopg.Cursor[Any]:
        with self._errors():
            cursor = self.raw.cursor()
            cursor.executemany(self._convert(query), rows)
            return cursor

    def query(self, query: str, params: Sequence[Any] = ()) -> Iterator[dict[str, Any]]:
        """Every row of ``query`` as a dict (``sqlite_utils.Database.query``)."""
        with self._errors():
            cursor = self.raw.cursor(row_factory=dict_row)
            cursor.execute(self._convert(query), tuple(params))
            rows = cursor.fetchall()
        return iter(rows)

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE

    def close(self) -> None:
        self.raw.close()


def connect(url: str, *, read_only: bool = False) -> psycopg.Connection[Any]:
    """A psycopg connection to ``url`` in autocommit mode, its ``search_path`` the
    ``fanfold`` schema; ``LogUnavailable`` (no password in it) if it cannot be made."""
    scrub = _Scrubbed(url)
    options = f"-c search_path={SCHEMA}"
    if read_only:
        options += " -c default_transaction_read_only=on"
    extra: dict[str, Any] = {"autocommit": True, "options": options}
    if "connect_timeout" not in url:
        extra["connect_timeout"] = CONNECT_TIMEOUT_S
    try:
        conn = psycopg.connect(url, **extra)
        if not read_only:
            _durable_commits(conn)
        return conn
    except psycopg.Error as exc:
        raise scrub.unavailable(exc) from None


def _durable_commits(conn: psycopg.Connection[Any]) -> None:
    """Make the connection's COMMIT wait for the server's WAL flush.

    The runtime starts a batch's effects once its COMMIT returns (write-ahead), so a
    commit must be on the server's stable storage by then. PostgreSQL's default,
    ``synchronous_commit = on``, does that; ``off`` (set for the server, the database,
    the role, or in the URL's ``options``) returns before the flush, and a crash of
    the server's machine could take back steps whose commands already ran. So ``off``
    is turned back ``on`` for this session; every other value (``local``,
    ``remote_write``, ``remote_apply``: at least the local flush) is kept. What this
    cannot fix: a server run with ``fsync = off``, whose flushes reach no disk.
    """
    row = conn.execute("SHOW synchronous_commit").fetchone()
    if row is not None and row[0] == "off":
        conn.execute("SET synchronous_commit = on")


class PostgresStore(Store):
    """fanfold's event log in a PostgreSQL database (``open(url)``); see the module.

    ``path`` is the URL without its password (what messages name).
    """

    _integrity_errors = (psycopg.IntegrityError,)
    _turns = False  # no last_turn column (SQLite's migration 7): found by replay

    @staticmethod
    def _column_text(text: str | None) -> str | None:
        """``codec.column_text``, and a NUL character (which a PostgreSQL text cannot
        hold; SQLite's can) written ``\\u0000`` too: the column is a copy for listing,
        the exact task is in the events (ASCII JSON, where JSON escapes it)."""
        text = column_text(text)
        return text.replace("\x00", "\\u0000") if text is not None else None

    def __init__(self, conn: _PgConnection, shown: str, *, read_only: bool = False) -> None:
        """Wrap an open connection. Use ``open`` instead."""
        # Store.__init__ wraps an sqlite3 connection in sqlite_utils: set the same
        # attributes here instead, with the psycopg adapter standing for both.
        self._conn = cast(Any, conn)
        self._db = cast(Any, conn)
        self._pg = conn
        self._url = ""  # set by ``open``; holds the password: never shown
        self._lock = threading.Lock()
        self._checkpointer = None
        self.path = shown
        self.read_only = read_only
        self._private_copy = None
        self._failed = None
        self._checksums = True
        self._blobs: dict[str, str] = {}
        self._blob_rowid: int | None = 0
        self._seen: dict[str, tuple[int, str]] = {}
        self.units: dict[str, str] = {}
        """The unit (a chunk's id) of each conversation a runtime runs for a chunk of
        placed children; every other conversation's unit is its tree (PostgreSQL's
        claims are per unit; a file has none)."""
        # This store's identity as a tree's owner, and the epoch of each tree it holds.
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"
        """Who this store is in the ``claims`` table (host, process, random)."""
        self._claims: dict[str, int] = {}
        self._lost: set[str] = set()  # trees taken over: refused until ``claim``
        self._taking: dict[str, int] = {}  # the claims the batch in flight takes

    @classmethod
    def open(cls, path: Any, *, read_only: bool = False) -> PostgresStore:
        """Connect to the database at URL ``path`` and create or check fanfold's schema.

        With ``read_only``, write nothing (no schema created: a database without one
        is ``EmptyLog``; the session's transactions are read-only too).
        """
        url = str(path)
        scrub = _Scrubbed(url)
        raw = connect(url, read_only=read_only)
        conn = _PgConnection(raw, scrub)
        try:
            store = cls(conn, scrub.shown, read_only=read_only)
            store._url = url
            store._check_or_create(read_only=read_only)
        except BaseException:
            raw.close()
            raise
        return store

    def _check_or_create(self, *, read_only: bool) -> None:
        conn = self._pg
        exists = self._schema_exists()
        if not exists and read_only:
            raise EmptyLog(
                f"{self.path} holds no fanfold log yet (no `{SCHEMA}` schema): nothing "
                "was recorded in it (the first `fanfold run --db` sets it up)"
            )
        if not read_only and (not exists or self._versions() != {v for v, _, _ in PG_MIGRATIONS}):
            conn.execute("BEGIN")
            try:
                conn.execute("SELECT pg_advisory_xact_lock(?)", [_LOCK_KEY])
                # Under the lock: another process may have made it meanwhile.
                if not self._schema_exists():
                    conn.raw.execute(
                        pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(pgsql.Identifier(SCHEMA))
                    )
                    conn.raw.execute(
                        "CREATE TABLE migrations (version BIGINT PRIMARY KEY,"
                        " name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
                    )
                self._migrate()
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.raw.execute("ROLLBACK")
                raise
        self._check_versions()

    def _schema_exists(self) -> bool:
        row = self._pg.execute(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = ?"
            " AND table_name = 'migrations'",
            [SCHEMA],
        ).fetchone()
        return row is not None

    def _versions(self) -> set[int]:
        return {int(r[0]) for r in self._pg.execute("SELECT version FROM migrations").fetchall()}

    def _migrate(self) -> None:
        """Apply the missing migrations (inside the caller's locked transaction)."""
        self._check_versions(applied_only=True)
        applied = self._versions()
        for version, name, ddl in PG_MIGRATIONS:
            if version in applied:
                continue
            self._pg.raw.execute(ddl.encode())
            self._pg.execute(
                "INSERT INTO migrations (version, name, applied_at) VALUES (?, ?, ?)",
                [version, name, time.time()],
            )
            if version == 1:
                self._pg.execute(
                    "INSERT INTO meta (key, value) VALUES ('instance_id', ?)"
                    " ON CONFLICT (key) DO NOTHING",
                    [secrets.token_hex(16)],
                )
        self._pg.execute(
            "INSERT INTO meta (key, value) VALUES ('event_schema_version', ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [str(max(SCHEMA_VERSION, self._event_version() or 0))],
        )

    def _event_version(self) -> int | None:
        row = self._pg.execute(
            "SELECT value FROM meta WHERE key = 'event_schema_version'"
        ).fetchone()
        return int(row[0]) if row else None

    def _check_versions(self, *, applied_only: bool = False) -> None:
        """SchemaError if a newer fanfold wrote the database (or, unless
        ``applied_only``, if a read-only open finds migrations missing)."""
        applied = self._versions()
        newest = max(applied, default=0)
        if newest > PG_LATEST:
            raise SchemaError(
                f"the PostgreSQL log {self.path} has schema version {newest}, newer than this "
                f"fanfold knows ({PG_LATEST}); upgrade fanfold to open it"
            )
        if applied_only:
            return
        events = self._event_version()
        if events is not None and events > SCHEMA_VERSION:
            raise SchemaError(
                f"the PostgreSQL log {self.path} holds events of schema version {events}, "
                f"newer than this fanfold reads ({SCHEMA_VERSION}); upgrade fanfold to open it"
            )
        if not {v for v, _, _ in PG_MIGRATIONS} - PG_READERS_DO_WITHOUT <= applied:
            raise SchemaError(
                f"the PostgreSQL log {self.path} was written by an older fanfold and needs a "
                "migration, which a read-only open cannot apply; any fanfold command that "
                "writes to it (run, send, fork, import) migrates it first"
            )

    # ---------------------------------------------------------------- what differs

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[Any]:
        """Hold the lock and one transaction; roll back on any exception. ``BEGIN
        IMMEDIATE`` (a write) is READ COMMITTED, guarded by the ``last_seq`` updates
        and keys; ``BEGIN`` (a read) sees one snapshot."""
        if self.read_only and begin != "BEGIN":
            raise ReadOnlyStore(f"{self.path} was opened read-only; nothing was written")
        statement = (
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if begin == "BEGIN" else "BEGIN"
        )
        with self._lock:
            self._connection()  # StoreClosed once closed
            conn = self._pg
            try:
                conn.execute(statement)
            except LogUnavailable:
                # Nothing of this transaction was sent: safe to connect again and go on.
                self._reconnect()
                conn.execute(statement)
            try:
                yield _BlobOrdered(conn)
            except BaseException:
                if conn.in_transaction:
                    # (If the connection is gone, so is the transaction.)
                    with suppress(psycopg.Error):
                        conn.raw.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            self._connection()
            try:
                return list(self._pg.query(sql, params))
            except LogUnavailable:
                self._reconnect()  # a lone read: safe to run again
                return list(self._pg.query(sql, params))

    def _reconnect(self) -> None:
        """Replace a lost connection (under the lock), trying for ``RECONNECT_S``.

        Here only where nothing can have been half-done: before a transaction's
        ``BEGIN`` reached the server, or for a lone read. A connection lost inside a
        write transaction (at ``COMMIT`` above all, where the batch may or may not have
        committed) is ``LogUnavailable`` out of the transaction; the write methods
        then try again (``_write`` after asking the log whether the batch landed,
        ``_rewritten`` for the writes that are the same twice), and the next
        transaction's ``BEGIN`` comes here. The store's memory of the rows it wrote
        stays right (it is updated only after a commit is known), and so do its
        claims (rows in the database).
        """
        with suppress(psycopg.Error):
            self._pg.raw.close()
        deadline = time.monotonic() + RECONNECT_S
        delay = 0.05
        while True:
            try:
                self._pg.raw = connect(self._url, read_only=self.read_only)
                return
            except LogUnavailable:
                if time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _write(
        self,
        prepared: list[_Prepared],
        last: dict[str, Step],
        new_blobs: list[tuple[str, str]],
        snapshot_rows: list[tuple[str, int, int, str]],
        *,
        trusted: bool,
    ) -> dict[str, str]:
        """``Store._write``, tried again when the connection is lost inside the batch's
        transaction (a server restart, a network cut: ``LogUnavailable``).

        A loss before ``COMMIT`` reached the server rolled the batch back; a loss at
        ``COMMIT`` leaves its outcome unknown: the server may have committed it and
        gone before the client heard. So, on a new connection, the log is asked
        (``_landed``): the batch is one transaction, so either every one of its event
        rows is there, exactly as sent, or none is. All there: it committed; its claims
        are recorded and it is reported written. None: it is written again, under the
        same guards as the first time (each conversation's ``last_seq`` in its
        ``UPDATE``, the keys, the tree's claim), so a writer that came in between (a
        worker that took the tree over) is still ``SequenceError`` or
        ``TreeTakenOver``, never a second copy. ``append`` returns only once its batch
        is known committed, so the runtime still runs a step's effects after it is in
        the log (write-ahead)."""
        lost = 0
        while True:
            self._taking = {}
            try:
                return super()._write(prepared, last, new_blobs, snapshot_rows, trusted=trusted)
            except LogUnavailable:
                lost += 1
                if lost > LOST_WRITES:
                    raise
                taking = self._taking
            # The next transaction's BEGIN finds the connection gone and makes a new one
            # (``_transaction``, for up to RECONNECT_S); a loss during the check itself
            # counts as one more.
            while True:
                try:
                    landed = self._landed(prepared)
                    break
                except LogUnavailable:
                    lost += 1
                    if lost > LOST_WRITES:
                        raise
            if landed:
                self._fenced(taking)  # committed with the batch
                return {cid: _status_text(step.state.phase) for cid, step in last.items()}

    def _landed(self, prepared: list[_Prepared]) -> bool:
        """Whether the batch ``prepared`` is in the log: True if every one of its event
        rows is stored as this store sent it, False if none is (not committed; a row
        of the same key with other content is another writer's, which the batch's
        guards refuse when it is written again). Some but not all would be a batch
        half applied, which one transaction cannot be: ``DatabaseError``."""
        keys = [p.event_row[:2] for p in prepared]
        with self._transaction("BEGIN") as conn:
            rows = conn.execute(
                "SELECT e.conversation_id, e.seq, e.type, e.payload, e.fingerprint, e.at,"
                " e.checksum FROM events e JOIN unnest(?::text[], ?::bigint[]) AS k (c, s)"
                " ON e.conversation_id = k.c AND e.seq = k.s",
                [[k[0] for k in keys], [k[1] for k in keys]],
            ).fetchall()
        stored = {(row[0], row[1]): tuple(row) for row in rows}
        ours = [stored.get(p.event_row[:2]) == tuple(p.event_row) for p in prepared]
        if all(ours):
            return True
        if not any(ours):
            return False
        raise DatabaseError(
            f"the PostgreSQL log {self.path} holds part of a batch whose commit was "
            "interrupted, which one transaction cannot leave: the log is not as fanfold "
            "wrote it"
        )

    def _rewritten(self, write: Callable[[], _T]) -> _T:
        """``write()`` (one transaction that may be run twice to the same end: a claim,
        a provider record, a snapshot), tried again on a new connection when its
        connection is lost inside it, up to ``LOST_WRITES`` times."""
        lost = 0
        while True:
            try:
                return write()
            except LogUnavailable:
                lost += 1
                if lost > LOST_WRITES:
                    raise

    def record_provider(self, root_id: str, provider: str) -> None:
        """``Store.record_provider``, tried again after a lost connection (it sets a
        column to one value: twice is once)."""
        self._rewritten(lambda: Store.record_provider(self, root_id, provider))

    def save_snapshot(self, conversation_id: str, seq: int, state: Any) -> None:
        """``Store.save_snapshot``, tried again after a lost connection (it writes the
        same snapshot, or nothing if a later one is stored: twice is once)."""
        self._rewritten(lambda: Store.save_snapshot(self, conversation_id, seq, state))

    def _has_trees(self) -> bool:
        return True  # created with the schema

    def _has_progress(self) -> bool:
        return bool(
            self._query(
                "SELECT 1 FROM information_schema.tables WHERE table_schema = ?"
                " AND table_name = 'tool_progress'",
                [SCHEMA],
            )
        )

    def _fence(self, conn: Any, prepared: list[Any]) -> dict[str, int]:
        """Check this store's claim on every tree of the batch, or take it.

        A tree this store holds: its claim row is read ``FOR SHARE`` (a competing
        claim waits for this batch's commit) and must still name this owner and epoch,
        else ``TreeTakenOver`` and nothing is written. A tree it does not hold (it
        starts, resumes, forks or sends to it: its first write) is claimed in this
        transaction, the epoch raised past any earlier owner's, whose next batch is
        then refused. Returns the claims taken, recorded once the batch commits.
        """
        # A conversation's claim is its unit's: its tree's, or the chunk it was placed
        # in (``units``, set by the runtime that runs the chunk) and its descendants.
        units = self.units
        roots = sorted({claim_unit(p.step.state, units) for p in prepared})
        lost = self._lost.intersection(roots)
        if lost:
            root = min(lost)
            raise TreeTakenOver(
                root,
                f"tree {root!r} was taken over by another runtime; this one writes no more "
                "of it (nothing of the batch was written)",
            )
        held = [root for root in roots if root in self._claims]
        if held:
            rows = conn.execute(
                "SELECT root_id, owner, epoch FROM claims WHERE root_id = ANY(?)"
                " ORDER BY root_id FOR SHARE",
                [held],
            ).fetchall()
            found = {root: (owner, epoch) for root, owner, epoch in rows}
            for root in held:
                now = found.get(root)
                mine = self._claims[root]
                if now != (self.owner, mine):
                    del self._claims[root]  # not this store's any more
                    self._lost.add(root)
                    by = f"{now[0]}, epoch {now[1]}" if now else "its claim is gone"
                    raise TreeTakenOver(
                        root,
                        f"tree {root!r} was taken over by another runtime ({by}) since this "
                        f"one claimed it (epoch {mine}); nothing of the batch was written: "
                        "its new owner goes on from the log",
                    )
        taken: dict[str, int] = {}
        for root in roots:
            if root in self._claims:
                continue
            row = conn.execute(
                "INSERT INTO claims (root_id, owner, epoch) VALUES (?, ?, 1)"
                " ON CONFLICT (root_id) DO UPDATE SET owner = excluded.owner,"
                " epoch = claims.epoch + 1 RETURNING epoch",
                [root, self.owner],
            ).fetchone()
            taken[root] = int(row[0])
        self._taking = taken  # for ``_write``, should the commit's outcome be unknown
        if any(p.step.state.id in units and p.step.state.outcome is not None for p in prepared):
            # A placed child (or a conversation below one) ended: wake the runtimes
            # watching placed children. Sent in the batch's transaction, so delivered only
            # once it commits; a runtime that misses it still finds the outcome by its poll.
            conn.execute(f"NOTIFY {NOTIFY_CHANNEL}, 'outcome'")
        return taken

    def _fenced(self, fence: Any) -> None:
        self._claims.update(fence)

    def claim(self, root_id: str) -> int:
        """Claim tree ``root_id`` now (as its next batch would) and return the epoch:
        for a worker that takes a tree over before writing to it.

        Tried again after a connection lost inside its transaction: if the first
        commit landed unheard, the second raises the epoch once more, for the same
        owner, which fences the same others."""

        def take() -> Any:
            with self._transaction("BEGIN IMMEDIATE") as conn:
                return conn.execute(
                    "INSERT INTO claims (root_id, owner, epoch) VALUES (?, ?, 1)"
                    " ON CONFLICT (root_id) DO UPDATE SET owner = excluded.owner,"
                    " epoch = claims.epoch + 1 RETURNING epoch",
                    [root_id, self.owner],
                ).fetchone()

        row = self._rewritten(take)
        self._claims[root_id] = int(row[0])
        self._lost.discard(root_id)
        return self._claims[root_id]

    # ------------------------------------------------------------ placement

    def place(self, rows: Sequence[tuple[str, str, str, str, str]]) -> None:
        """Record placed children: ``(child_id, chunk_id, root_id, parent_id, effect
        text)`` each, in one transaction; a child recorded already keeps its first
        row (a placement is decided once: a runtime that placed it again after a
        restart finds it). Tried again after a lost connection (twice is once)."""

        def write() -> None:
            with self._transaction("BEGIN IMMEDIATE") as conn:
                for row in rows:
                    conn.execute(
                        "INSERT INTO placements (child_id, chunk_id, root_id, parent_id, effect)"
                        " VALUES (?, ?, ?, ?, ?) ON CONFLICT (child_id) DO NOTHING",
                        list(row),
                    )

        self._rewritten(write)

    def placements(self, root_id: str) -> dict[str, str]:
        """Each placed child of tree ``root_id`` and its chunk."""
        return {
            r["child_id"]: r["chunk_id"]
            for r in self._query(
                "SELECT child_id, chunk_id FROM placements WHERE root_id = ?", [root_id]
            )
        }

    def placed_among(self, ids: Sequence[str]) -> dict[str, str]:
        """Which of ``ids`` were placed, and in which chunk."""
        if not ids:
            return {}
        return {
            r["child_id"]: r["chunk_id"]
            for r in self._query(
                "SELECT child_id, chunk_id FROM placements WHERE child_id = ANY(?)", [list(ids)]
            )
        }

    def chunk(self, chunk_id: str) -> list[tuple[str, str, str, str]]:
        """A chunk's children in spawn order: ``(child_id, root_id, parent_id, effect
        text)`` each (none: no such chunk)."""
        return [
            (r["child_id"], r["root_id"], r["parent_id"], r["effect"])
            for r in self._query(
                "SELECT child_id, root_id, parent_id, effect FROM placements"
                " WHERE chunk_id = ? ORDER BY child_id",
                [chunk_id],
            )
        ]

    def at_rest_among(self, ids: Sequence[str]) -> list[str]:
        """Which of ``ids`` are at rest in the log (status not ``running``)."""
        if not ids:
            return []
        return [
            r["id"]
            for r in self._query(
                "SELECT id FROM conversations WHERE id = ANY(?) AND status <> ?",
                [list(ids), Status.RUNNING.value],
            )
        ]

    def created_among(self, ids: Sequence[str]) -> list[str]:
        """Which of ``ids`` the log holds."""
        if not ids:
            return []
        return [
            r["id"]
            for r in self._query("SELECT id FROM conversations WHERE id = ANY(?)", [list(ids)])
        ]

    def request_cancels(self, ids: Sequence[str], reason: str) -> None:
        """Ask the runtimes running ``ids`` (elsewhere) to cancel them; the first
        reason asked stands."""

        def write() -> None:
            with self._transaction("BEGIN IMMEDIATE") as conn:
                for conversation_id in ids:
                    conn.execute(
                        "INSERT INTO cancels (conversation_id, reason) VALUES (?, ?)"
                        " ON CONFLICT (conversation_id) DO NOTHING",
                        [conversation_id, reason],
                    )
                # The runtimes running chunks read the rows at once (on commit only).
                conn.execute(f"NOTIFY {NOTIFY_CHANNEL}, 'cancel'")

        self._rewritten(write)

    def listen(self, stop: threading.Event, woken: Callable[[str], None]) -> None:
        """Until ``stop`` is set, call ``woken(payload)`` for each notification on
        ``NOTIFY_CHANNEL`` (``'outcome'``: a placed child ended; ``'cancel'``: cancels
        were asked), on a connection of its own. A lost connection is made again
        (``woken('reconnected')`` then, as notifications may have been missed); none
        is ever needed for correctness: the placement's poll reads the same rows."""
        while not stop.is_set():
            try:
                conn = connect(self._url)
            except LogUnavailable:
                stop.wait(LISTEN_RETRY_S)
                continue
            try:
                conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                woken("reconnected")
                while not stop.is_set():
                    for note in conn.notifies(timeout=LISTEN_STOP_S):
                        woken(note.payload)
            except psycopg.Error:
                stop.wait(LISTEN_RETRY_S)
            finally:
                conn.close()

    def cancels_among(self, ids: Sequence[str]) -> dict[str, str]:
        """The cancels asked of any of ``ids``: id to reason."""
        if not ids:
            return {}
        return {
            r["conversation_id"]: r["reason"]
            for r in self._query(
                "SELECT conversation_id, reason FROM cancels WHERE conversation_id = ANY(?)",
                [list(ids)],
            )
        }

    def damage(self) -> str | None:
        """None: PostgreSQL has no whole-database check like SQLite's
        ``integrity_check`` (its page checksums, where enabled, fail the read itself)."""
        self._connection()
        return None

    def close(self) -> None:
        """Close the connection. Idempotent; any later use raises StoreClosed."""
        with self._lock:
            if self._conn is not None:
                self._pg.close()
                self._conn = None

    def presence(self) -> PgPresence:
        """A runtime's presence on this log (``fanfold.runtime.presence``), held on a
        connection of its own until ``close()``."""
        return PgPresence(self._url)


class PgPresence:
    """What ``fanfold.runtime.presence.Presence`` is for a file, for a PostgreSQL log:
    a session-level advisory lock, held shared by every runtime on the database for as
    long as it is open; ``alone()`` asks for it exclusively without waiting. The
    server drops a session's locks when its connection ends, however the process
    ended (``kill -9`` closes its sockets): so ``resume`` never takes over the work of
    a runtime that is alive, as on one machine. A *frozen* process keeps its
    connection and its lock: the per-tree claims (``PostgresStore._fence``) are the
    answer to that, and to several workers resuming each other's trees. A session the
    server ended (a restart) is replaced, and its lock taken again, when ``alone()``
    next asks."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._scrub = _Scrubbed(url)
        self._conn: psycopg.Connection[Any] | None = None
        self._conn = self._connect()

    def _connect(self) -> psycopg.Connection[Any]:
        conn = connect(self._url)
        try:
            conn.execute("SELECT pg_advisory_lock_shared(%s)", [_RUNTIMES_KEY])
        except psycopg.Error as exc:
            conn.close()
            raise self._scrub.unavailable(exc) from None
        return conn

    def alone(self) -> bool:
        """True if no other runtime has the log open right now. (A session's own
        shared lock does not conflict with its exclusive request.)"""
        if self._conn is None:
            raise RuntimeError("the presence was closed")
        try:
            return self._alone(self._conn)
        except psycopg.OperationalError:
            # The session is gone, and its lock with it: a new one, then ask.
            with suppress(psycopg.Error):
                self._conn.close()
            self._conn = self._connect()
        try:
            return self._alone(self._conn)
        except psycopg.Error as exc:
            raise self._scrub.unavailable(exc) from None

    @staticmethod
    def _alone(conn: psycopg.Connection[Any]) -> bool:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", [_RUNTIMES_KEY]).fetchone()
        if row is None or not row[0]:
            return False
        conn.execute("SELECT pg_advisory_unlock(%s)", [_RUNTIMES_KEY])
        return True

    def close(self) -> None:
        """Release the lock (by ending the session). Idempotent."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _BlobOrdered:
    """The connection inside a write transaction: an insert into ``blobs`` first locks
    the table against other blob writers, so that blobs commit in ``rowid`` order
    (readers read them incrementally by ``rowid``; see the module)."""

    def __init__(self, conn: _PgConnection) -> None:
        self._conn = conn
        self._locked = False

    def _before(self, query: str) -> None:
        if not self._locked and query.startswith("INSERT INTO blobs"):
            self._conn.execute("LOCK TABLE blobs IN SHARE ROW EXCLUSIVE MODE")
            self._locked = True

    def execute(self, query: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        self._before(query)
        return self._conn.execute(query, params)

    def executemany(self, query: str, rows: Sequence[Sequence[Any]]) -> psycopg.Cursor[Any]:
        if not rows:
            return self._conn.raw.cursor()  # nothing to do (psycopg sends nothing either)
        self._before(query)
        return self._conn.executemany(query, rows)

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction
