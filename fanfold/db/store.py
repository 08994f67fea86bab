"""``Store``: the durable event log of conversation trees, in one SQLite file.

Write path: ``append(steps)`` records many steps of many conversations in ONE
transaction (group commit). For each step it writes the event and a fingerprint of
the new state (the events-only log: effects are re-derived by replay), and moves the
conversation row on (phase, status, last_seq, and the full-state snapshot when asked).
The runtime calls it before executing any of the step's effects: that is the
write-ahead rule.

Read path: rows come back as attrs values built by named constructors; a state is
rebuilt by decoding the conversation's snapshot and folding the later events with
``transition`` (``load_state``), checking each row's checksum and each fingerprint on
the way.

Threads: the Store owns one sqlite3 connection opened with ``check_same_thread=False``
and guards every use of it with a lock, so a worker thread (``trio.to_thread``) may
use a Store opened elsewhere. Other Stores, in this process or another, may open the
same file: WAL lets readers run while one writes, writes take the lock up front
(``BEGIN IMMEDIATE``) and wait up to ``BUSY_TIMEOUT_MS`` for each other. A file
store checkpoints its WAL from a background thread of its own (``_Checkpointer``),
so no commit waits for the disk syncs a checkpoint makes.
"""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
import sqlite3
import stat
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from types import TracebackType
from typing import TYPE_CHECKING, Any

import attrs

from fanfold.db import highwater
from fanfold.db.checksum import effect_checksum, event_checksum, snapshot_checksum
from fanfold.db.errors import (
    CannotOpen,
    CodecError,
    ConversationExists,
    EmptyLog,
    InvalidStep,
    ReadOnlyStore,
    ReplayError,
    SchemaError,
    SequenceError,
    StoreClosed,
    SyncFailed,
    UnknownConversation,
    UnloggableStep,
)
from fanfold.db.provenance import Origin, TreeRecord
from fanfold.db.records import (
    ConversationRow,
    RawConversation,
    RawEffect,
    RawEvent,
    RawLog,
    Status,
    Step,
    StoredEvent,
    ToolProgressRow,
    status_of,
)
from fanfold.db.rows import Rows
from fanfold.db.schema import check_current, migrate
from fanfold.regular_files import kind as file_kind

# The codec, the fingerprints and the reducer are imported when the store first encodes
# or decodes (``_load``): opening a log and reading its rows (``fanfold ls``) needs none
# of them, and they are most of what importing the store cost (issue 36).
if TYPE_CHECKING:
    from fanfold.db.codec import (
        column_text,
        decode_effect,
        decode_event,
        decode_state,
        encode_event_compact,
        encode_state_stored,
        stored_effect,
        stored_event,
        stored_state,
    )
    from fanfold.db.fingerprint import events_only, like, step_fingerprint
    from fanfold.statemachine import (
        Conversation,
        ConversationCreated,
        ConversationForked,
        IllegalTransition,
        ScheduleRetry,
        StartTimer,
        TurnFinished,
        start,
        transition,
    )

_loaded = False


def _load() -> None:
    """Bind the codec's, the fingerprints' and the reducer's names in this module (once;
    every method that encodes or decodes calls it first)."""
    global _loaded
    if _loaded:
        return
    from fanfold.db import codec
    from fanfold.db.fingerprint import events_only, like, step_fingerprint
    from fanfold.statemachine import (
        Conversation,
        ConversationCreated,
        ConversationForked,
        IllegalTransition,
        ScheduleRetry,
        StartTimer,
        TurnFinished,
    )

    globals().update(
        column_text=codec.column_text,
        decode_effect=codec.decode_effect,
        decode_event=codec.decode_event,
        decode_state=codec.decode_state,
        encode_event_compact=codec.encode_event_compact,
        encode_state_stored=codec.encode_state_stored,
        stored_effect=codec.stored_effect,
        stored_event=codec.stored_event,
        stored_state=codec.stored_state,
        events_only=events_only,
        like=like,
        step_fingerprint=step_fingerprint,
        Conversation=Conversation,
        ConversationCreated=ConversationCreated,
        ConversationForked=ConversationForked,
        IllegalTransition=IllegalTransition,
        ScheduleRetry=ScheduleRetry,
        StartTimer=StartTimer,
        TurnFinished=TurnFinished,
    )
    _loaded = True


_folds = False


def _load_reducer() -> None:
    """Bind the reducer's ``start`` and ``transition`` in this module (once): for what
    folds events (``events``, ``load_state`` past its snapshot) and for ``append``,
    whose caller ran them. ``load_state`` of a conversation at rest, whose snapshot is
    its last state, folds nothing: ``fanfold show`` imports no reducer function."""
    global _folds
    if _folds:
        return
    from fanfold.statemachine.transition import start, transition

    globals().update(start=start, transition=transition)
    _folds = True


BUSY_TIMEOUT_MS = 5000
"""How long a write waits for another connection's write lock before failing."""

CHECKPOINT_BYTES = 4_000_000
"""Bytes appended (payloads and snapshots) after which a file's WAL is checkpointed, in
a background thread. (SQLite's automatic checkpoint, which runs inside a commit every
1000 pages, is off for a Store's own connection.)"""

_SQLITE_CORRUPT = 11
_SQLITE_CANTOPEN = 14
_SQLITE_NOTADB = 26
_SQLITE_SYNC_ERRORS = (sqlite3.SQLITE_IOERR_FSYNC, sqlite3.SQLITE_IOERR_DIR_FSYNC)


def _sync_failed(exc: sqlite3.Error) -> bool:
    """Whether SQLite raised ``exc`` because an fsync/fdatasync returned an error."""
    return getattr(exc, "sqlite_errorcode", 0) in _SQLITE_SYNC_ERRORS


