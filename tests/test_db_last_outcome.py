"""The outcome of each conversation's latest finished turn, kept by the store with the
step that ended the turn (SQLite migration 7), so that ``fanfold ls`` reads it from a
column instead of folding every root's log through the reducer (issue 36). It must be
what replay finds (``Store.last_turn``), and where the log does not hold it (older
rows, an older log opened read-only) replay still answers."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from db_scenarios import Driver, cancelled_fan_out, fan_out

from fanfold.db import Store, open_store
from fanfold.statemachine import CancelRequested, UserMessaged


def _steps() -> list[Any]:
    """A fan-out answered, then asked again and cancelled (its latest turn is the
    cancelled one); a second fan-out cancelled while its children run."""
    driver = Driver(snapshot_every=4)
    fan_out(driver, "r")
    driver.feed("r", UserMessaged("once more"))
    driver.feed("r", CancelRequested())
    cancelled_fan_out(driver, "c")
    return driver.steps


def _replayed(store: Store) -> dict[str, str | None]:
    ids = [row["id"] for row in store._query("SELECT id FROM conversations ORDER BY id")]
    turns = {cid: store.last_turn(cid) for cid in ids}
    return {cid: None if turn is None else turn.outcome.value for cid, turn in turns.items()}


def _outcomes(store: Store) -> dict[str, str | None]:
    ids = [row["id"] for row in store._query("SELECT id FROM conversations ORDER BY id")]
    return {cid: store.last_outcome(cid) for cid in ids}


def test_the_stored_outcome_is_the_one_replay_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = _steps()
    # One batch, and one step per batch: a later turn in a batch wins either way.
    for name, batches in (("one.db", [steps]), ("each.db", [[s] for s in steps])):
        path = tmp_path / name
        with Store.open(path) as store:
            for batch in batches:
                store.append(batch)
            replayed = _replayed(store)
        assert replayed["r"] == "cancelled" and replayed["c"] == "cancelled"
        assert {"completed", "failed"} <= set(replayed.values())
        with Store.open(path, read_only=True) as reader:
            column = {
                row["id"]: row["last_turn"]
                for row in reader._query("SELECT id, last_turn FROM conversations")
            }
            assert column == replayed, name  # every turn that ended is in its row

            def no_replay(self: Store, conversation_id: str) -> None:
                raise AssertionError(f"replayed {conversation_id}")

            # Read from the column: no event decoded, no reducer run.
            monkeypatch.setattr(Store, "last_turn", no_replay)
            assert _outcomes(reader) == replayed
            monkeypatch.undo()


def test_where_the_log_does_not_hold_it_replay_finds_it(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    with Store.open(path) as store:
        store.append(_steps())
        expected = _replayed(store)
    # Rows written before the migration (NULL): found by replay.
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE conversations SET last_turn = NULL WHERE id = 'r'")
    with Store.open(path, read_only=True) as reader:
        assert _outcomes(reader) == expected
    # A log an older fanfold wrote (no migration 7), opened read-only (no migration
    # applied): found by replay for every conversation.
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE conversations DROP COLUMN last_turn")
        conn.execute("DELETE FROM migrations WHERE version = 7")
    with Store.open(path, read_only=True) as reader:
        assert not reader._turns
        assert _outcomes(reader) == expected
    # Opened to write, it is migrated: the column is back, empty until a turn ends.
    with Store.open(path) as writer:
        assert writer._turns
        assert _outcomes(writer) == expected


def test_every_log_answers_the_outcome_replay_finds(log_target: str) -> None:
    """SQLite from its column, PostgreSQL (no such column) by replay: the same."""
    with open_store(log_target) as store:
        store.append(_steps())
        assert store._turns == log_target.endswith(".db")
        expected = _replayed(store)
        assert _outcomes(store) == expected
        assert expected["r"] == "cancelled"
