"""Issue 35, the reducer's part: ask rules, requests, decisions, questions.

Every step goes through ``sm_support.step``, so each example also checks every
invariant of ``fanfold.testing`` (the approval properties included).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sm_support import (
    BASH,
    READ,
    of_type,
    only,
    replied,
    root,
    step,
    tool,
    tool_done,
    tool_results,
    user,
)

from fanfold import testing
from fanfold.statemachine import (
    AbortCall,
    CancelRequested,
    Conversation,
    IllegalTransition,
    Limits,
    LlmRequesting,
    RuntimeResumed,
    RunTool,
    StartTimer,
    TimerFired,
    ToolExecuting,
    ToolSpec,
    UnknownCall,
)
from fanfold.statemachine.approvals import ASK_USER_SPEC, edited_arguments_problem
from fanfold.statemachine.effects import AskUser, RequestApproval
from fanfold.statemachine.events import ApprovalDenied, ApprovalGranted, UserAnswered
from fanfold.statemachine.messages import ToolCall
from fanfold.statemachine.permissions import (
    Permissions,
    Rule,
    RuleSet,
    asking_rule,
    parse_rule,
    restrict,
)


def _rules(*texts: str) -> tuple[Rule, ...]:
    out = []
    for text in texts:
        rule = parse_rule(text)
        assert not isinstance(rule, str), rule
        out.append(rule)
    return tuple(out)


def asking_root(
    *ask: str, limits: Limits | None = None, tools: tuple[ToolSpec, ...] = (BASH, READ)
) -> Conversation:
    layer = RuleSet(source="--ask", base="/work", ask=_rules(*ask))
    state = root(limits, tools=tools, permissions=Permissions((layer,)))
    state, _ = step(state, user("go"))
    return state


def push_and_ls() -> tuple[ToolCall, ToolCall]:
    return tool("c1", command="git push origin main"), tool("c2", command="ls")


def test_a_call_matching_an_ask_rule_waits_and_the_rest_of_the_round_waits_behind_it() -> None:
    state = asking_root("Bash(git push:*)")
    push, ls = push_and_ls()
    state, effects = step(state, replied(state, push, ls))
    assert not of_type(effects, RunTool)
    request = only(effects, RequestApproval)
    assert request.tool_call == push and request.path == "root"
    assert request.rule == "the ask rule 'bash(git push*)' of --ask"
    phase = state.phase
    assert isinstance(phase, ToolExecuting) and phase.asking is not None
    assert phase.remaining == (ls,)
    # Granted: it runs as the same call number, then the round goes on.
    state, effects = step(state, ApprovalGranted(request.call))
    run = only(effects, RunTool)
    assert run.call == request.call and run.tool_call == push
    state, effects = step(state, tool_done(state, "pushed"))
    assert only(effects, RunTool).tool_call == ls


def test_a_denial_is_the_calls_result_and_the_call_never_runs() -> None:
    state = asking_root("bash(git push*)")
    push, ls = push_and_ls()
    state, effects = step(state, replied(state, push, ls))
    call = only(effects, RequestApproval).call
    state, effects = step(state, ApprovalDenied(call, "not on a Friday"))
    assert only(effects, RunTool).tool_call == ls  # the next call runs, not the push
    state, _ = step(state, tool_done(state, "a b"))
    results = tool_results(state)
    assert results[0].is_error and results[0].content == "denied by the user: not on a Friday"
    assert isinstance(state.phase, LlmRequesting)


def test_deny_beats_ask_beats_allow() -> None:
    layer = RuleSet(
        allow=_rules("bash"),
        deny=_rules("bash(rm *)"),
        source="agent 'x'",
        base="/work",
        ask=_rules("bash(rm *)", "bash(git push*)"),
    )
    perms = Permissions((layer,))
    state = root(tools=(BASH,), permissions=perms)
    state, _ = step(state, user("go"))
    state, effects = step(state, replied(state, tool("c1", command="rm -rf x")))
    assert not of_type(effects, RequestApproval)  # refused, never asked
    assert "deny rule" in tool_results(state)[0].content or state.refused_calls == 1


def test_a_childs_rules_intersect_so_it_asks_what_its_parent_must_ask() -> None:
    parent = Permissions((RuleSet(source="--ask", base="/w", ask=_rules("bash(git push*)")),))
    child = restrict(parent, RuleSet(allow=_rules("bash"), source="agent 'c'", base="/w"))
    push = tool("c", command="git push")
    assert asking_rule(child, push, "/w") == "'bash(git push*)' of --ask"
    # A child's own layer cannot lift it: its layers hold its parent's.
    assert child is not None and child.layers[0] == parent.layers[0]


def test_edited_arguments_are_checked_against_the_schema_and_the_rules_again() -> None:
    layer = RuleSet(deny=_rules("bash(rm *)"), source="--ask", base="/work", ask=_rules("bash"))
    state = root(tools=(BASH,), permissions=Permissions((layer,)))
    state, _ = step(state, user("go"))
    state, effects = step(state, replied(state, tool("c1", command="ls")))
    call = only(effects, RequestApproval).call
    with pytest.raises(IllegalTransition, match="JSON object"):
        step(state, ApprovalGranted(call, "[1]"))
    # Edited into something a deny rule refuses: refused, not run.
    after, effects = step(state, ApprovalGranted(call, '{"command": "rm -rf /"}'))
    assert not of_type(effects, RunTool) and after.refused_calls == 1
    # Edited and permitted: runs with the edited arguments.
    after, effects = step(state, ApprovalGranted(call, '{"command": "ls -l"}'))
    assert only(effects, RunTool).tool_call.arguments() == {"command": "ls -l"}


def test_schema_check_of_edited_arguments() -> None:
    spec = ToolSpec.from_schema(
        "t",
        "",
        {
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
            "additionalProperties": False,
        },
    )
    assert edited_arguments_problem(spec, '{"n": 1}') is None
    assert "lack" in (edited_arguments_problem(spec, "{}") or "")
    assert "integer" in (edited_arguments_problem(spec, '{"n": "1"}') or "")
    assert "integer" in (edited_arguments_problem(spec, '{"n": true}') or "")
    assert "does not take" in (edited_arguments_problem(spec, '{"n": 1, "m": 2}') or "")


def test_a_second_decision_or_one_for_an_unknown_call_is_illegal() -> None:
    state = asking_root("bash")
    state, effects = step(state, replied(state, tool("c1")))
    call = only(effects, RequestApproval).call
    decided, _ = step(state, ApprovalGranted(call))
    with pytest.raises(IllegalTransition, match="no open request"):
        step(decided, ApprovalDenied(call, "late"))
    with pytest.raises(UnknownCall):
        step(state, ApprovalGranted(999))
    with pytest.raises(IllegalTransition, match="no open request"):
        step(state, ApprovalGranted(0))  # the model call, never a request
    with pytest.raises(IllegalTransition, match="never ran"):
        step(state, tool_done(state))
    with pytest.raises(IllegalTransition, match="grant or a denial"):
        step(state, UserAnswered(call, "yes"))


def test_a_cancel_while_waiting_ends_the_request_and_nothing_is_pending() -> None:
    state = asking_root("bash", limits=Limits(approval_timeout=60))
    state, effects = step(state, replied(state, tool("c1")))
    request = only(effects, RequestApproval)
    timer = only(effects, StartTimer)
    assert timer.purpose == "approval timeout"
    after, effects = step(state, CancelRequested())
    assert {a.call for a in of_type(effects, AbortCall)} == {request.call, timer.timer}
    assert not isinstance(after.phase, ToolExecuting)
    assert "never ran" in tool_results(after)[0].content
    with pytest.raises(IllegalTransition):
        step(after, ApprovalGranted(request.call))


def test_the_approval_timeout_denies() -> None:
    state = asking_root("bash", limits=Limits(approval_timeout=5))
    state, effects = step(state, replied(state, tool("c1")))
    timer = only(effects, StartTimer).timer
    after, _ = step(state, TimerFired(timer))
    assert "no decision within 5.0s" in tool_results(after)[0].content
    # A grant cancels the timer.
    _, effects = step(state, ApprovalGranted(only(effects, RequestApproval).call))
    assert AbortCall(timer) in effects


def test_a_restart_while_waiting_asks_again_for_the_same_call_and_runs_nothing() -> None:
    state = asking_root("bash")
    state, effects = step(state, replied(state, tool("c1")))
    first = only(effects, RequestApproval)
    after, effects = step(state, RuntimeResumed(idempotent_tools=("bash",)))
    assert after == state
    assert only(effects, RequestApproval) == first
    assert not of_type(effects, RunTool)


def test_a_tool_spec_needing_approval_asks() -> None:
    deploy = ToolSpec.from_schema("deploy", "ship it", {"type": "object"}, needs_approval=True)
    state = root(tools=(BASH, deploy))
    state, _ = step(state, user("go"))
    state, effects = step(state, replied(state, ToolCall.of("c1", "deploy", {})))
    assert only(effects, RequestApproval).rule == "needs_approval of tool 'deploy'"


def test_ask_user_asks_and_the_answer_is_the_result() -> None:
    state = root(tools=(BASH, ASK_USER_SPEC))
    state, _ = step(state, user("go"))
    question = ToolCall.of("q1", "ask_user", {"question": "Which branch?", "choices": ["a", "b"]})
    state, effects = step(state, replied(state, question))
    asked = only(effects, AskUser)
    assert asked.question == "Which branch?" and asked.choices == ("a", "b")
    with pytest.raises(IllegalTransition, match="answer"):
        step(state, ApprovalGranted(asked.call))
    after, _ = step(state, UserAnswered(asked.call, "b"))
    assert tool_results(after)[0].content == "b" and not tool_results(after)[0].is_error
    # A malformed question is an error result, never a request.
    state2 = root(tools=(ASK_USER_SPEC,))
    state2, _ = step(state2, user("go"))
    state2, effects = step(state2, replied(state2, ToolCall.of("q", "ask_user", {"question": 3})))
    assert not of_type(effects, AskUser)


@settings(max_examples=60, deadline=None)
@given(
    decisions=st.lists(
        st.sampled_from(["grant", "deny", "edit", "cancel", "resume", "late"]), max_size=6
    ),
    commands=st.lists(
        st.sampled_from(["git push", "ls", "git push -f", "rm x"]), min_size=1, max_size=4
    ),
)
def test_random_decisions_keep_every_invariant(decisions: list[str], commands: list[str]) -> None:
    """Random rounds of calls, some asking, decided in random ways: every step is
    checked by fanfold.testing (no RunTool of an asking call without a grant first, a
    denied call never runs, one decision per request, nothing pending after a cancel)."""
    layer = RuleSet(
        deny=_rules("bash(rm *)"), source="--ask", base="/work", ask=_rules("bash(git push*)")
    )
    state = root(tools=(BASH,), permissions=Permissions((layer,)))
    state, _ = step(state, user("go"))
    calls = [tool(f"c{i}", command=c) for i, c in enumerate(commands)]
    state, _ = step(state, replied(state, *calls))
    for decision in decisions:
        phase = state.phase
        if not isinstance(phase, ToolExecuting):
            break
        if phase.asking is None:
            state, _ = step(state, tool_done(state))
            continue
        n = phase.call
        if decision == "grant":
            state, _ = step(state, ApprovalGranted(n))
        elif decision == "deny":
            state, _ = step(state, ApprovalDenied(n, "no"))
        elif decision == "edit":
            state, _ = step(state, ApprovalGranted(n, '{"command": "rm y"}'))
        elif decision == "cancel":
            state, _ = step(state, CancelRequested())
        elif decision == "resume":
            state, _ = step(state, RuntimeResumed())
        else:
            with pytest.raises(IllegalTransition):
                step(state, UserAnswered(n, "x"))


@settings(max_examples=60, deadline=None)
@given(trace=testing.event_sequences(asking=True))
def test_generated_runs_with_tools_that_ask_keep_every_invariant(trace: testing.Trace) -> None:
    """fanfold.testing's own generators (``asking=True``: a tool needing approval and
    ask_user offered, decisions drawn in every way): every step checked, the approval
    properties included."""
    testing.check_trace(trace)
