"""``export_jsonl`` / ``import_jsonl``: a tree's log moves to another database intact."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from db_scenarios import CHILD_PLANS, Driver, cancelled_fan_out, fan_out
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_helpers import ancestors, edit, trace_steps, write

from fanfold import replay, testing
from fanfold.db import Store, codec
from fanfold.replay import FORMAT, ImportRefused, LogCorrupt, VersionRefused


def _driver() -> Driver:
    driver = Driver(snapshot_every=3)
    fan_out(driver, "r", CHILD_PLANS)
    cancelled_fan_out(driver, "c")
    return driver


def _export(store: Store, cid: str) -> str:
    out = io.StringIO()
    replay.export_jsonl(store, cid, out)
    return out.getvalue()


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def _text(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


@pytest.fixture
def exported(tmp_path: Path) -> str:
    write(tmp_path / "source.db", _driver().steps)
    with Store.open(tmp_path / "source.db") as store:
        return _export(store, "r.3")  # any conversation of the tree exports the tree


@pytest.fixture
def exported_format_5(tmp_path: Path) -> str:
    """An export of a log written before the events-only log: its steps hold effects."""
    write(tmp_path / "source5.db", _driver().steps, format_5=True)
    with Store.open(tmp_path / "source5.db") as store:
        return _export(store, "r.3")


def test_an_export_of_a_log_with_effect_rows_imports_and_verifies(exported_format_5: str) -> None:
    records = _lines(exported_format_5)
    assert any(r.get("effects") for r in records)
    with Store.memory() as other:
        replay.import_jsonl(other, exported_format_5.splitlines())
        assert replay.verify(other, "r", tree=True).ok
        assert other._query("SELECT count(*) AS n FROM effects")[0]["n"] > 0


def test_export_then_import_then_verify(tmp_path: Path, exported: str) -> None:
    records = _lines(exported)
    header = records[0]
    assert header == {
        "record": "header",
        "format": FORMAT,
        "format_version": 2,  # events-only: no stored_effects
        "event_schema_version": codec.SCHEMA_VERSION,
        "root_id": "r",
        "conversations": 6,
        "steps": len(records) - 7,
    }
    assert [r["id"] for r in records[1:7]] == ["r", "r.1", "r.2", "r.3", "r.4", "r.5"]
    step = records[7]
    assert set(step) == {
        "record", "conversation_id", "seq", "at", "event", "effects", "fingerprint", "stored"
    }  # fmt: skip
    assert step["stored"].startswith(f"[{codec.SCHEMA_VERSION},")  # the exact stored text
    assert step["event"]["type"] == "ConversationCreated"
    assert step["event"]["v"] == codec.SCHEMA_VERSION
    with Store.open(tmp_path / "other.db") as other:
        assert replay.import_jsonl(other, io.StringIO(exported)) == "r"
        report = replay.verify(other, "r", tree=True)
        assert report.ok, report.summary()
        with Store.open(tmp_path / "source.db") as source:
            assert _same_logs(other, source)
            assert report.final_states() == replay.verify(source, "r", tree=True).final_states()
            assert [r.id for r in other.tree("r")] == [r.id for r in source.tree("r")]
            for row in source.tree("r"):
                assert other.conversation(row.id) == row
                assert other.load_state(row.id) == source.load_state(row.id)
        # The import is an export away from the same file.
        assert _export(other, "r") == exported


def _same_logs(a: Store, b: Store) -> bool:
    """Same rows, snapshots, events and effects (row ids aside: write positions differ)."""

    def strip(store: Store) -> list[Any]:
        return [
            (log.row, log.snapshot_json, [(e.seq, e.payload, e.effects) for e in log.events])
            for log in store.raw_tree("r")
        ]

    return strip(a) == strip(b)


@given(trace=testing.event_sequences(max_steps=25), snapshot_every=st.none() | st.integers(1, 3))
@settings(max_examples=25, deadline=None)
def test_any_generated_log_survives_the_trip(
    trace: testing.Trace, snapshot_every: int | None
) -> None:
    cid = trace.created.conversation_id
    with Store.memory() as source, Store.memory() as target:
        source.append(
            [*ancestors(trace.created), *trace_steps(trace, snapshot_every=snapshot_every)]
        )
        text = _export(source, cid)
        root = replay.import_jsonl(target, text.splitlines())
        assert root == source.conversation(cid).root_id
        report = replay.verify(target, root, tree=True)
        assert report.ok and report.result(cid).final_state == trace.final()


def test_an_existing_id_is_refused_and_nothing_is_written(tmp_path: Path, exported: str) -> None:
    with Store.open(tmp_path / "other.db") as other:
        replay.import_jsonl(other, io.StringIO(exported))
        before = other.raw_tree("r")
        with pytest.raises(ImportRefused, match="conversation 'r' already exists"):
            replay.import_jsonl(other, io.StringIO(exported))
        assert other.raw_tree("r") == before


def test_a_damaged_export_writes_nothing(tmp_path: Path, exported: str) -> None:
    lines = exported.splitlines()
    cases = {
        "cut mid-line": ("\n".join(lines)[:-40], f"line {len(lines)}: not valid JSON"),
        "last line lost": ("\n".join(lines[:-1]), "the file is incomplete or padded"),
        "empty": ("", "the file is empty"),
        "not a log": ('{"record": "header", "format": "csv"}', "not a fanfold log"),
        "no header": ("\n".join(lines[1:]), "line 1: the file does not start with a header"),
        "a gap": (
            "\n".join(lines[:8] + lines[9:]),
            "line 9: conversation 'r': expected seq 1, got 2",
        ),
        "unknown record": (
            "\n".join([*lines, '{"record": "comment"}']),
            "unknown record 'comment'",
        ),
    }
    with Store.open(tmp_path / "other.db") as other:
        for name, (text, message) in cases.items():
            with pytest.raises(ImportRefused, match=message):
                replay.import_jsonl(other, text.splitlines())
            assert other.list_roots() == [], name


def test_a_bad_document_is_refused_with_its_line(tmp_path: Path, exported: str) -> None:
    records = _lines(exported)
    records[9]["event"]["reply"]["text"] = 5
    with Store.open(tmp_path / "other.db") as other:
        with pytest.raises(ImportRefused, match=r"line 10: the event of conversation 'r', seq 2"):
            replay.import_jsonl(other, _text(records).splitlines())
        assert other.list_roots() == []


def test_a_newer_event_schema_version_is_refused_naming_both(exported: str) -> None:
    records = _lines(exported)
    records[0]["event_schema_version"] = codec.SCHEMA_VERSION + 1
    with Store.memory() as other:
        with pytest.raises(VersionRefused) as info:
            replay.import_jsonl(other, _text(records).splitlines())
        message = str(info.value)
        assert f"event schema version {codec.SCHEMA_VERSION + 1}" in message
        assert f"versions 1 to {codec.SCHEMA_VERSION}" in message
        assert (info.value.found, info.value.supported) == (
            codec.SCHEMA_VERSION + 1,
            codec.SCHEMA_VERSION,
        )
        records[0]["event_schema_version"] = 0
        with pytest.raises(VersionRefused, match="event schema version 0 is unknown"):
            replay.import_jsonl(other, _text(records).splitlines())
        assert other.list_roots() == []


def test_a_newer_document_inside_an_older_header_is_refused(exported_format_5: str) -> None:
    records = _lines(exported_format_5)
    records[8]["effects"][0]["v"] = codec.SCHEMA_VERSION + 1
    with (
        Store.memory() as other,
        pytest.raises(
            VersionRefused,
            match=r"line 9: effect 0 of conversation 'r', seq 1 .*"
            rf"version {codec.SCHEMA_VERSION + 1}; this fanfold reads versions 1 to "
            rf"{codec.SCHEMA_VERSION}",
        ),
    ):
        replay.import_jsonl(other, _text(records).splitlines())


def test_a_log_of_an_older_version_replays(
    tmp_path: Path, exported: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fanfold that reads a newer schema than today's imports and verifies today's
    logs as they are."""
    monkeypatch.setattr(codec, "SCHEMA_VERSION", codec.SCHEMA_VERSION + 1)
    with Store.memory() as other:
        root = replay.import_jsonl(other, exported.splitlines())
        assert replay.verify(other, root, tree=True).ok


