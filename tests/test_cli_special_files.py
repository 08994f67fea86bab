"""Issue 22, item 7: no output option writes over the provenance key file, the event
log or its companions, and no option that reads or writes a file waits on a FIFO
(``--config``, ``--script``, ``--file``, ``--system-file``, ``import``, ``trace -o``,
``export -o``, ``--json-log``, ``$FANFOLD_CONFIG``, the key file itself)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from replay_helpers import FifoReader

from fanfold.cli import cli
from fanfold.db import Store

# A hang guard: the old code blocked for ever on each of these; a pass takes about a
# second (a fresh interpreter).
HANG_GUARD = 60

SCRIPT = '{"latency": 0, "agents": [{"match": {"path": "root"}, "replies": [{"text": "ok"}]}]}'


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """A database holding one finished tree (and the test's own key file), the working
    directory a scratch folder with no configuration."""
    monkeypatch.chdir(tmp_path)
    # A key of this test's own: the old code overwrote it.
    monkeypatch.setenv("FANFOLD_KEY_FILE", str(tmp_path / "provenance.key"))
    monkeypatch.delenv("FANFOLD_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "s.json").write_text(SCRIPT)
    db = tmp_path / "log.db"
    ran = CliRunner().invoke(cli, ["run", "--no-live", "--db", str(db), "--script", "s.json", "go"])
    assert ran.exit_code == 0, ran.output
    with Store.open(db) as store:
        (root,) = store.list_roots()
    yield db, root.id


def fanfold(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own, so a hang is a failed test, not a stuck run."""
    return subprocess.run(
        [sys.executable, "-c", "from fanfold.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        env={**os.environ, **(env or {})},
    )


def key_file() -> Path:
    return Path(os.environ["FANFOLD_KEY_FILE"])


@pytest.mark.parametrize("command", ["trace", "export"])
def test_an_output_never_replaces_the_key_file(tree: tuple[Path, str], command: str) -> None:
    db, root = tree
    before = key_file().read_bytes()
    done = CliRunner().invoke(cli, [command, root, "-o", str(key_file()), "--db", str(db)])
    assert done.exit_code == 2
    assert f"is the provenance key file {key_file()}" in done.output
    assert key_file().read_bytes() == before
    # And the tree can still be continued: the key still verifies its mark.
    sent = CliRunner().invoke(
        cli, ["send", root, "again", "--no-live", "--db", str(db), "--script", "s.json"]
    )
    assert "not written by this runtime" not in sent.output


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm"])
def test_trace_never_replaces_the_log_or_its_companions(
    tree: tuple[Path, str], suffix: str
) -> None:
    db, root = tree
    target = db.with_name(db.name + suffix)
    target.touch()
    before = target.read_bytes()
    done = CliRunner().invoke(cli, ["trace", root, "-o", str(target), "--db", str(db)])
    assert done.exit_code == 2 and "writing there would destroy the log" in done.output
    assert target.read_bytes() == before


def test_json_log_never_appends_to_the_key_file(tree: tuple[Path, str]) -> None:
    db, _ = tree
    before = key_file().read_bytes()
    done = CliRunner().invoke(
        cli,
        [
            "run",
            "--no-live",
            "--db",
            str(db),
            "--script",
            "s.json",
            "--json-log",
            str(key_file()),
            "x",
        ],
    )
    assert done.exit_code == 2 and "--json-log" in done.output
    assert key_file().read_bytes() == before


@pytest.mark.parametrize(
    "args",
    [
        ("run", "--no-live", "--config", "{fifo}", "hi"),
        ("run", "--no-live", "--script", "{fifo}", "hi"),
        ("run", "--no-live", "--file", "{fifo}"),
        ("run", "--no-live", "--script", "s.json", "--system-file", "{fifo}", "hi"),
        ("run", "--no-live", "--script", "s.json", "--json-log", "{fifo}", "hi"),
        ("import", "{fifo}"),
        ("trace", "{root}", "-o", "{fifo}"),
        ("export", "{root}", "-o", "{fifo}"),
    ],
)
def test_a_fifo_is_refused_at_once(
    tree: tuple[Path, str], tmp_path: Path, args: tuple[str, ...]
) -> None:
    """Nobody on the FIFO's other end: each of these waited for ever."""
    db, root = tree
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    done = fanfold(*(a.format(fifo=fifo, root=root) for a in args), "--db", str(db))
    assert done.returncode == 2, done.stderr
    assert "FIFO" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("variable", ["FANFOLD_CONFIG", "FANFOLD_KEY_FILE"])
def test_a_fifo_named_by_a_variable_is_refused_at_once(
    tree: tuple[Path, str], tmp_path: Path, variable: str
) -> None:
    db, _ = tree
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    done = fanfold("run", "--no-live", "--db", str(db), "hi", env={variable: str(fifo)})
    assert done.returncode == 2, done.stderr
    assert "not a regular file" in done.stderr and "Traceback" not in done.stderr


def test_trace_writes_through_a_fifo_that_is_read(tree: tuple[Path, str], tmp_path: Path) -> None:
    """A FIFO with a reader (`-o >(gzip > t.gz)`) is still written, never replaced."""
    db, root = tree
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    done = fanfold("trace", root, "-o", str(fifo), "--db", str(db))
    page = reader.join()
    assert done.returncode == 0, done.stderr
    assert page.startswith("<!doctype html>")


@pytest.mark.parametrize(
    "args",
    [
        ("run", "--no-live", "--script", "s.json", "hi"),
        ("resume",),
        ("ls",),
        ("transcript", "{root}"),
        ("diff", "{root}", "{root}"),
    ],
)
def test_a_database_that_is_a_fifo_is_named_as_one(
    tree: tuple[Path, str], tmp_path: Path, args: tuple[str, ...]
) -> None:
    """``--db pipe``: `run` and `resume` said "disk I/O error (...everything up to the
    last committed step is kept)", the readers "no database file"; one line naming
    the FIFO for all."""
    _, root = tree
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    done = fanfold(*(a.format(root=root) for a in args), "--db", str(fifo))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    # One error line (`run` says which model and log it starts with first).
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert error == f"error: {fifo} is a FIFO (named pipe), not a database file"
