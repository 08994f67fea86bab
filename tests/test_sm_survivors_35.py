"""Example tests for the real survivors of the mutation sample drawn on the reducer with
approvals (issue 34, seed 20261208; DESIGN.md "Mutation testing", bench/README.md).

Each test pins behaviour a surviving mutant changed; each was checked to fail on a
hand-made copy of its mutant (the same one-line change) and to pass on the code.
"""

from __future__ import annotations

import attrs
import pytest
from sm_support import BASH, READ, child, only, replied, root, spawn, step, tool, user

from fanfold.statemachine import (
    AbortCall,
    ChildSucceeded,
    ConversationForked,
    ForkEdited,
    IllegalTransition,
    StartTimer,
    SystemPromptEdit,
    TaskEdit,
    ToolCall,
    ToolResultMessage,
    ToolsChanged,
    ToolSpec,
    TurnFinished,
    TurnOutcome,
    UserMessaged,
    start,
    table,
)
from fanfold.statemachine.agent_defs import AgentDefinition
from fanfold.statemachine.approvals import ASK_USER_SPEC, question_of
from fanfold.statemachine.children import Children, ChildSpec, FinishedChild, Roster
from fanfold.statemachine.confined import command_problem, shell_words
from fanfold.statemachine.control_tools import CwdRefused, join_cwd, relative_cwd
from fanfold.statemachine.delegation import capped_limits, parent_context
from fanfold.statemachine.effects import AskUser, RequestApproval
from fanfold.statemachine.events import ApprovalGranted, UserAnswered
from fanfold.statemachine.messages import AssistantMessage, UserMessage, frozen_json
from fanfold.statemachine.modes import settle
from fanfold.statemachine.permissions import (
    Permissions,
    Rule,
    RuleSet,
    asking_rule,
    parse_rule,
    refusal,
)
from fanfold.statemachine.transition import limits_edit_problem


def _rules(*texts: str) -> tuple[Rule, ...]:
    out = []
    for text in texts:
        rule = parse_rule(text)
        assert not isinstance(rule, str), rule
        out.append(rule)
    return tuple(out)


def _asking(*ask: str, source: str = "--ask") -> Permissions:
    return Permissions((RuleSet(source=source, base="/work", ask=_rules(*ask)),))


# ------------------------------------------------------------------ ask rules


def test_an_ask_rule_is_matched_as_a_deny_rule_against_each_part_of_a_command() -> None:
    # asking_rule_14 (deny=True -> False): matched as an allow pattern, the rule saw
    # only the whole text, so a push after `cd app &&` ran without asking.
    perms = _asking("bash(git push*)")
    compound = tool("c1", command="cd app && git push origin main")
    assert asking_rule(perms, compound, "/work") == "'bash(git push*)' of --ask"
    assert asking_rule(perms, tool("c2", command="cd app && git status"), "/work") is None
    # A URL that is no plain http(s) URL takes every ask rule of its tool, as a deny rule.
    fetch = ToolCall.of("c3", "web_fetch", {"url": "http://example.com /x"})
    assert asking_rule(_asking("web_fetch(domain:example.org)"), fetch, "/work") is not None


def test_an_ask_rule_of_a_layer_without_a_source_is_named_alone() -> None:
    # asking_rule_18: the rule's name, quoted, and nothing else when no one is named.
    push = tool("c1", command="git push")
    assert asking_rule(_asking("bash(git push*)", source=""), push, "/work") == (
        "'bash(git push*)'"
    )


# ------------------------------------------------------------------ decisions


def test_a_decision_of_the_wrong_kind_is_refused_with_its_event_and_what_is_awaited() -> None:
    # _on_decision_36 (the refusal without its event), _33 (what a grant waits for).
    state = root(tools=(BASH, READ, ASK_USER_SPEC))
    state, _ = step(state, user("go"))
    question = ToolCall.of("q1", "ask_user", {"question": "which branch?"})
    asked, effects = step(state, replied(state, question))
    call = only(effects, AskUser).call
    grant = ApprovalGranted(call)
    with pytest.raises(IllegalTransition) as refused:
        step(asked, grant)
    assert refused.value.event is grant
    assert f"call {call} waits for an answer (UserAnswered)" in str(refused.value)

    layer = RuleSet(source="--ask", base="/work", ask=_rules("bash"))
    state = root(tools=(BASH,), permissions=Permissions((layer,)))
    state, _ = step(state, user("go"))
    waiting, effects = step(state, replied(state, tool("c1", command="ls")))
    call = only(effects, RequestApproval).call
    answer = UserAnswered(call, "yes")
    with pytest.raises(IllegalTransition) as refused:
        step(waiting, answer)
    assert refused.value.event is answer
    assert f"call {call} waits for a grant or a denial" in str(refused.value)


