"""The shipped invariants (``fanfold.testing``) catch a wrong rule a user might add, and
say what changed (issue 22.10)."""

from __future__ import annotations

import re
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, assume, given, settings

from fanfold import testing
from fanfold.statemachine import (
    AssistantMessage,
    AwaitingRetry,
    Conversation,
    ConversationCreated,
    Effect,
    ErrorKind,
    LlmRequesting,
    ModelError,
    ModelFailed,
    ModelReplied,
    ModelReply,
    Usage,
    UserMessage,
    UserMessaged,
    start,
    transition,
)


@attrs.frozen
class NoteAdded:
    """An event a user's extension might add: a note for the model."""

    text: str


def _noting(message: type[UserMessage | AssistantMessage]) -> Any:
    """A wrapped reducer with a wrong rule: it accepts NoteAdded while a model call is
    in flight (or waits for its retry), adding the note to the call's history."""

    def wrapped(state: Conversation, event: Any) -> tuple[Conversation, tuple[Effect, ...]]:
        if isinstance(event, NoteAdded) and isinstance(state.phase, LlmRequesting | AwaitingRetry):
            return attrs.evolve(state, history=(*state.history, message(event.text))), ()
        return transition(state, event)

    return wrapped


def _calling() -> Conversation:
    created = ConversationCreated(conversation_id="root", cwd="/work", system_prompt="s")
    state, _ = start(created)
    state, _ = transition(state, UserMessaged("hi"))
    assert isinstance(state.phase, LlmRequesting)
    return state


def _retrying() -> Conversation:
    state = _calling()
    error = ModelError(ErrorKind.RATE_LIMIT, "slow down", retry_after=1.0)
    state, _ = transition(state, ModelFailed(call=0, error=error))
    assert isinstance(state.phase, AwaitingRetry)
    return state


@pytest.mark.parametrize("before", [_calling(), _retrying()], ids=["in-flight", "retrying"])
def test_a_rule_adding_a_user_note_during_a_model_call_is_caught(before: Conversation) -> None:
    event = NoteAdded("remember the tests")
    after, effects = _noting(UserMessage)(before, event)
    # Every state on its own is valid: the request still ends with a user message.
    testing.check_invariants(after)
    with pytest.raises(AssertionError) as caught:
        testing.check_transition(before, event, after, effects)  # type: ignore[arg-type]
    assert str(caught.value).startswith(
        "invariant 'history valid in every phase' broken: NoteAdded changed the history "
        "of the model call in flight (added UserMessage)"
    )


def test_a_rule_adding_an_assistant_note_during_a_model_call_breaks_the_state() -> None:
    before = _calling()
    after, _ = _noting(AssistantMessage)(before, NoteAdded("thinking..."))
    with pytest.raises(AssertionError, match=re.escape("the request ends with AssistantMessage")):
        testing.check_invariants(after)


@given(trace=testing.event_sequences(max_steps=30))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_wrong_rule_is_caught_wherever_a_model_call_is_in_flight(
    trace: testing.Trace,
) -> None:
    calling = [
        after
        for _, _, after, _ in trace.steps()
        if isinstance(after.phase, LlmRequesting | AwaitingRetry)
    ]
    assume(calling)
    event = NoteAdded("a note")
    for before in calling:
        after, effects = _noting(UserMessage)(before, event)
        with pytest.raises(AssertionError, match="history valid in every phase"):
            testing.check_transition(before, event, after, effects)  # type: ignore[arg-type]


def test_a_counter_that_shrinks_is_named_alone() -> None:
    before = _calling()
    reply = ModelReply(text="hello", usage=Usage(input_tokens=120, output_tokens=30))
    replied, effects = transition(before, ModelReplied(call=0, reply=reply))
    again, _ = transition(replied, UserMessaged("more"))
    # A wrong rule that forgets the tokens spent so far on the next call's reply.
    event = ModelReplied(call=1, reply=ModelReply(text="again"))
    right, effects = transition(again, event)
    wrong = attrs.evolve(right, usage_input=0, usage_output=0)
    with pytest.raises(AssertionError) as caught:
        testing.check_transition(again, event, wrong, effects)
    first_line = str(caught.value).splitlines()[0]
    assert first_line == (
        "invariant 'counters only grow' broken: usage_input 120->0, usage_output 30->0"
    )
