"""A fingerprint of a conversation state, stored with every event.

Storing the full state after each event would cost O(size of state) per event (a
parent with 1000 children holds ~200 KB). Instead each event row records this short
string, and the conversation row holds a full snapshot refreshed now and then. Replay
recomputes the fingerprint after every folded event and compares: a mismatch means
the log and the reducer disagree (a reducer change broke replay, or the log is
corrupt), and is reported rather than silently producing a different state.

Two formats, told apart by their last token:

- version 1 (logs written before issue 10.14): the phase name and counters,
  ``"AwaitingSubAgents n9 r2 h5 s3 p2 f1 w0"``. It does not cover message text, so an
  edited model reply showed up only at the next model call.
- version 2 (written now): the same, then ``#`` and a 64-bit BLAKE2b digest of the
  *whole* state (``"... w0 #1f2e3d4c5b6a7988"``): every field of the canonical
  encoding, message text included. So a change to anything the reducer's output
  depends on is caught at the step it happens.

Cost: the history, which grows with the conversation, is hashed incrementally: each
message's digest is chained onto the digest of the history before it, and the chain
of the last history seen per conversation is kept, so a step hashes only the
messages it added (plus the rest of the state, without its history). A history that
is not an extension of the one kept (a fork, a rebuilt state) is rehashed once.

- version 3 (written now): the same counters, then ``##`` and a 64-bit digest of the
  whole state (``"... w0 ##1f2e3d4c5b6a7988"``) in which the current round's children
  are hashed item by item too. Version 2 encoded every pending and finished child on
  every step: a parent with N children paid O(N) JSON encoding per step (610 us per
  child outcome at N = 1000, 10.6 ms at N = 10000; ``bench/bench_fanin.py``). Here
  each child's digest is computed once, when the child first appears (a child object
  survives unchanged from step to step until the reducer replaces it), kept by object
  identity, and the step joins the digests in order: no encoding per child and step,
  only a lookup in C. Version 3 hashes texts without the schema version (``"v":N``)
  that documents start with, so a new schema version changes no digest; version 2
  hashed it, and is checked with the version of the event it was written with.

- version 4 (written since 2026-11-25): the same, then ``###`` and the digest, in
  which the state's large values that rarely change (its tool set, system prompt,
  sub-agent prompt and agent catalogue: 6 KB and more with the default tools, the same
  objects from step to step) are hashed once per object, kept by identity like the
  children, and the step hashes their digests: version 3 ran BLAKE2b over their text
  on every step (10 of a sub-agent's 16 us per digest).

- version 5 (written since 2026-11-26): the counters, then ``####`` and a 64-bit
  digest of the step's *content* (its event's and effects' stored documents without
  their schema version, ``content_digest``),
  and, at a step after which the conversation is at rest
  (Idle, Error, Completed, Failed; but not where an ended conversation's step stores
  its whole state as the snapshot), a space and the version-4 digest of the whole
  state: ``"Idle n4 r1 h2 s0 p0 f0 w0 ####0123456789abcdef fedcba9876543210"``. The
  whole-state digest was a fifth of a logged step's CPU (issue 11); what it checked at
  every step is now checked in two parts: an edit of the log (a reply's text, a tool
  call's arguments) changes the step's content, so the content digest still shows it
  at the step that holds it, and import copies fingerprints without recomputing them; a
  reducer that changes the state without changing an effect or a counter is seen
  where the conversation next comes to rest, or at the snapshot (see DESIGN.md, "The
  event log").

- version 6 (written since 2026-11-28, with the events-only log: migration 5): the
  counters, then ``#####`` and a 64-bit digest of the step's event as stored (its
  compact text without the schema version) and of its effects' type names, and the
  version-4 whole-state digest at rest as in version 5:
  ``"Idle n4 r1 h2 s0 p0 f0 w0 #####0123456789abcdef fedcba9876543210"``. The log no
  longer stores effects (they are the reducer's output, re-derived by replay), so
  their texts are no longer hashed: encoding them only to digest them was most of
  the cost version 5 kept. Their names are: a reducer that adds, drops or reorders an
  effect is still caught at the step.

- version 7 (written since 2026-12-07, issue 34): the counters, then ``######`` and
  three parts: a 64-bit digest of the event as stored and of every effect's type name
  and fields' compact texts (the effects' whole content); the state fields whose value
  the step changed (at seq 0: those not at their declared defaults; every one when
  the writer has not the state before the step), each as its index in
  ``Conversation``'s field order (2 hex digits) and a 32-bit digest computed by the
  field's type (``_compile_state_digests``: counters by value, texts by CRC-32, large
  shared values by a digest kept by identity, the history by its chain, the phase with
  its children by 64-child chunk, kept by the chunk's identity); and per effect
  its type name and a 16-bit digest of each field
  (``Idle n4 r1 h2 s0 p0 f0 w0 ######0123456789abcdef 0a1b2c3d4e,16... CallModel:1a2b3c4d``).
  Every field the reducer outputs is so compared at every step, and
  ``differences`` names the ones that differ (``state.usage_output``,
  ``effect 0 StartTimer.delay``). Version 6 compared an effect's type only, and the
  state whole only at rest: a changed timer delay verified identical, a changed token
  count was reported where the conversation next rested. No whole-state digest at
  rest any more: every state field is pinned at the step that changes it.

``matches(state, recorded)`` compares in the recorded format, so logs written with
versions 1 to 6 still verify.
"""

from __future__ import annotations

import contextlib
import hashlib
import operator
import struct
import sys
import threading
import typing
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, compress, repeat
from typing import Any

import attrs

from fanfold.db import codec
from fanfold.db.codec import (
    OBJECT_EFFECTS,
    document_version,
    encode,
    encode_state_without_history,
    encode_unversioned,
    field_emitters,
    field_names,
    field_texts,
)
from fanfold.db.errors import CodecError
from fanfold.statemachine import (
    AwaitingSubAgents,
    CancellingSubAgents,
    Children,
    Conversation,
    Effect,
    Idle,
    Limits,
    Message,
    ToolExecuting,
)
from fanfold.statemachine.children import PendingChild, Roster
from fanfold.statemachine.phases import ALL_PHASES

_DIGEST_SIZE = 8  # bytes: a 64-bit digest, 16 hex characters
_FORMAT_5_SINCE = 6  # the log schema that first wrote version-5 fingerprints
_EMPTY = b"\0" * _DIGEST_SIZE
_CACHE_LIMIT = 4096  # conversations whose history chain is kept


def summary(state: Conversation) -> str:
    """The version-1 fingerprint: phase name and counters, e.g.
    ``"AwaitingSubAgents n9 r2 h5 s3 p2 f1 w0"``.

    ``n`` next call number, ``r`` model rounds, ``h`` history length, ``s`` children
    spawned, ``p``/``f`` pending/finished children of the current round, ``w`` children
    written off.
    """
    phase = state.phase
    kind = type(phase)
    # Computed at every step verified: a type lookup, not a match on three classes.
    if kind in _WITH_CHILDREN:
        c = phase.children  # type: ignore[union-attr]
        pending, finished = len(c.pending), len(c.finished)
    else:
        pending = finished = 0
    return (
        f"{kind.__name__} n{state.next_call} r{state.rounds} h{len(state.history)}"
        f" s{state.spawned} p{pending} f{finished} w{len(state.written_off)}"
    )


_WITH_CHILDREN = frozenset((ToolExecuting, AwaitingSubAgents, CancellingSubAgents))


def fingerprint(state: Conversation) -> str:
    """The version-4 fingerprint: ``summary(state)`` and a digest of the whole state,
    e.g. ``"Idle n4 r1 h2 s0 p0 f0 w0 ###0123456789abcdef"`` (logs written
    2026-11-25; the digest is the state part of version 5)."""
    return f"{summary(state)} ###{digest_v4(state)}"


