"""A JSON codec for every value of ``fanfold.statemachine``, with a versioned schema.

Format (``SCHEMA_VERSION`` 1):

- An attrs value is a JSON object ``{"type": "ClassName", <field>: <value>, ...}``
  holding every field, always, in declaration order; the class name is the tag.
- A document (the outermost object of an encoded text, or each element of an
  encoded tuple of values) also carries the schema version: ``{"v":1,"type":...}``.
  Nested objects inherit the version of the document that holds them.
- Fields are encoded from their annotated types: strings, numbers, booleans and
  ``None`` as themselves; enums (all ``StrEnum``) as their string value; tuples as
  arrays; attrs values as objects. Only in an untyped position (``encode(value)``) is
  an enum written as an object: ``{"v":1,"type":"ErrorKind","value":"auth"}``.
- Texts are exactly what ``json.dumps(..., separators=(",", ":"))`` writes: compact
  and ASCII-only. Non-ASCII characters and lone surrogates (which a provider's JSON
  may legitimately contain) are escaped, so every text is storable as UTF-8.
- Numbers are finite. JSON has no NaN or Infinity; Python's json would write and read
  them as bare ``NaN``/``Infinity``, which SQLite's JSON functions, other tools and
  strict parsers call malformed. ``encode`` refuses a non-finite float with
  ``NonFiniteNumber`` naming the path to it; ``decode`` refuses ``NaN``,
  ``Infinity``, ``-Infinity`` and numbers too large for a float (``1e999``) the same
  way, so no log, snapshot or export ever holds one.

Decoding is strict: an unknown type, a missing or extra field, a value of the wrong
type, or a version this code does not know raises ``CodecError`` naming the path to
what is wrong. The one exception is how the schema evolves: a field declared with
``metadata={"since": N}`` (and a default) may be missing from a document of a version
older than N, and then takes its default; older logs stay readable as they are. A
field whose metadata also has ``OMITTED_AT_DEFAULT`` is written only when it differs
from its default, and may be missing at any version: values that existed before it
encode byte for byte as they did, so the fingerprints of older logs (a digest of the
state's encoding) still match. An effect's field marked ``NEVER_STORED`` as well was
added after effects stopped being stored: no stored effect holds it, so replay
compares stored effects with it at its default at every version, and the compact form
leaves it out at its default when it ends its class (a stored effect imported again is
written as it was stored).

Encoding a stored value again does not always give back its stored text, and a
version-5 fingerprint digests the stored texts of a step's event and effects: a field
added with ``OMITTED_AT_DEFAULT`` within a schema version is left out of the object
form at its default, but the compact form writes every field of a nested value (only
a document's trailing ``NEVER_STORED`` fields are left out), so a value stored before
the field existed encodes today with it (``Limits.approval_timeout`` in a
``SpawnSubAgent``). Whatever moves a stored document elsewhere therefore carries its
exact text, never a re-encoding: an export's ``stored`` and ``stored_effects``
(``fanfold.replay.portable``, format 3), kept by ``stored_event`` and
``stored_effect``.

The class registry is derived once, at import, from ``ALL_EVENTS``,
``ALL_EFFECTS``, ``ALL_PHASES`` and ``Conversation`` by following field annotations,
so a class added to the state machine is covered (or refused at import) automatically.

Blobs: a field named in ``BLOB_FIELDS`` (a conversation's tool set, system prompt
and sub-agent prompt: kilobytes, the same in every conversation of a tree) may be
written, by the encoders that take a ``blobs`` dict, as a reference
``{"blob":"<sha256 of the value's text>"}`` when its text is at least
``BLOB_MIN_CHARS`` long; the text itself goes into that dict, which the store keeps
once per database (table ``blobs``, migration 4). Decoding such a document needs
the same mapping (``blobs=``): the value's text is checked against its digest, then
decoded like the inline value. References are a storage matter, not a new document
schema: a reference is accepted only where a blob mapping is given (a store's own
rows), so a document from anywhere else (an export, an import) must be inline, and a
fanfold too old for migration 4 refuses the database before reading any document.

Compact form: the log stores each event as an array instead of an object, the field
names left out: ``[6,"ModelReplied",3,["Done.",[],[12,7,0],"end_turn",""]]``. A
document holds its version, type name, then every field in declaration order; a
nested value its fields, after its type name only where the field's annotation
allows more than one class (a phase, a message). Fields added in a later schema are
at their place in that order, and a compact document of an older version, which
lacks them, decodes them as their defaults. Fields "omitted at default" are written
(every field has its place), but those that end a class's field list may be missing
at any version, and then decode as their defaults, as in the object form:
``[7,"RuntimeResumed"]`` and ``[7,"RuntimeResumed",[]]`` are the same value (schema 7
logs hold both: the field came after the first were written). The
value is the same as the object form's: ``encode_event_compact`` writes it,
``decode_event`` reads either form, ``inline_event`` turns a stored event back into
its object document (exports carry object documents only). Effects are
stored compact too, but for ``OBJECT_EFFECTS`` (``encode_effect_stored``), and so
are snapshots (``encode_state_stored``). Compact documents exist since schema 6
(``COMPACT_SINCE``); the fingerprint digests the object form, so it does not depend
on the form a value is stored in.

Speed: encoding is on the runtime's write path (every event and effect, tens of
thousands a second), so each class gets a compiled function that writes its JSON text
directly, and the text of the immutable values a conversation carries from step to
step (messages, tool specs, limits, child records) is memoised by identity: a
``CallModel`` repeats the whole history, but each message is encoded once.
"""

from __future__ import annotations

import enum
import hashlib
import inspect
import json
import json.encoder
import math
import re
import sys
import threading
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from fanfold.db.errors import CodecError, NonFiniteNumber, UnsupportedVersion

# Defined beside the schema's migrations, which read it on every open without the codec
# (issue 36: opening a log to list it imports neither the codec nor the reducer).
from fanfold.db.versions import SCHEMA_VERSION as SCHEMA_VERSION
from fanfold.statemachine import (
    ALL_EFFECTS,
    ALL_EVENTS,
    ALL_PHASES,
    AssistantMessage,
    ChildSpec,
    Conversation,
    Effect,
    Event,
    FinishedChild,
    Limits,
    ModelRequest,
    PendingChild,
    RejectedTask,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)
from fanfold.statemachine.agent_defs import AgentDefinition
from fanfold.statemachine.children import Roster
from fanfold.statemachine.permissions import Permissions

RETIRED: dict[str, dict[str, tuple[int, type[Any]]]] = {"CallModel": {"request": (6, ModelRequest)}}
"""Fields a later schema no longer has: class name -> field -> the first version
without it and the class its value had. A document older than that may hold the
field: decoding skips it (the class has no such field now) and ``retired_value``
reads it. ``CallModel.request`` is
derived from the state (``fanfold.statemachine.model_request``); replay checks an old
log's recorded request against it."""

BLOB_FIELDS: dict[str, frozenset[str]] = {
    "ConversationCreated": frozenset({"system_prompt", "tools", "sub_agent_prompt"}),
    "Conversation": frozenset({"system_prompt", "tools", "sub_agent_prompt"}),
    # The effect that creates a child carries the child's tool set and prompts: stored
    # inline, a fan-out's spawns were three quarters of its log (5 KB per child).
    "SpawnSubAgent": frozenset({"system_prompt", "tools", "sub_agent_prompt"}),
}
"""Fields whose (large, repeated) values may be stored by reference (see "Blobs")."""

BLOB_MIN_CHARS = 256
"""The shortest value text stored by reference: below it a reference saves little."""

_BLOB_KEY = re.compile(r"[0-9a-f]{64}")

COMPACT_SINCE = 6
"""The first schema version a compact document (see "Compact form") may have."""

OMITTED_AT_DEFAULT = "omitted_at_default"
BEFORE = "before"
"""Metadata of a ``since`` field whose new values default to something other than what
the older documents, which lack it, meant: the value those documents decode to (and,
with ``OMITTED_AT_DEFAULT``, the value left out when encoding, so that they encode
as they did). ``Limits.context_modes``: ``summary`` is offered by default since
schema 7, and a log of schema 6 decodes to the two modes it offered."""
"""Field metadata key: the codec writes the field only when it differs from its default."""

NEVER_STORED = "never_stored"
"""Field metadata key of an effect's field added after the log stopped storing
effects (the events-only log, issue 21; ``RunTool.confined``, ``RunTool.path_rules``):
no stored effect has it, whatever its document's version (schema 7 logs stored
effects before they stopped), so ``as_recorded_by`` gives it its default at every
version. Such a field is also ``OMITTED_AT_DEFAULT``: a stored effect encodes as it was
stored."""

_Emitter = Callable[[Any], str]
_Decoder = Callable[[Any], Any]

# Values that states hold and carry unchanged from step to step: their text is
# memoised by identity. Events and effects themselves are new each step: not memoised.
MEMOISED_TYPES: frozenset[type[Any]] = frozenset(
    {
        UserMessage,
        AssistantMessage,
        ToolResultMessage,
        ToolSpec,
        Limits,
        ChildSpec,
        PendingChild,
        FinishedChild,
        RejectedTask,
        AgentDefinition,
        Permissions,
    }
)
# Tuples of these are memoised too: a conversation's tool set is one tuple, repeated
# in every model request; so is its agent catalogue, in every state of a tree that has
# one. (Not messages: each request's history is a new, longer tuple.)
MEMOISED_ARRAYS: frozenset[type[Any]] = frozenset({ToolSpec, AgentDefinition})
_MEMO_LIMIT = 16_000_000  # characters of memoised text before the memo starts over


