"""Example tests of the rules the mutation run found unstated (issue 15, "The proof").

Each rule also has an invariant in ``fanfold.testing`` (checked on every generated step,
and on every step here through ``sm_support.step``); these examples pin the boundary
cases a generated run meets only by luck.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest
import sm_support as sm
from hypothesis import given, settings

from fanfold import testing
from fanfold.statemachine import (
    AwaitingSubAgents,
    CallModel,
    CancelReason,
    CancelRequested,
    ChildSucceeded,
    Conversation,
    ConversationCreated,
    ConversationForked,
    Error,
    ErrorKind,
    Failed,
    IllegalTransition,
    Limits,
    LlmRequesting,
    ModelError,
    ModelRequest,
    RuntimeResumed,
    RunTool,
    ScheduleRetry,
    SpawnSubAgent,
    StartTimer,
    SubAgentFinished,
    TimerFired,
    ToolCall,
    ToolExecuting,
    Usage,
    UserMessage,
    model_request,
    spawn_order,
    start,
    transition,
)

LIMITS = Limits(max_rounds=3, max_depth=2, child_timeout=60.0, cancel_grace=10.0)


def _spawned(entry: Any) -> tuple[list[SpawnSubAgent], dict[str, Any]]:
    """A root spawns one task ``entry``: the spawns, and the fan-in or error result."""
    state = sm.steps(sm.root(LIMITS), sm.user("go"))
    after, effects = sm.step(state, sm.replied(state, sm.spawn("s", entry)))
    spawns = sm.of_type(effects, SpawnSubAgent)
    if spawns:
        return spawns, {}
    (result,) = sm.tool_results(after)
    return spawns, {"error": result.content, "is_error": result.is_error}


# ------------------------------------------------------------------ task validation


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        # The boundaries that are accepted: the least time above 0, one round.
        ({"task": "t", "timeout": 5e-324}, (5e-324, 3)),
        ({"task": "t", "timeout": 1e-06}, (1e-06, 3)),
        ({"task": "t", "max_iterations": 1}, (60.0, 1)),
        # ``null`` is an absent field; numbers above the parent's limits are capped.
        ({"task": "t", "timeout": None, "max_iterations": None, "model": None}, (60.0, 3)),
        ({"task": "t", "timeout": 1e9, "max_iterations": 1000}, (60.0, 3)),
    ],
)
def test_boundary_tasks_are_accepted(entry: dict[str, Any], expected: tuple[float, int]) -> None:
    (spawn,), _ = _spawned(entry)
    assert (spawn.timeout, spawn.max_rounds) == expected


POSITIVE = "'timeout' must be a positive number of seconds"
AT_LEAST_1 = "'max_iterations' must be an integer >= 1"
NON_EMPTY = "'{}' must be a non-empty string"


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"task": "t", "colour": "red"}, "unknown field(s): colour"),
        ({"task": "t", "size": 1, "colour": "red"}, "unknown field(s): colour, size"),
        ({"task": "t", "timeout": 0}, POSITIVE),
        ({"task": "t", "timeout": "2"}, POSITIVE),
        ({"task": "t", "timeout": True}, POSITIVE),
        ({"task": "t", "max_iterations": 0}, AT_LEAST_1),
        ({"task": "t", "max_iterations": 1.5}, AT_LEAST_1),
        ({"task": "t", "max_iterations": True}, AT_LEAST_1),
        ({"task": "t", "model": ""}, NON_EMPTY.format("model")),
        ({"task": "t", "model": 7}, NON_EMPTY.format("model")),
        ({"task": "t", "cwd": 5}, NON_EMPTY.format("cwd")),
        ({"task": " "}, NON_EMPTY.format("task")),
        ({"task": ["t"]}, NON_EMPTY.format("task")),
        (5, 'each task must be an object like {"task": "..."}'),
    ],
)
def test_wrong_tasks_are_refused_with_the_reason(entry: Any, why: str) -> None:
    """The model is told exactly why (the text of the error result it reads)."""
    spawns, result = _spawned(entry)
    assert spawns == []
    assert result["is_error"] and result["error"].endswith(f": not spawned: {why}")


# ------------------------------------------------------------------ submissions


@pytest.mark.parametrize("arguments", ['["result", "x"]', '"x"', "null", "7", '{"result": 7}'])
@pytest.mark.parametrize("name", ["submit_result", "submit_error"])
def test_a_submission_that_is_no_object_is_refused_and_the_sub_agent_goes_on(
    name: str, arguments: str
) -> None:
    arguments = arguments.replace("result", "result" if name == "submit_result" else "error")
    state = sm.child(LIMITS)
    after, effects = sm.step(state, sm.replied(state, ToolCall("c", name, arguments)))
    (result,) = sm.tool_results(after)
    assert result.is_error and "needs a string argument" in result.content
    assert isinstance(after.phase, LlmRequesting) and sm.only(effects, CallModel)


def test_a_refused_submission_lets_the_rest_of_the_reply_run() -> None:
    state = sm.child(LIMITS)
    bad = ToolCall("c", "submit_result", "null")
    after, effects = sm.step(state, sm.replied(state, bad, sm.tool("t", command="ls")))
    assert isinstance(after.phase, ToolExecuting) and after.phase.current.id == "t"
    assert sm.only(effects, RunTool).tool_call.id == "t"


# ------------------------------------------------------------------ start


def test_start_keeps_a_root_at_depth_0_and_a_sub_agent_deeper() -> None:
    assert sm.root(LIMITS).depth == 0
    for depth in (1, 2):
        assert sm.child(LIMITS, depth=depth).depth == depth
    for bad in (
        sm.created_root(LIMITS, depth=1),
        sm.created_root(LIMITS, depth=-1),
        sm.created_child(LIMITS, depth=0),
        sm.created_child(LIMITS, task=None),
        sm.created_child(LIMITS, task=""),
        sm.created_child(LIMITS, timeout=-1.0),
        sm.created_child(LIMITS, timeout=math.nan),
        sm.created_child(LIMITS, timeout=math.inf),
    ):
        with pytest.raises(IllegalTransition):
            start(bad)


def test_a_sub_agent_asks_its_model_its_task_at_once() -> None:
    created = sm.created_child(LIMITS, model="small", timeout=0.0, sub_agent_prompt="alone")
    state, effects = sm.begin(created)
    assert effects == (
        StartTimer(0, 0.0, "time limit", counts_downtime=True),
        CallModel(1, 1),
    )
    assert model_request(state) == ModelRequest(
        "be brief", (UserMessage("count the files"),), state.tools, "small"
    )
    assert (state.task, state.model, state.sub_agent_prompt) == (
        "count the files",
        "small",
        "alone",
    )


def test_a_spawned_child_is_created_from_its_spawn_field_by_field() -> None:
    parent = sm.child(LIMITS, model="big", sub_agent_prompt="alone")
    task = {"task": "t", "cwd": "sub", "timeout": 5, "max_iterations": 2, "model": "small"}
    _, effects = sm.step(parent, sm.replied(parent, sm.spawn("s", task)))
    spawn = sm.only(effects, SpawnSubAgent)
    created = spawn.created_event()
    assert created == ConversationCreated(
        conversation_id="root.1.1",
        parent_id="root.1",
        root_id="root",
        depth=2,
        cwd="/work/sub",
        task="t",
        system_prompt="alone",
        model="small",
        limits=attrs.evolve(LIMITS, max_rounds=2),
        tools=sm.TOOLS,
        timeout=5.0,
        sub_agent_prompt="alone",
    )
    child, _ = sm.begin(created)
    assert (child.depth, child.task, child.model, child.limits.max_rounds) == (2, "t", "small", 2)


# ------------------------------------------------------------------ budgets


def _budgeted_parent(budget: int) -> Any:
    limits = Limits(max_rounds=3, max_concurrent=2, child_timeout=30.0, max_tokens=budget)
    state = sm.steps(sm.root(limits), sm.user("go"))
    return sm.step(state, sm.replied(state, sm.spawn("s", "a", "b")))


def test_a_written_off_child_is_charged_its_whole_share() -> None:
    state, effects = _budgeted_parent(300)
    deadlines = sm.of_type(effects, StartTimer)
    shares = [s.limits.max_tokens for s in sm.of_type(effects, SpawnSubAgent)]
    assert shares == [100, 100]  # a third each: two children and the parent
    state, _ = sm.step(state, TimerFired(deadlines[0].timer))
    assert state.usage_children == 100 and state.written_off == ("root.1",)
    state, _ = sm.step(state, SubAgentFinished("root.2", ChildSucceeded("ok", tokens=7)))
    assert state.usage_children == 107


@pytest.mark.parametrize(("spent", "ends"), [(99, False), (100, True)])
def test_spending_exactly_the_budget_ends_the_next_tool_round(spent: int, ends: bool) -> None:
    state = sm.child(Limits(max_tokens=100))
    after, _ = sm.step(state, sm.replied(state, sm.tool("a"), usage=Usage(spent, 0)))
    if ends:
        assert after.phase == Failed(
            "token budget of 100 exhausted (100 used)",
            ErrorKind.BUDGET_EXHAUSTED,
            CancelReason.LIMIT,
        )
    else:
        assert isinstance(after.phase, ToolExecuting)


def test_a_root_out_of_budget_ends_its_turn_in_error() -> None:
    state = sm.steps(sm.root(Limits(max_tokens=10)), sm.user("go"))
    after, _ = sm.step(state, sm.replied(state, sm.tool("a"), usage=Usage(10, 0)))
    assert after.phase == Error(
        "token budget of 10 exhausted (10 used)", ErrorKind.BUDGET_EXHAUSTED
    )


def test_a_restart_reissues_each_running_child_with_its_share() -> None:
    state, first = _budgeted_parent(300)
    assert isinstance(state.phase, AwaitingSubAgents)
    _, again = sm.step(state, RuntimeResumed())
    assert sm.of_type(again, SpawnSubAgent) == sm.of_type(first, SpawnSubAgent)
    assert sm.of_type(again, StartTimer) == sm.of_type(first, StartTimer)


# ------------------------------------------------------------------ backoff


def _retry(conversation: str, lim: Limits, hint: float | None, failures: int) -> list[float]:
    state = sm.steps(sm.root(lim, conversation_id=conversation), sm.user("go"))
    delays = []
    for _ in range(failures):
        error = ModelError(ErrorKind.RATE_LIMIT, "slow down", retry_after=hint)
        state, effects = sm.step(state, sm.failed(state, error))
        retry = sm.only(effects, ScheduleRetry)
        delays.append(retry.delay)
        state, _ = sm.step(state, TimerFired(retry.timer))
    return delays


def test_backoff_jitter_depends_on_the_conversation_and_the_timer() -> None:
    lim = Limits(max_attempts=5, retry_base=8.0, retry_cap=1000.0)
    ours = _retry("root", lim, None, 3)
    theirs = _retry("other", lim, None, 3)
    assert ours != theirs  # a different conversation waits differently
    for n, delay in enumerate(ours):
        assert 4.0 * 2**n <= delay <= 8.0 * 2**n  # equal jitter: 50-100 % of the step
    assert ours == _retry("root", lim, None, 3)  # and always the same for the same one


def test_a_retry_hint_of_0_means_at_once() -> None:
    assert _retry("root", Limits(max_attempts=3), 0.0, 2) == [0.0, 0.0]
    assert _retry("root", Limits(max_attempts=3, retry_cap=2.0), 30.0, 1) == [2.0]


# ------------------------------------------------------------------ backstop and reasons


@pytest.mark.parametrize(("depth", "levels"), [(1, 2), (2, 1)])
def test_the_backstop_of_a_sub_agent_counts_the_levels_below_it(depth: int, levels: int) -> None:
    parent = sm.child(Limits(max_depth=3, child_timeout=100.0, cancel_grace=10.0), depth=depth)
    _, effects = sm.step(parent, sm.replied(parent, sm.spawn("s", "deep")))
    (deadline,) = [e for e in sm.of_type(effects, StartTimer) if e.purpose.startswith("deadline")]
    assert deadline.delay == 100.0 + levels * 10.0


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        (CancelReason.USER, ErrorKind.CANCELLED),
        (CancelReason.PARENT, ErrorKind.CANCELLED),
        (CancelReason.TIMEOUT, ErrorKind.TIMED_OUT),
        (CancelReason.LIMIT, ErrorKind.BUDGET_EXHAUSTED),
    ],
)
def test_a_cancelled_sub_agent_fails_with_the_kind_its_reason_implies(
    reason: CancelReason, kind: ErrorKind
) -> None:
    state = sm.child(LIMITS)
    after, _ = sm.step(state, CancelRequested(reason))
    assert isinstance(after.phase, Failed)
    assert (after.phase.kind, after.phase.reason) == (kind, reason)


# ------------------------------------------------------------------ fan-in order


def test_a_sub_agents_fan_in_lists_its_children_in_spawn_order() -> None:
    """Eleven children of ``root.1``, finishing last first: ``root.1.10`` comes after
    ``root.1.9``, not after ``root.1.1`` as their spelling would sort."""
    lim = Limits(max_depth=2, max_tasks_per_call=11, max_concurrent=11, child_timeout=None)
    state = sm.child(lim)
    state = sm.steps(state, sm.replied(state, sm.spawn("s", *[f"t{i}" for i in range(11)])))
    ids = [f"root.1.{n}" for n in range(1, 12)]
    for child in reversed(ids):
        state = sm.steps(state, SubAgentFinished(child, ChildSucceeded(child)))
    fan_in = sm.fan_in(sm.tool_results(state)[-1].content)
    assert [e["agent_id"] for e in fan_in["sub_agent_results"]] == ids
    assert fan_in["sub_agent_results"][9]["result"] == "root.1.10"
    assert isinstance(state.phase, LlmRequesting)


# ------------------------------------------------------------------ refusals and forks


@settings(max_examples=100, deadline=None)
@given(testing.conversations())
def test_every_refusal_names_the_state_and_the_event_it_refused(state: Conversation) -> None:
    for rejected in testing.rejections(state):
        with pytest.raises(rejected.error) as caught:
            transition(state, rejected.event)
        assert caught.value.state is state and caught.value.event is rejected.event


def test_a_refused_start_names_its_event() -> None:
    created = sm.created_child(LIMITS, depth=0)
    with pytest.raises(IllegalTransition) as caught:
        start(created)
    assert caught.value.state is None and caught.value.event is created
    busy = sm.steps(sm.root(LIMITS), sm.user("go"))
    fork = ConversationForked("fork", "root", 1, busy)
    with pytest.raises(IllegalTransition) as refused:
        start(fork)
    assert refused.value.state is busy and refused.value.event is fork


def test_a_fork_forgets_the_children_its_source_wrote_off() -> None:
    """The source's written-off children are not the fork's: their late outcomes are
    refused, not absorbed."""
    lim = Limits(max_concurrent=1, child_timeout=5.0, cancel_grace=1.0)
    state = sm.steps(sm.root(lim), sm.user("go"))
    state, effects = sm.step(state, sm.replied(state, sm.spawn("s", "a")))
    state, _ = sm.step(state, TimerFired(sm.only(effects, StartTimer).timer))
    state = sm.steps(state, sm.replied(state, text="done"))
    assert state.written_off == ("root.1",)
    fork = ConversationForked("fork", "root", 7, state)
    forked, effects = start(fork)
    testing.check_start(fork, forked, effects)
    assert forked.written_off == () and effects == ()
    with pytest.raises(IllegalTransition):
        transition(forked, SubAgentFinished("root.1", ChildSucceeded("late")))


def test_spawn_order_sorts_by_spawn_number_and_foreign_ids_first() -> None:
    """``spawn_order`` also sorts ids read from logs (``show``, the runtime's tree), where
    an id need not be ``<parent>.<n>``: such an id sorts before every child."""
    wide = "root.1.\N{FULLWIDTH DIGIT ONE}"  # a digit, but not an ASCII one
    ids = ["root.10", "x", "root.2", wide, "root.1"]
    assert sorted(ids, key=spawn_order) == [wide, "x", "root.1", "root.2", "root.10"]
