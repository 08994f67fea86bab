"""The high-water mark of an SQLite log: evidence that it once held more than it does.

A log file's steps are in the database file and its WAL (``<db>-wal``) until a
checkpoint copies them over. A WAL that is deleted, cut short or damaged (SQLite stops
reading it at the first frame whose checksum fails) leaves an older log that is
perfectly consistent: ``replay --verify`` calls it identical, and ``resume`` would run
again every command whose step was lost (issue 32, item 6). Nothing in the log itself
can tell: the loss took the evidence with it.

So the log keeps its evidence beside it: ``<db>-committed`` (next to the database's
resolved path, so a symlink to it finds the same file), one line rewritten in place
after every commit of ``Store.append``::

    fanfold-committed 2 <instance id> <seq> <conversation id as JSON> <line crc>

the database's ``instance_id`` (from its ``meta`` table, made once per database) and
the last step of the batch just committed. A WAL loses a suffix of its commits (SQLite
reads frames up to the first one that is missing or fails its checksum), so when it
loses any, it loses the last one, which the mark names. ``check`` (run when a store
opens the file to write, when a reader finds it empty, and by ``replay.verify``) asks
the database for that step: if it is not there, the log lost committed steps, and
``LostSteps`` says so (the CLI: exit 2) before anything runs. Later steps cannot hide
the loss, since every writer is refused first (a mark is moved only by a store that
opened the log, after checking it).

Why this is sound: the mark is written after the commit it names (a crash between the
two leaves an older mark, which is still true); several writers may race to write it
(each names a step of its own commit: a committed step, at worst an older one). It
costs no SQL statement: one ``pwrite`` per batch. A mark of another database (its
instance id differs: the file was replaced) is ignored and overwritten. The mark is
not synced: a power loss may leave an older one, and an older mark never accuses the
log. It cannot leave one newer than the log on disk: each commit's WAL is synced before
the commit returns (``synchronous = FULL``), and the mark is written after that.

What it cannot see (DESIGN, "Failure model"): a loss together with its mark (the
whole folder restored from a backup, the database copied without ``-committed``); a
mark deleted or damaged (a line whose CRC fails is ignored: no evidence); steps lost
while no mark was written yet (the first commit); writes made outside
``Store.append`` (``import``: they move no mark, they are only not guarded); and
PostgreSQL logs, which have no WAL file to lose.
"""

from __future__ import annotations

import json
import os
import sqlite3
import zlib

import attrs

from fanfold.db.errors import LostSteps

SUFFIX = "-committed"
"""The mark's file: ``<resolved database path>-committed``."""

_MAGIC = "fanfold-committed 2"


def mark_path(database: str) -> str:
    """The mark file of the database file ``database`` (through any symlink)."""
    return os.path.realpath(database) + SUFFIX


@attrs.frozen
class Mark:
    """A mark as read back: the database it belongs to and its last committed step."""

    instance: str
    conversation_id: str
    seq: int

    def line(self) -> bytes:
        """The mark's line. It is rewritten in place, never truncated: a longer line
        written before may follow it in the file, after its newline (only the first
        line is read)."""
        return _line(f"{_MAGIC} {self.instance} ", self.conversation_id, self.seq)

    @classmethod
    def parse(cls, data: bytes) -> Mark | None:
        """The mark at the start of ``data``; None if it is not a whole, intact mark."""
        first, newline, _ = data.partition(b"\n")
        if not newline:
            return None
        try:
            body, _, crc = first.decode("ascii").rpartition(" ")
            if int(crc, 16) != zlib.crc32(body.encode()):
                return None
            parts = body.split(" ", 4)
            if len(parts) != 5 or " ".join(parts[:2]) != _MAGIC:
                return None
            cid = json.loads(parts[4])
            seq = int(parts[3])
        except (UnicodeDecodeError, ValueError):
            return None
        return cls(parts[2], cid, seq) if isinstance(cid, str) and seq >= 0 else None


def _line(head: str, conversation_id: str, seq: int) -> bytes:
    """A mark's line: ``head`` (magic and instance id, then a space), the step, a CRC."""
    body = f"{head}{seq} {json.dumps(conversation_id)}".encode()
    return b"%s %08x\n" % (body, zlib.crc32(body))


def read(database: str) -> Mark | None:
    """The database's mark, or None if there is none (or none intact)."""
    try:
        with open(mark_path(database), "rb") as file:
            return Mark.parse(file.read(65536))
    except OSError:
        return None


def instance_of(conn: sqlite3.Connection) -> str | None:
    """The database's instance id; None if it has none (no tables: an empty log)."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'instance_id'").fetchone()
    except sqlite3.OperationalError:  # no meta table
        return None
    return None if row is None else str(row[0])


_REMEDY = (
    "Nothing was run: resuming would run the lost steps' commands again. To accept the "
    "log as it is (those commands may run again), remove {0}."
)


def check(conn: sqlite3.Connection, database: str) -> None:
    """Raise ``LostSteps`` if ``database`` (open on ``conn``) lost steps its mark says
    were committed. No mark, a damaged one or another database's: nothing to check."""
    mark = read(database)
    if mark is None:
        return
    where = mark_path(database)
    step = f"step {mark.seq} of conversation {mark.conversation_id}"
    instance = instance_of(conn)
    if instance is None:
        # The mark was written after a commit of this path's log, and the file is
        # here, not empty, with no table in it: its WAL (everything never
        # checkpointed, the log's tables included) is gone. A zero-byte file never
        # held one (WAL mode writes the file's first page): a new log at a path whose
        # old one was removed, mark left behind. A file with tables but no instance
        # id is another database (a log older than instance ids, another program's).
        try:
            empty = os.path.getsize(database) == 0
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        except (OSError, sqlite3.DatabaseError):
            return
        if empty or tables:
            return
        raise LostSteps(
            f"the log {database} lost committed steps: it holds no log at all, but {where} "
            f"says {step} was committed to it (its WAL file {database}-wal was deleted or "
            f"damaged). {_REMEDY.format(where)}"
        )
    if instance != mark.instance:
        return  # the mark of another database once at this path
    try:
        found = conn.execute(
            "SELECT 1 FROM events WHERE conversation_id = ? AND seq = ?",
            (mark.conversation_id, mark.seq),
        ).fetchone()
        last = conn.execute(
            "SELECT last_seq FROM conversations WHERE id = ?", (mark.conversation_id,)
        ).fetchone()
    except sqlite3.OperationalError:
        found = last = None
    if found is not None:
        return
    held = (
        "the conversation is gone" if last is None else f"the conversation ends at step {last[0]}"
    )
    raise LostSteps(
        f"the log {database} lost committed steps: {where} says {step} was committed, "
        f"and {held} (its WAL file {database}-wal was cut, damaged or deleted). "
        f"{_REMEDY.format(where)}"
    )


class Writer:
    """Rewrites a log's mark after each commit (``Store.append``). Opened lazily at the
    first commit; a mark that cannot be written (a read-only folder, a full disk) is
    skipped: no evidence, never a failed step."""

    def __init__(self, database: str, instance: str | None) -> None:
        self._path = mark_path(database)
        self._head = f"{_MAGIC} {instance} "
        self._fd: int | None = None
        self._broken = instance is None

    def committed(self, conversation_id: str, seq: int) -> None:
        """Record the last step of a batch just committed."""
        if self._broken:
            return
        line = _line(self._head, conversation_id, seq)  # about 3 µs, and 3 µs of pwrite
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
