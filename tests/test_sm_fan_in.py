"""Issue 2, behaviour 4: fan-in. Each child's outcome is accepted exactly once (unknown
or duplicate outcomes raise), an early finisher is not lost, siblings never disturb
each other, and the model gets one aggregated, length-capped tool result."""

from __future__ import annotations

import pytest
from sm_support import (
    fan_in,
    of_type,
    only,
    replied,
    root,
    spawn,
    step,
    steps,
    tool,
    tool_done,
    tool_results,
    user,
)

from fanfold.statemachine import (
    AbortCall,
    AwaitingSubAgents,
    CallModel,
    CancelReason,
    CancelSubAgents,
    ChildFailed,
    ChildSucceeded,
    Conversation,
    DuplicateChildOutcome,
    ErrorKind,
    IllegalTransition,
    Limits,
    LlmRequesting,
    SpawnSubAgent,
    SubAgentFinished,
    TimerFired,
    ToolExecuting,
    ToolResultMessage,
    UnknownChild,
    model_request,
)
from fanfold.statemachine.children import Children, ChildSpec, FinishedChild, PendingChild
from fanfold.statemachine.messages import canonical_json


def _waiting(limits: Limits | None = None, *tasks: str) -> Conversation:
    state = steps(root(limits), user("go"))
    state, _ = step(state, replied(state, spawn("s", *(tasks or ("a", "b", "c")))))
    assert isinstance(state.phase, AwaitingSubAgents)
    return state


def test_each_outcome_is_accepted_once_and_the_last_one_calls_the_model() -> None:
    state = _waiting()
    state, effects = step(state, SubAgentFinished("root.2", ChildSucceeded("B")))
    assert effects == (AbortCall(2),)
    assert isinstance(state.phase, AwaitingSubAgents)
    assert state.phase.children.pending_ids() == ("root.1", "root.3")
    state = steps(state, SubAgentFinished("root.3", ChildSucceeded("C")))
    state, effects = step(state, SubAgentFinished("root.1", ChildSucceeded("A")))
    assert [type(e) for e in effects] == [AbortCall, CallModel]
    assert state.phase == LlmRequesting(call=4)
    # Children listed in the order they were requested, not the order they finished.
    (result,) = tool_results(state)
    assert result.tool_call_id == "s" and not result.is_error
    assert fan_in(result.content) == {
        "sub_agent_results": [
            {"agent_id": "root.1", "task": "a", "status": "completed", "result": "A"},
            {"agent_id": "root.2", "task": "b", "status": "completed", "result": "B"},
            {"agent_id": "root.3", "task": "c", "status": "completed", "result": "C"},
        ]
    }
    # The aggregated result is part of what the model sees next.
    assert only(effects, CallModel).call == state.next_call - 1
    assert ToolResultMessage(result) in model_request(state).messages


def test_an_unknown_outcome_raises_and_changes_nothing() -> None:
    state = _waiting()
    event = SubAgentFinished("root.9", ChildSucceeded("?"))
    with pytest.raises(UnknownChild) as caught:
        step(state, event)
    assert caught.value.state is state and caught.value.event is event
    assert "SubAgentFinished for unknown agent 'root.9'" in str(caught.value)
    assert str(caught.value).startswith("can't handle SubAgentFinished in AwaitingSubAgents")
    # Nothing changed: the same state still accepts the real outcomes.
    state, _ = step(state, SubAgentFinished("root.1", ChildSucceeded("A")))
    assert isinstance(state.phase, AwaitingSubAgents)


def test_a_duplicate_outcome_raises_and_changes_nothing() -> None:
    state = _waiting()
    state, _ = step(state, SubAgentFinished("root.1", ChildSucceeded("A")))
    duplicate = SubAgentFinished("root.1", ChildFailed("again", ErrorKind.CANCELLED))
    with pytest.raises(
        DuplicateChildOutcome, match=r"outcome of agent 'root\.1' was already"
    ) as refused:
        step(state, duplicate)
    assert refused.value.state is state and refused.value.event is duplicate
    assert isinstance(state.phase, AwaitingSubAgents)
    assert [f.outcome for f in state.phase.children.finished] == [ChildSucceeded("A")]


