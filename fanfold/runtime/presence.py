"""Which runtimes have a database file open: so ``resume`` never takes over live work.

``resume()`` picks up every conversation whose status is ``running``. After a crash
those are orphans; but while another process (a ``fanfold run`` in another terminal)
is running them, they are its work, and resuming them too would run every model call
and tool twice and make both processes fight over the log. The log alone cannot tell
the two apart: a crashed process leaves no mark.

The kernel can. Every ``Runtime`` on a file holds a shared ``flock`` on a sibling file
(``<database>-runtimes``) for as long as it is open; the kernel drops it when the
process exits, however it exits (``kill -9`` included). ``resume()`` first asks for the
lock exclusively, without waiting: it gets it only if no other runtime, in this process
or another, has the database open. Then it goes back to shared.

One lock per database, not per conversation tree: simple, one file descriptor, nothing
to clean up, at the price that resume also waits for unrelated runs on the same file to
end. (flock, not POSIX record locks: those are per process and silently released when
any descriptor of the file in the process is closed.)
"""

from __future__ import annotations

import fcntl
import os
from typing import Protocol


class Held(Protocol):
    """What a runtime holds while it is open: ``Presence`` for a file, a PostgreSQL
    log's ``PgPresence`` (``fanfold.db.postgres``) for a URL."""

    def alone(self) -> bool:
        """True if no other runtime has the log open right now."""
        ...

    def close(self) -> None:
        """Let go (idempotent)."""
        ...


class DatabaseInUse(RuntimeError):
    """Another runtime has the database open, so its unfinished conversations may be
    live work, not orphans of a crash."""


def lock_file(database: str | os.PathLike[str]) -> str:
    """The lock file of the runtimes on SQLite file ``database``."""
    return f"{os.fspath(database)}-runtimes"


def runtime_open(database: str | os.PathLike[str]) -> bool:
    """Whether some runtime, in any process, has SQLite file ``database`` open now.

    For views (``fanfold ls``): a tree ``running`` in the log while no runtime has its
    database open was left by a process that died, and waits for ``fanfold resume``.
    Asks for the lock exclusively without waiting and lets go at once; creates nothing
    (no lock file: no runtime ever opened it). Holding it for that moment cannot make a
    ``resume`` refuse wrongly: a runtime holds its shared lock from its start, so the
    two are never held at once.
    """
    try:
        fd = os.open(lock_file(database), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the lock if it was taken
    return False


class Presence:
    """This runtime's shared lock on ``<database>-runtimes``; ``close()`` releases it."""

    def __init__(self, database: str | os.PathLike[str]) -> None:
        self.path = lock_file(database)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise

    def alone(self) -> bool:
        """True if no other runtime has the database open right now.

        Holds the lock exclusively only for the moment of the check. (Converting a
        flock is not atomic: on failure the shared lock is gone and is taken again,
        waiting at most for another runtime's own moment of checking.)
        """
        fd = self._require()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return False
        fcntl.flock(fd, fcntl.LOCK_SH)
        return True

    def close(self) -> None:
        """Release the lock. Idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _require(self) -> int:
        if self._fd is None:
            raise RuntimeError("the runtime is closed")
        return self._fd
