"""The files this user trusts: project files that may do what only the user's own
configuration may (send a key to a host of their choice, start a program).

A repository anyone can clone may hold a ``fanfold.toml`` (and, later, MCP server
declarations). Such a file is the project's word, not the user's: fanfold refuses
what it could abuse until the user says ``fanfold trust PATH``. The record of that
is a JSON file in the user's configuration folder
(``$FANFOLD_TRUST_FILE``, else ``$XDG_CONFIG_HOME/fanfold/trusted.json``, default
``~/.config/fanfold/trusted.json``)::

    {"version": 2,
     "trusted": [{"path": "/home/me/src/proj/.mcp.json",
                  "target": "/home/me/src/proj/.mcp.json",
                  "sha256": "9f2c...", "trusted_at": "2026-11-27T23:40:00+00:00",
                  "runs": {"/home/me/src/proj/srv.py": "41ab..."}}]}

A file is trusted by where it is found, where it leads, and the sha256 of its bytes:

- ``path``: the file as found in the folder that uses it (``found_path``): that
  folder (the project: the file's folder, or the one holding ``.claude/agents`` or
  ``.fanfold/agents`` for an agent file) with every symbolic link resolved, then the
  file's own path inside it *as it is*. A ``.mcp.json`` that is a link to a trusted
  ``../good/.mcp.json`` is its own file, found in another project, and not trusted
  (issue 32, item 4: a cloned repository's link to a neighbour's trusted file ran the
  clone's own ``srv.py``);
- ``target``: the same file with every link resolved (``canonical``): a link the user
  trusted is trusted only while it leads where it led;
- ``runs``: the files the declared MCP servers' commands run relative to the project
  (``python srv.py``: ``srv.py``; see ``fanfold.mcp.config.run_files``), each with
  its sha256: a server whose program changed, or was never seen, is not trusted.

A changed file (a ``git pull``) is no longer trusted until the user trusts it again.
An MCP server whose ``command``, ``args`` or ``url`` names environment variables is
trusted with what they expanded to as well: the entry's optional ``"launches"`` maps
such a server's name to the sha256 of its expanded launch (``fanfold.mcp.config.
ServerLaunch.digest``), so a variable cannot change what runs under an earlier trust.
Version 1 records (``path`` resolved, no ``target`` or ``runs``) are still read: such
an entry trusts no file its servers run. The record is
replaced atomically (a temporary file, ``fsync``, ``rename``) under an exclusive
``flock`` of a lock file beside it, so concurrent ``trust``/``revoke`` lose nothing;
a record that is not one fanfold wrote is refused (``TrustFileError``), never
guessed at or overwritten.

Public API: ``TrustStore.default()``, ``store.is_trusted(path, digest)``,
``store.entry(path, digest)``, ``store.trust(path)``, ``store.revoke(path)``,
``store.entries()``, ``found_path(path)``, ``project_folder(path)``, and
``file_digest(data)`` for a file's bytes already read (check what you parse: read
the bytes once, hash them, parse them).
"""

from __future__ import annotations

import datetime
import errno
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

_VERSION = 2
_READABLE_VERSIONS = (1, 2)
_MAX_RECORD_BYTES = 4 * 1024 * 1024
_MAX_TRUSTED_BYTES = 16 * 1024 * 1024


class TrustFileError(Exception):
    """The trust record cannot be read, is not one fanfold wrote, or cannot be written;
    or the file to trust cannot be read. One line, naming the file."""


@attrs.frozen
class TrustedFile:
    """One trusted file: its path as found (``found_path``), the sha256 of its bytes
    when trusted, when (ISO 8601, UTC), the path it led to (``canonical``), and the
    files its servers run with their sha256 (None: not recorded, a version 1 entry);
    ``launches``: (server name, sha256 of its expanded launch) for each MCP server of
    the file whose launch names environment variables."""

    path: str
    sha256: str
    trusted_at: str
    target: str = ""
    runs: tuple[tuple[str, str], ...] | None = ()
    launches: tuple[tuple[str, str], ...] = ()

    def runs_trusted(self, files: dict[str, str]) -> bool:
        """Whether each of ``files`` (path -> sha256 now) was trusted with these bytes."""
        if not files:
            return True
        if self.runs is None:
            return False
        recorded = dict(self.runs)
        return all(recorded.get(path) == digest for path, digest in files.items())


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
    """Where a file leads: absolute, every symbolic link resolved."""
    return str(Path(path).expanduser().resolve())


_AGENT_FOLDERS = (".claude", ".fanfold")


def project_folder(path: str | os.PathLike[str]) -> Path:
    """The folder that uses a project file (absolute, links not resolved): the file's
    own folder, or for an agent file in ``.claude/agents`` or ``.fanfold/agents`` the
    folder holding those (where ``fanfold run`` finds them and its servers start)."""
    file = Path(os.path.abspath(os.path.expanduser(path)))
    folder = file.parent
    if folder.name == "agents" and folder.parent.name in _AGENT_FOLDERS:
        return folder.parent.parent
    return folder