def canonical_text(stored: str, *, object_form: bool) -> str | None:
    """A stored event or effect document without its schema version: the text a
    content digest hashes. ``object_form``: the type is one the log keeps as an object
    document (``OBJECT_EFFECTS``).

    A compact document (``[6,"Type",...]``) is hashed as stored, its version left out:
    the log writes it once and never rewrites it, and an import of the current schema
    stores the value's compact form again, the same text. An object document of a type
    kept as one is the value's ``encode_unversioned`` text, which a later schema does
    not change (its new fields are written only away from their defaults). An object
    document of any other type is either an import of an *older* schema's export (one
    that wrote format 5 already), whose compact text at that schema cannot be rebuilt
    here (None: not checkable), or a text neither ``append`` nor import writes: hashed
    as it is, so it differs from any recorded digest (an effect rewritten in object
    form, or given an older version, does not escape the check)."""
    if stored.startswith("["):
        comma = stored.find(",")
        return "[" + stored[comma + 1 :] if comma > 0 else stored
    if object_form and stored.startswith('{"v":'):
        comma = stored.find(",")
        return "{" + stored[comma + 1 :] if comma > 0 else stored
    try:
        version = document_version(stored)
    except CodecError:
        return stored
    # Older than today's schema, but not older than the first log schema that wrote
    # format 5: only such a document can be a legitimate import; anything else (a
    # document "downgraded" to dodge the check) is hashed as it is, and differs.
    return None if _FORMAT_5_SINCE <= version < codec.SCHEMA_VERSION else stored


def content_digest(event_text: str, effects: Sequence[tuple[str, str]]) -> str | None:
    """A 64-bit BLAKE2b digest (hex) of one step's content: its event's and its
    effects' stored documents (``effects``: each effect's type name and text), in
    order, each without its schema version (``canonical_text``). None if a document
    cannot be put in its canonical form (an import of another schema's export)."""
    text = canonical_text(event_text, object_form=False)
    if text is None:
        return None
    h = hashlib.blake2b(text.encode("utf-8"), digest_size=_DIGEST_SIZE)
    for kind, stored in effects:
        text = canonical_text(stored, object_form=kind in OBJECT_EFFECTS)
        if text is None:
            return None
        h.update(b"\x1e")  # a separator no JSON text holds unescaped
        h.update(text.encode("utf-8"))
    return h.hexdigest()


def event_digest(event_text: str, effect_names: Sequence[str]) -> str | None:
    """The version-6 content digest (hex, 64 bits): BLAKE2b of the stored event
    document without its schema version (``canonical_text``) and of the type names of
    the effects the step produced, in order. None if the document cannot be put in its
    canonical form (an import of another schema's export)."""
    text = canonical_text(event_text, object_form=False)
    if text is None:
        return None
    # The names are ASCII identifiers; the separator is no JSON text's.
    return hashlib.blake2b(
        f"{text}\x1e{','.join(effect_names)}".encode(), digest_size=_DIGEST_SIZE
    ).hexdigest()


def step_fingerprint(
    state: Conversation,
    event_text: str,
    effects: Sequence[Effect],
    before: Conversation | None,
    *,
    whole: bool = False,
) -> str:
    """The current (version 7) fingerprint of a step that stored ``event_text`` (its
    compact document), produced ``effects`` and took ``before`` (None at seq 0) to
    ``state``: the counters, a 64-bit digest of the event and of every effect's whole
    content, a short digest of each state field whose value the step changed, and a
    short digest of each effect's every field (see the module docstring). ``whole``:
    list every state field, changed or not (what a writer that does not have the state
    before the step records: verify checks a listed field whatever the step did)."""
    comma = event_text.find(",")
    if not event_text.startswith("[") or comma < 0:
        raise CodecError("a step's event is not in the form the log stores")
    content, effect_part = _effects_v7("[" + event_text[comma + 1 :], effects)
    changes = _all_fields(state) if whole else state_changes(state, before)
    return f"{summary(state)}{_V7}{content} {_state_part(changes)} {effect_part}"


def step_fingerprint_v6(
    state: Conversation,
    event_text: str,
    effect_names: Sequence[str],
    *,
    snapshot: bool = False,
) -> str:
    """The version-6 fingerprint (logs written 2026-11-28 to 2026-12-07) of a step
    that stored ``event_text`` (its compact document), produced effects of types
    ``effect_names`` and left ``state``: the counters, the content digest and, when the
    state is at rest, the whole-state digest; but not for an ended conversation whose
    whole state the step stores as its snapshot (``snapshot``): nothing changes it
    after that, and verify compares the snapshot itself."""
    comma = event_text.find(",")
    if not event_text.startswith("[") or comma < 0:
        raise CodecError("a step's event is not in the form the log stores")
    # ``event_digest`` of a compact document, without the checks a stored one needs.
    content = hashlib.blake2b(
        f"[{event_text[comma + 1 :]}\x1e{','.join(effect_names)}".encode(),
        digest_size=_DIGEST_SIZE,
    ).hexdigest()
    if state.at_rest and not (snapshot and state.is_terminal):
        return f"{summary(state)} #####{content} {digest_v4(state)}"
    return f"{summary(state)} #####{content}"


def events_only(recorded: str) -> bool:
    """True if ``recorded`` is a version-6 or 7 fingerprint: its step's effects are not
    stored (the events-only log), replay re-derives them."""
    return " #####" in recorded


def _v5(state: Conversation, content: str, whole: bool) -> str:
    if whole:
        return f"{summary(state)} ####{content} {digest_v4(state)}"
    return f"{summary(state)} ####{content}"


def fingerprint_v3(state: Conversation) -> str:
    """The version-3 fingerprint (logs written 2026-11-24 to 2026-11-25)."""
    return f"{summary(state)} ##{digest(state)}"


def fingerprint_v2(state: Conversation, schema: int = 5) -> str:
    """The version-2 fingerprint (logs written before version 3): ``summary(state)`` and
    a digest of the whole state's encoding, children encoded on every call. ``schema``:
    the log schema that wrote it (its documents' ``v``, which the hashed text holds)."""
    return f"{summary(state)} #{digest_v2(state, schema)}"


def digest(state: Conversation) -> str:
    """A 64-bit BLAKE2b digest (hex) of the whole state: its encoding without history
    and children, the history's chained digest, and the children's item digests in
    order (see the module docstring)."""
    children = state.children
    rest_of = state
    kids = _EMPTY
    if children is not None and (children.pending or children.finished or children.rejected):
        # The phase with its children taken out; they are hashed item by item below.
        phase = state.phase
        assert isinstance(phase, ToolExecuting | AwaitingSubAgents | CancellingSubAgents)
        rest_of = state.evolve(phase=attrs.evolve(phase, children=_bare(children)))
        kids = _children_digest(state.id, children)
    # Without the leading '"v":N,': a new schema version must not change a digest.
    rest = "{" + encode_state_without_history(rest_of).split(",", 1)[1]
    h = hashlib.blake2b(rest.encode("utf-8"), digest_size=_DIGEST_SIZE)
    h.update(_histories.chain(state.id, state.history))
    h.update(kids)
    return h.hexdigest()


# The state's fields whose values are large and shared from step to step (and between
# the conversations of a tree): hashed once per object (``_large``), by identity.
_LARGE_FIELDS = ("tools", "system_prompt", "sub_agent_prompt", "agents")
_LARGE_BLANKS: dict[str, object] = {
    "tools": (),
    "system_prompt": "",
    "sub_agent_prompt": None,
    "agents": (),
}


def digest_v4(state: Conversation) -> str:
    """The version-4 digest: version 3's, but the large shared values are hashed by
    their kept digests (``_LARGE_FIELDS``) rather than their text on every step."""
    changes: dict[str, object] = dict(_LARGE_BLANKS)
    children = state.children
    kids = _EMPTY
    if children is not None and (children.pending or children.finished or children.rejected):
        phase = state.phase
        assert isinstance(phase, ToolExecuting | AwaitingSubAgents | CancellingSubAgents)
        changes["phase"] = attrs.evolve(phase, children=_bare(children))
        kids = _children_digest(state.id, children)
    rest = "{" + encode_state_without_history(state.evolve(**changes)).split(",", 1)[1]
    h = hashlib.blake2b(rest.encode("utf-8"), digest_size=_DIGEST_SIZE)
    h.update(_large.joined([getattr(state, name) for name in _LARGE_FIELDS]))
    h.update(_histories.chain(state.id, state.history))
    h.update(kids)
    return h.hexdigest()


