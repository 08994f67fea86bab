"""Resume planning from the log: which unfinished trees a runtime may continue, and
what it reads of the store to rebuild them (timers, pending fork edits, placed
units). Reads the store only: ``Runtime.resume`` launches what this plans."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from fanfold.db import ConversationRow, LogUnavailable, Store
from fanfold.db.provenance import UserKey, refusal
from fanfold.runtime.results import ResumePlan, SkippedTree
from fanfold.statemachine import ConversationForked, ForkEdited

# SQLite result codes of a failing environment rather than a damaged log: they stop
# ``resume`` instead of skipping a tree (busy, locked, I/O error, disk full, read-only).
_ENVIRONMENT_CODES = frozenset({5, 6, 8, 10, 13})


def environment_failure(exc: BaseException) -> bool:
    if isinstance(exc, LogUnavailable):
        return True  # a PostgreSQL log's server or connection, not the tree's log
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and (code & 0xFF) in _ENVIRONMENT_CODES


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def resume_plan(store: Store, key: UserKey) -> ResumePlan:
    """Which unfinished trees of ``store`` a runtime holding ``key`` may continue, and
    which it must skip, and why.

    A tree is continued only if its provenance mark verifies with this user's key:
    every other one (imported, copied from another user or machine, edited, or
    written before marks existed) is an inert record, since resuming it would run
    whatever its log says is in flight (a bash command, say) with no model involved.
    """
    roots: list[str] = []
    skipped: list[SkippedTree] = []
    for root_id in dict.fromkeys(row.root_id for row in store.unfinished()):
        reason = refusal(store.tree_record(root_id), key, store.instance_id, root_id)
        if reason is None:
            roots.append(root_id)
        else:
            skipped.append(SkippedTree(root_id, reason))
    return ResumePlan(tuple(roots), tuple(skipped))


def clock_set_back(store: Store, root_id: str, now: Callable[[], float]) -> float:
    """How far the runtime's clock (``now``) reads earlier than the latest time tree
    ``root_id``'s log holds (0: not earlier).

    A resumed timer that counts downtime (a time limit, a back-off) keeps what it
    ran before the restart: ``now - started``, ``started`` being the ``at`` of the
    step that first started it. A wall clock set back while the tree was down makes
    that negative, and the limit would start over (issue 32.12). Downtime is never
    negative: a clock that reads earlier than the log's latest step is taken as
    reading that step's time, so the timer keeps what the log shows it ran, and the
    downtime counts as none. A clock set forward cannot be told from real downtime
    (the log holds no clock of its own): it counts as downtime. See DESIGN.md, "The
    runtime", on restarts and time limits."""
    latest = max((row.updated_at for row in store.tree(root_id)), default=0.0)
    return max(0.0, latest - now())


def timer_starts(store: Store, conversation_id: str, back: float) -> dict[int, float]:
    """``store.timer_starts``, moved ``back`` seconds earlier: the clock was set
    back that far (``clock_set_back``), so measured against it each timer has run
    what it ran until the log's latest step, and from now on what the clock says."""
    starts = store.timer_starts(conversation_id)
    if not back:
        return starts
    return {number: at - back for number, at in starts.items()}


def pending_edit(store: Store, row: ConversationRow) -> ForkEdited | None:
    """The edit a fork's conversation still at its seq 0 was written with (its
    ``ConversationForked``), to deliver in place of its RuntimeResumed."""
    if row.forked_from is None or row.last_seq != 0:
        return None
    (first,) = store.events(row.id, limit=1)
    event = first.event
    if isinstance(event, ConversationForked) and event.edit is not None:
        return ForkEdited(event.edit)
    return None


def units_of(
    store: Store, rows: Sequence[ConversationRow], placements: Mapping[str, str]
) -> dict[str, str]:
    """The chunk of each of ``rows`` that is a placed child or descends from one."""
    parents = {row.id: row.parent_id for row in rows}
    units: dict[str, str] = {}
    for row in rows:
        at: str | None = row.id
        while at is not None:
            if at in placements:
                units[row.id] = placements[at]
                break
            if at not in parents:  # an ancestor at rest: read its row once
                parents[at] = store.conversation(at).parent_id
            at = parents[at]
    return units
