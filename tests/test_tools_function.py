"""Python functions as tools: ``@fanfold.tool``, its schema, conversion and results."""

from __future__ import annotations

import datetime
import enum
import json
import textwrap
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import attrs
import pytest
import trio
from runtime_helpers import reply

import fanfold
from fanfold.db import Store
from fanfold.providers.scripted import ScriptedProvider
from fanfold.replay.verify import verify
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import ToolCall, ToolResultMessage
from fanfold.tools import ToolSet
from fanfold.tools.function import ToolDefinitionError, parse_docstring


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@attrs.frozen
class Point:
    x: int
    y: Annotated[int, "the height"] = 0


@dataclass
class Box:
    label: str
    size: float = 1.0


@fanfold.tool
def lookup_issue(number: int, with_comments: bool = False, labels: list[str] | None = None) -> str:
    """Fetch an issue from the tracker.

    Args:
        number: The issue's number.
        with_comments (bool): Include its comments,
            oldest first.
        labels: Only if it has these labels.

    Returns:
        The issue as text.
    """
    return f"issue {number} comments={with_comments} labels={labels}"


def schema_of(tool: fanfold.FunctionTool) -> dict[str, Any]:
    return tool.spec.input_schema()


def test_the_schema_comes_from_the_type_hints_and_the_google_docstring() -> None:
    assert lookup_issue.spec.name == "lookup_issue"
    assert lookup_issue.spec.description == "Fetch an issue from the tracker."
    assert schema_of(lookup_issue) == {
        "type": "object",
        "additionalProperties": False,
        "required": ["number"],
        "properties": {
            "number": {"type": "integer", "description": "The issue's number."},
            "with_comments": {
                "type": "boolean",
                "description": "Include its comments, oldest first.",
                "default": False,
            },
            "labels": {
                "type": ["array", "null"],
                "items": {"type": "string"},
                "description": "Only if it has these labels.",
                "default": None,
            },
        },
    }


def test_numpy_and_rest_docstrings_describe_parameters() -> None:
    numpy = """Do it.

    Parameters
    ----------
    a : int
        The first
        number.
    b : str
        The second.

    Returns
    -------
    str
    """
    rest = """Do it.

    :param a: The first number.
    :type a: int
    :param str b: The second.
    :returns: something
    """
    assert parse_docstring(numpy) == ("Do it.", {"a": "The first number.", "b": "The second."})
    assert parse_docstring(rest) == ("Do it.", {"a": "The first number.", "b": "The second."})


def test_decorator_arguments_and_annotated_descriptions() -> None:
    @fanfold.tool(name="paint", description="Paint a point.", read_only=True, idempotent=True)
    def f(colour: Annotated[Colour, "which colour"], where: Annotated[Point, "the point"]) -> str:
        return f"{colour} {where}"

    assert (f.spec.name, f.spec.description, f.read_only, f.idempotent) == (
        "paint",
        "Paint a point.",
        True,
        True,
    )
    assert schema_of(f)["properties"] == {
        "colour": {"description": "which colour", "enum": ["red", "blue"]},
        "where": {
            "description": "the point",
            "type": "object",
            "additionalProperties": False,
            "required": ["x"],
            "properties": {
                "x": {"type": "integer"},
                "y": {"type": "integer", "description": "the height"},
            },
        },
    }
    assert f(Colour.RED, Point(1)) == "Colour.RED Point(x=1, y=0)"  # still a function


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: fanfold.tool(_untyped), "parameter 'a': no type annotation"),
        (lambda: fanfold.tool(_varargs), "*args and **kwargs cannot be described"),
        (lambda: fanfold.tool(_no_doc), "no description: give the function a docstring"),
        # Neither fanfold nor pydantic (present here) can describe these.
        (lambda: fanfold.tool(_a_callable), "type 'Callable' cannot be described"),
        (lambda: fanfold.tool(_an_attrs_date), "'a'.when: type 'date' cannot be described"),
        (lambda: fanfold.tool(name="bad name!")(_ok), "a name is 1-64 letters"),
        (lambda: fanfold.tool(name="mcp__x__y")(_ok), "kept for MCP servers"),
        # Described until a RecursionError (an attrs class: pydantic takes no attrs).
        (lambda: fanfold.tool(_recursive_attrs), "tree'.children: 'Twig' contains itself"),
    ],
)
def test_a_function_that_cannot_be_described_is_refused_when_made(make: Any, message: str) -> None:
    with pytest.raises(ToolDefinitionError, match=message.replace("*", r"\*").replace("(", r"\(")):
        make()


