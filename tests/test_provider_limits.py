"""What each provider is sent for a tool, checked limit by limit against what the
providers document or answer (issue 33, item 1: "a provider that needs a narrower form
gets a converted copy, tested against its documented limits"). DESIGN.md, "What each
provider is sent", has the table and the sources.

The schemas are the shapes real servers emit: pydantic's ``$defs``/``$ref``,
``Optional`` as ``anyOf`` with null, ``format``, ``Field(pattern=...)`` as written
(anchored or not), a "one of these arguments" rule as a top-level ``anyOf``. The copy
is made where the request body is built; the schema as given stays what the call is
checked against and what the log records.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Annotated, Any, Literal

import attrs
import httpx
import pydantic
import pytest
from fakeserver import anthropic_message, openai_completion

from fanfold.providers.anthropic import AnthropicProvider, to_anthropic_tools
from fanfold.providers.base import CallContext, ProviderError
from fanfold.providers.openai import (
    OPENAI_DESCRIPTION_LIMIT,
    OpenAIProvider,
    openai_hosted,
    to_openai_tools,
)
from fanfold.providers.wire import PROVIDER_TOP_LEVEL_REFUSED, anchored
from fanfold.statemachine import ErrorKind, ModelRequest, ToolSpec, UserMessage
from fanfold.statemachine.control_tools import (
    SPAWN_AGENTS_SPEC,
    SUBMIT_ERROR_SPEC,
    SUBMIT_RESULT_SPEC,
)
from fanfold.tools import ToolSet, validate

# OpenAI: "Must be a-z, A-Z, 0-9, or contain underscores and dashes, with a maximum
# length of 64"; Anthropic: "Must match the regex ^[a-zA-Z0-9_-]{1,64}$".
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}\Z")


class Address(pydantic.BaseModel):
    street: str
    zip: Annotated[str, pydantic.Field(pattern=r"^[0-9]{5}$")]


class Fetch(pydantic.BaseModel):
    """mcp-server-fetch's arguments, and a nested model, as pydantic writes them."""

    url: Annotated[pydantic.AnyUrl, pydantic.Field(description="URL to fetch")]
    max_length: Annotated[int, pydantic.Field(gt=0, lt=1_000_000)] = 5000
    tags: list[str] | None = None
    mode: Literal["fast", "slow"] = "fast"
    home: Address | None = None
    # An unanchored pattern, as pydantic users write it (a search, by JSON Schema).
    slug: Annotated[str, pydantic.Field(pattern=r"[a-z]+", description="A slug")] = "a"
    code: Annotated[str | None, pydantic.Field(pattern=r"\d{3}")] = None


PYDANTIC = Fetch.model_json_schema()
ONE_OF_THESE = {
    "type": "object",
    "properties": {"a": {"type": "string"}},
    "anyOf": [{"required": ["a"]}, {"properties": {"b": {"type": "integer"}}, "required": ["b"]}],
}
NO_TYPE_ONE_OF = {"oneOf": [{"properties": {"x": {"type": "string"}}, "required": ["x"]}]}
SCHEMAS = {"pydantic": PYDANTIC, "top-level anyOf": ONE_OF_THESE, "no type": NO_TYPE_ONE_OF}


def sent(schema: dict[str, Any], description: str = "d") -> list[dict[str, Any]]:
    """The schema each provider is sent for a tool ``t`` with ``schema``."""
    spec = ToolSpec.from_schema("t", description, schema)
    (openai,) = to_openai_tools([spec])
    (anthropic,) = to_anthropic_tools([spec])
    return [openai["function"]["parameters"], anthropic["input_schema"]]


def patterns(schema: Any) -> list[str]:
    """Every ``pattern`` keyword in ``schema`` (not a property named "pattern")."""
    if isinstance(schema, list):
        return [p for s in schema for p in patterns(s)]
    if not isinstance(schema, dict):
        return []
    found = [schema["pattern"]] if isinstance(schema.get("pattern"), str) else []
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions", "patternProperties"):
            found += [p for sub in value.values() for p in patterns(sub)]
        elif isinstance(value, dict | list) and key not in ("enum", "const", "required"):
            found += patterns(value)
    return found


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_each_provider_gets_an_object_without_combinators_at_the_top(name: str) -> None:
    # OpenAI: "schema must have type 'object' and not have 'oneOf'/'anyOf'/'allOf'/
    # 'enum'/'not' at the top level"; Anthropic: "input_schema does not support oneOf,
    # allOf, or anyOf at the top level" (both HTTP 400 for the whole request).
    given = SCHEMAS[name]
    before = copy.deepcopy(given)
    for schema in sent(given):
        assert schema["type"] == "object"
        assert not set(schema) & set(PROVIDER_TOP_LEVEL_REFUSED)
    assert given == before


