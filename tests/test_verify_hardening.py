"""``replay --verify`` catches an edited log where it was edited (issue 10.14); no
non-finite number leaves or enters a log through export and import (issue 10.2)."""

from __future__ import annotations

import io
import re
import shutil
import sqlite3
from pathlib import Path

import attrs
import pytest
from db_scenarios import Driver, fan_out
from replay_helpers import edit, write

from fanfold import replay
from fanfold.db import Store, codec
from fanfold.replay import ImportRefused, LogCorrupt
from fanfold.statemachine import ModelReplied, RunTool, ToolCall


def _model_replies(path: Path) -> list[tuple[str, int, bool]]:
    """(conversation, seq, has a snapshot there) of every recorded model reply."""
    conn = sqlite3.connect(path)
    try:
        return [
            (cid, seq, seq == snap)
            for cid, seq, snap in conn.execute(
                "SELECT e.conversation_id, e.seq, c.snapshot_seq FROM events e"
                " JOIN conversations c ON c.id = e.conversation_id"
                " WHERE e.type = 'ModelReplied' ORDER BY e.rowid"
            )
        ]
    finally:
        conn.close()


def test_an_edited_model_reply_diverges_at_the_edited_step(tmp_path: Path) -> None:
    """Edit the text of each recorded model reply in turn: verify reports the
    divergence at that very step (the state fingerprint covers message text), not at
    the next model call or snapshot."""
    original = tmp_path / "original.db"
    driver = Driver(snapshot_every=3)
    fan_out(driver)
    write(original, driver.steps)
    replies = _model_replies(original)
    assert any(not snapshot for _, _, snapshot in replies)  # the case version 1 missed
    for cid, seq, _ in replies:
        path = tmp_path / f"{cid}-{seq}.db"
        shutil.copyfile(original, path)
        edit(
            path,
            (
                # The reply's text: field 0 of the reply, the event's field 1, in the
                # compact form the log stores events in (``codec``, "Compact form").
                "UPDATE events SET payload = json_set(payload, '$[3][0]',"
                " json_extract(payload, '$[3][0]') || ' (edited)')"
                " WHERE conversation_id = ? AND seq = ?",
                (cid, seq),
            ),
        )
        with Store.open(path) as store:
            report = replay.verify(store, cid)
        divergence = report.first_divergence
        assert divergence is not None, (cid, seq)
        assert (divergence.conversation_id, divergence.seq) == (cid, seq)
        assert not divergence.fingerprint_matches
        assert not report.corrupt


# ------------------------------------------------------------------ non-finite numbers


def test_a_tool_call_edited_in_its_event_and_its_effect_diverges_at_that_step(
    tmp_path: Path,
) -> None:
    """Format 5 (issue 11) writes the whole-state digest only at rest; the content
    digest of every step still shows an edit made consistently in a step's event (the
    reply's tool call) and its effect (RunTool), rows resealed, at that step, though
    the conversation never comes to rest after it."""
    original = tmp_path / "original.db"
    driver = Driver()
    fan_out(driver)
    write(original, driver.steps, format_5=True)  # effects stored: a log before migration 5
    conn = sqlite3.connect(original)
    try:
        cid, seq, event_text, effect_text = conn.execute(
            "SELECT e.conversation_id, e.seq, e.payload, f.payload FROM events e"
            " JOIN effects f ON f.conversation_id = e.conversation_id AND f.seq = e.seq"
            " WHERE e.type = 'ModelReplied' AND f.type = 'RunTool' ORDER BY e.rowid LIMIT 1"
        ).fetchone()
        later = conn.execute(
            "SELECT fingerprint FROM events WHERE conversation_id = ? AND seq = ?", (cid, seq)
        ).fetchone()[0]
    finally:
        conn.close()
    assert len(later.split(" ####")[1].split()) == 1  # no state digest at this step
    event, effect = codec.decode_event(event_text), codec.decode_effect(effect_text)
    assert isinstance(event, ModelReplied) and isinstance(effect, RunTool)
    call = effect.tool_call
    edited_call = ToolCall.of(call.id, call.name, {**call.arguments(), "edited": True})
    edited_event = attrs.evolve(
        event,
        reply=attrs.evolve(
            event.reply,
            tool_calls=tuple(edited_call if c == call else c for c in event.reply.tool_calls),
        ),
    )
    edited_effect = attrs.evolve(effect, tool_call=edited_call)
    as_stored = codec.encode_effect_stored(edited_effect)
    # The same effect as an object document of an older schema: a form no fanfold
    # that writes this fingerprint format stores, which must not escape the check.
    downgraded = codec.encode_effect(edited_effect).replace(
        f'{{"v":{codec.SCHEMA_VERSION},', '{"v":5,', 1
    )
    assert codec.decode_effect(downgraded) == edited_effect
    for name, effect_text in (("edited", as_stored), ("downgraded", downgraded)):
        path = tmp_path / f"{name}.db"
        shutil.copyfile(original, path)
        edit(
            path,
            (
                "UPDATE events SET payload = ? WHERE conversation_id = ? AND seq = ?",
                (codec.encode_event_compact(edited_event, {}), cid, seq),
            ),
            (
                "UPDATE effects SET payload = ?"
                " WHERE conversation_id = ? AND seq = ? AND type = 'RunTool'",
                (effect_text, cid, seq),
            ),
        )
        with Store.open(path) as store:
            report = replay.verify(store, cid)
        divergence = report.first_divergence
        assert divergence is not None, name
        assert (divergence.conversation_id, divergence.seq) == (cid, seq), name
        assert divergence.effects_match, name  # a consistent edit: only the digest shows
        assert not divergence.fingerprint_matches, name
        assert "content digest" in divergence.diff(), name
    with Store.open(original) as store:
        assert replay.verify(store, cid).ok


