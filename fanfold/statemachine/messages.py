"""Plain data that crosses the reducer's boundary: messages, tool calls, model replies.

All classes are frozen and hold only immutable values. JSON payloads (tool arguments,
tool schemas) are kept as canonical JSON text so that states stay hashable and
comparable; use the ``*_dict`` helpers to read them. A tool call also keeps its
arguments decoded, read-only (``ToolCall.arguments``, ``JsonObject``, ``JsonArray``),
so that they are decoded once, not by every reader.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any, NoReturn

import attrs

from fanfold.statemachine.errors import ErrorKind

# Fields added by log schema 6, written only when they differ from their default, so
# that values that existed before encode (and fingerprint) as they did.
_SINCE_6_OMITTED_AT_DEFAULT = {"since": 6, "omitted_at_default": True}


def canonical_json(value: Any) -> str:
    """Serialise ``value`` to the one JSON text fanfold stores (sorted keys, compact)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@attrs.frozen
class ToolSpec:
    """A tool offered to the model: its name, description and JSON input schema.

    ``read_only``: the tool says it changes nothing (a function tool's
    ``read_only=True``, an MCP tool whose server marks it ``readOnlyHint``), so the
    ``read-only`` rule allows it (``permissions.reading_tools``). Recorded with the
    spec, so the reducer decides from the log alone. fanfold's own reading tools are
    named in ``READING_TOOLS`` instead: their specs stay as older logs recorded them.
    Written only when true (schema 7, omitted at default), so every spec before it
    encodes as it did.
    """

    name: str
    description: str
    input_schema_json: str
    read_only: bool = attrs.field(default=False, metadata={"since": 7, "omitted_at_default": True})
    # Every call of it waits for a person's decision (issue 35): a function tool's
    # ``needs_approval=True``, an MCP server or tool marked ``ask`` in fanfold.toml.
    needs_approval: bool = attrs.field(
        default=False, metadata={"since": 7, "omitted_at_default": True}
    )

    @classmethod
    def from_schema(
        cls,
        name: str,
        description: str,
        schema: dict[str, Any],
        *,
        read_only: bool = False,
        needs_approval: bool = False,
    ) -> ToolSpec:
        return cls(name, description, canonical_json(schema), read_only, needs_approval)

    def input_schema(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.input_schema_json)
        return result


def _read_only(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(
        f"{type(self).__name__} is read-only (a tool call's decoded arguments): "
        "copy it (dict(value), list(value)) to change it"
    )


class JsonObject(dict[str, Any]):
    """A decoded JSON object that cannot be changed: a ``dict`` (so ``isinstance``,
    ``json.dumps``, ``**`` and ``dict(value)`` work as on a parsed object) whose
    changing methods raise ``TypeError``. ``dict(value)`` or ``{**value}`` is a plain
    copy to change. Unhashable, like a ``dict``."""

    __slots__ = ()

    __setitem__ = _read_only
    __delitem__ = _read_only
    __ior__ = _read_only
    clear = _read_only
    pop = _read_only
    popitem = _read_only
    setdefault = _read_only
    update = _read_only

    def __reduce__(self) -> tuple[type[JsonObject], tuple[dict[str, Any]]]:
        # pickle and copy rebuild it whole: the default sets items one by one.
        return (JsonObject, (dict(self),))


class JsonArray(list[Any]):
    """A decoded JSON array that cannot be changed: a ``list`` whose changing methods
    raise ``TypeError``; ``list(value)`` is a plain copy to change."""

    __slots__ = ()

    __setitem__ = _read_only
    __delitem__ = _read_only
    __iadd__ = _read_only
    __imul__ = _read_only
    append = _read_only
    extend = _read_only
    insert = _read_only
    pop = _read_only
    remove = _read_only
    reverse = _read_only
    sort = _read_only
    clear = _read_only

    def __reduce__(self) -> tuple[type[JsonArray], tuple[list[Any]]]:
        return (JsonArray, (list(self),))


class _NotJson(Exception):
    """A value ``json.loads`` cannot give (a tuple key, an enum, a set...)."""


# The exact types json.loads gives for scalars: a subclass (an IntEnum, a str
# subclass) is written by json.dumps as its base and read back as the base.
_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})


