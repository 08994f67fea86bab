"""Issue 2, behaviour 3: spawning. ``spawn_agents`` takes 1..N tasks (at most
``max_tasks_per_call``), child ids are deterministic, at most ``max_concurrent``
children run at once and the rest start as others finish, and depth is limited."""

from __future__ import annotations

import attrs
from sm_support import (
    BASH,
    READ,
    begin,
    child,
    created_root,
    fan_in,
    of_type,
    only,
    replied,
    root,
    spawn,
    step,
    steps,
    tool_results,
    user,
)

import fanfold.statemachine as sm
from fanfold.statemachine import (
    AbortCall,
    AwaitingSubAgents,
    CallModel,
    ChildSucceeded,
    Event,
    Limits,
    LlmRequesting,
    SpawnSubAgent,
    StartTimer,
    SubAgentFinished,
    ToolCall,
    fold,
)
from fanfold.statemachine.agent_defs import AgentDefinition
from fanfold.statemachine.permissions import Permissions, Rule, RuleSet


def _spawned_ids(effects: tuple[object, ...]) -> list[str]:
    return [e.child_id for e in effects if isinstance(e, SpawnSubAgent)]


def test_spawn_agents_starts_one_child_per_task_with_deterministic_ids() -> None:
    state = steps(root(), user("review"))
    state, effects = step(state, replied(state, spawn("s1", "security", "speed", "style")))
    assert effects == (
        StartTimer(1, 630.0, "deadline of root.1"),
        SpawnSubAgent(
            child_id="root.1",
            parent_id="root",
            root_id="root",
            task="security",
            cwd="/work",
            timeout=600.0,
            max_rounds=20,
            depth=1,
            limits=Limits(),
            tools=(BASH, READ),
            system_prompt="be brief",
            model=None,
        ),
        StartTimer(2, 630.0, "deadline of root.2"),
        of_type(effects, SpawnSubAgent)[1],
        StartTimer(3, 630.0, "deadline of root.3"),
        of_type(effects, SpawnSubAgent)[2],
    )
    assert _spawned_ids(effects) == ["root.1", "root.2", "root.3"]
    assert [e.task for e in of_type(effects, SpawnSubAgent)] == ["security", "speed", "style"]
    assert isinstance(state.phase, AwaitingSubAgents)
    assert state.phase.children.pending_ids() == ("root.1", "root.2", "root.3")
    assert state.spawned == 3


def test_sub_agents_are_told_the_sub_agent_prompt_down_the_tree() -> None:
    """Issue 12, system prompts: a root created with a sub-agent prompt gives it to its
    children as their system prompt (not its own) and passes it on, so grandchildren
    get it too; without one (logs before schema 6) a child gets its parent's prompt."""
    lim = Limits(max_depth=2)
    told = "You are a sub-agent."
    parent = steps(root(lim, sub_agent_prompt=told), user("go"))
    parent, effects = step(parent, replied(parent, spawn("s1", "a")))
    (spawned,) = of_type(effects, SpawnSubAgent)
    assert (spawned.system_prompt, spawned.sub_agent_prompt) == (told, told)
    child, _ = begin(spawned.created_event())
    assert (child.system_prompt, child.sub_agent_prompt) == (told, told)
    child, effects = step(child, replied(child, spawn("s2", "b")))
    (grandchild,) = of_type(effects, SpawnSubAgent)
    assert (grandchild.system_prompt, grandchild.sub_agent_prompt) == (told, told)
    legacy = steps(root(lim), user("go"))
    legacy, effects = step(legacy, replied(legacy, spawn("s1", "a")))
    (spawned,) = of_type(effects, SpawnSubAgent)
    assert (spawned.system_prompt, spawned.sub_agent_prompt) == ("be brief", None)


def test_child_ids_continue_across_rounds_and_replay_identically() -> None:
    state = steps(root(), user("go"))
    events: list[Event] = [user("go")]
    first = replied(state, spawn("s1", "a"))
    state, _ = step(state, first)
    events.append(first)
    done = SubAgentFinished("root.1", ChildSucceeded("ok"))
    state, _ = step(state, done)
    events.append(done)
    second = replied(state, spawn("s2", "b", "c"))
    state, effects = step(state, second)
    events.append(second)
    assert _spawned_ids(effects) == ["root.2", "root.3"]
    assert fold(created_root(), events) == state


def test_tasks_beyond_the_per_call_limit_get_error_results_and_are_not_spawned() -> None:
    state = steps(root(), user("go"))
    tasks = [f"task {i}" for i in range(12)]
    state, effects = step(state, replied(state, spawn("s", *tasks)))
    assert _spawned_ids(effects) == [f"root.{i}" for i in range(1, 11)]
    for i in range(1, 11):
        state, effects = step(state, SubAgentFinished(f"root.{i}", ChildSucceeded(f"r{i}")))
    (result,) = tool_results(state)
    payload = fan_in(result.content)
    assert [e["agent_id"] for e in payload["sub_agent_results"]] == [
        f"root.{i}" for i in range(1, 11)
    ]
    assert payload["rejected_tasks"] == [
        {
            "task": "task 10",
            "status": "rejected",
            "error": "not spawned: at most 10 tasks per call",
        },
        {
            "task": "task 11",
            "status": "rejected",
            "error": "not spawned: at most 10 tasks per call",
        },
    ]
    assert isinstance(only(effects, CallModel), CallModel)


