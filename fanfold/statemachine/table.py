"""The transition table: every phase x every event, as data.

``transition`` is the implementation; this table is its specification, checked both
ways by ``fanfold.testing.table_report`` (for fanfold's reducer or a user's rule; run
for fanfold's by tests/test_transition_table.py):

- every step the reducer takes lands in its cell: an accepted event leads to one of the
  cell's ``targets``, a refused one raises one of the cell's ``refusals`` (exact type);
- every target and every refusal a cell lists is reached by some example, so the
  table lists nothing the reducer cannot do.

The same data renders the table and the diagram in DESIGN.md
(``python -m fanfold.statemachine.table DESIGN.md``).
"""

from __future__ import annotations

import sys

import attrs

from fanfold.statemachine.errors import (
    DuplicateChildOutcome,
    IllegalTransition,
    UnknownCall,
    UnknownChild,
)
from fanfold.statemachine.events import ALL_EVENTS
from fanfold.statemachine.phases import ALL_PHASES


@attrs.frozen
class Cell:
    """What one event does in one phase.

    ``targets``: the phases it may lead to when accepted (empty: always refused);
    ``refusals``: the exceptions it may raise (exact types of the IllegalTransition
    family; empty: always accepted); ``rule``: the rule in words, for readers.
    """

    targets: frozenset[str]
    refusals: frozenset[type[IllegalTransition]]
    rule: str


def _cell(targets: str, rule: str, *refusals: type[IllegalTransition]) -> Cell:
    return Cell(frozenset(targets.split()), frozenset(refusals), rule)


STALE = "stale number: absorb; never issued: raise UnknownCall"
WRITTEN_OFF = "written-off child: absorb; else raise UnknownChild"

_BUSY_USER = _cell("", "raise (busy; sub-agents take no user messages)", IllegalTransition)
# A child outcome where a round's children are tracked: besides unknown children, a
# second outcome and the outcome of a child still queued are refused.
_CHILD_REFUSALS = (UnknownChild, DuplicateChildOutcome, IllegalTransition)


def _stale(phase: str) -> Cell:
    return _cell(phase, STALE, UnknownCall)


def _written_off(phase: str) -> Cell:
    return _cell(phase, WRITTEN_OFF, UnknownChild)


TABLE: dict[tuple[str, str], Cell] = {}

# A root's time limit is per turn (a delegated tree's agent definition sets it).
_ROOT_TIMEOUT = "Error timed_out when the turn's own time limit ran out"


def _row(phase: str, **cells: Cell) -> None:
    for event, cell in cells.items():
        TABLE[(phase, event)] = cell
    TABLE[(phase, "ConversationCreated")] = _cell("", "raise (already exists)", IllegalTransition)
    TABLE[(phase, "ConversationForked")] = _cell("", "raise (already exists)", IllegalTransition)