def _sync_folder(path: str) -> None:
    """Sync the folder of ``path``, so that the log's files (the WAL, made at open) are
    found after a power loss. SQLite syncs it when it creates the WAL but ignores an
    error there; a folder that cannot be synced at all (EINVAL: some file systems)
    is taken as it is."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return  # unreadable folder: SQLite opened the file, nothing more to learn
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):
            raise SyncFailed(path, exc.strerror or str(exc), "(its folder)") from None
    finally:
        os.close(fd)


def read_again(name: str) -> str | None:
    """After SQLite called the log ``name`` malformed: whether that was a read that
    failed rather than damage (issue 32.14).

    A read that fails with EIO partway through a B-tree page is reported by SQLite as
    "database disk image is malformed" in many places, the same words as a flipped
    byte. So the file is read again, whole, through a new read-only connection
    (``PRAGMA integrity_check``, indexes against their tables included: a damaged index
    page can fail a lookup while every B-tree is well formed): if it checks out now, it
    was read wrongly before, and the
    cause is an I/O error (a failing disk, a network filesystem), not damage; returns a
    line saying so. None: it is damaged, or the check could not tell (it failed too).
    Costs a read of the whole file, on an error's path only.
    """
    try:
        uri = pathlib.Path(name).resolve().as_uri()
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, isolation_level=None)
    except (sqlite3.Error, OSError, ValueError):
        return None
    try:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    if rows != [("ok",)]:
        return None
    return (
        f"an I/O error reading {name}: SQLite found it malformed, but read again it "
        "checks out (PRAGMA integrity_check), so a read of the file failed (a failing disk "
        "or a network filesystem?) and the log is not damaged; try again"
    )


_IN_CHUNK = 500  # ids per "WHERE id IN (...)": well under SQLite's variable limit
_SEEN_LIMIT = 200_000  # conversations whose (last_seq, status) a store remembers


class _StaleCache(Exception):
    """A conversation's row is not where this store remembered it (another connection
    wrote it): the batch was rolled back, to be checked against the rows."""


_ROW_COLUMNS = ", ".join(ConversationRow.COLUMNS)
_IDS_PER_QUERY = 500  # ids in one ``IN (...)``: well under SQLite's variable limit


class _Checkpointer:
    """Copies a file database's WAL back into the database, in a daemon thread on a
    connection of its own, once ``CHECKPOINT_BYTES`` have been appended.

    A checkpoint syncs the WAL, copies its pages into the database file and syncs
    that. SQLite's automatic checkpoint runs inside the commit that crosses its
    threshold and stalls that commit (and every step waiting for it) for as long as
    the copy and its syncs take; here commits go on meanwhile. The checkpoint is
    PASSIVE: it never waits for, nor blocks, readers or writers, and copies what it
    can. Durability does not depend on it: each commit syncs the WAL itself
    (``synchronous = FULL``, see ``Store._initialise``).
    """

    def __init__(self, path: str) -> None:
        # Absolute: the process may change directory before the first checkpoint.
        self._path = os.path.abspath(path)
        self._written = 0
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._lock = threading.Lock()
        self.failure: sqlite3.Error | None = None
        """A sync of the checkpoint that failed (the store raises SyncFailed for it)."""

    def wrote(self, nbytes: int) -> None:
        """Count bytes just committed; past the threshold, start a checkpoint."""
        with self._lock:
            self._written += nbytes
            if self._written < CHECKPOINT_BYTES or self._closed:
                return
            if self._thread is not None and self._thread.is_alive():
                return  # one at a time; a later commit tries again
            self._written = 0
            self._thread = threading.Thread(
                target=self._checkpoint, name="fanfold-wal-checkpoint", daemon=True
            )
            self._thread.start()

    def _checkpoint(self) -> None:
        try:
            if self._conn is None:
                # mode=rw: never create a file (if the database was removed meanwhile,
                # the checkpoint fails and is skipped).
                self._conn = sqlite3.connect(
                    f"{pathlib.Path(self._path).as_uri()}?mode=rw",
                    uri=True,
                    check_same_thread=False,
                    isolation_level=None,
                )
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            # The WAL grows until the next attempt; nothing is lost (the WAL was synced
            # at each commit, and a checkpoint that failed does not shorten it). A
            # failed sync, though, says the disk is failing: the store stops writing.
            if _sync_failed(exc):
                self.failure = exc

    def close(self) -> None:
        """Wait for a running checkpoint and close its connection (the store's own
        connection, closed last, then checkpoints what is left as SQLite does)."""
        with self._lock:
            self._closed = True
        if self._thread is not None:
            self._thread.join()
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _Prepared:
    """One step, validated and encoded outside the lock, ready to insert."""

    __slots__ = ("event_row", "size", "step")

    def __init__(self, step: Step, blobs: dict[str, str]) -> None:
        self.step = step
        _check_shape(step)
        cid, seq = step.conversation_id, step.seq
        try:
            # The events-only log (migration 5): the event alone is stored; its effects
            # are the reducer's output, which replay re-derives; the fingerprint
            # covers their content.
            kind, payload = type(step.event).__name__, encode_event_compact(step.event, blobs)
            # Version 7: the effects' whole content and the state fields the step
            # changed (every field when the step does not carry the state before it).
            mark = step_fingerprint(
                step.state,
                payload,
                step.effects,
                step.before,
                whole=seq > 0 and step.before is None,
            )
            self.event_row = (
                cid,
                seq,
                kind,
                payload,
                mark,
                step.at,
                event_checksum(cid, seq, kind, payload, mark, step.at),
            )
        except CodecError as exc:
            raise UnloggableStep(
                f"conversation {cid!r}, seq {seq} ({type(step.event).__name__}) cannot be "
                f"logged: {exc}. This is a bug in fanfold (the reducer made a value the log "
                "cannot hold); nothing of its batch was written, so the log holds every step "
                "up to the last one committed and `fanfold resume` goes on from there"
            ) from exc
        self.size = len(payload)


_STATUS_TEXT: dict[type[Any], str] = {}


def _status_text(phase: Any) -> str:
    """``status_of(phase).value``, remembered per phase class (enum values are slow)."""
    kind = type(phase)
    text = _STATUS_TEXT.get(kind)
    if text is None:
        text = _STATUS_TEXT[kind] = status_of(phase).value
    return text


def _check_shape(step: Step) -> None:
    """What can be checked about one step without reading the database."""
    cid = step.conversation_id
    if type(step.seq) is not int or step.seq < 0:
        raise InvalidStep(f"conversation {cid!r}: seq must be an int >= 0, got {step.seq!r}")
    if step.state.id != cid:
        raise InvalidStep(
            f"conversation {cid!r}, seq {step.seq}: the state is of conversation {step.state.id!r}"
        )
    created = isinstance(step.event, ConversationCreated | ConversationForked)
    kind = type(step.event).__name__
    if step.seq == 0 and not created:
        raise InvalidStep(
            f"conversation {cid!r}: seq 0 must be ConversationCreated or ConversationForked, "
            f"got {kind}"
        )
    if step.seq > 0 and created:
        raise InvalidStep(f"conversation {cid!r}: {kind} at seq {step.seq}, not 0")
    if (
        isinstance(step.event, ConversationCreated | ConversationForked)
        and step.event.conversation_id != cid
    ):
        raise InvalidStep(f"conversation {cid!r}: {kind} is for {step.event.conversation_id!r}")
    if step.seq == 0 and step.user_initiated and step.state.parent_id is not None:
        raise InvalidStep(f"conversation {cid!r}: a sub-agent cannot be user-initiated")


def _refuse_special(name: str) -> None:
    """CannotOpen if ``name`` exists and is no regular file: SQLite opened a FIFO as
    ``--db`` and failed later with "disk I/O error ... everything up to the last
    committed step is kept", which named neither the file nor the problem."""
    try:
        mode = os.stat(name).st_mode
    except OSError:
        return  # missing (created, or refused below) or unreadable: SQLite says
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):  # SQLite names a directory
        raise CannotOpen(f"{name} is {file_kind(mode)}, not a database file")


