"""The JSON-schema subset validator: messages a model can act on."""

from __future__ import annotations

from typing import Any

import pytest

from fanfold.statemachine.control_tools import (
    SPAWN_AGENTS_SPEC,
    SUBMIT_ERROR_SPEC,
    SUBMIT_RESULT_SPEC,
)
from fanfold.tools import SchemaError, ToolSet, check_schema, validate, validate_arguments

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "count"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "count": {"type": "integer", "minimum": 1, "maximum": 10},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "flag": {"type": "boolean"},
        "mode": {"type": "string", "enum": ["fast", "slow"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
        "nested": {
            "type": "object",
            "required": ["id"],
            "properties": {"id": {"type": "integer"}, "code": {"type": "string", "minLength": 3}},
        },
    },
}


def test_valid_arguments_pass() -> None:
    args = {
        "name": "x",
        "count": 3,
        "ratio": 0.5,
        "flag": False,
        "mode": "fast",
        "tags": ["a"],
        "nested": {"id": 1, "extra": "allowed here"},
    }
    assert validate(SCHEMA, args) == []
    assert validate_arguments("tool", SCHEMA, args) is None


BASE = {"name": "x", "count": 1}


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"count": 1}, "missing required argument 'name'"),
        ({"name": 5, "count": 1}, "argument 'name' must be a string, got an integer (5)"),
        ({"name": "", "count": 1}, "argument 'name' must not be empty"),
        ({"name": "x", "count": True}, "argument 'count' must be an integer, got a boolean (True)"),
        ({"name": "x", "count": 1.5}, "argument 'count' must be an integer, got a number (1.5)"),
        ({"name": "x", "count": 0}, "argument 'count' must be >= 1, got 0"),
        ({"name": "x", "count": 11}, "argument 'count' must be <= 10, got 11"),
        ({**BASE, "ratio": 0}, "argument 'ratio' must be > 0, got 0"),
        ({**BASE, "ratio": 1}, "argument 'ratio' must be < 1, got 1"),
        ({**BASE, "ratio": "1"}, "argument 'ratio' must be a number, got a string (\"1\")"),
        ({**BASE, "ratio": float("nan")}, "argument 'ratio' must be a finite number, got nan"),
        ({**BASE, "flag": "true"}, "argument 'flag' must be a boolean, got a string (\"true\")"),
        (
            {**BASE, "mode": "medium"},
            'argument \'mode\' must be one of "fast", "slow", got "medium"',
        ),
        ({**BASE, "tags": []}, "argument 'tags' must have at least 1 item(s)"),
        ({**BASE, "tags": ["a", "b", "c"]}, "argument 'tags' must have at most 2 item(s)"),
        ({**BASE, "tags": ["a", 2]}, "argument 'tags[1]' must be a string, got an integer (2)"),
        ({**BASE, "tags": "a"}, "argument 'tags' must be an array, got a string (\"a\")"),
        ({**BASE, "nested": {}}, "missing required argument 'nested.id'"),
        (
            {**BASE, "nested": {"id": 1, "code": "ab"}},
            "argument 'nested.code' must be at least 3 characters long",
        ),
        ({**BASE, "nested": []}, "argument 'nested' must be an object, got an array ([])"),
        (
            {**BASE, "colour": "red"},
            "unknown argument 'colour' (expected: name, count, ratio, flag, mode, tags, nested)",
        ),
    ],
)
def test_each_problem_has_a_clear_message(args: dict[str, Any], problem: str) -> None:
    assert validate(SCHEMA, args) == [problem]


def test_integral_floats_are_integers() -> None:
    assert validate(SCHEMA, {"name": "x", "count": 2.0}) == []


def test_all_problems_are_reported_together_with_the_expected_arguments() -> None:
    message = validate_arguments("demo", SCHEMA, {"count": "3", "flag": 1})
    assert message == (
        "demo: missing required argument 'name'; argument 'count' must be an integer, got a "
        "string (\"3\"); argument 'flag' must be a boolean, got an integer (1). Expected "
        "arguments: name: string (required), count: integer (required), ratio: number, "
        'flag: boolean, mode: "fast" | "slow", tags: array, nested: object'
    )


def test_non_object_arguments() -> None:
    assert validate(SCHEMA, [1, 2]) == ["arguments must be an object, got an array ([1, 2])"]
    assert validate(SCHEMA, None) == ["arguments must be an object, got a null (None)"]


def test_long_values_are_abbreviated_in_messages() -> None:
    [problem] = validate({"type": "integer"}, "x" * 100, "n")
    assert problem == "argument 'n' must be an integer, got a string (\"" + "x" * 36 + "...)"


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "object", "pattern": "x"}, "schema: unsupported keyword(s): pattern"),
        ({"type": "tuple"}, "schema: unsupported type 'tuple'"),
        ({"type": "object", "required": ["a"]}, "schema: required but not described: a"),
        ({"properties": {"a": {"format": "uri"}}}, "schema.properties.a: unsupported keyword"),
        ({"items": {"oneOf": []}}, "schema.items: unsupported keyword(s): oneOf"),
        ({"additionalProperties": {}}, "'additionalProperties' must be true or false"),
        ({"enum": "ab"}, "schema: 'enum' must be a list"),
        ({"required": "a"}, "schema: 'required' must be a list of names"),
    ],
)
def test_check_schema_refuses_what_validate_cannot_enforce(
    schema: dict[str, Any], message: str
) -> None:
    with pytest.raises(SchemaError, match=None) as info:
        check_schema(schema)
    assert message in str(info.value)


def test_every_shipped_schema_is_inside_the_subset() -> None:
    for spec in (
        *ToolSet.default().specs(),
        SPAWN_AGENTS_SPEC,
        SUBMIT_RESULT_SPEC,
        SUBMIT_ERROR_SPEC,
    ):
        check_schema(spec.input_schema(), spec.name)
        assert spec.description
        for name, sub in spec.input_schema()["properties"].items():
            assert sub.get("description"), f"{spec.name}.{name} has no description"


def test_spawn_agents_schema_validates_nested_tasks() -> None:
    schema = SPAWN_AGENTS_SPEC.input_schema()
    assert validate(schema, {"tasks": [{"task": "t", "max_iterations": 2}]}) == []
    assert validate(schema, {"tasks": []}) == ["argument 'tasks' must have at least 1 item(s)"]
    assert validate(schema, {"tasks": [{"max_iterations": 0}]}) == [
        "missing required argument 'tasks[0].task'",
        "argument 'tasks[0].max_iterations' must be >= 1, got 0",
    ]