def test_an_empty_task_list_is_an_error_result_and_spawns_nothing() -> None:
    state = steps(root(), user("go"))
    state, effects = step(state, replied(state, ToolCall.of("s", "spawn_agents", {"tasks": []})))
    assert _spawned_ids(effects) == []
    (result,) = tool_results(state)
    assert result.is_error and result.content == "spawn_agents needs at least one task"
    assert state.phase == LlmRequesting(call=1) and state.spawned == 0


def test_malformed_spawn_arguments_are_error_results() -> None:
    state = steps(root(), user("go"))
    bad = (
        ToolCall("s1", "spawn_agents", "not json"),
        ToolCall.of("s2", "spawn_agents", {"tasks": "everything"}),
        spawn("s3", {"task": ""}, {"task": "x", "timeout": -1}),
    )
    state, effects = step(state, replied(state, *bad))
    assert _spawned_ids(effects) == []
    contents = [r.content for r in tool_results(state)]
    assert contents[0] == "invalid JSON arguments for spawn_agents"
    assert contents[1] == "spawn_agents needs a 'tasks' array"
    assert contents[2].startswith("no sub-agent was spawned: ")
    assert "'task' must be a non-empty string" in contents[2]
    assert "'timeout' must be a positive number of seconds" in contents[2]


def test_task_options_set_cwd_timeout_rounds_and_model() -> None:
    state = steps(root(Limits(child_timeout=60.0)), user("go"))
    tasks = (
        {"task": "rel", "cwd": "sub/dir", "timeout": 5, "max_iterations": 3, "model": "big"},
        {"task": "dots", "cwd": "./a//b/", "timeout": 9999},
    )
    state, effects = step(state, replied(state, spawn("s", *tasks)))
    first, second = of_type(effects, SpawnSubAgent)
    assert (first.cwd, first.timeout, first.max_rounds, first.model) == (
        "/work/sub/dir",
        5.0,
        3,
        "big",
    )
    assert first.limits.max_rounds == 3
    assert (second.cwd, second.timeout, second.max_rounds) == ("/work/a/b", 60.0, 20)
    assert StartTimer(1, 35.0, "deadline of root.1") in effects  # 5s + 30s cancel grace


def test_without_any_time_limit_no_deadline_timer_is_set() -> None:
    state = steps(root(Limits(child_timeout=None)), user("go"))
    state, effects = step(state, replied(state, spawn("s", "a")))
    assert of_type(effects, StartTimer) == []
    assert only(effects, SpawnSubAgent).timeout is None


def test_at_most_max_concurrent_children_run_and_queued_ones_start_as_others_finish() -> None:
    state = steps(root(Limits(max_concurrent=2, child_timeout=None)), user("go"))
    state, effects = step(state, replied(state, spawn("s", "a", "b", "c", "d", "e")))
    assert _spawned_ids(effects) == ["root.1", "root.2"]
    assert isinstance(state.phase, AwaitingSubAgents)
    assert state.phase.children.running == 2
    state, effects = step(state, SubAgentFinished("root.2", ChildSucceeded("b done")))
    assert _spawned_ids(effects) == ["root.3"]
    state, effects = step(state, SubAgentFinished("root.1", ChildSucceeded("a done")))
    assert _spawned_ids(effects) == ["root.4"]
    state, effects = step(state, SubAgentFinished("root.3", ChildSucceeded("c done")))
    assert _spawned_ids(effects) == ["root.5"]
    state, effects = step(state, SubAgentFinished("root.4", ChildSucceeded("d done")))
    assert _spawned_ids(effects) == []
    assert isinstance(state.phase, AwaitingSubAgents)
    assert state.phase.children.running == 1
    state, effects = step(state, SubAgentFinished("root.5", ChildSucceeded("e done")))
    assert isinstance(state.phase, LlmRequesting)
    results = fan_in(tool_results(state)[0].content)["sub_agent_results"]
    assert [e["result"] for e in results] == ["a done", "b done", "c done", "d done", "e done"]


def test_finishing_a_child_aborts_its_deadline_timer() -> None:
    state = steps(root(), user("go"))
    state, _ = step(state, replied(state, spawn("s", "a", "b")))
    state, effects = step(state, SubAgentFinished("root.2", ChildSucceeded("ok")))
    assert effects == (AbortCall(2),)


def test_children_are_not_offered_spawn_agents_by_default() -> None:
    state = child()
    assert "spawn_agents" not in [t.name for t in state.tools]
    state, effects = step(state, replied(state, spawn("s", "grandchild task")))
    assert _spawned_ids(effects) == []
    (result,) = tool_results(state)
    assert result.is_error
    assert result.content == "spawn_agents is not available at depth 1 (max_depth is 1)"


