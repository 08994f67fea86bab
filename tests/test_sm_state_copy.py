"""``Conversation.evolve``, the reducer's generated copy (a speed trick, ``state.py``):
it must be exactly ``attrs.evolve``."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fanfold.statemachine import (
    Conversation,
    ConversationCreated,
    Idle,
    LlmRequesting,
    UserMessage,
    start,
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