def test_a_diverging_log_imports_as_recorded_and_verify_reports_it(
    tmp_path: Path, exported: str
) -> None:
    """A portable bug report: the divergence shows at the same seq in the new database."""
    records = _lines(exported)
    for record in records:
        if record.get("conversation_id") == "r.2" and record["seq"] == 1:
            record["fingerprint"] = "Idle n9 r9 h9 s0 p0 f0 w0"
    with Store.open(tmp_path / "other.db") as other:
        replay.import_jsonl(other, _text(records).splitlines())
        divergence = replay.verify(other, "r", tree=True).first_divergence
    assert divergence is not None
    assert (divergence.conversation_id, divergence.seq) == ("r.2", 1)


def test_a_fork_exports_without_its_source(tmp_path: Path) -> None:
    write(tmp_path / "source.db", _driver().steps)
    with Store.open(tmp_path / "source.db") as store:
        fork = replay.fork(store, "c", store.conversation("c").last_seq)
        text = _export(store, fork)
    with Store.memory() as other:
        assert replay.import_jsonl(other, text.splitlines()) == fork
        row = other.conversation(fork)
        assert (row.forked_from, row.forked_at_seq) == (None, 5)  # "c" is not here
        assert replay.lineage(other, row) == replay.Lineage("c", 5)  # its seq 0 names it
        assert replay.verify(other, fork).ok