# ------------------------------------------------------------------ MCP tools


def _mcp(name: str) -> ToolSpec:
    return ToolSpec.from_schema(name, f"the MCP tool {name}", {"type": "object"})


def test_a_servers_new_tool_list_replaces_its_tools_and_keeps_the_others() -> None:
    # _on_tools_changed_21 (the new tool set dropped: the state's tools became None).
    state = root(tools=(BASH, _mcp("mcp__notes__old"), _mcp("mcp__other__x")))
    changed, effects = step(state, ToolsChanged("notes", (_mcp("mcp__notes__new"),)))
    assert effects == ()
    assert [t.name for t in changed.tools if t.name.startswith(("bash", "mcp__"))] == [
        "bash",
        "mcp__other__x",
        "mcp__notes__new",
    ]


def test_a_resource_call_naming_no_servers_name_is_allowed_by_no_server_rule() -> None:
    # _matches_16: a `server` holding `__` is no server's name; `mcp__notes` allowed
    # reading a resource of "notes__x" as if it were a tool of server notes.
    reading = frozenset({"list_mcp_resources", "read_mcp_resource"})
    allow = Permissions((RuleSet(_rules("mcp__notes"), (), "agent 'a'", "/p"),))
    deny = Permissions((RuleSet(None, _rules("mcp__notes"), "agent 'a'", "/p"),))
    for server, permitted in (("notes", True), ("notes__x", False), ("x__notes", False)):
        call = ToolCall.of("c1", "read_mcp_resource", {"server": server, "uri": "note://x"})
        assert (refusal(allow, call, "/p", reading) is None) is permitted, server
        assert refusal(deny, call, "/p", reading) is not None, server


# ------------------------------------------------------------------ forks


def test_a_root_forked_at_rest_with_an_edit_is_refused_with_its_event() -> None:
    # _fork_6 (the refusal without its event), _fork_9 (a TypeError instead).
    idle = root()
    forked = ConversationForked(idle.id, "source", 1, idle, TaskEdit("other"))
    with pytest.raises(IllegalTransition, match="takes its edit as a ForkEdited event") as e:
        start(forked)
    assert e.value.event is forked


def test_an_edit_whose_text_is_no_text_names_its_field() -> None:
    # _on_fork_edit_25: the field a TaskEdit lacks is its `task`.
    state = root()
    for edit, field in ((TaskEdit(1), "task"), (SystemPromptEdit(2), "system_prompt")):  # type: ignore[arg-type]
        event = ForkEdited(edit)
        with pytest.raises(IllegalTransition) as refused:
            step(state, event)
        assert f"{type(edit).__name__}'s {field} must be a text, not int" in str(refused.value)
        assert refused.value.event is event


# ------------------------------------------------------------------ messages


def test_frozen_json_says_why_a_value_is_not_parsed_json() -> None:
    # frozen_json_2 and _3, reached by no selected test: the message is its contract.
    with pytest.raises(ValueError, match=r"^not a parsed JSON value$"):
        frozen_json({"a": (1,)})
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ValueError, match=r"^the JSON nests too deeply$"):
        frozen_json(deep)


# ------------------------------------------------------------------ batch 2


def test_a_read_only_layer_says_which_server_did_not_mark_an_mcp_tool() -> None:
    # refusal_61 (`why += ...` -> `why -= ...`: a TypeError instead of the refusal).
    layer = RuleSet(_rules("read-only"), (), "agent 'a'", "/p")
    call = ToolCall.of("c1", "mcp__srv__write", {})
    why = refusal(Permissions((layer,)), call, "/p", frozenset(), wording=1)
    assert why is not None
    assert why.endswith(
        "read-only takes an MCP tool only if its server marks it readOnlyHint, "
        "and server 'srv' does not mark 'mcp__srv__write'"
    )


