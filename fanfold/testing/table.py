"""The transition table observed: which (phase, event type) cells a reducer handles and
which it refuses (``table_report``, ``observe_step``), against the documented table
(``check_table``; ``fanfold.statemachine.table.TABLE``, DESIGN.md).
"""

from __future__ import annotations

import hashlib
from typing import Any

import attrs

from fanfold.statemachine import (
    ALL_PHASES,
    SPAWN_AGENTS,
    SUBMIT_ERROR,
    SUBMIT_RESULT,
    ApprovalDenied,
    ApprovalGranted,
    CancelReason,
    CancelRequested,
    Conversation,
    Event,
    ForkEdited,
    IllegalTransition,
    LlmRequesting,
    ModelReplied,
    ModelReply,
    ReplyEdit,
    RuntimeResumed,
    SystemPromptEdit,
    TaskEdit,
    TimerFired,
    ToolCall,
    ToolExecuting,
    ToolFinished,
    ToolResultEdit,
    ToolsChanged,
    ToolSpec,
    UserAnswered,
    UserMessaged,
    start,
)
from fanfold.statemachine.table import TABLE
from fanfold.testing.checks import late_events, rejections
from fanfold.testing.strategies import (
    Reducer,
    _created,
    _Dice,
    _progress_makers,
    _rare_makers,
    _reducer,
)

__all__ = ["TableReport", "TableStep", "check_table", "observe_step", "table_report"]
# --------------------------------------------------------------------------- the table

TableStep = tuple[str, str, str]
"""One observed step: ``(phase, event type, outcome)``; the outcome is the phase it led
to, or the name of the exception it raised."""


@attrs.frozen
class TableReport:
    """What a reducer did, cell by cell, against the documented table
    (``fanfold.statemachine.table.TABLE``, rendered in DESIGN.md).

    ``observed``: every step seen; ``unlisted``: steps the table does not list (a rule
    that refuses where the table accepts, or leads where it says nothing leads);
    ``unreached``: targets and refusals the table lists that no step took (a rule that
    leaves a cell out). ``cells()`` says of each (phase, event type) seen whether it
    was handled, raised, or both.
    """

    observed: frozenset[TableStep]
    unlisted: tuple[TableStep, ...]
    unreached: tuple[TableStep, ...]

    def cells(self) -> dict[tuple[str, str], str]:
        """``"handled"``, ``"raises"`` or ``"handled or raises"`` for each cell seen."""
        phases = {phase.__name__ for phase in ALL_PHASES}
        found: dict[tuple[str, str], set[str]] = {}
        for phase, event, outcome in self.observed:
            found.setdefault((phase, event), set()).add(
                "handled" if outcome in phases else "raises"
            )
        return {cell: " or ".join(sorted(kinds)) for cell, kinds in sorted(found.items())}

    @property
    def agrees(self) -> bool:
        return not self.unlisted and not self.unreached

    def __str__(self) -> str:
        lines = [f"{len(self.observed)} steps observed"]
        lines += [f"not in the table: {p} x {e} -> {o}" for p, e, o in self.unlisted]
        lines += [f"listed, never taken: {p} x {e} -> {o}" for p, e, o in self.unreached]
        return "\n".join(lines)


def _table_outcome(reducer: Reducer, state: Conversation, event: Event) -> tuple[str, Any]:
    try:
        after, _ = reducer(state, event)
    except IllegalTransition as error:
        return type(error).__name__, None
    return type(after.phase).__name__, after


def observe_step(
    state: Conversation, event: Event, seen: set[TableStep], transition: Reducer | None = None
) -> Conversation | None:
    """Run one step of ``transition`` (fanfold's by default), add what it did to
    ``seen``, and return the state after it (None if refused). An awaited reply or the
    running tool's result is also tried as the fork edit that stands for it."""
    reducer = _reducer(transition)
    result, after = _table_outcome(reducer, state, event)
    phase = state.phase
    seen.add((type(phase).__name__, type(event).__name__, result))
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
        edited, _ = _table_outcome(reducer, state, mirrored)
        seen.add((type(phase).__name__, "ForkEdited", edited))
    return after if isinstance(after, Conversation) else None


_MCP_PROBE_TOOL = ToolSpec.from_schema("mcp__srv__t", "a server's tool", {"type": "object"})


def _probe_table(state: Conversation, seen: set[TableStep], reducer: Reducer) -> None:
    """Try, without moving on, the events that leave ``state`` rarely: every refusal,
    late results of each kind, outcomes of written-off children, cancels, restarts,
    fork edits."""
    probes: list[Event] = [r.event for r in rejections(state)]
    probes += [CancelRequested(reason) for reason in CancelReason]
    probes.append(RuntimeResumed())
    probes.append(ToolsChanged("srv", (_MCP_PROBE_TOOL,)))  # an MCP server's new tool list
    probes += late_events(state)
    probes += [ForkEdited(SystemPromptEdit("edited")), ForkEdited(TaskEdit("edited task"))]
    probes.append(UserMessaged("hi"))
    probes += _decisions_on(state)
    for event in probes:
        observe_step(state, event, seen, reducer)
    _probe_asking_rounds(state, seen, reducer)


