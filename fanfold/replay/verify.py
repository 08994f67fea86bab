"""``verify``: check that today's reducer reproduces a stored log exactly."""

from __future__ import annotations

import attrs

from fanfold.db import RawLog, Store
from fanfold.db.fingerprint import texts_kept
from fanfold.replay.core import replay_log, replay_quickly, subtree_logs
from fanfold.replay.report import (
    ConversationResult,
    Divergence,
    Finding,
    FindingKind,
    ReplayStep,
    VerifyReport,
)
from fanfold.statemachine import Conversation


def verify(store: Store, conversation_id: str, *, tree: bool = False) -> VerifyReport:
    """Replay a conversation's log (with ``tree``, also every descendant's) through
    today's ``start``/``transition`` and compare every step with the record.

    Per conversation, replay stops at the first step whose recomputed effects, state
    fingerprint or (where a snapshot was taken) full state differ from the record (a
    ``Divergence``), or at the first problem in the log itself (a ``Finding``: gap,
    truncation, undecodable payload, an event the reducer refuses...). Nothing is
    executed and nothing is written. Raises UnknownConversation if there is no such
    conversation, and ``LostSteps`` if the log file lost steps it had committed (its
    WAL deleted, cut or damaged: what is left would verify, but it is not the whole
    log); every other problem of the log is in the report.

    Each conversation is first replayed the cheap way (``replay_quickly``: the state's
    whole-state digest compared only after its snapshot and last events, its phase
    and counters at every step); only if that finds anything off is it replayed step
    by step with every check, which locates and reports the first difference.
    """
    store.check_committed()
    logs = subtree_logs(store, conversation_id) if tree else [store.raw_log(conversation_id)]
    # A replay keeps a pending child's texts for its finished item (see ``texts_kept``).
    with texts_kept():
        results = tuple(_verify_one(log) for log in logs)
    if any(r.divergence is not None for r in results):
        results = _damage_explains(store, results)
    return VerifyReport(conversation_id=conversation_id, tree=tree, results=results)


def _damage_explains(
    store: Store, results: tuple[ConversationResult, ...]
) -> tuple[ConversationResult, ...]:
    """A divergence in a damaged file may be the damage: a damaged index hides rows
    (an effect, an event at the end) from the queries that read through it, which no
    row checksum can show. So a divergence is reported with a finding of damage when
    SQLite's integrity check finds the file damaged."""
    problem = store.damage()
    if problem is None:
        return results
    return tuple(
        attrs.evolve(
            r,
            findings=(
                *r.findings,
                Finding(
                    FindingKind.CORRUPT_PAYLOAD,
                    r.conversation_id,
                    r.divergence.seq,
                    f"the database file is damaged ({problem}): the divergence at event "
                    f"{r.divergence.seq} may be that damage",
                ),
            ),
        )
        if r.divergence is not None
        else r
        for r in results
    )


def _verify_one(log: RawLog) -> ConversationResult:
    final = replay_quickly(log)
    if final is not None:
        return ConversationResult(
            conversation_id=log.row.id, events=len(log.events), final_state=final
        )
    return _verify_carefully(log)


def _verify_carefully(log: RawLog) -> ConversationResult:
    """Replay step by step with every check (``replay_log``), to the first problem."""
    count = 0
    final: Conversation | None = None
    findings: list[Finding] = []
    divergence: Divergence | None = None
    for outcome in replay_log(log):
        if isinstance(outcome, Finding):
            findings.append(outcome)
            break
        if not outcome.matches:
            divergence = Divergence.of(outcome)
            suspicion = _suspicion(outcome)
            if suspicion is not None:
                findings.append(suspicion)
            break
        count += 1
        final = outcome.after_state
    return ConversationResult(
        conversation_id=log.row.id,
        events=count,
        final_state=final,
        divergence=divergence,
        findings=tuple(findings),
    )


def _suspicion(step: ReplayStep) -> Finding | None:
    """A diverging step that looks duplicated or moved is a damaged log as well."""
    if step.suspect is None:
        return None
    return Finding(
        step.suspect,
        step.conversation_id,
        step.seq,
        f"event {step.seq} ({type(step.event).__name__}) does not replay: " + "; ".join(step.notes),
    )
