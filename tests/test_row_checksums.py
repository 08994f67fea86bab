"""Damage that still decodes is damage, not a divergence (issue 10.8): every events
row, effects row (logs written before the events-only log) and snapshot carries a
checksum that readers check.

A real log (a root, a sub-agent, a bash call) is written by ``fanfold run``. Copies
get single-bit edits that leave printable ASCII ('a' -> 'c'), so that the text still
decodes and often still replays: through SQLite (one character of a stored text
rewritten, checksum untouched) and in the raw file (one bit flipped inside a payload).
``fanfold replay ROOT --verify --tree`` must exit 2 for every one, never 1 or 0.
A reducer that really disagrees with an intact log stays exit 1
(``test_replay_cli.py::test_verify_divergence_exits_1_with_a_diff_and_the_seq``).
"""

from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from replay_helpers import as_format_5, one_child_log

from fanfold.cli import cli
from fanfold.db import ReplayError, Store
from fanfold.replay import verify

# (table, column) of every stored text replay reads, and how many seeded edits each.
TEXTS = {
    ("events", "payload"): 40,
    ("events", "fingerprint"): 6,
    ("events", "type"): 4,
    ("effects", "payload"): 20,
    ("conversations", "snapshot_json"): 8,
}
RAW_FLIPS = 40


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    db, root, _ = one_child_log(tmp_path_factory.mktemp("checksums"))
    return db, root


def _verify(db: Path, root: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["replay", root, "--verify", "--tree", "--db", str(db)])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    return result.exit_code, result.output


def _flip_one_bit(text: str, rng: random.Random) -> str:
    """``text`` with one bit of one character flipped, still printable ASCII."""
    while True:
        index = rng.randrange(len(text))
        flipped = ord(text[index]) ^ (1 << rng.randrange(7))
        if 0x20 <= flipped < 0x7F:
            return text[:index] + chr(flipped) + text[index + 1 :]


def _edits() -> list[tuple[str, str, int]]:
    rng = random.Random(1008)
    return [
        (table, column, rng.randrange(1 << 30))
        for (table, column), count in TEXTS.items()
        for _ in range(count)
    ]


def test_an_untouched_log_verifies(original: tuple[Path, str]) -> None:
    db, root = original
    code, output = _verify(db, root)
    assert code == 0, output


@pytest.mark.parametrize(("table", "column", "seed"), _edits())
def test_a_text_edited_through_sqlite_is_damage(
    tmp_path: Path, original: tuple[Path, str], table: str, column: str, seed: int
) -> None:
    source, root = original
    db = tmp_path / "copy.db"
    shutil.copyfile(source, db)
    if table == "effects":
        as_format_5(db)  # the events-only log has no effect rows; older logs do
    rng = random.Random(seed)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        rows = conn.execute(
            f"SELECT rowid, {column} FROM {table} WHERE {column} IS NOT NULL ORDER BY rowid"
        ).fetchall()
        rowid, text = rows[rng.randrange(len(rows))]
        edited = _flip_one_bit(text, rng)
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", [edited, rowid])
    finally:
        conn.close()
    code, output = _verify(db, root)
    assert code == 2, (table, column, rowid, text, edited, output)
    assert "the log is damaged" in output


def _raw_flips() -> list[int]:
    rng = random.Random(2008)
    return [rng.randrange(1 << 30) for _ in range(RAW_FLIPS)]


@pytest.mark.parametrize("seed", _raw_flips())
def test_a_bit_flipped_in_a_payload_on_disk_is_damage(
    tmp_path: Path, original: tuple[Path, str], seed: int
) -> None:
    source, root = original
    with Store.open(source, read_only=True) as store:
        payloads = [
            row["payload"] for row in store._query("SELECT payload FROM events ORDER BY rowid")
        ]
    data = bytearray(source.read_bytes())
    rng = random.Random(seed)
    # A payload stored once in the file (not one that also sits in a freed page or
    # another row), so the flip is known to land in the live row.
    candidates = [p for p in payloads if data.count(p.encode()) == 1]
    assert len(candidates) >= len(payloads) // 2
    payload = candidates[rng.randrange(len(candidates))]
    edited = _flip_one_bit(payload, rng)
    start = data.find(payload.encode())
    data[start : start + len(payload)] = edited.encode()
    db = tmp_path / "copy.db"
    db.write_bytes(bytes(data))
    with Store.open(db, read_only=True) as store:
        stored = [row["payload"] for row in store._query("SELECT payload FROM events")]
    assert edited in stored and payload not in stored  # the live row changed
    code, output = _verify(db, root)
    assert code == 2, (payload, edited, output)
    assert "does not match its checksum" in output