_row(
    "Idle",
    UserMessaged=_cell(
        "LlmRequesting",
        "append message, CallModel (root only); a root with a time limit: StartTimer for the turn",
    ),
    ModelReplied=_stale("Idle"),
    ModelFailed=_stale("Idle"),
    ToolFinished=_stale("Idle"),
    SubAgentFinished=_written_off("Idle"),
    TimerFired=_stale("Idle"),
    CancelRequested=_cell("Idle", "absorb: nothing runs"),
    RuntimeResumed=_cell("Idle", "absorb: nothing was in flight"),
)
_row(
    "LlmRequesting",
    UserMessaged=_BUSY_USER,
    ModelReplied=_cell(
        "Idle Completed ToolExecuting AwaitingSubAgents LlmRequesting CancellingSubAgents "
        "Failed Error",
        "current call: text only ends the turn (root Idle, sub-agent Completed; cut off "
        "at max_tokens: kept, marked truncated); refusal: Failed/Error refused with its "
        "explanation, nothing run; tool calls run in order (control tools inline; an "
        "ordinary one: RunTool with how it runs, from the rules: confined, and a file "
        "tool's path_rules for the runtime's link check; one that must wait for a "
        "person, an ask rule's, a needs_approval tool's or ask_user: RequestApproval or "
        "AskUser, ToolExecuting waiting); grace "
        "round: submit or Failed/Error iteration_limit; token budget: Failed/Error "
        "budget_exhausted. " + STALE,
        UnknownCall,
    ),
    ModelFailed=_cell(
        "AwaitingRetry Error Failed LlmRequesting",
        "current call: its billed tokens count (budget reached: Failed/Error budget_exhausted); "
        "retryable with attempts left -> ScheduleRetry; else root Error, "
        "sub-agent Failed + NotifyParent. " + STALE,
        UnknownCall,
    ),
    ToolFinished=_stale("LlmRequesting"),
    SubAgentFinished=_written_off("LlmRequesting"),
    TimerFired=_cell(
        "LlmRequesting Failed Error",
        "own time limit: as CancelRequested(timeout); " + STALE,
        UnknownCall,
    ),
    CancelRequested=_cell(
        "Idle Failed Error", "AbortCall; root Idle (" + _ROOT_TIMEOUT + "), sub-agent Failed"
    ),
    RuntimeResumed=_cell("LlmRequesting", "re-issue CallModel (same call number)"),
)
_row(
    "AwaitingRetry",
    UserMessaged=_BUSY_USER,
    ModelReplied=_stale("AwaitingRetry"),
    ModelFailed=_stale("AwaitingRetry"),
    ToolFinished=_stale("AwaitingRetry"),
    SubAgentFinished=_written_off("AwaitingRetry"),
    TimerFired=_cell(
        "LlmRequesting Failed Error AwaitingRetry",
        "retry timer: CallModel attempt n+1; own time limit: Failed (a root: Error "
        "timed_out); " + STALE,
        UnknownCall,
    ),
    CancelRequested=_cell(
        "Idle Failed Error",
        "AbortCall(timer); root Idle (" + _ROOT_TIMEOUT + "), sub-agent Failed",
    ),
    RuntimeResumed=_cell("AwaitingRetry", "re-issue ScheduleRetry"),
)
_TOOL_TARGETS = "ToolExecuting AwaitingSubAgents LlmRequesting CancellingSubAgents Completed Failed"
_row(
    "ToolExecuting",
    UserMessaged=_BUSY_USER,
    ModelReplied=_stale("ToolExecuting"),
    ModelFailed=_stale("ToolExecuting"),
    ToolFinished=_cell(
        _TOOL_TARGETS,
        "current call: record result, run next tool (one that must wait for a person: "
        "RequestApproval or AskUser instead of RunTool, and stay); all done: wait for "
        "children or flush results and CallModel; submit_*: end (cancelling children "
        "first). Wrong tool_call_id, or the call waits for a decision: raise. " + STALE,
        UnknownCall,
        IllegalTransition,
    ),
    SubAgentFinished=_cell(
        "ToolExecuting",
        "running child: record outcome, charge its tokens, start queued children "
        "(none left of the token budget: they end budget_exhausted unstarted); "
        "duplicate: raise DuplicateChildOutcome; queued or unknown: raise; "
        "written-off: absorb",
        *_CHILD_REFUSALS,
    ),
    TimerFired=_cell(
        _TOOL_TARGETS + " Error",
        "child deadline: write child off (timed_out) + CancelSubAgents; own time limit: "
        "cancel; approval timeout of the waiting call: as ApprovalDenied ('no decision "
        "within N s'); " + STALE,
        UnknownCall,
    ),
    CancelRequested=_cell(
        "CancellingSubAgents Idle Failed Error",
        "AbortCall (a call waiting for a decision: its request ends, its timeout "
        "aborted, result 'cancelled ... it never ran'); 'cancelled'/'skipped' results; "
        "queued children finish cancelled; "
        "running children get CancelSubAgents and a grace timer; a root ends Idle ("
        + _ROOT_TIMEOUT
        + ")",
    ),
    RuntimeResumed=_cell(
        _TOOL_TARGETS,
        "a call waiting for a decision: RequestApproval/AskUser again (same call: the "
        "same request) and its timeout, nothing run; else the tool gets an 'interrupted' "
        "error result (forked: a 'not run in this fork' "
        "one; never run twice) unless it is one "
        "of the event's idempotent_tools (RunTool again, same call and decisions); "
        "continue as "
        "ToolFinished; re-issue SpawnSubAgent/deadlines of running children",
    ),
)
_row(
    "AwaitingSubAgents",
    UserMessaged=_BUSY_USER,
    # The one model call made while children run: the summary their children of
    # context mode summary start with (DESIGN.md "Context modes").
    ModelReplied=_cell(
        "AwaitingSubAgents LlmRequesting",
        "summary call: its tokens count (no round); a text starts the children waiting "
        "for it; refusal or no text: they end failed, never started; last one: fan-in, "
        "CallModel. " + STALE,
        UnknownCall,
    ),
    ModelFailed=_cell(
        "AwaitingSubAgents LlmRequesting",
        "summary call: its billed tokens count; retryable with attempts left (and "
        "budget) -> ScheduleRetry; else the children waiting for it end failed with its "
        "kind (budget_exhausted once the budget is spent); last "
        "one: fan-in, CallModel. " + STALE,
        UnknownCall,
    ),
    ToolFinished=_stale("AwaitingSubAgents"),
    SubAgentFinished=_cell(
        "AwaitingSubAgents LlmRequesting",
        "record outcome, charge its tokens, start queued (each on a share of the "
        "token budget); last one: fan-in result per spawn_agents call, CallModel "
        "(a summary call still in flight aborted); duplicate/unknown/queued: raise; "
        "written-off: absorb",
        *_CHILD_REFUSALS,
    ),
    TimerFired=_cell(
        "AwaitingSubAgents LlmRequesting CancellingSubAgents Failed Error",
        "child deadline: write child off; summary retry timer: CallModel of its next "
        "attempt (with no budget left: the waiting children end failed); own time "
        "limit: cancel (as CancelRequested: with no child running, it ends at once); " + STALE,
        UnknownCall,
    ),
    # Children waiting for a summary have not started: with nothing running (only
    # such children, or none left running), a cancel ends at once.
    CancelRequested=_cell(
        "CancellingSubAgents Idle Failed Error",
        "AbortCall(summary call), queued children finish cancelled; CancelSubAgents"
        "(running) + grace timer, or end at once when none runs (a root: Idle, "
        + _ROOT_TIMEOUT
        + ")",
    ),
    RuntimeResumed=_cell(
        "AwaitingSubAgents",
        "re-issue SpawnSubAgent (idempotent), deadlines, the summary's CallModel or ScheduleRetry",
    ),
)
_row(
    "CancellingSubAgents",
    UserMessaged=_BUSY_USER,
    ModelReplied=_stale("CancellingSubAgents"),
    ModelFailed=_stale("CancellingSubAgents"),
    ToolFinished=_stale("CancellingSubAgents"),
    SubAgentFinished=_cell(
        "CancellingSubAgents Idle Completed Failed Error",
        "record outcome (a natural finish counts); last one: flush results, end "
        "(root Idle, or Error timed_out past its turn's time limit; sub-agent Completed "
        "after submit, else Failed); "
        "duplicate/unknown: raise; written-off: absorb",
        UnknownChild,
        DuplicateChildOutcome,
    ),
    TimerFired=_cell(
        "CancellingSubAgents Idle Completed Failed Error",
        "grace timer: silent children written off as unresponsive, end; own time "
        "limit: absorb; " + STALE,
        UnknownCall,
    ),
    CancelRequested=_cell("CancellingSubAgents", "absorb: already cancelling"),
    RuntimeResumed=_cell("CancellingSubAgents", "re-issue CancelSubAgents and grace timer"),
)
_row(
    "Error",
    UserMessaged=_cell("LlmRequesting", "a new user message starts a fresh turn"),
    ModelReplied=_stale("Error"),
    ModelFailed=_stale("Error"),
    ToolFinished=_stale("Error"),
    SubAgentFinished=_written_off("Error"),
    TimerFired=_stale("Error"),
    CancelRequested=_cell("Error", "absorb: nothing runs"),
    RuntimeResumed=_cell("Error", "absorb: nothing was in flight"),
)
for _terminal in ("Completed", "Failed"):
    _row(
        _terminal,
        UserMessaged=_cell("", "raise: the conversation has ended", IllegalTransition),
        ModelReplied=_stale(_terminal),
        ModelFailed=_stale(_terminal),
        ToolFinished=_stale(_terminal),
        SubAgentFinished=_cell(
            _terminal, "written-off child: absorb; else raise (ended)", IllegalTransition
        ),
        TimerFired=_stale(_terminal),
        CancelRequested=_cell(_terminal, "absorb, no effects"),
        RuntimeResumed=_cell(_terminal, "absorb, no effects"),
    )