def test_max_depth_two_lets_children_spawn_one_level_further() -> None:
    limits = Limits(max_depth=2, child_timeout=None)
    state = steps(root(limits), user("go"))
    state, effects = step(state, replied(state, spawn("s", "delegate further")))
    spawned = only(effects, SpawnSubAgent)
    assert spawned.depth == 1 and spawned.limits.max_depth == 2
    kid, _ = begin(spawned.created_event())
    assert "spawn_agents" in [t.name for t in kid.tools]
    kid, effects = step(kid, replied(kid, spawn("k", "deepest")))
    grandchild = only(effects, SpawnSubAgent)
    assert (grandchild.child_id, grandchild.parent_id, grandchild.depth) == (
        "root.1.1",
        "root.1",
        2,
    )
    assert grandchild.root_id == "root"
    deepest, _ = begin(grandchild.created_event())
    assert "spawn_agents" not in [t.name for t in deepest.tools]


def test_max_depth_zero_means_even_the_root_cannot_spawn() -> None:
    state = steps(root(Limits(max_depth=0)), user("go"))
    assert "spawn_agents" not in [t.name for t in state.tools]
    state, _ = step(state, replied(state, spawn("s", "a")))
    assert "not available at depth 0" in tool_results(state)[0].content


def test_a_runtime_cannot_smuggle_in_its_own_control_tools() -> None:
    from fanfold.statemachine import ToolSpec

    fake = ToolSpec.from_schema("spawn_agents", "mine", {"type": "object"})
    state = child(tools=(BASH, fake))
    assert [t.name for t in state.tools] == ["bash", "submit_result", "submit_error"]


def test_spawned_children_get_only_ordinary_tools_and_start_working() -> None:
    state = steps(root(), user("go"))
    _, effects = step(state, replied(state, spawn("s", "look around")))
    spawned = only(effects, SpawnSubAgent)
    assert spawned.tools == (BASH, READ)
    kid, kid_effects = begin(spawned.created_event())
    assert (kid.id, kid.parent_id, kid.depth, kid.timeout) == ("root.1", "root", 1, 600.0)
    assert [type(e) for e in kid_effects] == [StartTimer, CallModel]
    assert kid_effects[0] == StartTimer(0, 600.0, "time limit", counts_downtime=True)
    assert kid.phase == LlmRequesting(call=1)


REVIEWER = AgentDefinition("reviewer", "reviews", allow=(Rule("read-only"),))
READ_ONLY_PERMISSIONS = Permissions((RuleSet((Rule("read-only"),), source="agent 'reviewer'"),))


def test_a_childs_creation_event_carries_every_field_of_its_spawn() -> None:
    """``SpawnSubAgent.created_event`` leaves no decision to the runtime: every field the
    two classes share is copied, none left at its default (mutation survivors: a field
    dropped from the copy). Each field gets a value different from its default."""
    workdir = sm.WorkingDirectory("/real/sub", "/real/parent", "/real", True)
    spawn = SpawnSubAgent(
        child_id="r.3",
        parent_id="r",
        root_id="r0",
        task="inspect",
        cwd="sub",
        timeout=12.5,
        max_rounds=7,
        depth=2,
        limits=Limits(max_rounds=7, max_tokens=900),
        tools=(BASH,),
        system_prompt="role",
        model="small",
        sub_agent_prompt="their role",
        agents=(REVIEWER,),
        agent="reviewer",
        permissions=READ_ONLY_PERMISSIONS,
        context=(sm.UserMessage("earlier"),),
        wording=1,
    )
    created = spawn.created_event(workdir)
    expected = {
        "conversation_id": "r.3",
        "parent_id": "r",
        "root_id": "r0",
        "depth": 2,
        "cwd": "sub",
        "task": "inspect",
        "system_prompt": "role",
        "model": "small",
        "limits": Limits(max_rounds=7, max_tokens=900),
        "tools": (BASH,),
        "timeout": 12.5,
        "workdir": workdir,
        "sub_agent_prompt": "their role",
        "agents": (REVIEWER,),
        "agent": "reviewer",
        "permissions": READ_ONLY_PERMISSIONS,
        "context": (sm.UserMessage("earlier"),),
        "wording": 1,
    }
    assert {f.name for f in attrs.fields(sm.ConversationCreated)} == set(expected)
    assert {name: getattr(created, name) for name in expected} == expected


def test_a_rejected_task_that_is_no_string_is_shown_as_the_json_it_was() -> None:
    # A task given as a number or a list is refused; the fan-in shows what was given
    # (a mutant that wrote "null" for it survived every test).
    state = steps(root(), user("go"))
    call = spawn("s", "ok", {"task": 5}, {"task": ["a", 1]})
    state = steps(state, replied(state, call))
    state = steps(state, SubAgentFinished("root.1", ChildSucceeded("done")))
    payload = fan_in(tool_results(state)[0].content)
    assert [(r["task"], r["error"]) for r in payload["rejected_tasks"]] == [
        ("5", "not spawned: 'task' must be a non-empty string"),
        ('["a", 1]', "not spawned: 'task' must be a non-empty string"),
    ]
