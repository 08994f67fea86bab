"""What a model says in a tool call cannot hurt the conversation tree (issue 10): task
numbers are capped by the parent's limits, non-finite numbers are refused, and a
sub-agent's working directory stays inside its parent's."""

from __future__ import annotations

import json
import math
import posixpath
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sm_support import (
    child,
    created_child,
    failed,
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

from fanfold import testing
from fanfold.statemachine import (
    AwaitingRetry,
    CallModel,
    ChildFailed,
    Conversation,
    ErrorKind,
    Failed,
    IllegalTransition,
    Limits,
    LlmRequesting,
    ModelError,
    NotifyParent,
    RunTool,
    ScheduleRetry,
    SpawnSubAgent,
    StartTimer,
    ToolCall,
    WorkingDirectory,
    start,
    transition,
)


def test_a_task_cannot_raise_its_round_limit_above_the_parents() -> None:
    # The reported case: --max-rounds 3, a task asking for 1000 iterations.
    state = steps(root(Limits(max_rounds=3)), user("go"))
    tasks = ({"task": "greedy", "max_iterations": 1000}, {"task": "modest", "max_iterations": 2})
    _, effects = step(state, replied(state, spawn("s", *tasks)))
    greedy, modest = of_type(effects, SpawnSubAgent)
    assert (greedy.max_rounds, greedy.limits.max_rounds) == (3, 3)
    assert (modest.max_rounds, modest.limits.max_rounds) == (2, 2)


def test_a_task_cannot_raise_its_time_limit_above_the_parents() -> None:
    state = steps(root(Limits(child_timeout=60.0)), user("go"))
    _, effects = step(state, replied(state, spawn("s", {"task": "slow", "timeout": 1e9})))
    assert of_type(effects, SpawnSubAgent)[0].timeout == 60.0


# --------------------------------------------------------------------------- non-finite

JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
)
NON_FINITE_TEXTS = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1E400"])


@st.composite
def non_finite_arguments(draw: st.DrawFn) -> str:
    """JSON-object text (as Python reads JSON) with a non-finite number somewhere,
    nested at any depth, spelled as a model or a provider may spell it."""
    marker = "__nonfinite__"
    tree = draw(
        st.recursive(
            JSON_LEAVES | st.just(marker),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=4), inner, max_size=3)
            ),
            max_leaves=8,
        )
    )
    arguments = {"task": "t", "command": "ls", "result": "r", "error": "e", "x": tree}
    if marker not in json.dumps(arguments):
        arguments["y"] = marker
    text = json.dumps(arguments)
    return text.replace(f'"{marker}"', draw(NON_FINITE_TEXTS))


@pytest.mark.parametrize("name", ["bash", "spawn_agents", "submit_result", "submit_error"])
@given(arguments=non_finite_arguments())
def test_a_tool_call_holding_a_non_finite_number_is_refused(name: str, arguments: str) -> None:
    # A sub-agent at depth 1 that may spawn (max_depth 2) is offered all four tools.
    state = child(Limits(max_depth=2, child_timeout=60.0))
    call = ToolCall("c1", name, arguments)
    after, effects = step(state, replied(state, call))
    assert of_type(effects, RunTool) == []
    assert of_type(effects, SpawnSubAgent) == []
    assert of_type(effects, StartTimer) == []
    assert isinstance(after.phase, LlmRequesting)  # not ended by a submission
    (result,) = tool_results(after)
    assert result.is_error
    assert result.content.startswith(f"refused: the arguments of {name} hold a non-finite number")


def test_a_nan_time_limit_spawns_nothing() -> None:
    # The reported case: spawn_agents with "timeout": NaN was accepted, and the NaN
    # reached the child's timer (and the log).
    state = steps(root(Limits(child_timeout=600.0)), user("go"))
    call = ToolCall("s", "spawn_agents", '{"tasks":[{"task":"x","timeout":NaN}]}')
    after, effects = step(state, replied(state, call))
    assert of_type(effects, SpawnSubAgent) == [] and of_type(effects, StartTimer) == []
    (result,) = tool_results(after)
    assert result.is_error and "non-finite number at 'tasks[0].timeout'" in result.content


def test_a_grace_round_submission_with_a_nan_is_no_submission() -> None:
    state = child(Limits(max_rounds=1))
    state = steps(state, replied(state, tool("t1")))
    state = steps(state, tool_done(state))
    assert isinstance(state.phase, LlmRequesting) and state.phase.grace
    call = ToolCall("s", "submit_result", '{"result":"done","score":-Infinity}')
    after, _ = step(state, replied(state, call))
    assert isinstance(after.phase, Failed) and after.phase.kind == ErrorKind.ITERATION_LIMIT


def test_a_nan_retry_hint_is_not_kept() -> None:
    state = steps(root(Limits(max_attempts=3)), user("go"))
    error = ModelError(ErrorKind.RATE_LIMIT, "slow down", retry_after=math.nan)
    after, effects = step(state, failed(state, error))
    assert isinstance(after.phase, AwaitingRetry) and after.phase.last_error.retry_after is None
    assert math.isfinite(only(effects, ScheduleRetry).delay)


def test_limits_and_time_limits_may_be_zero() -> None:
    limits = Limits(retry_base=0.0, retry_cap=0.0, child_timeout=0.0, cancel_grace=0.0)
    assert limits.child_timeout == 0.0 and limits.cancel_grace == 0.0
    assert start(created_child(timeout=0.0))[0].timeout == 0.0


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
def test_limits_and_time_limits_refuse_non_finite_numbers(value: float) -> None:
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        Limits(child_timeout=value)
    created = created_child(timeout=value)
    with pytest.raises(IllegalTransition, match="finite") as refused:
        start(created)
    assert refused.value.state is None and refused.value.event is created