# ForkEdited (issue 24): a forked conversation goes on with the user's edit in place of
# what was in flight: what RuntimeResumed re-issues, and the edit, in one step.
_PROMPT = (
    "SystemPromptEdit: the new prompt, then as RuntimeResumed; LimitsEdit: the new "
    "limits if they admit it as it is (rounds taken, attempt in flight, a spawning "
    "round's limits, running and queued children), then as RuntimeResumed, else raise"
)
_EDIT_ELSEWHERE = "other edits: raise"
_FORK_EDITS = {
    "Idle": _cell("Idle", f"{_PROMPT} (nothing in flight); {_EDIT_ELSEWHERE}", IllegalTransition),
    "Error": _cell("Error", f"{_PROMPT} (nothing in flight); {_EDIT_ELSEWHERE}", IllegalTransition),
    "LlmRequesting": _cell(
        "Idle Completed ToolExecuting AwaitingSubAgents LlmRequesting CancellingSubAgents "
        "Failed Error",
        "ReplyEdit: as ModelReplied of the current call (its tools run live), after the "
        "own time limit re-armed; TaskEdit (a sub-agent before its first reply): the task "
        f"message replaced, CallModel re-issued; {_PROMPT}; {_EDIT_ELSEWHERE}",
        IllegalTransition,
    ),
    "AwaitingRetry": _cell(
        "AwaitingRetry",
        f"TaskEdit (a sub-agent before its first reply) or {_PROMPT}; {_EDIT_ELSEWHERE}",
        IllegalTransition,
    ),
    "ToolExecuting": _cell(
        _TOOL_TARGETS,
        "ToolResultEdit of the running call: as ToolFinished, after what RuntimeResumed "
        f"re-issues of the round's children; wrong call id: raise; DecisionEdit of the "
        "open request: as that decision (ApprovalGranted/ApprovalDenied/UserAnswered) "
        f"after the same; {_PROMPT} (the running "
        f"tool gets the 'not run in this fork' result); {_EDIT_ELSEWHERE}",
        IllegalTransition,
    ),
    "AwaitingSubAgents": _cell(
        "AwaitingSubAgents", f"{_PROMPT}; {_EDIT_ELSEWHERE}", IllegalTransition
    ),
    "CancellingSubAgents": _cell(
        "CancellingSubAgents", f"{_PROMPT}; {_EDIT_ELSEWHERE}", IllegalTransition
    ),
    "Completed": _cell("", "raise: the conversation has ended", IllegalTransition),
    "Failed": _cell("", "raise: the conversation has ended", IllegalTransition),
}
for _phase, _edit_cell in _FORK_EDITS.items():
    TABLE[(_phase, "ForkEdited")] = _edit_cell

