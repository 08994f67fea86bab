"""Issue 2, behaviour 1: model replies. Text ends the turn; tools run one after another,
in order; every tool call gets exactly one result before the next model call."""

from __future__ import annotations

import pytest
from sm_support import (
    BASH,
    READ,
    child,
    created_child,
    root,
    step,
    steps,
    submit,
    tool,
    tool_done,
    tool_results,
    user,
)
from sm_support import failed as failed_reply
from sm_support import replied as replied_to

from fanfold.statemachine import (
    AbortCall,
    AssistantMessage,
    CallModel,
    CancelRequested,
    ChildSucceeded,
    Completed,
    Error,
    ErrorKind,
    Idle,
    Limits,
    LlmRequesting,
    ModelError,
    ModelReplied,
    ModelReply,
    ModelRequest,
    NotifyParent,
    RunTool,
    TimerFired,
    ToolExecuting,
    ToolResult,
    ToolResultMessage,
    TurnFinished,
    TurnOutcome,
    Usage,
    UserMessage,
    model_request,
    start,
)
from fanfold.statemachine.transition import CANCELLED_RESULT, SKIPPED_RESULT


def test_user_message_calls_the_model_with_the_history_and_tools() -> None:
    state, effects = step(root(), user("hello"))
    assert state.phase == LlmRequesting(call=0, attempt=1)
    assert state.rounds == 1
    assert effects == (CallModel(0),)
    assert model_request(state) == ModelRequest(
        system="be brief", messages=(UserMessage("hello"),), tools=state.tools, model=None
    )
    assert [t.name for t in state.tools] == ["bash", "read_file", "spawn_agents"]


def test_root_text_reply_ends_the_turn_in_idle() -> None:
    state = steps(root(), user("hello"))
    state, effects = step(state, ModelReplied(0, ModelReply("hi there", usage=Usage(7, 3))))
    assert state.phase == Idle()
    assert effects == (TurnFinished(TurnOutcome.ANSWERED, "hi there"),)
    assert state.history == (UserMessage("hello"), AssistantMessage("hi there"))
    assert (state.usage_input, state.usage_output) == (7, 3)


def test_sub_agent_text_reply_completes_it_and_notifies_the_parent_once() -> None:
    state = child(timeout=60.0)  # timer 0 is its time limit, call 1 the model call
    state, effects = step(state, ModelReplied(1, ModelReply("42 files")))
    # Issue 13, item 4: it completes, but it never called submit_result, and says so.
    assert state.phase == Completed("42 files") and not state.submitted
    assert effects == (
        AbortCall(0),
        NotifyParent("root", "root.1", ChildSucceeded("42 files", submitted=False)),
        TurnFinished(TurnOutcome.COMPLETED, "42 files"),
    )


def test_sub_agent_that_calls_submit_result_completes_as_submitted() -> None:
    state = child()
    state, effects = step(state, ModelReplied(0, ModelReply("", (submit("s", "42 files"),))))
    assert state.phase == Completed("42 files") and state.submitted
    assert NotifyParent("root", "root.1", ChildSucceeded("42 files", submitted=True)) in effects


def test_an_empty_plain_reply_also_completes_without_submitting() -> None:
    state, effects = step(child(), ModelReplied(0, ModelReply("")))
    assert state.phase == Completed("") and not state.submitted
    assert NotifyParent("root", "root.1", ChildSucceeded("", submitted=False)) in effects


def test_sub_agent_starts_on_its_task_at_once() -> None:
    state, effects = start(created_child())
    assert state.phase == LlmRequesting(call=0)
    assert state.history == (UserMessage("count the files"),)
    assert [t.name for t in state.tools] == ["bash", "read_file", "submit_result", "submit_error"]
    assert effects == (CallModel(0),)
    assert model_request(state) == ModelRequest("be brief", state.history, state.tools)


