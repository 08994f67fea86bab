"""Token budgets cover a whole tree: a parent's ``max_tokens`` bounds what it and every
sub-agent below it use. Children start with a share of what is left, report what
they used, and the shares of children running at once never add up to more than
the budget (the brief: budgets must not overshoot under parallelism)."""

from __future__ import annotations

from sm_support import (
    child,
    fan_in,
    of_type,
    replied,
    root,
    spawn,
    step,
    steps,
    submit,
    tool_results,
    user,
)

from fanfold.statemachine import (
    AwaitingSubAgents,
    CancelReason,
    ChildFailed,
    ChildSucceeded,
    Conversation,
    Error,
    ErrorKind,
    Failed,
    Limits,
    NotifyParent,
    SpawnSubAgent,
    SubAgentFinished,
    TimerFired,
    Usage,
)


def _spawned(
    limits: Limits, *tasks: str, used: int = 100
) -> tuple[Conversation, list[SpawnSubAgent]]:
    """A root that used ``used`` tokens on the reply that spawned ``tasks``."""
    state = steps(root(limits), user("go"))
    state, effects = step(state, replied(state, spawn("s", *tasks), usage=Usage(used - 10, 10)))
    return state, of_type(effects, SpawnSubAgent)


def test_each_child_starts_with_a_share_and_the_parent_keeps_one() -> None:
    state, spawns = _spawned(Limits(max_tokens=1000, child_timeout=None), "a", "b", "c")
    # 900 left after the parent's own 100: split four ways (three children, the parent).
    assert [s.limits.max_tokens for s in spawns] == [225, 225, 225]
    assert isinstance(state.phase, AwaitingSubAgents)
    assert state.phase.children.reserved == 675


def test_without_a_budget_children_get_none_but_still_report_what_they_used() -> None:
    state, spawns = _spawned(Limits(child_timeout=None), "a", "b")
    assert [s.limits.max_tokens for s in spawns] == [None, None]
    state = steps(
        state,
        SubAgentFinished("root.1", ChildSucceeded("A", tokens=70)),
        SubAgentFinished("root.2", ChildFailed("no", ErrorKind.AUTH, tokens=30)),
    )
    assert (state.usage.total, state.usage_children, state.tokens_spent) == (100, 100, 200)


def test_a_child_reports_its_own_and_its_sub_agents_tokens() -> None:
    limits = Limits(max_tokens=5000, max_depth=2, child_timeout=None)
    me = child(limits, depth=1)
    me, effects = step(me, replied(me, spawn("s", "x"), usage=Usage(150, 50)))
    (grandchild,) = of_type(effects, SpawnSubAgent)
    assert grandchild.limits.max_tokens == (5000 - 200) // 2
    me = steps(me, SubAgentFinished(f"{me.id}.1", ChildSucceeded("X", tokens=300)))
    me, effects = step(me, replied(me, submit("f", "done"), usage=Usage(40, 10)))
    (notice,) = of_type(effects, NotifyParent)
    assert notice.outcome == ChildSucceeded("done", tokens=200 + 300 + 50)