class Store:
    """The event log and conversation index of fanfold, in one SQLite database.

    (``fanfold.db.postgres.PostgresStore`` is the same log in PostgreSQL: a subclass
    that replaces the connection and what is SQLite's own, and keeps every query.)

    Open with ``Store.open(path)`` (a file, WAL mode) or ``Store.memory()`` (tests,
    benchmarks); close with ``close()`` or use it as a context manager. Every method
    is synchronous and thread-safe.
    """

    _integrity_errors: tuple[type[Exception], ...] = (sqlite3.IntegrityError,)
    """What the connection raises when a row breaks a key (a subclass's driver's)."""

    _mark: highwater.Writer | None = None
    """A file's high-water mark (``open``): None for memory and PostgreSQL."""

    _turns = True
    """Whether the conversations table has the last turn's outcome (migration 7), which
    ``_write`` keeps and ``last_outcome`` reads. False: a read-only open of an older
    log, and PostgreSQL (whose schema does not have it): found by replay there."""

    @staticmethod
    def _column_text(text: str | None) -> str | None:
        """A text copied into a column for listing (a task), as the database can hold it."""
        _load()
        return column_text(text)

    def __init__(
        self, conn: sqlite3.Connection, path: str | None, *, read_only: bool = False
    ) -> None:
        """Wrap an open connection. Use ``open`` or ``memory`` instead."""
        self._conn: sqlite3.Connection | None = conn
        # sqlite_utils is imported only to migrate (fanfold.db.rows).
        self._db = Rows(conn)
        self._lock = threading.Lock()
        self._checkpointer: _Checkpointer | None = None
        self.path = path
        """The database file, or None for an in-memory store."""
        self.read_only = read_only
        """True if opened with ``read_only=True``: every write raises ReadOnlyStore."""
        self._private_copy: str | None = None  # a folder removed on close (read-only media)
        # A sync of this store's that failed and was reported (SyncFailed raised): no
        # more writes on this connection's word, and close does not report it again.
        self._failed: SyncFailed | None = None
        # Whether the log has the row checksums (migration 3): a read-only open of an
        # older log reads its rows unchecked.
        self._checksums = True
        # The log's blobs (migration 4) read or written so far, and the last rowid read;
        # None: the log has no blobs table (a read-only open of an older log).
        self._blobs: dict[str, str] = {}
        self._blob_rowid: int | None = 0
        # ``id -> (last_seq, status)`` of the conversations this store last wrote, so
        # that a batch needs no SELECT to check its seqs (``_write``).
        self._seen: dict[str, tuple[int, str]] = {}
        self.units: dict[str, str] = {}
        """The unit (a chunk's id) of each conversation a runtime runs for a chunk of
        placed children; every other conversation's unit is its tree (PostgreSQL's
        claims are per unit; a file has none)."""

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, read_only: bool = False) -> Store:
        """Open (creating if needed) the database file at ``path`` and migrate it.

        With ``read_only``, open an existing log for reading without writing to it
        (no migration, no switch to WAL, SQLite's ``query_only``): for inspecting a
        log on read-only media or one that belongs to someone else. Its schema must
        be current; writes raise ReadOnlyStore.
        """
        name = os.fspath(path)
        if name.startswith(("postgresql://", "postgres://")):
            # A file by that name would be made (under ./postgresql:/), and every message
            # naming it would show the URL's password.
            raise CannotOpen(
                "Store.open takes a file path; open a PostgreSQL log with "
                "fanfold.db.open_store(url)"
            )
        _refuse_special(name)
        if read_only:
            return cls._open_read_only(name)
        try:
            conn = sqlite3.connect(
                name,
                check_same_thread=False,
                isolation_level=None,  # no implicit transactions: we BEGIN explicitly
                timeout=BUSY_TIMEOUT_MS / 1000,
            )
            try:
                # Before anything is written (migrating a log whose WAL is gone would
                # make it a new, empty one): a log that lost committed steps is refused.
                highwater.check(conn, name)
            except BaseException:
                conn.close()
                raise
            store = cls._setup(conn, name, wal=True)
            store._mark = highwater.Writer(name, highwater.instance_of(conn))
            return store
        except sqlite3.DatabaseError as exc:
            code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
            if code == _SQLITE_NOTADB:
                raise CannotOpen(f"{name} is not an SQLite database") from None
            if code == _SQLITE_CANTOPEN:
                raise CannotOpen(f"cannot open {name} as a database: {exc}") from None
            raise

    @classmethod
    def _open_read_only(cls, name: str) -> Store:
        if not os.path.isfile(name):
            raise CannotOpen(f"no database file at {name}")
        # A log without a -wal file (closed cleanly): read through a read-write
        # connection in query_only mode, which removes the -wal and -shm files it
        # makes when it closes (a mode=ro reader leaves them behind). A log with a
        # -wal (being written, or copied mid-run): mode=ro, since the last read-write
        # connection to close checkpoints the WAL into the file, and reading must not
        # rewrite the log. Writes are refused by this class before any SQL, and by
        # SQLite too.
        wal = name + "-wal"
        queries = ("mode=ro",) if os.path.exists(wal) else ("mode=rw", "mode=ro")
        for query in queries:
            try:
                return cls._connect_read_only(name, name, query)
            except CannotOpen as exc:
                if not exc.cannot_open_file:
                    raise
        # Read-only media: SQLite cannot create the WAL index (-shm) it needs to read a
        # WAL log. Nobody can be writing there. With no WAL content, the file alone is
        # the log: read it as immutable. Steps still in the -wal file would be ignored
        # by an immutable read, so the log and its WAL are read from a private copy.
        if not os.path.exists(wal) or os.path.getsize(wal) == 0:
            return cls._connect_read_only(name, name, "mode=ro&immutable=1")
        copy = tempfile.mkdtemp(prefix="fanfold-ro-")
        try:
            target = os.path.join(copy, os.path.basename(name))
            shutil.copyfile(name, target)
            shutil.copyfile(wal, target + "-wal")
            store = cls._connect_read_only(name, target, "mode=ro")
        except BaseException:
            shutil.rmtree(copy, ignore_errors=True)
            raise
        store._private_copy = copy
        return store

    @classmethod
    def _connect_read_only(cls, name: str, actual: str, query: str) -> Store:
        """Open ``actual`` (the file ``name`` or a copy of it) with URI ``query``."""
        uri = pathlib.Path(actual).resolve().as_uri()
        conn = sqlite3.connect(
            f"{uri}?{query}",
            uri=True,
            check_same_thread=False,
            isolation_level=None,
            timeout=BUSY_TIMEOUT_MS / 1000,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA query_only = ON")
            store = cls(conn, name, read_only=True)
            store._refuse_foreign()
            if not store._db.table("migrations").exists():
                if not store._db.table_names():
                    highwater.check(conn, name)  # an empty log that was not empty
                    raise EmptyLog(
                        f"{name} is an empty log: nothing was recorded in it (a run stopped "
                        "before its first write leaves one; the next `fanfold run --db` "
                        "sets it up)"
                    )
                raise CannotOpen(f"{name} is not a fanfold log (it has no tables)")
            check_current(store._db)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(events)")}
            store._checksums = "checksum" in columns
            turns = {row[1] for row in conn.execute("PRAGMA table_info(conversations)")}
            store._turns = "last_turn" in turns
            if not store._db.table("blobs").exists():
                store._blob_rowid = None
            return store
        except sqlite3.DatabaseError as exc:
            conn.close()
            code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
            if code == _SQLITE_NOTADB:
                raise CannotOpen(f"{name} is not an SQLite database") from None
            misread = read_again(name) if code == _SQLITE_CORRUPT else None
            error = CannotOpen(misread or f"cannot open {name} as a database: {exc}")
            error.cannot_open_file = code == _SQLITE_CANTOPEN
            raise error from None
        except BaseException:
            conn.close()
            raise

    @classmethod
    def memory(cls) -> Store:
        """A fresh in-memory database (gone when closed)."""
        conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        return cls._setup(conn, None, wal=False)

    @classmethod
    def _setup(cls, conn: sqlite3.Connection, path: str | None, *, wal: bool) -> Store:
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA foreign_keys = ON")
            store = cls(conn, path)
            store._initialise(wal=wal)
        except BaseException:
            conn.close()
            raise
        return store

    def _initialise(self, *, wal: bool) -> None:
        """Switch to WAL and migrate, retrying while other connections do the same.

        While a new file is still in rollback-journal mode, SQLite answers some lock
        conflicts between connections opening it at once with an immediate "database
        is locked" instead of waiting (it would be a deadlock), so the busy timeout
        does not cover them: retry until it has passed.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        delay = 0.002
        while True:
            try:
                self._refuse_foreign()
                if wal:
                    self._db.enable_wal()
                # FULL: every COMMIT syncs the WAL (one fdatasync) before it returns,
                # so a step is on stable storage before the writer starts its effects.
                # A batch of steps is one transaction: one sync per batch, however
                # many steps. (NORMAL synced only at checkpoints: a power loss could
                # take back committed steps whose commands had already run.)
                self._connection().execute("PRAGMA synchronous = FULL")
                migrate(self._db)
                if wal and self.path is not None:
                    self._connection().execute("PRAGMA wal_autocheckpoint = 0")
                    self._checkpointer = _Checkpointer(self.path)
                    _sync_folder(self.path)
                return
            except sqlite3.OperationalError as exc:
                if _sync_failed(exc):
                    raise SyncFailed(self.path, str(exc), "(setting it up)") from None
                busy = (exc.sqlite_errorcode & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
                if not busy or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _refuse_foreign(self) -> None:
        """Raise CannotOpen if the file holds another program's tables.

        Checked before anything is written (switching to WAL is a write): a mistyped
        ``--db`` must not add fanfold's tables to someone else's database.
        """
        names = {
            row[0]
            for row in self._connection().execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            )
        }
        if names and "migrations" not in names:
            shown = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
            raise CannotOpen(
                f"{self.path} is an SQLite database but not a fanfold log "
                f"(it has tables {shown}); fanfold does not write to it"
            )

    def close(self) -> None:
        """Close the connection. Idempotent; any later use raises StoreClosed.

        A file log is checkpointed first (its WAL copied into the database file, both
        synced): ``SyncFailed`` if a sync failed, then or in an earlier background
        checkpoint, after everything is closed. (SQLite's own checkpoint on close
        ignores errors: a run ended with exit 0 and no word.) Its WAL then stays
        beside the file, synced at each commit: nothing committed is lost.
        """
        failure: sqlite3.Error | None = None
        with self._lock:
            if self._mark is not None:
                self._mark.close()
                self._mark = None
            if self._checkpointer is not None:
                self._checkpointer.close()
                failure = self._checkpointer.failure
                self._checkpointer = None
                if self._failed is not None:
                    failure = None  # reported already; nothing more on its word
                elif self._conn is not None and failure is None:
                    try:
                        # PASSIVE: waits for no reader; SQLite's checkpoint on close
                        # then finds nothing left to copy.
                        self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    except sqlite3.Error as exc:
                        if _sync_failed(exc):
                            failure = exc
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._private_copy is not None:
                shutil.rmtree(self._private_copy, ignore_errors=True)
                self._private_copy = None
        if failure is not None:
            raise SyncFailed(self.path, str(failure), "while closing it (its WAL is kept)")

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreClosed("the store is closed")
        return self._conn

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        """Hold the lock and one transaction; roll back on any exception."""
        if self.read_only and begin != "BEGIN":
            raise ReadOnlyStore(f"{self.path} was opened read-only; nothing was written")
        with self._lock:
            conn = self._connection()
            conn.execute(begin)
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if not _sync_failed(exc):
                    raise
                # The WAL frames were written but not synced: the transaction did not
                # happen for this store (its effects never start). SQLite may keep it
                # in the WAL, where a later open finds it: a step in flight, which
                # resume re-issues as after a crash.
                with suppress(sqlite3.Error):
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                self._failed = SyncFailed(
                    self.path, str(exc), "(a commit: none of its steps were taken)"
                )
                raise self._failed from None

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Run one SELECT under the lock and return every row."""
        with self._lock:
            self._connection()
            return list(self._db.query(sql, params))

    # ------------------------------------------------------------------ writing

    def append(self, steps: Sequence[Step]) -> list[tuple[int, int]]:
        """Record ``steps`` (of any conversations) atomically, in one transaction.

        Steps of one conversation must appear in order, each with the next seq
        (``last_seq + 1``; 0 creates the conversation, whose parent must already be
        stored or be created earlier in the batch). If any step is refused
        (``InvalidStep``, ``SequenceError``, ``CodecError``), nothing of the batch is
        written.

        Returns, per step, the length of its event's stored text and of the snapshot
        stored with it (0 if none): what a snapshot policy needs to weigh folding
        events against reading a snapshot.
        """
        _load()
        if self.read_only:
            raise ReadOnlyStore(f"{self.path} was opened read-only; nothing was written")
        if not steps:
            return []
        checkpointer = self._checkpointer
        if self._failed is None and checkpointer is not None and checkpointer.failure is not None:
            self._failed = SyncFailed(
                self.path, str(checkpointer.failure), "(a checkpoint: nothing more is written)"
            )
        if self._failed is not None:
            raise SyncFailed(self._failed.path, *self._failed.parts)
        blobs: dict[str, str] = {}
        prepared = [_Prepared(step, blobs) for step in steps]
        snapshots: dict[str, Step] = {}
        last: dict[str, Step] = {}
        for step in steps:
            last[step.conversation_id] = step
            if step.snapshot and step.seq > 0:  # at seq 0 the state is start(created)
                snapshots[step.conversation_id] = step
        snapshot_rows = []
        for cid, step in snapshots.items():
            text = encode_state_stored(step.state, blobs)
            snapshot_rows.append((text, step.seq, snapshot_checksum(cid, step.seq, text), cid))
        known = self._blobs
        new_blobs = [(key, text) for key, text in blobs.items() if key not in known]
        snapshot_sizes = {(cid, seq): len(text) for text, seq, _, cid in snapshot_rows}
        try:
            statuses = self._write(prepared, last, new_blobs, snapshot_rows, trusted=True)
        except (_StaleCache, SequenceError, InvalidStep):
            # Another connection may have written one of these conversations since this
            # store last did: forget what it remembered and check everything against
            # the rows (a refusal that was right is made again, from the rows).
            self._seen.clear()
            statuses = self._write(prepared, last, new_blobs, snapshot_rows, trusted=False)
        known.update(new_blobs)  # committed: the log holds them
        seen = self._seen
        if len(seen) > _SEEN_LIMIT:
            seen.clear()
        for cid, step in last.items():
            seen[cid] = (step.seq, statuses[cid])
        if self._mark is not None:  # a file's high-water mark: this batch is committed
            last_step = prepared[-1].step
            self._mark.committed(last_step.conversation_id, last_step.seq)
        if checkpointer is not None:
            checkpointer.wrote(sum(p.size for p in prepared) + sum(snapshot_sizes.values()))
        return [
            (len(p.event_row[3]), snapshot_sizes.get((p.step.conversation_id, p.step.seq), 0))
            for p in prepared
        ]

    def _write(
        self,
        prepared: list[_Prepared],
        last: dict[str, Step],
        new_blobs: list[tuple[str, str]],
        snapshot_rows: list[tuple[str, int, int, str]],
        *,
        trusted: bool,
    ) -> dict[str, str]:
        """The batch's one transaction; returns each conversation's status after it.

        Statements: ``BEGIN IMMEDIATE``, the events, one ``UPDATE`` of the moved
        conversations (two if a status changed), ``COMMIT``, and only when needed the
        created conversations, trees, blobs and snapshots. With ``trusted``, the
        sequence check uses what this store remembers of the conversations it wrote
        (``_seen``) instead of reading their rows; every ``UPDATE`` then names the
        ``last_seq`` it expects, and a row that is not where it was remembered (another
        connection wrote it) raises ``_StaleCache``, rolling the batch back.
        """
        with self._transaction("BEGIN IMMEDIATE") as conn:
            fence = self._fence(conn, prepared)
            created_rows, status_before, first_seq = self._check_sequence(
                conn, prepared, self._seen if trusted else {}
            )
            # The status column is indexed: set it only when it changes (rarely).
            moved: list[tuple[Any, ...]] = []
            moved_with_status: list[tuple[Any, ...]] = []
            statuses: dict[str, str] = {}
            for cid, step in last.items():
                status = statuses[cid] = _status_text(step.state.phase)
                if step.seq == 0:
                    continue  # inserted just now, as it is
                phase = type(step.state.phase).__name__
                before = max(first_seq[cid] - 1, 0)  # a conversation created here: 0
                if status == status_before[cid]:
                    moved.append((step.seq, phase, step.at, cid, before))
                else:
                    moved_with_status.append((step.seq, phase, status, step.at, cid, before))
            try:
                if created_rows:
                    conn.executemany(
                        "INSERT INTO conversations (id, parent_id, root_id, depth, task,"
                        " user_initiated, created_at, updated_at, phase, status, forked_from,"
                        " forked_at_seq, last_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
                        created_rows,
                    )
                trees = [p.step.tree for p in prepared if p.step.seq == 0 and p.step.tree]
                if trees:
                    self._insert_trees(conn, trees, prepared)
                if new_blobs:
                    conn.executemany(
                        "INSERT INTO blobs (sha256, body) VALUES (?, ?) ON CONFLICT DO NOTHING",
                        new_blobs,
                    )
                conn.executemany(
                    "INSERT INTO events (conversation_id, seq, type, payload, fingerprint, at,"
                    " checksum) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [p.event_row for p in prepared],
                )
            except self._integrity_errors:
                if trusted:
                    raise _StaleCache from None  # a row this store did not know of
                raise
            changed = 0
            if moved:
                changed += conn.executemany(
                    "UPDATE conversations SET last_seq = ?, phase = ?, updated_at = ?"
                    " WHERE id = ? AND last_seq = ?",
                    moved,
                ).rowcount
            if moved_with_status:
                changed += conn.executemany(
                    "UPDATE conversations SET last_seq = ?, phase = ?, status = ?,"
                    " updated_at = ? WHERE id = ? AND last_seq = ?",
                    moved_with_status,
                ).rowcount
            if changed != len(moved) + len(moved_with_status):
                # Only a stale memory gets here: the rows read under this lock match.
                raise _StaleCache
            if snapshot_rows:
                conn.executemany(
                    "UPDATE conversations SET snapshot_json = ?, snapshot_seq = ?,"
                    " snapshot_checksum = ? WHERE id = ?",
                    snapshot_rows,
                )
            if self._turns:
                # The latest finished turn's outcome of each conversation (a step
                # ends at most one turn; a later one in the batch wins).
                ended = {
                    p.step.conversation_id: effect.outcome.value
                    for p in prepared
                    for effect in p.step.effects
                    if type(effect) is TurnFinished
                }
                if ended:
                    conn.executemany(
                        "UPDATE conversations SET last_turn = ? WHERE id = ?",
                        [(outcome, cid) for cid, outcome in ended.items()],
                    )
        self._fenced(fence)  # committed
        return statuses

    def check_committed(self) -> None:
        """Raise ``LostSteps`` if this log file holds fewer steps than its high-water
        mark says were committed (a WAL deleted, cut or damaged). A store opened to
        write was checked when it opened; ``replay.verify`` checks every file."""
        with self._lock:
            conn = self._connection()
            # A file's log only (a PostgreSQL log has no WAL file to lose).
            if self.path is not None and isinstance(conn, sqlite3.Connection):
                highwater.check(conn, self.path)

    def _fence(self, conn: Any, prepared: list[_Prepared]) -> Any:
        """Check (or take) this store's claim on the trees of a batch, inside its
        transaction; returns what ``_fenced`` records once it commits. A file needs
        none (one runtime writes it at a time: ``fanfold.runtime.presence``);
        ``PostgresStore`` keeps a per-tree epoch."""
        del conn, prepared

    def _fenced(self, fence: Any) -> None:
        """Record the claims ``_fence`` took, now that their transaction committed."""
        del fence

    def claim(self, root_id: str) -> int:
        """Take tree ``root_id`` for this store's runtime before loading it (resume,
        attach) and return its epoch. A file needs no claim (one runtime writes it at a
        time): 0. ``PostgresStore`` raises the tree's epoch, so that whoever ran it
        before writes nothing more of it."""
        del root_id
        return 0

    def _check_sequence(
        self,
        conn: sqlite3.Connection,
        prepared: list[_Prepared],
        seen: dict[str, tuple[int, str]],
    ) -> tuple[list[tuple[Any, ...]], dict[str, str], dict[str, int]]:
        """Check seq contiguity and parents against the stored rows, or against
        ``seen`` (``id -> (last_seq, status)`` remembered) for the ids it holds.

        Returns the rows of the conversations the batch creates, the status of every
        conversation of the batch before it (as stored, or as created), and the seq
        of each conversation's first step in the batch.
        """
        wanted: set[str] = set()
        for p in prepared:
            wanted.add(p.step.conversation_id)
            if p.step.seq == 0:
                wanted.update(x for x in (p.step.state.parent_id, p.step.state.root_id) if x)
                if isinstance(p.step.event, ConversationForked):
                    wanted.add(p.step.event.source_id)
        # A conversation this store wrote last is where it left it (the UPDATEs check):
        # no SELECT for it. A step's seq 0 is always looked up (it must not exist).
        stored = {cid: seen[cid] for cid in wanted if cid in seen}
        unknown = wanted - stored.keys()
        if unknown:
            stored.update(self._stored(conn, unknown))
        next_seq = {cid: last + 1 for cid, (last, _) in stored.items()}
        status_before = {cid: status for cid, (_, status) in stored.items()}
        first_seq: dict[str, int] = {}
        created_rows: list[tuple[Any, ...]] = []
        for p in prepared:
            step = p.step
            cid = step.conversation_id
            first_seq.setdefault(cid, step.seq)
            expected = next_seq.get(cid, 0)
            if step.seq != expected:
                detail = (
                    "the conversation is not stored; its first step is seq 0"
                    if expected == 0
                    else f"its last stored or batched step is seq {expected - 1}"
                )
                raise SequenceError(cid, expected, step.seq, detail)
            next_seq[cid] = expected + 1
            if step.seq == 0:
                state = step.state
                forked = step.event if isinstance(step.event, ConversationForked) else None
                source = forked.source_id if forked is not None else None
                for role, other in (
                    ("parent", state.parent_id),
                    ("root", state.root_id),
                    ("fork source", source),
                ):
                    if other is not None and other != cid and other not in next_seq:
                        raise InvalidStep(
                            f"conversation {cid!r}: its {role} {other!r} is not stored "
                            "(nor created earlier in this batch)"
                        )
                user_initiated = (
                    step.user_initiated
                    if step.user_initiated is not None
                    else state.parent_id is None
                )
                status_before[cid] = _status_text(state.phase)
                created_rows.append(
                    (
                        cid,
                        state.parent_id,
                        state.root_id,
                        state.depth,
                        self._column_text(state.task),  # the exact task: in the event
                        int(user_initiated),
                        step.at,
                        step.at,
                        type(state.phase).__name__,
                        status_before[cid],
                        source,
                        forked.source_seq if forked is not None else None,
                    )
                )
        return created_rows, status_before, first_seq

    @staticmethod
    def _insert_trees(
        conn: sqlite3.Connection, trees: list[TreeRecord], prepared: list[_Prepared]
    ) -> None:
        roots = {p.step.conversation_id for p in prepared if p.step.state.parent_id is None}
        for tree in trees:
            if tree.root_id not in roots:
                raise InvalidStep(
                    f"a tree record for {tree.root_id!r} goes with the creation of that root"
                )
        conn.executemany(
            f"INSERT INTO trees ({', '.join(TreeRecord.COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [tuple(getattr(t, name) for name in TreeRecord.COLUMNS) for t in trees],
        )

    @staticmethod
    def _stored(conn: sqlite3.Connection, ids: set[str]) -> dict[str, tuple[int, str]]:
        """``id -> (last_seq, status)`` of the stored conversations among ``ids``."""
        found: dict[str, tuple[int, str]] = {}
        ordered = sorted(ids)
        for i in range(0, len(ordered), _IN_CHUNK):
            chunk = ordered[i : i + _IN_CHUNK]
            marks = ", ".join("?" * len(chunk))
            rows = conn.execute(
                f"SELECT id, last_seq, status FROM conversations WHERE id IN ({marks})", chunk
            )
            for cid, last, status in rows:
                found[cid] = (last, status)
        return found

    def import_raw(
        self,
        conversations: Sequence[RawConversation],
        events: Sequence[RawEvent],
        *,
        tree: TreeRecord | None = None,
        blobs: Mapping[str, str] | None = None,
    ) -> None:
        """Insert whole conversations exactly as given (rows, events, effects), atomically.

        For importing a log written elsewhere: nothing is decoded or re-derived, so a
        log recorded by another version of the reducer keeps its recorded fingerprints
        and effects. The caller checks that the rows and events are consistent. Rows
        are inserted parents first; a ``forked_from`` naming a conversation that is
        neither stored nor imported here is left out (it is a key of the table), its
        ``forked_at_seq`` kept: the fork's ConversationForked event still names its
        source, and ``replay.lineage`` reads it there for such a row. Raises
        ConversationExists if an id is already stored, InvalidStep if the rows break
        a key (an unknown parent, an event of no imported conversation); nothing is
        written then. ``tree`` is the provenance record of the imported root, written
        in the same transaction (it never carries a mark: see ``provenance``).
        ``blobs``: the values (sha256 -> text) that events given in their stored
        compact form refer to; the caller checked they decode (``portable``).
        """
        _load()
        if tree is not None and tree.mark is not None:
            raise InvalidStep("an imported tree never carries a provenance mark")
        ids = {c.row.id for c in conversations}
        for event in events:
            if event.conversation_id not in ids:
                raise InvalidStep(
                    f"event {event.seq} is of conversation {event.conversation_id!r}, "
                    "which is not among the imported conversations"
                )
        ordered = sorted(conversations, key=lambda c: c.row.depth)
        # Stored as ``append`` stores them: large repeated values once, by reference.
        stored_blobs: dict[str, str] = dict(blobs or {})
        events = [
            attrs.evolve(
                e,
                payload=stored_event(e.payload, stored_blobs),
                effects=tuple(
                    attrs.evolve(f, payload=stored_effect(f.payload, stored_blobs))
                    for f in e.effects
                ),
            )
            for e in events
        ]
        ordered = [
            attrs.evolve(c, snapshot_json=stored_state(c.snapshot_json, stored_blobs))
            if c.snapshot_json is not None
            else c
            for c in ordered
        ]
        with self._transaction("BEGIN IMMEDIATE") as conn:
            if stored_blobs:
                conn.executemany(
                    "INSERT INTO blobs (sha256, body) VALUES (?, ?) ON CONFLICT DO NOTHING",
                    list(stored_blobs.items()),
                )
            stored = self._stored(conn, ids)
            if stored:
                raise ConversationExists(min(stored))
            sources = {c.row.forked_from for c in conversations if c.row.forked_from}
            known = ids | set(self._stored(conn, sources - ids))
            rows = []
            for conversation in ordered:
                row = conversation.row
                linked = row.forked_from is not None and row.forked_from in known
                rows.append(
                    (
                        row.id,
                        row.parent_id,
                        row.root_id,
                        row.depth,
                        self._column_text(row.task),
                        int(row.user_initiated),
                        row.created_at,
                        row.updated_at,
                        row.phase,
                        row.status.value,
                        row.last_seq,
                        conversation.snapshot_json,
                        row.snapshot_seq if conversation.snapshot_json is not None else None,
                        row.forked_from if linked else None,
                        # Kept unlinked too: it marks a fork whose source's id is read
                        # from its seq 0 (``replay.lineage``), so an export of it names
                        # its source as the file it came from did (issue 34).
                        row.forked_at_seq if row.forked_from is not None else None,
                        snapshot_checksum(row.id, row.snapshot_seq, conversation.snapshot_json)
                        if conversation.snapshot_json is not None and row.snapshot_seq is not None
                        else None,
                    )
                )
            try:
                conn.executemany(
                    "INSERT INTO conversations (id, parent_id, root_id, depth, task,"
                    " user_initiated, created_at, updated_at, phase, status, last_seq,"
                    " snapshot_json, snapshot_seq, forked_from, forked_at_seq, snapshot_checksum)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
                # The checksums are computed here from the values given: an imported
                # log's rows are checked from now on like those written by ``append``.
                conn.executemany(
                    "INSERT INTO events (conversation_id, seq, type, payload, fingerprint, at,"
                    " checksum) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            e.conversation_id,
                            e.seq,
                            e.type,
                            e.payload,
                            e.fingerprint,
                            e.at,
                            event_checksum(
                                e.conversation_id, e.seq, e.type, e.payload, e.fingerprint, e.at
                            ),
                        )
                        for e in events
                    ],
                )
                conn.executemany(
                    "INSERT INTO effects (conversation_id, seq, idx, type, payload, checksum)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    [
                        (
                            e.conversation_id,
                            e.seq,
                            f.idx,
                            f.type,
                            f.payload,
                            effect_checksum(e.conversation_id, e.seq, f.idx, f.type, f.payload),
                        )
                        for e in events
                        for f in e.effects
                    ],
                )
                if tree is not None:
                    conn.execute(
                        f"INSERT INTO trees ({', '.join(TreeRecord.COLUMNS)})"
                        " VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [getattr(tree, name) for name in TreeRecord.COLUMNS],
                    )
            except self._integrity_errors as exc:
                raise InvalidStep(f"the imported rows are inconsistent: {exc}") from None

    def save_snapshot(self, conversation_id: str, seq: int, state: Conversation) -> None:
        """Store ``state`` as the snapshot of the conversation after event ``seq``.

        For a state rebuilt outside ``append`` (e.g. after recovery folded a long
        log). Refused with InvalidStep if the state's fingerprint differs from the one
        recorded with event ``seq``; ignored if a later snapshot is already stored.
        """
        _load()
        if state.id != conversation_id:
            raise InvalidStep(
                f"conversation {conversation_id!r}: the state is of conversation {state.id!r}"
            )
        blobs: dict[str, str] = {}
        text = encode_state_stored(state, blobs)
        with self._transaction("BEGIN IMMEDIATE") as conn:
            row = conn.execute(
                "SELECT e.fingerprint, c.snapshot_seq, e.payload FROM events e"
                " JOIN conversations c ON c.id = e.conversation_id"
                " WHERE e.conversation_id = ? AND e.seq = ?",
                [conversation_id, seq],
            ).fetchone()
            if row is None:
                self._require(conn, conversation_id)
                raise InvalidStep(f"conversation {conversation_id!r} has no event {seq}")
            recorded, current, payload = row
            mark = like(state, recorded, payload)  # in the recorded format (any version)
            if recorded != mark:
                raise InvalidStep(
                    f"conversation {conversation_id!r}: the state does not match event {seq} "
                    f"(fingerprint {mark!r}, recorded {recorded!r})"
                )
            if current is not None and current > seq:
                return
            conn.executemany(
                "INSERT INTO blobs (sha256, body) VALUES (?, ?) ON CONFLICT DO NOTHING",
                [(key, body) for key, body in blobs.items() if key not in self._blobs],
            )
            conn.execute(
                "UPDATE conversations SET snapshot_json = ?, snapshot_seq = ?,"
                " snapshot_checksum = ? WHERE id = ?",
                [text, seq, snapshot_checksum(conversation_id, seq, text), conversation_id],
            )

    # ------------------------------------------------------------------ reading

    def _read_blobs(self, conn: sqlite3.Connection) -> dict[str, str]:
        """The log's blobs, reading those added since the last call (in the caller's
        transaction, under the lock). Checked against their keys where decoded."""
        after = self._blob_rowid
        if after is None:
            return self._blobs
        rows = conn.execute(
            "SELECT rowid, sha256, body FROM blobs WHERE rowid > ? ORDER BY rowid", [after]
        ).fetchall()
        if rows:
            self._blobs.update((key, body) for _, key, body in rows)
            self._blob_rowid = rows[-1][0]
        return self._blobs

    def damage(self) -> str | None:
        """What SQLite's ``PRAGMA integrity_check`` finds wrong with the database file
        (its first lines), or None if nothing. Reads the whole file: for telling a
        divergence from damage that no row checksum shows (a damaged index hides a row
        from the queries that use it)."""
        with self._transaction("BEGIN") as conn:
            try:
                rows = conn.execute("PRAGMA integrity_check(5)").fetchall()
            except sqlite3.DatabaseError as exc:
                return str(exc)
        lines = [str(row[0]) for row in rows]
        return None if lines == ["ok"] else "; ".join(lines)

    def blobs(self) -> dict[str, str]:
        """Every blob of the log (``sha256 -> text``), for decoding its documents."""
        with self._transaction("BEGIN") as conn:
            return dict(self._read_blobs(conn))

    @staticmethod
    def _require(conn: sqlite3.Connection, conversation_id: str) -> None:
        found = conn.execute(
            "SELECT 1 FROM conversations WHERE id = ?", [conversation_id]
        ).fetchone()
        if found is None:
            raise UnknownConversation(conversation_id)

    def exists(self, conversation_id: str) -> bool:
        """Whether the log has this conversation."""
        return bool(self._query("SELECT 1 FROM conversations WHERE id = ?", [conversation_id]))

    def last_turn(self, conversation_id: str) -> TurnFinished | None:
        """The ``TurnFinished`` effect of the conversation's latest finished turn (a
        sub-agent's only one), or None if no turn has finished. Re-derived by replay
        where the log stores events only (``events``)."""
        _load()
        for stored in reversed(self.events(conversation_id)):
            for effect in reversed(stored.effects):
                if isinstance(effect, TurnFinished):
                    return effect
        return None

    def last_outcome(self, conversation_id: str) -> str | None:
        """The outcome (a ``TurnOutcome`` value) of the conversation's latest finished
        turn, None if none finished: ``last_turn``'s, read from the column the store
        writes with the step that ended the turn (migration 7), so no event is decoded
        and the reducer is not imported. Where the log does not hold it (no turn ended
        since the migration, imported rows, a read-only open of an older log,
        PostgreSQL) it is found by ``last_turn``."""
        if self._turns:
            rows = self._query(
                "SELECT last_turn FROM conversations WHERE id = ?", [conversation_id]
            )
            if not rows:
                raise UnknownConversation(conversation_id)
            if rows[0]["last_turn"] is not None:
                return str(rows[0]["last_turn"])
        turn = self.last_turn(conversation_id)
        return None if turn is None else turn.outcome.value

    def conversation(self, conversation_id: str) -> ConversationRow:
        """The row of one conversation; raises UnknownConversation if there is none."""
        rows = self._query(
            f"SELECT {_ROW_COLUMNS} FROM conversations WHERE id = ?", [conversation_id]
        )
        if not rows:
            raise UnknownConversation(conversation_id)
        return ConversationRow.from_row(rows[0])

    def events(
        self,
        conversation_id: str,
        after_seq: int = -1,
        *,
        limit: int | None = None,
        after_state: Conversation | None = None,
    ) -> list[StoredEvent]:
        """The conversation's events with seq > ``after_seq``, in order, with effects;
        at most ``limit`` of them (the first ones) if given.

        A step of the events-only log (a version-6 fingerprint, migration 5) has no
        stored effects: they are re-derived by folding the conversation's events from
        seq 0 (``ReplayError`` if the reducer refuses one), or from ``after_state``
        when the caller gives it: the conversation's state after event ``after_seq``,
        as the caller folded it (a reader going page by page passes the state it
        reached, so each page costs its own events, not the conversation's whole
        log). Effects stored by older logs are read as stored. Raises ReplayError
        naming the seq if a row does not match its checksum."""
        _load()
        checksum = "checksum" if self._checksums else "NULL AS checksum"
        # Seqs are dense from 0: the first ``limit`` events after ``after_seq`` are
        # those up to ``after_seq + limit``.
        bound = "" if limit is None else " AND seq <= ?"
        upper: list[Any] = [] if limit is None else [after_seq + max(limit, 0)]
        with self._transaction("BEGIN") as conn:
            self._require(conn, conversation_id)
            blobs = self._read_blobs(conn)
            derive = conn.execute(
                "SELECT 1 FROM events WHERE conversation_id = ? AND seq > ?"
                " AND fingerprint LIKE '% #####%' LIMIT 1",
                [conversation_id, after_seq],
            ).fetchone()
            # Re-deriving effects needs the state before the first event read: the
            # caller's, or a fold from seq 0.
            start_after = -1 if derive and (after_state is None or after_seq < 0) else after_seq
            events = list(
                self._db.query(
                    f"SELECT seq, type, payload, fingerprint, at, {checksum} FROM events"
                    f" WHERE conversation_id = ? AND seq > ?{bound} ORDER BY seq",
                    [conversation_id, start_after, *upper],
                )
            )
            effects = list(
                self._db.query(
                    f"SELECT seq, idx, type, payload, {checksum} FROM effects"
                    f" WHERE conversation_id = ? AND seq > ?{bound} ORDER BY seq, idx",
                    [conversation_id, start_after, *upper],
                )
            )
        where = f"conversation {conversation_id!r}"
        for row in events:
            crc = row["checksum"]
            if crc is not None and crc != event_checksum(
                conversation_id,
                row["seq"],
                row["type"],
                row["payload"],
                row["fingerprint"],
                row["at"],
            ):
                raise ReplayError(
                    f"{where}, event {row['seq']}: the row is damaged (checksum mismatch)"
                )
        by_seq: dict[int, list[dict[str, Any]]] = {}
        for row in effects:
            crc = row["checksum"]
            if crc is not None and crc != effect_checksum(
                conversation_id, row["seq"], row["idx"], row["type"], row["payload"]
            ):
                raise ReplayError(
                    f"{where}, event {row['seq']}: effect {row['idx']} is damaged"
                    " (checksum mismatch)"
                )
            by_seq.setdefault(row["seq"], []).append(row)
        if not derive:
            return [StoredEvent.from_rows(row, by_seq.get(row["seq"], []), blobs) for row in events]
        state = after_state if start_after >= 0 else None
        return [
            stored
            for stored in _derived(conversation_id, events, by_seq, blobs, state, start_after + 1)
            if stored.seq > after_seq
        ]

    def timer_starts(self, conversation_id: str) -> dict[int, float]:
        """``timer number -> at`` of the step that first started each timer
        (``StartTimer`` or ``ScheduleRetry``) of the conversation.

        A restarted runtime re-issues timers under their old numbers; it uses this so
        that a conversation's time limit and retry back-offs keep their original
        deadlines instead of starting over. Re-derived by replay where the log stores
        events only (``events``).
        """
        _load()
        started: dict[int, float] = {}
        for stored in self.events(conversation_id):
            for effect in stored.effects:
                if isinstance(effect, StartTimer | ScheduleRetry):
                    started.setdefault(effect.timer, stored.at)
        return started

    def raw_log(self, conversation_id: str) -> RawLog:
        """The conversation's row, snapshot text, events and effects as stored, undecoded.

        Nothing is checked: gaps, undecodable payloads and the like come back as they
        are, for tools that diagnose them (replay verification, export). Raises
        UnknownConversation if there is no such conversation.
        """
        logs = self._raw_logs(
            f"SELECT {self._raw_columns()} FROM conversations WHERE id = ?", [conversation_id]
        )
        if not logs:
            raise UnknownConversation(conversation_id)
        return logs[0]

    def raw_tree(self, root_id: str) -> list[RawLog]:
        """``raw_log`` of every conversation of the tree rooted at ``root_id``, in the
        order of ``tree`` (root first, creation order), read in one transaction."""
        return self._raw_logs(
            f"SELECT {self._raw_columns()} FROM conversations WHERE root_id = ? ORDER BY rowid",
            [root_id],
        )

    def _raw_columns(self) -> str:
        """The columns of a conversation's row ``_raw_logs`` reads."""
        snapshot = "snapshot_checksum" if self._checksums else "NULL AS snapshot_checksum"
        return f"{_ROW_COLUMNS}, snapshot_json, {snapshot}"

    def _raw_logs(self, rows_sql: str, params: Sequence[Any]) -> list[RawLog]:
        """The raw logs of the conversations ``rows_sql`` selects (with ``params``)."""
        checksum = "checksum" if self._checksums else "NULL"
        with self._transaction("BEGIN") as conn:
            blobs = self._read_blobs(conn)
            rows = list(self._db.query(rows_sql, params))
            # (An alias, which PostgreSQL requires of a subquery in FROM.)
            ids = f"SELECT id FROM ({rows_sql}) AS picked"
            events = conn.execute(
                "SELECT conversation_id, rowid, seq, type, payload, fingerprint, at,"
                f" {checksum} FROM events"
                f" WHERE conversation_id IN ({ids}) ORDER BY conversation_id, seq",
                params,
            ).fetchall()
            effects = conn.execute(
                f"SELECT conversation_id, seq, idx, type, payload, {checksum} FROM effects"
                f" WHERE conversation_id IN ({ids}) ORDER BY conversation_id, seq, idx",
                params,
            ).fetchall()
        by_seq: dict[tuple[str, int], list[RawEffect]] = {}
        for cid, seq, idx, kind, payload, crc in effects:
            by_seq.setdefault((cid, seq), []).append(RawEffect(idx, kind, payload, crc))
        by_conversation: dict[str, list[RawEvent]] = {}
        for cid, rowid, seq, kind, payload, mark, at, crc in events:
            by_conversation.setdefault(cid, []).append(
                RawEvent(
                    cid,
                    seq,
                    kind,
                    payload,
                    mark,
                    at,
                    tuple(by_seq.get((cid, seq), ())),
                    rowid,
                    crc,
                )
            )
        return [
            RawLog(
                ConversationRow.from_row(row),
                row["snapshot_json"],
                tuple(by_conversation.get(row["id"], ())),
                row["snapshot_checksum"],
                blobs,
            )
            for row in rows
        ]

    def load_state(self, conversation_id: str, *, verify: bool = True) -> Conversation:
        """Rebuild the conversation's current state: its snapshot, then later events.

        With ``verify`` (the default) the fingerprint of every rebuilt state is
        compared with the recorded one. Raises ReplayError when the reducer refuses a
        stored event or a fingerprint differs, UnknownConversation if there is no
        such conversation. A row whose checksum (``fanfold.db.checksum``) does not
        match is damage: ReplayError naming the conversation and seq, even without
        ``verify``.
        """
        _load()
        checksum, snapshot = (
            ("checksum", "snapshot_checksum") if self._checksums else ("NULL", "NULL")
        )
        with self._transaction("BEGIN") as conn:
            row = conn.execute(
                f"SELECT snapshot_json, snapshot_seq, {snapshot} FROM conversations WHERE id = ?",
                [conversation_id],
            ).fetchone()
            if row is None:
                raise UnknownConversation(conversation_id)
            blobs = self._read_blobs(conn)
            snapshot_json, snapshot_seq, snapshot_crc = row
            if snapshot_json is None:
                snapshot_seq = 0
            rows: list[tuple[int, str, str, str, float, int | None]] = conn.execute(
                f"SELECT seq, type, payload, fingerprint, at, {checksum} FROM events"
                " WHERE conversation_id = ? AND seq >= ? ORDER BY seq",
                [conversation_id, snapshot_seq],
            ).fetchall()
        where = f"conversation {conversation_id!r}"
        if (
            snapshot_json is not None
            and snapshot_crc is not None
            and snapshot_crc != snapshot_checksum(conversation_id, snapshot_seq, snapshot_json)
        ):
            raise ReplayError(
                f"{where}: the snapshot after event {snapshot_seq} is damaged (checksum mismatch)"
            )
        for seq, kind, payload, mark, at, crc in rows:
            if crc is not None and crc != event_checksum(
                conversation_id, seq, kind, payload, mark, at
            ):
                raise ReplayError(f"{where}, event {seq}: the row is damaged (checksum mismatch)")
        events = [(seq, payload, mark) for seq, _, payload, mark, _, _ in rows]
        return _replay(conversation_id, snapshot_json, events, blobs, verify=verify)

    def list_roots(self, limit: int | None = None) -> list[ConversationRow]:
        """User-initiated conversations (no sub-agents), newest first."""
        sql = (
            f"SELECT {_ROW_COLUMNS} FROM conversations WHERE user_initiated = 1"
            " ORDER BY created_at DESC, rowid DESC"
        )
        params: list[Any] = []
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [ConversationRow.from_row(r) for r in self._query(sql, params)]

    def children(self, conversation_id: str) -> list[ConversationRow]:
        """The direct sub-agents of a conversation, in creation order."""
        rows = self._query(
            f"SELECT {_ROW_COLUMNS} FROM conversations WHERE parent_id = ? ORDER BY rowid",
            [conversation_id],
        )
        return [ConversationRow.from_row(r) for r in rows]

    def tree(self, root_id: str) -> list[ConversationRow]:
        """Every conversation of the tree rooted at ``root_id``, root first, in creation
        order (a parent always comes before its children)."""
        rows = self._query(
            f"SELECT {_ROW_COLUMNS} FROM conversations WHERE root_id = ? ORDER BY rowid",
            [root_id],
        )
        return [ConversationRow.from_row(r) for r in rows]

    @property
    def instance_id(self) -> str:
        """The database's random identity (made when it was created or migrated), which
        provenance marks name: a mark made for one database fails in any other."""
        rows = self._query("SELECT value FROM meta WHERE key = 'instance_id'")
        if not rows:  # only a read-only open of a log not yet migrated
            raise SchemaError(f"{self.path} has no instance id yet (it needs a migration)")
        return str(rows[0]["value"])

    def tree_record(self, root_id: str) -> TreeRecord | None:
        """The provenance record of the tree rooted at ``root_id`` (None: none is
        stored, as for trees written before provenance records existed)."""
        if not self._has_trees():
            return None  # a read-only open of a log older than provenance records
        rows = self._query(
            f"SELECT {', '.join(TreeRecord.COLUMNS)} FROM trees WHERE root_id = ?", [root_id]
        )
        if not rows:
            return None
        row = rows[0]
        try:
            origin = Origin(row["origin"])
        except ValueError:
            return None  # not a value fanfold writes: treated as no record at all
        return TreeRecord(**{**row, "origin": origin})

    def record_provider(self, root_id: str, provider: str) -> None:
        """Record ``provider`` (JSON) as the configuration tree ``root_id`` runs on. The
        tree's record must exist (only trees a runtime wrote are continued)."""
        with self._transaction("BEGIN IMMEDIATE") as conn:
            changed = conn.execute(
                "UPDATE trees SET provider = ? WHERE root_id = ?", [provider, root_id]
            ).rowcount
            if not changed:
                self._require(conn, root_id)
                raise InvalidStep(f"tree {root_id!r} has no provenance record")

    def _has_trees(self) -> bool:
        """Whether the log has the ``trees`` table (migration 2)."""
        return bool(
            self._query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'trees'")
        )

    # ------------------------------------------------------------ tool progress

    def write_progress(
        self, rows: Sequence[ToolProgressRow], ended: Sequence[tuple[str, int]] = ()
    ) -> None:
        """Record each of ``rows`` as its call's latest progress report (replacing the
        one before) and forget the calls ``ended`` names (``(conversation id, call)``),
        in one transaction.

        The ``tool_progress`` table is a side table for the trace page: no event, no
        fingerprint, never read by replay, verify or export. A store that stopped
        writing after a failed sync writes nothing here either (silently: progress is
        a view, and the failure is reported by the next ``append``)."""
        if (not rows and not ended) or self._failed is not None:
            return
        with self._transaction("BEGIN IMMEDIATE") as conn:
            if ended:
                conn.executemany(
                    "DELETE FROM tool_progress WHERE conversation_id = ? AND call = ?",
                    [list(key) for key in ended],
                )
            if rows:
                conn.executemany(
                    "INSERT INTO tool_progress (conversation_id, call, text, reports, at)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (conversation_id, call) DO UPDATE"
                    " SET text = excluded.text, reports = excluded.reports, at = excluded.at",
                    [[r.conversation_id, r.call, r.text, r.reports, r.at] for r in rows],
                )
        checkpointer = self._checkpointer
        if checkpointer is not None:
            # Its WAL frames count toward the next checkpoint like a batch's (a long
            # call reporting for an hour, with no step logged, grows no WAL unbounded).
            checkpointer.wrote(sum(len(r.text) + 64 for r in rows) + 64 * len(ended))

    def progress_of(
        self, conversation_ids: Sequence[str]
    ) -> dict[tuple[str, int], ToolProgressRow]:
        """The progress rows recorded for calls of ``conversation_ids``, by ``(conversation
        id, call)``; none from a log without the table (a read-only open of an older log)."""
        ids = list(dict.fromkeys(conversation_ids))
        if not ids or not self._has_progress():
            return {}
        found: dict[tuple[str, int], ToolProgressRow] = {}
        for at in range(0, len(ids), _IDS_PER_QUERY):
            part = ids[at : at + _IDS_PER_QUERY]
            for row in self._query(
                "SELECT conversation_id, call, text, reports, at FROM tool_progress"
                f" WHERE conversation_id IN ({', '.join('?' * len(part))})",
                part,
            ):
                made = ToolProgressRow(**row)
                found[made.conversation_id, made.call] = made
        return found

    def _has_progress(self) -> bool:
        """Whether the log has the ``tool_progress`` table (migration 6)."""
        return bool(
            self._query(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tool_progress'"
            )
        )

    def placements(self, root_id: str) -> dict[str, str]:
        """Each child of tree ``root_id`` placed in a chunk to run elsewhere, and its
        chunk: none in a file (placement is a PostgreSQL log's, ``PostgresStore``)."""
        return {}

    def unfinished(self) -> list[ConversationRow]:
        """Conversations with something in flight (status 'running'), in creation order:
        what a restarted runtime must resume."""
        rows = self._query(
            f"SELECT {_ROW_COLUMNS} FROM conversations WHERE status = ? ORDER BY rowid",
            [Status.RUNNING.value],
        )
        return [ConversationRow.from_row(r) for r in rows]


