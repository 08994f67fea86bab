"""Fork edits (issue 24): ``ForkEdited`` in the reducer keeps every invariant, shows
the edit, and is refused where the transition table says."""

from __future__ import annotations

import re

import attrs
import hypothesis
import pytest
import sm_support as sm
from hypothesis import given, settings
from hypothesis import strategies as st

from fanfold import testing
from fanfold.db.codec import decode_event, encode_event, encode_event_compact
from fanfold.statemachine import (
    AwaitingRetry,
    CallModel,
    Conversation,
    Edit,
    ForkEdited,
    IllegalTransition,
    Limits,
    LimitsEdit,
    LlmRequesting,
    ModelReply,
    ReplyEdit,
    RunTool,
    StartTimer,
    SystemPromptEdit,
    TaskEdit,
    ToolCall,
    ToolExecuting,
    ToolResult,
    ToolResultEdit,
    UserMessage,
    transition,
)
from fanfold.statemachine.transition import limits_edit_problem

LIMITS = Limits(max_rounds=3, max_attempts=2, max_concurrent=2, child_timeout=5.0)


def _edits(state: Conversation, data: st.DataObject) -> list[Edit]:
    """An edit of every kind the state's phase may take."""
    edits: list[Edit] = [SystemPromptEdit(data.draw(st.text(max_size=20)))]
    phase = state.phase
    if isinstance(phase, LlmRequesting):
        edits.append(ReplyEdit(data.draw(testing.model_replies(state))))
    if (
        isinstance(phase, LlmRequesting | AwaitingRetry)
        and state.is_sub_agent
        and state.rounds <= 1
        and state.history[-1:] == (UserMessage(state.task or ""),)
    ):
        edits.append(TaskEdit("the edited task"))
    if isinstance(phase, ToolExecuting):
        content = data.draw(st.text(max_size=20))
        edits.append(ToolResultEdit(ToolResult(phase.current.id, phase.current.name, content)))
    return edits


@settings(max_examples=300, deadline=None)
@given(testing.conversations(), st.data())
def test_every_legal_edit_keeps_every_invariant(state: Conversation, data: st.DataObject) -> None:
    if state.is_terminal:
        return  # refused: see test_an_ended_conversation_takes_no_edit
    for edit in _edits(state, data):
        event = ForkEdited(edit)
        after, effects = transition(state, event)
        testing.check_transition(state, event, after, effects)
        # The log records it: it encodes and decodes as itself.
        assert decode_event(encode_event(event)) == event


@settings(max_examples=100, deadline=None)
@given(testing.terminal_conversations())
def test_an_ended_conversation_takes_no_edit(state: Conversation) -> None:
    with pytest.raises(IllegalTransition, match="has ended"):
        transition(state, ForkEdited(SystemPromptEdit("x")))


def test_an_edited_reply_runs_its_tools_live_and_rearms_the_time_limit() -> None:
    child = sm.child(LIMITS, timeout=30.0)
    assert isinstance(child.phase, LlmRequesting) and child.deadline_timer is not None
    reply = ModelReply("", (ToolCall.of("e1", "bash", {"command": "ls"}),))
    after, effects = transition(child, ForkEdited(ReplyEdit(reply)))
    assert isinstance(after.phase, ToolExecuting) and after.phase.current.id == "e1"
    assert isinstance(effects[0], StartTimer) and effects[0].timer == child.deadline_timer
    assert any(isinstance(e, RunTool) and e.tool_call.id == "e1" for e in effects)


def test_an_edited_task_replaces_the_task_message_and_reissues_the_call() -> None:
    child = sm.child(LIMITS)
    call = child.phase.call  # type: ignore[union-attr]
    after, effects = transition(child, ForkEdited(TaskEdit("do the other thing")))
    assert after.task == "do the other thing"
    assert after.history[-1] == UserMessage("do the other thing")
    assert len(after.history) == len(child.history)
    assert CallModel(call, 1) in effects


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (ReplyEdit(ModelReply("x")), "ReplyEdit is legal in LlmRequesting"),
        (TaskEdit("x"), "TaskEdit is legal in a sub-agent's"),
        (ToolResultEdit(ToolResult("c", "bash", "x")), "ToolResultEdit is legal in ToolExecuting"),
    ],
)
def test_an_edit_out_of_place_names_where_it_is_legal(edit: Edit, message: str) -> None:
    root = sm.root(LIMITS)  # Idle
    with pytest.raises(IllegalTransition, match=message):
        transition(root, ForkEdited(edit))


def test_a_tool_result_edit_must_name_the_running_call() -> None:
    child = sm.child(LIMITS)
    child = sm.steps(child, sm.replied(child, sm.tool("a1")))
    with pytest.raises(IllegalTransition, match="the running tool call is 'a1'"):
        transition(child, ForkEdited(ToolResultEdit(ToolResult("zz", "bash", "x"))))


LIMIT_FIELDS = [field.name for field in attrs.fields(Limits)]