def test_load_state_refuses_a_damaged_row_naming_it(
    tmp_path: Path, original: tuple[Path, str]
) -> None:
    source, root = original
    db = tmp_path / "copy.db"
    shutil.copyfile(source, db)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        # The last event: load_state reads it (the snapshot is taken at rest, with it).
        seq, text = conn.execute(
            "SELECT seq, payload FROM events WHERE conversation_id = ? ORDER BY seq DESC",
            [root],
        ).fetchone()
        edited = _flip_one_bit(text, random.Random(7))
        conn.execute(
            "UPDATE events SET payload = ? WHERE conversation_id = ? AND seq = ?",
            [edited, root, seq],
        )
    finally:
        conn.close()
    with Store.open(db, read_only=True) as store:
        damaged = rf"conversation '{root}', event {seq}: the row is damaged"
        with pytest.raises(ReplayError, match=damaged):
            store.load_state(root, verify=False)
        with pytest.raises(ReplayError, match=damaged):
            store.events(root)
        report = verify(store, root, tree=True)
    assert report.corrupt and report.first_divergence is None


def test_a_log_without_checksums_is_read_unchecked(
    tmp_path: Path, original: tuple[Path, str]
) -> None:
    """A log written before migration 3: a read-only open reads it without checking;
    a read-write open migrates it, and its old rows (NULL) stay unchecked."""
    source, root = original
    db = tmp_path / "old.db"
    shutil.copyfile(source, db)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("DELETE FROM migrations WHERE version = 3")
        conn.execute("ALTER TABLE events DROP COLUMN checksum")
        conn.execute("ALTER TABLE effects DROP COLUMN checksum")
        conn.execute("ALTER TABLE conversations DROP COLUMN snapshot_checksum")
    finally:
        conn.close()
    with Store.open(db, read_only=True) as store:
        assert store.read_only
        assert verify(store, root, tree=True).ok
        store.load_state(root)
    assert _verify(db, root)[0] == 0
    with Store.open(db) as store:  # migrates
        assert {r["checksum"] for r in store._query("SELECT checksum FROM events")} == {None}
        assert verify(store, root, tree=True).ok


def test_load_state_refuses_a_damaged_snapshot(tmp_path: Path, original: tuple[Path, str]) -> None:
    source, root = original
    db = tmp_path / "copy.db"
    shutil.copyfile(source, db)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        seq, text = conn.execute(
            "SELECT snapshot_seq, snapshot_json FROM conversations WHERE id = ?", [root]
        ).fetchone()
        conn.execute(
            "UPDATE conversations SET snapshot_json = ? WHERE id = ?",
            [_flip_one_bit(text, random.Random(8)), root],
        )
    finally:
        conn.close()
    with (
        Store.open(db, read_only=True) as store,
        pytest.raises(
            ReplayError, match=rf"conversation '{root}': the snapshot after event {seq} is damaged"
        ),
    ):
        store.load_state(root)


@pytest.mark.parametrize(
    ("table", "column"),
    [("events", "payload"), ("effects", "payload"), ("conversations", "snapshot_json")],
)
def test_a_damaged_row_is_not_exported(
    tmp_path: Path, original: tuple[Path, str], table: str, column: str
) -> None:
    """Import writes fresh checksums: exporting a damaged row would turn the damage into
    a divergence (or nothing) in the imported copy. Export refuses it instead."""
    source, root = original
    db = tmp_path / "copy.db"
    shutil.copyfile(source, db)
    if table == "effects":
        as_format_5(db)  # the events-only log has no effect rows; older logs do
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        rowid, text = conn.execute(
            f"SELECT rowid, {column} FROM {table} WHERE {column} IS NOT NULL ORDER BY rowid DESC"
        ).fetchone()
        edited = _flip_one_bit(text, random.Random(9))
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", [edited, rowid])
    finally:
        conn.close()
    result = CliRunner().invoke(cli, ["export", root, "--db", str(db)])
    assert result.exit_code == 2, result.output
    assert "damaged" in result.output and "cannot export it" in result.output
    assert CliRunner().invoke(cli, ["export", root, "--db", str(source)]).exit_code == 0
