"""Tool schemas: any valid JSON Schema, checked by ``jsonschema``; messages a model can
act on."""

from __future__ import annotations

from typing import Any

import pytest

from fanfold.providers.wire import provider_schema
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
        ({"type": "tuple"}, "schema: not a valid JSON Schema: at type: 'tuple' is not valid"),
        ({"enum": "ab"}, "schema: not a valid JSON Schema: at enum: 'ab' is not of type 'array'"),
        ({"required": "a"}, "not a valid JSON Schema: at required: 'a' is not of type 'array'"),
        (
            {"items": {"oneOf": []}},
            "not a valid JSON Schema: at items.oneOf: [] should be non-empty",
        ),
        ({"minLength": -1}, "not a valid JSON Schema: at minLength: -1 is less than the minimum"),
        ({"$schema": "https://example.com/mine"}, "unknown JSON Schema dialect $schema"),
        (
            {"properties": {"a": {"$ref": "https://example.com/a.json"}}},
            "its $ref 'https://example.com/a.json' points outside the schema (fanfold "
            "fetches no schema",
        ),
        (
            {"properties": {"a": {"$ref": "#/$defs/Missing"}}},
            "its $ref '#/$defs/Missing' points to nothing in the schema",
        ),
        (
            {"$schema": "http://json-schema.org/draft-07/schema#", "type": ["x"]},
            "not a valid JSON Schema: at type: ['x'] is not valid",
        ),
    ],
)
def test_check_schema_refuses_what_is_not_a_valid_json_schema(
    schema: dict[str, Any], message: str
) -> None:
    with pytest.raises(SchemaError) as info:
        check_schema(schema)
    assert message in str(info.value)


# What pydantic writes for a tool taking ordinary types (the SDK's MCPServer, FastMCP):
# Optional, Literal, Field constraints, a nested model by reference, a free-form dict.
PYDANTIC: dict[str, Any] = {
    "$defs": {
        "Address": {
            "properties": {
                "street": {"maxLength": 20, "title": "Street", "type": "string"},
                "zip": {"pattern": "^[0-9]{5}$", "title": "Zip", "type": "string"},
            },
            "required": ["street", "zip"],
            "title": "Address",
            "type": "object",
        }
    },
    "properties": {
        "url": {"format": "uri", "minLength": 1, "type": "string"},
        "tags": {"anyOf": [{"items": {"type": "string"}, "type": "array"}, {"type": "null"}]},
        "mode": {"enum": ["fast", "slow"], "type": "string"},
        "level": {"anyOf": [{"enum": ["a", "b"], "type": "string"}, {"type": "null"}]},
        "count": {"exclusiveMinimum": 0, "maximum": 10, "type": "integer"},
        "home": {"$ref": "#/$defs/Address"},
        "work": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}]},
        "extra": {"additionalProperties": {"type": "integer"}, "type": "object"},
    },
    "required": ["url"],
    "title": "toolArguments",
    "type": "object",
}
HOME = {"street": "Main", "zip": "12345"}


