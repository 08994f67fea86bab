"""Issue 21: a round's children in Rosters, so that a child outcome costs the same at
any number of children. The Roster must behave exactly as the tuple it replaced
(the codec writes it as one, states compare and hash by their items), and a child
outcome must not copy the other children."""

from __future__ import annotations

import sys

import attrs
from hypothesis import given
from hypothesis import strategies as st
from sm_support import call_of, root

from fanfold.db import decode_state, encode_state
from fanfold.statemachine import (
    AwaitingSubAgents,
    ChildSucceeded,
    Conversation,
    Limits,
    ModelReplied,
    ModelReply,
    SubAgentFinished,
    ToolCall,
    UserMessaged,
    transition,
)
from fanfold.statemachine.children import (
    Children,
    ChildSpec,
    FinishedChild,
    PendingChild,
    Roster,
)


def _child(number: int, started: bool = True, parent: str = "r") -> PendingChild:
    return PendingChild(ChildSpec(f"{parent}.{number}", "task", "/w", None, 5, "s"), started)


def _waiting_root(n: int) -> Conversation:
    limits = Limits(max_concurrent=n, max_tasks_per_call=n, child_timeout=None)
    state, _ = transition(root(limits), UserMessaged("go"))
    call = ToolCall.of("s", "spawn_agents", {"tasks": [{"task": f"t{i}"} for i in range(n)]})
    state, _ = transition(state, ModelReplied(call_of(state), ModelReply("", (call,))))
    assert isinstance(state.phase, AwaitingSubAgents)
    return state


def test_a_child_outcome_copies_no_reference_to_the_other_children() -> None:
    # A tuple of N children copied per outcome takes a new reference to each of the
    # N - 1 others (the O(N) cost of issue 21); the Roster copies one 64-item chunk
    # of its vector (and the outer tuple of chunks).
    items = [_child(i + 1) for i in range(2000)]
    children = Children(tuple(items))
    before = [sys.getrefcount(p) for p in items]
    after = children.finish_at(children.index_of("r.1000"), ChildSucceeded("ok"))
    now = [sys.getrefcount(p) for p in items]  # counted the same way as before
    gained = sum(1 for old, new in zip(before, now, strict=True) if new > old)
    assert gained <= 64, gained
    assert len(after.pending) == 1999 and len(after.finished) == 1
    assert after.finished[0].spec.id == "r.1000"
    assert after.find_pending("r.1000") is None and after.is_finished("r.1000")


def test_outcomes_at_a_large_parent_conserve_its_children() -> None:
    state = _waiting_root(300)
    children = None
    for number in (7, 300, 1, 150):
        state, _ = transition(state, SubAgentFinished(f"{state.id}.{number}", ChildSucceeded("ok")))
        children = state.children
        assert children is not None
        assert len(children.pending) + len(children.finished) == 300
        assert children.running == len(children.pending)
    assert children is not None
    assert [f.spec.id.rsplit(".", 1)[1] for f in children.finished] == ["7", "300", "1", "150"]
    # Stored and read back exactly as a tuple-based state was (JSON arrays).
    assert decode_state(encode_state(state)) == state
    assert encode_state(decode_state(encode_state(state))) == encode_state(state)


_OPS = st.lists(
    st.tuples(st.sampled_from(["drop", "start", "append"]), st.integers(0, 40)), max_size=30
)


@given(st.integers(0, 12), st.booleans(), _OPS)
def test_a_roster_behaves_as_the_tuple_of_its_items(n: int, gap: bool, ops) -> None:  # type: ignore[no-untyped-def]
    # Ids consecutive (the reducer's case) or not (hand-built values, forks).
    numbers = [i * (2 if gap else 1) + 1 for i in range(n)]
    model = tuple(_child(k, started=False) for k in numbers)
    roster = Roster(model)
    next_number = (numbers[-1] if numbers else 0) + 1
    for op, at in ops:
        if op == "append" or not model:
            item = _child(next_number, started=at % 2 == 0)
            next_number += 1 + (at % 3 == 0)
            model, roster = (*model, item), roster.appended(item)
            continue
        target = model[at % len(model)]
        position = roster.find(target.spec.id)
        assert position >= 0 and roster.at(position) is target
        if op == "drop":
            model = tuple(p for p in model if p is not target)
            roster = roster.without(position)
        else:
            started = attrs.evolve(target, started=True)
            model = tuple(started if p is target else p for p in model)
            roster = roster.replaced(position, started)
        assert roster.find(target.spec.id) == (-1 if op == "drop" else position)
    assert tuple(roster) == model and roster == model and model == roster
    assert roster == Roster(model) and hash(roster) == hash(Roster(model))
    assert len(roster) == len(model) and bool(roster) == bool(model)
    assert roster.started == sum(1 for p in model if p.started)
    assert roster[:] == model and roster[1:3] == model[1:3]
    if model:
        assert roster[0] == model[0] and roster[-1] == model[-1]
    assert eval(repr(roster), {"Roster": Roster, **_names()}) == roster  # runnable repr
    assert [p.spec.id for p in roster] == [p.spec.id for p in model]
    positions = [position for position, _ in roster.positions()]
    assert positions == sorted(positions)


def _names() -> dict[str, object]:
    return {"PendingChild": PendingChild, "ChildSpec": ChildSpec, "FinishedChild": FinishedChild}


def test_children_take_tuples_and_keep_them_as_rosters() -> None:
    children = Children(pending=(_child(1),), finished=())
    assert type(children.pending) is Roster and type(children.finished) is Roster
    assert children == Children(pending=Roster((_child(1),)))
    assert Children() == Children(pending=(), finished=())


def test_as_tuple_is_the_items_in_order_holes_left_out() -> None:
    """``Roster.as_tuple`` (the fingerprint's C-speed read) equals iterating it, with
    and without holes, across chunk boundaries."""
    from fanfold.statemachine.children import _CHUNK, Roster

    items = [_child(i + 1) for i in range(_CHUNK * 2 + 5)]
    roster = Roster(items)
    assert roster.as_tuple() == tuple(roster) == tuple(items)
    for position in (_CHUNK * 2 + 4, _CHUNK, 0):
        roster = roster.without(position)
    assert roster.as_tuple() == tuple(roster)
    assert len(roster.as_tuple()) == len(items) - 3