def digest_v2(state: Conversation, schema: int = 5) -> str:
    """The version-2 digest: the whole state's encoding (children included) as log
    schema ``schema`` wrote it, and the history's chained digest."""
    # Version 2 hashed documents, which start with the schema version that wrote them;
    # a state's and a message's fields have not changed since schema 5 (schema 6
    # changed an effect), so only that number differs.
    rest = _as_written_by(encode_state_without_history(state), schema)
    h = hashlib.blake2b(rest.encode("utf-8"), digest_size=_DIGEST_SIZE)
    h.update(_histories_v2(schema).chain(state.id, state.history))
    return h.hexdigest()


def _as_written_by(document: str, schema: int) -> str:
    return f'{{"v":{schema},' + document.split(",", 1)[1]


_NO_CHILDREN = Children()


def _bare(children: Children) -> Children:
    """The round's children without the lists hashed item by item (``_children_digest``):
    what is left is the summary of context mode summary (schema 7), encoded with the
    rest of the state; without one, nothing (so older logs' digests are unchanged)."""
    return _NO_CHILDREN if children.summary is None else Children(summary=children.summary)


def _children_digest(key: str, children: Children) -> bytes:
    """The digest of a round's children: each list's length and its items' digests."""
    h = hashlib.blake2b(digest_size=_DIGEST_SIZE)
    lists: tuple[Iterable[object], ...] = (children.pending, children.finished, children.rejected)
    for slot, items in enumerate(lists):
        # Rosters as tuples: the digests of the last tuple seen are kept by identity.
        kept = items.as_tuple() if isinstance(items, Roster) else tuple(items)
        h.update(len(kept).to_bytes(8, "little"))
        h.update(_lists.joined((key, slot), kept))
    return h.digest()


def is_version_1(recorded: str) -> bool:
    """True if ``recorded`` is a version-1 fingerprint (no ``#`` digest)."""
    return " #" not in recorded


def version(recorded: str) -> int:
    """The format of a recorded fingerprint: 1 to 7."""
    if _V7 in recorded:
        return 7
    if " #####" in recorded:
        return 6
    if " ####" in recorded:
        return 5
    if " ###" in recorded:
        return 4
    if " ##" in recorded:
        return 3
    return 1 if is_version_1(recorded) else 2


def like(
    state: Conversation,
    recorded: str,
    event_payload: str | None = None,
    effects: Sequence[tuple[str, str]] | None = None,
    *,
    effect_names: Sequence[str] | None = None,
    derived: Sequence[Effect] | None = None,
    before: Conversation | None = None,
    stepwise: bool = False,
) -> str:
    """The fingerprint of ``state`` in the format of ``recorded``. A version-7
    fingerprint's content digest and effect part are computed from ``event_payload``
    and ``derived`` (the effects the step produced; without them, taken from
    ``recorded``); its state part lists, with their digests in ``state``, the fields
    ``recorded`` lists and, if ``stepwise`` (``before`` is the state before the step,
    None at seq 0), every field whose value the step changed: a field the recomputed
    step changes and the record does not list (or lists with another digest) makes it
    differ. Without ``stepwise`` only the listed fields are checked (rebuilding a
    state). A version-6
    fingerprint's content digest is computed from ``event_payload`` and
    ``effect_names`` (the types of the effects the step produced); without them it is
    taken from ``recorded``, as for version 5. A version-2
    fingerprint hashed the schema version its log wrote: that of ``event_payload``,
    the event recorded with it (schema 5 if not given). A version-5 fingerprint's
    content digest is computed from ``event_payload`` and ``effects`` (each stored
    effect's type name and text); without them, or when they cannot be put in
    canonical form (``canonical_text``), it is taken from ``recorded``, and only the
    state is compared: what rebuilding a state checks."""
    match version(recorded):
        case 7:
            return _like_v7(state, recorded, event_payload, derived, before, stepwise)
        case 6:
            digest_of_content = None
            if event_payload is not None and effect_names is not None:
                digest_of_content = event_digest(event_payload, effect_names)
            recorded_tail = recorded.split(" #####", 1)[1]
            if digest_of_content is None:
                digest_of_content = recorded_tail[: _DIGEST_SIZE * 2]
            if " " in recorded_tail:
                return f"{summary(state)} #####{digest_of_content} {digest_v4(state)}"
            return f"{summary(state)} #####{digest_of_content}"
        case 5:
            digest_of_content = None
            if event_payload is not None and effects is not None:
                digest_of_content = content_digest(event_payload, effects)
            recorded_tail = recorded.split(" ####", 1)[1]
            if digest_of_content is None:
                digest_of_content = recorded_tail[: _DIGEST_SIZE * 2]
            # Whether the step has a whole-state digest was the writer's choice (at
            # rest, but not an ended conversation's snapshot step): as recorded.
            return _v5(state, digest_of_content, " " in recorded_tail)
        case 4:
            return fingerprint(state)
        case 3:
            return fingerprint_v3(state)
        case 2:
            return fingerprint_v2(state, _schema_of(event_payload))
    return summary(state)


def _schema_of(event_payload: str | None) -> int:
    """The schema version of an event document; 5 if unknown or unreadable (the
    event's own decoding reports the damage)."""
    if event_payload is None:
        return 5
    try:
        return document_version(event_payload)
    except CodecError:
        return 5


def matches(
    state: Conversation,
    recorded: str,
    event_payload: str | None = None,
    effects: Sequence[tuple[str, str]] | None = None,
    *,
    effect_names: Sequence[str] | None = None,
    derived: Sequence[Effect] | None = None,
    before: Conversation | None = None,
    stepwise: bool = False,
) -> bool:
    """True if ``state`` has the fingerprint ``recorded`` (in its own format; see
    ``like`` for the other arguments)."""
    found = like(
        state,
        recorded,
        event_payload,
        effects,
        effect_names=effect_names,
        derived=derived,
        before=before,
        stepwise=stepwise,
    )
    return found == recorded


class _HistoryChains:
    """Per conversation: the last history hashed and the chained digest after each of
    its messages. Shared by threads (the writer's and replay's): an entry is replaced
    whole, never changed, so a race at worst hashes a history twice."""

    def __init__(self, text_of: Callable[[Message], str]) -> None:
        self._entries: dict[str, tuple[tuple[Message, ...], tuple[bytes, ...]]] = {}
        self._lock = threading.Lock()
        self._text_of = text_of

    def chain(self, key: str, history: tuple[Message, ...]) -> bytes:
        entry = self._entries.get(key)
        chained: tuple[bytes, ...] = ()
        if entry is not None:
            old, links = entry
            if old is history:
                return links[-1] if links else _EMPTY
            n = len(old)
            # The kept history is a prefix of this one. Tuple comparison in C: a step
            # reuses its predecessor's message objects, which compare by identity at
            # once; equal but distinct messages encode alike, so their links hold too.
            if n <= len(history) and history[:n] == old:
                chained = links
        last = chained[-1] if chained else _EMPTY
        added = []
        text_of = self._text_of
        for message in history[len(chained) :]:
            text = text_of(message).encode("utf-8")
            last = hashlib.blake2b(last + text, digest_size=_DIGEST_SIZE).digest()
            added.append(last)
        links = chained + tuple(added)
        with self._lock:
            if len(self._entries) >= _CACHE_LIMIT and key not in self._entries:
                self._entries.clear()
            self._entries[key] = (history, links)
        return links[-1] if links else _EMPTY

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_histories = _HistoryChains(encode_unversioned)
_v2_chains: dict[int, _HistoryChains] = {}


