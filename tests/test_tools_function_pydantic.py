"""Function tools as users write them (issue 33, item 6): pydantic models, TypedDicts,
unions, dates and ``Field`` metadata through pydantic when it is installed; a
parameter without a description is a warning; an enum reads as its values; a
returned model is JSON. And without pydantic: the base path as before, and a
pydantic-typed tool refused naming the install."""

from __future__ import annotations

import datetime
import enum
import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, Field
from runtime_helpers import reply
from typing_extensions import TypedDict

import fanfold
from fanfold.cli import cli
from fanfold.db import Store
from fanfold.providers.scripted import ScriptedProvider
from fanfold.replay.verify import verify
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import ToolCall, ToolResultMessage
from fanfold.tools import ToolSet
from fanfold.tools.function import ToolDefinitionWarning


class Address(BaseModel):
    city: str
    zip: Annotated[str, Field(max_length=5)]


class Person(BaseModel):
    name: str
    born: datetime.date
    home: Address | None = None


class Order(TypedDict):
    item: str
    count: int


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


seen: list[Any] = []


@fanfold.tool
def register(
    person: Person,
    order: Order,
    key: Union[int, str],  # noqa: UP007 - written as users write it
    on: datetime.date,
    count: Annotated[int, Field(description="How many to register.", ge=1)] = 1,
) -> Person:
    """Register a person's order.

    Args:
        person: Who orders.
        order: What they order.
        key: Their customer key, a number or a code.
        on: The day of the order.
    """
    seen.append((person, order, key, on, count))
    return person


async def call(tools: ToolSet, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
    result = await tools.run(ToolCall("c1", name, json.dumps(arguments)), "/")
    return result.content, result.is_error


ARGUMENTS: dict[str, Any] = {
    "person": {"name": "Ada", "born": "1815-12-10", "home": {"city": "London", "zip": "W1"}},
    "order": {"item": "engine", "count": 2},
    "key": "AB-7",
    "on": "2026-12-07",
}


def test_pydantic_types_are_described_by_pydantic() -> None:
    schema = register.spec.input_schema()
    properties = schema["properties"]
    assert schema["required"] == ["person", "order", "key", "on"]
    assert schema["additionalProperties"] is False
    assert properties["person"] == {"$ref": "#/$defs/Person", "description": "Who orders."}
    assert properties["order"] == {"$ref": "#/$defs/Order", "description": "What they order."}
    assert properties["key"]["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert properties["on"] == {
        "type": "string",
        "format": "date",
        "description": "The day of the order.",
    }
    assert properties["count"] == {
        "type": "integer",
        "minimum": 1,
        "default": 1,
        "description": "How many to register.",
    }
    definitions = schema["$defs"]
    assert set(definitions) == {"Person", "Address", "Order"}
    assert definitions["Address"]["properties"]["zip"]["maxLength"] == 5
    assert definitions["Order"]["required"] == ["item", "count"]
    assert register.validates_arguments


async def test_pydantic_arguments_are_validated_and_converted_by_pydantic() -> None:
    tools = ToolSet([register])
    seen.clear()
    content, is_error = await call(tools, "register", ARGUMENTS)
    assert not is_error, content
    person, order, key, on, count = seen[0]
    assert person == Person(
        name="Ada", born=datetime.date(1815, 12, 10), home=Address(city="London", zip="W1")
    )
    assert order == {"item": "engine", "count": 2}
    assert (key, on, count) == ("AB-7", datetime.date(2026, 12, 7), 1)
    # The returned model is its JSON (it was its str(): "name='Ada' born=...").
    assert json.loads(content) == ARGUMENTS["person"]
    assert (await call(tools, "register", {**ARGUMENTS, "key": 7}))[1] is False
    assert seen[1][2] == 7
    # Bad parts are named as the model wrote them: what the schema says by the tool
    # set's JSON Schema check, what only the type knows (a real date) by pydantic.
    bad = {
        **ARGUMENTS,
        "person": {**ARGUMENTS["person"], "home": {"city": "London", "zip": "W1A 1AA"}},
    }
    content, is_error = await call(tools, "register", bad)
    assert is_error
    assert "argument 'person.home.zip' must be at most 5 characters long, got 7" in content
    content, is_error = await call(tools, "register", {**ARGUMENTS, "on": "2026-13-01"})
    assert is_error
    assert "argument 'on': Input should be a valid date" in content
    content, is_error = await call(tools, "register", {**ARGUMENTS, "count": 0})
    assert is_error and "argument 'count' must be >= 1" in content
    content, is_error = await call(tools, "register", {**ARGUMENTS, "order": {"item": "x"}})
    assert is_error and "missing required argument 'order.count'" in content
    # The message lists what each argument takes, an enum's and a model's too.
    content, _ = await call(tools, "register", {"key": 1})
    assert "missing required argument 'person'" in content
    assert "person: Person (required)" in content and "key: integer | string" in content
    assert len(seen) == 2


async def test_a_parameter_without_a_description_is_a_warning_and_an_enum_reads_as_its_values(
    tmp_path: Path,
) -> None:
    with pytest.warns(ToolDefinitionWarning, match="parameter 'colour': no description"):

        @fanfold.tool
        def paint(colour: Colour, times: int = 1) -> str:
            """Paint the wall.

            Args:
                times: How many coats.
            """
            return f"{colour.value} x{times}"

    properties = paint.spec.input_schema()["properties"]
    assert properties["colour"] == {"enum": ["red", "blue"]}
    tools = ToolSet([paint])
    assert await call(tools, "paint", {"colour": "blue"}) == ("blue x1", False)
    content, is_error = await call(tools, "paint", {"colour": "green"})
    assert is_error and 'Expected arguments: colour: "red" | "blue" (required)' in content

    # On the command line: one line on stderr, and the tool is offered.
    (tmp_path / "mytools.py").write_text(
        "def shout(text: str) -> str:\n    '''Shout it.'''\n    return text.upper()\n"
    )
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    ref = f"{tmp_path / 'mytools.py'}:shout"
    args = ["tools", "--cwd", str(tmp_path), "--tools", ref, "--json"]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        "warning: --tools: tool 'shout', parameter 'text': no description (document it in "
        "the docstring's 'Args:' section, or annotate it as Annotated[..., 'what it is'])"
    ]
    assert "shout" in [t["name"] for t in json.loads(result.stdout)["tools"]]