# =============================================================== encoding: text emitters

_emit_str: _Emitter = json.encoder.encode_basestring_ascii  # C; TypeError on non-str
_emit_int: _Emitter = int.__repr__  # TypeError on non-int, as json writes ints


class _NonFinite(ValueError):
    """Internal: a non-finite float met while encoding (the path is found afterwards)."""


def _emit_float(value: Any) -> str:
    if type(value) is float:
        if math.isfinite(value):
            return float.__repr__(value)
        raise _NonFinite(repr(value))
    if type(value) is int:
        return int.__repr__(value)
    raise TypeError(f"expected a float, got {type(value).__name__}")


def _emit_bool(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    raise TypeError(f"expected a bool, got {type(value).__name__}")


def _optional(emit: _Emitter) -> _Emitter:
    def emit_optional(value: Any) -> str:
        return "null" if value is None else emit(value)

    return emit_optional


def _sequence(kind: type[Any]) -> Callable[[_Emitter], _Emitter]:
    """``emit -> emitter`` of a value of exactly ``kind`` (a tuple, or a Roster: a
    round's children, ``statemachine.children.Roster``) as the JSON array of its items:
    a Roster exactly as the tuple it replaced was written."""

    def sequence(emit: _Emitter) -> _Emitter:
        def emit_array(value: Any) -> str:
            if type(value) is not kind:
                raise TypeError(f"expected a {kind.__name__}, got {type(value).__name__}")
            return "[" + ",".join(map(emit, value)) + "]"

        return emit_array

    return sequence


_array = _sequence(tuple)
_roster = _sequence(Roster)


_PRIMITIVE_EMITTERS: dict[Any, _Emitter] = {
    str: _emit_str,
    int: _emit_int,
    float: _emit_float,
    bool: _emit_bool,
}


class _Memo:
    """Identity-keyed memo of encoded text, bounded by total size.

    Entries hold the object itself, so an id is never reused while its entry lives
    (``entry[0] is value`` guards the lookup). Safe to share between threads: a race
    at worst encodes a value twice.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.entries: dict[int, tuple[Any, str]] = {}
        self._lock = threading.Lock()

    def wrap(self, emit: _Emitter) -> _Emitter:
        entries = self.entries

        def emit_memoised(value: Any) -> str:
            entry = entries.get(id(value))
            if entry is not None and entry[0] is value:
                return entry[1]
            text = emit(value)
            entries[id(value)] = (value, text)
            self.size += len(text)
            if self.size > self.limit:
                self.clear()
            return text

        return emit_memoised

    def clear(self) -> None:
        with self._lock:
            self.entries.clear()
            self.size = 0

    def drop_added(self, count: int) -> None:
        """Drop the entries added after the memo held ``count`` (a dict pops its last
        inserted entry first). A race with another thread at worst drops its entry,
        which is then encoded again."""
        entries = self.entries
        while len(entries) > count:
            try:
                self.size -= len(entries.popitem()[1][1])
            except KeyError:
                return


_memo = _Memo(_MEMO_LIMIT)
_compact_memo = _Memo(_MEMO_LIMIT // 4)  # the compact texts of the same values
_untagged_memo = _Memo(_MEMO_LIMIT // 4)  # and their untagged ones


class _BlobSink(threading.local):
    """Where the blob-writing encoders put the texts they replace by references (per
    thread; None: write every value inline)."""

    blobs: dict[str, str] | None = None


_sink = _BlobSink()
_BLOB_KEYS_LIMIT = 4096
_blob_keys: dict[str, str] = {}  # value text -> its sha256 (a text's hash is kept by str)


def blob_key(text: str) -> str:
    """The reference key of a value's text: its sha256, in hex."""
    key = _blob_keys.get(text)
    if key is None:
        key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        if len(_blob_keys) >= _BLOB_KEYS_LIMIT:
            _blob_keys.clear()
        _blob_keys[text] = key
    return key


def _blobbing(emit: _Emitter, emit_item: _Emitter | None = None) -> _Emitter:
    """Emit the value, or a reference to its text when a sink collects blobs and the
    text is long enough. With ``emit_item`` (a tuple field), the referenced text is
    the array of its items, each long one itself by reference: a tool set with the
    control tools and one without them share the texts of the tools they both have."""

    # By identity, the reference a value was last written as and the blobs it put in
    # the sink: a tree's tool set and prompts are the same objects in every creation
    # and spawn, and rebuilding a tool set's array of references (a new 6 KB string
    # each time, hashed again to look up its key) cost most of their encoding.
    written: dict[int, tuple[Any, str, tuple[tuple[str, str], ...]]] = {}

    def emit_blob(value: Any) -> str:
        sink = _sink.blobs
        if sink is not None:
            entry = written.get(id(value))
            if entry is not None and entry[0] is value:
                sink.update(entry[2])
                return entry[1]
        text = emit(value)
        if sink is None or len(text) < BLOB_MIN_CHARS:
            return text
        added: list[tuple[str, str]] = []
        if emit_item is not None:
            parts = []
            for item in value:
                item_text = emit_item(item)
                if len(item_text) >= BLOB_MIN_CHARS:
                    item_key = blob_key(item_text)
                    added.append((item_key, item_text))
                    item_text = f'{{"blob":"{item_key}"}}'
                parts.append(item_text)
            text = "[" + ",".join(parts) + "]"
        key = blob_key(text)
        added.append((key, text))
        sink.update(added)
        reference = f'{{"blob":"{key}"}}'
        if len(written) >= _BLOB_KEYS_LIMIT:
            written.clear()
        written[id(value)] = (value, reference, tuple(added))
        return reference

    return emit_blob


def _compile_emitter(
    name: str,
    names: tuple[str, ...],
    emitters: dict[str, _Emitter],
    *,
    document: bool,
    omitted: dict[str, Any] | None = None,
) -> _Emitter:
    """Compile ``obj -> JSON text`` for one class, the way attrs compiles ``__init__``.

    For ``Usage`` the generated body is one f-string:
    ``f'{{"type":"Usage","input_tokens":{_e0(o.input_tokens)},...}}'``.
    """
    namespace: dict[str, Any] = {}
    head = f'{{"v":{SCHEMA_VERSION},"type":"{name}"' if document else f'{{"type":"{name}"'
    parts = [head.replace("{", "{{")]
    for index, field in enumerate(names):
        if omitted is not None and field in omitted:
            namespace[f"_e{index}"] = _omitting(field, emitters[field], omitted[field])
            parts.append(f"{{_e{index}(o.{field})}}")
            continue
        namespace[f"_e{index}"] = emitters[field]
        parts.append(f',"{field}":{{_e{index}(o.{field})}}')
    parts.append("}}")
    source = f"def emit(o):\n    return f'{''.join(parts)}'\n"
    kind = "document" if document else "value"
    exec(compile(source, f"<fanfold.db.codec {kind} emitter for {name}>", "exec"), namespace)
    emit: _Emitter = namespace["emit"]
    return emit


def _omitting(field: str, emit: _Emitter, default: Any) -> _Emitter:
    """Emit ``,"field":value``, or nothing when the value is the field's default."""
    prefix = f',"{field}":'

    def emit_unless_default(value: Any) -> str:
        return "" if value == default else prefix + emit(value)

    return emit_unless_default


def _compile_compact_emitter(
    name: str,
    names: tuple[str, ...],
    emitters: dict[str, _Emitter],
    *,
    document: bool,
    tagged: bool = True,
    never_stored: dict[str, Any] | None = None,
) -> _Emitter:
    """Compile ``obj -> compact JSON text`` for one class (see "Compact form"): an
    array of the type name (unless not ``tagged``) and every field's value in
    declaration order, after the schema version for a document: ``[6,"Usage",12,7]``;
    untagged ``[12,7]``.

    ``never_stored``: the class's last fields, ``NEVER_STORED`` ones, by name, with
    their defaults: left out when all are at their defaults, so that an effect a log
    stored before they existed is written again as it was (an import stores what the
    export holds in this form, and format-5 fingerprints hash that text)."""
    namespace: dict[str, Any] = {}
    items = [f'{SCHEMA_VERSION},"{name}"' if document else f'"{name}"'] if tagged else []
    for index, field in enumerate(names):
        namespace[f"_e{index}"] = emitters[field]
        items.append(f"{{_e{index}(o.{field})}}")
    kind = "compact document" if document else "compact value" if tagged else "untagged value"
    where = f"<fanfold.db.codec {kind} emitter for {name}>"
    emit: _Emitter = _compile_items("emit", "f'[{}]'", ",", items, never_stored, namespace, where)
    return emit


def _compile_field_texts(
    name: str,
    names: tuple[str, ...],
    emitters: tuple[_Emitter, ...],
    never_stored: dict[str, Any] | None,
) -> Callable[[Any], list[str]]:
    """Compile ``obj -> [text of each field]`` for one class (``field_texts``)."""
    namespace: dict[str, Any] = {}
    items = []
    for index, field in enumerate(names):
        namespace[f"_e{index}"] = emitters[index]
        items.append(f"_e{index}(o.{field})")
    where = f"<fanfold.db.codec field texts of {name}>"
    texts: Callable[[Any], list[str]] = _compile_items(
        "texts", "[{}]", ", ", items, never_stored, namespace, where
    )
    return texts


def _compile_items(
    function: str,
    template: str,
    separator: str,
    items: list[str],
    never_stored: dict[str, Any] | None,
    namespace: dict[str, Any],
    where: str,
) -> Any:
    """Compile ``def function(o): return template`` with ``items`` joined by
    ``separator`` into the template's ``{}``; with ``never_stored`` (the last fields by
    name, with their defaults), a first branch returns the items without those fields
    when every one of them is at its default. One piece of code for the compact emitters
    and ``field_texts``, so that both leave out the same fields; the function it
    compiles calls nothing more than the emitters in ``namespace``."""
    source = f"def {function}(o):\n    return {template.format(separator.join(items))}\n"
    if never_stored:
        tests = []
        for index, (field, default) in enumerate(never_stored.items()):
            namespace[f"_d{index}"] = default
            tests.append(f"o.{field} == _d{index}")
        short = items[: len(items) - len(never_stored)]
        source = (
            f"def {function}(o):\n    if {' and '.join(tests)}:\n"
            f"        return {template.format(separator.join(short))}\n"
            f"    return {template.format(separator.join(items))}\n"
        )
    exec(compile(source, where, "exec"), namespace)
    return namespace[function]


def _trailing_omitted(names: tuple[str, ...], omitted: dict[str, Any]) -> tuple[str, ...]:
    """The last fields of ``names`` that are all omitted at their default."""
    count = 0
    for field in reversed(names):
        if field not in omitted:
            break
        count += 1
    return names[len(names) - count :]


def _emit_object(value: Any) -> str:
    """The text of any registered attrs value (a field of an attrs or union type)."""
    codec = _CODECS.get(type(value))
    if codec is None:
        raise _not_ours(value)
    return codec.emit(value)


def _emit_compact_object(value: Any) -> str:
    """The compact text of any registered attrs value."""
    codec = _CODECS.get(type(value))
    if codec is None:
        raise _not_ours(value)
    return codec.compact(value)


def _not_ours(value: Any) -> CodecError:
    """The error for a value of a class the codec has not registered."""
    return CodecError(f"cannot encode {type(value).__qualname__}: not a fanfold.statemachine value")


def _untagged(cls: type[Any]) -> _Emitter:
    """The compact text of a value where the annotation names its one class: no type
    name (see "Compact form")."""

    def emit_untagged(value: Any) -> str:
        if type(value) is not cls:
            raise TypeError(f"expected a {cls.__name__}, got {type(value).__name__}")
        return _CODECS[cls].untagged(value)

    return emit_untagged


def _field_emitter(tp: Any, where: str, *, compact: bool = False) -> _Emitter:
    """The emitter of a value of annotated type ``tp`` (``compact``: in the compact
    form, see "Compact form")."""
    primitive = _PRIMITIVE_EMITTERS.get(tp)
    if primitive is not None:
        return primitive
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if not issubclass(tp, str):
            raise TypeError(f"{where}: only str enums are supported, got {tp.__name__}")
        return _emit_str
    objects = _emit_compact_object if compact else _emit_object
    if attrs.has(tp):
        return _untagged(tp) if compact else objects
    members = _union_members(tp)
    if members is not None:
        rest = [m for m in members if m is not type(None)]
        emit: _Emitter
        if compact and len(rest) == 1 and attrs.has(rest[0]):
            emit = _untagged(rest[0])
        elif all(attrs.has(m) for m in rest):
            emit = objects
        elif len(rest) == 1:
            emit = _field_emitter(rest[0], where, compact=compact)
        else:
            raise TypeError(f"{where}: unions mixing attrs classes and other types: {tp}")
        return _optional(emit) if len(rest) < len(members) else emit
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"{where}: only homogeneous tuples (tuple[T, ...]) are supported")
        array = _array(_field_emitter(args[0], where, compact=compact))
        memo = _compact_memo if compact else _memo
        return memo.wrap(array) if args[0] in MEMOISED_ARRAYS else array
    if typing.get_origin(tp) is Roster:
        return _roster(_field_emitter(typing.get_args(tp)[0], where, compact=compact))
    raise TypeError(f"{where}: the codec does not support the type {tp!r}")