def _histories_v2(schema: int) -> _HistoryChains:
    """The history chains of version-2 fingerprints written by log schema ``schema``."""
    chains = _v2_chains.get(schema)
    if chains is None:
        chains = _v2_chains[schema] = _HistoryChains(
            lambda message: _as_written_by(encode(message), schema)
        )
    return chains


_ITEM_CACHE_LIMIT = 1 << 18  # child objects whose digest is kept
_MISS = b""  # what a lookup of an item not in the cache gives


class _ItemDigests:
    """The digest of each child object (PendingChild, FinishedChild, RejectedTask) seen
    recently, by identity. The object is kept alive beside its digest, so its id cannot
    be reused by another object while the entry exists. A step's lookups run in C
    (``map`` over ``id`` and ``dict.get``): only a child new to the cache is encoded.
    Shared by threads: entries are only added or the whole cache cleared, so a race at
    worst encodes an item twice."""

    def __init__(self) -> None:
        self._digests: dict[int, bytes] = {}
        self._alive: dict[int, object] = {}

    def joined(self, items: Sequence[object]) -> bytes:
        # A miss reads as the empty digest: the join is then short by 8 bytes a miss.
        digests = list(map(self._digests.get, map(id, items), repeat(_MISS)))
        joined = b"".join(digests)
        missing = len(items) - len(joined) // _DIGEST_SIZE
        if not missing:
            return joined
        if len(self._digests) + missing > _ITEM_CACHE_LIMIT:
            self.clear()
        index = -1
        for _ in range(missing):
            # list.index finds the miss marker by identity first; a digest differs from
            # it by length at once: a scan in C.
            index = digests.index(_MISS, index + 1)
            item = items[index]
            self._alive[id(item)] = item
            self._digests[id(item)] = digests[index] = _digest_of(item)
        return b"".join(digests)

    def clear(self) -> None:
        # Digests first: a lookup never finds a digest whose object is no longer kept.
        self._digests = {}
        self._alive = {}


_items = _ItemDigests()


class _ListDigests:
    """Per conversation and list (pending, finished, rejected): the last tuple of
    children seen and its items' digests. A step changes one of them by one item: a
    child appended (it finished), removed (it finished), or replaced (it started).
    Found by comparing identities in C, those reuse the kept digests; anything else
    asks ``_items``. Shared by threads like ``_HistoryChains``."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, int], tuple[tuple[object, ...], list[bytes]]] = {}
        self._lock = threading.Lock()

    def joined(self, key: tuple[str, int], items: tuple[object, ...]) -> bytes:
        entry = self._entries.get(key)
        digests = None
        if entry is not None:
            old, old_digests = entry
            if old is items:
                return b"".join(old_digests)
            digests = _one_change(old, old_digests, items)
        if digests is None:
            joined = _items.joined(items)
            digests = [joined[i : i + _DIGEST_SIZE] for i in range(0, len(joined), _DIGEST_SIZE)]
        with self._lock:
            if len(self._entries) >= _CACHE_LIMIT and key not in self._entries:
                self._entries.clear()
            self._entries[key] = (items, digests)
        return b"".join(digests)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def _one_change(
    old: tuple[object, ...], old_digests: list[bytes], new: tuple[object, ...]
) -> list[bytes] | None:
    """The digests of ``new`` if it is ``old`` with one item appended, removed or
    replaced (each checked whole, by identity, in C); None otherwise."""
    n, m = len(old), len(new)
    if m == n + 1:
        if new[:n] != old:  # equal items compare by identity first: a scan in C
            return None
        return [*old_digests, _digest_of(new[n])]
    # The first position where they differ (or the end of the shorter one).
    same = list(map(operator.is_, old, new))
    first = same.index(False) if False in same else min(n, m)
    if m == n - 1:
        if new[first:] != old[first + 1 :]:
            return None
        return old_digests[:first] + old_digests[first + 1 :]
    if m == n and first < n:
        if new[first + 1 :] != old[first + 1 :]:
            return None
        return [*old_digests[:first], _digest_of(new[first]), *old_digests[first + 1 :]]
    return None


def _digest_of(item: object) -> bytes:
    text = encode_unversioned(item).encode("utf-8")
    return hashlib.blake2b(text, digest_size=_DIGEST_SIZE).digest()


_lists = _ListDigests()


class _LargeDigests:
    """The digest of each large shared value (a tool set, a prompt, an agent
    catalogue) seen recently, by identity, the value kept alive beside it (so its id is
    not reused while the entry exists). Shared by threads: entries are only added or the
    whole cache cleared."""

    _LIMIT = 4096

    def __init__(self) -> None:
        self._digests: dict[int, bytes] = {}
        self._alive: dict[int, object] = {}

    def joined(self, values: list[object]) -> bytes:
        digests = self._digests
        out = []
        for value in values:
            found = digests.get(id(value))
            if found is None:
                found = _large_digest(value)
                if len(digests) >= self._LIMIT:
                    self.clear()
                    digests = self._digests
                self._alive[id(value)] = value
                digests[id(value)] = found
            out.append(found)
        return b"".join(out)

    def clear(self) -> None:
        self._digests = {}
        self._alive = {}


def _large_digest(value: object) -> bytes:
    """The digest of a large value: a text, None, or a tuple of attrs values (each
    encoded without the schema version), kinds and lengths told apart."""
    h = hashlib.blake2b(digest_size=_DIGEST_SIZE)
    if value is None:
        h.update(b"n")
    elif isinstance(value, str):
        h.update(b"s")
        h.update(value.encode("utf-8", "surrogatepass"))
    else:
        assert isinstance(value, tuple), type(value)
        h.update(b"t" + len(value).to_bytes(8, "little"))
        for item in value:
            text = encode_unversioned(item).encode("utf-8")
            h.update(len(text).to_bytes(8, "little"))
            h.update(text)
    return h.digest()


_large = _LargeDigests()


def clear_cache() -> None:
    """Forget the kept history chains and child digests (benchmarks: a cold start)."""
    _histories.clear()
    for chains in list(_v2_chains.values()):
        chains.clear()
    _items.clear()
    _lists.clear()
    _large.clear()
    _state_digests.clear()
    _histories_v7.clear()
    _int_hexes.clear()
    _large_hexes.clear()
    _large_hexes8.clear()
    _text_hexes.clear()
    _shared_str_hexes.clear()
    _item_bytes.clear()
    _chunks.clear()
    _children_hexes.clear()


# ---------------------------------------------------------------- version 7

_V7 = " ######"
COUNTER_LABELS = {
    "n": "next call number",
    "r": "model rounds",
    "h": "history length",
    "s": "children spawned",
    "p": "pending children",
    "f": "finished children",
    "w": "children written off",
}
"""What each counter of a fingerprint (``summary``) counts, by its letter."""
CONTENT_LABEL = "content digest (the step's event and its effects, every field)"
"""How a report names a version-7 fingerprint's content digest."""
_STATE_FIELDS = field_names(Conversation)
_FIELD_WIDTH = 8  # hex digits of a state field's digest (32 bits)
_EFFECT_FIELD_WIDTH = 4  # hex digits of an effect field's digest (16 bits)
# A 32-bit digest as 8 hex digits: ``n.to_bytes(4, "big").hex()``, a third of the
# instructions of ``"{:08x}".format(n)`` (no format spec to parse), the same text.
_CACHE_OF_VALUES = 4096  # small values (counters, timer numbers) whose digest is kept


# Each state field is digested by its type, in one compiled function per class
# (``_compile_state_digests``): counters and timer numbers by value (kept), texts by
# CRC-32 of their bytes, the large shared values by identity (``_large_hex``), the
# history by its chain (``_histories_v7``), the phase by ``_phase_hex`` (its children
# by chunk: ``_children_digest``), any other field by CRC-32 of its compact text.


def _crc_hex(text: str) -> str:
    return zlib.crc32(text.encode("utf-8", "surrogatepass")).to_bytes(4, "big").hex()


_NULL_HEX = _crc_hex("null")
_int_hexes: dict[object, str] = {}


