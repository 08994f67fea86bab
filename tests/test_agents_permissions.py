"""Permission rules: matching, deny over allow, and the intersection down a tree (a
child never holds a tool or a right its parent lacks, at any depth)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sm_support import World, begin, created_root, root, step, user, world_moves

from fanfold.statemachine import (
    Effect,
    ModelReplied,
    ModelReply,
    RunTool,
    ToolCall,
    ToolFinished,
    ToolResult,
    ToolResultMessage,
    ToolSpec,
)
from fanfold.statemachine.agent_defs import AgentDefinition, with_own_tools, without_scoped
from fanfold.statemachine.delegation import child_setup, own_messages
from fanfold.statemachine.limits import Limits
from fanfold.statemachine.permissions import (
    Permissions,
    Rule,
    RuleSet,
    allows_tool,
    command_matches,
    glob_match,
    normalise,
    parse_rule,
    path_matches,
    reading_tools,
    refusal,
    restrict,
)


def _bash(command: str) -> ToolCall:
    return ToolCall.of("t", "bash", {"command": command})


def _file(name: str, path: str) -> ToolCall:
    return ToolCall.of("t", name, {"path": path, "content": "x"})


def _layer(allow: list[str] | None, deny: tuple[str, ...] = (), base: str = "/p") -> Permissions:
    def rules(texts: list[str]) -> tuple[Rule, ...]:
        parsed = [parse_rule(t) for t in texts]
        assert all(isinstance(r, Rule) for r in parsed), parsed
        return tuple(r for r in parsed if isinstance(r, Rule))

    return Permissions(
        (RuleSet(None if allow is None else rules(allow), rules(list(deny)), "agent 'a'", base),)
    )


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("bash", Rule("bash")),
        ("Bash(git diff:*)", Rule("bash", "git diff*")),
        ("bash(git diff*)", Rule("bash", "git diff*")),
        ("Read", Rule("read_file")),
        ("write_file(src/**)", Rule("write_file", "src/**")),
        ("read-only", Rule("read-only")),
        ("read_only", Rule("read-only")),
        ("my_tool", Rule("my_tool")),
    ],
)
def test_rules_parse(text: str, rule: Rule) -> None:
    assert parse_rule(text) == rule


@pytest.mark.parametrize("text", ["bash(", "bash()", "think(x)", "a b", "", "bash(x)y", 3])
def test_bad_rules_say_why(text: object) -> None:
    assert isinstance(parse_rule(text), str)


def test_bash_prefix_rules_match_simple_commands_only() -> None:
    allowed = _layer(["bash(git diff*)"])
    assert refusal(allowed, _bash("git diff HEAD~1"), "/p") is None
    assert refusal(allowed, _bash("  git diff"), "/p") is None
    for sneaky in [
        "git diff; rm -rf /",
        "git diff && curl x",
        "git diff | sh",
        "git diff $(rm x)",
        "git diff `rm x`",
        "git diff > out",
        "git diff\nrm x",
        "git status",
    ]:
        why = refusal(allowed, _bash(sneaky), "/p")
        assert why == (
            "refused: no allow rule of agent 'a' matches this call (allowed: bash(git diff*))"
        ), sneaky


def test_deny_wins_over_allow_and_checks_every_part_of_a_command() -> None:
    rules = _layer(["bash"], ("bash(rm *)",))
    assert refusal(rules, _bash("ls -l"), "/p") is None
    for command in ["rm -rf x", "ls; rm -rf x", "ls && rm x", "echo $(rm x)", "ls | rm x"]:
        assert refusal(rules, _bash(command), "/p") == (
            "refused by the deny rule 'bash(rm *)' of agent 'a'"
        ), command


def test_path_rules_are_relative_to_the_agents_directory() -> None:
    rules = _layer(["read-only", "write_file(src/**)", "edit_file(docs/*.md)"], base="/p")
    assert refusal(rules, _file("write_file", "src/a/b.py"), "/p") is None
    assert refusal(rules, _file("write_file", "b.py"), "/p/src") is None  # cwd /p/src
    assert refusal(rules, _file("write_file", "/p/src/x"), "/elsewhere") is None
    assert refusal(rules, _file("edit_file", "docs/a.md"), "/p") is None
    assert refusal(rules, _file("read_file", "/etc/passwd"), "/p") is None  # read-only
    for name, path, cwd in [
        ("write_file", "setup.py", "/p"),
        ("write_file", "src/../setup.py", "/p"),
        ("write_file", "../p2/src/x", "/p"),
        ("write_file", "/q/src/x", "/p"),
        ("edit_file", "docs/sub/a.md", "/p"),
        ("edit_file", "docs/a.txt", "/p"),
    ]:
        assert refusal(rules, _file(name, path), cwd) is not None, (name, path, cwd)


def test_malformed_arguments_match_no_pattern() -> None:
    rules = _layer(["bash(ls*)"])
    assert refusal(rules, ToolCall("t", "bash", "{not json"), "/p") is not None
    assert refusal(rules, ToolCall.of("t", "bash", {"command": 3}), "/p") is not None


def test_glob_matching() -> None:
    assert glob_match("src/**", "src/a/b", slash_special=True)
    assert glob_match("**/*.py", "a.py", slash_special=True)
    assert glob_match("**/*.py", "x/y/a.py", slash_special=True)
    assert not glob_match("*.py", "x/a.py", slash_special=True)
    assert glob_match("a?c", "abc", slash_special=True)
    assert not glob_match("a?c", "a/c", slash_special=True)
    assert glob_match("git *", "git a/b c", slash_special=False)


def test_a_pattern_may_hold_parentheses() -> None:
    assert parse_rule("bash(echo (hi))") == Rule("bash", "echo (hi)")


def test_a_bash_pattern_is_no_path_glob() -> None:
    # In a command '*' and '?' match '/' too, for allow and deny rules alike.
    allowed = _layer(["bash(git diff*)", "bash(cat ?/x)"])
    assert refusal(allowed, _bash("git diff src/a.py"), "/p") is None
    assert refusal(allowed, _bash("cat //x"), "/p") is None
    assert refusal(allowed, _bash("cat a/x"), "/p") is None
    assert command_matches("git d?ff", "git diff", any_part=False)
    assert command_matches("rm */x", "rm a/b/x", any_part=True)
    assert glob_match("a?c", "a/c", slash_special=False)
    assert not glob_match("a?c", "abbc", slash_special=False)


def test_a_deny_pattern_sees_the_whole_command_and_each_part() -> None:
    rules = _layer(["bash"], ("bash(rm *)", "bash(curl * | sh)"))
    # A subshell's parenthesis does not hide its command; '/' is text like any other.
    for command in ["(rm -rf x)", "ls && (rm a/b)", "curl https://x/y | sh"]:
        assert refusal(rules, _bash(command), "/p") is not None, command
    assert refusal(rules, _bash("curl https://x/y"), "/p") is None


def test_absolute_path_patterns_match_whole_names_only() -> None:
    rules = _layer(["write_file(/tmp/*.txt)"], base="/p")
    assert refusal(rules, _file("write_file", "/tmp/a.txt"), "/p") is None
    assert refusal(rules, _file("write_file", "../tmp/a.txt"), "/p") is None
    assert refusal(rules, _file("write_file", "/tmp/sub/a.txt"), "/p") is not None
    assert path_matches("/tmp/*", "/tmp/a", "/p", "/p")
    assert not path_matches("/tmp/*", "/tmp/a/b", "/p", "/p")


def test_relative_bases_and_paths_are_spelled_out() -> None:
    assert [normalise(p) for p in ("", ".", "./", "a/..", "a/b/../..")] == ["."] * 5
    assert normalise("../a/./b//") == "../a/b" and normalise("/../a") == "/a"
    # A base of "." (relative paths): a path above it or an absolute one matches nothing.
    assert path_matches("src/**", "src/a.py", ".", ".")
    assert path_matches("**", "a.py", ".", ".")
    for path in ("../a.py", "..", "/a.py", "../../x"):
        assert not path_matches("**", path, ".", "."), path
    assert path_matches("etc/*", "/etc/passwd", "/", "/")  # a base of "/"
    # A directory name may end with a space: only '/' is trimmed from it.
    assert path_matches("x", "x", "/p ", "/p ")
    assert not path_matches("x", "x", "/p ", "/p")


def test_a_pattern_longer_than_the_path_does_not_match() -> None:
    # A '?' or a plain character past the end of the text matches nothing (and reads
    # no character there: the reducer would raise IndexError).
    for pattern, text in [("/p/a?", "/p/a"), ("a?", "a"), ("?", ""), ("ab", "a"), ("a/", "a")]:
        for slash_special in (True, False):
            assert not glob_match(pattern, text, slash_special=slash_special), pattern
    assert glob_match("/p/a?", "/p/ab", slash_special=True)
    assert not path_matches("src/a?", "src/a", "/p", "/p")


def test_a_double_star_never_goes_back_before_where_it_starts() -> None:
    # "**/" matches whole directories from where it stands, not from an earlier '/':
    # "p/q/" is already used, so "q/r" must match what follows it.
    assert not glob_match("p/q/**/q/r", "p/q/r", slash_special=True)
    assert glob_match("p/q/**/q/r", "p/q/q/r", slash_special=True)
    assert not path_matches("src/gen/**/gen/*.py", "src/gen/x.py", "/p", "/p")


def test_a_base_directory_may_end_in_any_character() -> None:
    # Only a trailing '/' is trimmed from the base (a name ending in 'X' stays whole).
    assert path_matches("a", "/work/dirX/a", "/work/dirX", "/work/dirX")
    assert path_matches("*", "a", "/work/X", "/work/X")


def test_the_base_directory_itself_is_the_path_dot() -> None:
    # The base, named absolutely or as ".", is "." relative to itself: "." and "?"
    # (one character) match it, "??" and a name do not.
    for path in ("/p", ".", "/p/", "src/.."):
        assert path_matches(".", path, "/p", "/p"), path
        assert path_matches("?", path, "/p", "/p"), path
        assert not path_matches("??", path, "/p", "/p"), path
        assert not path_matches("p", path, "/p", "/p"), path


def test_allows_tool_decides_what_is_offered() -> None:
    rules = _layer(["read-only", "bash(git *)"], ("write_file",))
    assert [t for t in ("bash", "read_file", "think", "write_file", "edit_file") if
            allows_tool(rules, t)] == ["bash", "read_file", "think"]  # fmt: skip
    assert allows_tool(None, "anything")


# A program's tools: ``peek`` says it is read-only (a function tool's read_only=True,
# an MCP server's readOnlyHint, recorded in its spec), ``poke`` says nothing.
PEEK = ToolSpec.from_schema("peek", "read a value", {"type": "object"}, read_only=True)
POKE = ToolSpec.from_schema("poke", "change a value", {"type": "object"})


@pytest.mark.parametrize(
    ("allow", "deny", "tool", "allowed"),
    [
        (["read-only"], (), "peek", True),
        (["read-only"], (), "poke", False),
        (["read-only"], (), "read_file", True),
        (["read-only"], (), "bash", False),
        (["read-only"], ("peek",), "peek", False),  # deny still wins
        (["poke"], (), "peek", False),  # read-only is not implied by other rules
        (["poke"], (), "poke", True),
        (None, (), "poke", True),
    ],
)
def test_read_only_takes_the_tools_whose_specs_say_so(
    allow: list[str] | None, deny: tuple[str, ...], tool: str, allowed: bool
) -> None:
    """``read-only`` allows fanfold's reading tools and every tool whose recorded spec
    is marked read-only, and no other: what is offered and what is refused agree."""
    rules = _layer(allow, deny)
    reading = reading_tools((PEEK, POKE))
    assert allows_tool(rules, tool, reading) is allowed
    call = ToolCall.of("t", tool, {"path": "x"} if tool == "read_file" else {"command": "ls"})
    assert (refusal(rules, call, "/p", reading) is None) is allowed
    # Without the specs' marks (a log written before them), read-only is the built-ins.
    assert allows_tool(rules, "peek") is (allow is None and "peek" not in deny)


def test_reading_tools_are_the_built_ins_and_the_marked_specs() -> None:
    assert reading_tools(()) == frozenset({"read_file", "think", "grep", "glob"})
    assert reading_tools((PEEK, POKE)) == frozenset({"read_file", "think", "grep", "glob", "peek"})


def test_a_read_only_child_is_offered_and_may_call_a_read_only_tool_only() -> None:
    """Through the reducer: a conversation whose rules are ``read-only`` runs a call of
    a tool whose spec is marked read-only, and refuses one of a tool that is not."""
    state = root(
        tools=(PEEK,),  # what the runtime records: the tools the rules let it offer
        permissions=Permissions((RuleSet((Rule("read-only"),), (), "agent 'reader'", "/work"),)),
    )
    state, _ = step(state, user("go"))
    calls = (ToolCall.of("c1", "peek", {}), ToolCall.of("c2", "poke", {}))
    state, effects = step(state, ModelReplied(0, ModelReply("", calls)))
    (run,) = [e for e in effects if isinstance(e, RunTool)]
    assert run.tool_call.name == "peek"
    state, effects = step(state, ToolFinished(run.call, ToolResult("c1", "peek", "1")))
    results = [m.result for m in state.history if isinstance(m, ToolResultMessage)]
    assert [(r.name, r.is_error) for r in results] == [("peek", False), ("poke", True)]
    assert results[1].content.startswith("poke refused: no allow rule of agent 'reader'")
    # A child given these tools under read-only is offered peek, not poke.
    setup = child_setup(
        AgentDefinition("reader", "reads", allow=(Rule("read-only"),)),
        parent_permissions=None,
        parent_agents=(),
        tools=(PEEK, POKE),
        default_prompt="role",
        limits=Limits(max_depth=3),
        depth=1,
        cwd="/work",
    )
    assert [t.name for t in setup.tools] == ["peek"]


@pytest.mark.parametrize(
    ("parent", "child", "offered"),
    [
        (None, None, False),  # a root's plain sub-agent
        (None, "owner", True),  # the agent whose file declares the server
        (None, "namer", True),  # an agent naming it in mcpServers
        (None, "other", False),  # any other agent
        ("owner", None, False),  # the owner's plain sub-agent
        ("owner", "other", False),  # the owner's sub-agent of another definition
        ("owner", "namer", True),
        ("owner", "owner", True),
        ("denier", "owner", False),  # every layer of rules above still applies
    ],
)
def test_an_agent_scoped_servers_tools_go_to_the_agents_naming_it(
    parent: str | None, child: str | None, offered: bool
) -> None:
    """``AgentDefinition.own_tools`` (the tools of a server an agent file declares) are
    offered to agents of that definition and of definitions naming the server, and to
    no other agent: not the root, not a sibling, not the owner's other sub-agents."""
    # As the runtime records them: each definition naming s is given s's tools.
    catalogue = with_own_tools(
        (
            AgentDefinition("owner", "declares s", mcp_servers=("s",)),
            AgentDefinition("namer", "names s", mcp_servers=("s",)),
            AgentDefinition("other", "no servers"),
            AgentDefinition("denier", "denies s", deny=(Rule("mcp__s"),)),
        ),
        (SCOPED,),
    )
    root_tools = without_scoped((*SPECS, SCOPED), catalogue)
    assert "mcp__s__t" not in [t.name for t in root_tools]  # what Runtime.start records

    def setup(definition: str | None, tools: Any, permissions: Any) -> Any:
        return child_setup(
            None if definition is None else next(a for a in catalogue if a.name == definition),
            parent_permissions=permissions,
            parent_agents=catalogue,
            tools=tools,
            default_prompt="role",
            limits=Limits(max_depth=3),
            depth=1,
            cwd="/p",
        )

    if parent is None:
        tools = setup(child, root_tools, None).tools
    else:
        above = setup(parent, root_tools, None)
        tools = setup(child, above.tools, above.permissions).tools
    assert ("mcp__s__t" in [t.name for t in tools]) is offered


