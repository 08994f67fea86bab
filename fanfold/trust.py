"""The files this user trusts: project files that may do what only the user's own
configuration may (send a key to a host of their choice, start a program).

A repository anyone can clone may hold a ``fanfold.toml`` (and, later, MCP server
declarations). Such a file is the project's word, not the user's: fanfold refuses
what it could abuse until the user says ``fanfold trust PATH``. The record of that
is a JSON file in the user's configuration folder
(``$FANFOLD_TRUST_FILE``, else ``$XDG_CONFIG_HOME/fanfold/trusted.json``, default
``~/.config/fanfold/trusted.json``)::

    {"version": 1,
     "trusted": [{"path": "/home/me/src/proj/fanfold.toml",
                  "sha256": "9f2c...", "trusted_at": "2026-11-27T23:40:00+00:00"}]}

A file is trusted by its resolved path and the sha256 of its bytes: a changed file
(a ``git pull``) is no longer trusted until the user trusts it again. An MCP server
whose ``command``, ``args`` or ``url`` names environment variables is trusted with
what they expanded to as well: the entry's optional ``"launches"`` maps such a
server's name to the sha256 of its expanded launch (``fanfold.mcp.config.
ServerLaunch.digest``), so a variable cannot change what runs under an earlier trust.
The key is written only when there is such a server (a record without one is read by
older fanfold versions as before). The record is
replaced atomically (a temporary file, ``fsync``, ``rename``) under an exclusive
``flock`` of a lock file beside it, so concurrent ``trust``/``revoke`` lose nothing;
a record that is not one fanfold wrote is refused (``TrustFileError``), never
guessed at or overwritten.

Public API: ``TrustStore.default()``, ``store.is_trusted(path, digest)``,
``store.trust(path)``, ``store.revoke(path)``, ``store.entries()``, and
``file_digest(data)`` for a file's bytes already read (check what you parse: read
the bytes once, hash them, parse them).
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from fanfold.regular_files import open_regular_bytes, read_regular

TRUST_FILE_ENV = "FANFOLD_TRUST_FILE"
"""The environment variable that points at another trust record (tests, CI)."""

_VERSION = 1
_MAX_RECORD_BYTES = 4 * 1024 * 1024
_MAX_TRUSTED_BYTES = 16 * 1024 * 1024


class TrustFileError(Exception):
    """The trust record cannot be read, is not one fanfold wrote, or cannot be written;
    or the file to trust cannot be read. One line, naming the file."""


@attrs.frozen
class TrustedFile:
    """One trusted file: its resolved path, the sha256 of its bytes when trusted, and
    when (ISO 8601, UTC); ``launches``: (server name, sha256 of its expanded launch)
    for each MCP server of the file whose launch names environment variables."""

    path: str
    sha256: str
    trusted_at: str
    launches: tuple[tuple[str, str], ...] = ()


def file_digest(data: bytes) -> str:
    """The hex sha256 of a file's bytes, as the trust record keeps it."""
    return hashlib.sha256(data).hexdigest()


def default_trust_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$FANFOLD_TRUST_FILE``, else ``trusted.json`` in the user's fanfold
    configuration folder (``$XDG_CONFIG_HOME/fanfold``, default ``~/.config/fanfold``),
    beside the user's own ``config.toml``."""
    env = os.environ if environ is None else environ
    explicit = env.get(TRUST_FILE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base).expanduser() / "fanfold" / "trusted.json"


def canonical(path: str | os.PathLike[str]) -> str:
    """The path a file is trusted under: absolute, symbolic links resolved."""
    return str(Path(path).expanduser().resolve())


def _hex_digest(value: Any) -> bool:
    return (
        isinstance(value, str)
        and len(value) == 64
        and all(ch in "0123456789abcdef" for ch in value)
    )


def _entry_json(entry: TrustedFile) -> dict[str, Any]:
    """An entry as the record writes it: ``launches`` only when it has any."""
    written: dict[str, Any] = {
        "path": entry.path,
        "sha256": entry.sha256,
        "trusted_at": entry.trusted_at,
    }
    if entry.launches:
        written["launches"] = dict(entry.launches)
    return written


