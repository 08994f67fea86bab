"""The scripted provider's script, as typed records checked when it loads.

The records are attrs classes; cattrs builds them from the JSON document with strict
hooks (a string is never taken for a number, nor a number for a string, a bool for
neither) and refuses unknown keys. Every problem is reported, each with the place it
is at (``agents[0].replies[2].fail_first[0].retry_after``), in one ``ScriptError``.
Checking everything here means a script that loads cannot fail later, when a reply is
due and a conversation is waiting for it.
"""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Callable, Mapping
from typing import Any, NewType

import attrs
import cattrs
from cattrs.errors import (
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn

from fanfold.statemachine import ErrorKind


class ScriptError(ValueError):
    """The script is not valid; the message says where."""


# Values with a range, checked by their own hooks below.
Seconds = NewType("Seconds", float)
"""A finite number of seconds >= 0."""
Tokens = NewType("Tokens", int)
"""A whole number of tokens >= 0 (an integer SQLite can store)."""
Depth = NewType("Depth", int)
"""A depth in the tree: 0 for a root."""
JsonObject = NewType("JsonObject", dict[str, Any])
"""Tool-call arguments: any JSON object."""

# Kinds a provider reports for a failed model call; the others (cancelled, timed_out,
# ...) are endings the reducer decides, not something a model call can fail with.
MODEL_ERROR_KINDS: tuple[ErrorKind, ...] = (
    ErrorKind.RATE_LIMIT,
    ErrorKind.SERVER_ERROR,
    ErrorKind.NETWORK,
    ErrorKind.TIMEOUT,
    ErrorKind.MALFORMED_RESPONSE,
    ErrorKind.AUTH,
    ErrorKind.INVALID_REQUEST,
    ErrorKind.CONTEXT_EXHAUSTED,
    ErrorKind.QUOTA_EXHAUSTED,
    ErrorKind.PROVIDER_FAILURE,
)


@attrs.frozen
class TokenUsage:
    """The usage a reply reports."""

    input_tokens: Tokens = Tokens(0)
    output_tokens: Tokens = Tokens(0)


@attrs.frozen
class Failure:
    """An injected model-call failure (``fail_first`` entry)."""

    kind: ErrorKind
    message: str = "scripted failure"
    retry_after: Seconds | None = None
    usage: TokenUsage = TokenUsage()  # what the failed attempt was billed


@attrs.frozen
class ScriptedCall:
    """A tool call of a reply; string arguments may hold placeholders."""

    name: str
    arguments: JsonObject = attrs.field(factory=lambda: JsonObject({}))


@attrs.frozen
class Reply:
    """One model round of an agent. ``latency`` None: the script's default.

    ``stop_reason`` None: ``tool_use`` with tool calls, else ``end_turn``; a script can
    play ``max_tokens`` (a reply cut off) or ``refusal`` (with ``stop_details``, the
    explanation) to see how a tree handles them offline.
    """

    text: str = ""
    tool_calls: tuple[ScriptedCall, ...] = ()
    latency: Seconds | None = None
    fail_first: tuple[Failure, ...] = ()
    usage: TokenUsage = TokenUsage()
    stop_reason: str | None = None
    stop_details: str = ""


@attrs.frozen
class Match:
    """Which conversations an agent entry is for; a key left out matches anything."""

    path: str | None = None
    task: str | None = None
    depth: Depth | None = None


@attrs.frozen
class Agent:
    """The replies of the conversations ``match`` selects, round by round."""

    match: Match = Match()
    replies: tuple[Reply, ...] = attrs.field(kw_only=True)
    # The reply to a summary call (context mode "summary"); None: a made-up summary.
    summary: Reply | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class Script:
    """A whole script."""

    agents: tuple[Agent, ...]
    latency: Seconds = Seconds(0.0)


def load_script(document: object, source: str = "script") -> Script:
    """Check ``document`` (parsed JSON) and build the Script.

    Raises ScriptError naming ``source`` and every place that is wrong, on one line.
    """
    try:
        return _CONVERTER.structure(document, Script)
    except (ClassValidationError, IterableValidationError, _Invalid) as exc:
        problems = [f"{where}: {what}" if where else what for where, what in _problems(exc, "")]
        shown = "; ".join(problems[:_SHOWN])
        if len(problems) > _SHOWN:
            shown += f"; and {len(problems) - _SHOWN} more"
        raise ScriptError(f"{source}: {shown}") from None


_SHOWN = 5  # problems named in one message


class _Invalid(ValueError):
    """A value that is not what its field takes; the message says what was expected."""


def _show(value: object) -> str:
    """A value as the JSON text the user wrote, cut short (containers by their kind)."""
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _strict(
    expected: str, accepts: Callable[[Any], bool], convert: Callable[[Any], Any] = lambda v: v
) -> Callable[[Any, Any], Any]:
    """A hook that takes the values ``accepts`` allows (converted) and refuses the rest."""

    def hook(value: Any, _: Any) -> Any:
        if not accepts(value):
            raise _Invalid(f"expected {expected}, got {_show(value)}")
        return convert(value)

    return hook


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_json_object(value: object) -> bool:
    if not isinstance(value, dict):
        return False
    # A script built in Python may hold what JSON cannot (a set, a tuple key). NaN and
    # infinities pass: a script stands for a model, a model may send them (JSON text
    # "NaN"), and the reducer is what refuses such a call with an error result.
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _structure_kind(value: Any, _: Any) -> ErrorKind:
    if isinstance(value, str) and value in {k.value for k in MODEL_ERROR_KINDS}:
        return ErrorKind(value)
    kinds = ", ".join(k.value for k in MODEL_ERROR_KINDS)
    raise _Invalid(f"expected an error kind ({kinds}), got {_show(value)}")


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    hook = converter.register_structure_hook
    hook(str, _strict("a string", lambda v: isinstance(v, str)))
    hook(
        Seconds,
        _strict(
            "a number of seconds >= 0",
            lambda v: _is_number(v) and math.isfinite(v) and v >= 0,
            float,
        ),
    )
    hook(
        Tokens,
        _strict(
            "a whole number of tokens >= 0",
            lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63,
        ),
    )
    hook(
        Depth,
        _strict(
            "a depth (a whole number >= 0)",
            lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31,
        ),
    )
    hook(JsonObject, _strict("a JSON object", _is_json_object))
    hook(ErrorKind, _structure_kind)

    # Records must be JSON objects and lists must be JSON lists: cattrs alone would
    # iterate a string as a list of characters, or call .keys() on it.
    def record_hook(cls: type) -> Callable[[Any, Any], Any]:
        structure: Callable[[Any, Any], Any] = make_dict_structure_fn(cls, converter)
        fields = ", ".join(f.name for f in attrs.fields(cls))

        def record(value: Any, kind: Any) -> Any:
            if not isinstance(value, dict):
                raise _Invalid(f"expected an object with keys {fields}, got {_show(value)}")
            return structure(value, kind)

        return record

    def list_hook(kind: Any) -> Callable[[Any, Any], Any]:
        (item,) = {a for a in typing.get_args(kind) if a is not Ellipsis}
        structure = converter.get_structure_hook(list[item])  # type: ignore[valid-type]

        def as_tuple(value: Any, _: Any) -> tuple[Any, ...]:
            if not isinstance(value, list):
                raise _Invalid(f"expected a list, got {_show(value)}")
            return tuple(structure(value, list[item]))  # type: ignore[valid-type]

        return as_tuple

    converter.register_structure_hook_factory(attrs.has, record_hook)
    converter.register_structure_hook_factory(_is_tuple, list_hook)
    return converter


def _is_tuple(kind: Any) -> bool:
    return typing.get_origin(kind) is tuple


_CONVERTER = _make_converter()


def _problems(exc: BaseException, where: str) -> list[tuple[str, str]]:
    """(place, problem) for every leaf of cattrs' validation error tree."""
    if isinstance(exc, ClassValidationError | IterableValidationError):
        found: list[tuple[str, str]] = []
        with_notes, without = exc.group_exceptions()
        for inner, note in with_notes:
            if isinstance(note, IterableValidationNote):
                place = f"{where}[{note.index}]"
            else:
                place = f"{where}.{note.name}" if where else note.name
            found += _problems(inner, place)
        for inner in without:
            found += _problems(inner, where)
        return found
    return [(where, _describe(exc))]


def _describe(exc: BaseException) -> str:
    match exc:
        case _Invalid():
            return str(exc)
        case ForbiddenExtraKeysError(cl=cls, extra_fields=extra):
            keys = ", ".join(f.name for f in attrs.fields(cls))
            unknown = ", ".join(repr(k) for k in sorted(extra))
            return f"unknown key(s) {unknown} (keys are {keys})"
        case KeyError():
            return "required, missing"
    return f"invalid ({exc})"