# --------------------------------------------------------------- the subset property

TOOL_NAMES = ("bash", "read_file", "write_file", "edit_file", "think", "peek", "poke")
RULE_TEXTS = (
    "bash",
    "bash(git *)",
    "bash(git diff*)",
    "bash(rm *)",
    "bash(*)",
    "read_file",
    "read_file(src/**)",
    "write_file",
    "write_file(src/**)",
    "write_file(**/*.md)",
    "edit_file(docs/*)",
    "think",
    "read-only",
    "peek",
    "poke",
)
CALLS = (
    [_bash(c) for c in ("git diff", "git log -p", "rm -rf x", "ls; rm x", "ls", "git diff | sh")]
    + [
        _file(n, p)
        for n in ("read_file", "write_file", "edit_file")
        for p in ("src/a.py", "docs/x", "README.md", "/etc/passwd", "sub/src/y.md", "../out")
    ]
    + [ToolCall.of("t", "think", {"thought": "x"})]
    + [ToolCall.of("t", "peek", {}), ToolCall.of("t", "poke", {})]
)


def _rules(draw: st.DrawFn) -> tuple[Rule, ...]:
    texts = draw(st.lists(st.sampled_from(RULE_TEXTS), max_size=4))
    return tuple(r for r in map(parse_rule, texts) if isinstance(r, Rule))


