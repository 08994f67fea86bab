"""Bookkeeping of the sub-agents one tool round spawned, and the fan-in result."""

from __future__ import annotations

import enum

import attrs

from fanfold.statemachine.errors import CancelReason, ErrorKind
from fanfold.statemachine.messages import ToolResult, canonical_json

# ``since``: the log schema version that added a field; older documents decode with
# the field's default (see fanfold.db.codec).
_SINCE_2 = {"since": 2}
# Written only when False: outcomes that existed before encode as they did.
_SINCE_5_OMITTED_AT_DEFAULT = {"since": 5, "omitted_at_default": True}
# Written only when True, likewise.
_SINCE_6_OMITTED_AT_DEFAULT = {"since": 6, "omitted_at_default": True}
# The summary of context mode "summary" (schema 7), written only when there is one.
_SINCE_7_OMITTED_AT_DEFAULT = {"since": 7, "omitted_at_default": True}


@attrs.frozen
class ChildSucceeded:
    """A sub-agent finished its task. ``tokens``: what it and its own sub-agents used.

    ``submitted`` is False when it never called ``submit_result`` and its final plain
    text (possibly empty) stands as the result: a chat model that ignores tools.
    ``truncated``: that final text was cut off at the output token limit.
    """

    result: str
    tokens: int = attrs.field(default=0, metadata=_SINCE_2)
    submitted: bool = attrs.field(default=True, metadata=_SINCE_5_OMITTED_AT_DEFAULT)
    truncated: bool = attrs.field(default=False, metadata=_SINCE_6_OMITTED_AT_DEFAULT)


@attrs.frozen
class ChildFailed:
    """A sub-agent ended without a result. ``reason`` is set when it was cancelled.
    ``tokens``: what it and its own sub-agents used."""

    error: str
    kind: ErrorKind
    reason: CancelReason | None = None
    tokens: int = attrs.field(default=0, metadata=_SINCE_2)


ChildOutcome = ChildSucceeded | ChildFailed


class Mode(enum.StrEnum):
    """How the children of one ``spawn_agents`` call run."""

    PARALLEL = "parallel"
    SEQUENTIAL = "sequential"
    RACE = "race"


@attrs.frozen
class SpawnMode:
    """The execution mode of one ``spawn_agents`` call (absent: parallel).

    - ``sequential``: one child at a time, in order; each later task is given the
      outcomes of the earlier ones; a failure stops the rest (``not_run``) unless
      ``keep_going``.
    - ``race``: the parent stops waiting once ``quorum`` children have succeeded; the
      others are cancelled (written off, recorded ``cancelled``).
    """

    mode: Mode
    quorum: int = 1
    keep_going: bool = False


@attrs.frozen
class ChildSpec:
    """What a parent asked of one child, fixed when the ``spawn_agents`` call is read."""

    id: str
    task: str
    cwd: str
    timeout: float | None
    max_rounds: int
    spawn_call_id: str
    model: str | None = None
    # The agent definition the task named (issue 12; written only when set).
    agent: str | None = attrs.field(default=None, metadata={"since": 6, "omitted_at_default": True})
    # Its context mode when not task_only ("full" or "summary"; issue 12, written only
    # when set; "summary" since schema 7).
    context: str | None = attrs.field(
        default=None, metadata={"since": 6, "omitted_at_default": True}
    )
    # The mode of its spawn_agents call (None: parallel; issue 12, written only when set).
    mode: SpawnMode | None = attrs.field(
        default=None, metadata={"since": 6, "omitted_at_default": True}
    )


@attrs.frozen
class PendingChild:
    """A child without an outcome yet: ``started`` once its SpawnSubAgent was emitted.

    ``deadline_timer`` is the parent's backstop timer for a child with a time limit.
    ``budget``: the tokens set aside for a started child out of a parent's token
    budget (its own ``max_tokens``); None when the parent has no budget.
    """

    spec: ChildSpec
    started: bool = False
    deadline_timer: int | None = None
    budget: int | None = attrs.field(default=None, metadata=_SINCE_2)


@attrs.frozen
class FinishedChild:
    spec: ChildSpec
    outcome: ChildOutcome


@attrs.frozen
class RejectedTask:
    """A task of a ``spawn_agents`` call that was refused (over the per-call limit...)."""

    spawn_call_id: str
    task: str
    error: str


@attrs.frozen
class Summary:
    """The summary of a parent's conversation that its children of context mode
    ``summary`` start with: one model call of the parent per tool round, shared by
    every such child of the round (the parent's history does not change during a
    round, so neither would the summary).

    Exactly one of these is set: ``call``, the model call in flight; ``timer``, the
    retry timer before attempt ``attempt`` (``delay`` its backoff, re-issued as is
    after a restart); ``text``, the summary made; ``error``, why none could be made
    (``kind``: its typed kind, which the children waiting for it fail with; while a
    retry waits, the kind of the failure it follows).
    ``attempt``: the attempt of ``call``, or the one ``timer`` starts.
    """

    call: int | None = None
    attempt: int = 1
    timer: int | None = None
    delay: float | None = None
    text: str | None = None
    error: str | None = None
    kind: ErrorKind | None = None

    @property
    def in_flight(self) -> int | None:
        """The number of the model call or retry timer awaited, if any."""
        return self.call if self.call is not None else self.timer


