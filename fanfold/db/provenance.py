"""Where a conversation tree's log came from, and whether this user's runtime wrote it.

A log on disk is untrusted input: an export edited by hand, or a database copied from
someone else, may hold a pending ``RunTool`` whose command ``resume`` would run with no
model involved. So every tree has a record (the ``trees`` table):

- ``origin``: ``runtime`` (started or forked here) or ``imported`` (with the imported
  file's name, sha256 and the time of the import);
- ``mark``: for trees a runtime wrote, an HMAC-SHA256 over the database's instance id
  (a random id stored in ``meta`` when the database is created) and the root id, keyed
  by a per-user secret that lives outside the database (``UserKey``, a 0600 file in
  the user's fanfold data directory). Imported trees never get one;
- ``provider``: the provider configuration the tree runs on (JSON from
  ``fanfold.providers.description``; paths and digests, never keys).

Only a tree whose mark verifies with this user's key is ever continued (resumed, sent
to, attached); ``refusal`` says why any other is not. Someone without the key cannot
make a mark for another database's trees, nor move one between trees or databases:
the mark names both. It does not cover the events' content: whoever can write the
database file can also write the user's shell start-up files, and is out of reach of
any check made here.
"""

from __future__ import annotations

import datetime
import enum
import errno
import hashlib
import hmac
import json
import os
import secrets
import stat
import tempfile
from pathlib import Path

import attrs

from fanfold.db.errors import DatabaseError

KEY_FILE_ENV = "FANFOLD_KEY_FILE"
"""The environment variable that points at another key file (tests, several users)."""

_KEY_BYTES = 32
_MARK_DOMAIN = "fanfold-tree-mark/1"


class KeyFileError(DatabaseError):
    """The user's key file cannot be read, created, or trusted (wrong owner or mode)."""


class UntrustedTree(DatabaseError):
    """The tree was not written by this runtime on this machine (imported, copied,
    edited, or written by a fanfold without provenance marks): it is an inert record
    and may not be continued. ``reason`` says which."""

    def __init__(self, root_id: str, reason: str) -> None:
        self.root_id = root_id
        self.reason = reason
        super().__init__(f"tree {root_id}: {reason}")


class Origin(enum.StrEnum):
    """Who put a tree into the database."""

    RUNTIME = "runtime"
    """Started, or forked, by a fanfold runtime on this database."""
    IMPORTED = "imported"
    """Loaded from an export file: an inert record, never continued."""


@attrs.frozen
class TreeRecord:
    """A tree's provenance row. ``provider`` is JSON text (or None: not recorded)."""

    root_id: str
    origin: Origin
    mark: str | None = None
    provider: str | None = None
    source: str | None = None
    source_sha256: str | None = None
    imported_at: float | None = None

    COLUMNS = ("root_id", "origin", "mark", "provider", "source", "source_sha256", "imported_at")


