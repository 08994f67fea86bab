"""The transition table in DESIGN.md is the reducer's real behaviour, and is current."""

from __future__ import annotations

import random
from pathlib import Path

import attrs
import pytest
import sm_support as sm
from hypothesis import given, settings
from hypothesis import strategies as st

from fanfold import testing
from fanfold.statemachine import (
    ALL_EVENTS,
    ALL_PHASES,
    AwaitingRetry,
    CancellingSubAgents,
    CancelReason,
    CancelRequested,
    ChildFailed,
    ChildSucceeded,
    Conversation,
    ConversationCreated,
    ErrorKind,
    Event,
    ForkEdited,
    IllegalTransition,
    Limits,
    LlmRequesting,
    ModelError,
    ModelFailed,
    ModelReplied,
    ModelReply,
    ReplyEdit,
    RuntimeResumed,
    SubAgentFinished,
    SystemPromptEdit,
    TaskEdit,
    TimerFired,
    ToolCall,
    ToolExecuting,
    ToolFinished,
    ToolResult,
    ToolResultEdit,
    ToolsChanged,
    ToolSpec,
    Usage,
    UserMessaged,
    start,
    transition,
)
from fanfold.statemachine.table import (
    BEGIN,
    END,
    START_TARGETS,
    TABLE,
    generated_section,
    update,
)

BASH = ToolSpec.from_schema("bash", "run a command", {"type": "object"})
MCP_TOOL = ToolSpec.from_schema("mcp__srv__t", "a server's tool", {"type": "object"})
LIMITS = Limits(max_rounds=3, max_attempts=2, max_concurrent=2, child_timeout=5.0)


def _reply(rng: random.Random, counter: list[int]) -> ModelReply:
    calls = []
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
        counter[0] += 1
        name = rng.choice(["bash", "spawn_agents", "submit_result", "submit_error", "nope"])
        if name == "spawn_agents":
            tasks = [{"task": f"t{i}"} for i in range(rng.choice([0, 1, 2, 3, 12]))]
            calls.append(ToolCall.of(f"c{counter[0]}", name, {"tasks": tasks}))
        elif name == "submit_result":
            calls.append(ToolCall.of(f"c{counter[0]}", name, {"result": "done"}))
        elif name == "submit_error":
            calls.append(ToolCall.of(f"c{counter[0]}", name, {"error": "no"}))
        else:
            calls.append(ToolCall.of(f"c{counter[0]}", name, {"command": "ls"}))
    return ModelReply(text=rng.choice(["", "hello"]), tool_calls=tuple(calls))


def _candidates(state: Conversation, rng: random.Random, counter: list[int]) -> list[Event]:
    phase = state.phase
    events: list[Event] = [CancelRequested(rng.choice(list(CancelReason))), RuntimeResumed()]
    if state.next_call:
        n = rng.randrange(state.next_call)
        events += [
            TimerFired(n),
            ModelReplied(n, ModelReply("late")),
            ToolFinished(n, ToolResult("x", "bash", "late")),
        ]
    events.append(UserMessaged("hi"))
    if isinstance(phase, LlmRequesting):
        for _ in range(3):
            events.append(ModelReplied(phase.call, _reply(rng, counter)))
        kind = rng.choice(list(ErrorKind))
        events.append(ModelFailed(phase.call, ModelError(kind, "boom")))
    if isinstance(phase, AwaitingRetry):
        events += [TimerFired(phase.timer)] * 3
    if isinstance(phase, ToolExecuting):
        events += [ToolFinished(phase.call, ToolResult(phase.current.id, "bash", "ok"))] * 3
    if isinstance(phase, CancellingSubAgents):
        events.append(TimerFired(phase.grace_timer))
    if state.deadline_timer is not None:
        events.append(TimerFired(state.deadline_timer))
    children = getattr(phase, "children", None)
    if children is not None:
        for pending in children.pending:
            outcomes: list[ChildSucceeded | ChildFailed] = [
                ChildSucceeded("r"),
                ChildFailed("e", ErrorKind.CANCELLED, CancelReason.PARENT),
            ]
            outcome = rng.choice(outcomes)
            events += [SubAgentFinished(pending.spec.id, outcome)] * 2
            if pending.deadline_timer is not None:
                events.append(TimerFired(pending.deadline_timer))
        for finished in children.finished:
            events.append(SubAgentFinished(finished.spec.id, ChildSucceeded("again")))
    events.append(SubAgentFinished("stranger", ChildSucceeded("?")))
    return events