# ToolsChanged (issue 33, item 8): an MCP server's new tool list, in any phase.
for _phase_class in ALL_PHASES:
    _name = _phase_class.__name__
    if _name in ("Completed", "Failed"):
        TABLE[(_name, "ToolsChanged")] = _cell(_name, "absorb, no effects")
    else:
        TABLE[(_name, "ToolsChanged")] = _cell(
            _name,
            "replace the server's tools by the new ones its rules leave (from the next "
            "model call on); no effects",
        )

# A person's decisions (issue 35): only a ToolExecuting whose current call waits for
# one (``ToolExecuting.asking``) takes them; everywhere else there is no open request.
_DECISION_RULES = {
    "ApprovalGranted": (
        "the waiting call: edited arguments checked (not a JSON object, a required key "
        "missing, a property of the wrong type: raise), then the rules again (refused: "
        "its error result, the round goes on), else RunTool under the request's number; "
        "a question, or no open request: raise; never issued: raise UnknownCall"
    ),
    "ApprovalDenied": (
        "the waiting call (or question): its result is 'denied by the user: reason', "
        "the round goes on as after ToolFinished; no open request: raise; never issued: "
        "raise UnknownCall"
    ),
    "UserAnswered": (
        "the waiting ask_user question: the answer is its result, the round goes on as "
        "after ToolFinished; an approval request, or no open request: raise; never "
        "issued: raise UnknownCall"
    ),
}
for _phase_class in ALL_PHASES:
    _name = _phase_class.__name__
    for _event, _rule in _DECISION_RULES.items():
        if _name == "ToolExecuting":
            TABLE[(_name, _event)] = _cell(_TOOL_TARGETS, _rule, UnknownCall, IllegalTransition)
        elif _name in ("Completed", "Failed"):
            TABLE[(_name, _event)] = _cell(
                "", "raise: the conversation has ended", IllegalTransition
            )
        else:
            TABLE[(_name, _event)] = _cell(
                "",
                "raise: no open request (never issued: UnknownCall)",
                UnknownCall,
                IllegalTransition,
            )

