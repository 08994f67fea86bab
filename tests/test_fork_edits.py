"""Fork edits (issue 24): ``ForkEdited`` in the reducer keeps every invariant, shows
the edit, and is refused where the transition table says."""

from __future__ import annotations

import pytest
import sm_support as sm
from hypothesis import given, settings
from hypothesis import strategies as st

from fanfold import testing
from fanfold.db.codec import decode_event, encode_event
from fanfold.statemachine import (
    AwaitingRetry,
    CallModel,
    Conversation,
    Edit,
    ForkEdited,
    IllegalTransition,
    Limits,
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