@dataclass
class Branch:
    name: str
    children: list[Branch]


async def test_results_and_recursive_dataclasses_through_pydantic() -> None:
    @fanfold.tool
    def walk(tree: Annotated[Branch, "The tree."]) -> list[Any]:
        """Walk a tree (a dataclass that holds itself: pydantic describes it with $ref)."""
        return [tree.name, datetime.date(2026, 1, 2), Address(city="Oslo", zip="0150")]

    schema = walk.spec.input_schema()
    assert schema["$defs"]["Branch"]["properties"]["children"]["items"] == {
        "$ref": "#/$defs/Branch"
    }
    tree = {"name": "root", "children": [{"name": "leaf", "children": []}]}
    content, is_error = await call(ToolSet([walk]), "walk", {"tree": tree})
    assert (json.loads(content), is_error) == (
        ["root", "2026-01-02", {"city": "Oslo", "zip": "0150"}],
        False,
    )


async def test_a_tree_calls_a_pydantic_tool_and_verifies_without_it(tmp_path: Path) -> None:
    """The schema outside the subset is recorded like any other: the runtime offers it,
    the call runs, and replay verifies from the log alone."""
    provider = ScriptedProvider(
        {
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [
                        reply("", ("register", {**ARGUMENTS, "key": 12})),
                        reply("", ("register", {**ARGUMENTS, "on": "soon"})),
                        reply("registered"),
                    ],
                }
            ]
        }
    )
    database = tmp_path / "log.db"
    async with Runtime.open(
        database, provider, [register], logger=quiet_logger(), threaded_writes=False
    ) as runtime:
        root = await runtime.start("register Ada")
        assert (await runtime.wait(root)).text == "registered"
        state = runtime.state(root)
    (spec,) = [s for s in state.tools if s.name == "register"]
    assert "$defs" in spec.input_schema()
    first, second = [m.result for m in state.history if isinstance(m, ToolResultMessage)]
    assert not first.is_error and json.loads(first.content)["name"] == "Ada"
    assert second.is_error and "argument 'on': Input should be a valid date" in second.content
    store = Store.open(database)
    try:
        assert verify(store, root, tree=True).ok
    finally:
        store.close()


WITHOUT_PYDANTIC = textwrap.dedent(
    '''
    import datetime, json, sys
    from dataclasses import dataclass
    from typing import Annotated

    import attrs
    import pydantic  # the user's own types are made first...

    class Person(pydantic.BaseModel):
        name: str

    sys.modules["pydantic"] = None  # ...then fanfold finds no pydantic
    sys.modules["pydantic_core"] = None

    import trio
    import fanfold
    from fanfold.statemachine import ToolCall
    from fanfold.tools import ToolSet
    from fanfold.tools.function import ToolDefinitionError

    @attrs.frozen
    class Point:
        x: int
        y: int = 0

    @dataclass
    class Box:
        label: str

    @fanfold.tool
    def place(where: Annotated[Point, "w"], box: Annotated[Box, "b"]) -> dict:
        """Place a box."""
        return {"at": [where.x, where.y], "box": box.label, "day": datetime.date(2026, 1, 2)}

    tools = ToolSet([place])
    args = json.dumps({"where": {"x": 1}, "box": {"label": "k"}})
    result = trio.run(tools.run, ToolCall("c", "place", args), "/")
    print(json.dumps([result.content, result.is_error]))

    def greet(person: Annotated[Person, "p"]) -> str:
        """Greet."""
        return person.name

    def remind(on: Annotated[datetime.date, "d"]) -> str:
        """Remind."""
        return str(on)

    for function in (greet, remind):
        try:
            fanfold.tool(function)
        except ToolDefinitionError as exc:
            print(exc)
    '''
)


def test_without_pydantic_the_base_path_works_and_pydantic_types_name_the_install() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYDANTIC], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    first, greet, remind = done.stdout.splitlines()
    assert json.loads(first) == [
        '{"at": [1, 0], "box": "k", "day": "2026-01-02"}',
        False,
    ]
    for line, kind in ((greet, "Person"), (remind, "date")):
        assert f"type '{kind}' cannot be described in JSON" in line, line
        assert line.endswith("(pip install pydantic, or fanfold[pydantic])"), line


def test_fanfold_s_own_types_keep_their_schemas_when_pydantic_is_present() -> None:
    """What the base path described before stays byte for byte (recorded specs and
    their fingerprints do not change), and pydantic is not even imported for it."""
    code = textwrap.dedent(
        '''
        import sys
        from typing import Annotated, Literal
        import fanfold

        @fanfold.tool
        def f(a: Annotated[int, "a"], b: Annotated[Literal["x", "y"] | None, "b"] = None) -> str:
            """F."""
            return "f"

        print(f.spec.input_schema_json)
        print("pydantic" in sys.modules)
        '''
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    schema, imported = done.stdout.splitlines()
    assert json.loads(schema) == {
        "type": "object",
        "additionalProperties": False,
        "required": ["a"],
        "properties": {
            "a": {"type": "integer", "description": "a"},
            "b": {"enum": ["x", "y", None], "description": "b", "default": None},
        },
    }
    assert imported == "False"