def _union_members(tp: Any) -> tuple[Any, ...] | None:
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return typing.get_args(tp)
    return None


# =============================================================== decoding


class _Invalid(Exception):
    """Internal: a decoding failure, with the path collected while it propagates."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path: list[str] = []  # innermost first


class _NonFiniteLiteral:
    """What the parser puts where the JSON text has NaN, Infinity, -Infinity or a number
    too large for a float (``1e999``); ``_loads`` then refuses the document, naming the
    path to it. Never reaches a decoder."""

    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal


class _Parsing(threading.local):
    non_finite = False  # set by the parser's hooks: the text just parsed holds one


_parsing = _Parsing()


def _non_finite_literal(literal: str) -> _NonFiniteLiteral:
    _parsing.non_finite = True
    return _NonFiniteLiteral(literal)


def _parse_float(literal: str) -> float | _NonFiniteLiteral:
    value = float(literal)
    if math.isfinite(value):
        return value
    return _non_finite_literal(literal)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:40] + "..."
        return f"the string {shown!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        tag = value.get("type")
        return f"a {tag} object" if isinstance(tag, str) else "an object"
    return type(value).__name__  # pragma: no cover - json.loads makes nothing else


def _dec_str(value: Any) -> str:
    if type(value) is str:
        return value
    raise _Invalid(f"expected a string, got {_describe(value)}")


def _dec_int(value: Any) -> int:
    if type(value) is int:
        return value
    raise _Invalid(f"expected an integer, got {_describe(value)}")


def _dec_float(value: Any) -> float:
    kind = type(value)
    if kind is float:
        return typing.cast(float, value)
    if kind is int:
        return float(value)
    raise _Invalid(f"expected a number, got {_describe(value)}")


def _dec_bool(value: Any) -> bool:
    if type(value) is bool:
        return value
    raise _Invalid(f"expected a boolean, got {_describe(value)}")


def _dec_enum(enum_type: type[enum.Enum]) -> _Decoder:
    members = {m.value: m for m in enum_type}
    choices = ", ".join(repr(v) for v in members)

    def decode(value: Any) -> Any:
        try:
            return members[value]
        except (KeyError, TypeError):
            raise _Invalid(
                f"expected a {enum_type.__name__} ({choices}), got {_describe(value)}"
            ) from None

    return decode


def _dec_optional(inner: _Decoder) -> _Decoder:
    def decode(value: Any) -> Any:
        return None if value is None else inner(value)

    return decode


def _dec_tuple(inner: _Decoder) -> _Decoder:
    def decode(value: Any) -> tuple[Any, ...]:
        if type(value) is not list:
            raise _Invalid(f"expected an array, got {_describe(value)}")
        out = []
        for index, item in enumerate(value):
            try:
                out.append(inner(item))
            except _Invalid as failure:
                failure.path.append(f"[{index}]")
                raise
        return tuple(out)

    return decode


_PRIMITIVE_DECODERS: dict[Any, _Decoder] = {
    str: _dec_str,
    int: _dec_int,
    float: _dec_float,
    bool: _dec_bool,
}


def _field_decoder(tp: Any, where: str) -> _Decoder:
    primitive = _PRIMITIVE_DECODERS.get(tp)
    if primitive is not None:
        return primitive
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        _ENUMS.setdefault(tp.__name__, tp)
        return _dec_enum(tp)
    if attrs.has(tp):
        return _object_decoder((tp,))
    members = _union_members(tp)
    if members is not None:
        rest = tuple(m for m in members if m is not type(None))
        if all(attrs.has(m) for m in rest):
            decoder = _object_decoder(rest)
        elif len(rest) == 1:
            decoder = _field_decoder(rest[0], where)
        else:  # pragma: no cover - _field_emitter refuses these first
            raise TypeError(f"{where}: unsupported union {tp!r}")
        return _dec_optional(decoder) if len(rest) < len(members) else decoder
    if typing.get_origin(tp) in (tuple, Roster):
        # A Roster decodes as a tuple: Children's converter makes it one.
        return _dec_tuple(_field_decoder(typing.get_args(tp)[0], where))
    raise TypeError(f"{where}: the codec does not support the type {tp!r}")  # pragma: no cover


_DECODED_BLOBS_LIMIT = 1024


def _blob_items(tp: Any) -> _Emitter | None:
    """For a blob field of type ``tuple[X, ...]`` with X an attrs class, the emitter
    of its items (stored by reference one by one too); None for any other field."""
    if typing.get_origin(tp) is tuple and attrs.has(typing.get_args(tp)[0]):
        return _emit_object
    return None


def _blob_text(key: str) -> str:
    """The text of blob ``key`` from the blobs given to the decoder, checked."""
    blobs = _decoding.blobs
    if blobs is None:
        raise _Invalid("a blob reference, which only a log's own rows may hold")
    text = blobs.get(key)
    if text is None:
        raise _Invalid(f"blob {key[:16]} is not in the log")
    if hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest() != key:
        raise _Invalid(f"blob {key[:16]} is damaged: its text does not match its digest")
    return text


def _blob_key_of(value: Any) -> str | None:
    """The key if ``value`` is a blob reference ``{"blob": "<sha256>"}``, else None."""
    if type(value) is not dict or value.keys() != {"blob"}:
        return None
    key = value["blob"]
    return key if type(key) is str and _BLOB_KEY.fullmatch(key) else None


def _unblobbing(inner: _Decoder) -> _Decoder:
    """Decode a field that may hold a blob reference: the referenced text (which must
    be in the mapping given to the decoder and match its digest; an array's items may
    be references too) is decoded by ``inner``. Decoded values are kept by key (they
    are immutable, and a key names one text) while the texts stay the same: every
    conversation of a tree then shares one tool set."""
    decoded: dict[str, tuple[tuple[tuple[str, str], ...], Any]] = {}

    def decode(value: Any) -> Any:
        key = _blob_key_of(value)
        if key is None:
            return inner(value)  # not a reference: inner says what it expected
        blobs = _decoding.blobs
        found = decoded.get(key)
        # The same texts as when it was decoded (and checked) before: the same value.
        if found is not None and blobs is not None and all(blobs.get(k) == t for k, t in found[0]):
            return found[1]
        text = _blob_text(key)
        try:
            parsed = _loads(text)
        except CodecError as exc:
            raise _Invalid(f"blob {key[:16]}: {exc}") from None
        texts = [(key, text)]
        if type(parsed) is list:
            for index, item in enumerate(parsed):
                item_key = _blob_key_of(item)
                if item_key is not None:
                    item_text = _blob_text(item_key)
                    texts.append((item_key, item_text))
                    try:
                        parsed[index] = _loads(item_text)
                    except CodecError as exc:
                        raise _Invalid(f"blob {item_key[:16]}: {exc}") from None
        result = inner(parsed)
        if len(decoded) >= _DECODED_BLOBS_LIMIT:
            decoded.clear()
        decoded[key] = (tuple(texts), result)
        return result

    return decode


def _object_decoder(classes: tuple[type[Any], ...]) -> _Decoder:
    """Decode an object whose ``type`` must name one of ``classes``."""
    for cls in classes:
        _register(cls)
    allowed = {cls.__name__: _CODECS[cls] for cls in classes}
    expected = " or ".join(allowed)

    only = _CODECS[classes[0]] if len(classes) == 1 else None

    def decode(value: Any) -> Any:
        kind = type(value)
        if kind is list and only is not None:  # compact, untagged: [field, ...]
            return only.decode_compact(value, 0)
        if kind is list and value:  # the compact form: ["Type", field, ...]
            tag = value[0]
            codec = allowed.get(tag) if type(tag) is str else None
            if codec is None:
                raise _Invalid(f"expected a {expected} object, got {_describe(value)}")
            return codec.decode_compact(value, 1)
        if kind is not dict:
            raise _Invalid(f"expected a {expected} object, got {_describe(value)}")
        tag = value.get("type")
        codec = allowed.get(tag) if type(tag) is str else None
        if codec is None:
            raise _Invalid(f"expected a {expected} object, got {_describe(value)}")
        return codec.decode(value)

    return decode


# =============================================================== the class registry


class _Decoding(threading.local):
    """The schema version of the document being decoded, and the blobs its references
    may name (per thread; None: a reference is refused)."""

    version = SCHEMA_VERSION
    blobs: typing.Mapping[str, str] | None = None


_decoding = _Decoding()


_EMITTER_SLOTS = ("emit", "document", "stored", "compact", "untagged", "compact_stored")
"""The emitters of a class, each compiled on its first use (see ``_ClassCodec.build``)."""


class _ClassCodec:
    """How one attrs class is encoded and decoded; compiled once per class."""

    __slots__ = (
        "by_version",
        "cls",
        "compact",
        "compact_stored",
        "decoders",
        "document",
        "emit",
        "field_emitters",
        "hints",
        "keys",
        "name",
        "names",
        "never_stored",
        "omitted",
        "pending",
        "since",
        "stored",
        "texts",
        "unstored",
        "untagged",
    )

    def __init__(self, cls: type[Any]) -> None:
        self.cls = cls
        self.name = cls.__name__
        self.names: tuple[str, ...] = tuple(f.name for f in attrs.fields(cls))
        if {"type", "v"} & set(self.names):
            raise TypeError(f"{self.name}: fields 'type' and 'v' are reserved by the codec")
        self.keys = frozenset(("type", *self.names))
        # Fields added by a later schema version: name -> (that version, the value a
        # document without them means).
        self.since: dict[str, tuple[int, Any]] = {}
        for field in attrs.fields(cls):
            since = field.metadata.get("since")
            if since is not None:
                if field.default is attrs.NOTHING or hasattr(field.default, "factory"):
                    raise TypeError(f"{self.name}.{field.name}: a 'since' field needs a default")
                # What a document without the field means: the field's default, or
                # its BEFORE value when new values default to something else.
                before = field.metadata.get(BEFORE, field.default)
                self.since[field.name] = (since, before)
        # Fields written only when they differ from their default: name -> default.
        self.omitted: dict[str, Any] = {
            name: default
            for name, (_, default) in self.since.items()
            if attrs.fields_dict(cls)[name].metadata.get(OMITTED_AT_DEFAULT)
        }
        # Fields no stored document has (NEVER_STORED): name -> default.
        self.never_stored: dict[str, Any] = {
            name: default
            for name, default in self.omitted.items()
            if attrs.fields_dict(cls)[name].metadata.get(NEVER_STORED)
        }
        self.emit: _Emitter = _unbuilt
        self.document: _Emitter = _unbuilt
        self.stored: _Emitter = _unbuilt  # the document, blob fields by reference
        self.compact: _Emitter = _unbuilt  # the value in the compact form
        self.untagged: _Emitter = _unbuilt  # the same without its type name
        self.compact_stored: _Emitter = _unbuilt  # the compact document, blobs by reference
        # Compiled compact decoders by (schema version, index of the first field).
        self.by_version: dict[tuple[int, int], Callable[[list[Any]], Any]] = {}
        self.decoders: tuple[tuple[str, str, _Decoder], ...] = ()
        self.hints: dict[str, Any] = {}
        self.pending: set[str] = set()  # the emitter slots not compiled yet
        # The compact emitter of each field, in declaration order, and the compiled
        # ``field_texts`` (version-7 fingerprints); both made on first use.
        self.field_emitters: tuple[_Emitter, ...] | None = None
        self.texts: Callable[[Any], list[str]] = self._build_texts

    def build(self, hints: dict[str, Any]) -> None:
        """Make the decoders from the field annotations (which registers every class
        the fields hold); the emitters are compiled on their first use (``built``)."""
        fields = attrs.fields(self.cls)
        self.hints = hints
        blobbed = BLOB_FIELDS.get(self.name, frozenset())
        self.decoders = tuple(
            (
                f.name,
                f.alias,
                _unblobbing(_field_decoder(hints[f.name], f"{self.name}.{f.name}"))
                if f.name in blobbed
                else _field_decoder(hints[f.name], f"{self.name}.{f.name}"),
            )
            for f in fields
        )
        # Compiling six emitters for each of ~70 classes was most of the cost of
        # importing the codec, in every process, while a command uses a few of them:
        # each slot holds a stand-in that compiles the real emitter, puts it in the
        # slot and calls it. Callers look the slot up on every call (``codec.emit(v)``),
        # so from the second call on they call the compiled emitter directly.
        self.pending = set(_EMITTER_SLOTS)
        for slot in _EMITTER_SLOTS:
            setattr(self, slot, self._stand_in(slot))

    def _stand_in(self, slot: str) -> _Emitter:
        def build_and_emit(value: Any) -> str:
            return self.built(slot)(value)

        return build_and_emit

    def built(self, slot: str) -> _Emitter:
        """The emitter in ``slot`` (one of ``_EMITTER_SLOTS``), compiled if it is not
        yet. Two threads may both compile it: the texts are the same either way."""
        if slot not in self.pending:
            emit: _Emitter = getattr(self, slot)
            return emit
        emit = getattr(self, f"_make_{slot}")()
        setattr(self, slot, emit)
        self.pending.discard(slot)
        return emit

    def compact_field_emitters(self) -> tuple[_Emitter, ...]:
        """The compact emitter of each field, in declaration order (made once)."""
        if self.field_emitters is None:
            compact = self._emitters(True)
            self.field_emitters = tuple(compact[n] for n in self.names)
        return self.field_emitters

    def _build_texts(self, value: Any) -> list[str]:
        texts = _compile_field_texts(
            self.name, self.names, self.compact_field_emitters(), self._unstored()
        )
        self.texts = texts
        return texts(value)

    def _emitters(self, compact: bool) -> dict[str, _Emitter]:
        """Each field's emitter (``compact``: in the compact form)."""
        return {
            f.name: _field_emitter(self.hints[f.name], f"{self.name}.{f.name}", compact=compact)
            for f in attrs.fields(self.cls)
        }

    def _make_emit(self) -> _Emitter:
        emit = _compile_emitter(
            self.name, self.names, self._emitters(False), document=False, omitted=self.omitted
        )
        return _memo.wrap(emit) if self.cls in MEMOISED_TYPES else emit

    def _make_document(self) -> _Emitter:
        return _compile_emitter(
            self.name, self.names, self._emitters(False), document=True, omitted=self.omitted
        )

    def _make_stored(self) -> _Emitter:
        """The document with blob fields by reference (the document itself when the
        class has none)."""
        blobbed = BLOB_FIELDS.get(self.name, frozenset())
        if not blobbed:
            return self.built("document")
        stored = {
            n: _blobbing(e, _blob_items(self.hints[n])) if n in blobbed else e
            for n, e in self._emitters(False).items()
        }
        return _compile_emitter(self.name, self.names, stored, document=True, omitted=self.omitted)

    def _unstored(self) -> dict[str, Any] | None:
        # The last fields, if NEVER_STORED, are left out of the compact form at their
        # defaults (see _compile_compact_emitter).
        trailing = _trailing_omitted(self.names, self.never_stored)
        return {n: self.never_stored[n] for n in trailing} or None

    def _make_compact(self) -> _Emitter:
        value = _compile_compact_emitter(
            self.name,
            self.names,
            self._emitters(True),
            document=False,
            never_stored=self._unstored(),
        )
        return _compact_memo.wrap(value) if self.cls in MEMOISED_TYPES else value

    def _make_untagged(self) -> _Emitter:
        untagged = _compile_compact_emitter(
            self.name,
            self.names,
            self._emitters(True),
            document=False,
            tagged=False,
            never_stored=self._unstored(),
        )
        return _untagged_memo.wrap(untagged) if self.cls in MEMOISED_TYPES else untagged

    def _make_compact_stored(self) -> _Emitter:
        # A blob's text is the value's ordinary (object) text: one text per value,
        # whichever form names it.
        blobbed = BLOB_FIELDS.get(self.name, frozenset())
        emitters = self._emitters(False) if blobbed else {}
        compact_stored = {
            n: _blobbing(emitters[n], _blob_items(self.hints[n])) if n in blobbed else e
            for n, e in self._emitters(True).items()
        }
        return _compile_compact_emitter(
            self.name, self.names, compact_stored, document=True, never_stored=self._unstored()
        )

    def decode_compact(self, items: list[Any], start: int) -> Any:
        """Build the instance from a compact array whose fields begin at ``start``:
        every field the schema version being decoded has, in declaration order; the
        fields added later take their defaults."""
        key = (_decoding.version, start)
        build = self.by_version.get(key)
        if build is None:
            build = self.by_version[key] = self._compile_compact(*key)
        try:
            return build(items)
        except (_Invalid, TypeError, ValueError, IndexError):
            return self._decode_compact_slowly(items, start)

    def _fields_at(self, version: int) -> tuple[tuple[str, str, _Decoder], ...]:
        return tuple(d for d in self.decoders if self.since.get(d[0], (0,))[0] <= version)

    def _compile_compact(self, version: int, start: int) -> Callable[[list[Any]], Any]:
        """``items -> instance`` for compact arrays of ``version`` (fields from
        ``start``), compiled: one call of the class with each field decoded in place.
        Any failure is left to ``_decode_compact_slowly``, which says what is wrong."""
        fields = self._fields_at(version)
        optional = len(_trailing_omitted(tuple(f[0] for f in fields), self.omitted))
        namespace: dict[str, Any] = {"_cls": self.cls, "_Invalid": _Invalid}
        arguments = []
        for index, (name, alias, decode) in enumerate(fields):
            namespace[f"_d{index}"] = decode
            if index >= len(fields) - optional:
                # A trailing field omitted at its default may be left out (see "Compact form").
                namespace[f"_default_{alias}"] = self.omitted[name]
                arguments.append(
                    f"{alias}=_d{index}(items[{start + index}]) "
                    f"if len(items) > {start + index} else _default_{alias}"
                )
            else:
                arguments.append(f"{alias}=_d{index}(items[{start + index}])")
        for name, alias, _ in self.decoders:
            if self.since.get(name, (0,))[0] > version:
                namespace[f"_default_{alias}"] = self.since[name][1]
                arguments.append(f"{alias}=_default_{alias}")
        source = (
            "def build(items):\n"
            f"    if not {start + len(fields) - optional} <= len(items) <= {start + len(fields)}:\n"
            "        raise _Invalid('length')\n"
            f"    return _cls({', '.join(arguments)})\n"
        )
        where = f"<fanfold.db.codec compact decoder for {self.name}>"
        exec(compile(source, where, "exec"), namespace)
        build: Callable[[list[Any]], Any] = namespace["build"]
        return build

    def _decode_compact_slowly(self, items: list[Any], start: int) -> Any:
        """``decode_compact`` field by field, naming the field that is wrong."""
        version = _decoding.version
        decoders = self._fields_at(version)
        optional = len(_trailing_omitted(tuple(d[0] for d in decoders), self.omitted))
        if not len(decoders) - optional <= len(items) - start <= len(decoders):
            needs = str(len(decoders))
            if optional:
                needs = f"{len(decoders) - optional} to {needs}"
            raise _Invalid(
                f"{self.name} needs {needs} field(s) in its compact form, got {len(items) - start}"
            )
        kwargs = {
            alias: self.since[name][1]
            for name, alias, _ in self.decoders
            if self.since.get(name, (0,))[0] > version
        }
        for name, alias, _ in decoders[len(items) - start :]:
            kwargs[alias] = self.omitted[name]  # a trailing field left out at its default
        name = ""
        try:
            for index, field in enumerate(decoders[: len(items) - start], start):
                name = field[0]
                kwargs[field[1]] = field[2](items[index])
        except _Invalid as failure:
            failure.path.append(f".{name}")
            raise
        return self._build(kwargs)

    def _build(self, kwargs: dict[str, Any]) -> Any:
        """The instance of the decoded field values, or ``_Invalid`` naming the class."""
        try:
            return self.cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise _Invalid(f"invalid {self.name}: {exc}") from None

    def decode(self, obj: dict[str, Any]) -> Any:
        """Build the instance from a JSON object whose ``type`` is this class."""
        defaults: dict[str, Any] = {}
        if obj.keys() != self.keys:
            missing = [n for n in self.names if n not in obj]
            version = _decoding.version
            for n in missing:
                added = self.since.get(n)
                if added is not None and (version < added[0] or n in self.omitted):
                    defaults[n] = added[1]  # older than the field, or left out: its default
            missing = [n for n in missing if n not in defaults]
            if missing:
                raise _Invalid(f"{self.name} is missing field(s) {', '.join(map(repr, missing))}")
            extra = sorted(k for k in obj if k not in self.keys)
            retired = RETIRED.get(self.name)
            if retired and extra:
                extra = [k for k in extra if not (k in retired and version < retired[k][0])]
            if extra:
                raise _Invalid(f"{self.name} has unknown field(s) {', '.join(map(repr, extra))}")
        kwargs = {}
        name = ""
        try:
            for name, alias, decode in self.decoders:
                kwargs[alias] = defaults[name] if name in defaults else decode(obj[name])
        except _Invalid as failure:
            failure.path.append(f".{name}")
            raise
        return self._build(kwargs)


