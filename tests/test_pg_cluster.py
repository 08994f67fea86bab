"""The throwaway PostgreSQL cluster of the tests (``tests/pg_cluster.py``): it serves
connections, keeps committed data across a server restart, and leaves neither a
process nor a file behind, also when the process that made it is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from pg_cluster import NOT_INSTALLED, Binaries, Cluster, find_binaries, wait_gone

# Clusters of their own (the fixture's tests skip through the fixture).
needs_postgres = pytest.mark.skipif(find_binaries() is None, reason=NOT_INSTALLED)


def _psycopg() -> Any:
    return pytest.importorskip(
        "psycopg", reason="the PostgreSQL tests need the postgres extra: pip install '.[postgres]'"
    )


@pytest.mark.slow
def test_data_committed_before_a_restart_is_there_after_it(pg_cluster: Cluster) -> None:
    psycopg = _psycopg()
    with psycopg.connect(pg_cluster.conninfo, autocommit=True) as connection:
        connection.execute("DROP TABLE IF EXISTS survivors")
        connection.execute("CREATE TABLE survivors (id integer PRIMARY KEY, name text)")
        connection.execute("INSERT INTO survivors VALUES (1, 'one'), (2, 'two')")
        server_before = connection.execute("SELECT pg_backend_pid()").fetchone()
    pid_before = pg_cluster.postmaster_pid()

    pg_cluster.restart()

    assert pg_cluster.postmaster_pid() not in (None, pid_before)  # a new server
    with psycopg.connect(pg_cluster.conninfo) as connection:
        rows = connection.execute("SELECT id, name FROM survivors ORDER BY id").fetchall()
        assert connection.execute("SELECT pg_backend_pid()").fetchone() != server_before
    assert rows == [(1, "one"), (2, "two")]


@pytest.mark.slow
def test_the_server_listens_on_loopback_tcp_with_a_password(pg_cluster: Cluster) -> None:
    psycopg = _psycopg()
    tcp = f"host=127.0.0.1 port={pg_cluster.port} user=fanfold dbname=postgres"
    with psycopg.connect(tcp + f" password={pg_cluster.password}") as connection:
        assert connection.execute("SELECT inet_server_addr()::text").fetchone() == ("127.0.0.1/32",)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(tcp + " password=wrong").close()


@pytest.mark.slow
@needs_postgres
def test_close_stops_the_server_and_removes_the_folder() -> None:
    cluster = Cluster.create()
    pid = cluster.postmaster_pid()
    assert pid is not None and cluster.folder.is_dir()

    cluster.close()

    assert wait_gone(pid), f"postmaster {pid} still runs"
    assert not cluster.folder.exists()


@pytest.mark.slow
@needs_postgres
def test_a_killed_owner_leaves_no_server_and_no_folder(tmp_path: Path) -> None:
    """The watchdog stops the server and removes the folder when the process that
    made the cluster dies by SIGKILL, without running any cleanup of its own."""
    tests = Path(__file__).parent
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                sys.path.insert(0, {str(tests)!r})
                from pg_cluster import Cluster
                cluster = Cluster.create()
                print(cluster.postmaster_pid(), cluster.folder, flush=True)
                time.sleep(600)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline().split()
        assert len(line) == 2, f"the owner printed {line!r}"
        pid, folder = int(line[0]), Path(line[1])
        os.kill(pid, 0)  # the server runs
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)

        # The watchdog stops the server, then removes the folder. (Without the stop the
        # server would notice its removed postmaster.pid only at its next minutely check.)
        for _ in range(600):
            if not folder.exists():
                break
            time.sleep(0.1)
        assert not folder.exists(), f"{folder} survived its owner"
        assert wait_gone(pid, timeout=5), f"postmaster {pid} survived its owner"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def _programs(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    return folder


def test_the_binaries_are_found_on_path_first_then_in_the_newest_debian_folder(
    tmp_path: Path,
) -> None:
    debian = tmp_path / "lib"
    _programs(debian / "9.6" / "bin", "initdb", "pg_ctl")
    _programs(debian / "15" / "bin", "initdb", "pg_ctl")
    _programs(debian / "16" / "bin", "initdb")  # no pg_ctl: not usable
    empty = _programs(tmp_path / "empty")
    assert find_binaries(path=str(empty), debian_root=debian) == Binaries(
        debian / "15" / "bin" / "initdb", debian / "15" / "bin" / "pg_ctl"
    )
    on_path = _programs(tmp_path / "usr-bin", "initdb", "pg_ctl")
    assert find_binaries(path=f"{empty}:{on_path}", debian_root=debian) == Binaries(
        on_path / "initdb", on_path / "pg_ctl"
    )
    # Neither: PostgreSQL is not installed, and the fixture skips with NOT_INSTALLED.
    assert find_binaries(path=str(empty), debian_root=tmp_path / "nothing") is None