def found_path(path: str | os.PathLike[str]) -> str:
    """The path a file is trusted under: the folder that uses it
    (``project_folder``) with every symbolic link resolved, then the file's own path
    inside that folder as it is (a link there is not followed: it is another file)."""
    file = Path(os.path.abspath(os.path.expanduser(path)))
    folder = project_folder(file)
    return str(Path(os.path.realpath(folder)) / file.relative_to(folder))


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
        ``digest`` (hash the bytes you are about to use, not the file again): found
        there, leading where it led, with these bytes."""
        return self.entry(path, digest) is not None

    def entry(self, path: str | os.PathLike[str], digest: str) -> TrustedFile | None:
        """The entry that trusts the file at ``path`` with the content of sha256
        ``digest`` (None if none does): its ``runs`` say which files its servers may
        run."""
        where, target = found_path(path), canonical(path)
        return next(
            (
                e
                for e in self._read()
                if e.path == where and e.target == target and e.sha256 == digest
            ),
            None,
        )

    def trusted_launch(self, path: str | os.PathLike[str], server: str) -> str | None:
        """The digest of MCP server ``server``'s expanded launch that ``path`` was
        trusted with (None if none was recorded)."""
        where = found_path(path)
        for entry in self._read():
            if entry.path == where:
                return dict(entry.launches).get(server)
        return None

    def trusted_digest(self, path: str | os.PathLike[str]) -> str | None:
        """The sha256 ``path`` was trusted with (None if never): tells "changed since"
        from "never trusted"."""
        where = found_path(path)
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
        runs: dict[str, str] | None = None,
        launches: Mapping[str, str] | None = None,
    ) -> TrustedFile:
        """Trust the file at ``path`` with the content ``data`` (default: its bytes
        now; pass the bytes you showed the user), as found there and leading where it
        leads now, ``runs`` (path -> sha256: the files its servers run) and
        ``launches`` (server name -> digest of its expanded launch, for the servers
        whose launch names variables), replacing an earlier entry of the same path.
        TrustFileError if it cannot be read (it must be a regular file) or the record
        cannot be written."""
        where, target = found_path(path), canonical(path)
        if data is None:
            data = self.read(target)
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        entry = TrustedFile(
            where,
            file_digest(data),
            now,
            target,
            tuple(sorted((runs or {}).items())),
            tuple(sorted((launches or {}).items())),
        )
        with self._locked():
            kept = [e for e in self._read() if e.path != where]
            self._write((*kept, entry))
        return entry

    def revoke(self, path: str | os.PathLike[str]) -> bool:
        """Stop trusting ``path`` (the file need not exist any more); whether it was."""
        targets = {
            found_path(path),
            canonical(path),
            os.path.abspath(os.path.expanduser(path)),
        }
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
            raise self._malformed('expected {"version": 2, "trusted": [...]}')
        version = document["version"]
        if version not in _READABLE_VERSIONS:
            raise self._malformed(f"version {version!r}, expected {_VERSION}")
        items = document["trusted"]
        if not isinstance(items, list):
            raise self._malformed('"trusted" is not a list')
        keys = {"path", "sha256", "trusted_at"}
        if version == 2:
            keys |= {"target", "runs"}
        entries = []
        for index, item in enumerate(items):
            launches = item.get("launches", {}) if isinstance(item, dict) else None
            if (
                not isinstance(item, dict)
                or set(item) - {"launches"} != keys
                or not isinstance(launches, dict)
                or not all(isinstance(k, str) and _is_digest(v) for k, v in launches.items())
                or not all(isinstance(item[k], str) for k in keys - {"runs"})
                or not os.path.isabs(item["path"])
                or not _is_digest(item["sha256"])
                or (version == 2 and not os.path.isabs(item["target"]))
                or (version == 2 and not _is_runs(item["runs"]))
            ):
                raise self._malformed(
                    f"entry {index} is not {{path, target (absolute), sha256 (64 hex "
                    "digits), trusted_at, runs (null or {path: sha256}), launches "
                    "(optional: {server name: sha256})}"
                )
            if version == 1:
                # Version 1 kept the resolved path and nothing of what servers run.
                entries.append(
                    TrustedFile(
                        item["path"],
                        item["sha256"],
                        item["trusted_at"],
                        item["path"],
                        None,
                        tuple(sorted(launches.items())),
                    )
                )
                continue
            runs = item["runs"]
            entries.append(
                TrustedFile(
                    item["path"],
                    item["sha256"],
                    item["trusted_at"],
                    item["target"],
                    None if runs is None else tuple(sorted(runs.items())),
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
        document = {
            "version": _VERSION,
            "trusted": [
                {
                    "path": e.path,
                    "target": e.target,
                    "sha256": e.sha256,
                    "trusted_at": e.trusted_at,
                    "runs": None if e.runs is None else dict(e.runs),
                    # only when there is a server whose launch names variables
                    **({"launches": dict(e.launches)} if e.launches else {}),
                }
                for e in entries
            ],
        }
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
            # The rename is on stable storage before `fanfold trust` says it is done:
            # after a power loss the record would otherwise be the old one (a grant or
            # a revocation lost).
            folder = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
                    raise
            finally:
                os.close(folder)
        except OSError as exc:
            raise TrustFileError(
                f"cannot write the trust record {self.path}: {exc.strerror or exc}"
            ) from None
        finally:
            if temp is not None:
                Path(temp).unlink(missing_ok=True)


def _is_digest(value: Any) -> bool:
    return (
        isinstance(value, str)
        and len(value) == 64
        and all(ch in "0123456789abcdef" for ch in value)
    )


def _is_runs(value: Any) -> bool:
    return value is None or (
        isinstance(value, dict)
        and all(isinstance(k, str) and os.path.isabs(k) and _is_digest(v) for k, v in value.items())
    )