def as_recorded_by(value: Any, version: int) -> Any:
    """``value`` as a document of schema ``version`` records it: its fields added in a
    later version take their defaults, as decoding such a document gives, at any depth
    (a NotifyParent's outcome, a phase inside a state, the items of a tuple).

    Replay compares a recomputed effect with a recorded one this way: an older log
    lacks the field, which says nothing about its value. A ``NEVER_STORED`` field takes
    its default at every version: no stored effect ever held it.
    """
    if isinstance(value, tuple):
        return tuple(as_recorded_by(item, version) for item in value)
    codec = _CODECS.get(type(value))
    if codec is None:
        return value
    changes: dict[str, Any] = {}
    for name in codec.names:
        added = codec.since.get(name)
        if added is not None and (version < added[0] or name in codec.never_stored):
            changes[name] = added[1]
            continue
        inner = getattr(value, name)
        older = as_recorded_by(inner, version)
        if older is not inner:
            changes[name] = older
    return attrs.evolve(value, **changes) if changes else value


def document_version(text: str | bytes) -> int:
    """The schema version a document was written with; raises CodecError if unreadable."""
    document = _loads(text)
    if type(document) is list:
        return _check_compact_version(document)
    if not isinstance(document, dict):
        raise CodecError("not a document")
    return _check_version(document)