_text_hexes: dict[str, str] = {}
_SHORT_TEXT = 64  # the longest compact text whose digest ``_text_hex`` keeps


def _text_hex(text: str) -> str:
    """``_crc_hex(text)``, kept by value for a short text (a field with few distinct
    values, as a timeout: the same str object for every conversation that keeps it)."""
    found = _text_hexes.get(text)
    if found is None:
        found = _crc_hex(text)
        if len(text) <= _SHORT_TEXT:
            if len(_text_hexes) >= _CACHE_OF_VALUES:
                _text_hexes.clear()
            _text_hexes[text] = found
    return found


# The text fields whose values a tree's conversations share (a child's parent and
# root, the working directory): their digests kept by value.
_TREE_TEXT_FIELDS = frozenset(("parent_id", "root_id", "cwd"))
_shared_str_hexes: dict[str | None, str] = {}


def _shared_str_hex(value: str | None) -> str:
    """``_str_hex(value)``, kept by value (``_TREE_TEXT_FIELDS``)."""
    found = _str_hex(value)
    if len(_shared_str_hexes) >= _CACHE_OF_VALUES:
        _shared_str_hexes.clear()
    _shared_str_hexes[value] = found
    return found


def _int_hex(value: int | None) -> str:
    """A counter's (or an optional timer number's) digest: CRC-32 of its JSON text,
    kept by value (a step's counters are few distinct values)."""
    found = _int_hexes.get(value)
    if found is not None:
        return found
    if type(value) is not int and value is not None:
        raise CodecError(f"expected an int, got {type(value).__name__}")
    found = _NULL_HEX if value is None else _crc_hex(int.__repr__(value))
    if len(_int_hexes) >= _CACHE_OF_VALUES:
        _int_hexes.clear()
    _int_hexes[value] = found
    return found


def _str_hex(value: str | None) -> str:
    """A text field's digest: CRC-32 of its bytes (``null``'s for None)."""
    if value is None:
        return _NULL_HEX
    if type(value) is not str:
        raise CodecError(f"expected a str, got {type(value).__name__}")
    return zlib.crc32(value.encode("utf-8", "surrogatepass")).to_bytes(4, "big").hex()


class _ByIdentity:
    """Digests of immutable values kept by identity, each value kept alive beside its
    digest (so its id is not reused while the entry lives); cleared whole at its limit.
    Shared by threads: entries are only added or the whole cache replaced, so a race at
    worst computes a digest twice."""

    def __init__(self, compute: Callable[[object], str], limit: int) -> None:
        self._compute = compute
        self._limit = limit
        self.entries: dict[int, tuple[object, str]] = {}

    def digest(self, value: object) -> str:
        entry = self.entries.get(id(value))
        if entry is not None and entry[0] is value:
            return entry[1]
        found = self._compute(value)
        if len(self.entries) >= self._limit:
            self.entries = {}
        self.entries[id(value)] = (value, found)
        return found

    def clear(self) -> None:
        self.entries = {}


def _large_text_digest(value: object) -> str:
    """The 64-bit digest (hex) of a large value: ``_large_digest``'s (a text, None, a
    tuple of values), or of any other value's compact text (limits, permissions)."""
    if value is None or isinstance(value, str | tuple):
        return _large_digest(value).hex()
    text = codec.compact_emitter(type(value))(value)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=_DIGEST_SIZE).hexdigest()


# The large values a state or an effect carries from step to step and from parent to
# child (tool set, prompts, agent catalogue, limits, permissions, a child's context):
# digested once per object.
_large_hexes = _ByIdentity(_large_text_digest, 4096)
_large_hex = _large_hexes.digest
# A state's large fields by their first 8 hex digits, kept too: a slice per digest was
# a new str object, which each conversation's kept digests (``_StateDigests``) held
# once per large field (~340 B per waiting sub-agent).
_large_hexes8 = _ByIdentity(lambda value: _large_hex(value)[:8], 4096)
_LARGE_STATE_FIELDS = frozenset(
    ("tools", "system_prompt", "sub_agent_prompt", "agents", "limits", "permissions")
)
_LARGE_EFFECT_FIELDS = frozenset((*_LARGE_STATE_FIELDS, "context"))


# ---- the phase, its children by chunk


class _ItemBytes:
    """The CRC-32 (4 bytes) of each child object (PendingChild, FinishedChild), by
    identity, the object kept alive beside it; a hole (None) has the empty digest. A
    chunk's digests are looked up in C: only a child new here is encoded."""

    def __init__(self) -> None:
        self.digests: dict[int, bytes] = {id(None): b""}
        self.alive: dict[int, object] = {}
        # How many replays (``texts_kept``) are under way: they memoise a pending
        # child's compact text like any other value's.
        self.keeping = 0
        self.lock = threading.Lock()

    def each(self, chunk: tuple[object, ...]) -> tuple[bytes, ...]:
        """The digest of each item of ``chunk``, in order."""
        found = list(map(self.digests.get, map(id, chunk)))
        if None in found:
            missing = found.count(None)
            if len(self.digests) + missing > _ITEM_CACHE_LIMIT:
                self.clear()
            index = -1
            for _ in range(missing):
                index = found.index(None, index + 1)
                item = chunk[index]
                # CRC-32 (4 bytes): one C call, no hash object. The roster's CRC over
                # these detects any change confined to one item's 4 bytes.
                # A live pending child's texts are not memoised (a waiting sub-agent's
                # heap, issue 21): its digest is kept here, and no snapshot holds it
                # again (it ends finished or a hole). A replay memoises them: the
                # child's finished item reuses its spec's text (``texts_kept``).
                unkept = type(item) is PendingChild and not self.keeping
                emit = _unkept if unkept else codec.compact_text
                text = emit(item).encode("utf-8")
                digest = zlib.crc32(text).to_bytes(4, "little")
                self.alive[id(item)] = item
                self.digests[id(item)] = found[index] = digest
        return tuple(found)  # type: ignore[arg-type]

    def clear(self) -> None:
        self.digests = {id(None): b""}
        self.alive = {}


_unkept = codec.compact_text_unkept
_item_bytes = _ItemBytes()


@contextlib.contextmanager
def texts_kept() -> Iterator[None]:
    """Within it, a pending child's roster item memoises its compact text as every other
    value does. For a replay, which digests the child's finished item next from the
    same spec (its text emitted again cost verify 1.4 k instructions per event); a live
    runtime does not keep them (a waiting sub-agent's heap: issue 21's 4 KiB). The
    digests are the same either way."""
    with _item_bytes.lock:
        _item_bytes.keeping += 1
    try:
        yield
    finally:
        with _item_bytes.lock:
            _item_bytes.keeping -= 1