def test_every_pattern_sent_is_anchored_and_the_rest_said_in_the_description() -> None:
    # llama.cpp's server (both endpoints) converts every tool's schema to a grammar and
    # refuses the request when a pattern does not start with '^' and end with '$'
    # (grammars/README.md: "patterns must start with ^ and end with $"). Seen failing
    # before the change: the pydantic schema went out with "[a-z]+" and "\d{3}".
    assert sorted(patterns(PYDANTIC)) == ["[a-z]+", "\\d{3}", "^[0-9]{5}$"]
    before = copy.deepcopy(PYDANTIC)
    for schema in sent(PYDANTIC):
        assert patterns(schema) == ["^[0-9]{5}$"]  # the anchored one, as given
        slug = schema["properties"]["slug"]
        assert slug["description"] == "A slug (matches the regular expression [a-z]+)"
        [string, _null] = schema["properties"]["code"]["anyOf"]
        assert string == {"type": "string", "description": "Matches the regular expression \\d{3}"}
        # Everything else as pydantic wrote it.
        rest = {k: v for k, v in schema["properties"].items() if k not in ("slug", "code")}
        assert rest == {
            k: v for k, v in PYDANTIC["properties"].items() if k not in ("slug", "code")
        }
        assert schema["$defs"] == PYDANTIC["$defs"]
    # The tool's own schema is untouched and still checks the calls.
    assert before == PYDANTIC
    assert validate(PYDANTIC, {"url": "http://x", "slug": "123"}) == [
        "argument 'slug' must match the pattern '[a-z]+', got \"123\""
    ]


def test_what_no_provider_refuses_goes_out_as_given() -> None:
    # $defs/$ref, anyOf with null, format, enum, bounds, additionalProperties, anchored
    # patterns, and a property *named* "pattern": sent as given.
    schema = {
        "type": "object",
        "$defs": {"A": {"type": "object", "properties": {"z": {"pattern": "^a$"}}}},
        "properties": {
            "a": {"$ref": "#/$defs/A"},
            "u": {"type": "string", "format": "uri", "maxLength": 2083},
            "o": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
            "pattern": {"type": "string", "description": "a grep pattern"},
            "m": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
        },
        "required": ["pattern"],
    }
    for given in sent(schema):
        assert given == schema
    spawn = SPAWN_AGENTS_SPEC.input_schema()
    assert sent(spawn) == [spawn, spawn]


def test_fanfolds_own_tools_keep_every_limit_as_they_are() -> None:
    # Names both providers take; descriptions OpenAI takes whole (bash's, the longest,
    # is 942 characters: one grown past 1,024 would be cut on OpenAI's hosts).
    specs = [*ToolSet.default().specs(), SPAWN_AGENTS_SPEC, SUBMIT_RESULT_SPEC, SUBMIT_ERROR_SPEC]
    for spec in specs:
        assert NAME.match(spec.name), spec.name
        assert len(spec.description) <= OPENAI_DESCRIPTION_LIMIT, spec.name
        assert all(anchored(p) for p in patterns(spec.input_schema())), spec.name


@pytest.mark.parametrize("name", ["a.b", "x" * 65, "", "caf\u00e9", "two words"])
def test_a_name_a_provider_refuses_is_refused_before_any_request(name: str) -> None:
    # Not a provider's HTTP 400 for every request of the run: a clear error where the
    # tool is declared (an MCP server's such tool is left out with a warning:
    # test_mcp_*). ``@fanfold.tool(name=...)`` is the mapping for a function.
    spec = ToolSpec.from_schema(name, "d", {"type": "object", "properties": {}})

    class Named:
        def __init__(self) -> None:
            self.spec = spec

        async def run(self, arguments: Any, cwd: str) -> Any:  # pragma: no cover
            raise AssertionError

    with pytest.raises(ValueError, match="a name is 1-64 letters, digits, '_' or '-'"):
        ToolSet([Named()])


LONG = "Fetches a URL. " + "Read the page carefully. " * 80  # 2,015 characters


def context() -> CallContext:
    return CallContext("conv-1", "conv-1", "root", 0, None, 1)


