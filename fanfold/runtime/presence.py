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

One lock per database, not per conversation tree: simple, nothing to clean up, at the
price that resume also waits for unrelated runs on the same file to end. (flock, not
POSIX record locks: those are per process and silently released when any descriptor of
the file in the process is closed.)

A database has more than one name: a symbolic link to it, a hard link, a path through
a linked folder. A lock file named after the path as typed would let ``resume --db
link.db`` take over the trees a run on ``log.db`` is running (seen: the original run
then died with "expected seq 2, got 1"). So the lock is taken twice, and ``alone()``
needs both exclusively:

- ``<resolved path>-runtimes``, beside the file every symbolic link leads to (the
  path with every link resolved): one file for every name that resolves there, and
  visible to every user who can write that folder;
- the database's identity (device and inode, what a hard link shares):
  ``/tmp/fanfold-<uid>/runtimes-<device>-<inode>``, in a folder of this user's own
  (mode 0700). It covers this user's runtimes only, and is skipped (the first lock
  alone remains) when that folder cannot be made or is not this user's.

A runtime that finds the identity's lock held by others but its path's free opens the
file while another runtime has it open under another name (a hard link): SQLite keeps a
write-ahead log per name, so the two would damage the file. Opening is refused
(``DatabaseInUse``), whether to resume, run or send. (Two runtimes opening the file
under two names at the same moment may both be refused: the safe side.)
"""

from __future__ import annotations

import fcntl
import os
import stat
from typing import Protocol

IDENTITY_FOLDER = "/tmp"
"""Where the per-user folder of identity locks lives (a fixed place, not ``$TMPDIR``:
two processes of one user with different environments must find the same file)."""


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
    """The lock file of the runtimes on SQLite file ``database``: beside the file
    itself, every link resolved (a resume through a link must meet the run's lock)."""
    return f"{os.path.realpath(os.fspath(database))}-runtimes"


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
    """This runtime's shared locks on the database (``<resolved path>-runtimes`` and
    its identity's, see the module docstring); ``close()`` releases them."""

    def __init__(self, database: str | os.PathLike[str]) -> None:
        resolved = os.path.realpath(os.fspath(database))
        self.path = lock_file(resolved)
        self.identity_path = identity_lock_path(resolved)
        self._fds: list[int] | None = []
        try:
            for path, flags in ((self.path, 0), (self.identity_path, os.O_NOFOLLOW)):
                if path is None:
                    continue
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | flags, 0o644)
                self._fds.append(fd)
                fcntl.flock(fd, fcntl.LOCK_SH)
            if self._open_under_another_name():
                raise DatabaseInUse(
                    f"another fanfold runtime has {resolved} open under another name (a "
                    "hard link to it): SQLite keeps a write-ahead log per name, so opening "
                    "it here too would damage it. Use the same path, or wait until that "
                    "runtime has ended"
                )
        except BaseException:
            self.close()
            raise

    def _open_under_another_name(self) -> bool:
        """Whether another runtime holds the identity's lock but not this path's: it
        opened the same file through a hard link (a different path, a different WAL)."""
        fds = self._require()
        if len(fds) < 2:
            return False
        by_path, by_identity = fds
        try:
            fcntl.flock(by_identity, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fcntl.flock(by_identity, fcntl.LOCK_SH)
        else:
            fcntl.flock(by_identity, fcntl.LOCK_SH)
            return False  # nobody else has the file open at all
        try:
            fcntl.flock(by_path, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fcntl.flock(by_path, fcntl.LOCK_SH)
            return False  # another runtime has it open under this name too: allowed
        fcntl.flock(by_path, fcntl.LOCK_SH)
        return True

    def alone(self) -> bool:
        """True if no other runtime has the database open right now (under any of its
        names).

        Holds the locks exclusively only for the moment of the check. (Converting a
        flock is not atomic: on failure the shared lock is gone and is taken again,
        waiting at most for another runtime's own moment of checking; the exclusive
        tries never wait, so two runtimes checking at once cannot deadlock.)
        """
        fds = self._require()
        taken: list[int] = []
        alone = True
        for fd in fds:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fcntl.flock(fd, fcntl.LOCK_SH)
                alone = False
                break
            taken.append(fd)
        for fd in taken:
            fcntl.flock(fd, fcntl.LOCK_SH)
        return alone

    def close(self) -> None:
        """Release the locks. Idempotent."""
        if self._fds is not None:
            for fd in self._fds:
                os.close(fd)
            self._fds = None

    def _require(self) -> list[int]:
        if self._fds is None:
            raise RuntimeError("the runtime is closed")
        return self._fds


def identity_lock_path(database: str) -> str | None:
    """The lock file of the database's identity (device and inode) in this user's own
    folder under ``IDENTITY_FOLDER``; None when the database cannot be stat'ed or the
    folder cannot be made, or is not this user's (a folder another user made first)."""
    try:
        info = os.stat(database)
    except OSError:
        return None
    folder = os.path.join(IDENTITY_FOLDER, f"fanfold-{os.geteuid()}")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        mine = os.lstat(folder)
    except OSError:
        return None
    # A folder (not a link to one) of this user's, writable by nobody else: another
    # user cannot plant a lock file that makes every resume refuse.
    if not stat.S_ISDIR(mine.st_mode) or mine.st_uid != os.geteuid() or mine.st_mode & 0o022:
        return None
    return os.path.join(folder, f"runtimes-{info.st_dev}-{info.st_ino}")
