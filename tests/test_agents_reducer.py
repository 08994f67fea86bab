"""Agent definitions and permissions in the reducer: a task names an agent, the child
gets its tools, prompt, model and limits capped by its parent; a refused call gets an
error result naming the rule, is counted, and replay refuses it again."""

from __future__ import annotations

from sm_support import (
    BASH,
    READ,
    begin,
    created_root,
    of_type,
    only,
    replied,
    root,
    spawn,
    step,
    tool,
    tool_done,
    tool_results,
    user,
)

from fanfold.statemachine import (
    SUB_AGENT_PROMPT,
    AssistantMessage,
    ConversationCreated,
    Limits,
    RuntimeResumed,
    RunTool,
    SpawnSubAgent,
    ToolSpec,
    UserMessage,
    fold,
)
from fanfold.statemachine.agent_defs import AgentDefinition, ContextMode, PromptMode
from fanfold.statemachine.permissions import Rule

WRITE = ToolSpec.from_schema("write_file", "Write a file", {"type": "object"})
EXPLORER = AgentDefinition(
    "explorer", "reads only", prompt="Only read.", allow=(Rule("read-only"),), may_delegate=False
)
WRITER = AgentDefinition(
    "writer",
    "writes sources",
    prompt="You write code.",
    prompt_mode=PromptMode.REPLACE,
    allow=(Rule("read_file"), Rule("write_file", "src/**"), Rule("bash", "git diff*")),
    deny=(Rule("bash", "git diff --output*"),),
    model="small",
    max_rounds=3,
    max_tokens=500,
    timeout=20.0,
)
AGENTS = (EXPLORER, WRITER)


def _spawned(limits: Limits | None = None, *tasks: dict[str, object]) -> list[SpawnSubAgent]:
    state = root(
        limits, tools=(BASH, READ, WRITE), agents=AGENTS, sub_agent_prompt=SUB_AGENT_PROMPT
    )
    state, _ = step(state, user("go"))
    _, effects = step(state, replied(state, spawn("s1", *tasks)))
    return of_type(effects, SpawnSubAgent)


def test_the_spawn_tool_lists_the_agents_with_their_descriptions() -> None:
    state = root(agents=AGENTS)
    spec = next(t for t in state.tools if t.name == "spawn_agents")
    assert "- explorer: reads only\n- writer: writes sources" in spec.description
    agent = spec.input_schema()["properties"]["tasks"]["items"]["properties"]["agent"]
    # The whole property: a schema a model API reads (mutants that corrupted its keys
    # or its type survived the enum check alone).
    assert agent == {
        "type": "string",
        "enum": ["explorer", "writer"],
        "description": "The kind of agent to delegate to (default: a general sub-agent "
        "with your tools); see the list in this tool's description",
    }
    context = spec.input_schema()["properties"]["tasks"]["items"]["properties"]["context"]
    assert context == {
        "type": "string",
        "enum": ["task_only", "full", "summary"],
        "description": "task_only (default): the sub-agent sees just its task; full: "
        "also this conversation so far; summary: a summary of this conversation so far",
    }
    # Without definitions the tool is what it always was (older logs).
    plain = next(t for t in root().tools if t.name == "spawn_agents")
    assert "agent" not in plain.input_schema()["properties"]["tasks"]["items"]["properties"]


def test_a_child_gets_its_definitions_tools_prompt_model_and_limits() -> None:
    limits = Limits(max_rounds=10, child_timeout=60.0, max_depth=3)
    explorer, writer, plain = _spawned(
        limits,
        {"task": "look", "agent": "explorer"},
        {"task": "write", "agent": "writer", "max_iterations": 8, "timeout": 50},
        {"task": "anything"},
    )
    assert explorer.agent == "explorer"
    assert [t.name for t in explorer.tools] == ["read_file"]
    assert explorer.system_prompt == SUB_AGENT_PROMPT + "\n\nOnly read."
    assert explorer.limits.max_depth == 1  # may_delegate: false, no spawn_agents
    assert explorer.agents == ()
    assert explorer.permissions is not None
    assert [layer.source for layer in explorer.permissions.layers] == ["agent 'explorer'"]

    assert [t.name for t in writer.tools] == ["bash", "read_file", "write_file"]
    assert writer.system_prompt == "You write code."  # replace
    assert writer.model == "small"
    assert (writer.max_rounds, writer.timeout) == (3, 20.0)  # the definition caps the task
    assert writer.limits.max_tokens == 500  # the parent has no budget: the definition's
    assert writer.agents == AGENTS  # it may delegate, and max_depth allows it

    assert plain.agent is None and plain.permissions is None
    assert plain.agents == AGENTS  # it may delegate too: the catalogue goes down
    assert [t.name for t in plain.tools] == ["bash", "read_file", "write_file"]
    assert plain.system_prompt == SUB_AGENT_PROMPT


