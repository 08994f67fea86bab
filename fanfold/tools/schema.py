"""Tool input schemas: any valid JSON Schema, checked with the ``jsonschema`` package.

A tool's schema may be any valid JSON Schema (draft 2020-12 by default; the dialect its
``$schema`` names otherwise: draft-07 and the others ``jsonschema`` knows), as MCP
servers write them (pydantic's ``$defs``/``$ref``, ``anyOf``, ``format``, ``pattern``,
``maxLength``...). :func:`check_schema` refuses a schema that is not one (checked
against its dialect's metaschema), names an unknown dialect, or has a ``$ref`` that
points outside itself: nothing is ever fetched (the validators' registry has no
retrieval), so a reference must resolve inside the schema. ``format`` is an annotation,
as the 2020-12 specification makes it by default: it is offered to the model, not
asserted here (the tool checks its own values).

:func:`validate` checks a value with the dialect's validator (compiled once per schema
text) and writes every problem the way a model wrote the arguments (``argument
'tasks[0].task'``), saying what was expected and what was given.

``jsonschema`` is imported on first use, not with this module: a run whose calls all
pass ``ToolSet``'s fast check (the built-ins' common shapes) never loads it.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from fanfold.statemachine.messages import canonical_json

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

TYPES = frozenset({"string", "integer", "number", "boolean", "object", "array", "null"})


class SchemaError(ValueError):
    """A tool's schema is not a valid JSON Schema fanfold can check (the message says
    why: not an object, not valid under its metaschema, an unknown dialect, a ``$ref``
    outside the schema)."""


def check_schema(schema: Mapping[str, Any], where: str = "schema") -> None:
    """Raise :class:`SchemaError` unless ``schema`` is a valid JSON Schema whose
    references all resolve inside it."""
    if not isinstance(schema, Mapping):
        raise SchemaError(f"{where}: a schema must be an object")
    try:
        text = canonical_json(schema)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"{where}: not JSON ({exc})") from None
    problem = _schema_problem(text)
    if problem is not None:
        raise SchemaError(f"{where}: {problem}")


@functools.lru_cache(maxsize=512)
def _schema_problem(text: str) -> str | None:
    """Why the schema of canonical JSON ``text`` cannot be used, or None (cached: a
    server's schemas are checked once per process whatever the number of trees)."""
    from jsonschema.exceptions import SchemaError as MetaschemaError
    from jsonschema.validators import Draft202012Validator, validator_for

    schema = json.loads(text)
    cls = validator_for(schema, default=_UNKNOWN) if "$schema" in schema else Draft202012Validator
    if cls is _UNKNOWN:
        return f"unknown JSON Schema dialect $schema {str(schema.get('$schema'))[:100]!r}"
    try:
        cls.check_schema(schema)
    except MetaschemaError as exc:
        where = _json_path(exc.absolute_path) or "its top"
        return f"not a valid JSON Schema: at {where}: {_short(exc.message, 200)}"
    return _reference_problem(schema, cls)


class _Unknown:
    pass


_UNKNOWN: Any = _Unknown()


def _reference_problem(schema: dict[str, Any], cls: Any) -> str | None:
    """Why a ``$ref`` of ``schema`` cannot be resolved without fetching, or None."""
    from referencing import Registry
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import specification_with

    refs = list(_refs(schema))
    if not refs:
        return None
    dialect = cls.META_SCHEMA.get("$schema", "")
    resource = specification_with(dialect).create_resource(schema)
    registry = Registry().with_resource("", resource).crawl()
    resolver = registry.resolver()
    nested_ids = _has_nested_id(schema)
    for ref in refs:
        if nested_ids and not ref.startswith("#"):
            # A reference inside a subschema with its own ``$id`` is relative to that
            # ``$id``: the validator resolves it; validation reports one that fails.
            continue
        try:
            resolver.lookup(ref)
        except Unresolvable:
            if ref.startswith("#"):
                return f"its $ref {ref[:100]!r} points to nothing in the schema"
            return (
                f"its $ref {ref[:100]!r} points outside the schema "
                "(fanfold fetches no schema: a reference must resolve inside it)"
            )
    return None


def _refs(schema: object) -> Iterator[str]:
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in ("$ref", "$dynamicRef", "$recursiveRef") and isinstance(value, str):
                yield value
            elif key not in ("enum", "const", "default", "examples"):
                yield from _refs(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _refs(item)


def _has_nested_id(schema: object, top: bool = True) -> bool:
    if isinstance(schema, dict):
        if not top and isinstance(schema.get("$id"), str):
            return True
        return any(
            _has_nested_id(v, False)
            for k, v in schema.items()
            if k not in ("enum", "const", "default", "examples")
        )
    if isinstance(schema, list):
        return any(_has_nested_id(v, False) for v in schema)
    return False


@functools.lru_cache(maxsize=512)
def _validator(text: str) -> Validator:
    """The compiled validator of the schema whose canonical JSON is ``text``, with a
    registry that retrieves nothing (a ``$ref`` to a URL is never fetched)."""
    from jsonschema.validators import Draft202012Validator, validator_for
    from referencing import Registry

    schema = json.loads(text)
    cls = validator_for(schema, default=Draft202012Validator)
    validator: Validator = cls(schema, registry=Registry())
    return validator


def json_type(value: object) -> str:
    """The JSON type name of a parsed JSON value, as used in messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _show(value: object) -> str:
    text = repr(value) if not isinstance(value, str) else f'"{value}"'
    return _short(text, 40)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _article(kind: str) -> str:
    return "an" if kind[0] in "aeiou" else "a"


def _json_path(path: Iterable[str | int], prefix: str = "") -> str:
    """``tasks[0].task`` for the path ``("tasks", 0, "task")`` (after ``prefix``)."""
    out = prefix
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out


_Key = tuple[tuple[tuple[int, int | str], ...], int]


def _sort_key(path: Iterable[str | int], rank: int) -> _Key:
    """Problems in reading order: a value's missing and unknown arguments, then its
    arguments' own problems, depth first."""
    return (tuple((0, p) if isinstance(p, int) else (1, p) for p in path), rank)


def validate(schema: Mapping[str, Any], value: object, path: str = "") -> list[str]:
    """Every way ``value`` breaks ``schema``, as messages; empty when it conforms.

    ``path`` names ``value`` in messages (``"timeout"``, ``"tasks[0].task"``); the empty
    path means the whole arguments object. ``schema`` must have passed
    :func:`check_schema`.
    """
    # Keyed by the schema's text in its own key order (a spec's text is canonical), so
    # that messages list properties in the order the schema gives them.
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    return _problems(_validator(text), value, path)


def validate_text(schema_json: str, value: object) -> list[str]:
    """:func:`validate` for a schema given as its canonical JSON text (a spec's
    ``input_schema_json``): the compiled validator is looked up by that text."""
    return _problems(_validator(schema_json), value, "")


def _problems(validator: Validator, value: object, path: str) -> list[str]:
    from referencing.exceptions import Unresolvable

    found: list[tuple[_Key, str]] = list(_non_finite(value, (), path))
    try:
        errors = list(validator.iter_errors(value))  # type: ignore[arg-type]
    except Unresolvable as exc:  # a reference the schema check could not see
        return [f"the arguments cannot be checked: the schema's $ref {exc} cannot be resolved"]
    for error in errors:
        found += _messages(error, path)
    found.sort(key=lambda pair: pair[0])
    return list(dict.fromkeys(message for _, message in found))


def _non_finite(value: object, at: tuple[str | int, ...], path: str) -> Iterator[tuple[_Key, str]]:
    # JSON has no NaN or infinity, but Python's parser reads them: a value the schema
    # would take as a number (and compare as nothing) is refused here.
    if isinstance(value, float) and not math.isfinite(value):
        label = _label(at, path)
        yield _sort_key(at, 2), f"{label} must be a finite number, got {value}"
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite(item, (*at, key), path)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _non_finite(item, (*at, i), path)


def _label(at: Iterable[str | int], path: str) -> str:
    name = _json_path(at, path)
    return f"argument '{name}'" if name else "arguments"


def _messages(error: ValidationError, path: str) -> list[tuple[_Key, str]]:
    """``error`` (and, for ``anyOf``/``oneOf``, the errors of the branch the value was
    meant for) as messages with their sort keys."""
    at = tuple(error.absolute_path)
    label = _label(at, path)
    keyword = str(error.validator)
    parent: Any = error.schema if isinstance(error.schema, Mapping) else {}
    expected: Any = error.validator_value
    instance = error.instance
    if isinstance(instance, float) and not math.isfinite(instance):
        return []  # said once by _non_finite
    if keyword == "type":
        kinds = expected if isinstance(expected, list) else [expected]
        return [(_sort_key(at, 2), _type_message(label, kinds, instance))]
    if keyword == "required" and isinstance(instance, dict):
        return [
            (_sort_key(at, 0), f"missing required argument '{_json_path((*at, name), path)}'")
            for name in expected
            if name not in instance
        ]
    if keyword == "additionalProperties" and expected is False and isinstance(instance, dict):
        properties = parent.get("properties", {})
        patterns = list(parent.get("patternProperties", {}))
        names = ", ".join(properties) or "none"
        return [
            (
                _sort_key(at, 1),
                f"unknown argument '{_json_path((*at, name), path)}' (expected: {names})",
            )
            for name in instance
            if name not in properties and not any(re.search(p, name) for p in patterns)
        ]
    if keyword in ("anyOf", "oneOf") and error.context:
        return _alternatives(error, at, label, path)
    return [(_sort_key(at, 2), _keyword_message(label, keyword, expected, instance, error))]


def _type_message(label: str, kinds: list[str], value: object) -> str:
    got = json_type(value)
    wanted = " or ".join(f"{_article(k)} {k}" for k in dict.fromkeys(kinds))
    return f"{label} must be {wanted}, got {_article(got)} {got} ({_show(value)})"


def _keyword_message(
    label: str, keyword: str, expected: Any, value: object, error: ValidationError
) -> str:
    numeric = isinstance(expected, int | float) and not isinstance(expected, bool)
    if keyword == "enum":
        choices = ", ".join(_show(c) for c in expected)
        return f"{label} must be one of {choices}, got {_show(value)}"
    if keyword == "const":
        return f"{label} must be {_show(expected)}, got {_show(value)}"
    if keyword in _BOUNDS and numeric:
        return f"{label} must be {_BOUNDS[keyword]} {expected}, got {value}"
    if keyword == "minLength" and numeric:
        if expected == 1:
            return f"{label} must not be empty"
        return f"{label} must be at least {expected} characters long"
    if keyword == "maxLength" and numeric and isinstance(value, str):
        return f"{label} must be at most {expected} characters long, got {len(value)}"
    if keyword == "minItems" and numeric:
        return f"{label} must have at least {expected} item(s)"
    if keyword == "maxItems" and numeric:
        return f"{label} must have at most {expected} item(s)"
    if keyword == "pattern":
        return f"{label} must match the pattern {_short(str(expected), 80)!r}, got {_show(value)}"
    if keyword == "multipleOf" and numeric:
        return f"{label} must be a multiple of {expected}, got {value}"
    if keyword == "uniqueItems":
        return f"{label} must not repeat an item"
    if keyword == "oneOf":
        return f"{label} must match only one of the accepted forms, got {_show(value)}"
    return f"{label}: {_short(error.message, 200)}"


_BOUNDS = {
    "minimum": ">=",
    "maximum": "<=",
    "exclusiveMinimum": ">",
    "exclusiveMaximum": "<",
}


def _alternatives(
    error: ValidationError, at: tuple[str | int, ...], label: str, path: str
) -> list[tuple[_Key, str]]:
    """An ``anyOf``/``oneOf`` that no branch takes. When every branch wants another
    type (``Optional[int]`` given a string), one message lists the types; otherwise the
    branches of the value's type say what is wrong (an object for ``Optional[Model]``
    with a field missing: the model's messages)."""
    branches: dict[int, list[ValidationError]] = {}
    for sub in error.context or ():
        branches.setdefault(int(sub.relative_schema_path[0]), []).append(sub)
    kinds: list[str] = []
    fitting: list[list[ValidationError]] = []
    for subs in branches.values():
        wrong_type = [s for s in subs if s.validator == "type" and tuple(s.absolute_path) == at]
        if wrong_type:
            for s in wrong_type:
                value: Any = s.validator_value
                kinds += value if isinstance(value, list) else [str(value)]
        else:
            fitting.append(subs)
    if not fitting and kinds:
        return [(_sort_key(at, 2), _type_message(label, kinds, error.instance))]
    if len(fitting) == 1:
        return [m for sub in fitting[0] for m in _messages(sub, path)]
    from jsonschema.exceptions import best_match

    best = best_match(sub for subs in fitting for sub in subs)
    if best is None:
        return [(_sort_key(at, 2), f"{label}: {_short(error.message, 200)}")]
    inner = "; ".join(m for _, m in _messages(best, path))
    return [(_sort_key(at, 2), f"{label} must match one of the accepted forms ({inner})")]


def describe(schema: object) -> str:
    """A short name of what ``schema`` takes: ``string``, ``integer | null``,
    ``"red" | "blue"`` (an enum's choices), ``Address`` (a reference's last part),
    ``any``."""
    if not isinstance(schema, Mapping):
        return "any"
    if "enum" in schema and isinstance(schema["enum"], list):
        # The choices themselves (an enum read "enum", and before that "any").
        choices = " | ".join(_show(c) for c in schema["enum"][:6])
        return choices + (" | ..." if len(schema["enum"]) > 6 else "")
    kind = schema.get("type")
    if isinstance(kind, str):
        return kind
    if isinstance(kind, list):
        return " | ".join(str(k) for k in kind)
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return ref.rsplit("/", 1)[-1] or "any"
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            return " | ".join(dict.fromkeys(describe(b) for b in branches))
    return "any"


def describe_arguments(schema: Mapping[str, Any]) -> str:
    """A one-line summary of an object schema's arguments, for error messages.

    Example: ``"command: string (required), timeout: number"``.
    """
    required = set(schema.get("required", []))
    parts = []
    properties = schema.get("properties", {})
    for name, sub in properties.items() if isinstance(properties, Mapping) else ():
        part = f"{name}: {describe(sub)}"
        if name in required:
            part += " (required)"
        parts.append(part)
    return ", ".join(parts) or "none"


def validate_arguments(tool: str, schema: Mapping[str, Any], arguments: object) -> str | None:
    """Check a tool call's parsed arguments; return the model-facing message, or None.

    The message starts with the tool name and ends with the expected arguments, e.g.
    ``"bash: missing required argument 'command'. Expected arguments: command: string
    (required), timeout: number"``.
    """
    return _arguments_message(tool, schema, validate(schema, arguments))


def _arguments_message(tool: str, schema: Mapping[str, Any], problems: list[str]) -> str | None:
    if not problems:
        return None
    return f"{tool}: {'; '.join(problems)}. Expected arguments: {describe_arguments(schema)}"


def validate_spec_arguments(tool: str, schema_json: str, arguments: object) -> str | None:
    """:func:`validate_arguments` for a spec's canonical schema text."""
    problems = validate_text(schema_json, arguments)
    if not problems:
        return None
    return _arguments_message(tool, json.loads(schema_json), problems)
