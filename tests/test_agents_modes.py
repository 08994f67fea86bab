"""Execution modes of spawn_agents: sequential and race/quorum, by example and by
property over random interleavings (with cancels and restarts): exactly one outcome
per child in every mode, a sequential call never runs two children at once, a race
never resumes its parent before its quorum of successes, nor waits after it."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sm_support import (
    World,
    child,
    fan_in,
    of_type,
    replied,
    root,
    step,
    tool_results,
    user,
    world_moves,
)

from fanfold.statemachine import (
    CallModel,
    CancellingSubAgents,
    CancelReason,
    CancelSubAgents,
    ChildFailed,
    ChildSucceeded,
    Conversation,
    ErrorKind,
    Limits,
    ModelReply,
    RuntimeResumed,
    SpawnSubAgent,
    SubAgentFinished,
    ToolCall,
)
from fanfold.statemachine.children import Mode


def _spawn_with(call_id: str, tasks: list[str], **mode: Any) -> ToolCall:
    return ToolCall.of(call_id, "spawn_agents", {"tasks": [{"task": t} for t in tasks], **mode})


def _started(state: Conversation) -> list[str]:
    children = state.children
    return [] if children is None else [p.spec.id for p in children.pending if p.started]


def test_sequential_runs_one_at_a_time_and_passes_the_earlier_outcomes() -> None:
    state = root()
    state, _ = step(state, user("go"))
    call = _spawn_with("s", ["plan", "build", "test"], mode="sequential")
    state, effects = step(state, replied(state, call))
    (first,) = of_type(effects, SpawnSubAgent)
    assert (first.child_id, first.task) == ("root.1", "plan")
    state, effects = step(state, SubAgentFinished("root.1", ChildSucceeded("the plan")))
    (second,) = of_type(effects, SpawnSubAgent)
    assert second.child_id == "root.2"
    assert second.task.startswith("build\n\nThe earlier steps of this sequence")
    assert json.loads(second.task.split(":\n", 1)[1]) == [
        {"task": "plan", "status": "completed", "result": "the plan"}
    ]
    assert _started(state) == ["root.2"]
    state, effects = step(state, SubAgentFinished("root.2", ChildSucceeded("built")))
    (third,) = of_type(effects, SpawnSubAgent)
    assert "built" in third.task and "the plan" in third.task
    state, effects = step(state, SubAgentFinished("root.3", ChildSucceeded("green")))
    assert of_type(effects, CallModel)
    entries = fan_in(tool_results(state)[0].content)["sub_agent_results"]
    assert [e["status"] for e in entries] == ["completed"] * 3


def test_a_restart_re_issues_a_sequential_step_with_the_earlier_outcomes() -> None:
    state = root()
    state, _ = step(state, user("go"))
    state, _ = step(state, replied(state, _spawn_with("s", ["plan", "build"], mode="sequential")))
    state, effects = step(state, SubAgentFinished("root.1", ChildSucceeded("the plan")))
    (second,) = of_type(effects, SpawnSubAgent)
    assert "the plan" in second.task
    _, again = step(state, RuntimeResumed())
    assert of_type(again, SpawnSubAgent) == [second]


def test_a_sub_agents_sequence_numbers_its_steps_by_their_own_ids() -> None:
    # Its children are root.1.1, root.1.2: the step number is the last part of the id.
    state = child(Limits(max_depth=2))
    state, _ = step(state, replied(state, _spawn_with("s", ["plan", "build"], mode="sequential")))
    state, effects = step(state, SubAgentFinished("root.1.1", ChildSucceeded("the plan")))
    (second,) = of_type(effects, SpawnSubAgent)
    assert second.child_id == "root.1.2" and "the plan" in second.task


def test_a_sequential_step_is_told_only_its_own_calls_earlier_steps() -> None:
    state = root()
    state, _ = step(state, user("go"))
    calls = (_spawn_with("p", ["look"]), _spawn_with("s", ["plan", "build"], mode="sequential"))
    state, _ = step(state, replied(state, *calls))
    state, _ = step(state, SubAgentFinished("root.1", ChildSucceeded("looked")))
    state, effects = step(state, SubAgentFinished("root.2", ChildSucceeded("the plan")))
    (second,) = of_type(effects, SpawnSubAgent)
    assert second.child_id == "root.3"
    assert json.loads(second.task.split(":\n", 1)[1]) == [
        {"task": "plan", "status": "completed", "result": "the plan"}
    ]


def test_a_sequential_failure_stops_the_rest_unless_keep_going() -> None:
    state = root()
    state, _ = step(state, user("go"))
    state, _ = step(state, replied(state, _spawn_with("s", ["a", "b", "c"], mode="sequential")))
    failure = ChildFailed("broke", ErrorKind.SUBMITTED_ERROR)
    state, effects = step(state, SubAgentFinished("root.1", failure))
    assert not of_type(effects, SpawnSubAgent) and of_type(effects, CallModel)
    entries = fan_in(tool_results(state)[0].content)["sub_agent_results"]
    assert [(e["status"], e.get("error_kind")) for e in entries] == [
        ("failed", "submitted_error"),
        ("failed", "not_run"),
        ("failed", "not_run"),
    ]
    assert entries[1]["error"] == "not run: the earlier step root.1 failed"

    state = root()
    state, _ = step(state, user("go"))
    call = _spawn_with("s", ["a", "b"], mode="sequential", keep_going=True)
    state, _ = step(state, replied(state, call))
    state, effects = step(state, SubAgentFinished("root.1", failure))
    (next_step,) = of_type(effects, SpawnSubAgent)
    assert json.loads(next_step.task.split(":\n", 1)[1]) == [
        {"task": "a", "status": "failed", "error": "broke", "kind": "submitted_error"}
    ]


def test_a_race_resumes_at_its_quorum_and_cancels_the_others() -> None:
    state = root(Limits(child_timeout=60.0))
    state, _ = step(state, user("go"))
    state, effects = step(state, replied(state, _spawn_with("s", ["a", "b", "c"], quorum=2)))
    assert len(of_type(effects, SpawnSubAgent)) == 3
    state, effects = step(state, SubAgentFinished("root.2", ChildSucceeded("b won")))
    assert not of_type(effects, CallModel)  # one success of two
    state, effects = step(state, SubAgentFinished("root.3", ChildSucceeded("c won")))
    # The quorum: the parent resumes at once; root.1 is written off and told to stop.
    assert of_type(effects, CallModel)
    assert of_type(effects, CancelSubAgents) == [CancelSubAgents(("root.1",), CancelReason.PARENT)]
    assert state.written_off == ("root.1",)
    entries = fan_in(tool_results(state)[0].content)["sub_agent_results"]
    assert [(e["agent_id"], e["status"], e.get("error_kind")) for e in entries] == [
        ("root.1", "failed", "cancelled"),
        ("root.2", "completed", None),
        ("root.3", "completed", None),
    ]
    # Its acknowledgement arrives later and is absorbed.
    late = ChildFailed("cancelled (parent)", ErrorKind.CANCELLED)
    after, effects = step(state, SubAgentFinished("root.1", late))
    assert after == state and effects == ()


def test_a_race_counts_only_its_own_successes_toward_the_quorum() -> None:
    # A failed child of the race is no success: the race waits for its quorum...
    state = root()
    state, _ = step(state, user("go"))
    calls = (_spawn_with("r", ["a", "b", "c"], quorum=1), _spawn_with("p", ["d"]))
    state, _ = step(state, replied(state, *calls))
    failure = ChildFailed("broke", ErrorKind.SUBMITTED_ERROR)
    state, effects = step(state, SubAgentFinished("root.1", failure))
    assert not of_type(effects, CancelSubAgents) and state.written_off == ()
    assert _started(state) == ["root.2", "root.3", "root.4"]
    # ...and a success of another call of the round counts nothing toward it either.
    state, effects = step(state, SubAgentFinished("root.4", ChildSucceeded("d done")))
    assert not of_type(effects, CancelSubAgents) and _started(state) == ["root.2", "root.3"]
    state, effects = step(state, SubAgentFinished("root.3", ChildSucceeded("c won")))
    assert of_type(effects, CancelSubAgents) == [CancelSubAgents(("root.2",), CancelReason.PARENT)]
    assert of_type(effects, CallModel)


def test_mode_arguments_are_checked() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"mode": "random"}, "'mode' must be one of parallel, sequential, race"),
        ({"quorum": 0}, "'quorum' must be an integer >= 1"),
        ({"quorum": 3}, "'quorum' 3 is more than the 2 task(s) of the call"),
        ({"mode": "sequential", "quorum": 1}, "'quorum' goes with mode race"),
        # An explicit parallel with a quorum is two requests at once (a quorum alone is
        # a race): refused, not silently run as a race.
        ({"mode": "parallel", "quorum": 1}, "'quorum' goes with mode race"),
        ({"keep_going": True}, "'keep_going' goes with mode sequential"),
        ({"mode": "sequential", "keep_going": "yes"}, "'keep_going' must be true or false"),
    ]
    for arguments, error in cases:
        state = root()
        state, _ = step(state, user("go"))
        state, effects = step(state, replied(state, _spawn_with("s", ["a", "b"], **arguments)))
        assert not of_type(effects, SpawnSubAgent)
        assert tool_results(state)[0].content == f"spawn_agents: {error}", arguments


def test_a_race_charges_the_shares_of_the_children_it_cancels_and_says_why() -> None:
    # Another call of the round keeps the round open, so the cancelled child's
    # outcome is still there to read after the quorum.
    state = root(Limits(max_tokens=1000))
    state, _ = step(state, user("go"))
    calls = (_spawn_with("s", ["a", "b"], quorum=1), _spawn_with("p", ["c"]))
    state, _ = step(state, replied(state, *calls))
    assert state.children is not None
    shares = {p.spec.id: p.budget or 0 for p in state.children.pending}
    assert all(shares.values())
    used = state.usage_children
    state, effects = step(state, SubAgentFinished("root.1", ChildSucceeded("a won", tokens=7)))
    assert of_type(effects, CancelSubAgents) == [CancelSubAgents(("root.2",), CancelReason.PARENT)]
    assert state.written_off == ("root.2",)
    assert state.usage_children == used + 7 + shares["root.2"]
    assert state.children is not None
    (cancelled,) = [f.outcome for f in state.children.finished if f.spec.id == "root.2"]
    assert cancelled == ChildFailed(
        "cancelled: the quorum of 1 successful sub-agent(s) was reached",
        ErrorKind.CANCELLED,
        CancelReason.PARENT,
    )


def test_a_sequential_step_refused_for_want_of_budget_does_not_strand_the_rest() -> None:
    # The first step spends the whole budget: the second cannot get a share. Before
    # 2026-11-26 the third stayed queued behind it with nothing running, and the parent
    # waited forever; now the refusal is a failed step, so the rest are not run...
    limits = Limits(max_tokens=100)
    for keep_going, kinds in [
        (False, ["budget_exhausted", "not_run"]),
        # ...or, with keep_going, each is tried in turn (and refused the same way).
        (True, ["budget_exhausted", "budget_exhausted"]),
    ]:
        state = root(limits)
        state, _ = step(state, user("go"))
        call = _spawn_with("s", ["a", "b", "c"], mode="sequential", keep_going=keep_going)
        state, _ = step(state, replied(state, call))
        state, effects = step(state, SubAgentFinished("root.1", ChildSucceeded("x", tokens=100)))
        assert of_type(effects, CallModel) and not of_type(effects, SpawnSubAgent)
        entries = fan_in(tool_results(state)[0].content)["sub_agent_results"]
        assert [e.get("error_kind") for e in entries[1:]] == kinds


def test_a_race_without_a_quorum_ends_at_the_first_success() -> None:
    state = root()
    state, _ = step(state, user("go"))
    state, _ = step(state, replied(state, _spawn_with("s", ["a", "b"], mode="race")))
    state, effects = step(state, SubAgentFinished("root.2", ChildSucceeded("b won")))
    assert of_type(effects, CallModel)
    assert of_type(effects, CancelSubAgents) == [CancelSubAgents(("root.1",), CancelReason.PARENT)]


# --------------------------------------------------------------- properties


def _mode_arguments(data: st.DataObject, tasks: int) -> dict[str, Any]:
    kind = data.draw(st.sampled_from(["parallel", "sequential", "race"]))
    if kind == "sequential":
        return {"mode": kind, "keep_going": data.draw(st.booleans())}
    if kind == "race":
        return {"mode": kind, "quorum": data.draw(st.integers(1, tasks))}
    return {}


def _kind(arguments: dict[str, Any]) -> str:
    return str(arguments.get("mode", "race" if "quorum" in arguments else "parallel"))


def _check_modes(world: World, arguments: dict[str, Any]) -> None:
    children = world.root.children
    if children is None:
        return
    # The call under test (a later turn may spawn others, in parallel).
    pending = [p for p in children.pending if p.spec.spawn_call_id == "first"]
    finished = [f for f in children.finished if f.spec.spawn_call_id == "first"]
    mode = _kind(arguments)
    if mode == Mode.SEQUENTIAL:
        assert len([p for p in pending if p.started]) <= 1, "two steps at once"
    if mode == Mode.RACE and pending and not isinstance(world.root.phase, CancellingSubAgents):
        # Still waiting for the race: never after the quorum. (A parent that is being
        # cancelled waits for its children's acknowledgements instead, whatever the
        # mode: every running child has been told to stop, and none of their outcomes
        # resumes it.)
        successes = sum(isinstance(f.outcome, ChildSucceeded) for f in finished)
        assert successes < arguments["quorum"], "waited past the quorum"


def _check_resumed(world: World, arguments: dict[str, Any], tasks: int) -> None:
    """Once the parent has the fan-in: one entry per child; a race resumed early only
    with its quorum; a failed sequence ran nothing after the failure."""
    for message in tool_results(world.root):
        if message.tool_call_id != "first":
            continue
        entries = json.loads(message.content)["sub_agent_results"]
        assert sorted(e["agent_id"] for e in entries) == [f"root.{i + 1}" for i in range(tasks)]
        quorum_cancels = [e for e in entries if "quorum" in e.get("error", "")]
        successes = [e for e in entries if e["status"] != "failed"]
        if _kind(arguments) == Mode.RACE and quorum_cancels:
            assert len(successes) == arguments["quorum"], "resumed before the quorum"
        if _kind(arguments) == Mode.SEQUENTIAL and not arguments.get("keep_going"):
            kinds = [e.get("error_kind") for e in entries]
            if "not_run" in kinds:
                first = kinds.index("not_run")
                assert all(k == "not_run" for k in kinds[first:])
                assert entries[first - 1]["status"] == "failed"


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data())
def test_modes_hold_their_invariants_in_any_interleaving(data: st.DataObject) -> None:
    limits = Limits(
        max_concurrent=data.draw(st.integers(1, 3)),
        child_timeout=30.0,
        # A budget: a race charges the shares of the children it cancels.
        max_tokens=data.draw(st.sampled_from([None, 2000])),
    )
    world = World.with_root(limits)
    world.apply("root", user("go"))
    tasks = data.draw(st.integers(1, 4))
    arguments = _mode_arguments(data, tasks)
    # Each task with a context mode: a summary child waits for its parent's summary
    # call, which may fail, be retried, be cancelled or be cut short by a restart.
    contexts = data.draw(
        st.lists(st.sampled_from([None, "full", "summary"]), min_size=tasks, max_size=tasks)
    )
    entries = [
        {"task": f"task {i}"} if context is None else {"task": f"task {i}", "context": context}
        for i, context in enumerate(contexts)
    ]
    call = ToolCall.of("first", "spawn_agents", {"tasks": entries, **arguments})
    (key,) = world.models
    world.reply(key, ModelReply("delegating", (call,)))
    world.check()
    for _ in range(data.draw(st.integers(0, 60))):
        moves = world_moves(world, data)
        if not moves:
            break
        moves[data.draw(st.integers(0, len(moves) - 1))]()
        world.check()
        _check_modes(world, arguments)
    _check_resumed(world, arguments, tasks)


def test_a_quiet_tree_gives_every_child_one_outcome_in_every_mode() -> None:
    for arguments in ({"mode": "sequential"}, {"quorum": 1}, {"mode": "race", "quorum": 2}, {}):
        world = World.with_root(Limits(max_concurrent=2))
        world.apply("root", user("go"))
        (key,) = world.models
        world.reply(key, ModelReply("", (_spawn_with("first", ["a", "b", "c"], **arguments),)))
        world.drain()
        world.check_quiet()
        _check_resumed(world, arguments, 3)
