"""Example tests for the real mutation survivors issue 34 found (seed 4242): behaviour
of the pure core that no test looked at, each pinned here by an example (tests/README.md,
"Mutation testing")."""

from __future__ import annotations

import json

import attrs
import pytest
import sm_support as sm
from sm_support import of_type, only, replied, root, spawn, step, steps, user

from fanfold.statemachine import (
    ChildSucceeded,
    Conversation,
    ConversationForked,
    ErrorKind,
    ForkEdited,
    IllegalTransition,
    Limits,
    LimitsEdit,
    ModelError,
    ModelFailed,
    ModelReply,
    ReplyEdit,
    ScheduleRetry,
    SpawnSubAgent,
    SubAgentFinished,
    TaskEdit,
    TimerFired,
    ToolCall,
    ToolSpec,
    Usage,
    UserMessage,
    start,
    transition,
)
from fanfold.statemachine.children import ChildSpec, PendingChild, Roster
from fanfold.statemachine.confined import command_problem, shell_words
from fanfold.statemachine.control_tools import CwdRefused, relative_cwd
from fanfold.statemachine.limits import seconds
from fanfold.statemachine.messages import JsonArray, JsonObject
from fanfold.statemachine.permissions import (
    Permissions,
    Rule,
    RuleSet,
    command_matches,
    domain_matches,
    link_refusal,
    parse_rule,
    path_rules,
    refusal,
    url_host,
)


def _layer(allow: tuple[Rule, ...] | None, deny: tuple[Rule, ...] = ()) -> Permissions:
    return Permissions((RuleSet(allow, deny, "agent 'a'", "/w"),))


# ------------------------------------------------------------------ permissions


@pytest.mark.parametrize("arguments", ["[1]", "1", '"ls"', "null", "not json"])
@pytest.mark.parametrize("name", ["bash", "read_file", "write_file", "web_fetch"])
def test_arguments_that_are_no_object_are_refused_by_allow_rules_never_a_crash(
    name: str, arguments: str
) -> None:
    allow = _layer(
        (Rule("bash", "ls*"), Rule("read_file", "**"), Rule("write_file", "**"), Rule("web_fetch"))
    )
    call = ToolCall("t", name, arguments)
    # No allow pattern vouches for a call whose argument it cannot read.
    if name != "web_fetch":
        assert refusal(allow, call, "/w") is not None
    patterned = _layer((Rule("web_fetch", "domain:a.com"),))
    assert refusal(patterned, ToolCall("t", "web_fetch", arguments), "/w") is not None
    # A deny pattern takes every web call without a plain URL; a command or path it
    # cannot read is no command or path it names.
    deny = _layer(
        None, (Rule("bash", "rm*"), Rule("read_file", "x"), Rule("web_fetch", "domain:b.com"))
    )
    why = refusal(deny, call, "/w")
    if name == "web_fetch":
        assert why is not None and why.startswith("refused by the deny rule")
    else:
        assert why is None


def test_an_argument_of_the_wrong_type_is_no_command_and_no_path() -> None:
    allow = _layer((Rule("bash", "*"), Rule("read_file", "**")))
    for call in (
        ToolCall("t", "bash", json.dumps({"command": [1]})),
        ToolCall("t", "read_file", json.dumps({"path": [1]})),
    ):
        assert refusal(allow, call, "/w") is not None
    # Through the reducer: refused with a tool result, nothing run.
    bash = ToolSpec.from_schema("bash", "Run", {"type": "object"})
    state = steps(root(tools=(bash,), permissions=_layer((Rule("bash", "ls*"),))), user("go"))
    after, effects = step(state, replied(state, ToolCall("c1", "bash", "[1]")))
    assert not [e for e in effects if type(e).__name__ == "RunTool"]
    assert "no allow rule" in sm.tool_results(after)[0].content


@pytest.mark.parametrize(
    ("command", "refused"),
    [
        ("GIT_EXTERNAL_DIFF=x git diff", True),
        ("A=1 ls", True),
        ("_X9=1 ls", True),
        ("a_B=1 ls", True),
        # Not a variable name before '=': bash runs the word as a command.
        ("1A=x ls", False),
        ("=x ls", False),
        ("A-B=x ls", False),
        ("a.b=x ls", False),
    ],
)
def test_an_environment_variable_before_the_command_is_refused_under_bash_star(
    command: str, refused: bool
) -> None:
    everything = _layer((Rule("bash", "*"),))
    why = refusal(everything, ToolCall.of("t", "bash", {"command": command}), "/w")
    if refused:
        assert why is not None and "sets an environment variable" in why
        assert command_problem(command) is not None
    else:
        assert why is None and command_problem(command) is None


