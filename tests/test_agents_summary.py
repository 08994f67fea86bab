"""Context mode ``summary``: a summary of the parent's conversation, made by one
recorded model call of the parent per tool round and shared by the round's children
of that mode. By example through the reducer (every step checked by
``fanfold.testing``'s invariants); the random walks of ``fanfold.testing`` and the
modes' property test draw such tasks too."""

from __future__ import annotations

from typing import Any

import pytest
from sm_support import (
    World,
    call_of,
    child,
    fan_in,
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

from fanfold.statemachine import (
    AbortCall,
    AssistantMessage,
    AwaitingSubAgents,
    CallModel,
    CancelReason,
    CancelRequested,
    ChildFailed,
    ChildSucceeded,
    Conversation,
    ErrorKind,
    Idle,
    LlmRequesting,
    ModelError,
    ModelFailed,
    ModelReplied,
    ModelReply,
    RuntimeResumed,
    ScheduleRetry,
    SpawnSubAgent,
    SubAgentFinished,
    Summary,
    TimerFired,
    ToolCall,
    Usage,
    UserMessage,
    control_tools,
    model_request,
)
from fanfold.statemachine import limits as limits_module
from fanfold.statemachine.agent_defs import AgentDefinition, ContextMode
from fanfold.statemachine.control_tools import offered_tools, ordinary_tools, spawn_agents_spec
from fanfold.statemachine.delegation import SUMMARY_HEADER, SUMMARY_PROMPT, own_messages
from fanfold.statemachine.errors import UnknownCall
from fanfold.statemachine.limits import CONTEXT_MODES, Limits, with_max_rounds
from fanfold.statemachine.transition import is_summary_call
from fanfold.testing import expected_backoff

SUMMARY = {"task": "fix it", "context": "summary"}


def _summary(state: Conversation) -> Summary:
    children = state.children
    assert children is not None and children.summary is not None
    return children.summary


def _summary_call(state: Conversation) -> int:
    call = _summary(state).call
    assert call is not None
    return call


def _summarised(text: str = "the goal is X; Y was found") -> ModelReply:
    return ModelReply(text, usage=Usage(300, 40))


def _spawned(limits: Limits | None = None, *tasks: str | dict[str, Any]) -> Conversation:
    """A root that said "go", then replied with one spawn_agents call of ``tasks``."""
    state = steps(root(limits), user("go"))
    return steps(state, replied(state, spawn("s1", *tasks), text="Let me delegate."))


def test_the_summary_is_one_call_of_the_parent_shared_by_its_children() -> None:
    state = steps(root(), user("go"))
    state = steps(state, replied(state, tool("t1"), text="Looking first."))
    state = steps(state, tool_done(state, "a.py is broken"))
    # Two spawn calls in one round, three summary children, one task_only.
    calls = (spawn("s1", SUMMARY, "plain"), spawn("s2", {**SUMMARY, "task": "test it"}))
    state, effects = step(state, replied(state, *calls, text="Let me delegate."))
    # The plain child starts at once; the others wait for the one summary call.
    assert [s.child_id for s in of_type(effects, SpawnSubAgent)] == ["root.2"]
    call = only(effects, CallModel)
    assert isinstance(state.phase, AwaitingSubAgents)
    assert _summary(state) == Summary(call=call.call)
    request = model_request(state)
    # The parent's conversation as plain turns, its tool calls and results written
    # as text (no tool blocks, which a request without tools may not hold), then the
    # instruction; its system prompt and model, no tools.
    (t1,) = [c for m in state.history if isinstance(m, AssistantMessage) for c in m.tool_calls][:1]
    assert request.messages == (
        UserMessage("go"),
        AssistantMessage(f"Looking first.\n[tool call bash: {t1.arguments_json}]"),
        UserMessage("[result of bash: a.py is broken]"),
        AssistantMessage(
            "Let me delegate.\n"
            + "\n".join(f"[tool call spawn_agents: {c.arguments_json}]" for c in calls)
        ),
        UserMessage(SUMMARY_PROMPT),
    )
    assert (request.system, request.model, request.tools) == (
        state.system_prompt,
        state.model,
        (),
    )
    rounds, usage = state.rounds, state.usage
    state, effects = step(state, ModelReplied(call.call, _summarised()))
    spawned = of_type(effects, SpawnSubAgent)
    assert [s.child_id for s in spawned] == ["root.1", "root.3"]
    context = (UserMessage(SUMMARY_HEADER + "the goal is X; Y was found"),)
    assert all(s.context == context for s in spawned)
    # Its tokens are the parent's; it is no round; the history is untouched.
    assert state.rounds == rounds and state.usage == usage + Usage(300, 40)
    assert _summary(state).text == "the goal is X; Y was found"
    # A restart re-spawns the running summary children with the same context.
    _, again = step(state, RuntimeResumed())
    assert {s.child_id: s.context for s in of_type(again, SpawnSubAgent)} == {
        "root.1": context,
        "root.2": (),
        "root.3": context,
    }
    for child_id in ("root.1", "root.2", "root.3"):
        state, effects = step(state, SubAgentFinished(child_id, ChildSucceeded("ok")))
    assert isinstance(state.phase, LlmRequesting)
    fan_ins = [fan_in(r.content) for r in tool_results(state) if r.name == "spawn_agents"]
    assert [[e["status"] for e in f["sub_agent_results"]] for f in fan_ins] == [
        ["completed", "completed"],
        ["completed"],
    ]


def test_a_child_created_from_its_spawn_starts_with_the_summary_then_its_task() -> None:
    state = _spawned(None, SUMMARY)
    state, effects = step(state, ModelReplied(_summary_call(state), _summarised("S")))
    spawn_effect = only(effects, SpawnSubAgent)
    sub = child(task=spawn_effect.task, context=spawn_effect.context)
    assert sub.history == (UserMessage(SUMMARY_HEADER + "S"), UserMessage("fix it"))


def test_a_retryable_failure_is_retried_then_the_children_start() -> None:
    state = _spawned(Limits(max_attempts=3), SUMMARY)
    first = _summary_call(state)
    billed = ModelError(ErrorKind.RATE_LIMIT, "slow down", retry_after=2.0, usage=Usage(5, 0))
    state, effects = step(state, ModelFailed(first, billed))
    retry = only(effects, ScheduleRetry)
    assert (retry.delay, retry.attempt) == (2.0, 2)
    assert _summary(state) == Summary(
        attempt=2, timer=retry.timer, delay=2.0, kind=ErrorKind.RATE_LIMIT
    )
    assert state.usage_input == 5
    # A restart while it waits schedules the same retry again.
    _, again = step(state, RuntimeResumed())
    assert of_type(again, ScheduleRetry) == [retry]
    state, effects = step(state, TimerFired(retry.timer))
    call = only(effects, CallModel)
    assert call.attempt == 2 and call.call not in (first, retry.timer)
    # A restart while the second attempt runs re-issues that call, same number.
    _, again = step(state, RuntimeResumed())
    assert of_type(again, CallModel) == [call]
    # The first attempt's late answer is stale: absorbed.
    late, effects = step(state, ModelReplied(first, _summarised("late")))
    assert late == state and effects == ()
    state, effects = step(state, ModelReplied(call.call, _summarised()))
    assert only(effects, SpawnSubAgent).context[0].text.startswith(SUMMARY_HEADER)  # type: ignore[union-attr]


def test_a_failed_summary_fails_its_children_and_keeps_their_siblings_work() -> None:
    cases: list[tuple[ModelReplied | ModelFailed, ErrorKind, str]] = [
        (
            ModelFailed(0, ModelError(ErrorKind.AUTH, "bad key")),
            ErrorKind.AUTH,
            "the summary call failed (auth, not retryable after 1 attempt(s)): bad key",
        ),
        (
            ModelReplied(0, ModelReply("I won't", stop_reason="refusal", stop_details="policy")),
            ErrorKind.REFUSED,
            "the model refused to summarise: policy",
        ),
        (
            ModelReplied(0, ModelReply("  ")),
            ErrorKind.MALFORMED_RESPONSE,
            "the summary call returned no text",
        ),
    ]
    for answer, kind, words in cases:
        state = _spawned(None, "plain", SUMMARY, SUMMARY)
        state = steps(state, SubAgentFinished("root.1", ChildSucceeded("plain done")))
        answer = _with_call(answer, _summary_call(state))
        state, effects = step(state, answer)
        # No child starts without its summary; the round ends: the plain child's
        # result is kept beside the two failures, each with the call's kind.
        assert not of_type(effects, SpawnSubAgent) and of_type(effects, CallModel)
        entries = fan_in(tool_results(state)[0].content)["sub_agent_results"]
        assert [(e["status"], e.get("error_kind")) for e in entries] == [
            ("completed", None),
            ("failed", kind),
            ("failed", kind),
        ]
        assert entries[1]["error"] == (
            f"not started: no summary of its parent's conversation: {words}"
        )


def _with_call(event: ModelReplied | ModelFailed, call: int) -> ModelReplied | ModelFailed:
    if isinstance(event, ModelReplied):
        return ModelReplied(call, event.reply)
    return ModelFailed(call, event.error)


def test_a_cancel_aborts_the_summary_call_and_its_late_answer_is_absorbed() -> None:
    state = _spawned(None, SUMMARY, "plain")
    call = _summary_call(state)
    state, effects = step(state, CancelRequested(CancelReason.USER))
    assert AbortCall(call) in effects
    # The plain child runs: the cancel waits for it; the summary child never started.
    assert of_type(effects, SpawnSubAgent) == []
    late, effects = step(state, ModelReplied(call, _summarised()))
    assert late == state and effects == ()
    state = steps(state, SubAgentFinished("root.2", ChildFailed("stopped", ErrorKind.CANCELLED)))
    assert isinstance(state.phase, Idle)
    entries = fan_in(tool_results(state)[0].content)["sub_agent_results"]
    assert entries[0]["error"] == "cancelled before it started"

    # With only summary children, nothing runs: a sub-agent cancelled ends at once.
    sub = child(Limits(max_depth=2))
    sub = steps(sub, replied(sub, spawn("s1", SUMMARY)))
    call = _summary_call(sub)
    sub, effects = step(sub, CancelRequested(CancelReason.PARENT))
    assert sub.is_terminal and AbortCall(call) in effects


def test_a_race_won_before_the_summary_is_made_aborts_it() -> None:
    call = ToolCall.of(
        "s1", "spawn_agents", {"tasks": [{"task": "quick"}, SUMMARY], "mode": "race"}
    )
    state = steps(root(), user("go"))
    state = steps(state, replied(state, call))
    summary_call = _summary_call(state)
    state, effects = step(state, SubAgentFinished("root.1", ChildSucceeded("won")))
    assert AbortCall(summary_call) in effects and of_type(effects, CallModel)
    entries = fan_in(tool_results(state)[0].content)["sub_agent_results"]
    assert entries[1]["error_kind"] == "cancelled"


def test_a_sequential_step_waits_for_the_earlier_one_then_gets_the_summary_too() -> None:
    call = ToolCall.of(
        "s1", "spawn_agents", {"tasks": [{"task": "plan"}, SUMMARY], "mode": "sequential"}
    )
    state = steps(root(), user("go"))
    state, effects = step(state, replied(state, call))
    assert [s.child_id for s in of_type(effects, SpawnSubAgent)] == ["root.1"]
    state, effects = step(state, ModelReplied(_summary_call(state), _summarised("S")))
    assert not of_type(effects, SpawnSubAgent)  # its turn has not come
    state, effects = step(state, SubAgentFinished("root.1", ChildSucceeded("the plan")))
    second = only(effects, SpawnSubAgent)
    assert second.context == (UserMessage(SUMMARY_HEADER + "S"),)
    assert "the plan" in second.task


def test_the_summary_and_its_children_keep_to_the_token_budget() -> None:
    # 99 of 100 tokens spent: the summary call is made on what is left (as any call
    # is made while the budget is not spent), then nothing is left for a share.
    state = steps(root(Limits(max_tokens=100)), user("go"))
    state = steps(state, ModelReplied(0, ModelReply("", (spawn("s1", SUMMARY),), Usage(60, 39))))
    state, effects = step(state, ModelReplied(_summary_call(state), _summarised()))
    assert not of_type(effects, SpawnSubAgent)
    entries = fan_in(tool_results(state)[0].content)["sub_agent_results"]
    assert entries[0]["error_kind"] == "budget_exhausted"

    # A child that overshot its share while the round's tools ran spent the rest: no
    # summary call is made at all (it would overshoot the budget further).
    state = steps(root(Limits(max_tokens=100)), user("go"))
    calls = (spawn("s1", "plain"), spawn("s2", SUMMARY), tool("t1"))
    state = steps(state, ModelReplied(0, ModelReply("", calls, Usage(5, 5))))
    state = steps(state, SubAgentFinished("root.1", ChildSucceeded("done", tokens=90)))
    state, effects = step(state, tool_done(state))
    assert not of_type(effects, SpawnSubAgent)
    assert of_type(effects, CallModel) == [CallModel(state.next_call - 1, 1)]  # the next round
    assert isinstance(state.phase, LlmRequesting)
    (entry,) = fan_in(tool_results(state)[1].content)["sub_agent_results"]
    assert entry["error"] == (
        "not started: no summary of its parent's conversation: the token budget of 100 is used up"
    )
    assert entry["error_kind"] == "budget_exhausted"


def test_a_definition_may_ask_for_a_summary() -> None:
    briefed = AgentDefinition("briefed", "gets a summary", context=ContextMode.SUMMARY)
    state = steps(root(agents=(briefed,)), user("go"))
    state, effects = step(state, replied(state, spawn("s1", {"task": "t", "agent": "briefed"})))
    assert not of_type(effects, SpawnSubAgent) and of_type(effects, CallModel)
    # ...and a task may ask for task_only under it.
    state = steps(root(agents=(briefed,)), user("go"))
    task = {"task": "t", "agent": "briefed", "context": "task_only"}
    state, effects = step(state, replied(state, spawn("s1", task)))
    assert only(effects, SpawnSubAgent).context == ()


def test_a_quiet_tree_of_summary_children_gives_each_one_outcome() -> None:
    for limits in (Limits(max_concurrent=1), Limits(max_concurrent=3, max_depth=2)):
        world = World.with_root(limits)
        world.apply("root", user("go"))
        (key,) = world.models
        tasks = [SUMMARY, {"task": "plain"}, {**SUMMARY, "task": "again"}]
        world.reply(key, ModelReply("", (spawn("first", *tasks),)))
        world.drain()
        world.check_quiet()


def test_limits_that_leave_summary_out_refuse_it_as_a_schema_6_log_did() -> None:
    """The limits say which modes tasks may ask for; a log of schema 6 decodes to
    task_only and full, so its spawn_agents tool and its refusals replay as recorded
    (tests/test_old_logs.py verifies such a log)."""
    briefed = AgentDefinition("briefed", "gets a summary", context=ContextMode.SUMMARY)
    old = Limits(context_modes=("task_only", "full"))
    state = steps(root(old, agents=(briefed,)), user("go"))
    spec = next(t for t in state.tools if t.name == "spawn_agents")
    context = spec.input_schema()["properties"]["tasks"]["items"]["properties"]["context"]
    assert context == {
        "type": "string",
        "enum": ["task_only", "full"],
        "description": "task_only (default): the sub-agent sees just its task; full: "
        "also this conversation so far",
    }
    tasks = (SUMMARY, {"task": "t", "agent": "briefed"}, {"task": "t", "context": "full"})
    state, effects = step(state, replied(state, spawn("s1", *tasks)))
    assert [s.context != () for s in of_type(effects, SpawnSubAgent)] == [True]  # the full one
    assert not of_type(effects, CallModel)  # no summary is made
    state = steps(state, SubAgentFinished("root.1", ChildSucceeded("ok")))
    rejected = fan_in(tool_results(state)[0].content)["rejected_tasks"]
    assert [r["error"] for r in rejected] == [
        "not spawned: 'context' must be task_only or full",
        "not spawned: agent 'briefed' asks for context summary; the limits offer task_only or full",
    ]


def test_a_summary_nobody_waits_for_any_more_is_aborted_while_the_round_goes_on() -> None:
    # A race of a summary child and a quick one, beside a plain call still running:
    # the race is won, its summary child cancelled, the summary call no longer needed.
    race = ToolCall.of("r", "spawn_agents", {"tasks": [SUMMARY, {"task": "quick"}], "quorum": 1})
    state = steps(root(), user("go"))
    state = steps(state, replied(state, race, spawn("p", "slow")))
    call = _summary_call(state)
    state, effects = step(state, SubAgentFinished("root.2", ChildSucceeded("won")))
    assert AbortCall(call) in effects and not of_type(effects, CallModel)
    assert isinstance(state.phase, AwaitingSubAgents)
    assert _summary(state).in_flight is None
    late, effects = step(state, ModelReplied(call, _summarised()))
    assert late == state and effects == ()
    state, effects = step(state, SubAgentFinished("root.3", ChildSucceeded("slow done")))
    assert of_type(effects, CallModel) and AbortCall(call) not in effects  # not twice


def test_a_billed_failed_summary_attempt_that_spends_the_budget_is_not_retried() -> None:
    # As with the parent's own calls: a failed attempt the server billed counts
    # against the budget, and once that is spent no further attempt is made (the
    # retries would overshoot the budget more each time).
    state = _spawned(Limits(max_tokens=100, max_attempts=3), SUMMARY)
    billed = ModelError(ErrorKind.RATE_LIMIT, "slow down", retry_after=1.0, usage=Usage(150, 1))
    state, effects = step(state, ModelFailed(_summary_call(state), billed))
    assert not of_type(effects, ScheduleRetry) and not of_type(effects, SpawnSubAgent)
    (entry,) = fan_in(tool_results(state)[0].content)["sub_agent_results"]
    assert entry["error_kind"] == "budget_exhausted"
    assert "token budget of 100" in entry["error"]


def test_a_summary_retry_due_after_the_budget_was_spent_is_not_made() -> None:
    # The budget was spent by a sibling while the retry waited: the next attempt
    # is not made (as none would be asked for with no budget left).
    state = _spawned(Limits(max_tokens=100, max_attempts=3), "plain", SUMMARY)
    unbilled = ModelError(ErrorKind.RATE_LIMIT, "slow down", retry_after=1.0)
    state, effects = step(state, ModelFailed(_summary_call(state), unbilled))
    retry = only(effects, ScheduleRetry)
    state = steps(state, SubAgentFinished("root.1", ChildSucceeded("done", tokens=120)))
    state, effects = step(state, TimerFired(retry.timer))
    assert not of_type(effects, SpawnSubAgent)
    assert of_type(effects, CallModel) == [CallModel(state.next_call - 1, 1)]  # the next round
    entries = fan_in(tool_results(state)[0].content)["sub_agent_results"]
    assert entries[1]["error_kind"] == "budget_exhausted"


def test_a_sequential_summary_step_not_run_after_a_failure_aborts_the_summary() -> None:
    # (From the review: the race case above, and this one.)
    seq = ToolCall.of(
        "s1", "spawn_agents", {"tasks": [{"task": "plan"}, SUMMARY], "mode": "sequential"}
    )
    state = steps(root(), user("go"))
    state = steps(state, replied(state, seq, spawn("s2", "plain")))
    summary_call = _summary_call(state)
    failed = ChildFailed("no plan", ErrorKind.SUBMITTED_ERROR)
    state, effects = step(state, SubAgentFinished("root.1", failed))
    assert AbortCall(summary_call) in effects
    assert _summary(state).in_flight is None
    assert isinstance(state.phase, AwaitingSubAgents)  # the plain child still runs


def test_a_summary_request_holds_no_tool_blocks_for_either_api() -> None:
    """Found in review: a summary made after a tool round sent Anthropic tool_use and
    tool_result blocks without any tools, which its API refuses (400: "Requests which
    include tool_use or tool_result blocks must define tools"), so every summary
    child would fail invalid_request. The conversation is now written as plain turns."""
    from fanfold.providers.anthropic import anthropic_request_body
    from fanfold.providers.openai import openai_request_body

    state = steps(root(), user("go"))
    state = steps(state, replied(state, tool("t1"), text="Looking."))
    state = steps(state, tool_done(state, "found it"))
    state = steps(state, replied(state, spawn("s1", SUMMARY)))
    request = model_request(state)
    anthropic = anthropic_request_body(request, model="m", stream=False)
    assert "tools" not in anthropic
    blocks = [
        b for m in anthropic["messages"] if isinstance(m["content"], list) for b in m["content"]
    ]
    assert not [b for b in blocks if b.get("type") in ("tool_use", "tool_result")]
    openai = openai_request_body(request, model="m", stream=False)
    assert "tools" not in openai
    assert not [m for m in openai["messages"] if m.get("tool_calls") or m["role"] == "tool"]


def test_a_summary_cut_off_at_the_output_limit_says_so() -> None:
    state = _spawned(None, SUMMARY)
    cut = ModelReply("The goal is", usage=Usage(5, 5), stop_reason="max_tokens")
    state, effects = step(state, ModelReplied(_summary_call(state), cut))
    (spawned,) = of_type(effects, SpawnSubAgent)
    assert spawned.context == (
        UserMessage(
            SUMMARY_HEADER + "The goal is\n[the summary was cut off at the output token limit]"
        ),
    )


def test_is_summary_call_names_only_the_summary_call_awaited() -> None:
    """(Mutation testing: the trace and the OpenTelemetry spans label a call with it,
    and no pure test asked it; a mutant that crashed or always said no survived.)"""
    state = steps(root(), user("go"))
    round_call = call_of(state)
    assert not is_summary_call(state, round_call)  # a round's call, no summary at all
    state = steps(state, replied(state, spawn("s1", SUMMARY, "plain")))
    call = _summary_call(state)
    assert is_summary_call(state, call)
    assert not is_summary_call(state, round_call) and not is_summary_call(state, call + 1)
    # Once made, it is no call awaited any more.
    state = steps(state, ModelReplied(call, _summarised()))
    assert not is_summary_call(state, call)


def test_a_failed_tool_result_is_marked_in_the_summary_request() -> None:
    """(Mutation testing: dropping the " (error)" mark survived.) The model that
    summarises must know a tool call failed, not read its error text as its output."""
    state = steps(root(), user("go"))
    state = steps(state, replied(state, tool("t1"), text="Looking."))
    state = steps(state, tool_done(state, "no such file", is_error=True))
    state = steps(state, replied(state, spawn("s1", SUMMARY)))
    assert UserMessage("[result of bash (error): no such file]") in model_request(state).messages


def test_children_without_a_summary_for_want_of_budget_are_stopped_by_the_limit() -> None:
    """(Mutation testing: their outcome's reason was unchecked whenever the round ended
    in the same step, as the invariants see only the children still held.) A sibling
    still runs here, so the failed child stays in the round, with its reason."""
    state = steps(root(Limits(max_tokens=100)), user("go"))
    calls = (spawn("s1", "plain", "slow"), spawn("s2", SUMMARY), tool("t1"))
    state = steps(state, ModelReplied(0, ModelReply("", calls, Usage(5, 5))))
    state = steps(state, SubAgentFinished("root.1", ChildSucceeded("done", tokens=90)))
    state, effects = step(state, tool_done(state))
    assert not of_type(effects, CallModel) and not of_type(effects, SpawnSubAgent)
    assert isinstance(state.phase, AwaitingSubAgents)  # root.2 still runs
    children = state.children
    assert children is not None
    (failed,) = [f.outcome for f in children.finished if f.spec.id == "root.3"]
    assert failed == ChildFailed(
        "not started: no summary of its parent's conversation: the token budget of 100 is used up",
        ErrorKind.BUDGET_EXHAUSTED,
        CancelReason.LIMIT,
    )


def test_a_step_unblocked_by_children_left_without_a_summary_gets_their_share() -> None:
    """(Mutation testing: stopping the start pass at the first child left without a
    summary survived.) The children that cannot start are finished before the next
    pass, so a step they unblock splits the budget with none of them."""
    steps_call = ToolCall.of(
        "s1",
        "spawn_agents",
        {"tasks": [SUMMARY, {"task": "go on"}], "mode": "sequential", "keep_going": True},
    )
    state = steps(root(Limits(max_tokens=900)), user("go"))
    state = steps(state, replied(state, steps_call, spawn("s2", SUMMARY)))
    refusal = ModelReply("no", stop_reason="refusal")
    state, effects = step(state, ModelReplied(_summary_call(state), refusal))
    # Both summary children failed; the step after the first starts on half of the
    # 900 tokens (the other half stays with the parent), not on a third.
    spawned = of_type(effects, SpawnSubAgent)
    assert [(s.child_id, s.limits.max_tokens) for s in spawned] == [("root.2", 450)]


def test_context_modes_must_hold_task_only_and_known_modes_once_each() -> None:
    """(Mutation testing: a validator that or-ed its conditions survived.)"""
    for modes in (("full",), ("summary", "full"), ("task_only", "bogus"), ("task_only",) * 2):
        with pytest.raises(ValueError, match="context_modes must list task_only"):
            Limits(context_modes=modes)
    with pytest.raises(ValueError, match="context_modes must list task_only"):
        Limits(context_modes=["task_only"])  # type: ignore[arg-type]
    assert Limits(context_modes=("task_only",)).context_modes == ("task_only",)


def test_the_spawn_tool_follows_the_limits_modes_with_the_same_agents() -> None:
    """(Mutation testing: the memo of the last spawn tool and tool set could return the
    one made for other modes.) A tree whose limits offer fewer modes gets a tool that
    lists only those, even right after one listing all of them for the same agents."""
    agents = (AgentDefinition("briefed", "gets a summary", context=ContextMode.SUMMARY),)

    def context_enum(spec: Any) -> list[str]:
        properties = spec.input_schema()["properties"]["tasks"]["items"]["properties"]
        return list(properties["context"]["enum"])

    old = ("task_only", "full")
    for modes in (CONTEXT_MODES, old, CONTEXT_MODES, old):
        assert context_enum(spawn_agents_spec(agents, modes)) == list(modes)
        offered = offered_tools(
            (), depth=0, is_sub_agent=False, limits=Limits(context_modes=modes), agents=agents
        )
        (spec,) = [t for t in offered if t.name == "spawn_agents"]
        assert context_enum(spec) == list(modes)


def test_an_answer_to_a_call_never_issued_during_a_summary_is_refused_with_its_event() -> None:
    """(Mutation testing: the refusal could carry no event, unnoticed.)"""
    state = _spawned(None, SUMMARY)
    unknown = ModelReplied(state.next_call + 5, _summarised())
    with pytest.raises(UnknownCall) as refused:
        step(state, unknown)
    assert refused.value.event == unknown


def test_a_summary_call_gets_max_attempts_in_all_then_its_children_fail() -> None:
    """(Mutation testing: one attempt too many, ``<=`` for ``<``, survived.)"""
    state = _spawned(Limits(max_attempts=2), SUMMARY)
    error = ModelError(ErrorKind.RATE_LIMIT, "slow down", retry_after=1.0)
    state, effects = step(state, ModelFailed(_summary_call(state), error))
    state, effects = step(state, TimerFired(only(effects, ScheduleRetry).timer))
    state, effects = step(state, ModelFailed(only(effects, CallModel).call, error))
    assert not of_type(effects, ScheduleRetry) and not of_type(effects, SpawnSubAgent)
    (entry,) = fan_in(tool_results(state)[0].content)["sub_agent_results"]
    assert entry["error"] == (
        "not started: no summary of its parent's conversation: the summary call failed "
        "(rate_limit, retries exhausted after 2 attempt(s)): slow down"
    )


def test_a_refusal_to_summarise_says_why_as_best_it_can() -> None:
    """(Mutation testing: the fallbacks of the explanation survived.) The refusal's
    details, else its text, else a placeholder."""
    for reply, why in (
        (ModelReply("I can't", stop_reason="refusal"), "I can't"),
        (ModelReply("", stop_reason="refusal"), "(no explanation given)"),
    ):
        state = _spawned(None, SUMMARY)
        state = steps(state, ModelReplied(_summary_call(state), reply))
        (entry,) = fan_in(tool_results(state)[0].content)["sub_agent_results"]
        assert entry["error"] == (
            f"not started: no summary of its parent's conversation: "
            f"the model refused to summarise: {why}"
        )


def test_a_reply_with_no_text_is_only_its_tool_calls_in_the_summary_request() -> None:
    """(Mutation testing: keeping an empty text survived: the turn began with a blank
    line.)"""
    state = steps(root(), user("go"))
    state = steps(state, replied(state, spawn("s1", SUMMARY)))
    (call,) = [c for m in state.history if isinstance(m, AssistantMessage) for c in m.tool_calls]
    assert model_request(state).messages == (
        UserMessage("go"),
        AssistantMessage(f"[tool call spawn_agents: {call.arguments_json}]"),
        UserMessage(SUMMARY_PROMPT),
    )


def test_a_child_started_beside_one_left_without_a_summary_is_spawned() -> None:
    """(Mutation testing: the start pass's effects could be dropped when a later pass
    or a failed child's mode replaced them, unnoticed.) One slot: the third task
    starts when the second ends, in the pass that fails the summary child."""
    state = _spawned(Limits(max_concurrent=1), SUMMARY, "second", "third")
    refusal = ModelReply("no", stop_reason="refusal")
    state = steps(state, ModelReplied(_summary_call(state), refusal))
    state, effects = step(state, SubAgentFinished("root.2", ChildSucceeded("ok")))
    assert [s.child_id for s in of_type(effects, SpawnSubAgent)] == ["root.3"]
    state = steps(state, SubAgentFinished("root.3", ChildSucceeded("ok")))
    entries = fan_in(tool_results(state)[0].content)["sub_agent_results"]
    assert [e["status"] for e in entries] == ["failed", "completed", "completed"]


def test_a_task_only_context_is_recorded_as_no_context_mode() -> None:
    """(Mutation testing: recording "task_only" itself survived; the spec writes the
    mode only when it is not task_only.)"""
    briefed = AgentDefinition("briefed", "gets a summary", context=ContextMode.SUMMARY)
    state = steps(root(agents=(briefed,)), user("go"))
    tasks = ({"task": "t", "agent": "briefed", "context": "task_only"}, {**SUMMARY})
    state = steps(state, replied(state, spawn("s1", *tasks)))
    children = state.children
    assert children is not None
    assert [p.spec.context for p in children.pending] == [None, "summary"]


def test_a_summary_retry_without_a_hint_backs_off_as_specified() -> None:
    """(Mutation testing: a jitter drawn without the timer number survived; every test
    gave a retry_after hint.)"""
    state = _spawned(Limits(max_attempts=3), SUMMARY)
    error = ModelError(ErrorKind.SERVER_ERROR, "busy")
    after, effects = step(state, ModelFailed(_summary_call(state), error))
    retry = only(effects, ScheduleRetry)
    assert retry.delay == expected_backoff(after, 2, error, retry.timer)


def test_the_spawn_tools_are_made_in_a_fresh_process_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """(Mutation testing: memo checks that failed only on their first use survived: the
    memos were always filled by an earlier test.)"""
    monkeypatch.setattr(control_tools, "_last_spawn_spec", [None])
    monkeypatch.setattr(control_tools, "_last_offered", [None])
    agents = (AgentDefinition("briefed", "gets a summary"),)
    assert spawn_agents_spec(agents).name == "spawn_agents"
    offered = offered_tools((), depth=0, is_sub_agent=False, limits=Limits(), agents=agents)
    assert [t.name for t in offered] == ["spawn_agents"]
    monkeypatch.setattr(control_tools, "_last_ordinary", [None])
    assert [t.name for t in ordinary_tools(root().tools + offered)] == ["bash", "read_file"]
    monkeypatch.setattr(limits_module, "_last_with_rounds", [None])
    assert with_max_rounds(Limits(), 3) == Limits(max_rounds=3)


def test_siblings_share_one_spawn_tool_and_one_tool_set() -> None:
    """(Mutation testing: memos that never hit, or were never filled, survived: only
    memory told.) As documented, called again with the same arguments, both return
    the very object they made, which the siblings' states and log encodings share."""
    agents = (AgentDefinition("briefed", "gets a summary"),)
    for modes in (CONTEXT_MODES, ("task_only", "full")):
        assert spawn_agents_spec(agents, modes) is spawn_agents_spec(agents, modes)
        limits = Limits(context_modes=modes)
        ordinary = root().tools  # one tuple, as a spawn's siblings get it
        first = offered_tools(ordinary, depth=0, is_sub_agent=True, limits=limits, agents=agents)
        again = offered_tools(ordinary, depth=0, is_sub_agent=True, limits=limits, agents=agents)
        assert again is first
        assert ordinary_tools(first) is ordinary_tools(first)


def test_an_unbilled_summary_failure_is_retried_even_after_a_sibling_spent_the_budget() -> None:
    """(Mutation testing: checking the budget after every failure, not only a billed
    one, survived.) The budget is checked when the retry is due (the test above);
    a failure that cost nothing schedules it as usual."""
    state = _spawned(Limits(max_tokens=100, max_attempts=3), "plain", SUMMARY)
    state = steps(state, SubAgentFinished("root.1", ChildSucceeded("done", tokens=120)))
    unbilled = ModelError(ErrorKind.RATE_LIMIT, "slow down", retry_after=1.0)
    state, effects = step(state, ModelFailed(_summary_call(state), unbilled))
    assert only(effects, ScheduleRetry).attempt == 2
    assert isinstance(state.phase, AwaitingSubAgents)


def test_own_messages_start_at_the_last_copy_of_the_task() -> None:
    # A sub-agent of context mode full: its parent's conversation (which may hold the
    # task's text too), then its task, its turns and the grace prompt. Until issue 26
    # only the tree property reached this, with examples that changed with imports.
    task = UserMessage("do it")
    reply = AssistantMessage("ok")
    grace = UserMessage("time is up: submit")
    history = (task, reply, UserMessage("go"), reply, task, reply, grace)
    assert own_messages(history, "do it", True) == history[4:]
    assert own_messages(history[:5], "do it", True) == (task,)  # the task last
    assert own_messages(history[:6], "do it", True) == (task, reply)
    assert own_messages(history[:2], "do it", True) == history[:2]  # the task first
    assert own_messages((reply, task, grace), "do it", True) == (task, grace)
    # No copy of the task, no history, no task, or a root: the whole history.
    assert own_messages(history, "other", True) == history
    assert own_messages((), "do it", True) == ()
    assert own_messages(history, None, True) == history
    assert own_messages(history, "do it", False) == history
    assert own_messages(history, None, False) == history