def test_the_finiteness_invariant_catches_a_nan_in_an_effect() -> None:
    state = steps(root(), user("go"))
    after, effects = transition(state, replied(state, tool("t1")))
    with pytest.raises(AssertionError, match=r"only finite numbers.*delay = nan"):
        testing.check_transition(
            state, replied(state, tool("t1")), after, (*effects, StartTimer(99, math.nan, "x"))
        )


# --------------------------------------------------------------------------- cwd

CWD_PARTS = st.sampled_from(
    [
        *("a", "b", ".", "..", "", "...", "~", "~user", "é", "日本", "a b", "C:"),
        *("\\", "a\\..\\b", "\x00", "\n", "\x7f", "\x85", "\u202e", "x" * 300),
    ]
)
CWDS = st.one_of(
    st.lists(CWD_PARTS, max_size=6).map("/".join),
    st.lists(CWD_PARTS, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts)),
    st.text(max_size=12),
    st.sampled_from(
        [
            *("", "/", "~", "~/x", "..", "../outside", "a/../../b", "C:\\x", "c:/x"),
            *("a\x00b", "x" * 2000, "./a//b/", ".", "./"),
        ]
    ),
)


def _root() -> Conversation:
    return root()


def _sub_agent() -> Conversation:
    return child(Limits(max_depth=2), cwd="/work/sub")


PARENTS: dict[str, tuple[Callable[[], Conversation], str]] = {
    "root": (_root, "/work"),
    "sub-agent": (_sub_agent, "/work/sub"),
}


def _spawned_from(parent: Conversation, cwd: str) -> tuple[Conversation, list[SpawnSubAgent]]:
    state = parent if parent.is_sub_agent else steps(parent, user("go"))
    after, effects = step(state, replied(state, spawn("s", {"task": "t", "cwd": cwd})))
    return after, of_type(effects, SpawnSubAgent)


@pytest.mark.parametrize("who", PARENTS)
@given(cwd=CWDS)
def test_a_child_s_cwd_is_inside_its_parent_s_or_the_task_is_refused(who: str, cwd: str) -> None:
    make, parent_cwd = PARENTS[who]
    after, spawned = _spawned_from(make(), cwd)
    if not spawned:
        (result,) = tool_results(after)
        assert result.is_error and "'cwd'" in result.content
        return
    (effect,) = spawned
    child_cwd = effect.cwd
    assert posixpath.normpath(child_cwd) == child_cwd
    assert posixpath.commonpath([parent_cwd, child_cwd]) == parent_cwd
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in child_cwd)
    assert "\\" not in child_cwd
    assert start(effect.created_event())[0].cwd == child_cwd


@pytest.mark.parametrize(
    ("cwd", "why"),
    [
        ("/", "not absolute"),
        ("../outside", "must not contain '..'"),
        ("a/../../b", "must not contain '..'"),
        ("~/x", "must not start with '~'"),
        ("", "non-empty string"),
        ("a\x00b", "control characters"),
        ("a\\b", "backslashes"),
        ("C:/x", "drive letter"),
        ("x" * 2000, "too long"),
    ],
)
def test_a_task_cwd_that_would_leave_the_parent_s_directory_is_rejected(cwd: str, why: str) -> None:
    state = steps(root(), user("go"))
    tasks = ({"task": "bad", "cwd": cwd}, {"task": "good", "cwd": "./a//b/"})
    after, effects = step(state, replied(state, spawn("s", *tasks)))
    (good,) = of_type(effects, SpawnSubAgent)
    assert good.cwd == "/work/a/b"
    rejected = after.children.rejected if after.children else ()
    assert [r.task for r in rejected] == ["bad"] and why in rejected[0].error


@pytest.mark.parametrize(
    ("found", "why"),
    [
        (WorkingDirectory("/etc", "/work", "/work", True), "outside the project '/work'"),
        (WorkingDirectory("/work/b", "/work/a", "/work", True), "outside its parent's"),
        # Only a '/' is trimmed off a directory: /work/aX is no parent of /work/a/b.
        (WorkingDirectory("/work/a/b", "/work/aX", "/work", True), "outside its parent's"),
        (WorkingDirectory("/work/f", "/work", "/work", False), "not a directory"),
    ],
)
def test_a_sub_agent_whose_directory_really_lies_elsewhere_fails_at_once(
    found: WorkingDirectory, why: str
) -> None:
    created = created_child(timeout=5.0, workdir=found)
    state, effects = start(created)
    testing.check_start(created, state, effects)
    assert isinstance(state.phase, Failed) and state.phase.kind == ErrorKind.INVALID_CWD
    assert why in state.phase.error
    (notice,) = of_type(effects, NotifyParent)
    assert notice.outcome == ChildFailed(state.phase.error, ErrorKind.INVALID_CWD)
    assert of_type(effects, CallModel) == [] and of_type(effects, StartTimer) == []


def test_a_sub_agent_whose_directory_is_inside_starts() -> None:
    found = WorkingDirectory("/work/a", "/work", "/work", True)
    state, effects = start(created_child(workdir=found))
    assert isinstance(state.phase, LlmRequesting) and of_type(effects, CallModel)
