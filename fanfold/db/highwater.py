"""The high-water mark of an SQLite log: evidence that it once held more than it does.

A log file's steps are in the database file and its WAL (``<db>-wal``) until a
checkpoint copies them over. A WAL that is deleted, cut short or damaged (SQLite stops
reading it at the first frame whose checksum fails) leaves an older log that is
perfectly consistent: ``replay --verify`` calls it identical, and ``resume`` would run
again every command whose step was lost (issue 32, item 6). Nothing in the log itself
can tell: the loss took the evidence with it.

So the log keeps its evidence beside it: ``<db>-committed`` (next to the database's
resolved path, so a symlink to it finds the same file), one fixed-length line
rewritten in place after every commit of ``Store.append``::

    fanfold-committed 1 <instance id> <rowid> <row crc> <line crc>

the database's ``instance_id`` (from its ``meta`` table, made once per database), the
highest rowid of ``events`` after the commit, and a CRC of the ``(conversation_id,
seq)`` of that row. Events are never deleted, so rowids only grow, and the mark only
ever names a committed row. ``check`` (run when a store opens the file to write, when
a reader finds it empty, and by ``replay.verify``) asks the database for that row: if
it is not there, or is another step, the log lost committed steps, and ``LostSteps``
says so (the CLI: exit 2) before anything runs. Later steps do not hide the loss: the
row at the mark's rowid is checked, not a count.

Why this is sound: the mark is written after the commit it names (a crash between the
two leaves an older mark, which is still true); several writers may race to write it
(each writes a value it read after its own commit: still a committed row, at worst
an older one). A mark of another database (its instance id differs: the file was
replaced) is ignored and overwritten. The mark is not synced: a power loss may leave
an older one (an older mark never accuses the log), or a mark newer than the synced
log, which is the loss it is there to report.

What it cannot see (DESIGN, "Failure model"): a loss together with its mark (the
whole folder restored from a backup, the database copied without ``-committed``); a
mark deleted or damaged (a line whose CRC fails is ignored: no evidence); steps lost
while no mark was written yet (the first commit); writes made outside
``Store.append`` (``import``: they move no mark, they are only not guarded); and
PostgreSQL logs, which have no WAL file to lose.
"""

from __future__ import annotations

import os
import sqlite3
import zlib

import attrs

from fanfold.db.errors import LostSteps

SUFFIX = "-committed"
"""The mark's file: ``<resolved database path>-committed``."""

_MAGIC = "fanfold-committed 1"


def mark_path(database: str) -> str:
    """The mark file of the database file ``database`` (through any symlink)."""
    return os.path.realpath(database) + SUFFIX


@attrs.frozen
class Mark:
    """A mark as read back: the database it belongs to and its last committed event."""

    instance: str
    rowid: int
    row: int  # crc32 of "<conversation_id>\0<seq>" of the event at ``rowid``

    def line(self) -> bytes:
        """The mark's fixed-length line (the same length for every mark: it is
        rewritten in place, never truncated)."""
        body = f"{_MAGIC} {self.instance} {self.rowid:020d} {self.row:08x}"
        return f"{body} {zlib.crc32(body.encode()):08x}\n".encode()

    @classmethod
    def parse(cls, data: bytes) -> Mark | None:
        """The mark ``data`` holds; None if it is not a whole, intact mark."""
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError:
            return None
        body, _, crc = text.rstrip("\n").rpartition(" ")
        parts = body.split(" ")
        if len(parts) != 5 or " ".join(parts[:2]) != _MAGIC:
            return None
        try:
            if int(crc, 16) != zlib.crc32(body.encode()):
                return None
            return cls(parts[2], int(parts[3]), int(parts[4], 16))
        except ValueError:
            return None


def row_crc(conversation_id: str, seq: int) -> int:
    """What a mark keeps of the step it names."""
    return zlib.crc32(f"{conversation_id}\0{seq}".encode())


