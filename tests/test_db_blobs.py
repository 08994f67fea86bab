"""Large repeated values (tool sets, system prompts) are stored once per database, by
content (migration 4, ``fanfold.db.codec`` "Blobs"), and read back checked."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
from db_scenarios import Driver, fan_out
from replay_helpers import edit, one_child_log

from fanfold import replay
from fanfold.db import CodecError, ReplayError, Store, decode_event, encode_event, open_store
from fanfold.db.codec import (
    BLOB_MIN_CHARS,
    collapse_blobs,
    decode_effect,
    encode_effect_stored,
    expand_blobs,
)
from fanfold.replay.report import FindingKind
from fanfold.statemachine import ConversationCreated, Limits, SpawnSubAgent, ToolSpec

LONG_PROMPT = "You review code carefully and report what you find. " * 20


def _tools() -> tuple[ToolSpec, ...]:
    return tuple(
        ToolSpec.from_schema(f"tool{i}", "a tool " * 30, {"type": "object"}) for i in range(3)
    )


def test_a_creation_names_its_large_values_and_decodes_with_them() -> None:
    created = ConversationCreated("c", system_prompt=LONG_PROMPT, tools=_tools(), task="t")
    blobs: dict[str, str] = {}
    text = encode_event(created, blobs)
    assert len(blobs) == 5  # the prompt, the tool set, and each (long) tool in it
    named = text + "".join(blobs.values())
    for key, body in blobs.items():
        assert hashlib.sha256(body.encode()).hexdigest() == key
        assert len(body) >= BLOB_MIN_CHARS or body.startswith("[")  # a set of references
        assert f'{{"blob":"{key}"}}' in named  # by the document, or by the set
    values = [b for b in blobs.values() if not b.startswith("[")]  # the prompt, each tool
    assert len(text) < len(encode_event(created)) - sum(map(len, values)) + 200
    assert decode_event(text, blobs) == created
    # Expanded, the document is the inline one; collapsed again, the stored one.
    inline = json.dumps(expand_blobs(json.loads(text), blobs), separators=(",", ":"))
    assert inline == encode_event(created)
    again: dict[str, str] = {}
    assert collapse_blobs(inline, again) == text and again == blobs


def test_a_spawn_names_its_childs_large_values_and_decodes_with_them() -> None:
    """Since 2026-11-26 a SpawnSubAgent effect stores the child's tool set and prompt by
    reference too (inline, they were about 5 KB per child with the default tools: three
    quarters of a fan-out's log). Stored inline (older logs), it still decodes."""
    created = ConversationCreated("c", system_prompt=LONG_PROMPT, tools=_tools(), task="t")
    spawn = SpawnSubAgent(
        child_id="c.1",
        parent_id="c",
        root_id="c",
        task="review",
        cwd="/work",
        timeout=None,
        max_rounds=5,
        depth=1,
        limits=Limits(),
        tools=created.tools,
        system_prompt=LONG_PROMPT,
        model=None,
    )
    blobs: dict[str, str] = {}
    text = encode_effect_stored(spawn, blobs)
    inline = encode_effect_stored(spawn)
    assert set(blobs) == {hashlib.sha256(b.encode()).hexdigest() for b in blobs.values()}
    assert len(blobs) == 5 and "a tool a tool" not in text and "a tool a tool" in inline
    assert len(text) < len(inline) - len(LONG_PROMPT)
    assert decode_effect(text, blobs) == spawn == decode_effect(inline)
    with pytest.raises(CodecError, match="is not in the log"):
        decode_effect(text, {})
    # The creation that the spawn becomes names the same blobs: stored once.
    event_blobs: dict[str, str] = {}
    encode_event(created, event_blobs)
    assert event_blobs.keys() <= blobs.keys()


def test_short_values_stay_inline() -> None:
    created = ConversationCreated("c", system_prompt="Be brief.", task="t")
    blobs: dict[str, str] = {}
    assert encode_event(created, blobs) == encode_event(created)
    assert blobs == {}


def test_a_reference_needs_the_logs_blobs_and_their_exact_text() -> None:
    created = ConversationCreated("c", system_prompt=LONG_PROMPT, tools=_tools())
    blobs: dict[str, str] = {}
    text = encode_event(created, blobs)
    with pytest.raises(CodecError, match="only a log's own rows may hold"):
        decode_event(text)
    key = next(iter(blobs))
    with pytest.raises(CodecError, match=f"blob {key[:16]} is not in the log"):
        decode_event(text, {k: v for k, v in blobs.items() if k != key})
    decode_event(text, blobs)  # decoded once: kept by key
    damaged = {**blobs, key: blobs[key].replace("a", "b", 1)}
    with pytest.raises(CodecError, match="does not match its digest"):
        decode_event(text, damaged)


def test_a_tree_stores_its_tool_set_once(log_target: str) -> None:
    driver = Driver(snapshot_every=2)
    children = fan_out(driver)
    with open_store(log_target) as store:
        store.append(driver.steps)
        created = [s for s in driver.steps if s.seq == 0]
        assert len(created) == 1 + len(children)
        for cid in driver.states:
            assert store.load_state(cid) == driver.states[cid]
        assert replay.verify(store, "r", tree=True).ok
        conn = store._connection()  # (either store's: the same SQL)
        bodies = [b for (b,) in conn.execute("SELECT body FROM blobs").fetchall()]
        payloads = [p for (p,) in conn.execute("SELECT payload FROM events").fetchall()]
        effects = conn.execute("SELECT count(*) FROM effects").fetchone()[0]
    assert effects == 0  # the events-only log: a spawn's effect is re-derived, not stored
    with open_store(log_target) as store:
        stored = [e for cid in driver.states for e in store.events(cid)]
    recorded = [e for step in driver.steps for e in step.effects if isinstance(e, SpawnSubAgent)]
    assert [e for s in stored for e in s.effects if isinstance(e, SpawnSubAgent)] == recorded
    # Each long tool's text is stored once, though the root's tool set and its
    # sub-agents' differ (control tools) and each is named by many documents.
    for name in ("spawn_agents", "submit_result", "submit_error"):
        assert sum(f'"name":"{name}"' in b for b in bodies) <= 1, name
    assert any('"name":"submit_result"' in b for b in bodies)
    # Only creation events name blobs (snapshots do too; other events hold no tools).
    assert all('"blob"' not in p or '"ConversationCreated"' in p for p in payloads)


def test_a_damaged_or_missing_blob_is_reported_not_raised(tmp_path: Path) -> None:
    db, root, _ = one_child_log(tmp_path)
    edit(db, "UPDATE blobs SET body = replace(body, 'a', 'b')")
    with Store.open(db) as store:
        report = replay.verify(store, root, tree=True)
        assert not report.ok
        (finding, *_) = [f for r in report.results for f in r.findings]
        assert finding.kind is FindingKind.CORRUPT_PAYLOAD and finding.seq == 0
        assert "does not match its digest" in finding.message
        with pytest.raises(ReplayError, match="does not match its digest"):
            store.load_state(root)
    edit(db, "DELETE FROM blobs")
    with Store.open(db) as store, pytest.raises(ReplayError, match="is not in the log"):
        store.load_state(root)


def test_an_export_is_inline_and_imports_as_stored(tmp_path: Path) -> None:
    db, root, _ = one_child_log(tmp_path)
    out = io.StringIO()
    with Store.open(db) as store:
        replay.export_jsonl(store, root, out)
    assert '"blob"' not in out.getvalue()
    # The tools inline (a child's creation event holds them); no effects in an export
    # of the events-only log.
    assert '"name":"submit_result"' in out.getvalue()
    assert '"SpawnSubAgent"' not in out.getvalue()
    with Store.open(tmp_path / "other.db") as other:
        assert replay.import_jsonl(other, io.StringIO(out.getvalue())) == root
        assert replay.verify(other, root, tree=True).ok
        assert other.blobs()  # collapsed on the way in, as append stores them
    # A reference in an imported file is refused: the file carries no blobs.
    with Store.open(db) as store:
        (created,) = [e for e in store.raw_log(root).events if e.seq == 0]
    assert '"blob"' in created.payload
    lines = out.getvalue().splitlines()
    forged = [
        json.dumps({**json.loads(line), "event": json.loads(created.payload)})
        if json.loads(line).get("record") == "step"
        and json.loads(line)["conversation_id"] == root
        and json.loads(line)["seq"] == 0
        else line
        for line in lines
    ]
    with (
        Store.open(tmp_path / "third.db") as third,
        pytest.raises(replay.ImportRefused, match="only a log's own rows may hold"),
    ):
        replay.import_jsonl(third, forged)
