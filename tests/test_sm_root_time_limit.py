"""A root's own time limit (``ConversationCreated.timeout`` on a root): per turn.

A delegated tree's root runs as an agent definition (``fanfold mcp``'s
``delegate_task``), and the definition's ``timeout`` bounds each of its turns as it
bounds a spawned child: a timer armed when a turn starts, aborted when it ends,
and when it fires the turn ends in error ``timed_out`` (its children cancelled
first), not as a user's cancel."""

from __future__ import annotations

from sm_support import only, replied, root, spawn, step, steps, user

from fanfold.statemachine import (
    AbortCall,
    CancellingSubAgents,
    CancelSubAgents,
    Error,
    ErrorKind,
    Idle,
    StartTimer,
    TimerFired,
    TurnFinished,
    TurnOutcome,
)


def test_each_turn_gets_the_time_limit_and_an_answer_aborts_it() -> None:
    state, effects = step(root(timeout=5.0), user("go"))
    timer = only(effects, StartTimer)
    assert (timer.timer, timer.delay, timer.counts_downtime) == (0, 5.0, True)
    assert state.deadline_timer == 0
    state, effects = step(state, replied(state, text="done"))
    assert isinstance(state.phase, Idle) and state.deadline_timer is None
    assert AbortCall(0) in effects
    assert only(effects, TurnFinished).outcome is TurnOutcome.ANSWERED
    # The next turn has a time limit of its own, with a fresh number.
    state, effects = step(state, user("again"))
    assert state.deadline_timer == only(effects, StartTimer).timer > 0


def test_a_turn_past_its_time_limit_ends_in_error_timed_out() -> None:
    state, _ = step(root(timeout=5.0), user("go"))
    state, effects = step(state, TimerFired(state.deadline_timer or 0))
    assert state.phase == Error("time limit of 5.0s reached", ErrorKind.TIMED_OUT)
    assert state.deadline_timer is None
    assert only(effects, TurnFinished).outcome is TurnOutcome.ERROR
    # The model call in flight is aborted; a new message starts a new turn.
    assert any(isinstance(e, AbortCall) for e in effects)
    state, _ = step(state, user("try again"))
    assert state.deadline_timer is not None


def test_a_turn_waiting_for_children_cancels_them_first() -> None:
    state, _ = step(root(timeout=5.0), user("go"))
    state = steps(state, replied(state, spawn("c1", "a", "b")))
    state, effects = step(state, TimerFired(state.deadline_timer or 0))
    assert isinstance(state.phase, CancellingSubAgents)
    assert only(effects, CancelSubAgents).ids == ("root.1", "root.2")


def test_a_root_without_a_time_limit_arms_nothing() -> None:
    state, effects = step(root(), user("go"))
    assert state.deadline_timer is None
    assert not any(isinstance(e, StartTimer) for e in effects)