def _untyped(a):  # type: ignore[no-untyped-def]
    """Doc.

    Args:
        a: A.
    """


def _varargs(*a: int) -> None:
    """Doc."""


def _no_doc(a: Annotated[int, "a"]) -> None:
    pass


def _a_callable(a: Annotated[Callable[[int], int], "a"]) -> None:
    """Doc."""


@attrs.frozen
class _Dated:
    when: datetime.date


def _an_attrs_date(a: Annotated[_Dated, "a"]) -> None:
    """Doc."""


@attrs.frozen
class Twig:
    name: str
    children: list[Twig]


def _recursive_attrs(tree: Annotated[Twig, "the tree"]) -> str:
    """Walk a tree."""
    return tree.name


def _ok(a: Annotated[int, "a"]) -> None:
    """Doc."""


def test_a_name_clash_with_a_built_in_is_refused_with_a_clear_error() -> None:
    @fanfold.tool(name="bash")
    def my_bash(command: Annotated[str, "the command"]) -> str:
        """Not the real bash."""
        return command

    with pytest.raises(ValueError, match="'bash' clashes with fanfold's built-in tool"):
        ToolSet.default(extra=[my_bash])
    with pytest.raises(ValueError, match="clashes with fanfold's built-in"):
        ToolSet([my_bash])
    with pytest.raises(ValueError, match="duplicate tool name 'lookup_issue'"):
        ToolSet([lookup_issue, lookup_issue])


async def call(tools: ToolSet, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
    result = await tools.run(ToolCall("c1", name, json.dumps(arguments)), "/")
    return result.content, result.is_error


async def test_arguments_are_validated_then_converted_to_the_annotated_types() -> None:
    seen: list[Any] = []

    @fanfold.tool
    def record(
        colour: Annotated[Colour, "c"],
        where: Annotated[Point, "p"],
        boxes: Annotated[tuple[Box, ...], "b"],
        scale: Annotated[float, "s"],
        mode: Annotated[Literal["a", "b"], "m"] = "a",
        note: Annotated[str | None, "n"] = None,
    ) -> dict[str, Any]:
        """Record what it is given."""
        seen.append((colour, where, boxes, scale, mode, note))
        return {"ok": True}

    tools = ToolSet([record])
    arguments = {
        "colour": "blue",
        "where": {"x": 1, "y": 2},
        "boxes": [{"label": "k"}],
        "scale": 2,
        "note": None,
    }
    assert await call(tools, "record", arguments) == ('{"ok": true}', False)
    assert seen == [(Colour.BLUE, Point(1, 2), (Box("k", 1.0),), 2.0, "a", None)]
    assert isinstance(seen[0][3], float)
    content, is_error = await call(tools, "record", {**arguments, "colour": "green"})
    assert is_error
    assert 'argument \'colour\' must be one of "red", "blue"' in content
    content, is_error = await call(tools, "record", {**arguments, "where": {"x": "1"}})
    assert is_error and "argument 'where.x' must be an integer" in content
    content, is_error = await call(tools, "record", {**arguments, "extra": 1})
    assert is_error and "unknown argument 'extra'" in content
    content, is_error = await call(tools, "record", {**arguments, "note": 3})
    assert is_error and "argument 'note' must be a string or a null, got an integer" in content
    assert "note: string | null" in content
    assert len(seen) == 1


async def test_a_sync_function_runs_in_a_worker_thread_and_an_async_one_in_the_loop() -> None:
    threads: list[str] = []

    @fanfold.tool
    def sync_one() -> str:
        """Where am I?"""
        threads.append(threading.current_thread().name)
        return "sync"

    @fanfold.tool
    async def async_one() -> str:
        """Where am I?"""
        await trio.sleep(0)
        threads.append(threading.current_thread().name)
        return "async"

    tools = ToolSet([sync_one, async_one])
    assert await call(tools, "sync_one", {}) == ("sync", False)
    assert await call(tools, "async_one", {}) == ("async", False)
    main = threading.current_thread().name
    assert threads[0] != main
    assert threads[1] == main


async def test_a_cancelled_sync_call_ends_at_once_and_its_thread_is_abandoned() -> None:
    release = threading.Event()
    started = threading.Event()

    @fanfold.tool
    def blocks() -> str:
        """Blocks until released."""
        started.set()
        release.wait(30)
        return "late"

    tools = ToolSet([blocks])
    with trio.move_on_after(5) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, tools, "blocks", {})
            await trio.to_thread.run_sync(started.wait, 5)
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught  # the call ended without waiting for the thread
    release.set()