def test_a_tool_call_edited_in_an_events_only_log_diverges_at_that_step(
    tmp_path: Path,
) -> None:
    """The events-only log (format 6) stores no effect: an edit of the reply's tool call,
    row resealed, is seen at its step by the content digest over the event's text,
    though the conversation never comes to rest after it."""
    original = tmp_path / "original.db"
    driver = Driver()
    fan_out(driver)
    write(original, driver.steps)
    conn = sqlite3.connect(original)
    try:
        cid, seq, event_text, mark = conn.execute(
            "SELECT conversation_id, seq, payload, fingerprint FROM events"
            " WHERE type = 'ModelReplied' AND payload LIKE '%bash%' ORDER BY rowid LIMIT 1"
        ).fetchone()
        assert conn.execute("SELECT count(*) FROM effects").fetchone() == (0,)
    finally:
        conn.close()
    assert " ######" in mark  # version 7: the event's text is in the content digest
    event = codec.decode_event(event_text)
    assert isinstance(event, ModelReplied) and event.reply.tool_calls
    call = event.reply.tool_calls[0]
    edited_call = ToolCall.of(call.id, call.name, {**call.arguments(), "edited": True})
    edited_event = attrs.evolve(
        event,
        reply=attrs.evolve(event.reply, tool_calls=(edited_call, *event.reply.tool_calls[1:])),
    )
    path = tmp_path / "edited.db"
    shutil.copyfile(original, path)
    edit(
        path,
        (
            "UPDATE events SET payload = ? WHERE conversation_id = ? AND seq = ?",
            (codec.encode_event_compact(edited_event, {}), cid, seq),
        ),
    )
    with Store.open(path) as store:
        report = replay.verify(store, cid)
    divergence = report.first_divergence
    assert divergence is not None
    assert (divergence.conversation_id, divergence.seq) == (cid, seq)
    assert not divergence.fingerprint_matches
    assert "content digest" in divergence.diff()
    with Store.open(original) as store:
        assert replay.verify(store, cid).ok


def _fan_out_log(path: Path, *, format_5: bool = False) -> None:
    driver = Driver(snapshot_every=3)
    fan_out(driver)
    write(path, driver.steps, format_5=format_5)


def test_a_bare_nan_in_the_log_is_never_exported(tmp_path: Path) -> None:
    """Issue 10.2: an older fanfold could store a model's NaN as a bare ``NaN``;
    export refuses the tree (naming the row) instead of writing it on."""
    _fan_out_log(tmp_path / "log.db", format_5=True)  # a log with effect rows
    edit(
        tmp_path / "log.db",
        'UPDATE effects SET payload = replace(payload, \'"delay":\', \'"delay":NaN,"d":\')'
        " WHERE type = 'StartTimer'",
    )
    with Store.open(tmp_path / "log.db") as store, pytest.raises(LogCorrupt) as info:
        replay.export_jsonl(store, "r", io.StringIO())
    assert "non-finite number NaN" in str(info.value)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
@pytest.mark.parametrize("field", ["at", "event"])
def test_import_refuses_non_finite_numbers_and_imports_nothing(
    tmp_path: Path, literal: str, field: str
) -> None:
    _fan_out_log(tmp_path / "log.db", format_5=True)  # its export holds effects
    out = io.StringIO()
    with Store.open(tmp_path / "log.db") as store:
        replay.export_jsonl(store, "r", out)
    lines = out.getvalue().splitlines()
    index = next(i for i, line in enumerate(lines) if '"StartTimer"' in line)
    if field == "at":
        lines[index] = re.sub(r'"at":[0-9.e+-]+', f'"at":{literal}', lines[index], count=1)
    else:
        lines[index] = re.sub(r'"delay":[0-9.e+-]+', f'"delay":{literal}', lines[index], count=1)
    assert literal in lines[index]
    with Store.open(tmp_path / "other.db") as other:
        with pytest.raises(ImportRefused, match=f"line {index + 1}: .*non-finite number"):
            replay.import_jsonl(other, lines)
        assert other.list_roots() == []


@pytest.mark.parametrize("field", ["conversation_id", "fingerprint"])
def test_import_refuses_an_id_that_is_not_unicode_and_imports_nothing(
    tmp_path: Path, field: str
) -> None:
    """A lone surrogate in a stored column (an id, a fingerprint) of an edited export
    is one ImportRefused naming the line and field, not SQLite's codec message."""
    _fan_out_log(tmp_path / "log.db")
    out = io.StringIO()
    with Store.open(tmp_path / "log.db") as store:
        replay.export_jsonl(store, "r", out)
    lines = out.getvalue().splitlines()
    index = next(i for i, line in enumerate(lines) if '"record":"step"' in line)
    lines[index] = re.sub(f'"{field}":"', f'"{field}":"\\\\ud83d', lines[index], count=1)
    assert "\\ud83d" in lines[index]
    with Store.open(tmp_path / "other.db") as other:
        with pytest.raises(ImportRefused, match=f"line {index + 1}: '{field}' holds text"):
            replay.import_jsonl(other, lines)
        assert other.list_roots() == []
