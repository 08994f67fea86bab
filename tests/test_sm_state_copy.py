"""``Conversation.evolve``, the reducer's generated copy (a speed trick, ``state.py``):
it must be exactly ``attrs.evolve``."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sm_support import created_child, replied, root, spawn, submit, tool, tool_done, user

from fanfold.statemachine import (
    AwaitingSubAgents,
    ChildSucceeded,
    Conversation,
    ConversationCreated,
    Idle,
    Limits,
    LlmRequesting,
    SubAgentFinished,
    UserMessage,
    start,
    transition,
)

_STATE, _ = start(ConversationCreated("c", task="t", system_prompt="be brief"))
_NAMES = tuple(a.name for a in attrs.fields(Conversation))

# A value of each kind some fields take; what matters is that it is put where asked.
_VALUES: dict[str, Any] = {
    "phase": LlmRequesting(3, 1),
    "history": (UserMessage("hello"),),
    "next_call": 7,
    "rounds": 2,
    "usage_input": 11,
    "refused_calls": 1,
}


@given(st.sets(st.sampled_from(sorted(_VALUES))))
def test_evolve_is_attrs_evolve(fields: set[str]) -> None:
    changes = {name: _VALUES[name] for name in fields}
    copied = _STATE.evolve(**changes)
    assert copied == attrs.evolve(_STATE, **changes)
    assert copied is not _STATE
    # A Conversation like any other, frozen (evolve builds it in a private draft).
    assert type(copied) is Conversation and hash(copied) == hash(attrs.evolve(_STATE, **changes))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        copied.rounds = 9  # type: ignore[misc]
    for name in _NAMES:
        expected = changes[name] if name in changes else getattr(_STATE, name)
        assert getattr(copied, name) is expected, name
    assert isinstance(_STATE.phase, Idle)  # the original is untouched


def test_evolve_refuses_an_unknown_field_naming_it() -> None:
    with pytest.raises(TypeError, match=r"has no field\(s\) \['colour'\]"):
        _STATE.evolve(colour="red", next_call=1)


# ---------------------------------------------------------------- copies per step
# Every step of a sub-agent's life, and of its parent's fan-out, is the engine's hot
# path: each copy of the 29-field state costs about 8,400 instructions (issue 21). A
# step makes one copy of the state, however many fields it changes; a spawn of N
# children makes as many as a spawn of one.


def _copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count ``Conversation.evolve`` calls from now on (one element per call)."""
    made: list[int] = []
    evolve = Conversation.evolve

    def counting(self: Conversation, **changes: Any) -> Conversation:
        made.append(1)
        return evolve(self, **changes)

    monkeypatch.setattr(Conversation, "evolve", counting)
    return made


def test_each_step_of_a_sub_agents_life_copies_the_state_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = _copies(monkeypatch)
    state, _ = start(created_child(timeout=60.0))  # a time limit: a timer issued too
    assert len(made) <= 1, "start"
    for name in ("a tool call", "its result", "submit_result"):
        made.clear()
        if name == "a tool call":
            state, _ = transition(state, replied(state, tool("t1")))
        elif name == "its result":
            state, _ = transition(state, tool_done(state))
        else:
            state, _ = transition(state, replied(state, submit("t2", "done")))
        assert len(made) == 1, name
    assert state.is_terminal


def test_a_roots_turn_copies_the_state_once_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    state = root()
    made = _copies(monkeypatch)
    state, _ = transition(state, user("hi"))
    assert len(made) == 1, "the user's message"
    made.clear()
    state, _ = transition(state, replied(state, text="hello"))
    assert len(made) == 1, "the answer"
    assert isinstance(state.phase, Idle)


def test_a_spawn_copies_the_state_as_often_for_many_children_as_for_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limits = Limits(max_tasks_per_call=50, max_concurrent=50)
    made = _copies(monkeypatch)
    copies = []
    for count in (1, 30):
        state, _ = transition(root(limits), user("fan out"))
        tasks = [{"task": f"task {i}", "timeout": 30} for i in range(count)]
        made.clear()
        state, _ = transition(state, replied(state, spawn("s1", *tasks)))
        assert isinstance(state.phase, AwaitingSubAgents) and state.spawned == count
        copies.append(len(made))
    assert copies[0] == copies[1] <= 4


def test_a_child_outcome_with_tokens_copies_the_state_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every outcome of a real model's child carries tokens: they are counted in the
    # same copy that records the outcome (two copies before).
    limits = Limits(max_tasks_per_call=5, max_concurrent=5)
    state, _ = transition(root(limits), user("fan out"))
    state, _ = transition(state, replied(state, spawn("s1", "one", "two")))
    made = _copies(monkeypatch)
    for child in ("root.1", "root.2"):  # the first leaves one waiting, the last ends the wait
        made.clear()
        state, _ = transition(state, SubAgentFinished(child, ChildSucceeded("done", tokens=7)))
        assert len(made) == 1, child
    assert isinstance(state.phase, LlmRequesting) and state.usage_children == 14


def test_awaiting_sub_agents_has_the_fields_with_children_copies() -> None:
    # _with_children builds this phase from its two fields rather than attrs.evolve's
    # generic copy (every child outcome's path): a field added here must be added there.
    assert [a.name for a in attrs.fields(AwaitingSubAgents)] == ["children", "results"]
