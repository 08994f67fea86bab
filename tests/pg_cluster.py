"""A throwaway PostgreSQL cluster: ``initdb`` in a temporary folder, a server on a free
loopback port with its Unix socket in that folder, stopped and removed afterwards.

Used by the test fixture ``pg_cluster`` (``tests/conftest.py``) and by the workers'
benchmarks (``bench/bench_workers.py``, ``bench_pg_log.py``, ``bench_chunk_kill.py``).
Standard library only, so importing it needs no extra; connecting is the caller's
business (``Cluster.url`` for SQLAlchemy/DBOS, ``Cluster.conninfo`` for psycopg).

- **Binaries**: ``initdb`` and ``pg_ctl`` on ``PATH``, else the newest
  ``/usr/lib/postgresql/*/bin`` (Debian's layout, which keeps them off ``PATH``).
  ``find_binaries`` returns None where PostgreSQL is not installed; the fixture then
  skips with that message, and nothing else makes it skip.
- **Root**: ``initdb`` and ``pg_ctl`` refuse to run as root. Under root (CI runs as
  root) every server command runs as the ``postgres`` user through ``runuser``, and
  the folder is given to that user; it lives directly in the system's temporary
  directory (world-traversable), not under pytest's per-user folder (mode 0700).
- **Authentication**: one role, ``fanfold``, with a random password (scram-sha-256,
  over TCP and the socket alike): the machine is shared, and a cluster with ``trust``
  on a loopback port would be open to every local user's process.
- **Cleanup**: ``close`` stops the server (``-m immediate``: nothing in it is worth
  a checkpoint) and removes the folder. A watchdog process started first does the same
  when the process that made the cluster ends without calling ``close`` (SIGKILL
  included): it waits for end-of-file on a pipe only the owner holds, which the kernel
  closes however the owner dies, and it ignores SIGINT so that a Ctrl-C to the
  terminal's process group cannot end it before its work.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

USER = "fanfold"
DATABASE = "postgres"
# The operating-system user the server runs as when we are root.
SERVER_USER = "postgres"

# Cleans up after an owner that died: reads stdin to end-of-file, then stops the server
# (if it is running) and removes the folder. argv: folder, then the pg_ctl command.
_WATCHDOG = """
import shutil, signal, subprocess, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
folder, stop = sys.argv[1], sys.argv[2:]
while sys.stdin.buffer.read(65536):
    pass
if stop:
    subprocess.run(stop, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=60, check=False)
shutil.rmtree(folder, ignore_errors=True)
"""


class ClusterError(RuntimeError):
    """A PostgreSQL command failed; the message holds its output and the server log's end."""


@attrs.frozen
class Binaries:
    """Where ``initdb`` and ``pg_ctl`` are."""

    initdb: Path
    pg_ctl: Path


def find_binaries(
    path: str | None = None, debian_root: Path = Path("/usr/lib/postgresql")
) -> Binaries | None:
    """``initdb`` and ``pg_ctl`` on ``PATH`` (or ``path``), else the newest Debian-style
    ``<debian_root>/<version>/bin`` holding both; None if PostgreSQL is not installed."""
    initdb, pg_ctl = shutil.which("initdb", path=path), shutil.which("pg_ctl", path=path)
    if initdb and pg_ctl:
        return Binaries(Path(initdb), Path(pg_ctl))

    def version(folder: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in folder.parent.name.split(".") if part.isdigit())

    for folder in sorted(debian_root.glob("*/bin"), key=version, reverse=True):
        if os.access(folder / "initdb", os.X_OK) and os.access(folder / "pg_ctl", os.X_OK):
            return Binaries(folder / "initdb", folder / "pg_ctl")
    return None