def test_a_definitions_budget_is_capped_by_the_share_the_parent_has_left() -> None:
    big = AgentDefinition("big", "greedy", max_tokens=10_000)
    small = AgentDefinition("small", "modest", max_tokens=100)
    state = root(Limits(max_tokens=1000), agents=(big, small))
    state, _ = step(state, user("go"))
    state, effects = step(
        state,
        replied(state, spawn("s1", {"task": "a", "agent": "big"}, {"task": "b", "agent": "small"})),
    )
    first, second = of_type(effects, SpawnSubAgent)
    assert first.limits.max_tokens == 1000 // 3  # a share: never the definition's 10,000
    assert second.limits.max_tokens == 100  # the definition asks for less than its share
    children = state.children
    assert children is not None and [p.budget for p in children.pending] == [333, 100]


def test_an_unknown_agent_is_an_error_naming_the_known_ones() -> None:
    state = root(agents=AGENTS)
    state, _ = step(state, user("go"))
    state, effects = step(state, replied(state, spawn("s1", {"task": "x", "agent": "nope"})))
    assert not of_type(effects, SpawnSubAgent)
    (result,) = tool_results(state)
    assert result.is_error
    assert "unknown agent 'nope'; known agents: explorer, writer" in result.content
    # Mixed with a good task, it is a rejected entry of the fan-in.
    state = root(agents=AGENTS)
    state, _ = step(state, user("go"))
    state, effects = step(
        state,
        replied(
            state, spawn("s1", {"task": "x", "agent": "nope"}, {"task": "y", "agent": "explorer"})
        ),
    )
    assert len(of_type(effects, SpawnSubAgent)) == 1
    children = state.children
    assert children is not None
    assert (
        children.rejected[0].error
        == "not spawned: unknown agent 'nope'; known agents: explorer, writer"
    )


def test_no_agents_defined_says_so() -> None:
    state = root()
    state, _ = step(state, user("go"))
    state, _ = step(state, replied(state, spawn("s1", {"task": "x", "agent": "reviewer"})))
    assert "unknown agent 'reviewer': no agents are defined" in tool_results(state)[0].content


def _writer_child() -> tuple[ConversationCreated, SpawnSubAgent]:
    (writer,) = _spawned(Limits(max_depth=2), {"task": "write", "agent": "writer", "cwd": "pkg"})
    return writer.created_event(), writer


def test_a_refused_call_gets_an_error_naming_the_rule_and_is_counted() -> None:
    created, _ = _writer_child()
    state, _ = begin(created)
    calls = (
        tool("c1", "write_file", path="src/a.py", content="x"),  # allowed: pkg/src/a.py
        tool("c2", "write_file", path="setup.py", content="x"),  # no allow rule matches
        tool("c3", "bash", command="git diff --output=/tmp/x"),  # the deny rule
        tool("c4", "edit_file", path="src/a.py"),  # not offered, and no rule allows it
    )
    state, effects = step(state, replied(state, *calls))
    (run,) = of_type(effects, RunTool)
    assert run.tool_call.id == "c1"
    state, effects = step(state, tool_done(state))  # the others are decided in turn
    assert not of_type(effects, RunTool)
    assert state.refused_calls == 3
    results = tool_results(state)
    assert results[0].content == "ok"
    assert [r.content for r in results[1:]] == [
        "write_file refused: no allow rule of agent 'writer' matches this call (allowed: "
        "read_file, write_file(src/**), bash(git diff*))",
        "bash refused by the deny rule 'bash(git diff --output*)' of agent 'writer'",
        "edit_file refused: no allow rule of agent 'writer' matches this call (allowed: "
        "read_file, write_file(src/**), bash(git diff*))",
    ]
    assert all(r.is_error for r in results[1:])


def test_replay_refuses_the_same_calls_from_the_log_alone() -> None:
    created, _ = _writer_child()
    state, _ = begin(created)
    event = replied(state, tool("c2", "write_file", path="setup.py", content="x"))
    after, _ = step(state, event)
    again = fold(created, [event])
    assert again == after and again.refused_calls == 1