Observed = set[tuple[str, str, str]]


def _outcome(state: Conversation, event: Event) -> tuple[str, Conversation | None]:
    """What the reducer did: the next phase's name, or the exact exception's name."""
    try:
        after, _ = transition(state, event)
    except IllegalTransition as error:
        return type(error).__name__, None
    return type(after.phase).__name__, after


def _observe(state: Conversation, event: Event, seen: Observed) -> Conversation | None:
    result, after = _outcome(state, event)
    seen.add((type(state.phase).__name__, type(event).__name__, result))
    # A fork edit of the awaited reply or the running tool's result goes where the
    # real one goes: try it beside every one tried (it does not move the walk on).
    phase = state.phase
    mirrored: Event | None = None
    match event:
        case ModelReplied(call=n, reply=reply) if isinstance(phase, LlmRequesting) and (
            phase.call == n
        ):
            mirrored = ForkEdited(ReplyEdit(reply))
        case ToolFinished(call=n, result=tool_result) if isinstance(phase, ToolExecuting) and (
            phase.call == n
        ):
            mirrored = ForkEdited(ToolResultEdit(tool_result))
    if mirrored is not None:
        edited, _ = _outcome(state, mirrored)
        seen.add((type(phase).__name__, "ForkEdited", edited))
    return after


def _probe(state: Conversation, seen: Observed) -> None:
    """Try, without moving on, the events that leave ``state`` rarely: every refusal,
    late results of each kind, outcomes of written-off children, cancels, restarts."""
    probes: list[Event] = [r.event for r in testing.rejections(state)]
    probes += [CancelRequested(reason) for reason in CancelReason]
    probes.append(RuntimeResumed())
    probes.append(ToolsChanged("srv", (MCP_TOOL,)))  # an MCP server's new tool list
    if state.next_call:
        late = state.next_call - 1
        while late in testing.live_numbers(state) and late > 0:
            late -= 1
        if late not in testing.live_numbers(state):
            probes.append(ModelFailed(late, ModelError(ErrorKind.NETWORK, "late")))
    probes += [SubAgentFinished(child, ChildSucceeded("late")) for child in state.written_off]
    probes += [ForkEdited(SystemPromptEdit("edited")), ForkEdited(TaskEdit("edited task"))]
    for event in probes:
        _observe(state, event, seen)


def _walk(seed: int, sub_agent: bool, generated: bool = False) -> Observed:
    """A seeded walk choosing among this file's candidates, or (``generated``) among
    the events of ``fanfold.testing``'s generators, so an event that has a generator is
    covered without an edit here."""
    rng = random.Random(seed)
    created = ConversationCreated(
        conversation_id="c",
        parent_id="p" if sub_agent else None,
        root_id="p" if sub_agent else None,
        depth=1 if sub_agent else 0,
        task="work" if sub_agent else None,
        limits=LIMITS if not sub_agent else attrs.evolve(LIMITS, max_depth=2),
        tools=(BASH,),
        # Half the roots have a time limit (per turn): a delegated tree's agent's.
        timeout=3.0 if sub_agent or seed % 4 == 0 else None,
    )
    state, _ = start(created)
    assert type(state.phase).__name__ in START_TARGETS
    seen: Observed = set()
    counter = [0]
    for _ in range(60):
        _probe(state, seen)
        if generated:
            candidates = testing.each_plausible_event(state, rng.randbytes(16))
        else:
            candidates = _candidates(state, rng, counter)
        after = _observe(state, rng.choice(candidates), seen)
        if after is not None:
            state = after
    return seen


def _cell_allows(phase: str, event: str, result: str) -> bool:
    cell = TABLE[(phase, event)]
    return result in cell.targets or result in {e.__name__ for e in cell.refusals}


# ------------------------------------------------------------------ directed examples
#
# Steps the random walk rarely or never takes, built by hand so that every target and
# every refusal the table lists is shown to happen (the walk's seeds are fixed, so the
# coverage test is deterministic).