def _derived(
    conversation_id: str,
    events: list[dict[str, Any]],
    stored_effects: dict[int, list[dict[str, Any]]],
    blobs: dict[str, str],
    state: Conversation | None = None,
    first: int = 0,
) -> list[StoredEvent]:
    """The events of a conversation (``events``: its rows in order from seq
    ``first``: 0, or the seq after the one that left ``state``) with
    their effects: those an events-only step produced, re-derived by folding; those
    an older step stored, as stored."""
    _load()
    _load_reducer()
    where = f"conversation {conversation_id!r}"
    out: list[StoredEvent] = []
    for expected, row in enumerate(events, start=first):
        seq = row["seq"]
        if seq != expected:
            raise ReplayError(f"{where}: event {expected} is missing")
        try:
            event = decode_event(row["payload"], blobs)
            if state is None:
                if not isinstance(event, ConversationCreated | ConversationForked):
                    raise ReplayError(f"{where}: event 0 is {type(event).__name__}")
                state, effects = start(event)
            else:
                state, effects = transition(state, event)
            if not events_only(row["fingerprint"]):
                effects = tuple(
                    decode_effect(e["payload"], blobs) for e in stored_effects.get(seq, [])
                )
        except CodecError as exc:
            raise ReplayError(f"{where}, event {seq}: {exc}") from exc
        except IllegalTransition as exc:
            raise ReplayError(f"{where}: the reducer refused event {seq}: {exc}") from exc
        out.append(StoredEvent(seq, event, effects, row["fingerprint"], row["at"]))
    return out


