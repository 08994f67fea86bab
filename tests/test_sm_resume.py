"""RuntimeResumed: after a crash the reducer re-issues whatever was in flight (same call
and timer numbers), never runs an interrupted tool twice, and replaying the logged
events rebuilds the very same state."""

from __future__ import annotations

import attrs
import pytest
import sm_support as sm
from sm_support import (
    BASH,
    READ,
    child,
    created_root,
    failed,
    only,
    replied,
    root,
    spawn,
    step,
    steps,
    submit,
    tool,
    tool_results,
    user,
)

from fanfold.statemachine import (
    CallModel,
    CancellingSubAgents,
    CancelReason,
    CancelRequested,
    CancelSubAgents,
    ChildSucceeded,
    ConversationForked,
    ErrorKind,
    Event,
    ForkEdited,
    IllegalTransition,
    Limits,
    ModelError,
    RuntimeResumed,
    RunTool,
    ScheduleRetry,
    SpawnSubAgent,
    StartTimer,
    SubAgentFinished,
    SystemPromptEdit,
    ToolExecuting,
    ToolFinished,
    ToolResult,
    fold,
    start,
    transition,
)
from fanfold.statemachine.transition import INTERRUPTED_RESULT
from fanfold.testing import check_start, check_transition


def test_resume_with_nothing_in_flight_does_nothing() -> None:
    state = root()
    assert step(state, RuntimeResumed()) == (state, ())


def test_resume_repeats_the_model_call_in_flight() -> None:
    state, effects = step(root(), user("hi"))
    assert step(state, RuntimeResumed()) == (state, effects)


def test_resume_reschedules_a_pending_retry_with_the_same_timer_and_delay() -> None:
    state = steps(root(), user("hi"))
    state, effects = step(state, failed(state, ModelError(ErrorKind.RATE_LIMIT, "x")))
    retry = only(effects, ScheduleRetry)
    assert step(state, RuntimeResumed()) == (state, (retry,))


def test_an_interrupted_tool_gets_an_error_result_and_is_never_run_twice() -> None:
    state = steps(root(), user("hi"))
    a, b = tool("a"), tool("b", "read_file")
    state, effects = step(state, replied(state, a, b))
    assert effects == (RunTool(1, a, "/work"),)
    state, effects = step(state, RuntimeResumed())
    assert effects == (RunTool(2, b, "/work"),)
    assert isinstance(state.phase, ToolExecuting)
    assert state.phase.results == (ToolResult("a", "bash", INTERRUPTED_RESULT, is_error=True),)
    # The crashed run's result, if it ever shows up, is stale.
    late = ToolFinished(1, ToolResult("a", "bash", "finished after all"))
    assert step(state, late) == (state, ())


def test_an_interrupted_last_tool_lets_the_round_continue_to_the_model() -> None:
    state = steps(root(), user("hi"))
    state = steps(state, replied(state, tool("a")))
    state, effects = step(state, RuntimeResumed())
    assert only(effects, CallModel).call == 2
    assert tool_results(state)[0].content == INTERRUPTED_RESULT


def test_resume_respawns_running_children_and_their_deadlines_but_not_queued_ones() -> None:
    state = steps(root(Limits(max_concurrent=1)), user("go"))
    state, effects = step(state, replied(state, spawn("s", "a", "b")))
    spawned = only(effects, SpawnSubAgent)
    assert spawned.child_id == "root.1"
    again, effects = step(state, RuntimeResumed())
    assert again == state
    assert effects == (spawned, StartTimer(1, 630.0, "deadline of root.1"))


def test_resume_while_cancelling_repeats_the_cancel_and_its_grace_timer() -> None:
    state = steps(root(Limits(max_concurrent=1)), user("go"))
    state, effects = step(state, replied(state, spawn("s", "a", "b")))
    spawned = only(effects, SpawnSubAgent)
    state, _ = step(state, CancelRequested())
    again, effects = step(state, RuntimeResumed())
    assert again == state
    assert effects == (
        spawned,
        CancelSubAgents(("root.1",), CancelReason.PARENT),
        StartTimer(2, 30.0, "cancel acknowledgement"),
    )


def test_resume_restarts_a_sub_agents_own_time_limit() -> None:
    state, start_effects = start(
        created_root(
            conversation_id="root.1",
            parent_id="root",
            root_id="root",
            depth=1,
            task="t",
            timeout=5.0,
        )
    )
    again, effects = step(state, RuntimeResumed())
    assert again == state
    assert effects == start_effects  # StartTimer(0, 5.0, "time limit"), CallModel(1, ...)


def test_resume_restarts_a_roots_turn_time_limit_and_none_at_rest() -> None:
    # A root's time limit is per turn: none at rest, so a restart then starts none;
    # during a turn a restart re-arms it (its remaining time is the runtime's to
    # count from the step that first started it).
    state = root(timeout=5.0)
    assert state.timeout == 5.0 and state.deadline_timer is None
    assert step(state, RuntimeResumed()) == (state, ())
    state, started = step(state, user("go"))
    assert state.deadline_timer is not None
    assert StartTimer(state.deadline_timer, 5.0, "time limit", counts_downtime=True) in started
    _, effects = step(state, RuntimeResumed())
    assert [type(e).__name__ for e in effects] == ["StartTimer", "CallModel"]


