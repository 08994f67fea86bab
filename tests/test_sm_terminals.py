"""Issue 2, behaviour 5: sub-agent terminals. submit_result -> Completed, submit_error ->
Failed, text -> Completed, max rounds -> one grace round, then Completed or Failed
(iteration limit). Every entry into Completed/Failed emits exactly one NotifyParent;
terminal phases absorb late arrivals with no effects and refuse everything else."""

from __future__ import annotations

import pytest
from sm_support import (
    call_of,
    child,
    messages_of,
    only,
    replied,
    root,
    spawn,
    step,
    steps,
    submit,
    submit_error,
    tool,
    tool_done,
    tool_results,
    user,
)

from fanfold.statemachine import (
    AbortCall,
    CallModel,
    CancellingSubAgents,
    CancelReason,
    CancelRequested,
    CancelSubAgents,
    ChildFailed,
    ChildSucceeded,
    Completed,
    Conversation,
    EndCompleted,
    Error,
    ErrorKind,
    Failed,
    Idle,
    IllegalTransition,
    Limits,
    LlmRequesting,
    ModelReplied,
    ModelReply,
    NotifyParent,
    RuntimeResumed,
    RunTool,
    StartTimer,
    SubAgentFinished,
    TimerFired,
    ToolCall,
    ToolFinished,
    ToolResult,
    TurnFinished,
    TurnOutcome,
    UnknownCall,
    UserMessage,
    UserMessaged,
    model_request,
)
from fanfold.statemachine.control_tools import (
    GRACE_PROMPT,
    ROOT_GRACE_PROMPT,
    SUBMIT_ERROR_SPEC,
    SUBMIT_RESULT_SPEC,
)

SUBMITTED = ToolResult("r", "submit_result", "submitted; the conversation ends")


def test_submit_result_completes_and_notifies_the_parent_once() -> None:
    state = child()
    state, effects = step(state, replied(state, submit("r", "the answer"), text="here"))
    assert state.phase == Completed("the answer")
    assert effects == (
        NotifyParent("root", "root.1", ChildSucceeded("the answer")),
        TurnFinished(TurnOutcome.COMPLETED, "the answer"),
    )
    assert tool_results(state) == [SUBMITTED]


def test_submit_error_fails_with_the_submitted_error_kind() -> None:
    state = child()
    state, effects = step(state, replied(state, submit_error("e", "repository is empty")))
    assert state.phase == Failed("repository is empty", ErrorKind.SUBMITTED_ERROR)
    assert effects == (
        NotifyParent(
            "root", "root.1", ChildFailed("repository is empty", ErrorKind.SUBMITTED_ERROR)
        ),
        TurnFinished(TurnOutcome.FAILED, "repository is empty"),
    )


def test_tools_before_submit_run_first_and_calls_after_it_are_skipped() -> None:
    state = child()
    state, effects = step(state, replied(state, tool("a"), submit("r", "done"), tool("b")))
    assert [type(e) for e in effects] == [RunTool]
    state, effects = step(state, tool_done(state, "did a"))
    assert state.phase == Completed("done")
    assert [r.content for r in tool_results(state)] == [
        "did a",
        "submitted; the conversation ends",
        "skipped: the conversation stopped before this tool ran",
    ]
    assert len([e for e in effects if isinstance(e, NotifyParent)]) == 1


def test_a_malformed_submission_is_an_error_result_and_the_agent_goes_on() -> None:
    state = child()
    bad = ToolCall.of("r", "submit_result", {"answer": "wrong key"})
    state, effects = step(state, replied(state, bad))
    assert isinstance(state.phase, LlmRequesting)
    assert tool_results(state) == [
        ToolResult("r", "submit_result", "submit_result needs a string argument 'result'", True)
    ]
    assert [type(e) for e in effects] == [CallModel]


def test_a_root_is_not_offered_the_submit_tools() -> None:
    state = steps(root(), user("go"))
    state, _ = step(state, replied(state, submit("r", "done")))
    assert isinstance(state.phase, LlmRequesting)
    assert "unknown or unavailable tool 'submit_result'" in tool_results(state)[0].content


def test_the_default_round_limit_is_twenty() -> None:
    assert Limits().max_rounds == 20


def _at_grace(limits: Limits) -> Conversation:
    """A sub-agent that used its ``max_rounds`` rounds and is in its grace round."""
    state = child(limits)
    for i in range(limits.max_rounds):
        state = steps(state, replied(state, tool(f"t{i}")))
        state, effects = step(state, tool_done(state))
    assert isinstance(state.phase, LlmRequesting) and state.phase.grace
    assert only(effects, CallModel).call == state.phase.call
    request = model_request(state)
    assert request.messages[-1] == UserMessage(GRACE_PROMPT)
    assert request.tools == (SUBMIT_RESULT_SPEC, SUBMIT_ERROR_SPEC)
    assert state.rounds == limits.max_rounds
    return state


def test_max_rounds_leads_to_one_grace_round_asking_for_submit_result() -> None:
    state = _at_grace(Limits(max_rounds=2))
    assert messages_of(state)[-1] == "UserMessage"
    state, effects = step(state, replied(state, submit("r", "best effort")))
    assert state.phase == Completed("best effort")
    assert only(effects, NotifyParent).outcome == ChildSucceeded("best effort")