def _unbuilt(value: Any) -> str:  # pragma: no cover - replaced by build()
    raise AssertionError("codec not built")


_CODECS: dict[type[Any], _ClassCodec] = {}
_BY_NAME: dict[str, _ClassCodec] = {}
_ENUMS: dict[str, type[enum.Enum]] = {}


def _register(cls: type[Any]) -> None:
    """Add ``cls`` and, through its annotations, every class it holds to the registry."""
    if cls in _CODECS:
        return
    codec = _ClassCodec(cls)
    if codec.name in _BY_NAME:
        raise TypeError(f"two codec types are named {codec.name!r}")
    _CODECS[cls] = codec
    _BY_NAME[codec.name] = codec
    codec.build(_type_hints(cls))


_ANNOTATIONS: dict[tuple[str, str], Any] = {}


def _type_hints(cls: type[Any]) -> dict[str, Any]:
    """``typing.get_type_hints(cls)`` for the reducer's classes, each annotation's text
    evaluated once per module: their modules use ``from __future__ import annotations``,
    so every annotation is a text, and the ~70 classes repeat the same ~110 texts ~280
    times (``get_type_hints`` compiles each; issue 36). A test compares the two for
    every registered class."""
    hints: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        annotations = inspect.get_annotations(base)
        if not annotations:
            continue
        namespace = vars(sys.modules[base.__module__])
        for name, text in annotations.items():
            if not isinstance(text, str):
                hints[name] = type(None) if text is None else text
                continue
            key = (base.__module__, text)
            value = _ANNOTATIONS.get(key, _ANNOTATIONS)
            if value is _ANNOTATIONS:
                # The text is fanfold's own source (a class annotation), never input.
                value = _ANNOTATIONS[key] = eval(text, namespace)
            hints[name] = value
    return hints