def test_an_outcome_when_no_children_are_pending_raises() -> None:
    state = steps(root(), user("go"))
    with pytest.raises(UnknownChild, match="no children are pending"):
        step(state, SubAgentFinished("root.1", ChildSucceeded("A")))


def test_an_outcome_of_a_queued_child_raises() -> None:
    state = _waiting(Limits(max_concurrent=1), "a", "b")
    with pytest.raises(IllegalTransition, match=r"'root\.2' is queued and has not started"):
        step(state, SubAgentFinished("root.2", ChildSucceeded("B")))


def test_a_child_finishing_before_the_parent_leaves_tool_executing_is_not_lost() -> None:
    state = steps(root(), user("go"))
    state, effects = step(state, replied(state, spawn("s", "a", "b"), tool("t")))
    assert isinstance(state.phase, ToolExecuting)
    assert _ids(effects) == ["root.1", "root.2"]
    state, effects = step(state, SubAgentFinished("root.1", ChildSucceeded("early")))
    assert effects == (AbortCall(1),)
    state = steps(state, SubAgentFinished("root.2", ChildFailed("broke", ErrorKind.AUTH)))
    assert isinstance(state.phase, ToolExecuting)
    state, effects = step(state, tool_done(state, "tool output"))
    assert isinstance(state.phase, LlmRequesting)
    spawn_result, tool_result = tool_results(state)
    assert tool_result.content == "tool output"
    assert fan_in(spawn_result.content)["sub_agent_results"] == [
        {"agent_id": "root.1", "task": "a", "status": "completed", "result": "early"},
        {
            "agent_id": "root.2",
            "task": "b",
            "status": "failed",
            "error": "broke",
            "error_kind": "auth",
        },
    ]


def test_a_child_still_running_after_the_tools_is_waited_for() -> None:
    state = steps(root(), user("go"))
    state, _ = step(state, replied(state, spawn("s", "a"), tool("t")))
    state, effects = step(state, tool_done(state))
    assert effects == ()
    assert isinstance(state.phase, AwaitingSubAgents)
    state, effects = step(state, SubAgentFinished("root.1", ChildSucceeded("A")))
    assert isinstance(only(effects, CallModel), CallModel)


def test_failing_timing_out_and_cancelled_siblings_do_not_disturb_each_other() -> None:
    state = _waiting(None, "fails", "hangs", "succeeds", "cancelled")
    state, effects = step(state, SubAgentFinished("root.1", ChildFailed("no", ErrorKind.AUTH)))
    assert effects == (AbortCall(1),)
    # root.2 never reports: its deadline (time limit + grace) writes it off.
    state, effects = step(state, TimerFired(2))
    assert effects == (CancelSubAgents(("root.2",), CancelReason.TIMEOUT),)
    assert state.written_off == ("root.2",)
    assert isinstance(state.phase, AwaitingSubAgents)
    assert state.phase.children.pending_ids() == ("root.3", "root.4")
    cancelled = ChildFailed("cancelled (user)", ErrorKind.CANCELLED, CancelReason.USER)
    state = steps(state, SubAgentFinished("root.4", cancelled))
    state, effects = step(state, SubAgentFinished("root.3", ChildSucceeded("fine")))
    assert isinstance(state.phase, LlmRequesting)
    (result,) = tool_results(state)
    entries = fan_in(result.content)["sub_agent_results"]
    assert [(e["agent_id"], e["status"]) for e in entries] == [
        ("root.1", "failed"),
        ("root.2", "failed"),
        ("root.3", "completed"),
        ("root.4", "failed"),
    ]
    assert entries[1]["error_kind"] == "timed_out"
    assert entries[1]["error"] == "did not report within its time limit of 600.0s (+30.0s grace)"
    assert entries[2]["result"] == "fine"
    assert entries[3]["error_kind"] == "cancelled"
    assert not result.is_error  # one child succeeded
    # The written-off child's late outcome is absorbed, whenever it arrives.
    assert step(state, SubAgentFinished("root.2", ChildSucceeded("late"))) == (state, ())


