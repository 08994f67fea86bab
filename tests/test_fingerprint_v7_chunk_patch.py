"""Format 7's roster digest reads a roster's new chunk from the lineage's last chunk at
its place (issue 34, h34g: a child appended, or one replaced or dropped), instead of
looking up all 64 items. Whatever path it takes, the digest must be the one a cold
cache computes from the items alone."""

from __future__ import annotations

import importlib
import random

from fanfold.statemachine.children import (
    ChildSpec,
    ChildSucceeded,
    FinishedChild,
    PendingChild,
    Roster,
)

F = importlib.import_module("fanfold.db.fingerprint")


def _child(number: int, flag: bool = True) -> PendingChild:
    return PendingChild(ChildSpec(f"r.{number}", f"task {number}", "/w", None, 5, "s"), flag)


def _cold(roster: Roster[PendingChild] | Roster[FinishedChild]) -> int:
    chunks = F._Chunks()
    items = F._ItemBytes()
    kept = F._item_bytes
    setattr(F, "_item_bytes", items)  # a cache that has seen nothing  # noqa: B010
    try:
        return int(chunks.digest("cold", roster))
    finally:
        setattr(F, "_item_bytes", kept)  # noqa: B010


class _Counting(F._Chunks):  # type: ignore[name-defined,misc]
    """Counts the chunks read from their predecessor."""

    patched = 0

    def _patched(self, chunk: tuple[object, ...], old: tuple[object, ...]) -> object:
        found = super()._patched(chunk, old)
        self.patched += found is not None
        return found


def test_each_kind_of_step_gives_the_cold_digest() -> None:
    chunks = _Counting()
    live: Roster[PendingChild] = Roster(_child(n) for n in range(150))
    done: Roster[FinishedChild] = Roster()
    rng = random.Random(34)
    for step in range(400):
        kind = rng.choice(("finish", "replace", "append", "swap"))
        positions = [p for p, _ in live.positions()]
        if kind == "finish" and positions:
            at = rng.choice(positions)
            done = done.appended(FinishedChild(live.at(at).spec, ChildSucceeded(f"ok {step}")))
            live = live.without(at)
        elif kind == "replace" and positions:
            at = rng.choice(positions)
            live = live.replaced(at, _child(1000 + step, flag=False))
        elif kind == "swap" and len(positions) > 1:
            # Two items changed in one chunk: not a patchable step, read whole.
            items = list(live)
            items[0], items[1] = items[1], items[0]
            live = Roster(items)
        else:
            live = live.appended(_child(2000 + step))
        assert chunks.digest("live", live) == _cold(live), (step, kind)
        assert chunks.digest("done", done) == _cold(done), (step, kind)
    # Most steps' new chunks were read from their predecessor (the swaps were not).
    assert chunks.patched > 400


def test_a_changed_item_changes_the_digest_through_the_patched_path() -> None:
    chunks = F._Chunks()
    live: Roster[PendingChild] = Roster(_child(n) for n in range(100))
    first = chunks.digest("live", live)
    changed = live.replaced(70, _child(70, flag=False))
    assert chunks.digest("live", changed) != first
    restored = changed.replaced(70, _child(70))
    assert chunks.digest("live", restored) == first