def _decisions_on(state: Conversation) -> list[Event]:
    """Every decision on ``state``'s open request (issue 35), if it has one."""
    phase = state.phase
    if not (isinstance(phase, ToolExecuting) and phase.asking is not None):
        return []
    probes: list[Event] = [
        ApprovalGranted(phase.call),
        ApprovalGranted(phase.call, '{"command":"ls","n":NaN}'),  # refused on the way
        ApprovalDenied(phase.call, "no"),
        UserAnswered(phase.call, "yes"),
    ]
    if phase.asking.timer is not None:
        probes.append(TimerFired(phase.asking.timer))
    return probes


def _probe_asking_rounds(state: Conversation, seen: set[TableStep], reducer: Reducer) -> None:
    """From a model call in flight, rounds whose first call waits for a person and
    whose next calls end the round in each way (another tool, children, a submit with
    and without children running), each decided in every way: the decisions' cells,
    whatever follows them (issue 35)."""
    phase = state.phase
    if not isinstance(phase, LlmRequesting):
        return
    asking = [t.name for t in state.tools if t.needs_approval or t.name == "ask_user"]
    if not asking:
        return
    follow = [
        (ToolCall("p2", "bash", '{"command":"ls"}'),),
        (ToolCall("p2", SPAWN_AGENTS, '{"tasks":[{"task":"t"}]}'),),
        (ToolCall("p2", SUBMIT_RESULT, '{"result":"r"}'),),
        (ToolCall("p2", SUBMIT_ERROR, '{"error":"e"}'),),
        (
            ToolCall("p2", SPAWN_AGENTS, '{"tasks":[{"task":"t"}]}'),
            ToolCall("p3", SUBMIT_RESULT, '{"result":"r"}'),
        ),
    ]
    for name in asking:
        arguments = '{"question":"q?"}' if name == "ask_user" else "{}"
        for after_it in follow:
            first = ToolCall("p1", name, arguments)
            for calls in ((first, *after_it), (*after_it[:1], first, *after_it[1:])):
                reply = ModelReply(tool_calls=calls, stop_reason="tool_use")
                waiting = observe_step(state, ModelReplied(phase.call, reply), seen, reducer)
                if waiting is None:
                    continue
                for event in _decisions_on(waiting):
                    observe_step(waiting, event, seen, reducer)


def table_report(
    transition: Reducer | None = None,
    *,
    walks: int = 200,
    steps: int = 60,
    extra: frozenset[TableStep] | set[TableStep] = frozenset(),
) -> TableReport:
    """Which (phase, event type) cells ``transition`` (the reducer under test, fanfold's
    by default) handles and which it refuses, against the documented table.

    Seeded walks (``walks`` of up to ``steps`` steps, half of them sub-agents, their
    creations drawn as ``conversation_created()`` draws them) try one event of each
    kind the generators make and move on with one accepted, and, in every state, try
    each refusal of
    ``rejections``, the late events of ``late_events``, cancels, restarts, fork edits
    and a user message. Deterministic: the same reducer gives the same report.
    ``extra``: steps observed elsewhere (``observe_step``), added before comparing.
    """
    reducer = _reducer(transition)
    seen: set[TableStep] = set(extra)
    for walk in range(walks):
        dice = _seeded_dice(f"table:{walk}".encode())
        # Half the walks offer tools that wait for a person (issue 35's cells).
        created = _created(dice, walk % 2 == 1, None, asking=walk % 4 >= 2)
        state, _ = start(created)
        for _ in range(steps):
            _probe_table(state, seen, reducer)
            if state.is_terminal:
                break
            makers = dict.fromkeys(_progress_makers(state) + _rare_makers(state, True))
            moved = [observe_step(state, make(dice, state), seen, reducer) for make in makers]
            accepted = [after for after in moved if after is not None]
            if not accepted:
                break
            state = dice.pick(accepted)
    return _compare_table(frozenset(seen))


def _seeded_dice(seed: bytes) -> _Dice:
    """Dice reading a stream of bytes made from ``seed`` (BLAKE2b in counter mode)."""
    counter = iter(range(1 << 62))

    def chunk(_: object) -> bytes:
        block = next(counter).to_bytes(8, "big")
        return hashlib.blake2b(seed + block, digest_size=16).digest()

    return _Dice(chunk)


def _compare_table(observed: frozenset[TableStep]) -> TableReport:
    def allows(phase: str, event: str, outcome: str) -> bool:
        cell = TABLE.get((phase, event))
        return cell is not None and (
            outcome in cell.targets or outcome in {e.__name__ for e in cell.refusals}
        )

    unlisted = tuple(sorted(step for step in observed if not allows(*step)))
    unreached = tuple(
        sorted(
            (phase, event, outcome)
            for (phase, event), cell in TABLE.items()
            for outcome in (*cell.targets, *(e.__name__ for e in cell.refusals))
            if (phase, event, outcome) not in observed
        )
    )
    return TableReport(observed, unlisted, unreached)


def check_table(transition: Reducer | None = None, **options: Any) -> TableReport:
    """Assert that ``table_report(transition, **options)`` agrees with the documented
    table both ways; return the report. A rule you add fails it naming each cell it
    changes: update ``fanfold/statemachine/table.py`` (DESIGN.md, "Adding a
    transition")."""
    report = table_report(transition, **options)
    if not report.agrees:
        raise AssertionError(f"invariant 'the transition table is the reducer's' broken:\n{report}")
    return report