def _directed() -> Observed:
    seen: Observed = set()
    lim = Limits(max_rounds=1, max_attempts=1, max_concurrent=1, child_timeout=5.0)
    # A sub-agent, then a root, whose token budget runs out on the first reply:
    # Failed / Error budget_exhausted.
    spend = Usage(10, 5)
    tight = sm.child(attrs.evolve(lim, max_tokens=10))
    _observe(tight, sm.replied(tight, sm.tool("a1"), usage=spend), seen)
    tight_root = sm.steps(sm.root(attrs.evolve(lim, max_tokens=10)), sm.user("go"))
    _observe(tight_root, sm.replied(tight_root, sm.tool("a1"), usage=spend), seen)
    # The grace round: past max_rounds, more tool calls end a root in Error and a
    # sub-agent in Failed (iteration_limit).
    for state in (sm.steps(sm.root(lim), sm.user("go")), sm.child(lim)):
        state = sm.steps(state, sm.replied(state, sm.tool("a1")))
        state = sm.steps(state, sm.tool_done(state))
        _observe(state, sm.replied(state, sm.tool("a2")), seen)
    # A reply that spawns a child and submits at once: the running child is cancelled
    # first (LlmRequesting -> CancellingSubAgents on the reply).
    at_once = sm.child(attrs.evolve(LIMITS, max_depth=2))
    _observe(at_once, sm.replied(at_once, sm.spawn("s1", "t"), sm.submit("s2", "done")), seen)
    # A tool round that ends with submit_result while nothing else runs: Completed.
    sub = sm.child(LIMITS)
    sub = sm.steps(sub, sm.replied(sub, sm.tool("a1"), sm.submit("s1", "done")))
    _observe(sub, sm.tool_done(sub), seen)
    # ...and with submit_error: Failed, after the tool's result or after a restart
    # (the interrupted tool gets its error result, then the submission counts).
    sub = sm.child(LIMITS)
    sub = sm.steps(sub, sm.replied(sub, sm.tool("a1"), sm.submit_error("s1", "cannot")))
    _observe(sub, sm.tool_done(sub), seen)
    _observe(sub, RuntimeResumed(), seen)
    # A sub-agent that spawned a child and still runs a tool: its own time limit, or a
    # submit_result after the tool, must first cancel the running child.
    parent = sm.child(attrs.evolve(LIMITS, max_depth=2), timeout=60.0)
    parent = sm.steps(
        parent, sm.replied(parent, sm.spawn("s1", "t"), sm.tool("a1"), sm.submit("s2", "done"))
    )
    # spawn_agents ran inline: the child runs while bash does.
    assert parent.deadline_timer is not None
    _observe(parent, TimerFired(parent.deadline_timer), seen)
    cancelling = _observe(parent, sm.tool_done(parent), seen)
    # ...and once the child acknowledges, the sub-agent completes with its submission.
    assert cancelling is not None and isinstance(cancelling.phase, CancellingSubAgents)
    (child,) = cancelling.phase.children.pending_ids()
    _observe(cancelling, SubAgentFinished(child, ChildSucceeded("stopped")), seen)
    # Context mode summary: the parent's summary call is refused, so its only child
    # never starts and the round ends (AwaitingSubAgents -> LlmRequesting on the
    # reply); a sub-agent cancelled while the call runs ends at once (nothing runs).
    wants = {"task": "t", "context": "summary"}
    summarising = sm.steps(sm.root(LIMITS), sm.user("go"))
    summarising = sm.steps(summarising, sm.replied(summarising, sm.spawn("s1", wants)))
    (call,) = testing.live_numbers(summarising)
    _observe(summarising, ModelReplied(call, ModelReply("no", stop_reason="refusal")), seen)
    sub = sm.child(attrs.evolve(LIMITS, max_depth=2))
    sub = sm.steps(sub, sm.replied(sub, sm.spawn("s1", wants)))
    _observe(sub, CancelRequested(CancelReason.PARENT), seen)
    return seen


def _covered() -> Observed:
    observed: Observed = set()
    for seed in range(300):
        observed |= _walk(seed, sub_agent=seed % 2 == 1)
    for seed in range(100):
        observed |= _walk(seed, sub_agent=seed % 2 == 1, generated=True)
    return observed | _directed()