async def test_an_exception_is_an_error_result_with_its_message() -> None:
    @fanfold.tool
    def fails(n: Annotated[int, "n"]) -> str:
        """Fails."""
        raise LookupError(f"no issue {n}\nin the tracker")

    @fanfold.tool
    async def fails_async() -> str:
        """Fails."""
        raise RuntimeError("down")

    tools = ToolSet([fails, fails_async])
    assert await call(tools, "fails", {"n": 7}) == (
        "fails: LookupError: no issue 7 in the tracker",
        True,
    )
    assert await call(tools, "fails_async", {}) == ("fails_async: RuntimeError: down", True)


async def test_output_is_capped_and_results_become_text() -> None:
    @fanfold.tool(max_output_chars=1000)
    def big() -> str:
        """A lot of text."""
        return "a" * 600 + "b" * 5000

    @fanfold.tool
    def nothing() -> None:
        """Nothing."""

    @fanfold.tool
    def point() -> Point:
        """A point."""
        return Point(1, 2)

    tools = ToolSet([big, nothing, point])
    content, is_error = await call(tools, "big", {})
    assert not is_error
    assert content.startswith("a" * 500) and content.endswith("b" * 500)
    assert "5600 characters" in content and len(content) < 1300
    assert await call(tools, "nothing", {}) == ("ok", False)
    assert await call(tools, "point", {}) == ('{"x": 1, "y": 2}', False)


async def test_a_timeout_ends_the_call_with_an_error_result(autojump_clock: Any) -> None:
    @fanfold.tool(timeout=2)
    async def slow() -> str:
        """Slow."""
        await trio.sleep(10)
        return "done"

    assert await call(ToolSet([slow]), "slow", {}) == ("slow: timed out after 2 s", True)


async def test_runtime_open_takes_functions_and_replay_needs_none_of_them(tmp_path: Path) -> None:
    calls: list[int] = []

    def double(n: Annotated[int, "the number"]) -> int:
        """Double a number."""
        calls.append(n)
        return 2 * n

    provider = ScriptedProvider(
        {
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [
                        reply("", ("double", {"n": 21})),
                        reply("the answer is 42"),
                    ],
                }
            ]
        }
    )
    database = tmp_path / "log.db"
    async with Runtime.open(
        database, provider, [double], logger=quiet_logger(), threaded_writes=False
    ) as runtime:
        root = await runtime.start("double 21")
        result = await runtime.wait(root)
        state = runtime.state(root)
    assert calls == [21]
    assert result.text == "the answer is 42"
    assert [spec.name for spec in state.tools] == ["double", "spawn_agents"]
    assert any("42" in str(m) for m in state.history)
    store = Store.open(database)
    try:
        assert verify(store, root, tree=True).ok
    finally:
        store.close()


async def test_a_call_in_flight_when_the_runtime_stops_is_interrupted_never_run_again(
    tmp_path: Path,
) -> None:
    """A sync function running when the runtime closes (as at a crash) is not called
    again on resume: its call gets an 'interrupted' error result, and the tree goes on."""
    started = threading.Event()
    release = threading.Event()
    calls: list[int] = []

    def deploy(n: Annotated[int, "which"]) -> str:
        """Deploy something (not idempotent)."""
        calls.append(n)
        started.set()
        release.wait(30)
        return "deployed"

    provider = ScriptedProvider(
        {
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [reply("", ("deploy", {"n": 1})), reply("went on")],
                }
            ]
        }
    )
    database = tmp_path / "log.db"
    options: dict[str, Any] = {"logger": quiet_logger(), "threaded_writes": False}
    async with Runtime.open(database, provider, [deploy], **options) as runtime:
        root = await runtime.start("deploy")
        await trio.to_thread.run_sync(started.wait, 30)
    release.set()
    async with Runtime.open(database, provider, [deploy], **options) as runtime:
        assert await runtime.resume() == [root]
        result = await runtime.wait(root)
        state = runtime.state(root)
    assert calls == [1]
    assert result.text == "went on"
    (outcome,) = [m.result for m in state.history if isinstance(m, ToolResultMessage)]
    assert outcome.is_error and "interrupted" in outcome.content