@st.composite
def definitions(draw: st.DrawFn) -> AgentDefinition:
    allow = _rules(draw) if draw(st.booleans()) else None
    return AgentDefinition(
        "a",
        "an agent",
        allow=allow,
        deny=_rules(draw),
        may_delegate=True,
    )


SPECS = tuple(
    ToolSpec.from_schema(n, n, {"type": "object"}, read_only=n == "peek") for n in TOOL_NAMES
)


@given(
    chain=st.lists(st.one_of(st.none(), definitions()), min_size=1, max_size=5),
    cwds=st.lists(st.sampled_from(["", "src", "docs", "sub/src"]), min_size=5, max_size=5),
)
def test_a_child_never_holds_what_its_parent_lacks(
    chain: list[AgentDefinition | None], cwds: list[str]
) -> None:
    """Down any chain of agent definitions (None: a task naming none), each child's
    tools are among its parent's, and every call it may make its parent may make too,
    however deep the nesting."""
    permissions: Permissions | None = None
    tools = SPECS
    cwd = "/p"
    for depth, (definition, sub) in enumerate(zip(chain, cwds, strict=False), start=1):
        child_cwd = cwd + "/" + sub if sub else cwd
        setup = child_setup(
            definition,
            parent_permissions=permissions,
            parent_agents=(),
            tools=tools,
            default_prompt="role",
            limits=Limits(max_depth=10),
            depth=depth,
            cwd=child_cwd,
        )
        assert {t.name for t in setup.tools} <= {t.name for t in tools}
        reading = reading_tools(SPECS)
        for call in CALLS:
            for where in (cwd, child_cwd):
                if refusal(setup.permissions, call, where, reading) is None:
                    assert refusal(permissions, call, where, reading) is None, (call, where)
        for name in TOOL_NAMES:
            assert not allows_tool(setup.permissions, name, reading) or allows_tool(
                permissions, name, reading
            )
            # What the child is offered is what its rules allow (read-only included).
            offered = name in {t.name for t in setup.tools}
            had = name in {t.name for t in tools}
            assert offered == (had and allows_tool(setup.permissions, name, reading)), name
        permissions, tools, cwd = setup.permissions, setup.tools, child_cwd