def test_an_allow_pattern_ending_in_a_star_after_a_letter_keeps_to_the_word() -> None:
    # `l*` as an allow pattern is the command `l` and its arguments, not `ls`.
    assert not command_matches("l*", "ls", any_part=False)
    assert command_matches("l*", "l -a", any_part=False)
    assert command_matches("l*", "l", any_part=False)
    # A deny pattern takes any text.
    assert command_matches("l*", "ls", any_part=True)
    assert refusal(_layer((Rule("bash", "l*"),)), ToolCall.of("t", "bash", {"command": "ls"}), "/w")


@pytest.mark.parametrize(
    "url",
    [
        "http://a.com/x y",
        "http://a.com/x\ty",
        "http://a.com/\u00a0",
        "https://a.com/x\\y",
        "http://a.com/\x01",
    ],
)
def test_a_url_with_a_space_anywhere_names_no_host(url: str) -> None:
    assert url_host(url) is None
    allow = _layer((Rule("web_fetch", "domain:a.com"),))
    assert refusal(allow, ToolCall.of("t", "web_fetch", {"url": url}), "/w") is not None
    assert url_host("http://a.com/xy") == "a.com"


# ------------------------------------------------------------------ symbolic links


PEEK = ToolSpec.from_schema("peek", "Peek", {"type": "object"}, read_only=True)
READ = ToolSpec.from_schema("read_file", "Read", {"type": "object"})
WRITE = ToolSpec.from_schema("write_file", "Write", {"type": "object"})


def test_a_link_leading_where_the_rules_refuse_is_refused_naming_both_paths() -> None:
    permissions = _layer(
        (Rule("read-only"), Rule("write_file", "docs/**")), (Rule("read_file", "secret/**"),)
    )
    write = ToolCall.of("t", "write_file", {"path": "docs/a.md", "content": "x"})
    rules = path_rules(permissions, write, (READ, WRITE, PEEK))
    assert rules is not None
    assert link_refusal(rules, write, "/w", "docs/b.md") is None
    why = link_refusal(rules, write, "/w", "src/a.py")
    assert why is not None
    assert why.startswith("write_file refused: no allow rule of agent 'a'")
    assert why.endswith("'docs/a.md' leads to 'src/a.py' through a symbolic link")
    # A read: permitted by `read-only` (the reading tools the reducer recorded) unless
    # the real path is denied.
    read = ToolCall.of("t", "read_file", {"path": "notes.txt"})
    read_rules = path_rules(permissions, read, (READ, WRITE, PEEK))
    assert read_rules is not None and "read_file" in read_rules.reading
    assert link_refusal(read_rules, read, "/w", "other.txt") is None
    denied = link_refusal(read_rules, read, "/w", "secret/key")
    assert denied is not None and "deny rule 'read_file(secret/**)'" in denied
    # `read-only` stands for the reading tools the rules recorded, not today's list.
    recorded = attrs.evolve(read_rules, reading=("peek",))
    refused = link_refusal(recorded, read, "/w", "other.txt")
    assert refused is not None and refused.startswith("read_file refused: no allow rule")
    # Arguments it cannot read: nothing to say (the reducer judged the call as spelled).
    for text in ("[1]", "not json"):
        assert link_refusal(rules, ToolCall("t", "write_file", text), "/w", "src/a.py") is None


# ------------------------------------------------------------------ fork edits


def _summary_retry_waiting() -> tuple[Conversation, ScheduleRetry]:
    """A root whose round's summary call failed once and waits to retry (attempt 2)."""
    state = steps(root(Limits(max_attempts=3)), user("go"))
    state = steps(state, replied(state, spawn("s1", {"task": "fix it", "context": "summary"})))
    children = state.children
    assert children is not None and children.summary is not None
    first = children.summary.call
    assert first is not None
    billed = ModelError(ErrorKind.RATE_LIMIT, "slow down", retry_after=2.0, usage=Usage(5, 0))
    state, effects = step(state, ModelFailed(first, billed))
    return state, only(effects, ScheduleRetry)


