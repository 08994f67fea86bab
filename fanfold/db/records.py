"""The values ``Store`` takes and returns: steps to append, rows read back."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from fanfold.db.provenance import TreeRecord

# The reducer's types and the codec are imported where a value is built or decoded
# (``status_of``, ``StoredEvent.from_rows``): a listing of the log's rows needs neither
# (issue 36; the annotations are strings, ``from __future__ import annotations``).
if TYPE_CHECKING:
    from fanfold.statemachine import Conversation, Effect, Event, Phase


class Status(enum.StrEnum):
    """A conversation's status column, derived from its phase."""

    RUNNING = "running"
    """Something is in flight (model call, tool, retry timer, children): resume it."""
    IDLE = "idle"
    """A root conversation waiting for the user."""
    ERROR = "error"
    """A root conversation whose last turn failed; a new user message starts over."""
    COMPLETED = "completed"
    """A sub-agent that produced a result (terminal)."""
    FAILED = "failed"
    """A sub-agent that ended without a result (terminal)."""


_STATUS_OF_PHASE: dict[type[Phase], Status] = {}


def _statuses() -> dict[type[Phase], Status]:
    from fanfold.statemachine import (
        ALL_PHASES,
        AwaitingRetry,
        AwaitingSubAgents,
        CancellingSubAgents,
        Completed,
        Error,
        Failed,
        Idle,
        LlmRequesting,
        ToolExecuting,
    )

    statuses = {
        Idle: Status.IDLE,
        LlmRequesting: Status.RUNNING,
        AwaitingRetry: Status.RUNNING,
        ToolExecuting: Status.RUNNING,
        AwaitingSubAgents: Status.RUNNING,
        CancellingSubAgents: Status.RUNNING,
        Error: Status.ERROR,
        Completed: Status.COMPLETED,
        Failed: Status.FAILED,
    }
    assert set(statuses) == set(ALL_PHASES), "every phase needs a status"
    return statuses


def status_of(phase: Phase) -> Status:
    """The status a conversation in ``phase`` is listed with."""
    if not _STATUS_OF_PHASE:
        _STATUS_OF_PHASE.update(_statuses())
    return _STATUS_OF_PHASE[type(phase)]


@attrs.frozen
class Step:
    """One transition to record: the event, the effects it produced and the new state.

    ``state`` is the state *after* the event; the store keeps only its fingerprint,
    phase and status, plus the whole state as the conversation's snapshot when
    ``snapshot`` is true (ask every K steps and whenever the conversation comes to
    rest, so recovery folds few events); it is ignored at seq 0, where replay
    rebuilds the state with ``start(created)`` for free. Seq 0 must be the
    ConversationCreated (or, for a fork, ConversationForked) event; appending it
    creates the conversation row.
    ``user_initiated`` is read at seq 0 only: None means "a root is user-initiated,
    a sub-agent is not". ``tree`` is read at seq 0 of a root only: its provenance
    record, written in the same transaction (None: the tree gets no record, and is
    never continued by a runtime). ``before``: the state the event was applied to
    (None at seq 0, or when the writer does not have it): the fingerprint then lists
    only the state fields the step changed, else every field.
    """

    conversation_id: str
    seq: int
    event: Event
    effects: tuple[Effect, ...]
    state: Conversation
    at: float
    snapshot: bool = False
    user_initiated: bool | None = None
    tree: TreeRecord | None = None
    before: Conversation | None = None


class InTree(Protocol):
    """Anything that names a conversation and its tree: a ``Conversation`` (a state)
    or a ``ConversationRow``."""

    @property
    def id(self) -> str: ...

    @property
    def root_id(self) -> str: ...


def claim_unit(conversation: InTree, units: Mapping[str, str]) -> str:
    """The id of the unit a conversation is claimed with (a PostgreSQL log's claim,
    ``TreeTakenOver.root_id``): the chunk it runs in (``units``: ``Store.units``, a
    placed child and its descendants, ``fanfold/runtime/placement.py``), else its
    tree's root. The store fences by it and the runtime drops the conversations of a
    unit taken over by it, so the two agree by construction."""
    return units.get(conversation.id) or conversation.root_id or conversation.id


@attrs.frozen
class StoredEvent:
    """One recorded event with its effects, as read back from the log."""

    seq: int
    event: Event
    effects: tuple[Effect, ...]
    fingerprint: str
    at: float

    @classmethod
    def from_rows(
        cls,
        row: Mapping[str, Any],
        effect_rows: Sequence[Mapping[str, Any]],
        blobs: Mapping[str, str] | None = None,
    ) -> StoredEvent:
        """Build from an ``events`` row and its ``effects`` rows (ordered by idx);
        ``blobs``: the log's blobs, which the event and effects may name."""
        from fanfold.db.codec import decode_effect, decode_event

        return cls(
            seq=row["seq"],
            event=decode_event(row["payload"], blobs),
            effects=tuple(decode_effect(e["payload"], blobs) for e in effect_rows),
            fingerprint=row["fingerprint"],
            at=row["at"],
        )