def test_restrict_adds_a_layer_and_keeps_the_parents() -> None:
    parent = _layer(["bash"])
    layer = RuleSet((Rule("read-only"),), (), "agent 'b'", "/p")
    child = restrict(parent, layer)
    assert child is not None and child.layers == (*parent.layers, layer)
    assert restrict(parent, RuleSet()) is parent  # no rules: nothing to add


# --------------------------------------------------------------- through the reducer

SCOPED = ToolSpec.from_schema("mcp__s__t", "an agent file's server's tool", {"type": "object"})
CATALOGUE = (
    AgentDefinition("reader", "reads", allow=(Rule("read-only"),)),
    # Declares the MCP server s in its file: its agents alone get s's tool.
    AgentDefinition("owner", "owns s", mcp_servers=("s",), own_tools=(SCOPED,)),
    AgentDefinition("gitter", "git only", allow=(Rule("bash", "git *"), Rule("read_file"))),
    AgentDefinition("no-ls", "anything but ls", deny=(Rule("bash", "ls*"),)),
    AgentDefinition("open", "no rules"),
)


@attrs.define
class _GuardedWorld(World):
    """A World that fails if a tool ever runs that its conversation's rules refuse."""

    ran: int = 0

    def run(self, cid: str, effects: tuple[Effect, ...]) -> None:
        state = self.convs.get(cid)
        for effect in effects:
            if isinstance(effect, RunTool) and state is not None:
                assert state.offers(effect.tool_call.name), effect
                why = refusal(
                    state.permissions, effect.tool_call, effect.cwd, reading_tools(state.tools)
                )
                assert why is None, f"{cid} ran a refused call: {why}"
                self.ran += 1
        super().run(cid, effects)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data())