NOT_INSTALLED = (
    "PostgreSQL is not installed (no initdb/pg_ctl on PATH or under /usr/lib/postgresql/*/bin); "
    "install it (Debian: apt-get install postgresql) to run the PostgreSQL tests"
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Cluster:
    """One throwaway cluster. ``Cluster.create()`` makes and starts it; ``close()``
    stops and removes it (also a context manager)."""

    def __init__(self, binaries: Binaries, folder: Path, *, fsync: bool) -> None:
        self.binaries = binaries
        self.folder = folder
        self.data = folder / "data"
        self.socket_dir = folder / "socket"
        self.log_file = folder / "server.log"
        self.password = secrets.token_hex(16)
        self.port = 0
        self.fsync = fsync
        self._as_server: list[str] = []
        self._watchdog: subprocess.Popen[bytes] | None = None

    @classmethod
    def create(cls, binaries: Binaries | None = None, *, fsync: bool = False) -> Cluster:
        """initdb a new cluster in a new temporary folder and start its server.

        ``fsync=False`` (the tests' default) trades crash safety of the *machine* for
        speed; a server process that is killed loses nothing either way. Raises
        ``ClusterError`` (after removing what it made) if PostgreSQL is installed but
        the cluster cannot be made or started.
        """
        found = binaries or find_binaries()
        if found is None:
            raise ClusterError(NOT_INSTALLED)
        folder = Path(tempfile.mkdtemp(prefix="fanfold-pg-"))
        cluster = cls(found, folder, fsync=fsync)
        try:
            cluster._prepare()
            cluster._initdb()
            cluster._start_on_a_free_port()
        except BaseException:
            cluster.close()
            raise
        return cluster

    # -- what clients need ----------------------------------------------------------

    @property
    def url(self) -> str:
        """``postgresql://`` URL over TCP (SQLAlchemy, DBOS)."""
        return f"postgresql://{USER}:{self.password}@127.0.0.1:{self.port}/{DATABASE}"

    def url_for(self, database: str) -> str:
        """The same URL for another database of this cluster."""
        return f"postgresql://{USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    @property
    def conninfo(self) -> str:
        """libpq connection string over the Unix socket (psycopg)."""
        return self.conninfo_for(DATABASE)

    def conninfo_for(self, database: str) -> str:
        """The same connection string for another database of this cluster."""
        return (
            f"host={self.socket_dir} port={self.port} user={USER} "
            f"password={self.password} dbname={database}"
        )

    # -- server control ---------------------------------------------------------------

    def restart(self) -> None:
        """``pg_ctl restart`` (fast shutdown: open connections are ended)."""
        self._pg_ctl("restart", "-m", "fast", "-o", self._server_options())

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop``; ``start`` brings it back on the same port."""
        self._pg_ctl("stop", "-m", mode)

    def start(self) -> None:
        """``pg_ctl start`` on the cluster's port."""
        self._pg_ctl("start", "-o", self._server_options())

    def postmaster_pid(self) -> int | None:
        """The server's process id while it runs (first line of ``postmaster.pid``)."""
        try:
            first = (self.data / "postmaster.pid").read_text().split("\n", 1)[0]
        except (FileNotFoundError, PermissionError):
            return None
        return int(first) if first.strip().isdigit() else None

    def close(self) -> None:
        """Stop the server if it runs and remove the folder; safe to call twice."""
        try:
            if self.postmaster_pid() is not None:
                subprocess.run(
                    self._immediate_stop(),
                    capture_output=True,
                    timeout=60,
                    check=False,
                )
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
            if self._watchdog is not None:
                assert self._watchdog.stdin is not None
                self._watchdog.stdin.close()
                self._watchdog.wait(timeout=60)
                self._watchdog = None

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- making it ------------------------------------------------------------------

    def _prepare(self) -> None:
        if os.geteuid() == 0:
            # initdb and pg_ctl refuse root: run them as the server user, in a folder
            # it owns (mkdtemp made it 0700, root's).
            import pwd

            try:
                account = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise ClusterError(
                    f"running as root, and there is no {SERVER_USER!r} user to run "
                    "PostgreSQL as (initdb refuses root)"
                ) from None
            os.chown(self.folder, account.pw_uid, account.pw_gid)
            self._as_server = ["runuser", "-u", SERVER_USER, "--"]
        self._watchdog = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WATCHDOG,
                str(self.folder),
                *self._immediate_stop(),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd="/",
        )
        self._run(["mkdir", "-m", "0700", str(self.socket_dir)])

    def _initdb(self) -> None:
        password_file = self.folder / "password"
        self._run(
            ["sh", "-c", 'umask 077 && cat > "$1"', "sh", str(password_file)], input=self.password
        )
        try:
            self._run(
                [
                    str(self.binaries.initdb),
                    "-D",
                    str(self.data),
                    "-U",
                    USER,
                    f"--pwfile={password_file}",
                    "--auth=scram-sha-256",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ]
            )
        finally:
            self._run(["rm", "-f", str(password_file)])

    def _start_on_a_free_port(self) -> None:
        # The port is free when asked; another process can take it before the server
        # binds it. Then the start fails and another port is tried.
        for attempt in range(5):
            self.port = free_port()
            try:
                self.start()
                return
            except ClusterError:
                if attempt == 4 or "Address already in use" not in self._log_tail():
                    raise

    def _server_options(self) -> str:
        options = [
            f"-p {self.port}",
            "-c listen_addresses=127.0.0.1",
            f"-c unix_socket_directories={self.socket_dir}",
            "-c max_connections=200",
            "-c shared_buffers=32MB",
        ]
        if not self.fsync:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        return " ".join(options)

    def _pg_ctl(self, action: str, *args: str) -> None:
        self._run(
            [
                str(self.binaries.pg_ctl),
                action,
                "-D",
                str(self.data),
                "-l",
                str(self.log_file),
                "-w",
                "-t",
                "60",
                *args,
            ]
        )

    def _immediate_stop(self) -> list[str]:
        # -m immediate: nothing in a throwaway cluster is worth a shutdown checkpoint.
        pg_ctl = str(self.binaries.pg_ctl)
        return [*self._as_server, pg_ctl, "stop", "-D", str(self.data), "-m", "immediate", "-w"]

    def _run(self, argv: Sequence[str], *, input: str | None = None) -> None:
        command = [*self._as_server, *argv]
        done = subprocess.run(
            command,
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            # pg_ctl's server inherits the working directory: one the server user can
            # enter, whatever ours is.
            cwd=self.folder,
        )
        if done.returncode != 0:
            raise ClusterError(
                f"{' '.join(argv[:2])} failed ({done.returncode}): "
                f"{(done.stdout + done.stderr).strip()}\n--- server log ---\n{self._log_tail()}"
            )

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return "(no server log)"


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (an exited server whose new
    parent, after ``pg_ctl`` exited, has not reaped it yet is gone for our purposes)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    # The state follows the command name in parentheses, which may itself hold spaces.
    return stat[stat.rindex(")") + 2 :].split(" ", 1)[0] not in ("Z", "X")


def wait_gone(pid: int, timeout: float = 30.0) -> bool:
    """Wait until process ``pid`` is gone (see ``alive``); True if it went in time."""
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
