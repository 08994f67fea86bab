"""Execution modes of a ``spawn_agents`` call: parallel, sequential, race. Pure.

A call's mode travels in each of its children's ``ChildSpec.mode`` (None: parallel,
the only mode before issue 12), so it is in the state, in the log, and in the
fingerprint's per-child digests. The reducer asks this module three things:

- ``parse_mode``: the call's ``mode``/``quorum``/``keep_going`` arguments;
- ``may_start``: whether a queued child may start now (a sequential call runs one
  child at a time, in order);
- ``settle``: after a child got its outcome, what its call's mode makes of the
  others: a sequential call whose step failed finishes the steps not yet run as
  ``not_run`` (unless ``keep_going``); a race whose ``quorum`` of successes is
  reached finishes the rest as ``cancelled``: the queued ones at once, the running
  ones written off and told to cancel (their late outcomes are absorbed), so the
  parent never waits past its quorum.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import attrs

from fanfold.statemachine.children import (
    ChildFailed,
    Children,
    ChildSpec,
    ChildSucceeded,
    Mode,
    PendingChild,
    SpawnMode,
)
from fanfold.statemachine.errors import CancelReason, ErrorKind

MODE_KEYS = ("mode", "quorum", "keep_going")


def parse_mode(arguments: dict[str, object], tasks: int) -> SpawnMode | str | None:
    """The mode of a ``spawn_agents`` call with ``tasks`` tasks: None for parallel,
    or the error message for the call."""
    given = arguments.get("mode")
    mode = Mode.PARALLEL.value if given is None else given
    if mode not in {m.value for m in Mode}:
        return "'mode' must be one of parallel, sequential, race"
    quorum = arguments.get("quorum")
    keep_going = arguments.get("keep_going", False)
    if not isinstance(keep_going, bool):
        return "'keep_going' must be true or false"
    if quorum is not None:
        if isinstance(quorum, bool) or not isinstance(quorum, int) or quorum < 1:
            return "'quorum' must be an integer >= 1"
        if given is None:
            mode = Mode.RACE.value  # a quorum alone is a race
        elif mode != Mode.RACE.value:
            # An explicit "parallel" (or "sequential") with a quorum asks for two
            # things at once: refused, rather than silently run as a race.
            return "'quorum' goes with mode race"
        if quorum > tasks:
            return f"'quorum' {quorum} is more than the {tasks} task(s) of the call"
    if keep_going and mode != Mode.SEQUENTIAL.value:
        return "'keep_going' goes with mode sequential"
    if mode == Mode.PARALLEL.value:
        return None
    return SpawnMode(Mode(mode), quorum or 1, keep_going)


def may_start(child: PendingChild, pending: Iterable[PendingChild]) -> bool:
    """Whether queued ``child`` may start: a sequential call's child waits while an
    earlier child of its call is pending (running or queued before it)."""
    mode = child.spec.mode
    if mode is None or mode.mode is not Mode.SEQUENTIAL:
        return True
    call = child.spec.spawn_call_id
    for other in pending:
        if other is child:
            return True
        if other.spec.spawn_call_id == call:
            return False
    return True


def task_with_earlier(spec: ChildSpec, children: Children | None) -> str:
    """A sequential step's task, followed by the outcomes of the earlier steps of its
    call (all finished before it started, so the text is the same when re-issued)."""
    if spec.mode is None or spec.mode.mode is not Mode.SEQUENTIAL or children is None:
        return spec.task
    earlier = [
        f
        for f in children.finished
        if f.spec.spawn_call_id == spec.spawn_call_id and _number(f.spec.id) < _number(spec.id)
    ]
    if not earlier:
        return spec.task
    steps = []
    for done in sorted(earlier, key=lambda f: _number(f.spec.id)):
        match done.outcome:
            case ChildSucceeded(result=result):
                steps.append({"task": done.spec.task, "status": "completed", "result": result})
            case ChildFailed(error=error, kind=kind):
                steps.append(
                    {"task": done.spec.task, "status": "failed", "error": error, "kind": kind}
                )
    return (
        spec.task
        + "\n\nThe earlier steps of this sequence and their outcomes:\n"
        + json.dumps(steps, ensure_ascii=False, indent=1)
    )


def _number(child_id: str) -> int:
    return int(child_id[child_id.rfind(".") + 1 :])


@attrs.frozen
class Settled:
    """What ``settle`` decided: the children now, the running ones to cancel (written
    off), and the tokens to charge for them (their whole shares)."""

    children: Children
    cancel: tuple[str, ...] = ()
    deadline_timers: tuple[int, ...] = ()
    charged: int = 0


def settle(children: Children) -> Settled:
    """Apply the mode of the call whose child finished last (``finished[-1]``)."""
    if not children.finished:
        return Settled(children)
    last = children.finished[-1]
    mode = last.spec.mode
    if mode is None:
        return Settled(children)
    call = last.spec.spawn_call_id
    siblings = [p for p in children.pending if p.spec.spawn_call_id == call]
    if not siblings:
        return Settled(children)
    if mode.mode is Mode.SEQUENTIAL:
        if isinstance(last.outcome, ChildSucceeded) or mode.keep_going:
            return Settled(children)
        for pending in siblings:
            children = children.finish(
                pending.spec.id,
                ChildFailed(
                    f"not run: the earlier step {last.spec.id} failed",
                    ErrorKind.NOT_RUN,
                    CancelReason.PARENT,
                ),
            )
        return Settled(children)
    succeeded = sum(
        1
        for f in children.finished
        if f.spec.spawn_call_id == call and isinstance(f.outcome, ChildSucceeded)
    )
    if succeeded < mode.quorum:
        return Settled(children)
    cancel: list[str] = []
    timers: list[int] = []
    charged = 0
    for pending in siblings:
        if pending.started:
            cancel.append(pending.spec.id)
            charged += pending.budget or 0
            if pending.deadline_timer is not None:
                timers.append(pending.deadline_timer)
        children = children.finish(
            pending.spec.id,
            ChildFailed(
                f"cancelled: the quorum of {mode.quorum} successful sub-agent(s) was reached",
                ErrorKind.CANCELLED,
                CancelReason.PARENT,
            ),
        )
    return Settled(children, tuple(cancel), tuple(timers), charged)