class _Chunks:
    """Each roster chunk's item digests and their join, by identity (the chunk kept
    alive beside them, so its id is not reused while its entry lives), and per roster
    lineage (a conversation's pending or finished children) its last chunks.

    A step that finishes one child makes one new chunk in each roster: in the pending
    one the child became a hole, in the finished one it was appended. The new chunk is
    compared with the chunk at its place in the lineage's last roster (by identity, in
    C), and when one item was replaced or items were appended, only those items are
    looked up: a chunk of 64 is not read item by item. Anything else (a chunk seen for
    the first time, other changes) reads the chunk whole (``_ItemBytes``)."""

    def __init__(self) -> None:
        self.items: dict[int, tuple[bytes, ...]] = {}
        self.joined: dict[int, bytes] = {}
        self.alive: dict[int, object] = {}
        self.last: dict[object, tuple[tuple[object, ...], ...]] = {}

    def digest(self, lineage: object, items: Iterable[object]) -> int:
        """A roster's (or a tuple's) digest: CRC-32 of its items' CRCs in order, holes
        left out, so the same however the items are chunked."""
        chunks = items.chunks() if isinstance(items, Roster) else (tuple(items),)
        # The kept chunks looked up in C; only a chunk new here is read.
        found = list(map(self.joined.get, map(id, chunks)))
        if None in found:
            if len(self.joined) >= _CACHE_LIMIT:
                self.clear()
            before = self.last.get(lineage, ())
            for index, chunk in enumerate(chunks):
                if found[index] is None:
                    old = before[index] if index < len(before) else None
                    each = self._patched(chunk, old) if old is not None else None
                    if each is None:
                        each = _item_bytes.each(chunk)
                    self.alive[id(chunk)] = chunk
                    self.items[id(chunk)] = each
                    self.joined[id(chunk)] = found[index] = b"".join(each)
            if len(self.last) >= _CACHE_LIMIT:
                self.last = {}
            self.last[lineage] = chunks
        return zlib.crc32(b"".join(found))  # type: ignore[arg-type]

    def _patched(
        self, chunk: tuple[object, ...], old: tuple[object, ...]
    ) -> tuple[bytes, ...] | None:
        """``chunk``'s item digests from ``old``'s, if ``chunk`` is ``old`` with items
        appended or with one item replaced; None otherwise (or if ``old`` is not kept).
        Tuples compare item by item by identity first, so the unchanged items cost no
        equality test; an item equal but not identical has the same digest anyway."""
        kept = self.items.get(id(old))
        if kept is None or self.alive.get(id(old)) is not old:
            return None
        size = len(old)
        if len(chunk) > size:
            if chunk[:size] != old:
                return None
            return kept + _item_bytes.each(chunk[size:])
        if len(chunk) != size:
            return None
        try:
            at = list(map(operator.is_, chunk, old)).index(False)
        except ValueError:  # the same items in a new tuple
            return kept
        if chunk[at + 1 :] != old[at + 1 :]:
            return None
        return (*kept[:at], *_item_bytes.each(chunk[at : at + 1]), *kept[at + 1 :])

    def clear(self) -> None:
        self.items = {}
        self.joined = {}
        self.alive = {}
        self.last = {}


_chunks = _Chunks()


def _children_text_digest(key: str, children: Children) -> str:
    """The digest (8 hex digits) of a round's children: CRC-32 of each roster's digest
    (``_Chunks``, 4 bytes each), then of the rejected tasks' and the summary's compact
    texts. ``key``: the conversation's id (the rosters' lineage)."""
    rosters = _ROSTERS.pack(
        _chunks.digest((key, 0), children.pending), _chunks.digest((key, 1), children.finished)
    )
    emit_rejected, emit_summary = _children_emitters()
    rest = f"{emit_rejected(children.rejected)}\x1f{emit_summary(children.summary)}"
    crc = zlib.crc32(rest.encode("utf-8", "surrogatepass"), zlib.crc32(rosters))
    return crc.to_bytes(4, "big").hex()


_ROSTERS = struct.Struct(">II")


class _ChildrenDigests:
    """Each round's children digest by identity (the ``Children`` kept alive beside it);
    cleared whole at its limit. Shared by threads like ``_ByIdentity``."""

    def __init__(self) -> None:
        self.entries: dict[int, tuple[object, str]] = {}

    def digest(self, key: str, children: Children) -> str:
        entry = self.entries.get(id(children))
        if entry is not None and entry[0] is children:
            return entry[1]
        found = _children_text_digest(key, children)
        if len(self.entries) >= _CACHE_LIMIT:
            self.entries = {}
        self.entries[id(children)] = (children, found)
        return found

    def clear(self) -> None:
        self.entries = {}


_children_hexes = _ChildrenDigests()
_children_hex = _children_hexes.digest
_CHILDREN_EMITTERS: list[tuple[Callable[[Any], str], Callable[[Any], str]]] = []


def _children_emitters() -> tuple[Callable[[Any], str], Callable[[Any], str]]:
    """The compact emitters of ``Children.rejected`` and ``.summary`` (made on first
    use: importing ``fanfold.db`` compiles no emitter)."""
    if not _CHILDREN_EMITTERS:
        emitters = dict(zip(field_names(Children), field_emitters(Children), strict=True))
        _CHILDREN_EMITTERS.append((emitters["rejected"], emitters["summary"]))
    return _CHILDREN_EMITTERS[0]


def _compile_phase_digest(cls: type[object]) -> Callable[[str, object], str]:
    """``(conversation id, phase) -> digest`` for one phase class: CRC-32 of its compact
    text, or, for a phase with children, of its other fields' compact texts and its
    children's digest (``_children_hex``: kept by identity, rosters by chunk)."""
    names = field_names(cls)
    if "children" not in names:
        emit = codec.compact_emitter(cls)
        crc32 = zlib.crc32
        return lambda key, phase: (
            crc32(emit(phase).encode("utf-8", "surrogatepass")).to_bytes(4, "big").hex()
        )
    namespace: dict[str, object] = {"_crc_hex": _crc_hex, "_children_hex": _children_hex}
    parts = [repr(cls.__name__)]
    for index, (name, emitter) in enumerate(zip(names, field_emitters(cls), strict=True)):
        if name == "children":
            parts.append("_children_hex(k, p.children)")
        else:
            namespace[f"_e{index}"] = emitter
            parts.append(f"_e{index}(p.{name})")
    source = f"def digest(k, p):\n    return _crc_hex('\\x1f'.join(({', '.join(parts)},)))\n"
    where = f"<fanfold fingerprint phase digest of {cls.__name__}>"
    exec(compile(source, where, "exec"), namespace)
    digest: Callable[[str, object], str] = namespace["digest"]  # type: ignore[assignment]
    return digest


# Each phase class's digest function, compiled on first use.
_PHASE_DIGESTS: dict[type[object], Callable[[str, object], str]] = {}
_PHASES = frozenset(ALL_PHASES)


def _phase_hex(key: str, phase: object) -> str:
    """A phase's digest in the conversation ``key`` (its rosters' lineage)."""
    digest = _PHASE_DIGESTS.get(type(phase))
    if digest is None:
        if type(phase) not in _PHASES:
            raise CodecError(f"not a phase: {type(phase).__name__}")
        digest = _PHASE_DIGESTS[type(phase)] = _compile_phase_digest(type(phase))
    return digest(key, phase)


# ---- the state, one compiled function