@attrs.frozen
class ConversationRow:
    """A conversation's row: identity, place in its tree, current phase and status.

    ``last_seq`` is the seq of its latest event; ``snapshot_seq`` the seq its stored
    snapshot was taken after (None: no snapshot, replay starts at seq 0).
    ``forked_from``/``forked_at_seq`` name the conversation and seq a fork was made
    from (its ConversationForked event); None for every other conversation. A fork
    imported into a database that does not hold its source has ``forked_at_seq`` and
    no ``forked_from`` (a key of the table): ``replay.lineage`` reads the source's id
    from its seq 0 (before issue 34 both were None there).
    """

    id: str
    parent_id: str | None
    root_id: str
    depth: int
    task: str | None
    user_initiated: bool
    created_at: float
    updated_at: float
    phase: str
    status: Status
    last_seq: int
    snapshot_seq: int | None
    forked_from: str | None
    forked_at_seq: int | None

    COLUMNS = (
        "id",
        "parent_id",
        "root_id",
        "depth",
        "task",
        "user_initiated",
        "created_at",
        "updated_at",
        "phase",
        "status",
        "last_seq",
        "snapshot_seq",
        "forked_from",
        "forked_at_seq",
    )
    """The columns ``from_row`` reads (the snapshot itself is not among them)."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ConversationRow:
        """Build from a ``conversations`` row holding at least ``COLUMNS``."""
        return cls(
            id=row["id"],
            parent_id=row["parent_id"],
            root_id=row["root_id"],
            depth=row["depth"],
            task=row["task"],
            user_initiated=bool(row["user_initiated"]),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            phase=row["phase"],
            status=Status(row["status"]),
            last_seq=row["last_seq"],
            snapshot_seq=row["snapshot_seq"],
            forked_from=row["forked_from"],
            forked_at_seq=row["forked_at_seq"],
        )

    @property
    def is_sub_agent(self) -> bool:
        return self.parent_id is not None


@attrs.frozen
class RawEffect:
    """One ``effects`` row as stored: its index within the step and its JSON text."""

    idx: int
    type: str
    payload: str
    checksum: int | None = None
    """The row's stored checksum (``fanfold.db.checksum``); None: not recorded."""


@attrs.frozen
class RawEvent:
    """One ``events`` row and its effects exactly as stored, not decoded.

    For tools that must survive a corrupt log (replay verification, export, import):
    decoding is left to the caller. ``rowid`` is the row's position in the write order
    of the whole database (None when the event is not stored yet).
    """

    conversation_id: str
    seq: int
    type: str
    payload: str
    fingerprint: str
    at: float
    effects: tuple[RawEffect, ...] = ()
    rowid: int | None = None
    checksum: int | None = None
    """The row's stored checksum (``fanfold.db.checksum``); None: not recorded (a log
    older than the checksums, or an event not stored yet)."""


@attrs.frozen
class ToolProgressRow:
    """The latest progress report of one tool call in flight (``Store.write_progress``):
    a side table for the trace page, never part of the log's facts."""

    conversation_id: str
    call: int
    """The call's number in its conversation (``RunTool.call``)."""
    text: str
    """What the live view shows (``3/5, step 3``); its message is the server's text."""
    reports: int
    """Reports received for the call so far."""
    at: float
    """When the report was received (seconds since the epoch)."""


@attrs.frozen
class RawConversation:
    """A ``conversations`` row as stored, snapshot text included, for ``import_raw``."""

    row: ConversationRow
    snapshot_json: str | None = None


@attrs.frozen
class RawLog:
    """One conversation as stored: its row, snapshot text and events, undecoded.

    ``snapshot_json`` is the full state after event ``row.snapshot_seq`` (None if no
    snapshot was taken); ``events`` are ordered by seq.
    """

    row: ConversationRow
    snapshot_json: str | None
    events: tuple[RawEvent, ...]
    snapshot_checksum: int | None = None
    """The snapshot's stored checksum (``fanfold.db.checksum``); None: not recorded."""
    blobs: Mapping[str, str] = attrs.field(factory=dict, eq=False, repr=False)
    """The log's blobs (``sha256 -> text``), which its documents may name
    (``fanfold.db.codec``, "Blobs"); decode with ``decode_event(payload, blobs)``."""
