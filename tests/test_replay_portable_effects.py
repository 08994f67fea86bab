"""Export and import keep an effect's stored text (format 3): a version-5 fingerprint's
content digest is of those bytes, and today's encoder need not give them back."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from db_scenarios import CHILD_PLANS, Driver, fan_out
from replay_helpers import write

from fanfold import replay
from fanfold.db import Store, codec
from fanfold.replay import ImportRefused
from fanfold.statemachine import Limits, SpawnSubAgent

# Where a SpawnSubAgent's limits sit in its compact document: [v, type, field...].
_LIMITS_AT = 2 + [f.name for f in attrs.fields(SpawnSubAgent)].index("limits")
_LAST_OF_LIMITS = attrs.fields(Limits)[-1]


def _as_before_the_last_limit(effect: Any, blobs: dict[str, str]) -> str:
    """The stored text of ``effect`` as a fanfold written before ``Limits``' last field
    (added with ``omitted_at_default``, trailing) wrote it: that field left out."""
    text = codec.encode_effect_stored(effect, blobs)
    if not isinstance(effect, SpawnSubAgent):
        return text
    document = json.loads(text)
    limits = document[_LIMITS_AT]
    assert limits[-1] == _LAST_OF_LIMITS.default  # the new field, at its default
    limits.pop()
    older = json.dumps(document, separators=(",", ":"))
    assert older != text and codec.decode_effect(older, blobs) == effect  # same value
    return older


def _export(store: Store, cid: str) -> str:
    out = io.StringIO()
    replay.export_jsonl(store, cid, out)
    return out.getvalue()


@pytest.fixture(scope="module")
def older(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A format-5 log (effects stored) whose spawns' limits lack the last field (read
    only by the tests: made once)."""
    driver = Driver()
    fan_out(driver, "r", CHILD_PLANS)
    path = tmp_path_factory.mktemp("older") / "older.db"
    write(path, driver.steps, format_5=True, encode_effect=_as_before_the_last_limit)
    return path


def test_an_effect_stored_before_a_later_field_survives_the_trip(
    older: Path, tmp_path: Path
) -> None:
    assert _LAST_OF_LIMITS.metadata.get(codec.OMITTED_AT_DEFAULT)
    with Store.open(older) as store:
        assert replay.verify(store, "r", tree=True).ok  # in place
        spawns = store._query("SELECT payload FROM effects WHERE type = 'SpawnSubAgent'")
        text = _export(store, "r")
    assert spawns
    with Store.open(tmp_path / "other.db") as other:
        assert replay.import_jsonl(other, text.splitlines()) == "r"
        report = replay.verify(other, "r", tree=True)
        assert report.ok, report.summary()
        again = other._query("SELECT payload FROM effects WHERE type = 'SpawnSubAgent'")
        assert sorted(r["payload"] for r in again) == sorted(r["payload"] for r in spawns)
        assert _export(other, "r") == text  # export -> import -> export: the same bytes
    header, *steps = (json.loads(line) for line in text.splitlines())
    assert header["format_version"] == 3
    carried = {s for step in steps for s in step.get("stored_effects", []) if s is not None}
    assert {row["payload"] for row in spawns} <= carried  # the exact stored texts


def _with_stored_spawn(text: str) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    records = [json.loads(line) for line in text.splitlines()]
    for record in records:
        for index, stored in enumerate(record.get("stored_effects", [])):
            if stored is not None and '"SpawnSubAgent"' in stored:
                return records, record, index
    raise AssertionError("no stored spawn")


def _lines(records: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(r) for r in records]


def test_a_stored_effect_that_differs_from_its_document_is_refused(older: Path) -> None:
    with Store.open(older) as store:
        records, step, index = _with_stored_spawn(_export(store, "r"))
    task = step["effects"][index]["task"]
    step["stored_effects"][index] = step["stored_effects"][index].replace(
        json.dumps(task), json.dumps(task + "!"), 1
    )
    with Store.memory() as other:
        with pytest.raises(ImportRefused, match="stored text and its effect differ"):
            replay.import_jsonl(other, _lines(records))
        assert not other.list_roots()


def test_stored_effects_in_a_format_2_file_are_refused(older: Path) -> None:
    with Store.open(older) as store:
        records, _, _ = _with_stored_spawn(_export(store, "r"))
    records[0]["format_version"] = 2
    with Store.memory() as other, pytest.raises(ImportRefused, match="field of format 3"):
        replay.import_jsonl(other, _lines(records))


def test_stored_effects_must_match_the_effects(older: Path) -> None:
    with Store.open(older) as store:
        records, step, _ = _with_stored_spawn(_export(store, "r"))
    step["stored_effects"].append(None)
    with Store.memory() as other, pytest.raises(ImportRefused, match="one text or null"):
        replay.import_jsonl(other, _lines(records))
