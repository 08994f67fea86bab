"""The checked fold: one conversation's stored log through ``start``/``transition``.

This is the only place replay runs the reducer. It reads undecoded rows, decodes
each event, recomputes the step and compares it with what was recorded; problems in
the log come out as ``Finding`` values, never as exceptions. Effects are data here:
nothing in this package can execute one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from fanfold.db import (
    CodecError,
    RawEffect,
    RawEvent,
    RawLog,
    Store,
    UnsupportedVersion,
    codec,
    decode_effect,
    decode_event,
    decode_state,
    encode_effect,
    encode_state,
)
from fanfold.db.checksum import effect_checksum, event_checksum, snapshot_checksum
from fanfold.db.codec import encode_effect_stored, encode_state_stored
from fanfold.db.fingerprint import events_only, summary
from fanfold.db.fingerprint import like as fingerprint_like
from fanfold.replay.report import Finding, FindingKind, ReplayStep
from fanfold.statemachine import (
    Conversation,
    ConversationCreated,
    ConversationForked,
    Effect,
    Event,
    IllegalTransition,
    model_request,
    start,
    transition,
)

Outcome = ReplayStep | Finding
"""What the checked fold yields: a replayed step, or the problem that stopped it."""


def replay_conversation(store: Store, conversation_id: str) -> Iterator[Outcome]:
    """Replay one stored conversation from seq 0; see ``replay_log``.

    Raises UnknownConversation if there is no such conversation.
    """
    return replay_log(store.raw_log(conversation_id))


def subtree_logs(store: Store, conversation_id: str) -> list[RawLog]:
    """The raw logs of the conversation and all its descendants, parents first, in
    creation order, read in one go. Raises UnknownConversation for an unknown id."""
    row = store.conversation(conversation_id)
    inside = {row.id}
    logs = []
    for log in store.raw_tree(row.root_id):
        other = log.row
        if other.id == row.id or (other.parent_id in inside and other.id not in inside):
            inside.add(other.id)
            logs.append(log)
    return logs


def replay_log(log: RawLog) -> Iterator[Outcome]:
    """Yield every step of a conversation's log, checked, then stop at the first problem.

    Each step is yielded whether or not it matches the record (consumers decide what
    a divergence means for them). A problem that makes further replay meaningless
    (undecodable event, gap, refused event...) is yielded as a Finding and ends the
    iteration; so does a row that disagrees with the log at its end.
    """
    row, events = log.row, log.events
    snapshot = (
        (row.snapshot_seq, log.snapshot_json)
        if log.snapshot_json is not None and row.snapshot_seq is not None
        else None
    )
    cid = row.id
    if not events:
        yield Finding(
            FindingKind.TRUNCATED,
            cid,
            0,
            f"the log holds no event (the conversation row names event {row.last_seq} as its last)",
        )
        return
    snapshot_seq, snapshot_text = snapshot if snapshot is not None else (None, None)
    first_seen: dict[str, int] = {}
    state: Conversation | None = None
    previous: RawEvent | None = None
    expected = 0
    for index, raw in enumerate(events):
        seq = raw.seq
        if seq != expected:
            yield Finding(
                FindingKind.MISSING_EVENT,
                cid,
                expected,
                f"event {expected} is missing: the log goes from seq {expected - 1} to {seq}"
                if expected
                else f"event 0 is missing: the log starts at seq {seq}",
            )
            return
        if seq > row.last_seq:
            repeated = first_seen.get(raw.payload)
            note = f"; it repeats event {repeated} exactly" if repeated is not None else ""
            yield Finding(
                FindingKind.DUPLICATE_EVENT if repeated is not None else FindingKind.ROW_MISMATCH,
                cid,
                seq,
                f"events {seq} to {events[-1].seq} follow event {row.last_seq}, which the "
                f"conversation row names as its last{note}",
            )
            return
        damaged = damaged_row(cid, raw)
        if damaged is not None:
            yield damaged
            return
        following = events[index + 1] if index + 1 < len(events) else None
        notes, suspect = _suspicions(raw, previous, following, first_seen.get(raw.payload))
        decoded = _decode_event(cid, raw, log.blobs)
        if isinstance(decoded, Finding):
            yield decoded
            return
        event = decoded
        try:
            if seq == 0:
                if not isinstance(event, ConversationCreated | ConversationForked):
                    raise _NotACreation(
                        f"event 0 must be ConversationCreated or ConversationForked, "
                        f"got {type(event).__name__}"
                    )
                if event.conversation_id != cid:
                    raise _NotACreation(
                        f"event 0 creates conversation {event.conversation_id!r}, not {cid!r}"
                    )
                after, effects = start(event)
            else:
                assert state is not None
                after, effects = transition(state, event)
        except (IllegalTransition, _NotACreation) as exc:
            detail = "; ".join((str(exc), *notes))
            yield Finding(
                suspect or FindingKind.REFUSED,
                cid,
                seq,
                f"the reducer refuses event {seq} ({type(event).__name__}): {detail}",
            )
            return
        except Exception as exc:  # a reducer bug: still a report, not a traceback
            detail = "; ".join((f"{type(exc).__name__}: {exc}", *notes))
            yield Finding(
                suspect or FindingKind.REFUSED,
                cid,
                seq,
                f"the reducer fails on event {seq} ({type(event).__name__}) with {detail}",
            )
            return
        derived = events_only(raw.fingerprint) and not raw.effects
        compared = (
            # The events-only log stores no effects: the recomputed ones are the log's
            # (the fingerprint covers them: their type names in version 6, their whole
            # content in version 7; compared below).
            (effects, True, ())
            if derived
            else _compare_effects(cid, seq, raw.effects, effects, after, log.blobs)
        )
        if isinstance(compared, Finding):
            yield compared
            return
        recorded_effects, effects_match, effect_notes = compared
        notes = (*notes, *effect_notes)
        recorded_state = None
        if seq == snapshot_seq and snapshot_text is not None:
            if log.snapshot_checksum is not None and log.snapshot_checksum != snapshot_checksum(
                cid, seq, snapshot_text
            ):
                yield Finding(
                    FindingKind.CORRUPT_PAYLOAD,
                    cid,
                    seq,
                    f"the snapshot taken after event {seq} is damaged (checksum mismatch)",
                )
                return
            try:
                # Fast path: the recomputed state encodes to exactly the stored text.
                same = _encodes_to(after, snapshot_text)
                recorded_state = after if same else decode_state(snapshot_text, log.blobs)
            except CodecError as exc:
                yield Finding(
                    _codec_kind(exc),
                    cid,
                    seq,
                    f"the snapshot taken after event {seq} cannot be read: {exc}",
                )
                return
        yield ReplayStep(
            conversation_id=cid,
            seq=seq,
            at=raw.at,
            event=event,
            before_state=state,
            after_state=after,
            effects=recorded_effects,
            recomputed_effects=effects,
            fingerprint=raw.fingerprint,
            recomputed_fingerprint=fingerprint_like(
                after,
                raw.fingerprint,
                raw.payload,
                [(e.type, e.payload) for e in raw.effects],
                effect_names=[type(e).__name__ for e in effects],
                derived=effects,
                before=state,
                stepwise=True,
            ),
            recorded_state=recorded_state,
            rowid=raw.rowid,
            effects_match=effects_match,
            notes=notes,
            suspect=suspect,
        )
        first_seen.setdefault(raw.payload, seq)
        state, previous, expected = after, raw, expected + 1
    last = expected - 1
    if row.last_seq > last:
        yield Finding(
            FindingKind.TRUNCATED,
            cid,
            last + 1,
            f"the log ends at event {last}, but the conversation row names event "
            f"{row.last_seq} as its last: events {last + 1} to {row.last_seq} are missing",
        )
    elif state is not None and row.phase != type(state.phase).__name__:
        yield Finding(
            FindingKind.ROW_MISMATCH,
            cid,
            last,
            f"the conversation row says phase {row.phase}, the log ends in "
            f"{type(state.phase).__name__}",
        )


def replay_quickly(log: RawLog) -> Conversation | None:
    """The state at the end of the log if it replays exactly, checked the cheap way;
    None if anything is (or may be) off, and ``replay_log`` must say what.

    What ``replay_log`` checks at every step is checked here too (contiguous seqs
    within the row's, row checksums, each event decodes, is of its stored type and is
    accepted, the recomputed effects encode to exactly the stored texts, the snapshot
    equals the recomputed state), and a version-5 fingerprint (written since
    2026-11-26) whole at every step: its counters, its content digest and, where it
    has one (at rest), its whole-state digest; a version-7 fingerprint (written since
    2026-12-07) whole at every step too, so of such a log every field of every step's
    state and effects is compared here (a difference ends this quick pass, and the
    careful replay names it). Of an older fingerprint, the phase and
    counters (``fingerprint.summary``) are compared at every step, its whole-state
    digest only after the snapshot's event and the last event. The digest is most of the cost of a
    step (it encodes the state), and a difference in the state that lasts is still
    seen at the end; a difference the reducer makes and later undoes, leaving no trace
    in any effect, counter, snapshot or the final state, is not. The caller replays
    with ``replay_log`` whenever this returns None, so every report it makes is the
    one ``replay_log`` makes.
    """
    row, events = log.row, log.events
    if not events or row.last_seq != events[-1].seq or len(events) != row.last_seq + 1:
        return None
    cid = row.id
    blobs = log.blobs
    snapshot_seq = row.snapshot_seq if log.snapshot_json is not None else None
    last = events[-1].seq
    state: Conversation | None = None
    event_crc, effect_crc = event_checksum, effect_checksum
    try:
        for expected, raw in enumerate(events):
            seq, payload, mark = raw.seq, raw.payload, raw.fingerprint
            if seq != expected:
                return None
            if raw.checksum is not None and raw.checksum != event_crc(
                cid, seq, raw.type, payload, mark, raw.at
            ):
                return None
            event = decode_event(payload, blobs)
            if type(event).__name__ != raw.type:
                return None
            if state is None:
                if (
                    not isinstance(event, ConversationCreated | ConversationForked)
                    or event.conversation_id != cid
                ):
                    return None
                before, (state, effects) = None, start(event)
            else:
                before, (state, effects) = state, transition(state, event)
            recorded = raw.effects
            if " ######" in mark:
                # Version 7, the events-only log: the content digest covers the event's
                # text and the recomputed effects' whole content, the state part every
                # field the step changed.
                if recorded or (
                    fingerprint_like(
                        state, mark, payload, derived=effects, before=before, stepwise=True
                    )
                    != mark
                ):
                    return None
                if seq == snapshot_seq and not _same_snapshot(log, state):
                    return None
                continue
            if " #####" in mark:
                # Version 6, the events-only log: no stored effects; the content digest
                # covers the event's text and the recomputed effects' names.
                if recorded:
                    return None
                names = [type(effect).__name__ for effect in effects]
                if fingerprint_like(state, mark, payload, effect_names=names) != mark:
                    return None
                if seq == snapshot_seq and not _same_snapshot(log, state):
                    return None
                continue
            if len(recorded) != len(effects):
                return None
            for index, (effect, stored) in enumerate(zip(effects, recorded, strict=True)):
                if (
                    stored.idx != index
                    or type(effect).__name__ != stored.type
                    or not _stored_as(effect, stored.payload)
                    or (
                        stored.checksum is not None
                        and stored.checksum
                        != effect_crc(cid, seq, index, stored.type, stored.payload)
                    )
                ):
                    return None
            if " ####" in mark:
                # Version 5: the content digest at every step (it costs a hash of the
                # texts at hand), the whole-state digest where the row holds one.
                stored_effects = [(e.type, e.payload) for e in recorded]
                if fingerprint_like(state, mark, payload, stored_effects) != mark:
                    return None
                if seq == snapshot_seq and not _same_snapshot(log, state):
                    return None
            elif seq in (snapshot_seq, last):
                if fingerprint_like(state, mark, payload) != mark:
                    return None
                if seq == snapshot_seq and not _same_snapshot(log, state):
                    return None
            else:
                counters = summary(state)
                if mark != counters and not mark.startswith(counters + " #"):
                    return None
    except Exception:  # anything at all: the careful replay reports it
        return None
    if state is None or row.phase != type(state.phase).__name__:
        return None
    return state


def _same_snapshot(log: RawLog, state: Conversation) -> bool:
    """The log's snapshot is intact and is ``state``'s encoding, exactly."""
    text, seq = log.snapshot_json, log.row.snapshot_seq
    if text is None or seq is None:
        return False
    if log.snapshot_checksum is not None and log.snapshot_checksum != snapshot_checksum(
        log.row.id, seq, text
    ):
        return False
    return _encodes_to(state, text)


def _encodes_to(state: Conversation, text: str) -> bool:
    """``text`` is ``state``'s encoding, in the form the log stores (compact, blob
    values by reference) or the object form (older logs, imports of older schemas)."""
    if text.startswith("["):
        return encode_state_stored(state, {}) == text
    return encode_state(state, {}) == text or encode_state(state) == text


class _NotACreation(Exception):
    """Seq 0 holds something ``start`` cannot take."""


def _suspicions(
    raw: RawEvent, previous: RawEvent | None, following: RawEvent | None, repeats: int | None
) -> tuple[tuple[str, ...], FindingKind | None]:
    """Signs that an event was duplicated or moved; they matter only if it fails."""
    notes: list[str] = []
    suspect = None
    if repeats is not None:
        notes.append(f"it repeats event {repeats} exactly")
        suspect = FindingKind.DUPLICATE_EVENT
    for other, earlier in ((previous, True), (following, False)):
        if other is None:
            continue
        gap = (raw.at - other.at) if earlier else (other.at - raw.at)
        if gap < 0:
            when = "before" if earlier else "after"
            notes.append(f"it was recorded {-gap:.3f}s {when} event {other.seq}")
            suspect = suspect or FindingKind.OUT_OF_ORDER
        elif (
            raw.rowid is not None
            and other.rowid is not None
            and (raw.rowid < other.rowid) == earlier
        ):
            when = "before" if earlier else "after"
            notes.append(f"it was written to the database {when} event {other.seq}")
            suspect = suspect or FindingKind.OUT_OF_ORDER
    return tuple(notes), suspect


def _recorded_requests(
    cid: str, seq: int, recorded: tuple[RawEffect, ...], after: Conversation
) -> str | Finding | None:
    """A note if a model call recorded (before schema 6) a request other than the one
    derived from ``after``; a Finding if one cannot be read; None otherwise."""
    for effect in recorded:
        if effect.type != "CallModel":
            continue
        try:
            held, request = codec.retired_value(effect.payload, "request")
            if not held:
                continue
            version = codec.document_version(effect.payload)
        except CodecError as exc:
            return Finding(
                _codec_kind(exc),
                cid,
                seq,
                f"effect {effect.idx} of event {seq} cannot be read: {exc}",
            )
        try:
            derived = codec.as_recorded_by(model_request(after), version)
        except ValueError:
            return (
                f"effect {effect.idx} recorded a model request, but the rebuilt state "
                "awaits no model call"
            )
        if derived != request:
            differ = [
                name
                for name in ("system", "messages", "tools", "model")
                if getattr(derived, name) != getattr(request, name)
            ]
            return (
                f"the model request recorded with effect {effect.idx} (log schema "
                f"{version}) is not the one today's reducer derives from the state: its "
                f"{', '.join(differ)} differ"
            )
    return None


def damaged_row(cid: str, raw: RawEvent) -> Finding | None:
    """A Finding if the event's row or one of its effects' rows does not match its
    checksum (rows without one, written before the checksums, are not checked).
    The snapshot's checksum is checked where it is read."""
    if raw.checksum is not None and raw.checksum != event_checksum(
        cid, raw.seq, raw.type, raw.payload, raw.fingerprint, raw.at
    ):
        return Finding(
            FindingKind.CORRUPT_PAYLOAD,
            cid,
            raw.seq,
            f"event {raw.seq} is damaged: its row does not match its checksum",
        )
    for effect in raw.effects:
        if effect.checksum is not None and effect.checksum != effect_checksum(
            cid, raw.seq, effect.idx, effect.type, effect.payload
        ):
            return Finding(
                FindingKind.CORRUPT_PAYLOAD,
                cid,
                raw.seq,
                f"effect {effect.idx} of event {raw.seq} is damaged: its row does not match "
                "its checksum",
            )
    return None


