"""``fanfold.replay.verify``: generated logs replay exactly; damaged logs and changed
reducers are reported with the seq they fail at, never with an exception."""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from db_scenarios import CHILD_PLANS, Driver, cancelled_fan_out, fan_out
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from replay_helpers import ancestors, edit, reseal, trace_steps, write

from fanfold import replay, testing
from fanfold.db import SCHEMA_VERSION, Store, codec
from fanfold.replay import FindingKind, LogCorrupt, LogDiverged
from fanfold.statemachine import AbortCall, Conversation, ToolFinished

REDUCER = importlib.import_module("fanfold.statemachine.transition")


# ------------------------------------------------------------------ logs that replay


@given(
    trace=testing.event_sequences(max_steps=30),
    snapshot_every=st.none() | st.integers(1, 4),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_generated_log_replays_exactly(
    trace: testing.Trace, snapshot_every: int | None
) -> None:
    steps = trace_steps(trace, snapshot_every=snapshot_every)
    cid = trace.created.conversation_id
    with Store.memory() as store:
        store.append([*ancestors(trace.created), *steps])
        report = replay.verify(store, cid)
        assert report.ok, report.summary()
        assert report.events == len(steps)
        assert report.result(cid).final_state == trace.final() == steps[-1].state
        replayed = list(replay.steps(store, cid))
        assert [(s.seq, s.event, s.effects, s.after_state) for s in replayed] == [
            (s.seq, s.event, s.effects, s.state) for s in steps
        ]
        assert all(s.matches for s in replayed)
        for step in steps[:: max(1, len(steps) // 4)]:
            assert replay.state_at(store, cid, step.seq) == step.state


@given(
    plans=st.lists(st.sampled_from(CHILD_PLANS), min_size=1, max_size=4),
    snapshot_every=st.none() | st.integers(1, 3),
    cancelled=st.booleans(),
)
@settings(max_examples=25, deadline=None)
def test_any_tree_replays_to_every_live_state(
    plans: list[Any], snapshot_every: int | None, cancelled: bool
) -> None:
    driver = Driver(snapshot_every=snapshot_every)
    fan_out(driver, "r", plans)
    if cancelled:
        cancelled_fan_out(driver, "c")
    with Store.memory() as store:
        store.append(driver.steps)
        report = replay.verify(store, "r", tree=True)
        assert report.ok, report.summary()
        assert report.events == sum(1 for s in driver.steps if s.conversation_id[0] == "r")
        assert report.final_states() == {
            cid: state for cid, state in driver.states.items() if cid[0] == "r"
        }
        if cancelled:
            assert replay.verify(store, "c", tree=True).ok


def test_verify_of_one_conversation_leaves_its_children_out(tmp_path: Path) -> None:
    driver = Driver()
    fan_out(driver)
    write(tmp_path / "log.db", driver.steps)
    with Store.open(tmp_path / "log.db") as store:
        assert [r.conversation_id for r in replay.verify(store, "r").results] == ["r"]
        tree = replay.verify(store, "r", tree=True)
        assert [r.conversation_id for r in tree.results] == ["r", "r.1", "r.2", "r.3"]
        assert [r.conversation_id for r in replay.verify(store, "r.2", tree=True).results] == [
            "r.2"
        ]


# ------------------------------------------------------------------ damaged logs


def _fan_out_db(tmp_path: Path, *, format_5: bool = False) -> Path:
    """The root r: 0 created, 1 user, 2 spawn reply, 3..5 outcomes, 6 answer; children
    r.1 (tool), r.2 (retry), r.3 (error); snapshots every 2 steps. ``format_5``: as
    written before the events-only log (effect rows)."""
    driver = Driver(snapshot_every=2)
    fan_out(driver)
    path = tmp_path / "log.db"
    write(path, driver.steps, format_5=format_5)
    return path


def _swap(cid: str, a: int, b: int) -> list[str]:
    """Statements swapping events a and b (with their effects) of ``cid``."""
    statements = []
    for table in ("events", "effects"):
        where = f"conversation_id = '{cid}'"
        statements += [
            f"UPDATE {table} SET seq = -1 WHERE {where} AND seq = {a}",
            f"UPDATE {table} SET seq = {a} WHERE {where} AND seq = {b}",
            f"UPDATE {table} SET seq = {b} WHERE {where} AND seq = -1",
        ]
    return statements


def _copy_event(cid: str, source: int, target: int) -> list[str]:
    """Statements making event ``target`` an exact copy of event ``source``."""
    where = f"conversation_id = '{cid}'"
    return [
        f"UPDATE events SET payload = (SELECT payload FROM events WHERE {where} AND seq = "
        f"{source}), type = (SELECT type FROM events WHERE {where} AND seq = {source}) "
        f"WHERE {where} AND seq = {target}",
    ]


DAMAGE: dict[str, tuple[list[str], str, int, FindingKind, str]] = {
    # name: (statements, conversation, seq, kind, words in the message)
    "gap": (
        [
            "DELETE FROM effects WHERE conversation_id = 'r' AND seq = 3",
            "DELETE FROM events WHERE conversation_id = 'r' AND seq = 3",
        ],
        "r",
        3,
        FindingKind.MISSING_EVENT,
        "event 3 is missing",
    ),
    "truncated": (
        [
            "DELETE FROM effects WHERE conversation_id = 'r' AND seq >= 5",
            "DELETE FROM events WHERE conversation_id = 'r' AND seq >= 5",
        ],
        "r",
        5,
        FindingKind.TRUNCATED,
        "the log ends at event 4",
    ),
    "no events": (
        [
            "DELETE FROM effects WHERE conversation_id = 'r.2'",
            "DELETE FROM events WHERE conversation_id = 'r.2'",
        ],
        "r.2",
        0,
        FindingKind.TRUNCATED,
        "holds no event",
    ),
    "cut payload": (
        [
            "UPDATE events SET payload = substr(payload, 1, 30) WHERE conversation_id = 'r' "
            "AND seq = 4"
        ],
        "r",
        4,
        FindingKind.CORRUPT_PAYLOAD,
        "not valid JSON",
    ),
    "wrong type column": (
        ["UPDATE events SET type = 'TimerFired' WHERE conversation_id = 'r' AND seq = 1"],
        "r",
        1,
        FindingKind.CORRUPT_PAYLOAD,
        "stored as a TimerFired but its payload is a UserMessaged",
    ),
    "newer version": (
        [
            # Events are stored in the compact form: [version, "Type", ...].
            f"UPDATE events SET payload = '[99,' || substr(payload, {len(str(SCHEMA_VERSION)) + 3})"
            " WHERE conversation_id = 'r' AND seq = 2"
        ],
        "r",
        2,
        FindingKind.UNSUPPORTED_VERSION,
        f"schema version 99 is not supported: this fanfold reads versions 1 to {SCHEMA_VERSION}",
    ),
    "reordered": (
        _swap("r", 2, 3),
        "r",
        2,
        FindingKind.OUT_OF_ORDER,
        "after event 3",
    ),
    "duplicated": (
        _copy_event("r", 3, 4),
        "r",
        4,
        FindingKind.DUPLICATE_EVENT,
        "repeats event 3 exactly",
    ),
    "duplicated at the end": (
        [
            "INSERT INTO events SELECT conversation_id, seq + 1, type, payload, fingerprint, "
            "at, checksum FROM events WHERE conversation_id = 'r.1' AND seq = 3"
        ],
        "r.1",
        4,
        FindingKind.DUPLICATE_EVENT,
        "repeats event 3 exactly",
    ),
    "refused": (
        [
            'UPDATE events SET payload = \'{"v":1,"type":"TimerFired","timer":99}\', '
            "type = 'TimerFired' WHERE conversation_id = 'r' AND seq = 2"
        ],
        "r",
        2,
        FindingKind.REFUSED,
        "call 99 was never issued",
    ),
    "effect row missing": (
        ["DELETE FROM effects WHERE conversation_id = 'r' AND seq = 2 AND idx = 0"],
        "r",
        2,
        FindingKind.CORRUPT_PAYLOAD,
        "effect 0 of event 2 is missing",
    ),
    "corrupt effect": (
        ["UPDATE effects SET payload = '[' WHERE conversation_id = 'r' AND seq = 1"],
        "r",
        1,
        FindingKind.CORRUPT_PAYLOAD,
        "effect 0 of event 1 cannot be read",
    ),
    "corrupt snapshot": (
        ["UPDATE conversations SET snapshot_json = '{\"v\":1}' WHERE id = 'r'"],
        "r",
        6,
        FindingKind.CORRUPT_PAYLOAD,
        "the snapshot taken after event 6 cannot be read",
    ),
    "row disagrees": (
        ["UPDATE conversations SET phase = 'Error' WHERE id = 'r.3'"],
        "r.3",
        1,
        FindingKind.ROW_MISMATCH,
        "row says phase Error, the log ends in Failed",
    ),
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_damaged_logs_are_reported_with_the_seq(tmp_path: Path, name: str) -> None:
    statements, cid, seq, kind, words = DAMAGE[name]
    # Effect rows exist in logs written before the events-only log.
    path = _fan_out_db(tmp_path, format_5="effect" in name)
    edit(path, *statements)
    with Store.open(path) as store:
        report = replay.verify(store, "r", tree=True)
        assert not report.ok and report.corrupt
        (finding,) = report.findings
        assert (finding.kind, finding.conversation_id, finding.seq) == (kind, cid, seq)
        assert words in finding.message
        assert f"seq {seq}" in str(finding)
        # Every other conversation of the tree still replays.
        assert all(r.ok for r in report.results if r.conversation_id != cid)
        # Walking the history stops at the same place, with a typed error.
        with pytest.raises(LogCorrupt) as info:
            list(replay.steps(store, cid))
        assert info.value.finding == finding
        walked: list[int] = []
        with contextlib.suppress(LogCorrupt):
            walked.extend(s.seq for s in replay.steps(store, cid))
        assert all(s < seq for s in walked) or kind is FindingKind.ROW_MISMATCH


def test_a_changed_fingerprint_is_a_divergence_with_a_diff(tmp_path: Path) -> None:
    path = _fan_out_db(tmp_path)
    edit(
        path,
        "UPDATE events SET fingerprint = 'Idle n0 r0 h0 s0 p0 f0 w0' "
        "WHERE conversation_id = 'r.2' AND seq = 2",
    )
    with Store.open(path) as store:
        report = replay.verify(store, "r", tree=True)
    assert not report.ok and not report.corrupt
    divergence = report.first_divergence
    assert divergence is not None
    assert (divergence.conversation_id, divergence.seq) == ("r.2", 2)
    assert divergence.recorded_fingerprint == "Idle n0 r0 h0 s0 p0 f0 w0"
    assert divergence.recomputed_fingerprint.startswith("LlmRequesting")
    assert "phase: Idle recorded, LlmRequesting recomputed" in divergence.diff()
    assert report.result("r.2").events == 2


def _trace_db(directory: Path, trace: testing.Trace, *, format_5: bool = False) -> Path:
    path = directory / "trace.db"
    steps = [*ancestors(trace.created), *trace_steps(trace, snapshot_every=3)]
    write(path, steps, format_5=format_5)
    return path


def _damage(cid: str, kind: int, seq: int, last: int) -> list[str]:
    where = f"conversation_id = '{cid}'"
    match kind:
        case 0:
            return [
                f"DELETE FROM effects WHERE {where} AND seq = {seq}",
                f"DELETE FROM events WHERE {where} AND seq = {seq}",
            ]
        case 1:
            return [f"UPDATE events SET payload = substr(payload, 2) WHERE {where} AND seq = {seq}"]
        case 2:
            return _swap(cid, seq, last) if seq != last else _swap(cid, seq - 1, seq)
        case 3:
            return _copy_event(cid, seq - 1, seq)
        case 4:
            return [f"UPDATE events SET fingerprint = 'x' WHERE {where} AND seq = {seq}"]
    return [f"DELETE FROM effects WHERE {where} AND seq = {seq}"]


@given(
    trace=testing.event_sequences(max_steps=20),
    kind=st.integers(0, 5),
    where=st.floats(0.0, 1.0),
)
@settings(max_examples=40, deadline=None)
def test_no_damage_ever_raises(trace: testing.Trace, kind: int, where: float) -> None:
    """Whatever row is edited, verify reports (no exception), and the first problem it
    reports is at or after the edited seq."""
    last = len(trace.events)
    assume(last >= 2)
    seq = 1 + int(where * (last - 1))
    cid = trace.created.conversation_id
    with tempfile.TemporaryDirectory() as directory:
        # Kind 5 deletes effect rows: those of a log written before the events-only log.
        path = _trace_db(Path(directory), trace, format_5=kind == 5)
        edit(path, *_damage(cid, kind, seq, last))
        with Store.open(path) as store:
            report = replay.verify(store, cid)
            problems = [f.seq for f in report.findings] + [d.seq for d in report.divergences]
            assert all(p is not None and p >= min(seq, last - 1) for p in problems)
            if kind in (0, 1, 4) or (kind == 5 and trace_steps(trace)[seq].effects):
                assert not report.ok
            with contextlib.suppress(LogCorrupt):
                for _ in replay.steps(store, cid):
                    pass


# ------------------------------------------------------------------ a changed reducer


def _with_extra_abort(original: Callable[..., Any]) -> Callable[..., Any]:
    def changed(state: Conversation, event: ToolFinished) -> Any:
        after, effects = original(state, event)
        return after, (*effects, AbortCall(999))

    return changed


def _counting_one_more_round(original: Callable[..., Any]) -> Callable[..., Any]:
    def changed(state: Conversation, event: ToolFinished) -> Any:
        after, effects = original(state, event)
        return attrs.evolve(after, rounds=after.rounds + 1), effects

    return changed


def _using_more_tokens(original: Callable[..., Any]) -> Callable[..., Any]:
    def changed(state: Conversation, event: ToolFinished) -> Any:
        after, effects = original(state, event)
        return attrs.evolve(after, usage_input=after.usage_input + 1), effects

    return changed


def test_a_changed_effect_in_an_events_only_log_is_reported_at_its_seq(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The events-only log stores no effect to compare with: the recomputed effects'
    types are in the fingerprint's content digest, so an added effect is still a
    divergence at its step."""
    path = _fan_out_db(tmp_path)  # r.1 runs bash: its seq 2 is a ToolFinished
    monkeypatch.setattr(REDUCER, "_on_tool_finished", _with_extra_abort(REDUCER._on_tool_finished))
    with Store.open(path) as store:
        report = replay.verify(store, "r", tree=True)
    assert not report.ok and not report.corrupt
    divergence = report.first_divergence
    assert divergence is not None
    assert (divergence.conversation_id, divergence.seq) == ("r.1", 2)
    assert divergence.recomputed_effects[-1] == AbortCall(999)
    assert not divergence.fingerprint_matches
    assert "content digest" in divergence.diff()
    assert [r.conversation_id for r in report.results if not r.ok] == ["r.1"]


def test_a_changed_effect_is_reported_at_its_seq_with_a_diff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log with effect rows (written before the events-only log): the diff shows
    the effects."""
    path = _fan_out_db(tmp_path, format_5=True)  # r.1 runs bash: its seq 2 is a ToolFinished
    monkeypatch.setattr(REDUCER, "_on_tool_finished", _with_extra_abort(REDUCER._on_tool_finished))
    with Store.open(path) as store:
        report = replay.verify(store, "r", tree=True)
        with pytest.raises(LogDiverged, match=r"conversation r\.1, seq 2"):
            replay.state_at(store, "r.1", 3)
        assert replay.state_at(store, "r.1", 1).rounds == 1
    assert not report.ok and not report.corrupt
    divergence = report.first_divergence
    assert divergence is not None
    assert (divergence.conversation_id, divergence.seq) == ("r.1", 2)
    assert isinstance(divergence.event, ToolFinished)
    assert divergence.recomputed_effects[-1] == AbortCall(999)
    assert divergence.recorded_effects == divergence.recomputed_effects[:-1]
    assert divergence.fingerprint_matches and not divergence.effects_match
    diff = divergence.diff()
    assert "conversation r.1, seq 2 (ToolFinished)" in diff
    assert "--- recorded" in diff and "+++ recomputed" in diff
    assert '+    "call": 999' in diff
    # The rest of the tree is checked on its own: only r.1 ran a tool.
    assert [r.conversation_id for r in report.results if not r.ok] == ["r.1"]


def test_a_changed_state_is_reported_by_its_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _fan_out_db(tmp_path)
    monkeypatch.setattr(
        REDUCER, "_on_tool_finished", _counting_one_more_round(REDUCER._on_tool_finished)
    )
    with Store.open(path) as store:
        divergence = replay.verify(store, "r.1").first_divergence
    assert divergence is not None and divergence.seq == 2
    assert divergence.effects_match and not divergence.fingerprint_matches
    assert "model rounds: 2 recorded, 3 recomputed" in divergence.diff()


def test_a_change_only_the_full_state_shows_is_caught_where_a_format_5_log_rests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Token counts are not among the fingerprint's counters. In a format-5 log (issue
    11) the whole state is checked where a conversation comes to rest, not at every
    step: a reducer that counts more tokens at r.1's tool step is caught at r.1's last
    step (its end: the state stored as its snapshot, and the tokens its NotifyParent
    reports), not at the tool step. Version 7 catches it at the tool step:
    test_verify_names_the_step_and_field.py.
    """
    path = _fan_out_db(tmp_path, format_5=True)
    monkeypatch.setattr(REDUCER, "_on_tool_finished", _using_more_tokens(REDUCER._on_tool_finished))
    with Store.open(path) as store:
        row = store.conversation("r.1")
        divergence = replay.verify(store, "r.1").first_divergence
    assert divergence is not None
    assert divergence.seq == row.last_seq == row.snapshot_seq
    # An ended conversation's last step stores its whole state: no state digest then.
    assert divergence.recorded_state is not None
    assert divergence.recorded_state != divergence.after_state
    assert "state snapshot" in divergence.diff()


# ------------------------------------------------------------------ nothing is executed

FORBIDDEN = ("fanfold.runtime", "fanfold.providers", "fanfold.tools", "trio", "httpx")


def test_replay_never_imports_the_runtime_providers_or_tools() -> None:
    code = (
        "import sys, fanfold.replay\n"
        f"bad = [m for m in sys.modules if m.startswith({FORBIDDEN!r})]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""


def test_replay_modules_import_only_the_log_and_the_reducer() -> None:
    allowed = ("fanfold.db", "fanfold.statemachine", "fanfold.replay", "fanfold")
    package = Path(replay.__file__).parent
    for source in package.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.startswith("fanfold"):
                    assert name.startswith(allowed) and not name.startswith(FORBIDDEN), (
                        f"{source.name} imports {name}"
                    )


def test_a_reducer_that_crashes_is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _fan_out_db(tmp_path)

    def broken(state: Conversation, event: ToolFinished) -> Any:
        raise KeyError("oops")

    monkeypatch.setattr(REDUCER, "_on_tool_finished", broken)
    with Store.open(path) as store:
        report = replay.verify(store, "r", tree=True)
    (finding,) = report.findings
    assert (finding.kind, finding.conversation_id, finding.seq) == (
        FindingKind.REFUSED,
        "r.1",
        2,
    )
    assert "the reducer fails on event 2 (ToolFinished) with KeyError" in finding.message


# ------------------------------------------------------------------ older schemas


def test_a_schema_3_log_without_the_fields_4_added_still_verifies(tmp_path: Path) -> None:
    """Schema 4 added CallModel.attempt and StartTimer.counts_downtime. A log written
    before has neither; the reducer recomputes them, and that is not a divergence."""
    driver = Driver()
    fan_out(driver)  # r.2 retries (attempt 2); every child has a time limit
    path = tmp_path / "log.db"
    write(path, driver.steps, format_5=True)  # with effect rows, as every older log
    conn = sqlite3.connect(path)
    # A schema-3 fanfold wrote format-1 fingerprints (phase and counters).
    conn.execute(
        "UPDATE events SET fingerprint = substr(fingerprint, 1, instr(fingerprint, ' #') - 1)"
    )
    rows = conn.execute("SELECT conversation_id, seq, idx, payload FROM effects").fetchall()
    added = {"CallModel": "attempt", "StartTimer": "counts_downtime"}
    dropped: list[object] = []
    for cid, seq, idx, payload in rows:
        doc = codec.inline_effect(payload)  # an object document (most are stored compact)
        doc["v"] = 3
        if doc["type"] in added:
            dropped.append(doc.pop(added[doc["type"]]))
        conn.execute(
            "UPDATE effects SET payload = ? WHERE conversation_id = ? AND seq = ? AND idx = ?",
            (json.dumps(doc, separators=(",", ":")), cid, seq, idx),
        )
    conn.commit()
    reseal(conn)  # as a schema-3 fanfold wrote it: intact rows
    conn.commit()
    conn.close()
    # The log had a retry and a time limit, so the defaults are really wrong for some.
    assert 2 in dropped and True in dropped
    with Store.open(path) as store:
        report = replay.verify(store, "r", tree=True)
    assert report.ok, report
    assert [r.conversation_id for r in report.results] == ["r", "r.1", "r.2", "r.3"]


def test_a_schema_4_log_with_a_child_that_never_submitted_still_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schema 5 tells a sub-agent that ended with plain text from one that called
    submit_result (ChildSucceeded.submitted). A schema-4 log recorded every success as
    submitted; recomputing it now reports the plain child as not submitted, which that
    log could not say: not a divergence. Its states (and so its fingerprints) encode
    exactly as they were recorded."""
    driver = Driver()
    with monkeypatch.context() as old:
        # As a schema-4 fanfold ran it: every success counted as submitted.
        old.setattr(Conversation, "submitted", property(lambda self: True))
        fan_out(driver, "r", ("text", "result"))
        path = tmp_path / "log.db"
        # With effect rows, as every older log (derived as that reducer derived them).
        write(path, driver.steps, format_5=True)
    with Store.open(path) as store:
        blobs = store.blobs()
    conn = sqlite3.connect(path)
    # A schema-4 fanfold wrote format-1 fingerprints (phase and counters).
    conn.execute(
        "UPDATE events SET fingerprint = substr(fingerprint, 1, instr(fingerprint, ' #') - 1)"
    )
    for table in ("events", "effects"):
        rows = conn.execute(f"SELECT rowid, payload FROM {table}").fetchall()
        for rowid, stored in rows:
            # As an object document (events are stored compact since schema 6).
            payload = json.dumps(
                codec.inline_event(stored, blobs)
                if table == "events"
                else codec.inline_effect(stored),
                separators=(",", ":"),
            )
            assert '"submitted"' not in payload
            doc = json.loads(payload)
            doc["v"] = 4
            conn.execute(
                f"UPDATE {table} SET payload = ? WHERE rowid = ?",
                (json.dumps(doc, separators=(",", ":")), rowid),
            )
    conn.commit()
    reseal(conn)
    conn.commit()
    conn.close()
    with Store.open(path) as store:
        report = replay.verify(store, "r", tree=True)
    assert report.ok, report
    # Today the same child is reported as not submitted.
    plain = Driver()
    fan_out(plain, "r", ("text", "result"))
    assert not plain.states["r.1"].submitted and plain.states["r.2"].submitted
