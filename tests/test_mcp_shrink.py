"""The streaming cut of a JSON text's long strings (fanfold/mcp/shrink.py)."""

from __future__ import annotations

import json
import random

import pytest

from fanfold.mcp.shrink import Shrinker

PIECES = ["x", "é", "\u20ac", "\U0001f600", '"', "\\", "\n", "\u0001", "ab", "\\u"]


def _text(dice: random.Random, n: int) -> str:
    return "".join(dice.choice(PIECES) for _ in range(n))


@pytest.mark.parametrize("seed", range(12))
def test_long_strings_are_cut_short_ones_kept_and_the_json_stays_valid(seed: int) -> None:
    dice = random.Random(seed)
    big = _text(dice, dice.randint(3_000, 9_000))
    value = {
        "jsonrpc": "2.0",
        "id": seed,
        "result": {
            "content": [{"type": "text", "text": big}, {"type": "text", "text": "short é"}],
            "structuredContent": {"result": big},
            "n": [1, 2.5, True, None],
        },
    }
    raw = json.dumps(value, ensure_ascii=dice.random() < 0.5).encode()
    shrinker = Shrinker(limit=2_000, keep=500)
    i = 0
    while i < len(raw):  # chunks of every size, as a pipe delivers them
        step = dice.randint(1, 700)
        shrinker.feed(raw[i : i + step])
        i += step
    out = json.loads(shrinker.text())
    text = out["result"]["content"][0]["text"]
    assert out["result"]["content"][1]["text"] == "short é"
    assert out["result"]["n"] == [1, 2.5, True, None] and out["id"] == seed
    # The two copies are cut alike (so the result still counts its text once).
    assert out["result"]["structuredContent"]["result"] == text
    head, _, rest = text.partition("\n[... fanfold cut ")
    _, _, tail = rest.partition(" bytes of this text ...]\n")
    assert big.startswith(head) and big.endswith(tail)
    # A tail is kept from a byte no escape can reach (no backslash in the 11 before):
    # in text this dense with escapes there may be none, and then the head is all.
    assert len(head) > 100


def test_ordinary_text_keeps_head_and_tail() -> None:
    big = ('line of text, é and "quotes" and a tab\t\n' * 400).replace("\\t", "\t")
    shrinker = Shrinker(limit=2_000, keep=500)
    shrinker.feed(json.dumps({"text": big}, ensure_ascii=False).encode())
    text = json.loads(shrinker.text())["text"]
    head, _, rest = text.partition("\n[... fanfold cut ")
    cut, _, tail = rest.partition(" bytes of this text ...]\n")
    assert big.startswith(head) and big.endswith(tail)
    assert len(head) > 400 and len(tail) > 400 and int(cut) > 10_000
    assert len(shrinker.text()) < 4 * 2_000 + 1_000


def test_a_string_of_backslashes_keeps_its_head() -> None:
    shrinker = Shrinker(limit=200, keep=50)
    shrinker.feed(json.dumps({"t": "\\" * 1000}).encode())
    text = json.loads(shrinker.text())["t"]
    assert text.startswith("\\" * 10) and "fanfold cut" in text