@pytest.mark.parametrize(
    ("base_url", "limited"),
    [
        ("https://api.openai.com/v1", True),
        ("https://my-team.openai.azure.com/openai/v1", True),
        ("http://127.0.0.1:8080/v1", False),  # llama-server, vLLM, Ollama: all of it
    ],
)
async def test_openai_is_sent_at_most_1024_characters_of_a_description(
    base_url: str, limited: bool
) -> None:
    # OpenAI answers a longer one with HTTP 400 string_above_max_length ("Invalid
    # 'tools[N].function.description': string too long. Expected a string with maximum
    # length 1024"). Seen failing before the change: 2,015 characters went out.
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=openai_completion("hi").body)

    tool = ToolSpec.from_schema("fetch", LONG, PYDANTIC)
    request = ModelRequest("s", (UserMessage("u"),), (tool,))
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        provider = OpenAIProvider(
            base_url=base_url, model="m", api_key="k-123456", stream=False, client=client
        )
        assert (await provider.complete(request, context())).text == "hi"
    [function] = [t["function"] for t in bodies[0]["tools"]]
    if limited:
        assert len(function["description"]) == OPENAI_DESCRIPTION_LIMIT
        assert function["description"] == LONG[:1023] + "\u2026"
    else:
        assert function["description"] == LONG
    assert tool.description == LONG  # the spec (and so the log) keeps it whole


async def test_anthropic_is_sent_the_whole_description() -> None:
    # Anthropic documents no length limit for a tool's description (it asks for
    # detailed ones); the whole text goes out.
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=anthropic_message("hi").body)

    tool = ToolSpec.from_schema("fetch", LONG, PYDANTIC)
    request = ModelRequest("s", (UserMessage("u"),), (tool,))
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        provider = AnthropicProvider(model="m", api_key="k-123456", stream=False, client=client)
        assert (await provider.complete(request, context())).text == "hi"
    [sent_tool] = bodies[0]["tools"]
    assert sent_tool["description"] == LONG
    assert all(anchored(p) for p in patterns(sent_tool["input_schema"]))


@pytest.mark.parametrize("base_url", ["https://api.openai.com/v1", "http://127.0.0.1:8080/v1"])
async def test_more_tools_than_openai_takes_is_a_clear_error_never_sent(base_url: str) -> None:
    # OpenAI's API reference, tools: "A max of 128 functions are supported". Each MCP
    # server is held to 128, but several servers and the built-ins together can offer
    # more: OpenAI's own API gets a clear error naming what to do, without a request
    # (it would be an HTTP 400 on every round); a local server gets them all. Seen
    # failing before the change: the 129 tools were sent.
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=openai_completion("hi").body)

    empty = {"type": "object", "properties": {}}
    tools = tuple(ToolSpec.from_schema(f"t{i}", "d", empty) for i in range(129))
    request = ModelRequest("s", (UserMessage("u"),), tools)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        provider = OpenAIProvider(
            base_url=base_url, model="m", api_key="k-123456", stream=False, client=client
        )
        if openai_hosted(base_url):
            with pytest.raises(ProviderError) as caught:
                await provider.complete(request, context())
            assert caught.value.error.kind is ErrorKind.INVALID_REQUEST
            assert caught.value.error.message == (
                "openai: OpenAI takes at most 128 tools in a request and this one offers "
                "129: offer fewer (an MCP server's include_tools/exclude_tools, an agent "
                "definition's tools)"
            )
            assert bodies == []
            # 128 go out.
            assert await provider.complete(attrs.evolve(request, tools=tools[:128]), context())
            assert len(bodies[0]["tools"]) == 128
        else:
            assert (await provider.complete(request, context())).text == "hi"
            assert len(bodies[0]["tools"]) == 129


@pytest.mark.parametrize("tool", ["get.weather", "x" * 55, "caf\u00e9"])
def test_an_mcp_tool_whose_name_a_provider_refuses_is_left_out_saying_why(tool: str) -> None:
    # mcp__SERVER__TOOL must itself be 1-64 letters, digits, '_' or '-': "x" * 55 makes
    # 65 characters with mcp__srv__. The server's other tools are still offered.
    from types import SimpleNamespace

    from fanfold.mcp.client import _tool

    left_out = _tool(SimpleNamespace(name="srv"), SimpleNamespace(name=tool))  # type: ignore[arg-type]
    assert left_out == (
        f"MCP server 'srv': tool {tool!r} left out: 'mcp__srv__{tool}' is not a name a "
        "model can call (1-64 letters, digits, '_' or '-')"
    )