def test_pydantic_schemas_are_accepted_and_enforced() -> None:
    check_schema(PYDANTIC)
    good = {
        "url": "https://example.com",
        "tags": None,
        "mode": "fast",
        "level": "a",
        "count": 3,
        "home": HOME,
        "work": None,
        "extra": {"n": 1},
    }
    assert validate(PYDANTIC, good) == []
    assert validate(PYDANTIC, {**good, "tags": ["x"], "work": HOME}) == []
    # ``format`` is an annotation (2020-12's default): offered, not asserted.
    assert validate(PYDANTIC, {"url": "not a url"}) == []


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({}, "missing required argument 'url'"),
        ({"url": ""}, "argument 'url' must not be empty"),
        ({"url": "u", "tags": "x"}, "argument 'tags' must be an array or a null, got a string"),
        ({"url": "u", "tags": [1]}, "argument 'tags[0]' must be a string, got an integer (1)"),
        ({"url": "u", "mode": "medium"}, 'argument \'mode\' must be one of "fast", "slow"'),
        ({"url": "u", "level": "c"}, 'argument \'level\' must be one of "a", "b", got "c"'),
        ({"url": "u", "count": 0}, "argument 'count' must be > 0, got 0"),
        ({"url": "u", "home": {"zip": "12345"}}, "missing required argument 'home.street'"),
        (
            {"url": "u", "home": {**HOME, "street": "x" * 21}},
            "argument 'home.street' must be at most 20 characters long, got 21",
        ),
        (
            {"url": "u", "work": {**HOME, "zip": "1"}},
            "argument 'work.zip' must match the pattern '^[0-9]{5}$', got \"1\"",
        ),
        ({"url": "u", "work": 5}, "argument 'work' must be an object or a null, got an integer"),
        ({"url": "u", "extra": {"n": "1"}}, "argument 'extra.n' must be an integer, got a string"),
    ],
)
def test_pydantic_schemas_problems_name_the_argument(args: dict[str, Any], problem: str) -> None:
    problems = validate(PYDANTIC, args)
    assert len(problems) == 1, problems
    assert problems[0].startswith(problem), problems


def test_draft_07_schemas_are_checked_as_draft_07() -> None:
    # Draft-07's ``definitions`` and its tuple ``items``, which 2020-12 spells otherwise.
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"N": {"type": "integer"}},
        "properties": {"pair": {"items": [{"$ref": "#/definitions/N"}, {"type": "string"}]}},
        "type": "object",
    }
    check_schema(schema)
    assert validate(schema, {"pair": [1, "a"]}) == []
    assert validate(schema, {"pair": ["a", "a"]}) == [
        "argument 'pair[0]' must be an integer, got a string (\"a\")"
    ]


def test_a_remote_reference_is_never_fetched() -> None:
    # An unresolvable remote $ref met while validating (the check above refuses such a
    # schema; a program may still call validate) is a problem, not a network request.
    schema = {"properties": {"a": {"$ref": "http://127.0.0.1:9/nothing.json"}}}
    [problem] = validate(schema, {"a": 1})
    assert "cannot be checked" in problem


def test_provider_schema_drops_only_what_providers_refuse_at_the_top() -> None:
    assert provider_schema(PYDANTIC) is PYDANTIC
    one_of = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "anyOf": [
            {"required": ["a"]},
            {"properties": {"b": {"type": "integer"}}, "required": ["b"]},
        ],
    }
    assert provider_schema(one_of) == {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
    }
    # The full schema is still what calls are checked against.
    assert validate(one_of, {}) == [
        "arguments must match one of the accepted forms (missing required argument 'a')"
    ]


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


def test_both_providers_are_sent_the_narrowed_copy() -> None:
    from fanfold.providers.anthropic import to_anthropic_tools
    from fanfold.providers.openai import to_openai_tools
    from fanfold.statemachine import ToolSpec

    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "oneOf": [{}, {}]}
    spec = ToolSpec.from_schema("t", "d", schema)
    (openai,) = to_openai_tools([spec])
    (anthropic,) = to_anthropic_tools([spec])
    expected = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert openai["function"]["parameters"] == anthropic["input_schema"] == expected
    plain = ToolSet.default().specs()[0]
    assert to_openai_tools([plain])[0]["function"]["parameters"] == plain.input_schema()


def test_well_formed_calls_of_the_built_ins_never_load_jsonschema() -> None:
    import subprocess
    import sys

    code = (
        "import sys, trio\n"
        "from fanfold.tools import ToolSet\n"
        "from fanfold.statemachine import ToolCall\n"
        "tools = ToolSet.default()\n"
        "call = ToolCall('c', 'think', '{\"thought\": \"x\"}')\n"
        "assert not trio.run(tools.run, call, '.').is_error\n"
        "print('jsonschema' in sys.modules)\n"
        "bad = ToolCall('c', 'think', '{}')\n"
        "assert trio.run(tools.run, bad, '.').is_error\n"
        "print('jsonschema' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