def test_resume_of_an_ended_sub_agent_is_absorbed() -> None:
    state = child()
    state = steps(state, replied(state, submit("r", "done")))
    assert step(state, RuntimeResumed()) == (state, ())


def test_replaying_the_logged_events_rebuilds_the_same_state_and_effects() -> None:
    created = created_root(Limits(max_concurrent=1), tools=(BASH, READ))
    state, _ = start(created)
    log: list[tuple[Event, tuple[object, ...]]] = []

    def record(event: Event) -> None:
        nonlocal state
        state, effects = step(state, event)
        log.append((event, effects))

    record(user("go"))
    record(replied(state, spawn("s", "a", "b"), tool("t")))
    record(SubAgentFinished("root.1", ChildSucceeded("A")))
    record(RuntimeResumed())
    record(SubAgentFinished("root.2", ChildSucceeded("B")))
    assert fold(created, [e for e, _ in log]) == state
    replayed, _ = start(created)
    for event, effects in log:
        replayed, again = transition(replayed, event)
        assert again == effects
    assert replayed == state


def test_a_fork_starts_where_its_source_rests_under_its_own_id() -> None:
    state = steps(root(), user("go"))
    state = steps(state, replied(state, spawn("s", "a")))
    state = steps(state, SubAgentFinished("root.1", ChildSucceeded("A")))
    state = steps(state, replied(state, text="ok"))
    fork = ConversationForked("fork", "root", 5, state)
    forked, effects = start(fork)
    check_start(fork, forked, effects)
    assert effects == ()
    assert (forked.id, forked.root_id, forked.history) == ("fork", "fork", state.history)
    forked = steps(forked, user("continue"))
    _, effects = step(forked, replied(forked, spawn("s2", "b")))
    assert only(effects, SpawnSubAgent).child_id == "fork.2"


def test_a_busy_state_is_forked_only_under_the_forks_ids() -> None:
    # A conversation with work in flight is forked with its whole tree, renamed by the
    # fork (issue 24): the reducer takes no state still under its source's ids.
    busy = steps(root(), user("go"))
    with pytest.raises(IllegalTransition, match="under the fork's ids"):
        start(ConversationForked("fork", "root", 1, busy))
    with pytest.raises(IllegalTransition, match="already exists"):
        transition(busy, ConversationForked("fork", "root", 1, busy))


def test_a_busy_fork_starts_as_it_was_and_resuming_reissues_its_work() -> None:
    busy = steps(root(), user("go"))
    renamed = attrs.evolve(busy, id="fork", root_id="fork")
    fork = ConversationForked("fork", "root", 1, renamed)
    forked, effects = start(fork)
    check_start(fork, forked, effects)
    assert (forked, effects) == (renamed, ())
    call = busy.phase.call  # type: ignore[union-attr]
    _, reissued = transition(forked, RuntimeResumed())
    assert CallModel(call, 1) in reissued


def test_a_forked_sub_agent_must_name_its_own_root() -> None:
    child = attrs.evolve(steps(root(), user("go")), id="f.1", parent_id="f", root_id="f.1", depth=1)
    with pytest.raises(IllegalTransition, match="root id does not match"):
        start(ConversationForked("f.1", "root.1", 0, child))


@pytest.mark.parametrize(
    "event", [RuntimeResumed(), ForkEdited(SystemPromptEdit("x"))], ids=["resume", "edit"]
)
def test_a_restart_that_goes_on_to_cancel_a_child_does_not_rearm_its_deadline(
    event: RuntimeResumed | ForkEdited,
) -> None:
    # Found by test_fork_edits' property test (2026-11-28): a round that spawned a child
    # with a time limit, then ran bash, then submits. A restart during bash gives bash the
    # interrupted result and the submit ends the round, cancelling the child in the same
    # step: the child's deadline was re-armed all the same (a timer for a child no
    # longer running, the invariant "timers run as long as their purpose says").
    limits = Limits(max_rounds=1, max_concurrent=1, max_depth=2, child_timeout=None)
    child = sm.child(limits, depth=1)
    child = sm.steps(
        child,
        sm.replied(
            child,
            sm.spawn("s", {"task": "t0", "timeout": 2}, "t1"),
            sm.tool("b"),
            sm.submit("d", "done"),
        ),
    )
    assert isinstance(child.phase, ToolExecuting) and child.phase.current.id == "b"
    after, effects = transition(child, event)
    check_transition(child, event, after, effects)  # raised before the fix
    assert isinstance(after.phase, CancellingSubAgents)
    assert not [e for e in effects if isinstance(e, StartTimer) and "deadline" in e.purpose]