def test_no_refused_call_ever_runs_at_any_depth(data: st.DataObject) -> None:
    """Random trees of named agents (two levels) under random replies, failures,
    cancels and restarts: every call that reaches the runtime passes the rules of the
    conversation that made it, every refusal is counted, and every step keeps the
    invariants (a child's rules extend its parent's, its tools are among its parent's)."""
    world = _GuardedWorld()
    limits = Limits(max_depth=2, max_concurrent=3)
    state, effects = begin(created_root(limits, agents=CATALOGUE))
    world.convs[state.id] = state
    world.run(state.id, effects)
    world.apply("root", user("go"))
    names = [None, *(a.name for a in CATALOGUE)]
    tasks: list[dict[str, str]] = []
    for i in range(data.draw(st.integers(1, 4))):
        name = data.draw(st.sampled_from(names))
        tasks.append({"task": f"t{i}"} if name is None else {"task": f"t{i}", "agent": name})
    (key,) = world.models
    world.reply(key, ModelReply("", (ToolCall.of("first", "spawn_agents", {"tasks": tasks}),)))
    for _ in range(data.draw(st.integers(0, 60))):
        moves = world_moves(world, data)
        if not moves:
            break
        moves[data.draw(st.integers(0, len(moves) - 1))]()
        world.check()
    if world.ran:
        event("a permitted call ran")
    for cid, conversation in world.convs.items():
        # Each refusal is an error result "<tool> refused ..." in the history once its
        # round is over, and counted when it is decided.
        # (Its own messages: a child of context mode full is first given its
        # parent's conversation, refusals included.)
        own = own_messages(conversation.history, conversation.task, conversation.is_sub_agent)
        refused = [
            m
            for m in own
            if isinstance(m, ToolResultMessage)
            and m.result.is_error
            and m.result.content.startswith(f"{m.result.name} refused")
        ]
        if conversation.refused_calls:
            event("a call was refused")
        if conversation.at_rest:
            assert len(refused) == conversation.refused_calls, cid
        else:
            assert len(refused) <= conversation.refused_calls, cid
