"""The typed results of replaying a log: steps, findings, divergences, reports."""

from __future__ import annotations

import enum

import attrs

from fanfold.db.fingerprint import differences as fingerprint_differences
from fanfold.db.fingerprint import version as fingerprint_version
from fanfold.replay import render
from fanfold.statemachine import Conversation, Effect, Event


class FindingKind(enum.StrEnum):
    """What is wrong with a log itself (as opposed to the reducer disagreeing with it)."""

    MISSING_EVENT = "missing_event"
    """A seq is missing: the log has a gap, or does not start at 0."""
    TRUNCATED = "truncated"
    """The log ends before the event its conversation row names as the last one."""
    ROW_MISMATCH = "row_mismatch"
    """The conversation row disagrees with its log (events after its last_seq, phase)."""
    OUT_OF_ORDER = "out_of_order"
    """A failing event was recorded (or written) before the one preceding it."""
    DUPLICATE_EVENT = "duplicate_event"
    """A failing event repeats an earlier event of the conversation exactly."""
    CORRUPT_PAYLOAD = "corrupt_payload"
    """An event, effect or snapshot cannot be decoded, its rows disagree, or a row does
    not match its checksum."""
    UNSUPPORTED_VERSION = "unsupported_version"
    """A document was written with an event schema version this fanfold cannot read."""
    REFUSED = "refused"
    """The reducer refuses the event (IllegalTransition)."""


@attrs.frozen
class Finding:
    """One problem in a log, at the event ``seq`` of ``conversation_id`` (when known)."""

    kind: FindingKind
    conversation_id: str
    seq: int | None
    message: str

    def __str__(self) -> str:
        where = f"conversation {self.conversation_id}"
        if self.seq is not None:
            where += f", seq {self.seq}"
        return f"{where}: {self.message} [{self.kind}]"


@attrs.frozen
class ReplayStep:
    """One recorded transition and what today's reducer makes of it.

    ``before_state`` is None at seq 0 (the creation event). ``after_state`` is the
    recomputed state; ``effects`` and ``fingerprint`` are the recorded ones, next to
    ``recomputed_effects`` and ``recomputed_fingerprint``. ``recorded_state`` is the
    full state stored as the conversation's snapshot when it was taken after this
    event, else None. ``notes`` flag signs of a reordered or duplicated event.
    """

    conversation_id: str
    seq: int
    at: float
    event: Event
    before_state: Conversation | None
    after_state: Conversation
    effects: tuple[Effect, ...]
    recomputed_effects: tuple[Effect, ...]
    fingerprint: str
    recomputed_fingerprint: str
    recorded_state: Conversation | None = None
    rowid: int | None = None
    effects_match: bool = True
    notes: tuple[str, ...] = ()
    suspect: FindingKind | None = None

    @property
    def fingerprint_matches(self) -> bool:
        return self.fingerprint == self.recomputed_fingerprint

    @property
    def state_matches(self) -> bool:
        return self.recorded_state is None or self.recorded_state == self.after_state

    @property
    def matches(self) -> bool:
        """True if the reducer reproduces everything recorded for this step."""
        return self.effects_match and self.fingerprint_matches and self.state_matches