def _frozen(value: Any) -> Any:
    """``value`` (as ``json.loads`` gives it) with every object a ``JsonObject`` and
    every array a ``JsonArray``; raises ``_NotJson`` for what ``json.loads`` of its
    canonical text would not give back the same (a non-string key, a tuple, a set,
    a subclass of a scalar), RecursionError when it nests too deeply."""
    kind = type(value)
    if kind in _JSON_SCALARS:
        return value
    # A JsonObject or JsonArray is walked too: one built by hand may hold plain ones.
    if kind is dict or kind is JsonObject:
        # Copied whole (in C), then only its containers replaced: most arguments are
        # flat objects of strings and numbers.
        kept = JsonObject(value)
        for key, item in value.items():
            if type(key) is not str:
                raise _NotJson
            if type(item) not in _JSON_SCALARS:
                dict.__setitem__(kept, key, _frozen(item))
        return kept
    if kind is list or kind is JsonArray:
        return JsonArray([item if type(item) in _JSON_SCALARS else _frozen(item) for item in value])
    raise _NotJson


def frozen_json(value: Any) -> Any:
    """The read-only form of ``value``, a parsed JSON value: objects as
    ``JsonObject``, arrays as ``JsonArray``, scalars as they are. Raises ``ValueError``
    for a value that is not what ``json.loads`` gives (a tuple, a non-string key) or
    that nests too deeply to walk."""
    try:
        return _frozen(value)
    except _NotJson:
        raise ValueError("not a parsed JSON value") from None
    except RecursionError:
        raise ValueError("the JSON nests too deeply") from None