def test_a_limits_edit_must_admit_a_summary_retry_in_flight() -> None:
    state, retry = _summary_retry_waiting()
    assert (retry.attempt, retry.delay) == (2, 2.0)
    limits = state.limits
    with pytest.raises(
        IllegalTransition, match=r"max_attempts 1 is below the attempt in flight \(2\)"
    ):
        transition(state, ForkEdited(LimitsEdit(attrs.evolve(limits, max_attempts=1))))
    with pytest.raises(IllegalTransition, match=r"retry_cap 1.5 is below the summary retry's"):
        transition(state, ForkEdited(LimitsEdit(attrs.evolve(limits, retry_cap=1.5))))
    # Exactly what is in flight is admitted.
    for admitted in (attrs.evolve(limits, max_attempts=2), attrs.evolve(limits, retry_cap=2.0)):
        assert transition(state, ForkEdited(LimitsEdit(admitted)))[0].limits == admitted
    # While the retried call is in flight (its timer fired), attempt 2 still counts.
    state, _ = step(state, TimerFired(retry.timer))
    with pytest.raises(IllegalTransition, match="max_attempts 1 is below"):
        transition(state, ForkEdited(LimitsEdit(attrs.evolve(limits, max_attempts=1))))


def test_an_empty_task_edit_is_an_illegal_transition() -> None:
    child = sm.child(Limits(max_rounds=3))
    event = ForkEdited(TaskEdit(""))
    with pytest.raises(IllegalTransition, match="a sub-agent needs a task") as refused:
        transition(child, event)
    assert refused.value.event is event and refused.value.state is child


# ------------------------------------------------------------------ sequential steps


def test_an_earlier_steps_non_ascii_outcome_is_verbatim_in_the_next_task() -> None:
    state = steps(root(), user("go"))
    call = ToolCall.of(
        "s", "spawn_agents", {"tasks": [{"task": "plan"}, {"task": "build"}], "mode": "sequential"}
    )
    state, _ = step(state, replied(state, call))
    state, effects = step(state, SubAgentFinished("root.1", ChildSucceeded("café ✓ → 東京")))
    (second,) = of_type(effects, SpawnSubAgent)
    assert "café ✓ → 東京" in second.task
    assert "\\u" not in second.task


# ------------------------------------------------------------------ working directories


def test_a_cwd_may_hold_a_no_break_space_but_no_c1_control() -> None:
    assert relative_cwd("a\u00a0b") == "a\u00a0b"
    assert relative_cwd("\u00a0") == "\u00a0"
    for refused in ("a\x9fb", "a\x80b", "a\x7fb"):
        assert isinstance(relative_cwd(refused), CwdRefused)


# ------------------------------------------------------------------ the new sample's survivors
# (seed 20261207, tests/README.md, "Mutation testing": real survivors pinned as they were read)


def test_a_wildcard_domain_names_only_the_hosts_below_it() -> None:
    assert domain_matches("domain:*.example.com", "a.example.com")
    assert not domain_matches("domain:*.example.com", "example.com")
    assert not domain_matches("domain:*.example.com", "badexample.com")
    allow = _layer((Rule("web_fetch", "domain:*.example.com"),))
    fetch = ToolCall.of("t", "web_fetch", {"url": "https://badexample.com/x"})
    assert refusal(allow, fetch, "/w") is not None


def test_an_mcp_wildcard_rule_parses_and_takes_no_pattern() -> None:
    assert parse_rule("mcp__srv__*") == Rule("mcp__srv__*")
    assert parse_rule("mcp__srv*") == Rule("mcp__srv*")
    assert parse_rule("mcp__srv__*(x)") == "rule 'mcp__srv__*(x)': a wildcard rule takes no pattern"
    assert parse_rule("my*") == "rule 'my*': 'my*' is not a tool name"


def _pending(number: int) -> PendingChild:
    return PendingChild(ChildSpec(f"r.{number}", "task", "/w", None, 5, "s"), number % 2 == 0)


def test_a_roster_appended_past_its_chunks_is_the_tuple_of_its_items() -> None:
    # 64 items a chunk: appending at 64 and 128 starts a new one.
    model = tuple(_pending(k) for k in range(1, 131))
    grown = Roster(model[:1])
    for item in model[1:]:
        grown = grown.appended(item)
    assert tuple(grown) == model and grown == Roster(model)
    assert grown.started == sum(1 for p in model if p.started)
    assert Roster(model[:64]).appended(model[64])[-1] == model[64]


