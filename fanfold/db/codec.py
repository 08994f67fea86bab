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
state's encoding) still match.

The class registry is derived once, at import, from ``ALL_EVENTS``,
``ALL_EFFECTS``, ``ALL_PHASES`` and ``Conversation`` by following field annotations,
so a class added to the state machine is covered (or refused at import) automatically.

Speed: encoding is on the runtime's write path (every event and effect, tens of
thousands a second), so each class gets a compiled function that writes its JSON text
directly, and the text of the immutable values a conversation carries from step to
step (messages, tool specs, limits, child records) is memoised by identity: a
``CallModel`` repeats the whole history, but each message is encoded once.
"""

from __future__ import annotations

import enum
import json
import json.encoder
import math
import re
import threading
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from fanfold.db.errors import CodecError, NonFiniteNumber, UnsupportedVersion
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
from fanfold.statemachine.permissions import Permissions

SCHEMA_VERSION = 6
"""Version written into every document; decoding accepts 1..SCHEMA_VERSION.

History: 2 added the token accounting of sub-agent trees (``ChildSucceeded.tokens``,
``ChildFailed.tokens``, ``PendingChild.budget``, ``Conversation.usage_children``); 3
added ``ConversationCreated.workdir`` (where a sub-agent's working directory really
is) and the error kind ``invalid_cwd``; 4 added ``CallModel.attempt`` and
``StartTimer.counts_downtime`` (facts the runtime used to work out itself); 5 added
``ChildSucceeded.submitted`` (whether a sub-agent called ``submit_result`` or ended
with plain text), written only when False (see ``OMITTED_AT_DEFAULT``), and
``ModelError.usage`` (the tokens of a failed attempt), written only when not zero; 6
retired ``CallModel.request`` (see ``RETIRED``).
"""

RETIRED: dict[str, dict[str, tuple[int, type[Any]]]] = {"CallModel": {"request": (6, ModelRequest)}}
"""Fields a later schema no longer has: class name -> field -> the first version
without it and the class its value had. A document older than that may hold the
field: decoding skips it (the class has no such field now) and ``retired_value``
reads it. ``CallModel.request`` is
derived from the state (``fanfold.statemachine.model_request``); replay checks an old
log's recorded request against it."""

OMITTED_AT_DEFAULT = "omitted_at_default"
"""Field metadata key: the codec writes the field only when it differs from its default."""

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


def _array(emit: _Emitter) -> _Emitter:
    def emit_array(value: Any) -> str:
        if type(value) is not tuple:
            raise TypeError(f"expected a tuple, got {type(value).__name__}")
        return "[" + ",".join(map(emit, value)) + "]"

    return emit_array


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


_memo = _Memo(_MEMO_LIMIT)


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


def _emit_object(value: Any) -> str:
    """The text of any registered attrs value (a field of an attrs or union type)."""
    codec = _CODECS.get(type(value))
    if codec is None:
        raise CodecError(
            f"cannot encode {type(value).__qualname__}: not a fanfold.statemachine value"
        )
    return codec.emit(value)


def _field_emitter(tp: Any, where: str) -> _Emitter:
    """The emitter of a value of annotated type ``tp``."""
    primitive = _PRIMITIVE_EMITTERS.get(tp)
    if primitive is not None:
        return primitive
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if not issubclass(tp, str):
            raise TypeError(f"{where}: only str enums are supported, got {tp.__name__}")
        return _emit_str
    if attrs.has(tp):
        return _emit_object
    members = _union_members(tp)
    if members is not None:
        rest = [m for m in members if m is not type(None)]
        emit: _Emitter
        if all(attrs.has(m) for m in rest):
            emit = _emit_object
        elif len(rest) == 1:
            emit = _field_emitter(rest[0], where)
        else:
            raise TypeError(f"{where}: unions mixing attrs classes and other types: {tp}")
        return _optional(emit) if len(rest) < len(members) else emit
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"{where}: only homogeneous tuples (tuple[T, ...]) are supported")
        array = _array(_field_emitter(args[0], where))
        return _memo.wrap(array) if args[0] in MEMOISED_ARRAYS else array
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
    if typing.get_origin(tp) is tuple:
        return _dec_tuple(_field_decoder(typing.get_args(tp)[0], where))
    raise TypeError(f"{where}: the codec does not support the type {tp!r}")  # pragma: no cover


def _object_decoder(classes: tuple[type[Any], ...]) -> _Decoder:
    """Decode an object whose ``type`` must name one of ``classes``."""
    for cls in classes:
        _register(cls)
    allowed = {cls.__name__: _CODECS[cls] for cls in classes}
    expected = " or ".join(allowed)

    def decode(value: Any) -> Any:
        if type(value) is not dict:
            raise _Invalid(f"expected a {expected} object, got {_describe(value)}")
        tag = value.get("type")
        codec = allowed.get(tag) if type(tag) is str else None
        if codec is None:
            raise _Invalid(f"expected a {expected} object, got {_describe(value)}")
        return codec.decode(value)

    return decode


# =============================================================== the class registry


class _Decoding(threading.local):
    """The schema version of the document being decoded (per thread)."""

    version = SCHEMA_VERSION


_decoding = _Decoding()