@attrs.frozen
class Children:
    """The children of one tool round. ``pending`` + ``finished`` is every accepted child.

    ``summary``: the summary their children of context mode ``summary`` start with,
    once one of them waits for it (None before that, and in rounds without one).
    """

    pending: tuple[PendingChild, ...] = ()
    finished: tuple[FinishedChild, ...] = ()
    rejected: tuple[RejectedTask, ...] = ()
    summary: Summary | None = attrs.field(default=None, metadata=_SINCE_7_OMITTED_AT_DEFAULT)

    @property
    def running(self) -> int:
        return sum(1 for p in self.pending if p.started)

    @property
    def total(self) -> int:
        return len(self.pending) + len(self.finished)

    @property
    def reserved(self) -> int:
        """Tokens set aside for the children running now (see PendingChild.budget)."""
        return sum(p.budget for p in self.pending if p.budget is not None)

    def pending_ids(self) -> tuple[str, ...]:
        return tuple(p.spec.id for p in self.pending)

    def _index(self, child_id: str) -> int:
        pending = self.pending
        if len(pending) > _SCAN_LIMIT:
            # The reducer keeps pending children in spawn order, and a child's id ends
            # in its spawn number: binary search, checked, instead of a long scan.
            index = _bisect(pending, child_id)
            if index >= 0:
                return index
        for index, child in enumerate(pending):
            if child.spec.id == child_id:
                return index
        return -1

    def index_of(self, child_id: str) -> int:
        """The position of pending child ``child_id`` in ``pending``, or -1."""
        return self._index(child_id)

    def find_pending(self, child_id: str) -> PendingChild | None:
        index = self._index(child_id)
        return self.pending[index] if index >= 0 else None

    def is_finished(self, child_id: str) -> bool:
        return any(f.spec.id == child_id for f in self.finished)

    def finish(self, child_id: str, outcome: ChildOutcome) -> Children:
        """Move one pending child to finished. The caller checked it is pending."""
        index = self._index(child_id)
        assert index >= 0
        return self.finish_at(index, outcome)

    def finish_at(self, index: int, outcome: ChildOutcome) -> Children:
        """Move the pending child at ``index`` (from ``index_of``) to finished."""
        # A parent with a thousand children receives a thousand outcomes: the child is
        # found once by a binary search (see _index) and the tuples are concatenated
        # in C (no unpacking into a new tuple item by item).
        pending = self.pending
        return Children(
            pending[:index] + pending[index + 1 :],
            self.finished + (FinishedChild(pending[index].spec, outcome),),  # noqa: RUF005
            self.rejected,
            self.summary,
        )


_SCAN_LIMIT = 16  # pending children up to which a plain scan is as fast as a search


def _spawn_number(child_id: str) -> int:
    """The n of a child id ``"<parent>.<n>"``; -1 if it has none."""
    tail = child_id[child_id.rfind(".") + 1 :]
    return int(tail) if tail.isascii() and tail.isdigit() else -1


def spawn_order(child_id: str) -> tuple[int, str]:
    """A sort key putting sub-agents in the order their parent spawned them
    (``root.2`` before ``root.10``); an id that is not ``"<parent>.<n>"`` sorts first."""
    number = _spawn_number(child_id)
    return (number, child_id[: child_id.rfind(".")]) if number >= 0 else (0, child_id)


def _bisect(pending: tuple[PendingChild, ...], child_id: str) -> int:
    """The index of ``child_id`` in ``pending`` found by its spawn number, or -1.

    Only a hit is trusted: the entry must carry the id, and the entry before it a
    smaller spawn number (so it is the first with that id when the ids are in spawn
    order, as the reducer keeps them). Anything else is left to the plain scan.
    """
    number = _spawn_number(child_id)
    if number < 0:
        return -1
    lo, hi = 0, len(pending)
    while lo < hi:
        mid = (lo + hi) // 2
        if _spawn_number(pending[mid].spec.id) < number:
            lo = mid + 1
        else:
            hi = mid
    if lo == len(pending) or pending[lo].spec.id != child_id:
        return -1
    if lo > 0 and _spawn_number(pending[lo - 1].spec.id) >= number:
        return -1
    return lo


def _cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"... [truncated {len(text) - limit} characters]"


def fan_in_result(spawn_call_id: str, children: Children, result_cap: int) -> ToolResult:
    """The one aggregated tool result the model sees for a ``spawn_agents`` call.

    Children appear in the order they were requested; every child has a status and
    either a result or an error, each capped at ``result_cap`` characters. A child that
    ended with plain text instead of calling ``submit_result`` has the status
    ``completed_without_submit``: its text is its result, but it never said it was done;
    ``completed_truncated`` if that text was cut off at the output token limit.
    """
    entries: list[dict[str, str]] = []
    ok = 0
    for fin in children.finished:
        if fin.spec.spawn_call_id != spawn_call_id:
            continue
        entry = {"agent_id": fin.spec.id, "task": _cap(fin.spec.task, result_cap)}
        match fin.outcome:
            case ChildSucceeded(result=result, submitted=submitted, truncated=truncated):
                ok += 1
                status = "completed" if submitted else "completed_without_submit"
                if truncated:
                    status = "completed_truncated"
                entry.update(status=status, result=_cap(result, result_cap))
            case ChildFailed(error=error, kind=kind):
                entry.update(status="failed", error=_cap(error, result_cap), error_kind=kind)
        entries.append(entry)
    entries.sort(key=lambda e: spawn_order(e["agent_id"]))
    rejected = [
        {"task": _cap(r.task, result_cap), "status": "rejected", "error": r.error}
        for r in children.rejected
        if r.spawn_call_id == spawn_call_id
    ]
    payload: dict[str, object] = {"sub_agent_results": entries}
    if rejected:
        payload["rejected_tasks"] = rejected
    return ToolResult(
        tool_call_id=spawn_call_id,
        name="spawn_agents",
        content=canonical_json(payload),
        # The call as a whole is an error only when nothing it asked for succeeded.
        is_error=ok == 0,
    )
