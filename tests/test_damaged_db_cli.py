"""Every command on a damaged database file: success, or one clear line with a typed
exit code, never a traceback (issue 10.8).

A real log (a root, a sub-agent, a bash call) is written by ``fanfold run``, then
copies of it are damaged at positions chosen by a seeded generator: bytes flipped
(XOR 0xFF) and the file truncated. Every command is run on each copy.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from click.testing import CliRunner
from replay_helpers import one_child_log

from fanfold.cli import cli

FLIPS = 26
TRUNCATIONS = 6
# Exit codes: 0 success; 1 a finding the command reports as its result (verify: a
# divergence; resume: a tree left); 2 one-line error (damage included).
ALLOWED = {0, 1, 2}


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    return one_child_log(tmp_path_factory.mktemp("damaged"))


def _damages() -> list[tuple[str, int]]:
    rng = random.Random(108)
    return [("flip", rng.randrange(1 << 30)) for _ in range(FLIPS)] + [
        ("truncate", rng.randrange(1 << 30)) for _ in range(TRUNCATIONS)
    ]


def _commands(root: str, script: Path) -> list[list[str]]:
    return [
        ["ls"],
        ["show", root],
        ["replay", root, "--verify", "--tree"],
        ["replay", root, "--step"],
        ["export", root],
        ["fork", root, "--at", "1"],
        ["run", "--script", str(script), "--no-live", "again"],
        ["send", root, "more", "--script", str(script), "--no-live"],
        ["resume", "--script", str(script)],
    ]


@pytest.mark.parametrize(("how", "where"), _damages())
def test_every_command_on_a_damaged_file_is_clean(
    tmp_path: Path, original: tuple[Path, str, Path], how: str, where: int
) -> None:
    source, root, script = original
    data = bytearray(source.read_bytes())
    position = where % len(data)
    if how == "flip":
        data[position] ^= 0xFF
    else:
        data = data[:position]
    for command in _commands(root, script):
        db = tmp_path / "copy.db"
        for leftover in tmp_path.glob("copy.db*"):
            leftover.unlink()
        db.write_bytes(bytes(data))
        result = CliRunner().invoke(cli, [*command, "--db", str(db)])
        what = f"{command[0]} after {how} at {position}"
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            what,
            repr(result.exception),
        )
        assert "Traceback" not in result.output, what
        assert result.exit_code in ALLOWED, (what, result.exit_code, result.output)
        if command[0] == "replay" and command[2] == "--verify":
            # The codec writes ASCII only, so a flipped byte (XOR 0xFF) in any stored
            # text is damage SQLite or the codec notices: never called a divergence.
            assert result.exit_code in (0, 2), (what, result.output)
        if result.exit_code == 2:
            errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
            assert len(errors) >= 1, (what, result.output)
            assert all(len(line) < 1000 for line in errors), (what, "an error line too long")


def test_an_empty_file_is_an_empty_log_left_untouched(tmp_path: Path) -> None:
    """A run killed in its first milliseconds leaves an empty SQLite file. Reading it
    is not an error to `ls` (no conversations, said as such), a clear one to `show`,
    the file stays as it was, and the next `run` sets it up (found by issue 10's kill
    -9 campaign: it used to be "not a fanfold log")."""
    db = tmp_path / "empty.db"
    db.touch()
    runner = CliRunner()
    listed = runner.invoke(cli, ["ls", "--db", str(db)])
    assert listed.exit_code == 0, listed.output
    assert "empty log" in listed.output and "Traceback" not in listed.output
    shown = runner.invoke(cli, ["show", "abc", "--db", str(db)])
    assert shown.exit_code == 2
    assert "is an empty log: nothing was recorded in it" in shown.output
    assert db.stat().st_size == 0
    ran = runner.invoke(cli, ["run", "--no-live", "--db", str(db), "Review this repository"])
    assert ran.exit_code == 0, ran.output
    assert runner.invoke(cli, ["ls", "--db", str(db)]).output.count("idle") == 1


def test_a_log_missing_a_table_or_unreadable_says_it_is_damaged(
    tmp_path: Path, original: tuple[Path, str, Path]
) -> None:
    """`replay`, `export` and `trace` on a log whose tables were changed by hand, or
    whose pages are garbage, once gave SQLite's bare words ("error: no such table:
    effects", "error: database disk image is malformed"), or called a missing table
    a failed write with "everything up to the last committed step is kept"."""
    import sqlite3

    source, root, _ = original
    dropped = tmp_path / "dropped.db"
    dropped.write_bytes(source.read_bytes())
    with sqlite3.connect(dropped) as connection:
        connection.execute("DROP TABLE effects")
    connection.close()
    garbled = tmp_path / "garbled.db"
    data = bytearray(source.read_bytes())
    half = len(data) // 2  # rows and indexes, past the schema in the first pages
    data[half:] = b"A" * (len(data) - half)
    garbled.write_bytes(bytes(data))
    commands = [
        ["replay", root, "--verify", "--tree"],
        ["export", root, "-o", str(tmp_path / "out.jsonl")],
        ["trace", root, "-o", str(tmp_path / "out.html")],
    ]
    for db, words in ((dropped, "no such table: effects"), (garbled, "malformed")):
        for command in commands:
            result = CliRunner().invoke(cli, [*command, "--db", str(db)])
            what = (command[0], db.name, result.output)
            assert result.exit_code == 2, what
            assert result.output.startswith("error: the event log"), what
            assert "is damaged: " in result.output and words in result.output, what
            assert "committed step" not in result.output, what
            assert len(result.output.strip().splitlines()) == 1, what


def test_a_read_that_fails_during_verify_is_an_io_error_not_damage(
    tmp_path: Path, original: tuple[Path, str, Path]
) -> None:
    """Issue 32.14: one read of the log failing with EIO (strace fault injection)
    while ``replay --verify`` reads it was reported as "the event log is damaged:
    database disk image is malformed". The file is sound: the error says a read
    failed."""
    import shutil
    import subprocess
    import sys

    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (Debian's package; .ci/run installs it)")
    source, root, _ = original
    db = tmp_path / "log.db"
    db.write_bytes(source.read_bytes())
    fanfold = [sys.executable, "-c", "from fanfold.cli import main; main()"]
    verify = [*fanfold, "replay", root, "--verify", "--tree", "--db", str(db)]
    reads = tmp_path / "reads.txt"
    traced = [strace, "-f", "--seccomp-bpf", "-qq", "-P", str(db), "-e", "trace=pread64"]
    counted = subprocess.run([*traced, "-o", str(reads), *verify], capture_output=True, text=True)
    assert counted.returncode == 0, counted.stdout + counted.stderr
    count = len(reads.read_text().splitlines())
    assert count >= 8, count  # opening the log takes the first few reads
    # One failed read among the rows verify reads, past the opening's.
    failing = f"inject=pread64:error=EIO:when={count - 2}"
    done = subprocess.run(
        [*traced, "-o", "/dev/null", "-e", failing, *verify], capture_output=True, text=True
    )
    assert (done.returncode, "Traceback" in done.stderr) == (2, False), done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: an I/O error reading {db}"), line
    assert "damaged" not in line.replace("not damaged", ""), line


def test_a_row_that_is_not_utf8_is_named_as_such(
    tmp_path: Path, original: tuple[Path, str, Path]
) -> None:
    """Issue 32.14: a row whose text is not UTF-8 (changed outside fanfold) was "the
    event log could not be written or read ... everything up to the last committed
    step is kept", a failed read or write; it is damage, named as such."""
    import sqlite3

    source, root, _ = original
    db = tmp_path / "log.db"
    db.write_bytes(source.read_bytes())
    with sqlite3.connect(db) as connection:
        changed = connection.execute(
            "UPDATE events SET payload = CAST(X'5b362c22ff22' AS TEXT) "
            "WHERE conversation_id = ? AND seq = 1",
            (root,),
        ).rowcount
    connection.close()
    assert changed == 1
    result = CliRunner().invoke(cli, ["replay", root, "--verify", "--tree", "--db", str(db)])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(
        f"error: the event log {db} is damaged: a row holds text that is not UTF-8"
    )
    assert "'payload'" in line and "committed step" not in line, line