def test_settling_with_no_child_finished_keeps_the_children() -> None:
    # settle_2 (Settled(None) for children with nothing finished).
    children = Children()
    assert settle(children).children is children


def test_a_childs_cwd_below_a_parent_at_dot_is_the_relative_path_itself() -> None:
    # join_cwd_6: a parent whose cwd is "." (a relative root, which the model in
    # fanfold.testing allows) gave its child "./sub" instead of "sub".
    assert join_cwd(".", "sub") == "sub"
    assert join_cwd("/w/", "sub") == "/w/sub"
    assert join_cwd("/w", ".") == join_cwd("/w", None) == "/w"


def test_the_table_update_needs_both_markers() -> None:
    # table.update_6: the message of a text without the generated section.
    with pytest.raises(ValueError, match=r"^no generated section markers found$"):
        table.update("no markers here")
    with pytest.raises(ValueError, match=r"^generated section has no end marker$"):
        table.update(f"head {table.BEGIN} rest")


def test_edited_arguments_are_checked_against_the_tools_schema_in_the_reducer() -> None:
    # _on_decision_67: the reducer checked edited arguments without the tool's spec,
    # so a grant whose arguments lacked a required key ran the tool.
    bash = ToolSpec.from_schema(
        "bash",
        "Run a shell command",
        {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    )
    layer = RuleSet(source="--ask", base="/work", ask=_rules("bash"))
    state = root(tools=(bash,), permissions=Permissions((layer,)))
    state, _ = step(state, user("go"))
    waiting, effects = step(state, replied(state, tool("c1", command="ls")))
    call = only(effects, RequestApproval).call
    lacking = ApprovalGranted(call, arguments_json='{"cmd": "ls -a"}')
    with pytest.raises(IllegalTransition, match="the edited arguments lack 'command'"):
        step(waiting, lacking)
    wrong_type = ApprovalGranted(call, arguments_json='{"command": 1}')
    with pytest.raises(IllegalTransition, match="'command' must be of type string"):
        step(waiting, wrong_type)


def test_only_star_question_mark_and_bracket_make_a_word_a_glob() -> None:
    # shell_words_104: `X` counted as a glob character, so `git log X` was refused.
    assert shell_words("git log X") == [("git", False), ("log", False), ("X", False)]
    assert command_problem("git log X") is None
    for glob in ("a*", "a?", "a["):
        assert shell_words(f"ls {glob}")[-1] == (glob, True)


def test_limits_a_spawning_round_stands_under_are_named_one_by_one() -> None:
    # limits_edit_problem_53: the names of the limits that cannot change, joined.
    state = root()
    state, _ = step(state, user("go"))
    state, _ = step(state, replied(state, spawn("c1", "a", "b")))
    old = state.limits
    edited = attrs.evolve(old, max_rounds=old.max_rounds + 1, max_depth=old.max_depth + 1)
    assert limits_edit_problem(state, edited) == (
        "max_rounds, max_depth cannot change while this round's spawn_agents calls "
        "stand (edit a step before or after the round)"
    )


def test_a_parents_context_ends_before_its_last_reply_wherever_that_stands() -> None:
    # parent_context_12 (the scan stepping by two): the last reply is found whether an
    # even or an odd number of messages follow it.
    task, reply, later = UserMessage("do it"), AssistantMessage("on it"), UserMessage("and?")
    assert parent_context((task, reply)) == (task, reply)
    assert parent_context((task, reply, later)) == (task, reply)
    assert parent_context((task, AssistantMessage("  "), later)) == (task,)


def test_a_definitions_time_limit_caps_a_childs_and_stands_in_for_none() -> None:
    # capped_limits_6 (`is None` -> `is not None`): a given time limit was replaced by
    # the definition's, and none given was a TypeError.
    definition = AgentDefinition("x", "an agent", "be brief", timeout=10.0, max_rounds=4)
    assert capped_limits(definition, 5.0, 9) == (5.0, 4)
    assert capped_limits(definition, 20.0, 3) == (10.0, 3)
    assert capped_limits(definition, None, 9) == (10.0, 4)


def test_a_cwd_with_a_control_character_or_absolute_is_refused_saying_why() -> None:
    # relative_cwd_20, _21: the refusal's wording (the model reads it to correct its call).
    refused = CwdRefused("'cwd' must not contain control characters (NUL, newline...)")
    assert relative_cwd("a\x00b") == refused
    assert relative_cwd("a\nb") == refused
    # relative_cwd_31: and an absolute one is told to be relative.
    assert relative_cwd("/etc") == CwdRefused(
        "'cwd' must be relative to your working directory (a sub-agent works inside it), "
        "not absolute"
    )


def test_a_root_answering_within_its_time_limit_reports_its_text() -> None:
    # _answered_17: with the turn's time limit set, the TurnFinished lost its text.
    state = root(timeout=30.0)
    state, effects = step(state, user("go"))
    timer = only(effects, StartTimer).timer
    state, effects = step(state, replied(state, text="done"))
    assert effects == (AbortCall(timer), TurnFinished(TurnOutcome.ANSWERED, "done"))


def test_a_fork_whose_edit_does_not_fit_is_refused_with_its_state() -> None:
    # _fork_48: the refusal carried no state (None for the conversation forked).
    busy = step(root(), user("go"))[0]  # a model call in flight, under the fork's id
    misfit = ConversationForked(busy.id, "source", 1, busy, TaskEdit("other"))
    with pytest.raises(IllegalTransition, match="its edit does not fit its state") as e:
        start(misfit)
    assert e.value.state is busy and e.value.event is misfit


def test_a_sub_agents_new_tool_list_keeps_its_submit_tools() -> None:
    # _on_tools_changed_24 (is_sub_agent=None): the control tools were recomputed as
    # a root's, so a sub-agent lost submit_result and submit_error.
    state = child()
    unchanged, effects = step(state, ToolsChanged("notes", ()))
    assert unchanged.tools == state.tools and effects == ()
    changed, _ = step(state, ToolsChanged("notes", (_mcp("mcp__notes__new"),)))
    names = [t.name for t in changed.tools]
    assert "mcp__notes__new" in names
    assert {"submit_result", "submit_error"} <= set(names)


def test_the_read_only_sentence_is_only_for_mcp_tools_and_new_wording() -> None:
    # refusal_53 (`and` -> `or`): any call refused under `read-only` got the MCP
    # sentence ("server None does not mark 'bash'"), also in a log of wording 0.
    perms = Permissions((RuleSet(_rules("read-only"), (), "agent 'a'", "/p"),))
    plain = "refused: no allow rule of agent 'a' matches this call (allowed: read-only)"
    bash = tool("c1", command="rm -r x")
    assert refusal(perms, bash, "/p", frozenset(), wording=1) == plain
    mcp = ToolCall.of("c2", "mcp__srv__write", {})
    assert refusal(perms, mcp, "/p", frozenset(), wording=0) == plain


def test_an_ask_user_call_without_a_question_is_told_what_it_needs() -> None:
    # question_of_16: the error result the model reads to correct its call.
    for arguments in ({"question": "  "}, {"question": 3}, {}):
        call = ToolCall.of("q1", "ask_user", arguments)
        assert question_of(call) == "ask_user needs a non-empty string argument 'question'"


def test_a_roster_counts_as_started_only_items_that_say_so() -> None:
    # Roster.appended_27: an item without `started` (a finished child) was counted.
    done = FinishedChild(ChildSpec("root.1", "a", "/w", None, 5, "c1"), ChildSucceeded("ok"))
    more = FinishedChild(ChildSpec("root.2", "b", "/w", None, 5, "c1"), ChildSucceeded("ok"))
    assert Roster([done]).appended(more).started == 0


def test_a_sub_agent_is_told_it_takes_no_user_messages() -> None:
    # _on_user_message_8: the refusal's wording.
    with pytest.raises(IllegalTransition, match=r"a sub-agent takes no user messages$"):
        step(child(), UserMessaged("hi"))


def test_a_non_finite_number_is_refused_saying_what_to_send() -> None:
    # _refused_numbers_11: the refusal's wording (the model reads it to correct its call).
    state = step(root(), user("go"))[0]
    call = ToolCall("c1", "bash", '{"command": "sleep", "n": NaN}')
    after, _ = step(state, replied(state, call))
    (result,) = [m for m in after.history if isinstance(m, ToolResultMessage)]
    assert result.result.content == (
        "refused: the arguments of bash hold a non-finite number at 'n' (NaN, Infinity, "
        "or a literal too large for a float); send finite numbers"
    )