def test_tools_run_one_after_another_in_order() -> None:
    state = steps(root(), user("look"))
    a, b = tool("a", "bash"), tool("b", "read_file", path="x")
    state, effects = step(state, ModelReplied(0, ModelReply("let me see", (a, b))))
    assert effects == (RunTool(1, a, "/work"),)
    assert state.phase == ToolExecuting(current=a, call=1, remaining=(b,))
    state, effects = step(state, tool_done(state, "listing"))
    assert effects == (RunTool(2, b, "/work"),)
    assert state.phase == ToolExecuting(
        current=b, call=2, results=(ToolResult("a", "bash", "listing"),)
    )
    state, effects = step(state, tool_done(state, "contents", is_error=True))
    (model_call,) = effects
    assert isinstance(model_call, CallModel) and model_call.call == 3
    assert model_request(state).messages == (
        UserMessage("look"),
        AssistantMessage("let me see", (a, b)),
        ToolResultMessage(ToolResult("a", "bash", "listing")),
        ToolResultMessage(ToolResult("b", "read_file", "contents", is_error=True)),
    )
    assert state.phase == LlmRequesting(call=3)
    assert state.rounds == 2


def test_a_tool_nobody_offers_gets_an_error_result_and_never_runs() -> None:
    state = steps(root(tools=(BASH,)), user("go"))
    ghost = tool("g", "read_file")
    state, effects = step(state, ModelReplied(0, ModelReply("", (ghost,))))
    assert [type(e) for e in effects] == [CallModel]
    (result,) = tool_results(state)
    assert result.tool_call_id == "g" and result.is_error
    assert "unknown or unavailable tool 'read_file'" in result.content
    assert "bash, spawn_agents" in result.content


def test_cancel_while_a_tool_runs_gives_every_call_one_result() -> None:
    state = steps(root(), user("go"))
    a, b, c = tool("a"), tool("b", "read_file"), tool("c")
    state = steps(state, ModelReplied(0, ModelReply("", (a, b, c))))
    state = steps(state, tool_done(state, "first"))
    state, effects = step(state, CancelRequested())
    assert state.phase == Idle()
    assert effects == (AbortCall(2), TurnFinished(TurnOutcome.CANCELLED, "cancelled"))
    assert tool_results(state) == [
        ToolResult("a", "bash", "first"),
        ToolResult("b", "read_file", CANCELLED_RESULT, is_error=True),
        ToolResult("c", "bash", SKIPPED_RESULT, is_error=True),
    ]
    # The next turn's model call sees a complete history.
    state, effects = step(state, user("again"))
    (model_call,) = effects
    assert isinstance(model_call, CallModel)
    assert model_request(state).messages[-1] == UserMessage("again")
    assert len(model_request(state).messages) == 6


def test_reply_with_text_and_tools_keeps_both_in_the_history() -> None:
    state = steps(root(), user("go"))
    state, _ = step(state, ModelReplied(0, ModelReply("running ls", (tool("a"),))))
    assert state.history[-1] == AssistantMessage("running ls", (tool("a"),))
    assert isinstance(state.phase, ToolExecuting)
    assert READ in state.tools


def test_cached_input_tokens_are_counted_from_replies_and_failed_attempts() -> None:
    """Issue 13.6: the tokens read from the prompt cache are kept apart (they are part
    of the input tokens), from replies and from billed failed attempts alike."""
    state = steps(root(Limits(max_attempts=3, retry_base=0.01)), user("go"))
    billed = ModelError(ErrorKind.SERVER_ERROR, "overloaded", usage=Usage(100, 0, 80))
    state, _ = step(state, failed_reply(state, billed))
    assert (state.usage_input, state.usage_cached) == (100, 80)
    state = steps(state, TimerFired(state.phase.timer))  # type: ignore[union-attr]
    state, _ = step(state, replied_to(state, text="ok", usage=Usage(50, 5, 30)))
    assert state.usage == Usage(150, 5, 110)


def test_a_refusal_without_any_explanation_says_so() -> None:
    state = steps(root(), user("go"))
    state, _ = step(state, ModelReplied(0, ModelReply("", stop_reason="refusal")))
    assert isinstance(state.phase, Error) and state.phase.kind is ErrorKind.REFUSED
    assert state.phase.error == "the model refused the request: (no explanation given)"
    state = steps(root(), user("go"))
    state, _ = step(state, ModelReplied(0, ModelReply("I won't.", stop_reason="refusal")))
    assert state.phase.error == "the model refused the request: I won't."  # type: ignore[union-attr]


def test_model_request_refuses_a_state_that_awaits_no_call() -> None:
    with pytest.raises(ValueError, match="awaits no model call \\(phase Idle\\)"):
        model_request(root())