def _replay(
    conversation_id: str,
    snapshot_json: str | None,
    events: list[tuple[int, str, str]],
    blobs: dict[str, str],
    *,
    verify: bool,
) -> Conversation:
    """Fold ``events`` (the first one is the snapshot's, or seq 0) into a state."""
    _load()
    if snapshot_json is None or len(events) > 1:
        _load_reducer()  # a fold: from seq 0, or past the snapshot
    if not events:
        raise ReplayError(f"conversation {conversation_id!r}: no events to start from")
    where = f"conversation {conversation_id!r}"

    def decoded(seq: int, payload: str) -> Any:
        try:
            return decode_event(payload, blobs)
        except CodecError as exc:
            raise ReplayError(f"{where}, event {seq}: {exc}") from exc

    first_seq, first_payload, _ = events[0]
    try:
        if snapshot_json is None:
            created = decoded(first_seq, first_payload)
            if not isinstance(created, ConversationCreated | ConversationForked):
                raise ReplayError(f"{where}: event 0 is {type(created).__name__}")
            state, _ = start(created)
        else:
            state = decode_state(snapshot_json, blobs)
    except CodecError as exc:
        raise ReplayError(f"{where}: the snapshot cannot be read: {exc}") from exc
    except IllegalTransition as exc:
        raise ReplayError(f"{where}: the reducer refused event 0: {exc}") from exc
    expected_seq = first_seq
    for seq, payload, mark in events:
        if seq != expected_seq:
            raise ReplayError(f"{where}: event {expected_seq} is missing")
        expected_seq += 1
        if seq != first_seq:
            event = decoded(seq, payload)
            try:
                state, _ = transition(state, event)
            except IllegalTransition as exc:
                raise ReplayError(f"{where}: the reducer refused event {seq}: {exc}") from exc
        if verify and like(state, mark, payload) != mark:
            raise ReplayError(
                f"{where}: the state after event {seq} does not match the log "
                f"(rebuilt {like(state, mark, payload)!r}, recorded {mark!r})"
            )
    return state