def thawed_json(value: Any) -> Any:
    """A plain copy (``dict``, ``list``) of a read-only JSON value, to hand to code
    that may change it (a user's function tool, an MCP client library)."""
    if isinstance(value, dict):
        return {key: thawed_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [thawed_json(item) for item in value]
    return value


@attrs.frozen
class ToolCall:
    """One tool call requested by the model. ``arguments_json`` is the raw argument text.

    The arguments are also kept decoded on the call (``arguments()``), read-only, out
    of its fields: equality, hashing, ``repr``, ``attrs.evolve``, the codec and the
    fingerprints see only the text. ``of`` (and the providers, which parse the model's
    text once anyway) keep the value they were given; a call made from its text alone
    (a decoded log, ``attrs.evolve``) decodes it on first use, once.
    """

    id: str
    name: str
    arguments_json: str = "{}"

    @classmethod
    def of(cls, id: str, name: str, arguments: dict[str, Any]) -> ToolCall:
        """A call with ``arguments`` written as canonical JSON, and kept decoded when
        they are what reading that text back gives (a parsed JSON value)."""
        return cls.parsed(id, name, canonical_json(arguments), arguments)

    @classmethod
    def parsed(cls, id: str, name: str, arguments_json: str, arguments: Any) -> ToolCall:
        """A call with its text ``arguments_json`` and ``arguments``, the value
        ``json.loads(arguments_json)`` gives (the caller parsed it, or wrote the text
        from it): kept, read-only, so nothing decodes the text again. A value that is
        not what ``json.loads`` gives (a tuple, a non-string key) is not kept."""
        call = cls(id, name, arguments_json)
        try:
            kept = _frozen(arguments)
        except (_NotJson, RecursionError):
            return call  # decoded from its text on first use instead
        # The cache slot of ``_kept`` (a frozen class refuses setattr; the slot is
        # not a field, so the call compares, hashes and encodes as without it).
        object.__setattr__(call, "_kept", kept)
        return call

    @functools.cached_property
    def _kept(self) -> Any:
        try:
            return _frozen(json.loads(self.arguments_json))
        except RecursionError:
            raise ValueError("the JSON nests too deeply") from None

    def arguments(self) -> Any:
        """The parsed arguments, read-only (objects are ``JsonObject``, arrays
        ``JsonArray``: copy them to change them), decoded once and kept on the call;
        raises ``ValueError`` if they are not valid JSON (or nest too deeply to parse).

        Python's JSON reader accepts ``NaN``, ``Infinity`` and literals too large for a
        float (``1e999``, read as infinity); ``non_finite_path`` finds them.
        """
        return self._kept


# What a JSON text must hold for Python's reader to give a non-finite number: the
# literals NaN or Infinity, or a number that float() reads as infinity: one with an
# exponent, or (with a fraction only) at least 309 digits before the point. An
# integer without fraction or exponent is read as an int, never infinite.
# (JSON numbers are ASCII digits: [0-9], not \d, which also takes other scripts' digits.)
_EXPONENT_OR_HUGE = re.compile(r"[0-9](?:[eE]|[0-9]{308})")


def may_hold_non_finite(arguments_json: str) -> bool:
    """False when parsing ``arguments_json`` cannot give a non-finite number (then
    ``non_finite_path`` of it is None, or it is not JSON): the check of every tool
    call's arguments without parsing them (a ``json.loads`` and a walk cost 19,000
    instructions for ``{"thought":"working"}``; this scan about 3,000). True means only
    that the arguments must be parsed to tell."""
    # Two substring scans and a search from a character class: an alternation of the
    # four in one pattern cost twice as much (it tries each branch at each position).
    return (
        "NaN" in arguments_json
        or "Infinity" in arguments_json
        or _EXPONENT_OR_HUGE.search(arguments_json) is not None
    )


def non_finite_path(value: Any) -> str | None:
    """Where the first non-finite number (NaN, ±infinity) in the parsed JSON ``value``
    is, as a path like ``tasks[0].timeout`` (``""`` for ``value`` itself); None if it
    holds none. Walks iteratively: nesting depth costs no stack.
    """
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return path
        elif isinstance(item, dict):
            for key, inner in reversed(item.items()):
                stack.append((inner, f"{path}.{key}" if path else str(key)))
        elif isinstance(item, list):
            for index in range(len(item) - 1, -1, -1):
                stack.append((item[index], f"{path}[{index}]"))
    return None


@attrs.frozen
class ToolResult:
    """The result of one tool call, as the model will see it."""

    tool_call_id: str
    name: str
    content: str
    is_error: bool = False


@attrs.frozen
class Usage:
    """Token counts reported by the provider.

    ``input_tokens`` counts every input token, those read from the provider's prompt
    cache included (OpenAI's ``prompt_tokens`` does; the Anthropic provider adds
    ``cache_read_input_tokens`` and ``cache_creation_input_tokens`` to its
    ``input_tokens``, which leaves them out); ``cached_input_tokens`` says how many of
    them came from the cache (billed cheaper). Schema 6, written only when not zero.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = attrs.field(default=0, metadata=_SINCE_6_OMITTED_AT_DEFAULT)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
        )

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


@attrs.frozen
class UserMessage:
    text: str


@attrs.frozen
class AssistantMessage:
    """A reply of the model in the history. ``truncated``: it was cut off at the output
    token limit (stop reason ``max_tokens``) before it ended; schema 6, written only
    when true."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    truncated: bool = attrs.field(default=False, metadata=_SINCE_6_OMITTED_AT_DEFAULT)


@attrs.frozen
class ToolResultMessage:
    result: ToolResult


Message = UserMessage | AssistantMessage | ToolResultMessage


@attrs.frozen
class ModelReply:
    """A complete model reply: text, tool calls, usage and why it stopped.

    ``stop_reason`` is normalised by the providers: ``end_turn``, ``tool_use``,
    ``max_tokens`` (cut off at the output token limit), ``refusal`` (the model declined;
    ``stop_details`` holds the explanation the provider gave, if any: schema 6, written
    only when not empty); other values pass through.
    """

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = Usage()
    stop_reason: str = "end_turn"
    stop_details: str = attrs.field(default="", metadata=_SINCE_6_OMITTED_AT_DEFAULT)


STOP_MAX_TOKENS = "max_tokens"
"""The stop reason of a reply cut off at the output token limit."""
STOP_REFUSAL = "refusal"
"""The stop reason of a reply in which the model declined the request."""


@attrs.frozen
class ModelError:
    """A classified model-call failure. ``retry_after`` is the provider's delay hint.

    ``usage``: the tokens the server reported for the failed attempt (a stream that
    broke after its usage chunk, an error body that states it): they were billed, so
    they count in the conversation's usage and its token budget. Schema 5, written
    only when not zero.
    """

    kind: ErrorKind
    message: str
    retry_after: float | None = None
    usage: Usage = attrs.field(default=Usage(), metadata={"since": 5, "omitted_at_default": True})


@attrs.frozen
class ModelRequest:
    """Everything a provider needs for one model call."""

    system: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    model: str | None = None