def read(database: str) -> Mark | None:
    """The database's mark, or None if there is none (or none intact)."""
    try:
        with open(mark_path(database), "rb") as file:
            return Mark.parse(file.read(4096))
    except OSError:
        return None


def instance_of(conn: sqlite3.Connection) -> str | None:
    """The database's instance id; None if it has none (no tables: an empty log)."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'instance_id'").fetchone()
    except sqlite3.OperationalError:  # no meta table
        return None
    return None if row is None else str(row[0])


def last_event(conn: sqlite3.Connection) -> tuple[int, str, int] | None:
    """``(rowid, conversation_id, seq)`` of the last event written; None if none."""
    try:
        row = conn.execute(
            "SELECT rowid, conversation_id, seq FROM events ORDER BY rowid DESC LIMIT 1"
        ).fetchone()
    except sqlite3.OperationalError:  # no events table
        return None
    return None if row is None else (int(row[0]), str(row[1]), int(row[2]))


def check(conn: sqlite3.Connection, database: str) -> None:
    """Raise ``LostSteps`` if ``database`` (open on ``conn``) lost steps its mark says
    were committed. No mark, a damaged one or another database's: nothing to check."""
    mark = read(database)
    if mark is None:
        return
    instance = instance_of(conn)
    if instance is None:
        # The mark was written after a commit of this path's log, and the file is
        # here, not empty, with no log in it: its WAL (everything never checkpointed,
        # the log's tables included) is gone. A zero-byte file never held one (WAL
        # mode writes the file's first page): a new log at a path whose old one was
        # removed, mark left behind.
        try:
            empty = os.path.getsize(database) == 0
        except OSError:
            empty = True
        if empty:
            return
        raise LostSteps(
            f"the log {database} lost committed steps: it holds no log at all, but "
            f"{mark_path(database)} says {mark.rowid} steps were committed to it (its WAL "
            f"file {database}-wal was deleted or damaged). {_REMEDY.format(database)}"
        )
    if instance != mark.instance:
        return  # the mark of another database once at this path
    try:
        row = conn.execute(
            "SELECT conversation_id, seq FROM events WHERE rowid = ?", (mark.rowid,)
        ).fetchone()
    except sqlite3.OperationalError:
        row = None
    if row is not None and row_crc(str(row[0]), int(row[1])) == mark.row:
        return
    last = last_event(conn)
    end = 0 if last is None else last[0]
    lost = f"at least {mark.rowid - end}" if end < mark.rowid else "some"
    raise LostSteps(
        f"the log {database} lost committed steps: it ends at step #{end}, but "
        f"{mark_path(database)} says step #{mark.rowid} was committed ({lost} steps lost: "
        f"its WAL file {database}-wal was cut, damaged or deleted). "
        f"{_REMEDY.format(database)}"
    )


_REMEDY = (
    "Nothing was run: resuming would run the lost steps' commands again. To accept the "
    "log as it is (those commands may run again), remove {0}-committed."
)


class Writer:
    """Rewrites a log's mark after each commit (``Store.append``). Opened lazily at the
    first commit; a mark that cannot be written (a read-only folder, a full disk) is
    skipped: no evidence, never a failed step."""

    def __init__(self, database: str, instance: str | None) -> None:
        self._path = mark_path(database)
        self._instance = instance
        self._fd: int | None = None
        self._broken = instance is None

    def committed(self, conn: sqlite3.Connection) -> None:
        """Record the log's last event, read on ``conn`` after a commit."""
        if self._broken or self._instance is None:
            return
        last = last_event(conn)
        if last is None:
            return
        rowid, cid, seq = last
        line = Mark(self._instance, rowid, row_crc(cid, seq)).line()
        try:
            if self._fd is None:
                self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            if os.pwrite(self._fd, line, 0) != len(line):
                self._broken = True
        except OSError:
            self._broken = True

    def close(self) -> None:
        """Close the mark's file (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