@attrs.frozen
class TrustStore:
    """The trust record at ``path`` (see the module docstring). Reads it afresh on
    every question: another process may have changed it."""

    path: Path

    @classmethod
    def default(cls, environ: Mapping[str, str] | None = None) -> TrustStore:
        """The user's trust record (``default_trust_path``)."""
        return cls(default_trust_path(environ))

    def entries(self) -> tuple[TrustedFile, ...]:
        """Every trusted file, oldest first; TrustFileError if the record is damaged."""
        return self._read()

    def is_trusted(self, path: str | os.PathLike[str], digest: str) -> bool:
        """Whether the file at ``path`` is trusted with the content of sha256
        ``digest`` (hash the bytes you are about to use, not the file again)."""
        where = canonical(path)
        return any(e.path == where and e.sha256 == digest for e in self._read())

    def trusted_launch(self, path: str | os.PathLike[str], server: str) -> str | None:
        """The digest of MCP server ``server``'s expanded launch that ``path`` was
        trusted with (None if none was recorded)."""
        where = canonical(path)
        for entry in self._read():
            if entry.path == where:
                return dict(entry.launches).get(server)
        return None

    def trusted_digest(self, path: str | os.PathLike[str]) -> str | None:
        """The sha256 ``path`` was trusted with (None if never): tells "changed since"
        from "never trusted"."""
        where = canonical(path)
        return next((e.sha256 for e in self._read() if e.path == where), None)

    @staticmethod
    def read(path: str | os.PathLike[str]) -> bytes:
        """The bytes of a file to trust (a regular file, at most 16 MiB);
        TrustFileError if it cannot be read."""
        try:
            data = read_regular(path, limit=_MAX_TRUSTED_BYTES)
        except OSError as exc:
            raise TrustFileError(f"cannot read {path}: {exc.strerror or exc}") from None
        if len(data) > _MAX_TRUSTED_BYTES:
            raise TrustFileError(f"{path} is larger than {_MAX_TRUSTED_BYTES} bytes")
        return data

    def trust(
        self,
        path: str | os.PathLike[str],
        data: bytes | None = None,
        launches: Mapping[str, str] | None = None,
    ) -> TrustedFile:
        """Trust the file at ``path`` with the content ``data`` (default: its bytes
        now; pass the bytes you showed the user) and ``launches`` (server name: digest
        of its expanded launch, for the servers whose launch names variables),
        replacing an earlier entry of the same path. TrustFileError if it cannot be
        read (it must be a regular file) or the record cannot be written."""
        where = canonical(path)
        if data is None:
            data = self.read(where)
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        entry = TrustedFile(where, file_digest(data), now, tuple(sorted((launches or {}).items())))
        with self._locked():
            kept = [e for e in self._read() if e.path != where]
            self._write((*kept, entry))
        return entry

    def revoke(self, path: str | os.PathLike[str]) -> bool:
        """Stop trusting ``path`` (the file need not exist any more); whether it was."""
        targets = {canonical(path), os.path.abspath(os.path.expanduser(path))}
        with self._locked():
            entries = self._read()
            kept = tuple(e for e in entries if e.path not in targets)
            if len(kept) == len(entries):
                return False
            self._write(kept)
        return True

    # -------------------------------------------------------------- the record file

    def _read(self) -> tuple[TrustedFile, ...]:
        try:
            with open_regular_bytes(self.path) as handle:
                # The owner and mode of the file read, not of whatever the path names
                # a moment later: checked on the open descriptor.
                self._check_owner(os.fstat(handle.fileno()))
                data = handle.read(_MAX_RECORD_BYTES + 1)
        except FileNotFoundError:
            return ()
        except OSError as exc:
            raise TrustFileError(
                f"cannot read the trust record {self.path}: {exc.strerror or exc}"
            ) from None
        if len(data) > _MAX_RECORD_BYTES:
            raise self._malformed(f"larger than {_MAX_RECORD_BYTES} bytes")
        try:
            document = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise self._malformed(f"not JSON ({str(exc).splitlines()[0][:80]})") from None
        return self._entries(document)

    def _entries(self, document: Any) -> tuple[TrustedFile, ...]:
        if not isinstance(document, dict) or set(document) != {"version", "trusted"}:
            raise self._malformed('expected {"version": 1, "trusted": [...]}')
        if document["version"] != _VERSION:
            raise self._malformed(f"version {document['version']!r}, expected {_VERSION}")
        items = document["trusted"]
        if not isinstance(items, list):
            raise self._malformed('"trusted" is not a list')
        entries = []
        for index, item in enumerate(items):
            launches = item.get("launches", {}) if isinstance(item, dict) else None
            if (
                not isinstance(item, dict)
                or set(item) - {"launches"} != {"path", "sha256", "trusted_at"}
                or not all(isinstance(item[key], str) for key in ("path", "sha256", "trusted_at"))
                or not os.path.isabs(item["path"])
                or not _hex_digest(item["sha256"])
                or not isinstance(launches, dict)
                or not all(isinstance(k, str) and _hex_digest(v) for k, v in launches.items())
            ):
                raise self._malformed(
                    f"entry {index} is not {{path (absolute), sha256 (64 hex digits), "
                    "trusted_at, launches (optional: server name -> 64 hex digits)}"
                )
            entries.append(
                TrustedFile(
                    item["path"],
                    item["sha256"],
                    item["trusted_at"],
                    tuple(sorted(launches.items())),
                )
            )
        return tuple(entries)

    def _check_owner(self, info: os.stat_result) -> None:
        # Whoever can write the record can trust any file: it must be this user's own,
        # writable by nobody else (as the provenance key file).
        if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
            raise TrustFileError(
                f"the trust record {self.path} belongs to another user (uid {info.st_uid}); "
                "fanfold uses only a record of its own"
            )
        if info.st_mode & 0o022:
            raise TrustFileError(
                f"the trust record {self.path} is writable by other users (mode "
                f"{stat.S_IMODE(info.st_mode):o}); run: chmod 600 {self.path}"
            )

    def _malformed(self, why: str) -> TrustFileError:
        return TrustFileError(
            f"the trust record {self.path} is damaged: {why}; fix or remove it "
            f"(then trust your files again), or set {TRUST_FILE_ENV} to use another"
        )

    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(
                self.path.with_name(self.path.name + ".lock"),
                os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC,
                0o600,
            )
        except OSError as exc:
            raise TrustFileError(
                f"cannot write the trust record {self.path}: {exc.strerror or exc}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write(self, entries: tuple[TrustedFile, ...]) -> None:
        document = {"version": _VERSION, "trusted": [_entry_json(e) for e in entries]}
        text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
        temp: str | None = None
        try:
            fd, temp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as out:  # mkstemp: mode 0600
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, self.path)
            temp = None
        except OSError as exc:
            raise TrustFileError(
                f"cannot write the trust record {self.path}: {exc.strerror or exc}"
            ) from None
        finally:
            if temp is not None:
                Path(temp).unlink(missing_ok=True)