def _register_all(roots: Iterable[type[Any]]) -> None:
    for cls in roots:
        _register(cls)
    for name in _ENUMS:
        if name in _BY_NAME:
            raise TypeError(f"two codec types are named {name!r}")


# ModelRequest: no event or effect holds one since schema 6, but older logs' CallModel
# documents do (``RETIRED``).
_register_all((*ALL_EVENTS, *ALL_EFFECTS, *ALL_PHASES, Conversation, ModelRequest))

EVENT_TYPES: frozenset[str] = frozenset(cls.__name__ for cls in ALL_EVENTS)
"""Names of the event classes."""
EFFECT_TYPES: frozenset[str] = frozenset(cls.__name__ for cls in ALL_EFFECTS)
"""Names of the effect classes."""
REGISTERED_TYPES: frozenset[type[Any]] = frozenset(_CODECS)
"""Every attrs class the codec knows."""
REGISTERED_ENUMS: frozenset[type[enum.Enum]] = frozenset(_ENUMS.values())
"""Every enum the codec knows."""


def _state_without_history() -> _Emitter:
    """The document emitter of a Conversation with every field but ``history`` (for
    the fingerprint, which hashes the history incrementally)."""
    hints = _CODECS[Conversation].hints
    names = tuple(n for n in _CODECS[Conversation].names if n != "history")
    emitters = {n: _field_emitter(hints[n], f"Conversation.{n}") for n in names}
    # Fields written only when not at their default are left out here too, so that a
    # state that existed before such a field digests as it did.
    omitted = _CODECS[Conversation].omitted
    return _compile_emitter("Conversation", names, emitters, document=True, omitted=omitted)


def _compile_state_without_history(state: Conversation) -> str:
    """Compiles the emitter on its first use (as each class's, see ``_ClassCodec.build``)
    and puts it in ``_STATE_WITHOUT_HISTORY``, which is looked up on every call."""
    global _STATE_WITHOUT_HISTORY
    _STATE_WITHOUT_HISTORY = _state_without_history()
    return _STATE_WITHOUT_HISTORY(state)


_STATE_WITHOUT_HISTORY: _Emitter = _compile_state_without_history
_EVENT_CODECS = {cls: _CODECS[cls] for cls in ALL_EVENTS}
_EFFECT_CODECS = {cls: _CODECS[cls] for cls in ALL_EFFECTS}
_STATE_CODEC = _CODECS[Conversation]


# =============================================================== documents


def _document(
    codec: _ClassCodec | None, value: Any, what: str, blobs: dict[str, str] | None = None
) -> str:
    if codec is None:
        raise CodecError(f"cannot encode {type(value).__qualname__} as {what}")
    try:
        if blobs is None:
            return codec.document(value)
        _sink.blobs = blobs
        try:
            return codec.stored(value)
        finally:
            _sink.blobs = None
    except _NonFinite:
        raise _refuse_non_finite(value) from None
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise CodecError(f"cannot encode {codec.name}: {exc}") from None


_strict_json = json.JSONDecoder(parse_constant=_non_finite_literal, parse_float=_parse_float)


def loads_strict(text: str | bytes) -> Any:
    """``json.loads``, but a non-finite number (NaN, Infinity, -Infinity, or a literal
    such as ``1e999`` that overflows a float) raises NonFiniteNumber naming the path to
    the first one; any other invalid JSON raises CodecError."""
    return _loads(text)


def _loads(text: str | bytes) -> Any:
    _parsing.non_finite = False
    try:
        if isinstance(text, bytes | bytearray):
            text = bytes(text).decode("utf-8")
        value = _strict_json.decode(text)
    except (ValueError, TypeError, RecursionError) as exc:
        raise CodecError(f"not valid JSON: {exc}") from None
    if _parsing.non_finite:
        _parsing.non_finite = False
        found = _non_finite_path(value, "")
        if found is not None:  # always (the hooks ran), unless a dict key repeated
            where, literal = found
            head = value.get("type") if type(value) is dict else None
            where = f"{head if type(head) is str else ''}{where}" or "the document"
            raise NonFiniteNumber(
                f"{where}: the non-finite number {literal} (JSON numbers must be finite)"
            )
    return value


def _non_finite_path(value: Any, where: str) -> tuple[str, str] | None:
    """The path and literal of the first non-finite number of a parsed JSON value."""
    kind = type(value)
    if kind is _NonFiniteLiteral:
        return where, value.literal
    if kind is dict:
        for key, item in value.items():
            found = _non_finite_path(item, f"{where}.{key}")
            if found is not None:
                return found
    elif kind is list:
        for index, item in enumerate(value):
            found = _non_finite_path(item, f"{where}[{index}]")
            if found is not None:
                return found
    return None


def _non_finite_field(value: Any, where: str) -> str | None:
    """The path to the first non-finite float inside an encodable value (slow; only
    to name it once the fast emitter has refused it)."""
    if type(value) is float:
        return None if math.isfinite(value) else where
    if type(value) is tuple:
        for index, item in enumerate(value):
            found = _non_finite_field(item, f"{where}[{index}]")
            if found is not None:
                return found
    elif attrs.has(type(value)):
        for field in attrs.fields(type(value)):
            found = _non_finite_field(getattr(value, field.name), f"{where}.{field.name}")
            if found is not None:
                return found
    return None


def _refuse_non_finite(value: Any) -> NonFiniteNumber:
    head = type(value).__name__ if attrs.has(type(value)) else ""
    where = f"{head}{_non_finite_field(value, '') or ''}" or "the value"
    return NonFiniteNumber(
        f"cannot encode {where}: a non-finite number (NaN or infinity) has no JSON form"
    )


def _check_version(document: dict[str, Any]) -> int:
    version = document.pop("v", None)
    if version is None:
        raise CodecError(f"{_describe(document)} has no schema version 'v'")
    if type(version) is not int or not 1 <= version <= SCHEMA_VERSION:
        raise UnsupportedVersion(version, SCHEMA_VERSION)
    return version


def _check_compact_version(document: list[Any]) -> int:
    version = document[0] if document else None
    if type(version) is not int or not 1 <= version <= SCHEMA_VERSION:
        if type(version) is int and version > SCHEMA_VERSION:
            raise UnsupportedVersion(version, SCHEMA_VERSION)
        raise CodecError("an array that is no compact document: it does not start with a version")
    if version < COMPACT_SINCE:
        raise CodecError(
            f"a compact document of schema {version}: the compact form exists since "
            f"schema {COMPACT_SINCE}"
        )
    return version


def _decode_compact(value: list[Any], allowed: frozenset[str] | None, what: str) -> Any:
    """Decode one compact document: ``[version, "Type", field, ...]``."""
    version = _check_compact_version(value)
    name = value[1] if len(value) > 1 else None
    if type(name) is not str:
        raise CodecError(f"expected {what}: the compact document has no type name")
    if allowed is not None and name not in allowed:
        raise CodecError(f"expected {what}, got type {name!r}")
    codec = _BY_NAME.get(name)
    if codec is None:
        raise CodecError(f"unknown type {name!r}")
    outer, _decoding.version = _decoding.version, version
    try:
        return codec.decode_compact(value, 2)
    except _Invalid as failure:
        where = "".join(reversed(failure.path))
        raise CodecError(f"{name}{where}: {failure.problem}") from None
    finally:
        _decoding.version = outer


def _decode_document(value: Any, allowed: frozenset[str] | None, what: str) -> Any:
    """Decode one versioned document, whose type must be in ``allowed`` (if given)."""
    if type(value) is list:
        return _decode_compact(value, allowed, what)
    if type(value) is not dict:
        raise CodecError(f"expected {what} (a JSON object), got {_describe(value)}")
    version = _check_version(value)
    name = value.get("type")
    if type(name) is not str:
        raise CodecError(f"expected {what}: the object has no 'type' string")
    if allowed is not None and name not in allowed:
        raise CodecError(f"expected {what}, got type {name!r}")
    try:
        codec = _BY_NAME.get(name)
        if codec is not None:
            outer, _decoding.version = _decoding.version, version
            try:
                return codec.decode(value)
            finally:
                _decoding.version = outer
        enum_type = _ENUMS.get(name)
        if enum_type is not None:
            if value.keys() != {"type", "value"}:
                raise _Invalid(f"{name} needs exactly the fields 'type' and 'value'")
            return _dec_enum(enum_type)(value["value"])
    except _Invalid as failure:
        where = "".join(reversed(failure.path))
        raise CodecError(f"{name}{where}: {failure.problem}") from None
    raise CodecError(f"unknown type {name!r}")