def test_an_unreadable_stored_payload_cannot_be_exported(tmp_path: Path) -> None:
    write(tmp_path / "source.db", _driver().steps)
    edit(
        tmp_path / "source.db",
        "UPDATE events SET payload = '{' WHERE conversation_id = 'r.1' AND seq = 1",
    )
    with (
        Store.open(tmp_path / "source.db") as store,
        pytest.raises(LogCorrupt, match=r"r\.1, seq 1"),
    ):
        _export(store, "r")


def test_a_log_with_a_gap_cannot_be_exported(tmp_path: Path) -> None:
    # import could never load it back, so it is refused here, naming the missing seq.
    write(tmp_path / "source.db", _driver().steps)
    edit(
        tmp_path / "source.db",
        "PRAGMA foreign_keys = OFF",
        "DELETE FROM effects WHERE conversation_id = 'r' AND seq = 2",
        "DELETE FROM events WHERE conversation_id = 'r' AND seq = 2",
    )
    with (
        Store.open(tmp_path / "source.db") as store,
        pytest.raises(LogCorrupt, match=r"event 2 is missing \(the next stored one is 3\)"),
    ):
        _export(store, "r")


def test_a_truncated_log_cannot_be_exported(tmp_path: Path) -> None:
    write(tmp_path / "source.db", _driver().steps)
    with Store.open(tmp_path / "source.db") as store:
        last = store.conversation("r.4").last_seq
    edit(
        tmp_path / "source.db",
        f"DELETE FROM effects WHERE conversation_id = 'r.4' AND seq = {last}",
        f"DELETE FROM events WHERE conversation_id = 'r.4' AND seq = {last}",
    )
    with (
        Store.open(tmp_path / "source.db") as store,
        pytest.raises(LogCorrupt, match=f"ends at seq {last - 1} but its conversation row"),
    ):
        _export(store, "r")


FIXTURES = Path(__file__).parent / "fixtures" / "logs"


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.db")))
def test_every_old_log_fixture_survives_the_trip(tmp_path: Path, name: str) -> None:
    # s7-tools.db holds schema-7 documents written before two later fields of schema
    # 7 (an agent definition's mcp_servers and own_tools): re-encoding its events on
    # import wrote them, and verify saw different bytes than the fingerprint's (a
    # divergence at seq 0). The export now carries the stored text itself. The same for
    # effects (s7-confined.db, s7-tools.db: a spawn's Limits and permission layer
    # stored before approval_timeout and ask): format 3's stored_effects.
    import shutil

    source = tmp_path / name
    shutil.copy(FIXTURES / name, source)
    with Store.open(source) as store:
        roots = [row.id for row in store.list_roots()]
        texts = {root: _export(store, root) for root in roots}
        before = {root: replay.verify(store, root, tree=True).ok for root in roots}
    with Store.open(tmp_path / "other.db") as other:
        for root, text in texts.items():
            replay.import_jsonl(other, text.splitlines())
            assert replay.verify(other, root, tree=True).ok == before[root], root


def test_a_stored_text_that_differs_from_its_event_is_refused(exported: str) -> None:
    records = _lines(exported)
    step = records[7]
    assert '"r"' in step["stored"]
    step["stored"] = step["stored"].replace('"r"', '"x"', 1)
    with Store.memory() as other:
        with pytest.raises(ImportRefused, match="stored text and its event differ"):
            replay.import_jsonl(other, _text(records).splitlines())
        assert not other.list_roots()


def test_a_stored_text_in_a_format_1_file_is_refused(exported: str) -> None:
    records = _lines(exported)
    records[0]["format_version"] = 1
    with Store.memory() as other, pytest.raises(ImportRefused, match="field of format 2"):
        replay.import_jsonl(other, _text(records).splitlines())


def test_a_format_1_file_without_stored_texts_imports_as_before(exported: str) -> None:
    records = _lines(exported)
    records[0]["format_version"] = 1
    for record in records:
        record.pop("stored", None)
    with Store.memory() as other:
        assert replay.import_jsonl(other, _text(records).splitlines()) == "r"
        assert replay.verify(other, "r", tree=True).ok