def test_the_spawn_result_is_an_error_only_when_no_child_succeeded() -> None:
    state = _waiting(None, "a", "b")
    state = steps(
        state,
        SubAgentFinished("root.1", ChildFailed("x", ErrorKind.NETWORK)),
        SubAgentFinished("root.2", ChildFailed("y", ErrorKind.ITERATION_LIMIT)),
    )
    assert tool_results(state)[0].is_error


def test_results_and_errors_are_length_capped() -> None:
    state = _waiting(Limits(child_result_cap=10), "t" * 12, "b")
    state = steps(
        state,
        SubAgentFinished("root.1", ChildSucceeded("x" * 25)),
        SubAgentFinished("root.2", ChildFailed("e" * 11, ErrorKind.AUTH)),
    )
    first, second = fan_in(tool_results(state)[0].content)["sub_agent_results"]
    assert first["task"] == "t" * 10 + "... [truncated 2 characters]"
    assert first["result"] == "x" * 10 + "... [truncated 15 characters]"
    assert second["error"] == "e" * 10 + "... [truncated 1 characters]"


def test_children_of_two_spawn_calls_fan_in_to_their_own_call() -> None:
    state = steps(root(), user("go"))
    state, _ = step(state, replied(state, spawn("s1", "a"), spawn("s2", "b", "c")))
    state = steps(
        state,
        SubAgentFinished("root.3", ChildSucceeded("C")),
        SubAgentFinished("root.1", ChildSucceeded("A")),
        SubAgentFinished("root.2", ChildSucceeded("B")),
    )
    first, second = tool_results(state)
    assert first.tool_call_id == "s1" and second.tool_call_id == "s2"
    assert [e["agent_id"] for e in fan_in(first.content)["sub_agent_results"]] == ["root.1"]
    assert [e["agent_id"] for e in fan_in(second.content)["sub_agent_results"]] == [
        "root.2",
        "root.3",
    ]


def _ids(effects: tuple[object, ...]) -> list[str]:
    return [e.child_id for e in of_type(effects, SpawnSubAgent)]  # type: ignore[arg-type]


def test_a_child_that_never_submitted_has_its_own_status_in_the_fan_in() -> None:
    """Issue 13, item 4: plain text is a result, but the parent sees it was not submitted."""
    state = _waiting(None, "a", "b")
    state = steps(
        state,
        SubAgentFinished("root.1", ChildSucceeded("said so", submitted=False)),
        SubAgentFinished("root.2", ChildSucceeded("B")),
    )
    (result,) = tool_results(state)
    assert not result.is_error  # a result is a result
    assert fan_in(result.content)["sub_agent_results"] == [
        {
            "agent_id": "root.1",
            "task": "a",
            "status": "completed_without_submit",
            "result": "said so",
        },
        {"agent_id": "root.2", "task": "b", "status": "completed", "result": "B"},
    ]


@pytest.mark.parametrize("size", [3, 20])  # a scan, and beyond _SCAN_LIMIT a binary search
def test_children_find_exactly_their_pending_children_by_id(size: int) -> None:
    specs = [ChildSpec(f"root.{i}", "t", "/work", None, 3, "s") for i in range(1, size + 2)]
    done = FinishedChild(specs[0], ChildSucceeded("r"))
    children = Children(pending=tuple(PendingChild(s) for s in specs[1:]), finished=(done,))
    for index, spec in enumerate(specs[1:]):
        assert children.index_of(spec.id) == index
        assert children.find_pending(spec.id) == PendingChild(spec)
    for absent in ("root.1", f"root.{size + 2}", "root.x", "other.2", "root"):
        assert children.index_of(absent) == -1, absent
        assert children.find_pending(absent) is None, absent
    assert children.is_finished("root.1") and not children.is_finished("root.2")


def test_canonical_json_is_sorted_and_compact() -> None:
    # The fan-in, tool arguments and schemas are written this one way (the log too).
    assert canonical_json({"b": 1, "a": [1, "é"]}) == '{"a":[1,"é"],"b":1}'