def test_a_calls_arguments_are_read_only_at_every_depth() -> None:
    made = ToolCall.of("t", "x", {"a": [1, {"b": 2}]}).arguments()
    decoded = ToolCall("t", "x", '{"a": [1, {"b": 2}]}').arguments()
    for arguments in (made, decoded):
        assert isinstance(arguments, JsonObject)
        assert isinstance(arguments["a"], JsonArray) and isinstance(arguments["a"][1], JsonObject)
        with pytest.raises(TypeError, match="read-only"):
            arguments["z"] = 1
    # A value json.loads would not give (a tuple) is not kept: the text is decoded.
    kept = ToolCall.parsed("t", "x", '{"a": [1]}', {"a": (1,)}).arguments()
    assert isinstance(kept["a"], JsonArray) and kept["a"] == [1]


def test_a_fork_with_an_edit_takes_one_its_state_admits_and_refuses_another() -> None:
    busy = steps(root(), user("go"))  # a model call in flight, under the fork's id
    fits = ConversationForked(busy.id, "source", 1, busy, ReplyEdit(ModelReply("hi")))
    forked, effects = start(fits)
    assert forked == busy and effects == ()
    misfit = ConversationForked(busy.id, "source", 1, busy, TaskEdit("other"))
    with pytest.raises(IllegalTransition, match="its edit does not fit its state: TaskEdit") as e:
        start(misfit)
    assert e.value.event is misfit


def test_a_wildcard_domain_never_names_its_bare_dot_form() -> None:
    assert url_host("http://.example.com/x") == ".example.com"
    assert not domain_matches("domain:*.example.com", ".example.com")


def test_a_word_end_star_mid_pattern_keeps_what_follows() -> None:
    assert command_matches("ls*x", "lsx", any_part=False)
    assert not command_matches("ls*x", "ls", any_part=False)


def test_a_backslash_in_double_quotes_escapes_only_what_bash_lets_it() -> None:
    assert shell_words('a "\\X" "\\"" "\\\\"') == [
        ("a", False),
        ("\\X", False),
        ('"', False),
        ("\\", False),
    ]


def test_a_result_exactly_at_the_cap_is_given_whole() -> None:
    state = steps(root(Limits(child_result_cap=5)), user("go"))
    state = steps(state, replied(state, spawn("s", "abcde", "fghij")))
    state = steps(state, SubAgentFinished("root.1", ChildSucceeded("12345")))
    state = steps(state, SubAgentFinished("root.2", ChildSucceeded("123456")))
    entries = sm.fan_in(sm.tool_results(state)[0].content)["sub_agent_results"]
    assert [(e["task"], e["result"]) for e in entries] == [
        ("abcde", "12345"),
        ("fghij", "12345... [truncated 1 characters]"),
    ]


def test_a_trailing_space_star_after_a_word_also_matches_the_bare_command() -> None:
    # `a-X *` reads as `a-X*`: the word before ` *` is `X`, whatever precedes it.
    assert command_matches("a-X *", "a-X", any_part=False)
    assert command_matches("a-X *", "a-X y", any_part=False)
    assert not command_matches("a-X *", "a-Xy", any_part=False)


def test_a_task_edit_needs_a_sub_agent_before_its_first_reply_context_or_not() -> None:
    # A sub-agent given a context first: its task is still the last message.
    given = sm.child(context=(UserMessage("ctx"),))
    after, _ = transition(given, ForkEdited(TaskEdit("other")))
    assert after.history == (UserMessage("ctx"), UserMessage("other"))
    # A root whose last message happens to be the empty text is no sub-agent.
    bare = steps(root(), user(""))
    with pytest.raises(IllegalTransition, match="TaskEdit is legal in a sub-agent's"):
        transition(bare, ForkEdited(TaskEdit("x")))


def test_a_bare_drive_letter_is_no_cwd() -> None:
    assert relative_cwd("C:") == CwdRefused("'cwd' must not start with a drive letter")
    assert relative_cwd("C") == "C"


def test_seconds_turns_an_int_into_a_float_and_refuses_a_bool() -> None:
    assert seconds(8) == 8.0 and type(seconds(8)) is float
    assert type(Limits(cancel_grace=8).cancel_grace) is float
    for wrong in (True, "8", None):
        with pytest.raises(TypeError, match="expected a number of seconds"):
            seconds(wrong)