async def test_a_read_only_agent_may_call_a_read_only_function_tool_only(tmp_path: Path) -> None:
    """``read-only`` takes a function tool marked ``read_only=True`` (its recorded spec
    says so) and refuses one without; replay decides the same from the log alone."""
    from fanfold.statemachine.agent_defs import AgentDefinition
    from fanfold.statemachine.permissions import Rule

    @fanfold.tool(read_only=True)
    def peek(name: Annotated[str, "the value's name"]) -> str:
        """Read a value."""
        return f"{name} = 1"

    @fanfold.tool
    def poke(name: Annotated[str, "the value's name"]) -> str:
        """Change a value."""
        return f"{name} changed"

    provider = ScriptedProvider(
        {
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [
                        reply("", ("spawn_agents", {"tasks": [{"task": "t", "agent": "reader"}]})),
                        reply("done"),
                    ],
                },
                {
                    "match": {"depth": 1},
                    "replies": [
                        reply("", ("peek", {"name": "a"}), ("poke", {"name": "a"})),
                        reply("", ("submit_result", {"result": "looked"})),
                    ],
                },
            ]
        }
    )
    reader = AgentDefinition("reader", "reads", allow=(Rule("read-only"),))
    database = tmp_path / "log.db"
    async with Runtime.open(
        database, provider, ToolSet.default(extra=[peek, poke]), logger=quiet_logger()
    ) as runtime:
        root = await runtime.start("go", cwd=tmp_path, agents=(reader,))
        assert (await runtime.wait(root)).text == "done"
    with Store.open(database) as store:
        child = store.load_state(root + ".1")
        results = [m.result for m in child.history if isinstance(m, ToolResultMessage)]
        assert [(r.name, r.content, r.is_error) for r in results[:2]] == [
            ("peek", "a = 1", False),
            ("poke", "poke refused: no allow rule of agent 'reader' matches this call "
             "(allowed: read-only)", True),
        ]  # fmt: skip
        assert "peek" in [t.name for t in child.tools]
        assert "poke" not in [t.name for t in child.tools]
        assert verify(store, root, tree=True).ok


def _values(schema: dict[str, Any]) -> Any:
    """A Hypothesis strategy of JSON values that conform to ``schema`` (the subset)."""
    from hypothesis import strategies as st

    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of(*(_values({**schema, "type": k}) for k in kind))
    if kind == "string":
        return st.text(max_size=5)
    if kind == "integer":  # the validator takes 3.0 for an integer too
        return st.one_of(st.integers(-(2**40), 2**40), st.integers(-1000, 1000).map(float))
    if kind == "number":
        return st.one_of(st.integers(-100, 100), st.floats(allow_nan=False, allow_infinity=False))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(_values(schema.get("items", {"type": "integer"})), max_size=3)
    if kind == "object" and "properties" in schema:
        required = schema.get("required", [])
        optional = [n for n in schema["properties"] if n not in required]
        return st.fixed_dictionaries(
            {n: _values(schema["properties"][n]) for n in required},
            optional={n: _values(schema["properties"][n]) for n in optional},
        )
    if kind == "object":
        return st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
    return st.integers()


@attrs.frozen
class Inner:
    flag: bool
    tags: tuple[str, ...] = ()


def _everything(
    a: Annotated[int, "a"],
    b: Annotated[float, "b"],
    c: Annotated[list[int] | None, "c"],
    d: Annotated[Colour, "d"],
    e: Annotated[Literal["x", "y", 3], "e"],
    f: Annotated[Inner, "f"],
    g: Annotated[dict[str, int], "g"],
    h: Annotated[set[str], "h"],
    i: Annotated[Box | None, "i"] = None,
    j: Annotated[str | None, "j"] = "j",
) -> str:
    """Takes every kind of parameter."""
    assert type(a) is int and type(b) is float and isinstance(d, Colour)
    assert c is None or all(type(x) is int for x in c)
    assert e in ("x", "y", 3) and isinstance(f, Inner) and isinstance(f.tags, tuple)
    assert isinstance(g, dict) and isinstance(h, set)
    assert i is None or (isinstance(i, Box) and type(i.size) is float)
    assert j is None or isinstance(j, str)
    return "ok"


def test_every_value_the_schema_accepts_converts_to_the_annotated_types() -> None:
    """The schema is never looser than the types: whatever conforms converts."""
    from hypothesis import given, settings

    everything = fanfold.tool(_everything)
    tools = ToolSet([everything])
    schema = everything.spec.input_schema()

    @settings(max_examples=200, deadline=None)
    @given(_values(schema))
    def check(arguments: dict[str, Any]) -> None:
        result = trio.run(tools.run, ToolCall("c", "_everything", json.dumps(arguments)), "/")
        assert (result.content, result.is_error) == ("ok", False), arguments

    check()