def test_submit_is_never_refused() -> None:
    created, _ = _writer_child()
    state, _ = begin(created)
    state, _ = step(state, replied(state, tool("c1", "submit_result", result="done")))
    assert state.is_terminal and state.refused_calls == 0


def test_a_grandchild_keeps_its_parents_rules() -> None:
    created, writer = _writer_child()
    state, _ = begin(created)
    state, effects = step(state, replied(state, spawn("s", {"task": "t", "agent": "explorer"})))
    (grandchild,) = of_type(effects, SpawnSubAgent)
    assert grandchild.permissions is not None and writer.permissions is not None
    assert grandchild.permissions.layers[:1] == writer.permissions.layers
    assert [t.name for t in grandchild.tools] == ["read_file"]


def test_a_root_with_agents_encodes_like_before_without_them() -> None:
    from fanfold.db.codec import encode_event

    assert "agents" not in encode_event(created_root())
    assert '"agents":[{"type":"AgentDefinition"' in encode_event(created_root(agents=AGENTS))


def test_context_full_gives_the_parents_conversation_before_the_spawning_call() -> None:
    thorough = AgentDefinition("thorough", "sees everything", context=ContextMode.FULL)
    state = root(agents=(thorough,), sub_agent_prompt=SUB_AGENT_PROMPT)
    state, _ = step(state, user("fix the bug in parser.py"))
    state, _ = step(state, replied(state, tool("b1", "bash", command="pytest -x")))
    state, _ = step(state, tool_done(state, "1 failed: test_parse"))
    spawning = replied(
        state,
        spawn("s1", {"task": "find the cause", "agent": "thorough"}, {"task": "plain"}),
        spawn("s2", {"task": "look too", "context": "full"}),
        text="Let me delegate.",
    )
    state, effects = step(state, spawning)
    full, plain, asked = of_type(effects, SpawnSubAgent)
    assert [type(m).__name__ for m in full.context] == [
        "UserMessage",  # the user's request
        "AssistantMessage",  # the bash call ...
        "ToolResultMessage",  # ... and its result
        "AssistantMessage",  # the spawning reply's text, without its tool calls
    ]
    assert full.context[-1] == AssistantMessage("Let me delegate.")
    assert plain.context == () and asked.context == full.context
    child, _ = begin(full.created_event())
    assert child.history == (*full.context, UserMessage("find the cause"))
    # Restarted while they run: the re-issued spawns carry the same context.
    _, again = step(state, RuntimeResumed())
    assert [s.context for s in of_type(again, SpawnSubAgent)] == [full.context, (), full.context]


def test_context_full_in_the_first_reply_is_the_request_and_the_replys_text() -> None:
    # The spawning reply is the first assistant message (index 1 of the history).
    for text, context in [
        ("Delegating.", (UserMessage("go"), AssistantMessage("Delegating."))),
        ("", (UserMessage("go"),)),
    ]:
        state = root()
        state, _ = step(state, user("go"))
        call = spawn("s1", {"task": "t", "context": "full"})
        _, effects = step(state, replied(state, call, text=text))
        assert only(effects, SpawnSubAgent).context == context


def test_a_task_may_ask_for_task_only_under_a_full_definition() -> None:
    thorough = AgentDefinition("thorough", "sees everything", context=ContextMode.FULL)
    state = root(agents=(thorough,))
    state, _ = step(state, user("go"))
    task = {"task": "t", "agent": "thorough", "context": "task_only"}
    state, effects = step(state, replied(state, spawn("s1", task)))
    assert only(effects, SpawnSubAgent).context == ()
    state = root()
    state, _ = step(state, user("go"))
    state, _ = step(state, replied(state, spawn("s1", {"task": "t", "context": "all"})))
    assert "'context' must be task_only, full or summary" in tool_results(state)[0].content


def test_the_spawn_tool_lists_each_name_once_with_a_bounded_description() -> None:
    long = AgentDefinition("long", "x" * 5000)
    again = AgentDefinition("long", "shadowed")
    state = root(agents=(long, again, EXPLORER))
    spec = next(t for t in state.tools if t.name == "spawn_agents")
    agent = spec.input_schema()["properties"]["tasks"]["items"]["properties"]["agent"]
    assert agent["enum"] == ["long", "explorer"]
    assert "- long: " + "x" * 497 + "...\n- explorer: reads only" in spec.description
    assert "shadowed" not in spec.description