# ------------------------------------------------------------------ the tests


def test_table_covers_every_phase_and_event() -> None:
    for phase in ALL_PHASES:
        for event in ALL_EVENTS:
            cell = TABLE[(phase.__name__, event.__name__)]
            assert cell.targets or cell.refusals, (phase, event)
            assert cell.targets <= {p.__name__ for p in ALL_PHASES}, (phase, event)


def test_every_observed_step_is_in_the_table() -> None:
    observed = _covered()
    missing = [step for step in observed if not _cell_allows(*step)]
    assert not missing, f"steps the table does not list: {sorted(missing)}"
    # The walk reaches every phase, so the check above is not vacuous.
    assert {phase for phase, _, _ in observed} == {p.__name__ for p in ALL_PHASES}


def test_every_listed_step_happens() -> None:
    """The other direction: every target and every refusal of every cell is reached."""
    observed = _covered()
    unreached = [
        (phase, event, result)
        for (phase, event), cell in TABLE.items()
        for result in (*cell.targets, *(e.__name__ for e in cell.refusals))
        if (phase, event, result) not in observed
    ]
    assert not unreached, f"the table lists steps no example takes: {sorted(unreached)}"


def _any_event(state: Conversation) -> st.SearchStrategy[Event]:
    """Events of every kind for ``state``: plausible ones, rejected ones, and one of each
    event type as it might arrive from a confused or malicious sender."""
    fixed: list[Event] = [
        UserMessaged("hi"),
        ConversationCreated(state.id),
        CancelRequested(CancelReason.USER),
        RuntimeResumed(),
        SubAgentFinished("stranger", ChildSucceeded("?")),
    ]
    options = [
        testing.plausible_events(state),
        testing.rejected_events(state).map(lambda r: r.event),
        st.sampled_from(fixed),
    ]
    if testing.has_stale_events(state):
        options.append(testing.stale_events(state))
    return st.one_of(options)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_generated_steps_obey_their_cell(data: st.DataObject) -> None:
    """Any event in any reachable state lands in its cell; "raise" cells always raise."""
    state = data.draw(testing.conversations())
    event = data.draw(_any_event(state))
    phase, kind = type(state.phase).__name__, type(event).__name__
    result, _ = _outcome(state, event)
    assert _cell_allows(phase, kind, result), (phase, kind, result)
    if not TABLE[(phase, kind)].targets:
        assert result in {e.__name__ for e in TABLE[(phase, kind)].refusals}


@settings(max_examples=100, deadline=None)
@given(testing.conversations())
def test_raise_cells_raise_their_exception(state: Conversation) -> None:
    """Each cell with no targets raises its listed exception in generated states, with
    the events ``fanfold.testing.rejections`` says must be refused there."""
    samples: dict[str, Event] = {}
    for rejected in testing.rejections(state):
        samples.setdefault(type(rejected.event).__name__, rejected.event)
    phase = type(state.phase).__name__
    checked = 0
    for (cell_phase, kind), cell in TABLE.items():
        if cell_phase != phase or cell.targets:
            continue
        assert kind in samples, f"fanfold.testing.rejections gives no {kind} in {phase}"
        result, _ = _outcome(state, samples[kind])
        assert result in {e.__name__ for e in cell.refusals}, (phase, kind, result)
        checked += 1
    assert checked >= 2  # ConversationCreated and ConversationForked at least


def test_design_md_shows_the_current_table_and_diagram() -> None:
    design = (Path(__file__).parent.parent / "DESIGN.md").read_text(encoding="utf-8")
    assert generated_section() in design
    assert update(design) == design, "run: python -m fanfold.statemachine.table DESIGN.md"


def test_update_replaces_the_first_generated_section_only() -> None:
    text = f"head\n{BEGIN}\nold\n{END}\nquoted: {BEGIN}{END}\ntail"
    assert update(text) == f"head\n{generated_section()}\nquoted: {BEGIN}{END}\ntail"
    for broken in ("no markers", f"{BEGIN} and no end"):
        with pytest.raises(ValueError, match="marker"):
            update(broken)
