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

``matches(state, recorded)`` compares in the recorded format, so logs written with
versions 1 to 5 still verify.
"""

from __future__ import annotations

import hashlib
import operator
import threading
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat

import attrs

from fanfold.db import codec
from fanfold.db.codec import (
    OBJECT_EFFECTS,
    document_version,
    encode,
    encode_state_without_history,
    encode_unversioned,
)
from fanfold.db.errors import CodecError
from fanfold.statemachine import (
    AwaitingSubAgents,
    CancellingSubAgents,
    Children,
    Conversation,
    Message,
    ToolExecuting,
)

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
    match phase:
        case (
            ToolExecuting(children=c)
            | AwaitingSubAgents(children=c)
            | CancellingSubAgents(children=c)
        ):
            pending, finished = len(c.pending), len(c.finished)
        case _:
            pending = finished = 0
    return (
        f"{type(phase).__name__} n{state.next_call} r{state.rounds} h{len(state.history)}"
        f" s{state.spawned} p{pending} f{finished} w{len(state.written_off)}"
    )


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
    effect_names: Sequence[str],
    *,
    snapshot: bool = False,
) -> str:
    """The current (version 6) fingerprint of a step that stored ``event_text`` (its
    compact document), produced effects of types ``effect_names`` and left ``state``:
    the counters, the content digest and, when the state is at rest, the whole-state
    digest; but not for an ended conversation whose whole state the step stores as its
    snapshot (``snapshot``): nothing changes it after that, and verify compares the
    snapshot itself."""
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
    """True if ``recorded`` is a version-6 fingerprint: its step's effects are not
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
        kept = tuple(items)
        h.update(len(kept).to_bytes(8, "little"))
        h.update(_lists.joined((key, slot), kept))
    return h.digest()


def is_version_1(recorded: str) -> bool:
    """True if ``recorded`` is a version-1 fingerprint (no ``#`` digest)."""
    return " #" not in recorded


def version(recorded: str) -> int:
    """The format of a recorded fingerprint: 1 to 6."""
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
) -> str:
    """The fingerprint of ``state`` in the format of ``recorded``. A version-6
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
) -> bool:
    """True if ``state`` has the fingerprint ``recorded`` (in its own format; see
    ``like`` for ``event_payload``, ``effects`` and ``effect_names``)."""
    return like(state, recorded, event_payload, effects, effect_names=effect_names) == recorded


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