START_TARGETS = frozenset({"Idle", "LlmRequesting", "Failed"})

PHASE_NAMES = tuple(p.__name__ for p in ALL_PHASES)
EVENT_NAMES = tuple(e.__name__ for e in ALL_EVENTS)


def markdown_table() -> str:
    """The table as Markdown: one row per phase, one column per event."""
    events = [e for e in EVENT_NAMES if e not in ("ConversationCreated", "ConversationForked")]
    lines = ["| phase \\ event | " + " | ".join(events) + " |"]
    lines.append("|---" * (len(events) + 1) + "|")
    for phase in PHASE_NAMES:
        cells = []
        for event in events:
            cell = TABLE[(phase, event)]
            target = ", ".join(sorted(cell.targets)) or "—"
            refused = ", ".join(sorted(e.__name__ for e in cell.refusals))
            cells.append(
                f"**→ {target}**<br>{cell.rule}" + (f"<br>*raises {refused}*" if refused else "")
            )
        lines.append(f"| **{phase}** | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "`start(ConversationCreated)`: root → Idle; sub-agent → LlmRequesting (CallModel, "
        "plus StartTimer for its time limit), or → Failed `invalid_cwd` + NotifyParent "
        "when the runtime found its working directory (links followed) outside its "
        "parent's or the project, or no directory. `start(ConversationForked)`: a root at "
        "rest → the source's state under the new id (an `edit` raises: its edit is a "
        "ForkEdited at seq 1); any other state (a sub-agent, work in flight: its tree "
        "forked with it) → that state as it is, no effects, if it is already under the "
        "fork's ids (its id the fork's, its root id matching its place) and its `edit`, if "
        "any, is a ForkEdited the state admits, else raise; RuntimeResumed (or, for an "
        "`edit`, that ForkEdited) then re-issues its work. Either event in any phase: raise."
    )
    return "\n".join(lines)


def mermaid_diagram() -> str:
    """A mermaid stateDiagram-v2 of every phase change in the table (absorbs omitted)."""
    edges: dict[tuple[str, str], list[str]] = {}
    for (phase, event), cell in TABLE.items():
        for target in cell.targets:
            if target != phase:
                edges.setdefault((phase, target), []).append(event)
    lines = ["stateDiagram-v2"]
    lines.append("    [*] --> Idle: start (root)")
    lines.append("    [*] --> LlmRequesting: start (sub-agent)")
    lines.append("    [*] --> Failed: start (sub-agent, invalid cwd)")
    for (source, target), events in sorted(edges.items()):
        lines.append(f"    {source} --> {target}: {', '.join(sorted(set(events)))}")
    lines.append("    Completed --> [*]")
    lines.append("    Failed --> [*]")
    return "\n".join(lines)


BEGIN = "<!-- BEGIN GENERATED: python -m fanfold.statemachine.table DESIGN.md -->"
END = "<!-- END GENERATED -->"


def generated_section() -> str:
    return (
        f"{BEGIN}\n\n### Transition table\n\n{markdown_table()}\n\n### Diagram\n\n"
        f"```mermaid\n{mermaid_diagram()}\n```\n\n{END}"
    )


def update(text: str) -> str:
    """``text`` with its generated section replaced by the current one."""
    head, found, rest = text.partition(BEGIN)
    if not found:
        raise ValueError("no generated section markers found")
    _, found, tail = rest.partition(END)
    if not found:
        raise ValueError("generated section has no end marker")
    return head + generated_section() + tail


if __name__ == "__main__":  # pragma: no cover - a maintenance script
    # File access happens only when run as a script, never on import.
    path = sys.argv[1]
    with open(path, encoding="utf-8") as handle:
        current = handle.read()
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(update(current))