def _emit_any(value: Any) -> str:
    kind = type(value)
    if value is None:
        return "null"
    if kind is str:
        return _emit_str(value)
    if kind is bool:
        return _emit_bool(value)
    if kind is int:
        return _emit_int(value)
    if kind is float:
        if not math.isfinite(value):
            raise _refuse_non_finite(value)
        return _emit_float(value)
    codec = _CODECS.get(kind)
    if codec is not None:
        return _document(codec, value, "a value")
    if _ENUMS.get(kind.__name__) is kind:
        return f'{{"v":{SCHEMA_VERSION},"type":"{kind.__name__}","value":{_emit_str(value)}}}'
    if kind is tuple:
        return "[" + ",".join(map(_emit_any, value)) + "]"
    raise CodecError(f"cannot encode {kind.__qualname__}: not a fanfold.statemachine value")


def _decode_any(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        return _decode_document(value, None, "a fanfold value")
    if kind is list:
        return tuple(_decode_any(item) for item in value)
    return value


# =============================================================== public API

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def column_text(text: str | None) -> str | None:
    """``text`` as an SQLite TEXT column can hold it: lone surrogates (half of a UTF-16
    pair, which a str holds but UTF-8 cannot) written ``\\ud83d`` as JSON writes them.

    For the columns that copy a text out of the log for listing (a task); the events
    themselves are JSON text and keep the exact string.
    """
    if text is None or not _LONE_SURROGATE.search(text):
        return text
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def clear_memo() -> None:
    """Forget every memoised text (benchmarks use it to measure a cold start)."""
    _memo.clear()
    _compact_memo.clear()
    _untagged_memo.clear()


def encode(value: Any) -> str:
    """Encode any statemachine value: attrs values, enums, tuples of values, None, scalars."""
    return _emit_any(value)


def encode_unversioned(value: Any) -> str:
    """The text of an attrs value of the statemachine without the schema version: what
    ``encode`` writes after ``"v":N,``. For digests (``fanfold.db.fingerprint``), which
    must not change when a schema version is added; not decodable."""
    codec = _CODECS.get(type(value))
    if codec is None:
        raise CodecError(f"cannot encode {type(value).__qualname__}: not an attrs value")
    try:
        return codec.emit(value)
    except _NonFinite:
        raise _refuse_non_finite(value) from None
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise CodecError(f"cannot encode {codec.name}: {exc}") from None


def field_names(cls: type[Any]) -> tuple[str, ...]:
    """The fields of a registered attrs class, in declaration order (the order of
    ``field_texts``)."""
    return _CODECS[cls].names


def effect_class(name: str) -> type[Any] | None:
    """The effect class named ``name``; None if there is none."""
    codec = _BY_NAME.get(name)
    return codec.cls if codec is not None and codec.cls in _EFFECT_CODECS else None


def field_emitters(cls: type[Any]) -> tuple[Callable[[Any], str], ...]:
    """The compact emitters of a registered class's fields, in declaration order: what
    the compact form writes for each field (memoised tuple fields included)."""
    return _CODECS[cls].compact_field_emitters()


def compact_text(value: Any) -> str:
    """The compact text of a registered attrs value, its type name first (memoised by
    identity for ``MEMOISED_TYPES``: the text a compact document holds for it)."""
    return _emit_compact_object(value)


def compact_text_unkept(value: Any) -> str:
    """``compact_text``, leaving the compact memos as they were: the entries the call
    added (for ``value`` and the values inside it) are dropped. For a caller that keeps
    a digest of the text and will not ask for it again (a pending child's roster item:
    its memoised texts cost a waiting sub-agent ~0.8 KB of heap, issue 21)."""
    compact, untagged = len(_compact_memo.entries), len(_untagged_memo.entries)
    text = _emit_compact_object(value)
    _compact_memo.drop_added(compact)
    _untagged_memo.drop_added(untagged)
    return text


def compact_emitter(cls: type[Any]) -> Callable[[Any], str]:
    """The compact emitter of a registered class (its type name first; memoised by
    identity for ``MEMOISED_TYPES``): what the compact form writes for a value of it."""
    return _CODECS[cls].compact


def compile_field_texts(
    cls: type[Any], overrides: dict[str, Callable[[Any], str]]
) -> Callable[[Any], list[str]]:
    """``field_texts`` for one registered class, compiled, with the fields named in
    ``overrides`` given by their function instead of their compact text (a digest's
    text of a large value, kept by identity). Raises what the emitters raise."""
    codec = _CODECS[cls]
    pairs = zip(codec.names, codec.compact_field_emitters(), strict=True)
    emitters = tuple(overrides.get(name, emit) for name, emit in pairs)
    return _compile_field_texts(codec.name, codec.names, emitters, codec._unstored())


def field_texts(value: Any) -> list[str]:
    """The compact text of each field of an attrs value of the statemachine, in
    declaration order; its last fields that no stored document has (``NEVER_STORED``)
    left out at their defaults, as the compact form leaves them (so a field a later
    schema adds at its default does not change a version-7 fingerprint). For digests:
    raises CodecError for a value the codec cannot encode."""
    codec = _CODECS.get(type(value))
    if codec is None:
        raise CodecError(f"cannot encode {type(value).__qualname__}: not an attrs value")
    try:
        return codec.texts(value)
    except _NonFinite:
        raise _refuse_non_finite(value) from None
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise CodecError(f"cannot encode {codec.name}: {exc}") from None


def decode(text: str | bytes) -> Any:
    """Decode a text made by ``encode``; arrays come back as tuples."""
    value = _loads(text)
    try:
        return _decode_any(value)
    except RecursionError:  # JSON that parsed just below the limit recurses again here
        raise CodecError("not valid JSON: nested too deeply") from None


def retired_value(text: str | bytes, name: str) -> tuple[bool, Any]:
    """The value of retired field ``name`` (see ``RETIRED``) in the document ``text``:
    ``(True, value)`` if the document holds it, ``(False, None)`` if not. The value is
    decoded as a document of the same version decodes its fields."""
    document = _loads(text)
    if type(document) is not dict or name not in document:
        return False, None
    version = _check_version(document)
    kind = document.get("type")
    retired = RETIRED.get(kind, {}).get(name) if type(kind) is str else None
    if retired is None or version >= retired[0]:
        return False, None
    value, codec = document[name], _CODECS[retired[1]]
    outer, _decoding.version = _decoding.version, version
    try:
        if type(value) is not dict or value.get("type") != codec.name:
            raise _Invalid(f"expected a {codec.name} object, got {_describe(value)}")
        return True, codec.decode(value)
    except _Invalid as failure:
        where = "".join(reversed(failure.path))
        raise CodecError(f"{kind}.{name}{where}: {failure.problem}") from None
    finally:
        _decoding.version = outer


def encode_event(event: Event, blobs: dict[str, str] | None = None) -> str:
    """Encode one event as a versioned JSON document. With ``blobs``, the values of
    ``BLOB_FIELDS`` are written as references and their texts added to ``blobs``."""
    return _document(_EVENT_CODECS.get(type(event)), event, "an event", blobs)


def encode_event_compact(event: Event, blobs: dict[str, str]) -> str:
    """Encode one event as the log stores it: a compact document (see "Compact
    form"), the values of ``BLOB_FIELDS`` by reference, their texts added to
    ``blobs``."""
    codec = _EVENT_CODECS.get(type(event))
    if codec is None:
        raise CodecError(f"cannot encode {type(event).__qualname__} as an event")
    return _compact_stored(codec, event, blobs)


def _compact_stored(codec: _ClassCodec, value: Any, blobs: dict[str, str] | None) -> str:
    """``value``'s compact document, the values of ``BLOB_FIELDS`` by reference (their
    texts added to ``blobs``), or inline when ``blobs`` is None; CodecError for a value
    it cannot encode."""
    _sink.blobs = blobs
    try:
        return codec.compact_stored(value)
    except _NonFinite:
        raise _refuse_non_finite(value) from None
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise CodecError(f"cannot encode {codec.name}: {exc}") from None
    finally:
        _sink.blobs = None


def stored_event(text: str, blobs: dict[str, str]) -> str:
    """An event document from elsewhere (an import) as ``append`` stores the same
    value: an object document of the current schema as its compact form, its blob
    values by reference (added to ``blobs``). A compact document is kept as it is
    (an import that carries the exact stored text: its fingerprint is a digest of
    those bytes, and encoding the value again may not give them back). A document of
    an older schema keeps its form (only its blob values by reference), and one that
    does not decode is left as it is, for the reader to report."""
    if text.startswith("["):
        return text
    try:
        if document_version(text) == SCHEMA_VERSION:
            return encode_event_compact(decode_event(text), blobs)
    except CodecError:
        return text
    return collapse_blobs(text, blobs)


def inline_event(text: str, blobs: typing.Mapping[str, str]) -> Any:
    """A stored event document as its ordinary, self-contained form parses: a compact
    document re-encoded as the object document of the same value (exact: a compact
    document is of the current schema), blob references written inline. For exports."""
    document = _loads(text)
    if type(document) is list:
        version = _check_compact_version(document)
        exported: dict[str, Any] = _loads(encode_event(decode_event(text, blobs)))
        # A compact document of an older schema (6) becomes the object document that
        # schema wrote: the same fields, since the later ones are at their defaults
        # and written only away from them; only the version differs.
        exported["v"] = version
        return exported
    return expand_blobs(document, blobs)


def decode_event(text: str | bytes, blobs: typing.Mapping[str, str] | None = None) -> Event:
    """Decode a text made by ``encode_event``; anything but an event raises CodecError.
    ``blobs``: the texts its references may name (a log's ``blobs`` table)."""
    event: Event = _with_blobs(blobs, _decode_document, _loads(text), EVENT_TYPES, "an event")
    return event


def _with_blobs(blobs: typing.Mapping[str, str] | None, decode: Any, *args: Any) -> Any:
    if blobs is None:
        return decode(*args)
    outer, _decoding.blobs = _decoding.blobs, blobs
    try:
        return decode(*args)
    finally:
        _decoding.blobs = outer


def collapse_blobs(text: str, blobs: dict[str, str]) -> str:
    """A stored document's text with the values of its ``BLOB_FIELDS`` written as
    references, their texts added to ``blobs``: what the encoders that take ``blobs``
    write, for a document written inline (an import). Any other text, or one that
    cannot be read (decoding it reports why), comes back unchanged."""
    if not any(f'"type":"{name}"' in text[:200] for name in BLOB_FIELDS):
        return text
    try:
        document = _loads(text)
    except CodecError:
        return text
    kind = document.get("type") if type(document) is dict else None
    fields = BLOB_FIELDS.get(kind) if type(kind) is str else None
    if not fields:
        return text
    changed = False
    for name in fields:
        value = document.get(name)
        if value is None or type(value) is dict:
            continue
        value_text = json.dumps(value, separators=(",", ":"))
        if len(value_text) >= BLOB_MIN_CHARS:
            if type(value) is list:  # items by reference too, as ``_blobbing`` writes
                parts = []
                for item in value:
                    item_text = json.dumps(item, separators=(",", ":"))
                    if len(item_text) >= BLOB_MIN_CHARS:
                        item_key = blob_key(item_text)
                        blobs[item_key] = item_text
                        item_text = f'{{"blob":"{item_key}"}}'
                    parts.append(item_text)
                value_text = "[" + ",".join(parts) + "]"
            key = blob_key(value_text)
            blobs[key] = value_text
            document[name] = {"blob": key}
            changed = True
    return json.dumps(document, separators=(",", ":")) if changed else text


def expand_blobs(document: Any, blobs: typing.Mapping[str, str]) -> Any:
    """A parsed document (as ``json.loads`` gives it) with its blob references
    replaced by the parsed texts they name, as the document is written inline; for
    exports, which carry no blobs table. A reference not in ``blobs`` stays as it is
    (decoding it then says so)."""
    if type(document) is not dict:
        return document
    kind = document.get("type")
    fields = BLOB_FIELDS.get(kind, frozenset()) if type(kind) is str else frozenset()
    out = {}
    for name, value in document.items():
        if (
            name in fields
            and type(value) is dict
            and value.keys() == {"blob"}
            and value["blob"] in blobs
        ):
            value = _loads(blobs[value["blob"]])
            if type(value) is list:
                value = [
                    _loads(blobs[item["blob"]]) if _blob_key_of(item) in blobs else item
                    for item in value
                ]
        elif type(value) is dict:
            value = expand_blobs(value, blobs)
        out[name] = value
    return out


def encode_effect(effect: Effect) -> str:
    """Encode one effect as a versioned JSON document."""
    return _document(_EFFECT_CODECS.get(type(effect)), effect, "an effect")


def decode_effect(text: str | bytes, blobs: typing.Mapping[str, str] | None = None) -> Effect:
    """Decode a text made by ``encode_effect`` or ``encode_effect_stored``; ``blobs``:
    the texts its references may name (a log's ``blobs`` table)."""
    effect: Effect = _with_blobs(blobs, _decode_document, _loads(text), EFFECT_TYPES, "an effect")
    return effect


OBJECT_EFFECTS: frozenset[str] = frozenset({"CallModel", "StartTimer", "ScheduleRetry"})
"""Effects the log keeps as object documents: readers query their fields with SQL's
JSON functions (``Store.timer_starts``: a timer's number), or they are what a model
call is logged as (its number and attempt, by name). Every other effect is stored in
the compact form."""


def encode_effect_stored(effect: Effect, blobs: dict[str, str] | None = None) -> str:
    """Encode one effect as the log stores it: compact, but for ``OBJECT_EFFECTS``;
    with ``blobs``, the values of ``BLOB_FIELDS`` by reference, their texts added to
    ``blobs`` (without, inline: how logs written before 2026-11-26 stored them)."""
    codec = _EFFECT_CODECS.get(type(effect))
    if codec is None or codec.name in OBJECT_EFFECTS:
        return encode_effect(effect)
    return _compact_stored(codec, effect, blobs)


def stored_effect(text: str, blobs: dict[str, str]) -> str:
    """An effect document from elsewhere (an import) as ``append`` stores the same
    value (see ``stored_event``). A compact document is kept as it is: an import that
    carries the exact stored text (a version-5 fingerprint digests those bytes, and a
    value holding a field added since, at its default, encodes to other bytes today)."""
    if text.startswith("["):
        return text
    try:
        if document_version(text) == SCHEMA_VERSION:
            return encode_effect_stored(decode_effect(text), blobs)
    except CodecError:
        return text
    return collapse_blobs(text, blobs)


def inline_effect(text: str, blobs: typing.Mapping[str, str] | None = None) -> Any:
    """A stored effect document as its object form parses, blob references written
    inline (for exports)."""
    document = _loads(text)
    if type(document) is list:
        return _loads(encode_effect(decode_effect(text, blobs)))
    return expand_blobs(document, blobs or {})


def encode_effects(effects: tuple[Effect, ...]) -> str:
    """Encode a tuple of effects as a JSON array of versioned documents."""
    return "[" + ",".join(map(encode_effect, effects)) + "]"


def decode_effects(text: str | bytes) -> tuple[Effect, ...]:
    """Decode a text made by ``encode_effects``."""
    value = _loads(text)
    if type(value) is not list:
        raise CodecError(f"expected an array of effects, got {_describe(value)}")
    effects = []
    for index, item in enumerate(value):
        try:
            effects.append(_decode_document(item, EFFECT_TYPES, "an effect"))
        except UnsupportedVersion:
            raise
        except CodecError as exc:
            raise CodecError(f"effect [{index}]: {exc}") from None
    return tuple(effects)


def encode_state(state: Conversation, blobs: dict[str, str] | None = None) -> str:
    """Encode a whole conversation state (a snapshot) as a versioned JSON document
    (``blobs``: as for ``encode_event``)."""
    codec = _STATE_CODEC if type(state) is Conversation else None
    return _document(codec, state, "a Conversation", blobs)


def encode_state_stored(state: Conversation, blobs: dict[str, str]) -> str:
    """Encode a state as the log stores a snapshot: a compact document, the values of
    ``BLOB_FIELDS`` by reference (their texts added to ``blobs``)."""
    if type(state) is not Conversation:
        raise CodecError(f"cannot encode {type(state).__qualname__} as a Conversation")
    return _compact_stored(_STATE_CODEC, state, blobs)


def stored_state(text: str, blobs: dict[str, str]) -> str:
    """A snapshot from elsewhere (an import) as ``append`` stores the same state (see
    ``stored_event``)."""
    try:
        if document_version(text) == SCHEMA_VERSION:
            return encode_state_stored(decode_state(text), blobs)
    except CodecError:
        return text
    return collapse_blobs(text, blobs)


def inline_state(text: str, blobs: typing.Mapping[str, str]) -> Any:
    """A stored snapshot as its object document parses, blob values inline (exports)."""
    document = _loads(text)
    if type(document) is list:
        return _loads(encode_state(decode_state(text, blobs)))
    return expand_blobs(document, blobs)


def encode_state_without_history(state: Conversation) -> str:
    """The text of ``state`` without its ``history`` field (not decodable: for digests)."""
    if type(state) is not Conversation:
        raise CodecError(f"cannot encode {type(state).__qualname__} as a Conversation")
    try:
        return _STATE_WITHOUT_HISTORY(state)
    except _NonFinite:
        raise _refuse_non_finite(state) from None
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise CodecError(f"cannot encode Conversation: {exc}") from None


def decode_state(text: str | bytes, blobs: typing.Mapping[str, str] | None = None) -> Conversation:
    """Decode a text made by ``encode_state`` (``blobs``: as for ``decode_event``)."""
    state: Conversation = _with_blobs(
        blobs, _decode_document, _loads(text), frozenset({"Conversation"}), "a state"
    )
    return state
