"""The one exception family of ``fanfold.db``: every failure names what is wrong.

``sqlite3`` errors that mean the environment failed (disk full, a lock held past the
busy timeout) are not wrapped: they propagate as they are, after the transaction that
hit them was rolled back.
"""

from __future__ import annotations


class DatabaseError(Exception):
    """Base class of every error raised by ``fanfold.db``."""


class CodecError(DatabaseError):
    """A value could not be encoded, or a JSON text is not a valid encoded value.

    The message names the document type and the path to the offending field, e.g.
    ``ModelReplied.reply.tool_calls[1]: missing field 'name'``.
    """


class NonFiniteNumber(CodecError):
    """A value holds NaN or an infinity, which JSON cannot represent: refused when
    encoding (nothing is written) and when decoding (a log or file that holds a bare
    ``NaN``, ``Infinity`` or an overflowing literal such as ``1e999``). The message
    names the path, e.g. ``SpawnSubAgent.timeout``."""


class UnsupportedVersion(CodecError):
    """The JSON was written with a schema version this fanfold does not understand."""

    def __init__(self, version: object, supported: int) -> None:
        self.version = version
        self.supported = supported
        super().__init__(
            f"schema version {version!r} is not supported: this fanfold reads versions "
            f"1 to {supported}"
        )


class SchemaError(DatabaseError):
    """The database file's schema cannot be used by this fanfold (e.g. it is newer)."""


class CannotOpen(DatabaseError):
    """The file cannot be used as a fanfold log: it is not SQLite, it is another
    program's SQLite database (fanfold never writes into those), or SQLite cannot open
    it at all. Nothing was written to it."""

    cannot_open_file = False
    """True if SQLite could not open the file at all (SQLITE_CANTOPEN)."""


class EmptyLog(CannotOpen):
    """A database with no tables at all, opened for reading: nothing was ever recorded
    in it (``fanfold run`` killed before its first write leaves one). Commands that
    only read show it as a log without conversations; one that writes sets it up."""


class LostSteps(DatabaseError):
    """The log file holds fewer steps than were committed to it: its WAL was deleted,
    cut or damaged (``fanfold.db.highwater``). Raised before anything is written or
    run, so no lost step's command runs again."""


class ReadOnlyStore(DatabaseError):
    """A write was asked of a Store opened with ``read_only=True``; nothing was written."""


class StoreClosed(DatabaseError):
    """The Store was used after ``close()``."""


class SyncFailed(DatabaseError):
    """The operating system failed to put the log on stable storage: an ``fsync`` or
    ``fdatasync`` of the database, its WAL or their folder returned an error (EIO, a
    failing disk). The message names the database. Raised by the commit whose sync
    failed (the steps of that batch count as not taken: the runtime starts none of
    their effects and stops), by the first write after a failed background checkpoint,
    and by ``close`` when the final checkpoint's sync failed. After a failed sync the
    kernel may have dropped the unsynced pages and report the next sync as fine, so
    nothing more is written on that connection's word."""

    def __init__(self, path: str | None, detail: str, when: str) -> None:
        self.path = path
        self.parts = (detail, when)
        super().__init__(f"could not sync the event log {path} to disk {when}: {detail}")


class UnknownConversation(DatabaseError, LookupError):
    """No conversation with this id is stored."""

    def __init__(self, conversation_id: str) -> None:
        self.conversation_id = conversation_id
        super().__init__(f"no conversation {conversation_id!r} in the database")


class InvalidStep(DatabaseError):
    """A step of an ``append`` batch was refused; nothing of the batch was written."""


class UnloggableStep(InvalidStep, CodecError):
    """A step holds a value the codec refuses (e.g. NaN): a fanfold bug. The batch was
    rolled back whole; ``__cause__`` is the CodecError naming the path."""


class ConversationExists(InvalidStep):
    """``import_raw`` was given a conversation id the database already holds."""

    def __init__(self, conversation_id: str) -> None:
        self.conversation_id = conversation_id
        super().__init__(f"conversation {conversation_id!r} already exists in the database")


class SequenceError(InvalidStep):
    """A step's sequence number is not the next one of its conversation."""

    def __init__(self, conversation_id: str, expected: int, got: int, detail: str = "") -> None:
        self.conversation_id = conversation_id
        self.expected = expected
        self.got = got
        super().__init__(
            f"conversation {conversation_id!r}: expected seq {expected}, got {got}"
            + (f" ({detail})" if detail else "")
        )


class ReplayError(DatabaseError):
    """Folding the stored events did not reproduce the recorded states.

    Raised when the reducer refuses a stored event or a state's fingerprint differs
    from the one recorded with its event: the log and the reducer disagree.
    """


class TreeTakenOver(DatabaseError):
    """Another runtime claimed the tree (a PostgreSQL log's per-tree epoch) since this
    one did: nothing of the batch was written, and this runtime must stop running the
    tree (its new owner goes on from the log). ``root_id`` names the tree."""

    def __init__(self, root_id: str, message: str) -> None:
        self.root_id = root_id
        super().__init__(message)


class LogUnavailable(DatabaseError):
    """The PostgreSQL log cannot be reached or used right now: the server refused the
    login, the database does not exist, the connection was lost. The message names the
    database by its URL without the password, and never holds the password. A write
    that hit it was not committed (or, if the connection was lost at the commit
    itself, may have been: the log's own rows say which, and ``resume`` reads them)."""