def test_a_record_used_twice_side_by_side_is_not_recursive() -> None:
    @fanfold.tool
    def segment(start: Point, end: Point) -> str:
        """A segment.

        Args:
            start: One end.
            end: The other.
        """
        return f"{start} {end}"

    start, end = (schema_of(segment)["properties"][k] for k in ("start", "end"))
    assert start.pop("description") == "One end." and end.pop("description") == "The other."
    assert start == end and start["required"] == ["x"]


# ---------------------------------------------------------------- asyncio tools (issue 33, 7)


async def test_an_asyncio_tool_runs_on_the_shared_asyncio_loop_thread() -> None:
    """asyncio.sleep, asyncio.gather and an asyncio.Queue work in a tool marked
    ``runs_on="asyncio"`` (on Trio they raise at the first await); every call runs on
    the same loop, so asyncio objects kept between calls stay usable."""
    import asyncio

    loops: list[Any] = []

    @fanfold.tool(runs_on="asyncio")
    async def gather(n: Annotated[int, "how many"]) -> list[int]:
        """Gather n sleeps through a queue."""
        queue: asyncio.Queue[int] = asyncio.Queue()

        async def put(i: int) -> None:
            await asyncio.sleep(0.01 * (n - i))
            await queue.put(i)

        await asyncio.gather(*(put(i) for i in range(n)))
        loops.append((asyncio.get_running_loop(), threading.current_thread().name))
        return [queue.get_nowait() for _ in range(n)]

    @fanfold.tool
    async def on_trio() -> str:
        """Where am I?"""
        await trio.sleep(0)
        return threading.current_thread().name

    assert (gather.runs_on, on_trio.runs_on) == ("asyncio", "trio")
    tools = ToolSet([gather, on_trio])
    assert await call(tools, "gather", {"n": 4}) == ("[3, 2, 1, 0]", False)
    assert await call(tools, "gather", {"n": 2}) == ("[1, 0]", False)
    assert loops[0] == loops[1] and loops[0][1] == "fanfold-asyncio"
    assert await call(tools, "on_trio", {}) == (threading.current_thread().name, False)


async def test_cancelling_an_asyncio_tool_cancels_its_asyncio_task() -> None:
    """A Trio cancel (here a tool timeout, and a cancelled scope) reaches the asyncio
    task: the coroutine sees CancelledError at its await and its cleanup has run by the
    time the call has ended."""
    import asyncio

    seen: list[str] = []

    @fanfold.tool(runs_on="asyncio", timeout=0.5)
    async def hangs(label: Annotated[str, "a label"]) -> str:
        """Hangs."""
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # cleanup that awaits: waited for
            seen.append(f"{label} cancelled")
            raise
        return "never"

    tools = ToolSet([hangs])
    with trio.fail_after(30):
        assert await call(tools, "hangs", {"label": "a"}) == ("hangs: timed out after 0.5 s", True)
        assert seen == ["a cancelled"]
        with trio.move_on_after(0.3) as scope:
            await call(tools, "hangs", {"label": "b"})
        assert scope.cancelled_caught
        assert seen == ["a cancelled", "b cancelled"]


def test_runs_on_auto_follows_the_module_s_imports() -> None:
    """``runs_on="auto"``: a module that imports asyncio (or aiohttp-style ``aio*``)
    and not trio gets the asyncio loop; one that imports trio, or neither, Trio."""

    def made(source: str) -> Any:
        namespace: dict[str, Any] = {}
        exec(textwrap.dedent(source), namespace)  # the test's own code
        return fanfold.tool(namespace["f"]).runs_on

    body = '''
    async def f() -> str:
        """F."""
        return "f"
    '''
    assert made("import asyncio\n" + textwrap.dedent(body)) == "asyncio"
    assert made("from asyncio import sleep\n" + textwrap.dedent(body)) == "asyncio"
    assert made("import trio\n" + textwrap.dedent(body)) == "trio"
    assert made("import asyncio, trio\n" + textwrap.dedent(body)) == "trio"
    assert made(textwrap.dedent(body)) == "trio"
    with pytest.raises(ToolDefinitionError, match="runs_on must be 'auto', 'trio' or 'asyncio'"):
        fanfold.tool(runs_on="curio")(_ok)  # type: ignore[call-overload]


async def test_asyncio_code_awaited_on_trio_says_how_to_run_it() -> None:
    import asyncio

    @fanfold.tool(runs_on="trio")
    async def wrong() -> str:
        """asyncio on Trio."""
        await asyncio.sleep(0.01)
        return "never"

    content, is_error = await call(ToolSet([wrong]), "wrong", {})
    assert is_error and 'declare @fanfold.tool(runs_on="asyncio")' in content, content