class _CrcChains:
    """Version 7's history digest: CRC-32 chained over each message's compact text
    (memoised on the message: the snapshot comparison at a conversation's end reuses
    it), so the same as the CRC-32 of the history's texts end to end (a compact text is
    a JSON array: they join unambiguously). Per conversation, the last history digested
    and the CRC after each of its messages: a step digests only the messages it added.
    Shared by threads like ``_HistoryChains``: an entry is replaced whole (one dict
    assignment), so a race at worst digests a history twice."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[tuple[Message, ...], tuple[int, ...]]] = {}

    def chain(self, key: str, history: tuple[Message, ...]) -> int:
        entries = self.entries
        entry = entries.get(key)
        links: tuple[int, ...] = ()
        if entry is not None:
            old, links = entry
            if old is history:
                return links[-1] if links else 0
            n = len(old)
            # The kept history is a prefix of this one (compared in C: a step reuses its
            # predecessor's message objects, equal at once by identity).
            if not (n <= len(history) and history[:n] == old):
                links = ()
        crc = links[-1] if links else 0
        added = []
        for message in history[len(links) :]:
            crc = zlib.crc32(codec.compact_text(message).encode("utf-8"), crc)
            added.append(crc)
        if added:
            links += tuple(added)
        if len(entries) >= _CACHE_LIMIT and key not in entries:
            self.entries = entries = {}
        entries[key] = (history, links)
        return crc

    def clear(self) -> None:
        self.entries = {}


def _history_hex(key: str, history: tuple[Message, ...]) -> str:
    return _histories_v7.chain(key, history).to_bytes(4, "big").hex()


def _compile_state_digests() -> tuple[
    Callable[[Conversation, Conversation, list[str], list[str]], None],
    Callable[[Conversation], list[str]],
]:
    """Compile, for ``Conversation``, ``changes(s, b, d, out)``: for each field whose
    value ``s`` holds another object than ``b``, its digest in ``s``; if that differs
    from ``d`` (``b``'s digests) it is written into ``d`` and ``out`` gets
    ``"<index as 2 hex digits><digest>"``; and ``every(s)``: every field's digest."""
    hints = typing.get_type_hints(Conversation)
    namespace: dict[str, object] = {
        "_int_hex": _int_hex,
        "_ih": _int_hexes,
        "_crc32": zlib.crc32,
        "_str_hex": _str_hex,
        "_large_hex": _large_hex,
        "_history_hex": _history_hex,
        "_phase_hex": _phase_hex,
        "_crc_hex": _crc_hex,
        "_text_hex": _text_hex,
        "_sh": _shared_str_hexes,
        "_shared_str_hex": _shared_str_hex,
        "_large_hex8": _large_hexes8.digest,
    }
    expressions = []
    emitters = field_emitters(Conversation)
    for index, name in enumerate(_STATE_FIELDS):
        hint = hints[name]
        if name == "history":
            expression = "_history_hex(s.id, {v})"
        elif name == "phase":
            expression = "_phase_hex(s.id, {v})"
        elif name in _LARGE_STATE_FIELDS:
            expression = "_large_hex8({v})"
        elif hint in (int, int | None):
            # The kept digest looked up inline (no call), computed by ``_int_hex``
            # on a miss (which also refuses a non-int).
            expression = "(_ih.get({v}) or _int_hex({v}))"
        elif name in _TREE_TEXT_FIELDS:
            # Kept by value: every conversation of a tree holds the same few (a
            # digest str per conversation was ~57 B each of a waiting sub-agent).
            expression = "(_sh.get({v}) or _shared_str_hex({v}))"
        elif hint in (str, str | None):
            expression = (
                "(_crc32({v}.encode('utf-8', 'surrogatepass')).to_bytes(4, 'big').hex()"
                " if type({v}) is str else _str_hex({v}))"
            )
        else:
            namespace[f"_e{index}"] = emitters[index]
            expression = f"_text_hex(_e{index}({{v}}))"
        expressions.append(expression)
    lines = ["def changes(s, b, d, out):"]
    for index, (name, expression) in enumerate(zip(_STATE_FIELDS, expressions, strict=True)):
        lines += [
            f"    v = s.{name}",
            f"    if v is not b.{name}:",
            f"        x = {expression.format(v='v')}",
            f"        if x != d[{index}]:",
            f"            d[{index}] = x",
            f"            out.append('{index:02x}' + x)",
        ]
    # ``every`` builds its list as one literal: no append per field.
    lines.append("def every(s):")
    lines.append("    return [")
    for name, expression in zip(_STATE_FIELDS, expressions, strict=True):
        lines.append(f"        {expression.format(v='s.' + name)},")
    lines.append("    ]")
    source = "\n".join(lines) + "\n"
    exec(compile(source, "<fanfold fingerprint state digests>", "exec"), namespace)
    return namespace["changes"], namespace["every"]  # type: ignore[return-value]


_histories_v7 = _CrcChains()
_Changes = Callable[[Conversation, Conversation, list[str], list[str]], None]
_Every = Callable[[Conversation], list[str]]


def _build_state_digests() -> None:
    """Compile the state's digest functions into ``_state_changes`` and ``_state_every``
    (on first use: compiling them runs the codec's field emitters, which importing
    ``fanfold.db`` must not pay for; issue 36)."""
    global _state_changes, _state_every
    _state_changes, _state_every = _compile_state_digests()


def _changes_stand_in(s: Conversation, b: Conversation, d: list[str], out: list[str]) -> None:
    _build_state_digests()
    _state_changes(s, b, d, out)


def _every_stand_in(s: Conversation) -> list[str]:
    _build_state_digests()
    return _state_every(s)


_state_changes: _Changes = _changes_stand_in
_state_every: _Every = _every_stand_in


def _default_digests() -> tuple[str | None, ...]:
    """Each field's digest at its declared default (None: a field without one)."""
    probe = Conversation(
        id="",
        parent_id=None,
        root_id="",
        depth=0,
        cwd="",
        task=None,
        system_prompt="",
        model=None,
        limits=Limits(),
        tools=(),
        history=(),
        phase=Idle(),
    )
    every = _state_every(probe)
    out: list[str | None] = []
    for index, field in enumerate(attrs.fields(Conversation)):
        default: object = getattr(field, "default", attrs.NOTHING)
        without = default is attrs.NOTHING or isinstance(default, attrs.Factory)  # type: ignore[arg-type]
        out.append(None if without else every[index])
    return tuple(out)


# Made on first use: computing them runs the codec's emitters, which importing
# ``fanfold.db`` must not compile (issue 36: ``ls`` and ``show`` encode nothing).
_defaults_v7: list[tuple[str | None, ...]] = []


def _defaults() -> tuple[str | None, ...]:
    if not _defaults_v7:
        _defaults_v7.append(_default_digests())
    return _defaults_v7[0]


class _StateDigests:
    """Per conversation: the last state whose field digests were computed and their
    digests. A step's fields are compared with its predecessor's by identity (in the
    compiled ``_state_changes``): only a field the reducer replaced is digested again.
    Shared by threads like ``_HistoryChains``: an entry is replaced whole."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[Conversation, list[str]]] = {}

    def clear(self) -> None:
        self.entries = {}


_state_digests = _StateDigests()


def _remember(state: Conversation, digests: list[str]) -> None:
    entries = _state_digests.entries
    if state.at_rest:
        # A conversation at rest keeps nothing here: an ended tree leaves no state
        # behind it (test_runtime_lifecycle), and a turn that starts again digests
        # its first step's predecessor whole, once.
        entries.pop(state.id, None)
        return
    if len(entries) >= _CACHE_LIMIT and state.id not in entries:
        _state_digests.entries = entries = {}
    entries[state.id] = (state, digests)


_INDEX_HEX = tuple(f"{index:02x}" for index in range(len(_STATE_FIELDS)))


def _all_fields(state: Conversation) -> list[str]:
    digests = _state_every(state)
    _remember(state, digests)
    return list(map(operator.add, _INDEX_HEX, digests))


def state_changes(state: Conversation, before: Conversation | None) -> list[str]:
    """The fields (by index in ``Conversation``'s declaration order) whose value differs
    between ``before`` and ``state``, each as ``"<index, 2 hex digits><digest in
    state>"``; at seq 0 (``before`` None) those whose digest differs from their declared
    default's (every field without a default): seq 0 as a step from a state of
    defaults."""
    if before is None:
        digests = _state_every(state)
        _remember(state, digests)
        # The fields off their defaults, picked and prefixed in C loops.
        off = list(map(operator.ne, digests, _defaults()))
        return list(map(operator.add, compress(_INDEX_HEX, off), compress(digests, off)))
    entry = _state_digests.entries.get(state.id)
    # The predecessor's digests, if it is the state last digested here.
    kept = entry is not None and entry[0] is before
    digests = entry[1].copy() if kept and entry is not None else _state_every(before)
    out: list[str] = []
    _state_changes(state, before, digests, out)
    _remember(state, digests)
    return out


def _state_part(changes: list[str]) -> str:
    return ",".join(changes) or "-"


def _effect_texts(cls: type[object]) -> Callable[[object], list[str]]:
    """``effect -> [text of each field]`` for one effect class: the compact text, or a
    large value's kept digest (``_large_hex``)."""
    names = field_names(cls)
    overrides: dict[str, Callable[[Any], str]] = {
        name: _large_hex for name in names if name in _LARGE_EFFECT_FIELDS
    }
    return codec.compile_field_texts(cls, overrides)


_EFFECT_TEXTS: dict[type[object], Callable[[object], list[str]]] = {}


def _texts_of(effect: Effect) -> list[str]:
    cls = type(effect)
    texts = _EFFECT_TEXTS.get(cls)
    if texts is None:
        if codec.effect_class(cls.__name__) is not cls:
            raise CodecError(f"cannot encode {cls.__qualname__}: not an effect")
        texts = _EFFECT_TEXTS[cls] = _effect_texts(cls)
    try:
        return texts(effect)
    except (TypeError, ValueError, AttributeError, RecursionError):
        # The codec's own words for a value it cannot encode (a non-finite number...).
        return field_texts(effect)


def _effects_v7(
    event_text: str, effects: Sequence[Effect], recorded: tuple[str, str] | None = None
) -> tuple[str, str]:
    """The content digest (64 bits, hex) of an event's canonical text and its effects'
    field texts (a large value's by its kept digest), and the effects' part of the
    fingerprint: per effect its type name, ``:`` and a 16-bit digest of each field's
    text. ``recorded``: the content digest and effect part a step recorded; if the
    content digest is the same, the effect part is too (it digests the same texts) and
    is not computed."""
    if not effects:
        digest = hashlib.blake2b(event_text.encode("utf-8"), digest_size=_DIGEST_SIZE)
        return digest.hexdigest(), "-"
    parts = [event_text]
    each = []
    for effect in effects:
        texts = _texts_of(effect)
        each.append(texts)
        parts.append(type(effect).__name__)
        parts += texts
    # One text, one hash: the separator is no JSON text's (a field's text never holds
    # it unescaped), and each effect starts with its type name, so the split is unique
    # given the field counts of the types.
    text = "\x1f".join(parts).encode("utf-8")
    content = hashlib.blake2b(text, digest_size=_DIGEST_SIZE).hexdigest()
    if recorded is not None and recorded[0] == content:
        return recorded
    # CRC-32 of every field's text of every effect, cut to 16 bits, as one hex text for
    # the whole step (C loops, no Python-level work per field), then cut per effect.
    crcs = map(zlib.crc32, map(str.encode, chain.from_iterable(each)))
    digits = array("H", map(operator.and_, crcs, repeat(0xFFFF)))
    if sys.byteorder != "little":
        digits.byteswap()
    hexed = digits.tobytes().hex()
    tokens = []
    at = 0
    for effect, texts in zip(effects, each, strict=True):
        end = at + 4 * len(texts)
        tokens.append(f"{type(effect).__name__}:{hexed[at:end]}")
        at = end
    return content, ",".join(tokens)


def _like_v7(
    state: Conversation,
    recorded: str,
    event_payload: str | None,
    derived: Sequence[Effect] | None,
    before: Conversation | None,
    stepwise: bool,
) -> str:
    """``like`` for a version-7 fingerprint (see there)."""
    tail = recorded.split(_V7, 1)[1].split(" ")
    if len(tail) != 3:
        return f"{summary(state)}{_V7}(not a version-7 fingerprint: {recorded!r})"
    content, state_part, effect_part = tail
    if event_payload is not None and derived is not None:
        text = canonical_text(event_payload, object_form=False)
        if text is not None:
            content, effect_part = _effects_v7(text, derived, (content, effect_part))
    fields: dict[int, str] = {}
    if stepwise:
        changes = state_changes(state, before)
        part = _state_part(changes)
        if part == state_part:
            # The common case: the record lists exactly the fields the step changed.
            return f"{summary(state)}{_V7}{content} {part} {effect_part}"
        fields.update(_parse_state_part(part) or {})
    listed = _parse_state_part(state_part)
    if listed is None:
        return f"{summary(state)}{_V7}{content} {state_part}? {effect_part}"
    missing = [index for index in listed if index not in fields and index < len(_STATE_FIELDS)]
    if missing:
        every = _state_every(state)
        for index in missing:
            fields[index] = every[index]
    changed = [f"{index:02x}{found}" for index, found in sorted(fields.items())]
    return f"{summary(state)}{_V7}{content} {_state_part(changed)} {effect_part}"


def _parse_state_part(part: str) -> dict[int, str] | None:
    """A version-7 state part as {field index: digest}; None if malformed."""
    if part == "-":
        return {}
    out = {}
    for item in part.split(","):
        if len(item) != 2 + _FIELD_WIDTH:
            return None
        try:
            out[int(item[:2], 16)] = item[2:]
        except ValueError:
            return None
    return out


def _parse_effect_part(part: str) -> list[tuple[str, list[str]]]:
    if part == "-":
        return []
    out = []
    for token in part.split(","):
        name, _, digests = token.partition(":")
        w = _EFFECT_FIELD_WIDTH
        out.append((name, [digests[i : i + w] for i in range(0, len(digests), w)]))
    return out


def differences(recorded: str, recomputed: str) -> list[str]:
    """What differs between a recorded version-7 fingerprint and the one recomputed
    for the same step, each difference named: a counter, a state field (``state.NAME``,
    in declaration order), an effect added, dropped or of another type, an effect's
    field (``effect N TYPE.FIELD``), or else the step's content digest alone (the event
    text, or an effect field whose 16-bit digests happen to agree). Empty if they are
    the same; a single line if either is not version 7."""
    if version(recorded) != 7 or version(recomputed) != 7:
        return [] if recorded == recomputed else [f"recorded {recorded}, recomputed {recomputed}"]
    head_a, tail_a = recorded.split(_V7, 1)
    head_b, tail_b = recomputed.split(_V7, 1)
    out = []
    for token_a, token_b in zip(head_a.split(), head_b.split(), strict=False):
        if token_a == token_b:
            continue
        label = COUNTER_LABELS.get(token_a[:1])
        if label is None or token_a[:1] != token_b[:1]:  # the phase
            out.append(f"phase: {token_a} recorded, {token_b} recomputed")
        else:
            out.append(f"{label}: {token_a[1:]} recorded, {token_b[1:]} recomputed")
    parts_a, parts_b = tail_a.split(" "), tail_b.split(" ")
    if len(parts_a) != 3 or len(parts_b) != 3:
        return [*out, f"recorded {recorded}, recomputed {recomputed}"]
    fields_a = _parse_state_part(parts_a[1]) or {}
    fields_b = _parse_state_part(parts_b[1].rstrip("?")) or {}
    for index in sorted(set(fields_a) | set(fields_b)):
        a, b = fields_a.get(index), fields_b.get(index)
        if a == b:
            continue
        name = _STATE_FIELDS[index] if index < len(_STATE_FIELDS) else f"#{index}"
        if a is None:
            out.append(f"state.{name}: changed by the recomputed step only")
        elif b is None:
            out.append(f"state.{name}: changed by the recorded step only")
        else:
            out.append(f"state.{name}: differs (digest {a} recorded, {b} recomputed)")
    effects_a, effects_b = _parse_effect_part(parts_a[2]), _parse_effect_part(parts_b[2])
    for number, (ea, eb) in enumerate(zip(effects_a, effects_b, strict=False)):
        if ea[0] != eb[0]:
            out.append(f"effect {number}: {ea[0]} recorded, {eb[0]} recomputed")
            continue
        names = _effect_field_names(ea[0])
        for position, (da, db) in enumerate(zip(ea[1], eb[1], strict=False)):
            if da != db:
                field = names[position] if position < len(names) else f"#{position}"
                out.append(f"effect {number} {ea[0]}.{field}: differs")
        if len(ea[1]) != len(eb[1]):
            out.append(f"effect {number} {ea[0]}: its fields at their defaults differ")
    if len(effects_a) != len(effects_b):
        out.append(
            f"effects: {len(effects_a)} recorded ({', '.join(e[0] for e in effects_a)}), "
            f"{len(effects_b)} recomputed ({', '.join(e[0] for e in effects_b)})"
        )
    if parts_a[0] != parts_b[0]:
        # Last: a named field above says more. Alone, it is the event's text (an edit
        # of the log), or an effect field whose 16-bit digests agree by chance.
        out.append(f"{CONTENT_LABEL}: {parts_a[0]} recorded, {parts_b[0]} recomputed")
    return out


def _effect_field_names(name: str) -> tuple[str, ...]:
    cls = codec.effect_class(name)
    return field_names(cls) if cls is not None else ()
