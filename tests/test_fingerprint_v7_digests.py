"""Format 7's state digests (issue 34, cost levers): the children of a phase are
digested per 64-child chunk kept by identity, yet the digest depends on the items
only, never on how a roster happens to be chunked (a roster loaded from a snapshot is
packed densely, the live one has holes); large values are digested by identity but
equal values digest alike."""

from __future__ import annotations

import importlib

from fanfold.statemachine import AwaitingSubAgents
from fanfold.statemachine.children import (
    Children,
    ChildSpec,
    ChildSucceeded,
    FinishedChild,
    PendingChild,
    Roster,
)
from fanfold.statemachine.messages import ToolSpec

F = importlib.import_module("fanfold.db.fingerprint")


def _child(number: int) -> PendingChild:
    return PendingChild(ChildSpec(f"r.{number}", f"task {number}", "/w", None, 5, "s"), True)


def test_a_rosters_digest_does_not_depend_on_its_chunking() -> None:
    items = [_child(n) for n in range(1, 201)]
    live = Roster(items)
    done = Roster[FinishedChild]()
    # Finish every third child the way the reducer does: holes in pending, appends.
    for number in range(1, 201, 3):
        position = live.find(f"r.{number}")
        done = done.appended(FinishedChild(live.at(position).spec, ChildSucceeded("ok")))
        live = live.without(position)
    dense_pending = Roster(tuple(live))  # as a snapshot loads it: no holes
    dense_done = Roster(tuple(done))
    assert live.chunks() != dense_pending.chunks()  # really chunked otherwise
    a = AwaitingSubAgents(Children(live, done))
    b = AwaitingSubAgents(Children(dense_pending, dense_done))
    assert F._phase_hex("r", a) == F._phase_hex("r", b)
    # And it is a digest of the items: one child changed, or two swapped, differ.
    changed = live.replaced(live.find("r.200"), PendingChild(_child(200).spec, False))
    assert F._phase_hex("r", AwaitingSubAgents(Children(changed, done))) != F._phase_hex("r", a)
    swapped = Roster((*tuple(live)[:10][::-1], *tuple(live)[10:]))
    assert F._phase_hex("r", AwaitingSubAgents(Children(swapped, done))) != F._phase_hex("r", a)


def test_large_values_digest_by_content_though_kept_by_identity() -> None:
    tools = (ToolSpec("bash", "run a command", '{"type":"object"}'),)
    copy = (ToolSpec("bash", "run a command", '{"type":"object"}'),)
    other = (ToolSpec("bash", "run a command!", '{"type":"object"}'),)
    assert tools is not copy
    assert F._large_hex(tools) == F._large_hex(copy)
    assert F._large_hex(tools) != F._large_hex(other)