def _codec_kind(exc: CodecError) -> FindingKind:
    if isinstance(exc, UnsupportedVersion):
        return FindingKind.UNSUPPORTED_VERSION
    return FindingKind.CORRUPT_PAYLOAD


def _decode_event(cid: str, raw: RawEvent, blobs: Mapping[str, str]) -> Event | Finding:
    try:
        event = decode_event(raw.payload, blobs)
    except CodecError as exc:
        return Finding(_codec_kind(exc), cid, raw.seq, f"event {raw.seq} cannot be read: {exc}")
    if type(event).__name__ != raw.type:
        return Finding(
            FindingKind.CORRUPT_PAYLOAD,
            cid,
            raw.seq,
            f"event {raw.seq} is stored as a {raw.type} but its payload is a "
            f"{type(event).__name__}",
        )
    return event


def _stored_as(effect: Effect, text: str) -> bool:
    """``text`` is ``effect`` in a form the log stores it in: as stored now (blob fields
    by reference), as stored before 2026-11-26 (inline), or as an object document (older
    logs, imports of older schemas)."""
    return (
        encode_effect_stored(effect, {}) == text
        or encode_effect_stored(effect) == text
        or encode_effect(effect) == text
    )


def _compare_effects(
    cid: str,
    seq: int,
    recorded: tuple[RawEffect, ...],
    recomputed: tuple[Effect, ...],
    after: Conversation,
    blobs: Mapping[str, str],
) -> tuple[tuple[Effect, ...], bool, tuple[str, ...]] | Finding:
    """The recorded effects, decoded (``blobs``: the texts their references name), whether
    the reducer reproduces them, and notes saying what differs where the effects alone
    cannot show it.

    Fast path: the recomputed effects encode to exactly the stored texts. A model
    call of a log older than schema 6 recorded its whole request: it must be the
    request derived from the rebuilt state ``after`` (``model_request``).
    """
    for index, effect in enumerate(recorded):
        if effect.idx != index:
            return Finding(
                FindingKind.CORRUPT_PAYLOAD,
                cid,
                seq,
                f"effect {index} of event {seq} is missing (the next stored is {effect.idx})",
            )
    texts = [encode_effect(e) for e in recomputed]
    if len(texts) == len(recorded) and all(
        (t == r.payload or _stored_as(e, r.payload)) and type(e).__name__ == r.type
        for t, r, e in zip(texts, recorded, recomputed, strict=True)
    ):
        return recomputed, True, ()
    request_note = _recorded_requests(cid, seq, recorded, after)
    if isinstance(request_note, Finding):
        return request_note
    decoded: list[Effect] = []
    for effect in recorded:
        try:
            value = decode_effect(effect.payload, blobs)
        except CodecError as exc:
            return Finding(
                _codec_kind(exc),
                cid,
                seq,
                f"effect {effect.idx} of event {seq} cannot be read: {exc}",
            )
        if type(value).__name__ != effect.type:
            return Finding(
                FindingKind.CORRUPT_PAYLOAD,
                cid,
                seq,
                f"effect {effect.idx} of event {seq} is stored as a {effect.type} but its "
                f"payload is a {type(value).__name__}",
            )
        decoded.append(value)
    same = tuple(decoded) == recomputed or [encode_effect(e) for e in decoded] == texts
    if not same and len(decoded) == len(recomputed):
        # A log of an older schema lacks the fields added since: compare the recomputed
        # effects as that schema recorded them.
        same = all(
            codec.as_recorded_by(new, codec.document_version(raw.payload)) == old
            for new, old, raw in zip(recomputed, decoded, recorded, strict=True)
        )
    if request_note is not None:
        return tuple(decoded), False, (request_note,)
    return tuple(decoded), same, ()