def default_key_path() -> Path:
    """``$FANFOLD_KEY_FILE``, else ``provenance.key`` in the user's fanfold data
    directory (``$XDG_DATA_HOME/fanfold``, default ``~/.local/share/fanfold``), where
    the default database lives too."""
    explicit = os.environ.get(KEY_FILE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "fanfold" / "provenance.key"


class UserKey:
    """This user's secret for provenance marks. Its repr never shows the secret."""

    def __init__(self, secret: bytes, path: Path | None = None) -> None:
        if len(secret) < 16:
            raise KeyFileError("a provenance key needs at least 16 bytes")
        self._secret = secret
        self.path = path
        """The file it was read from (None for a key made in memory)."""

    def __repr__(self) -> str:
        return f"UserKey(path={str(self.path)!r})"

    @classmethod
    def generate(cls) -> UserKey:
        """A fresh random key held in memory only (tests, throwaway databases)."""
        return cls(secrets.token_bytes(_KEY_BYTES))

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> UserKey:
        """Read the key file (``default_key_path()`` unless given), creating it with
        mode 0600 on first use. Raises KeyFileError if it cannot be read or created,
        is not a fanfold key, or could be read or replaced by another user (a key
        someone else knows proves nothing)."""
        target = Path(path) if path is not None else default_key_path()
        try:
            return cls._read(target)
        except FileNotFoundError:
            pass
        _create(target)
        try:
            return cls._read(target)
        except FileNotFoundError:  # pragma: no cover - removed right after creation
            raise KeyFileError(f"the key file {target} disappeared while it was created") from None

    @classmethod
    def existing(cls, path: str | os.PathLike[str] | None = None) -> UserKey | None:
        """The key file if it exists and is valid, else None: never creates one (for
        commands that only read)."""
        target = Path(path) if path is not None else default_key_path()
        try:
            return cls._read(target)
        except (FileNotFoundError, KeyFileError):
            return None

    @classmethod
    def _read(cls, target: Path) -> UserKey:
        try:
            # A symlink is followed: what is checked below is the file it leads to.
            # O_NONBLOCK: a FIFO put in its place is refused below, never waited on.
            fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise KeyFileError(
                f"cannot read the key file {target}: {exc.strerror or exc} "
                f"(set {KEY_FILE_ENV} to use another one)"
            ) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise KeyFileError(f"the key file {target} is not a regular file")
            if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
                raise KeyFileError(
                    f"the key file {target} belongs to another user (uid {info.st_uid}); "
                    "fanfold trusts only a key file of its own"
                )
            if info.st_mode & 0o077:
                raise KeyFileError(
                    f"the key file {target} is readable or writable by other users "
                    f"(mode {stat.S_IMODE(info.st_mode):o}); run: chmod 600 {target}"
                )
            text = os.read(fd, 4096).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        try:
            secret = bytes.fromhex(text)
        except ValueError:
            secret = b""
        if len(secret) != _KEY_BYTES:
            raise KeyFileError(f"{target} is not a fanfold key file ({_KEY_BYTES * 2} hex digits)")
        return cls(secret, target)

    def mark(self, instance_id: str, root_id: str) -> str:
        """The provenance mark of tree ``root_id`` in database ``instance_id``."""
        message = json.dumps([_MARK_DOMAIN, instance_id, root_id], ensure_ascii=True)
        return hmac.new(self._secret, message.encode("ascii"), hashlib.sha256).hexdigest()

    def verifies(self, instance_id: str, root_id: str, mark: str | None) -> bool:
        """Whether ``mark`` is this key's mark of the tree (constant-time compare)."""
        if not isinstance(mark, str):
            return False
        return hmac.compare_digest(self.mark(instance_id, root_id), mark)


def _create(target: Path) -> None:
    """Write a new key file atomically (a complete file or none): two processes that
    create it at once end up sharing the first one's key."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, temp = tempfile.mkstemp(prefix=".provenance-key.", dir=target.parent)
    except OSError as exc:
        raise KeyFileError(
            f"cannot create the key file {target}: {exc.strerror or exc} "
            f"(set {KEY_FILE_ENV} to a writable place)"
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="ascii") as out:  # mkstemp: mode 0600
            out.write(secrets.token_bytes(_KEY_BYTES).hex() + "\n")
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(temp, target)  # fails if another process got there first
        except FileExistsError:
            pass
        except OSError as exc:
            raise KeyFileError(f"cannot create the key file {target}: {exc.strerror}") from None
    finally:
        Path(temp).unlink(missing_ok=True)
    # The link is on stable storage before any tree is marked with the key: after a
    # power loss a missing key would make every tree of the log untrusted (inert).
    try:
        folder = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise KeyFileError(
                f"cannot sync the key file's folder {target.parent}: {exc.strerror}"
            ) from None


def refusal(record: TreeRecord | None, key: UserKey, instance_id: str, root_id: str) -> str | None:
    """Why tree ``root_id`` may not be continued here, or None if its mark verifies."""
    if record is None:
        return (
            "not written by this runtime on this machine: it has no provenance record "
            "(written by a fanfold older than provenance marks, or added to the database "
            "by hand); it is an inert record: view, replay, verify or fork it"
        )
    if record.origin == Origin.IMPORTED:
        when = (
            datetime.datetime.fromtimestamp(record.imported_at).strftime("%Y-%m-%d %H:%M:%S")
            if record.imported_at is not None
            else "an unknown time"
        )
        digest = (record.source_sha256 or "unknown")[:16]
        return (
            f"imported from {record.source or 'a file'} (sha256 {digest}..., at {when}): "
            "imported trees are inert records; view, replay, verify or fork it"
        )
    if not key.verifies(instance_id, root_id, record.mark):
        where = f" ({key.path})" if key.path is not None else ""
        return (
            "not written by this runtime on this machine: its provenance mark does not "
            f"verify with this user's key{where} (a database copied from another user or "
            "machine, or edited); it is an inert record: view, replay, verify or fork it"
        )
    return None


def sha256_of_file(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of a regular file's bytes (OSError if it cannot be read, or is
    a FIFO, device or directory: opened without blocking, never waited on)."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    with open(fd, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 16), b""):
            digest.update(chunk)
    return digest.hexdigest()