class _ClassCodec:
    """How one attrs class is encoded and decoded; compiled once per class."""

    __slots__ = (
        "cls",
        "decoders",
        "document",
        "emit",
        "keys",
        "name",
        "names",
        "omitted",
        "since",
    )

    def __init__(self, cls: type[Any]) -> None:
        self.cls = cls
        self.name = cls.__name__
        self.names: tuple[str, ...] = tuple(f.name for f in attrs.fields(cls))
        if {"type", "v"} & set(self.names):
            raise TypeError(f"{self.name}: fields 'type' and 'v' are reserved by the codec")
        self.keys = frozenset(("type", *self.names))
        # Fields added by a later schema version: name -> (that version, default).
        self.since: dict[str, tuple[int, Any]] = {}
        for field in attrs.fields(cls):
            since = field.metadata.get("since")
            if since is not None:
                if field.default is attrs.NOTHING or hasattr(field.default, "factory"):
                    raise TypeError(f"{self.name}.{field.name}: a 'since' field needs a default")
                self.since[field.name] = (since, field.default)
        # Fields written only when they differ from their default: name -> default.
        self.omitted: dict[str, Any] = {
            name: default
            for name, (_, default) in self.since.items()
            if attrs.fields_dict(cls)[name].metadata.get(OMITTED_AT_DEFAULT)
        }
        self.emit: _Emitter = _unbuilt
        self.document: _Emitter = _unbuilt
        self.decoders: tuple[tuple[str, str, _Decoder], ...] = ()

    def build(self, hints: dict[str, Any]) -> None:
        """Compile the emitters and the decoders from the field annotations."""
        fields = attrs.fields(self.cls)
        where = {f.name: f"{self.name}.{f.name}" for f in fields}
        emitters = {f.name: _field_emitter(hints[f.name], where[f.name]) for f in fields}
        omitted = self.omitted
        emit = _compile_emitter(self.name, self.names, emitters, document=False, omitted=omitted)
        self.emit = _memo.wrap(emit) if self.cls in MEMOISED_TYPES else emit
        self.document = _compile_emitter(
            self.name, self.names, emitters, document=True, omitted=omitted
        )
        self.decoders = tuple(
            (f.name, f.alias, _field_decoder(hints[f.name], where[f.name])) for f in fields
        )

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
        try:
            return self.cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise _Invalid(f"invalid {self.name}: {exc}") from None


def as_recorded_by(value: Any, version: int) -> Any:
    """``value`` as a document of schema ``version`` records it: its fields added in a
    later version take their defaults, as decoding such a document gives, at any depth
    (a NotifyParent's outcome, a phase inside a state, the items of a tuple).

    Replay compares a recomputed effect with a recorded one this way: an older log
    lacks the field, which says nothing about its value.
    """
    if isinstance(value, tuple):
        return tuple(as_recorded_by(item, version) for item in value)
    codec = _CODECS.get(type(value))
    if codec is None:
        return value
    changes: dict[str, Any] = {}
    for name in codec.names:
        added = codec.since.get(name)
        if added is not None and version < added[0]:
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
    codec.build(typing.get_type_hints(cls))


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
    hints = typing.get_type_hints(Conversation)
    names = tuple(n for n in _CODECS[Conversation].names if n != "history")
    emitters = {n: _field_emitter(hints[n], f"Conversation.{n}") for n in names}
    # Fields written only when not at their default are left out here too, so that a
    # state that existed before such a field digests as it did.
    omitted = _CODECS[Conversation].omitted
    return _compile_emitter("Conversation", names, emitters, document=True, omitted=omitted)


_STATE_WITHOUT_HISTORY = _state_without_history()
_EVENT_CODECS = {cls: _CODECS[cls] for cls in ALL_EVENTS}
_EFFECT_CODECS = {cls: _CODECS[cls] for cls in ALL_EFFECTS}
_STATE_CODEC = _CODECS[Conversation]


# =============================================================== documents


def _document(codec: _ClassCodec | None, value: Any, what: str) -> str:
    if codec is None:
        raise CodecError(f"cannot encode {type(value).__qualname__} as {what}")
    try:
        return codec.document(value)
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


def _decode_document(value: Any, allowed: frozenset[str] | None, what: str) -> Any:
    """Decode one versioned document, whose type must be in ``allowed`` (if given)."""
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


def decode(text: str | bytes) -> Any:
    """Decode a text made by ``encode``; arrays come back as tuples."""
    return _decode_any(_loads(text))


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


def encode_event(event: Event) -> str:
    """Encode one event as a versioned JSON document."""
    return _document(_EVENT_CODECS.get(type(event)), event, "an event")


def decode_event(text: str | bytes) -> Event:
    """Decode a text made by ``encode_event``; anything but an event raises CodecError."""
    event: Event = _decode_document(_loads(text), EVENT_TYPES, "an event")
    return event


def encode_effect(effect: Effect) -> str:
    """Encode one effect as a versioned JSON document."""
    return _document(_EFFECT_CODECS.get(type(effect)), effect, "an effect")


def decode_effect(text: str | bytes) -> Effect:
    """Decode a text made by ``encode_effect``."""
    effect: Effect = _decode_document(_loads(text), EFFECT_TYPES, "an effect")
    return effect


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


def encode_state(state: Conversation) -> str:
    """Encode a whole conversation state (a snapshot) as a versioned JSON document."""
    codec = _STATE_CODEC if type(state) is Conversation else None
    return _document(codec, state, "a Conversation")


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


def decode_state(text: str | bytes) -> Conversation:
    """Decode a text made by ``encode_state``."""
    state: Conversation = _decode_document(_loads(text), frozenset({"Conversation"}), "a state")
    return state
