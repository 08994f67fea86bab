"""A small validator for the JSON-schema subset fanfold's tool schemas use.

Supported keywords: ``type`` (string, integer, number, boolean, object, array, null,
or a list of them: ``["string", "null"]`` for an optional value),
``properties``, ``required``, ``additionalProperties`` (a boolean), ``enum``,
``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``, ``minLength``,
``items``, ``minItems``, ``maxItems``, and the annotations ``description``, ``title``,
``default`` and ``examples``. :func:`check_schema` refuses any other keyword, so a
schema can never carry a constraint that is silently not enforced.

Messages name arguments the way a model wrote them (``argument 'tasks[0].task'``) and
say what was expected and what was given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

ANNOTATIONS = frozenset({"description", "title", "default", "examples"})
KEYWORDS = ANNOTATIONS | {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "items",
    "minItems",
    "maxItems",
}
TYPES = frozenset({"string", "integer", "number", "boolean", "object", "array", "null"})


class SchemaError(ValueError):
    """A tool's own schema uses something outside the supported subset (a fanfold bug)."""


def check_schema(schema: Mapping[str, Any], where: str = "schema") -> None:
    """Raise :class:`SchemaError` unless ``schema`` stays inside the supported subset."""
    if not isinstance(schema, Mapping):
        raise SchemaError(f"{where}: a schema must be an object")
    unknown = set(schema) - KEYWORDS
    if unknown:
        raise SchemaError(f"{where}: unsupported keyword(s): {', '.join(sorted(unknown))}")
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if kind is not None and (
        not kinds or not all(isinstance(k, str) and k in TYPES for k in kinds)
    ):
        raise SchemaError(f"{where}: unsupported type {kind!r}")
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        raise SchemaError(f"{where}: 'properties' must be an object")
    for name, sub in properties.items():
        check_schema(sub, f"{where}.properties.{name}")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise SchemaError(f"{where}: 'required' must be a list of names")
    missing = [r for r in required if r not in properties]
    if missing:
        raise SchemaError(f"{where}: required but not described: {', '.join(missing)}")
    if not isinstance(schema.get("additionalProperties", True), bool):
        raise SchemaError(f"{where}: 'additionalProperties' must be true or false")
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise SchemaError(f"{where}: 'enum' must be a list")
    if "items" in schema:
        check_schema(schema["items"], f"{where}.items")


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


def _has_type(value: object, kind: str) -> bool:
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    return json_type(value) == kind


def _show(value: object) -> str:
    text = repr(value) if not isinstance(value, str) else f'"{value}"'
    return text if len(text) <= 40 else text[:37] + "..."


def _article(kind: str) -> str:
    return "an" if kind[0] in "aeiou" else "a"


def validate(schema: Mapping[str, Any], value: object, path: str = "") -> list[str]:
    """Every way ``value`` breaks ``schema``, as messages; empty when it conforms.

    ``path`` names ``value`` in messages (``"timeout"``, ``"tasks[0].task"``); the empty
    path means the whole arguments object.
    """
    label = f"argument '{path}'" if path else "arguments"
    kind = schema.get("type")
    if isinstance(kind, list):
        # A list of types (``["string", "null"]``): the value must have one of them.
        if not any(_has_type(value, k) for k in kind):
            got = json_type(value)
            wanted = " or ".join(f"{_article(k)} {k}" for k in kind)
            return [f"{label} must be {wanted}, got {_article(got)} {got} ({_show(value)})"]
    elif kind is not None and not _has_type(value, kind):
        got = json_type(value)
        return [
            f"{label} must be {_article(kind)} {kind}, got {_article(got)} {got} ({_show(value)})"
        ]
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{label} must be a finite number, got {value}"]
    problems: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(_show(c) for c in schema["enum"])
        problems.append(f"{label} must be one of {choices}, got {_show(value)}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        problems += _check_bounds(schema, value, label)
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        if schema["minLength"] == 1:
            problems.append(f"{label} must not be empty")
        else:
            problems.append(f"{label} must be at least {schema['minLength']} characters long")
    if isinstance(value, list):
        problems += _check_array(schema, value, path, label)
    if isinstance(value, dict):
        problems += _check_object(schema, value, path)
    return problems


def _check_bounds(schema: Mapping[str, Any], value: float, label: str) -> list[str]:
    problems = []
    if "minimum" in schema and value < schema["minimum"]:
        problems.append(f"{label} must be >= {schema['minimum']}, got {value}")
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        problems.append(f"{label} must be > {schema['exclusiveMinimum']}, got {value}")
    if "maximum" in schema and value > schema["maximum"]:
        problems.append(f"{label} must be <= {schema['maximum']}, got {value}")
    if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
        problems.append(f"{label} must be < {schema['exclusiveMaximum']}, got {value}")
    return problems


def _check_array(schema: Mapping[str, Any], value: list[Any], path: str, label: str) -> list[str]:
    problems = []
    if len(value) < schema.get("minItems", 0):
        problems.append(f"{label} must have at least {schema['minItems']} item(s)")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        problems.append(f"{label} must have at most {schema['maxItems']} item(s)")
    if "items" in schema:
        for i, item in enumerate(value):
            problems += validate(schema["items"], item, f"{path}[{i}]")
    return problems


def _check_object(schema: Mapping[str, Any], value: dict[str, Any], path: str) -> list[str]:
    def child(name: str) -> str:
        return f"{path}.{name}" if path else name

    properties: Mapping[str, Any] = schema.get("properties", {})
    problems = [
        f"missing required argument '{child(name)}'"
        for name in schema.get("required", [])
        if name not in value
    ]
    if schema.get("additionalProperties", True) is False:
        expected = ", ".join(properties) or "none"
        problems += [
            f"unknown argument '{child(name)}' (expected: {expected})"
            for name in value
            if name not in properties
        ]
    for name, sub in properties.items():
        if name in value:
            problems += validate(sub, value[name], child(name))
    return problems


def describe_arguments(schema: Mapping[str, Any]) -> str:
    """A one-line summary of an object schema's arguments, for error messages.

    Example: ``"command: string (required), timeout: number"``.
    """
    required = set(schema.get("required", []))
    parts = []
    for name, sub in schema.get("properties", {}).items():
        part = f"{name}: {_kind(sub)}"
        if name in required:
            part += " (required)"
        parts.append(part)
    return ", ".join(parts) or "none"


def _kind(schema: object) -> str:
    """What a property takes, in a word or a few: ``integer``, ``string | null``,
    ``"red" | "blue"`` (an enum read "any" before), ``Address`` (a ``$ref``)."""
    if not isinstance(schema, Mapping):
        return "any"
    if "enum" in schema and isinstance(schema["enum"], list):
        choices = " | ".join(_show(c) for c in schema["enum"][:6])
        return choices + (" | ..." if len(schema["enum"]) > 6 else "")
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(str(k) for k in kind)
    if isinstance(kind, str):
        return kind
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return ref.rpartition("/")[2] or "any"
    branches = schema.get("anyOf", schema.get("oneOf"))
    if isinstance(branches, list) and branches:
        return " | ".join(_kind(b) for b in branches)
    return "any"


def validate_arguments(tool: str, schema: Mapping[str, Any], arguments: object) -> str | None:
    """Check a tool call's parsed arguments; return the model-facing message, or None.

    The message starts with the tool name and ends with the expected arguments, e.g.
    ``"bash: missing required argument 'command'. Expected arguments: command: string
    (required), timeout: number"``.
    """
    problems = validate(schema, arguments)
    if not problems:
        return None
    return f"{tool}: {'; '.join(problems)}. Expected arguments: {describe_arguments(schema)}"