@attrs.frozen
class Divergence:
    """The first step where today's reducer disagrees with a conversation's log."""

    conversation_id: str
    seq: int
    at: float
    event: Event
    recorded_effects: tuple[Effect, ...]
    recomputed_effects: tuple[Effect, ...]
    recorded_fingerprint: str
    recomputed_fingerprint: str
    before_state: Conversation | None
    after_state: Conversation
    recorded_state: Conversation | None = None
    notes: tuple[str, ...] = ()
    effects_match: bool = True

    @classmethod
    def of(cls, step: ReplayStep) -> Divergence:
        """The divergence a mismatching step shows."""
        return cls(
            conversation_id=step.conversation_id,
            seq=step.seq,
            at=step.at,
            event=step.event,
            recorded_effects=step.effects,
            recomputed_effects=step.recomputed_effects,
            recorded_fingerprint=step.fingerprint,
            recomputed_fingerprint=step.recomputed_fingerprint,
            before_state=step.before_state,
            after_state=step.after_state,
            recorded_state=step.recorded_state,
            notes=step.notes,
            effects_match=step.effects_match,
        )

    @property
    def fingerprint_matches(self) -> bool:
        return self.recorded_fingerprint == self.recomputed_fingerprint

    def headline(self) -> str:
        """One line: where the log and the reducer part ways."""
        what = []
        if not self.effects_match:
            what.append("effects")
        if not self.fingerprint_matches:
            what.append("state fingerprint")
        if self.recorded_state is not None and self.recorded_state != self.after_state:
            what.append("state snapshot")
        named = ""
        if not self.fingerprint_matches and fingerprint_version(self.recorded_fingerprint) == 7:
            # Version 7 names what differs: the first counter, state field or effect
            # field (in that order), and how many more.
            found = fingerprint_differences(self.recorded_fingerprint, self.recomputed_fingerprint)
            if found:
                more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
                named = f"; first: {found[0]}{more}"
        return (
            f"conversation {self.conversation_id}, seq {self.seq} "
            f"({type(self.event).__name__}): recorded and recomputed "
            f"{' and '.join(what) or 'values'} differ{named}"
        )

    def diff(self) -> str:
        """A readable account: the event, then what differs, recorded vs recomputed."""
        lines = [self.headline(), f"event: {render.describe(self.event)}"]
        if self.before_state is not None:
            lines.append(f"state before: {render.summary(self.before_state)}")
        lines.extend(f"note: {note}" for note in self.notes)
        if self.effects_match:
            lines.append(f"effects: identical ({render.describe_effects(self.recorded_effects)})")
        else:
            lines.append("effects:")
            lines.append(
                render.unified(
                    render.pretty(self.recorded_effects), render.pretty(self.recomputed_effects)
                )
            )
        if self.fingerprint_matches:
            lines.append(f"state fingerprint: identical ({self.recorded_fingerprint})")
        else:
            lines.append("state fingerprint:")
            lines.extend(
                "  " + line
                for line in render.fingerprint_diff(
                    self.recorded_fingerprint, self.recomputed_fingerprint
                )
            )
        if self.recorded_state is not None and self.recorded_state != self.after_state:
            lines.append("state (recorded snapshot vs recomputed):")
            lines.append(
                render.unified(render.pretty(self.recorded_state), render.pretty(self.after_state))
            )
        lines.append(f"recomputed state after: {render.summary(self.after_state)}")
        return "\n".join(lines)


@attrs.frozen
class ConversationResult:
    """How one conversation's log replayed.

    ``events`` counts the events that replayed identically; ``final_state`` is the
    state after the last of them (None if not even seq 0 did).
    """

    conversation_id: str
    events: int
    final_state: Conversation | None
    divergence: Divergence | None = None
    findings: tuple[Finding, ...] = ()

    @property
    def ok(self) -> bool:
        return self.divergence is None and not self.findings

    @property
    def last_seq(self) -> int | None:
        """The seq of the last event that replayed identically."""
        return self.events - 1 if self.events else None


@attrs.frozen
class VerifyReport:
    """The outcome of ``verify``: one result per conversation checked.

    ``ok`` is True only if every event of every conversation replayed identically and
    no problem was found in the log. A divergence means the reducer and the log
    disagree; a finding means the log itself is damaged (``corrupt``).
    """

    conversation_id: str
    tree: bool
    results: tuple[ConversationResult, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def events(self) -> int:
        """Events that replayed identically, over every conversation checked."""
        return sum(r.events for r in self.results)

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for r in self.results for f in r.findings)

    @property
    def corrupt(self) -> bool:
        """True if the log itself is damaged (any finding)."""
        return bool(self.findings)

    @property
    def divergences(self) -> tuple[Divergence, ...]:
        return tuple(r.divergence for r in self.results if r.divergence is not None)

    @property
    def first_divergence(self) -> Divergence | None:
        """The earliest divergence by recorded time (ties: tree order)."""
        found = self.divergences
        if not found:
            return None
        order = {r.conversation_id: i for i, r in enumerate(self.results)}
        return min(found, key=lambda d: (d.at, order[d.conversation_id], d.seq))

    def result(self, conversation_id: str) -> ConversationResult:
        """The result of one conversation; KeyError if it was not checked."""
        for result in self.results:
            if result.conversation_id == conversation_id:
                return result
        raise KeyError(conversation_id)

    def final_states(self) -> dict[str, Conversation]:
        """The recomputed final state of every conversation that replayed to its end."""
        return {
            r.conversation_id: r.final_state
            for r in self.results
            if r.ok and r.final_state is not None
        }

    def summary(self) -> str:
        """One line: what was checked and how it went."""
        n = len(self.results)
        what = f"{self.events} event(s) of {n} conversation(s)"
        if self.ok:
            return f"identical: {what} replayed"
        bad = sum(1 for r in self.results if not r.ok)
        parts = []
        if self.divergences:
            parts.append(f"{len(self.divergences)} diverged")
        if self.findings:
            parts.append(f"{len(self.findings)} log problem(s)")
        return f"{', '.join(parts)} in {bad} of {n} conversation(s); {what} replayed identically"