def test_grace_round_text_completes_with_that_text() -> None:
    state = _at_grace(Limits(max_rounds=1))
    state, _ = step(state, replied(state, text="what I found"))
    assert state.phase == Completed("what I found")


def test_grace_round_submit_error_fails_with_the_submitted_error() -> None:
    state = _at_grace(Limits(max_rounds=1))
    state, _ = step(state, replied(state, submit_error("e", "gave up")))
    assert state.phase == Failed("gave up", ErrorKind.SUBMITTED_ERROR)


def test_grace_round_without_a_result_fails_with_the_iteration_limit_kind() -> None:
    state = _at_grace(Limits(max_rounds=1))
    state, effects = step(state, replied(state, tool("more"), text="still looking"))
    assert state.phase == Failed(
        "reached the limit of 1 model rounds without a result; last text: still looking",
        ErrorKind.ITERATION_LIMIT,
    )
    assert tool_results(state)[-1].content.startswith("skipped")
    assert only(effects, NotifyParent).outcome == ChildFailed(
        state.phase.error, ErrorKind.ITERATION_LIMIT
    )


def test_grace_round_empty_text_fails_with_the_iteration_limit_kind() -> None:
    state = _at_grace(Limits(max_rounds=1))
    state, _ = step(state, replied(state, text="  "))
    assert isinstance(state.phase, Failed) and state.phase.kind is ErrorKind.ITERATION_LIMIT


def test_a_root_turn_gets_a_tool_less_grace_round_too() -> None:
    state = steps(root(Limits(max_rounds=1)), user("go"))
    state = steps(state, replied(state, tool("a")))
    state, effects = step(state, tool_done(state))
    assert only(effects, CallModel).call == call_of(state)
    request = model_request(state)
    assert request.tools == () and request.messages[-1] == UserMessage(ROOT_GRACE_PROMPT)
    answered, effects = step(state, replied(state, text="summary"))
    assert answered.phase == Idle()
    assert effects == (TurnFinished(TurnOutcome.ANSWERED, "summary"),)
    stuck, _ = step(state, replied(state, tool("b")))
    assert isinstance(stuck.phase, Error) and stuck.phase.kind is ErrorKind.ITERATION_LIMIT
    # The next turn has its full round budget again.
    again, _ = step(stuck, user("next"))
    assert again.rounds == 1 and again.phase == LlmRequesting(call=3)


def test_submit_with_children_running_cancels_them_and_completes_once_they_ack() -> None:
    state = child(Limits(max_depth=2))
    state, effects = step(state, replied(state, spawn("s", "helper"), submit("r", "early")))
    assert state.phase == CancellingSubAgents(
        children=state.phase.children,  # type: ignore[union-attr]
        results=(ToolResult("r", "submit_result", "submitted; the conversation ends"),),
        ending=EndCompleted("early"),
        grace_timer=2,
    )
    assert [type(e) for e in effects] == [
        StartTimer,  # the helper's deadline ...
        type(effects[1]),  # ... its SpawnSubAgent
        AbortCall,  # the deadline, no longer needed
        CancelSubAgents,
        StartTimer,  # cancel acknowledgement grace
    ]
    assert effects[3] == CancelSubAgents(("root.1.1",), CancelReason.PARENT)
    assert not [e for e in effects if isinstance(e, NotifyParent)]
    ack = ChildFailed("cancelled (parent)", ErrorKind.CANCELLED, CancelReason.PARENT)
    state, effects = step(state, SubAgentFinished("root.1.1", ack))
    assert state.phase == Completed("early")
    assert effects == (
        AbortCall(2),
        NotifyParent("root", "root.1", ChildSucceeded("early")),
        TurnFinished(TurnOutcome.COMPLETED, "early"),
    )


def _completed() -> Conversation:
    state = child(timeout=10.0)
    state, _ = step(state, replied(state, submit("r", "done")))
    assert state.phase == Completed("done")
    return state


@pytest.mark.parametrize(
    "event",
    [
        CancelRequested(CancelReason.PARENT),
        CancelRequested(CancelReason.TIMEOUT),
        RuntimeResumed(),
        TimerFired(0),  # its own time limit, aborted when it ended
        ModelReplied(1, ModelReply("a second reply to the last call")),
        ToolFinished(1, ToolResult("x", "bash", "late")),
    ],
)
def test_terminal_phases_absorb_late_arrivals_with_no_effects(event: object) -> None:
    state = _completed()
    assert step(state, event) == (state, ())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("event", "error", "message"),
    [
        (UserMessaged("more?"), IllegalTransition, "the conversation has ended"),
        (
            SubAgentFinished("root.1.1", ChildSucceeded("?")),
            IllegalTransition,
            "the conversation has ended",
        ),
        (TimerFired(2), UnknownCall, "call 2 was never issued"),
    ],
)
def test_terminal_phases_refuse_everything_else(
    event: object, error: type[IllegalTransition], message: str
) -> None:
    state = _completed()
    with pytest.raises(error, match=message):
        step(state, event)  # type: ignore[arg-type]


def test_failed_is_as_terminal_as_completed() -> None:
    state = child()
    state, _ = step(state, CancelRequested(CancelReason.LIMIT))
    assert state.phase == Failed(
        "cancelled (limit)", ErrorKind.BUDGET_EXHAUSTED, CancelReason.LIMIT
    )
    assert step(state, CancelRequested()) == (state, ())
    with pytest.raises(IllegalTransition):
        step(state, UserMessaged("hello"))