def test_queued_children_start_on_what_finished_ones_left() -> None:
    limits = Limits(max_tokens=1000, max_concurrent=1, child_timeout=None)
    state, spawns = _spawned(limits, "a", "b")
    assert [s.limits.max_tokens for s in spawns] == [900 // 3]  # b waits; the parent too
    # a used 50 of its 300: b gets a share of 1000 - 100 - 50 = 850, split with the parent.
    state, effects = step(state, SubAgentFinished("root.1", ChildSucceeded("A", tokens=50)))
    (second,) = of_type(effects, SpawnSubAgent)
    assert second.limits.max_tokens == 850 // 2


def test_when_nothing_is_left_queued_children_never_start() -> None:
    limits = Limits(max_tokens=1000, max_concurrent=1, child_timeout=None)
    state, _ = _spawned(limits, "a", "b", "c")
    # a overran its share (a model call's usage is known only after the call).
    state, effects = step(state, SubAgentFinished("root.1", ChildSucceeded("A", tokens=950)))
    assert of_type(effects, SpawnSubAgent) == []
    (result,) = tool_results(state)
    entries = fan_in(result.content)["sub_agent_results"]
    assert [(e["agent_id"], e["status"]) for e in entries] == [
        ("root.1", "completed"),
        ("root.2", "failed"),
        ("root.3", "failed"),
    ]
    assert entries[1]["error_kind"] == ErrorKind.BUDGET_EXHAUSTED
    assert "token budget of 1000 is used up" in entries[1]["error"]
    # The parent's next reply asking for tools hits the budget of the whole tree.
    state, _ = step(state, replied(state, spawn("t", "d"), usage=Usage(1, 1)))
    assert isinstance(state.phase, Error) and state.phase.kind is ErrorKind.BUDGET_EXHAUSTED
    assert "1052 used" in state.phase.error


def test_a_share_of_one_token_still_starts_a_child() -> None:
    # 103 - 100 = 3 tokens left for two children and the parent: one each.
    _, spawns = _spawned(Limits(max_tokens=103, child_timeout=None), "a", "b")
    assert [s.limits.max_tokens for s in spawns] == [1, 1]


def test_a_child_refused_its_share_while_others_run_records_the_limit() -> None:
    limits = Limits(max_tokens=1000, max_concurrent=2, child_timeout=None)
    state, _ = _spawned(limits, "a", "b", "c")
    state, effects = step(state, SubAgentFinished("root.1", ChildSucceeded("A", tokens=900)))
    assert of_type(effects, SpawnSubAgent) == []
    assert isinstance(state.phase, AwaitingSubAgents)  # b still runs
    (refused,) = [f.outcome for f in state.phase.children.finished if f.spec.id == "root.3"]
    assert refused == ChildFailed(
        "not started: the token budget of 1000 is used up",
        ErrorKind.BUDGET_EXHAUSTED,
        CancelReason.LIMIT,
    )


def test_a_written_off_child_is_charged_its_whole_share() -> None:
    limits = Limits(max_tokens=1000, child_timeout=60.0)
    state, spawns = _spawned(limits, "a", "b")
    assert [s.limits.max_tokens for s in spawns] == [300, 300]
    assert isinstance(state.phase, AwaitingSubAgents)
    deadline = state.phase.children.pending[0].deadline_timer
    assert deadline is not None
    state = steps(state, TimerFired(deadline))  # a never reported
    assert state.usage_children == 300
    outcome = ChildFailed("late", ErrorKind.TIMED_OUT, CancelReason.TIMEOUT, tokens=999)
    state = steps(state, SubAgentFinished("root.1", outcome))  # absorbed: not charged again
    assert state.usage_children == 300


def test_a_queued_child_without_a_share_is_not_overtaken_by_younger_ones() -> None:
    """3 tokens left for 4 children: no share is worth a token, and none of them may
    start ahead of an older one that got nothing."""
    state, spawns = _spawned(Limits(max_tokens=103, child_timeout=None), "a", "b", "c", "d")
    assert spawns == []
    (result,) = tool_results(state)
    entries = fan_in(result.content)["sub_agent_results"]
    assert [e["status"] for e in entries] == ["failed"] * 4


def test_spending_exactly_the_budget_ends_a_sub_agent_cancelled_by_the_limit() -> None:
    """A reply that brings the tokens spent to exactly ``max_tokens`` and asks for tools
    ends the conversation (the budget is spent, not exceeded), and a sub-agent's
    outcome says who stopped it: the limit (mutation survivors: ``>`` for ``>=``, the
    reason left out)."""
    me = child(Limits(max_tokens=100, child_timeout=None))
    me, effects = step(me, replied(me, spawn("s", "never"), usage=Usage(60, 40)))
    assert me.tokens_spent == 100
    assert isinstance(me.phase, Failed)
    assert (me.phase.kind, me.phase.reason) == (ErrorKind.BUDGET_EXHAUSTED, CancelReason.LIMIT)
    assert not of_type(effects, SpawnSubAgent)
    below = child(Limits(max_tokens=101, child_timeout=None))
    below, _ = step(below, replied(below, spawn("s", "runs"), usage=Usage(60, 40)))
    assert not isinstance(below.phase, Failed)
    root_state = steps(root(Limits(max_tokens=100)), user("go"))
    root_state, _ = step(root_state, replied(root_state, spawn("s", "x"), usage=Usage(99, 1)))
    assert isinstance(root_state.phase, Error) and root_state.phase.kind is (
        ErrorKind.BUDGET_EXHAUSTED
    )
