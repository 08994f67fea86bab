"""The two fork rules of issue 34 together: a fork of a tree from elsewhere is refused
where it would start a tool call the log decided, and a fork's conversations off the
edited one's chain take their recorded results from the source. The refusal is
checked on what the fork copies, so it is narrowed to calls the source has no result
for (DESIGN, "Time travel", "With recorded futures")."""

from __future__ import annotations

from pathlib import Path

import pytest
from db_scenarios import Driver, fan_out
from replay_helpers import write

from fanfold import replay
from fanfold.db import Store
from fanfold.db.provenance import UserKey
from fanfold.replay.errors import ForkRefused
from fanfold.replay.fork import recorded_calls_that_would_run
from fanfold.statemachine import ToolCall, ToolResultMessage


def _source(tmp_path: Path, finished: int) -> tuple[Path, str, int]:
    """A log written without a mark (a tree from elsewhere): c.2 asks for three calls
    in one reply; then c.1 takes a step (the fork moment, c.2's round still at its first
    call); then c.2 finishes ``finished`` of its calls and the log ends."""
    driver = Driver()
    first, second = fan_out(driver, "c", ("result", "text"), finish=False)
    calls = [ToolCall.of(f"b{i}", "bash", {"command": f"echo {i}"}) for i in range(3)]
    driver.reply(second, "three", *calls)
    moment = driver.reply(first, "looking", ToolCall.of("a", "bash", {"command": "ls"})).seq
    for i in range(finished):
        driver.finish_tool(second, f"out {i}")
    db = tmp_path / "log.db"
    write(db, driver.steps)
    return db, first, moment


def test_a_sibling_call_the_source_finished_is_taken_not_refused(tmp_path: Path) -> None:
    db, first, moment = _source(tmp_path, finished=3)
    key = UserKey.load()
    with Store.open(db) as store:
        assert store.tree_record("c") is None  # no mark: a tree from elsewhere
        # Copied as at the moment (--rerun-siblings), c.2 would start b1 and b2 with no
        # model asked: refused, nothing written, and the refusal names the way out.
        with pytest.raises(ForkRefused) as refused:
            replay.fork(store, first, moment, new_id="r", key=key, rerun_siblings=True)
        said = str(refused.value)
        assert "has no result for: root/2 bash (b1), root/2 bash (b2)" in said
        assert "without --rerun-siblings none would run" in said
        assert [row.id for row in store.list_roots()] == ["c"]
        # By default c.2 takes its recorded future: all three results, from the log.
        fork = replay.fork(store, first, moment, new_id="f", key=key)
        assert replay.verify(store, fork, tree=True).ok
        sibling = store.load_state("f.2")
        assert recorded_calls_that_would_run(sibling) == ()
        results = [m.result.content for m in sibling.history if isinstance(m, ToolResultMessage)]
        assert results == ["out 0", "out 1", "out 2"]
        record = store.tree_record(fork)
        assert record is not None and record.provider is None  # still the user's to name


def test_a_sibling_call_the_source_has_no_result_for_still_refuses(tmp_path: Path) -> None:
    # The source's log ends after b0's result: b1 is running there, b2 never started.
    # Taking b0's result runs nothing, but b2 would start: refused either way.
    db, first, moment = _source(tmp_path, finished=1)
    key = UserKey.load()
    with Store.open(db) as store:
        with pytest.raises(ForkRefused) as refused:
            replay.fork(store, first, moment, new_id="f", key=key)
        said = str(refused.value)
        assert "has no result for: root/2 bash (b2);" in said
        assert "(b1)" not in said  # running: it gets the fork's result, never run
        assert "none would run" not in said  # --rerun-siblings refuses too (b1, b2)
        assert [row.id for row in store.list_roots()] == ["c"]