@settings(max_examples=400, deadline=None)
@given(testing.conversations(), testing.limits(), st.sampled_from(LIMIT_FIELDS), st.data())
def test_a_limits_edit_keeps_every_invariant_or_is_refused_naming_why(
    state: Conversation, drawn: Limits, field: str, data: st.DataObject
) -> None:
    """New limits, all drawn afresh or one field of the state's own changed: where
    they admit the conversation as it is, the edit keeps every invariant, and so does
    the edited conversation as it goes on; elsewhere it is refused, with the reason."""
    if state.is_terminal:
        return  # refused: see test_an_ended_conversation_takes_no_edit
    near = attrs.evolve(state.limits, **{field: getattr(drawn, field)})
    for limits in (drawn, near):
        event = ForkEdited(LimitsEdit(limits))
        problem = limits_edit_problem(state, limits)
        hypothesis.event("refused" if problem is not None else "accepted")
        if problem is not None:
            with pytest.raises(IllegalTransition, match=re.escape(problem)):
                transition(state, event)
            continue
        after, effects = transition(state, event)
        testing.check_transition(state, event, after, effects)
        assert after.limits == limits
        assert decode_event(encode_event(event)) == event
        # The edited conversation goes on under its new limits: a few more steps.
        for _ in range(data.draw(st.integers(0, 6))):
            if after.is_terminal:
                break
            following = data.draw(testing.plausible_events(after))
            try:
                later, effects = transition(after, following)
            except IllegalTransition:
                continue  # a plausible event may be refused (a stale number): no step
            testing.check_transition(after, following, later, effects)
            after = later


@settings(max_examples=100, deadline=None)
@given(testing.terminal_conversations())
def test_an_ended_conversation_takes_no_limits_edit(state: Conversation) -> None:
    with pytest.raises(IllegalTransition, match="has ended"):
        transition(state, ForkEdited(LimitsEdit(state.limits)))


def test_new_limits_must_admit_the_rounds_taken_and_the_attempt_in_flight() -> None:
    child = sm.child(LIMITS)
    child = sm.steps(child, sm.replied(child, sm.tool("a1")))
    assert child.rounds == 1
    fewer = attrs.evolve(LIMITS, max_rounds=1)
    after, _ = transition(child, ForkEdited(LimitsEdit(fewer)))  # exactly what it took
    assert after.limits.max_rounds == 1
    requesting = sm.child(LIMITS)
    assert isinstance(requesting.phase, LlmRequesting) and requesting.phase.attempt == 1
    one = attrs.evolve(LIMITS, max_attempts=1)
    assert transition(requesting, ForkEdited(LimitsEdit(one)))[0].limits == one


# The texts an edited fork's log held before LimitsEdit existed (written by the code of
# b02e8f7): a new edit kind changes none of them, so such logs decode and verify as
# they did, and today's encoder writes them byte for byte.
OLD_DOCUMENTS = [
    (
        ForkEdited(SystemPromptEdit("be terse")),
        '{"v":7,"type":"ForkEdited","edit":{"type":"SystemPromptEdit","system_prompt":"be terse"}}',
        '[7,"ForkEdited",["SystemPromptEdit","be terse"]]',
    ),
    (
        ForkEdited(TaskEdit("other")),
        '{"v":7,"type":"ForkEdited","edit":{"type":"TaskEdit","task":"other"}}',
        '[7,"ForkEdited",["TaskEdit","other"]]',
    ),
    (
        ForkEdited(ReplyEdit(ModelReply("hi"))),
        '{"v":7,"type":"ForkEdited","edit":{"type":"ReplyEdit","reply":{"type":"ModelReply",'
        '"text":"hi","tool_calls":[],"usage":{"type":"Usage","input_tokens":0,'
        '"output_tokens":0},"stop_reason":"end_turn"}}}',
        '[7,"ForkEdited",["ReplyEdit",["hi",[],[0,0,0],"end_turn",""]]]',
    ),
    (
        ForkEdited(ToolResultEdit(ToolResult("c1", "bash", "out"))),
        '{"v":7,"type":"ForkEdited","edit":{"type":"ToolResultEdit","result":{"type":'
        '"ToolResult","tool_call_id":"c1","name":"bash","content":"out","is_error":false}}}',
        '[7,"ForkEdited",["ToolResultEdit",["c1","bash","out",false]]]',
    ),
]


@pytest.mark.parametrize(("event", "document", "compact"), OLD_DOCUMENTS)
def test_the_older_edits_decode_and_encode_as_before(
    event: ForkEdited, document: str, compact: str
) -> None:
    assert decode_event(document) == event
    assert decode_event(compact) == event
    assert encode_event(event) == document
    assert encode_event_compact(event, {}) == compact


def test_a_limits_edit_encodes_in_both_forms_and_decodes_as_itself() -> None:
    event = ForkEdited(LimitsEdit(attrs.evolve(LIMITS, max_tokens=None, child_timeout=None)))
    assert decode_event(encode_event(event)) == event
    compact = encode_event_compact(event, {})
    assert compact.startswith('[7,"ForkEdited",["LimitsEdit",[3,2,')
    assert decode_event(compact) == event
