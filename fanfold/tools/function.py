"""Python functions as tools: ``@fanfold.tool`` and :class:`FunctionTool`.

A typed function, sync or async, becomes a tool::

    @fanfold.tool
    def lookup_issue(number: int, with_comments: bool = False) -> str:
        \"\"\"Fetch an issue from the tracker.

        Args:
            number: The issue's number.
            with_comments: Include its comments.
        \"\"\"

- The **schema** comes from the signature and the docstring: each parameter's type
  hint gives its JSON type (``str``, ``int``, ``float``, ``bool``, ``None``,
  ``list[X]``, ``tuple[X, ...]``, ``set[X]``, ``dict[str, X]``, ``Literal[...]``, an
  ``enum.Enum``, ``X | None``, ``Any``, and attrs classes or dataclasses of those as
  nested objects), its description comes from the docstring (Google ``Args:``, NumPy
  ``Parameters``, reST ``:param x:``) or from ``Annotated[int, "the number"]`` (or
  ``Field(description=...)``); a parameter without one is a
  :class:`ToolDefinitionWarning`. A type outside that list (a pydantic model, a
  ``TypedDict``, ``Union[int, str]``, a ``date``), or ``Annotated`` constraints
  (``Field(ge=1)``), are described by pydantic when it is installed
  (:mod:`fanfold.tools.pydantic_types`). A parameter without a type,
  ``*args``/``**kwargs``, or a type neither can describe is refused when the tool is
  made (:class:`ToolDefinitionError`).
- The **arguments** are validated by the tool set against that schema, then
  converted to the annotated types by cattrs (an ``Enum``, a tuple, an attrs class),
  or by pydantic for the parameters it described (it validates those itself).
- A **sync function** runs in a worker thread (``trio.to_thread.run_sync``) that a
  cancellation abandons: the call ends at once, the thread finishes on its own and
  its result is dropped (a thread cannot be killed; a function that must not be
  abandoned should be async and handle ``trio.Cancelled``).
- An **async function** runs on Trio, fanfold's loop, or, when it is asyncio code,
  on one shared asyncio loop thread (:mod:`fanfold.tools.aio`), where a cancellation
  cancels its asyncio task. ``@tool(runs_on="asyncio" | "trio")`` says which;
  ``"auto"`` (the default) reads the function's module: asyncio when it imports
  ``asyncio`` or an ``aio*`` package (aiohttp...) and not ``trio``.
- An **exception** becomes an error result with its type and message; the output
  (a ``str`` as it is, ``None`` as ``ok``, anything else as JSON, a pydantic model
  through ``model_dump(mode="json")``) is capped at ``max_output_chars`` like bash's.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import json
import types
import typing
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, overload

import attrs
import cattrs
import trio

from fanfold.statemachine import ToolSpec
from fanfold.statemachine.messages import thawed_json
from fanfold.tools import pydantic_types
from fanfold.tools.aio import run_on_asyncio
from fanfold.tools.output import HeadTailBuffer
from fanfold.tools.schema import SchemaError, check_schema
from fanfold.tools.tool import ToolOutput, valid_tool_name

MAX_OUTPUT_CHARS = 30_000
"""A function tool's output beyond this is cut to its head and tail (as bash's)."""


RunsOn = Literal["auto", "trio", "asyncio"]
"""Where an async function tool's coroutines run (``@tool(runs_on=...)``); ``"auto"``
decides from the function's module (:func:`_library_of`)."""


class ToolDefinitionError(TypeError):
    """A function cannot be made a tool (a type the schema cannot express, no
    docstring...): raised when the tool is made, never while a model uses it."""


class ToolDefinitionWarning(UserWarning):
    """A tool was made with something a model may use badly (a parameter without a
    description): warned when the tool is made."""


@attrs.frozen(eq=False)
class FunctionTool:
    """A tool made from a Python function (see the module docstring).

    Calling the object calls the function, so a decorated function stays usable as
    one. ``read_only`` and ``idempotent`` say what the function claims about itself:
    that it changes nothing, and that running it twice is harmless (for the runtime
    and tool sets to read; see DESIGN.md, "Tools from outside").
    """

    spec: ToolSpec
    function: Callable[..., Any]
    read_only: bool = False
    idempotent: bool = False
    timeout: float | None = None
    max_output_chars: int = MAX_OUTPUT_CHARS
    _types: Mapping[str, Any] = attrs.field(factory=dict, repr=False)
    # The parameters pydantic describes and converts: their ``TypeAdapter``s.
    _adapters: Mapping[str, Any] = attrs.field(factory=dict, repr=False)
    runs_on: Literal["trio", "asyncio"] = "trio"
    """Where its coroutines run: on fanfold's Trio loop, or on the shared asyncio loop
    thread (:mod:`fanfold.tools.aio`). A sync function runs in a worker thread either
    way; this applies to what it returns if that is awaitable."""

    @property
    def name(self) -> str:
        """The tool's name, as the model calls it."""
        return self.spec.name

    @property
    def validates_arguments(self) -> bool:
        """Whether pydantic checks (some of) its arguments, against the very types its
        schema was made from, after the tool set has checked them against that schema
        (valid JSON Schema: ``$defs``, ``anyOf``, ``format``...)."""
        return bool(self._adapters)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        """Convert ``args`` (already valid against the schema) and call the function."""
        # Plain copies: the function may change what it is given, and ``args`` are
        # the call's kept arguments, read-only (ToolCall.arguments).
        kwargs: dict[str, Any] = {}
        problems: list[str] = []
        for name, value in args.items():
            if name not in self._adapters:
                continue
            try:  # every pydantic parameter's problems, not only the first one's
                kwargs[name] = pydantic_types.convert(
                    self._adapters[name], thawed_json(value), name
                )
            except pydantic_types.BadArgument as exc:
                problems.append(str(exc))
        if problems:
            return ToolOutput.error(f"{self.name}: {'; '.join(problems)}")
        try:
            kwargs.update(
                (name, _CONVERTER.structure(thawed_json(value), self._types[name]))
                for name, value in args.items()
                if name not in self._adapters
            )
        except Exception as exc:  # the schema let through what the type refuses
            return ToolOutput.error(f"{self.name}: bad arguments: {_one_line(exc)}")
        try:
            if self.timeout is not None:
                with trio.fail_after(self.timeout):
                    result = await self._call(kwargs)
            else:
                result = await self._call(kwargs)
        except trio.TooSlowError:
            return ToolOutput.error(f"{self.name}: timed out after {self.timeout:g} s")
        except Exception as exc:
            # The function's own failure: the model sees its type and message, as a
            # Python user would in a traceback's last line.
            text = f"{self.name}: {type(exc).__name__}: {_one_line(exc)}"
            if self.runs_on == "trio" and _asyncio_on_trio(exc):
                # The model cannot fix that; the one reading the log can.
                text += ' (asyncio code awaited on Trio: declare @fanfold.tool(runs_on="asyncio"))'
            return ToolOutput.error(text)
        if isinstance(result, ToolOutput):
            return ToolOutput(self._cap(result.content), result.is_error)
        return ToolOutput.ok(self._cap(_text(result)))

    async def _call(self, kwargs: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(self.function):
            return await self._awaited(self.function(**kwargs))
        call = functools.partial(self.function, **kwargs)
        result = await trio.to_thread.run_sync(call, abandon_on_cancel=True)
        if inspect.isawaitable(result):  # a sync wrapper returning a coroutine
            return await self._awaited(result)
        return result

    async def _awaited(self, awaitable: Any) -> Any:
        if self.runs_on == "asyncio":
            if not inspect.iscoroutine(awaitable):
                awaitable = _as_coroutine(awaitable)
            return await run_on_asyncio(awaitable)
        return await awaitable

    def _cap(self, text: str) -> str:
        if len(text) <= self.max_output_chars:
            return text
        buffer = HeadTailBuffer(self.max_output_chars)
        buffer._add(text)
        return buffer.text()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or "(no message)"


def _text(result: Any) -> str:
    if isinstance(result, str):
        return result
    if result is None:
        return "ok"
    try:
        return json.dumps(_CONVERTER.unstructure(result), ensure_ascii=False, default=_json_of)
    except (TypeError, ValueError):
        return str(result)


def _json_of(value: Any) -> Any:
    """What ``json.dumps`` cannot write itself: a pydantic model through its own
    ``model_dump(mode="json")``, a date as ISO text (pydantic's rules when it is
    installed), else the value's ``str``."""
    try:
        return pydantic_types.jsonable(value)
    except Exception:
        return str(value)


def _converter() -> cattrs.Converter:
    converter = cattrs.Converter()
    # JSON has no tuples or sets; cattrs builds them from lists. Floats arrive as ints
    # when integral (``3``); ``float`` takes them.
    return converter


_CONVERTER = _converter()


@overload
def tool(function: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    idempotent: bool = False,
    timeout: float | None = None,
    max_output_chars: int = MAX_OUTPUT_CHARS,
    runs_on: RunsOn = "auto",
    needs_approval: bool = False,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    idempotent: bool = False,
    timeout: float | None = None,
    max_output_chars: int = MAX_OUTPUT_CHARS,
    runs_on: RunsOn = "auto",
    needs_approval: bool = False,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Make a tool of a typed function: ``@tool`` or ``@tool(name=..., ...)``.

    ``name`` defaults to the function's name, ``description`` to its docstring's text
    before its sections. ``read_only``: the function changes nothing; ``idempotent``:
    calling it twice with the same arguments is harmless. ``timeout`` (seconds) ends a
    call that takes longer with an error result. ``runs_on``: where an async
    function's coroutine runs, ``"trio"`` or ``"asyncio"`` (``"auto"``: asyncio when
    its module imports asyncio or an ``aio*`` package and not trio).
    ``needs_approval``: every call waits for a person's decision first (recorded in
    its spec; the reducer asks, see DESIGN.md "A human in the loop"). Raises
    :class:`ToolDefinitionError` when the function cannot be described to a model.
    """

    def make(fn: Callable[..., Any]) -> FunctionTool:
        return function_tool(
            fn,
            name=name,
            description=description,
            read_only=read_only,
            idempotent=idempotent,
            timeout=timeout,
            max_output_chars=max_output_chars,
            runs_on=runs_on,
            needs_approval=needs_approval,
        )

    if function is not None:
        return make(function)
    return make


def function_tool(
    function: Callable[..., Any] | Callable[..., Awaitable[Any]],
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    idempotent: bool = False,
    timeout: float | None = None,
    max_output_chars: int = MAX_OUTPUT_CHARS,
    runs_on: RunsOn = "auto",
    needs_approval: bool = False,
) -> FunctionTool:
    """The constructor behind ``@tool`` (same arguments)."""
    if isinstance(function, FunctionTool):
        function = function.function
    if not callable(function):
        raise ToolDefinitionError(f"a tool must be made from a function, not {function!r}")
    label = getattr(function, "__qualname__", repr(function))
    tool_name = name if name is not None else getattr(function, "__name__", "")
    if not valid_tool_name(tool_name):
        raise ToolDefinitionError(
            f"tool {tool_name!r} (from {label}): a name is 1-64 letters, digits, '_' or '-'"
        )
    if tool_name.startswith("mcp__"):
        raise ToolDefinitionError(
            f"tool {tool_name!r}: names starting with 'mcp__' are kept for MCP servers' tools"
        )
    if timeout is not None and not (0 < timeout < float("inf")):
        raise ToolDefinitionError(f"tool {tool_name!r}: timeout must be a number of seconds > 0")
    if max_output_chars < 100:
        raise ToolDefinitionError(f"tool {tool_name!r}: max_output_chars must be at least 100")
    if runs_on not in ("auto", "trio", "asyncio"):
        raise ToolDefinitionError(
            f"tool {tool_name!r}: runs_on must be 'auto', 'trio' or 'asyncio', not {runs_on!r}"
        )
    loop: Literal["trio", "asyncio"] = runs_on if runs_on != "auto" else _library_of(function)
    doc = inspect.getdoc(function) or ""
    summary, documented = parse_docstring(doc)
    text = description if description is not None else summary
    if not text.strip():
        raise ToolDefinitionError(
            f"tool {tool_name!r}: no description: give the function a docstring or "
            "pass description=..."
        )
    try:
        hints = typing.get_type_hints(function, include_extras=True)
    except Exception as exc:
        raise ToolDefinitionError(
            f"tool {tool_name!r}: its type hints cannot be read: {_one_line(exc)}"
        ) from None
    properties: dict[str, Any] = {}
    required: list[str] = []
    kinds: dict[str, Any] = {}
    adapters: dict[str, Any] = {}  # the parameters pydantic describes: their TypeAdapters
    for parameter in inspect.signature(function).parameters.values():
        where = f"tool {tool_name!r}, parameter {parameter.name!r}"
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise ToolDefinitionError(f"{where}: *args and **kwargs cannot be described")
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise ToolDefinitionError(f"{where}: a tool's arguments are passed by name")
        if parameter.name not in hints:
            raise ToolDefinitionError(f"{where}: no type annotation")
        hint = hints[parameter.name]
        base, note = _unannotated(hint)
        schema = _described(hint, base, where)
        if schema is None:  # pydantic's: its schema comes below, with the others'
            adapters[parameter.name] = _pydantic_adapter(hint, base, where)
            schema = {}
        described = note or documented.get(parameter.name, "")
        if described.strip():
            schema = {"description": " ".join(described.split()), **schema}
        else:
            # Both SDKs named in issue 33 take such a tool (the model reads the name
            # and the type); fanfold says so once, where the tool is made.
            warnings.warn(
                ToolDefinitionWarning(
                    f"{where}: no description (document it in the docstring's 'Args:' "
                    "section, or annotate it as Annotated[..., 'what it is'])"
                ),
                stacklevel=3,
            )
        if parameter.default is parameter.empty:
            required.append(parameter.name)
        elif parameter.name in adapters:
            default = _pydantic_default(adapters[parameter.name], parameter.default)
            if default is not _NO_DEFAULT:
                schema["default"] = default
        elif _jsonable(parameter.default):
            schema["default"] = _CONVERTER.unstructure(parameter.default)
        properties[parameter.name] = schema
        kinds[parameter.name] = base
    input_schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    if adapters:
        offered, definitions = pydantic_types.schemas(adapters)
        for name, schema in offered.items():
            # What the signature and docstring say (description, default) wins over
            # what pydantic repeats of them.
            properties[name] = {**schema, **properties[name]}
        if definitions:
            input_schema["$defs"] = definitions
    try:
        check_schema(input_schema, tool_name)
    except SchemaError as exc:  # a bug of _schema's (or pydantic's): it must be valid
        raise ToolDefinitionError(str(exc)) from None
    spec = ToolSpec.from_schema(
        tool_name,
        " ".join(text.split()),
        input_schema,
        read_only=read_only,
        needs_approval=needs_approval,
    )
    return FunctionTool(
        spec,
        function,
        read_only=read_only,
        idempotent=idempotent,
        timeout=timeout,
        max_output_chars=max_output_chars,
        types=kinds,
        runs_on=loop,
        adapters=adapters,
    )


# Packages whose async code needs a running asyncio loop: asyncio itself, and the
# asyncio-only libraries most tools use (by custom their names start with "aio").
_ASYNCIO_PACKAGES = frozenset({"asyncio", "asyncpg", "motor", "uvloop", "websockets"})


def _library_of(function: Callable[..., Any]) -> Literal["trio", "asyncio"]:
    """``runs_on="auto"``: ``"asyncio"`` when the module defining ``function`` uses
    asyncio (it imported ``asyncio``, a package named ``aio...`` such as aiohttp, or
    one of ``_ASYNCIO_PACKAGES``, or a name from one) and not Trio; else ``"trio"``,
    which also runs anyio and sniffio-aware libraries (httpx, the OpenAI and Anthropic
    SDKs). A sync function's module is read too: it matters only if the function
    returns a coroutine."""
    namespace = getattr(inspect.unwrap(function), "__globals__", {})
    uses: set[str] = set()
    for value in list(namespace.values()):
        try:
            module = value.__name__ if isinstance(value, types.ModuleType) else None
            if module is None:
                module = getattr(value, "__module__", None)
        except Exception:  # a proxy object that answers nothing
            continue
        if not isinstance(module, str):
            continue
        package = module.partition(".")[0]
        if package == "trio" or package.startswith("trio_"):
            uses.add("trio")
        elif package in _ASYNCIO_PACKAGES or package.startswith("aio"):
            uses.add("asyncio")
    return "asyncio" if uses == {"asyncio"} else "trio"


def _asyncio_on_trio(exc: Exception) -> bool:
    """Whether ``exc`` is what asyncio code raises when awaited on Trio: asyncio's
    "no running event loop", Trio's refusal of an asyncio future, sniffio's
    "unknown async library"."""
    text = str(exc)
    return (
        (isinstance(exc, RuntimeError) and "event loop" in text)
        or (isinstance(exc, TypeError) and "unrecognized yield message" in text)
        or type(exc).__name__ == "AsyncLibraryNotFoundError"
    )


def _as_coroutine(awaitable: Any) -> Any:
    async def wrapped() -> Any:
        return await awaitable

    return wrapped()


def _described(hint: Any, base: Any, where: str) -> dict[str, Any] | None:
    """The schema fanfold's own description gives a parameter, or None when pydantic
    is to describe it: a type outside fanfold's list, or ``Annotated`` metadata that
    constrains it (``Field(ge=0)``), when pydantic is installed. Without pydantic a
    type outside the list is refused naming the install, and constraints are ignored
    as they always were."""
    if _constrained(hint) and pydantic_types.available():
        return None
    try:
        return _schema(base, where)
    except ToolDefinitionError as exc:
        if pydantic_types.available():
            return None
        raise ToolDefinitionError(
            f"{exc}; with pydantic installed, pydantic types, TypedDicts, unions, dates "
            f"and the like are described too ({pydantic_types.INSTALL})"
        ) from None


def _pydantic_adapter(hint: Any, base: Any, where: str) -> Any:
    try:
        return pydantic_types.adapter(hint)
    except pydantic_types.PydanticRefused as exc:
        try:
            _schema(base, where)
        except ToolDefinitionError as own:  # fanfold's reason first: it names the part
            raise ToolDefinitionError(f"{own}; nor can pydantic: {exc}") from None
        raise ToolDefinitionError(f"{where}: pydantic cannot describe it: {exc}") from None


_NO_DEFAULT = object()


def _pydantic_default(made: Any, value: Any) -> Any:
    """A pydantic-typed parameter's default as JSON, or ``_NO_DEFAULT`` when it has
    none (a default the type refuses, or one JSON cannot carry, is not shown)."""
    try:
        dumped = made.dump_python(value, mode="json")
        json.dumps(dumped, allow_nan=False)
    except Exception:
        return _NO_DEFAULT
    return dumped


def _constrained(hint: Any) -> bool:
    """Whether ``Annotated`` metadata other than text (a ``Field(...)``, an
    ``annotated_types`` constraint) is on ``hint``'s outer level."""
    if typing.get_origin(hint) is typing.Annotated:
        return any(not isinstance(extra, str) for extra in typing.get_args(hint)[1:])
    return False


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(_CONVERTER.unstructure(value), allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _unannotated(hint: Any) -> tuple[Any, str]:
    """``Annotated[X, "text", ...]`` (or ``Field(description="text")``) as (X,
    "text"); anything else as (hint, "")."""
    if typing.get_origin(hint) is typing.Annotated:
        base, *extras = typing.get_args(hint)
        # Text, or a pydantic ``Field(description=...)`` (anything with a text
        # ``description``).
        notes = [e if isinstance(e, str) else getattr(e, "description", None) for e in extras]
        note = next((n for n in notes if isinstance(n, str) and n.strip()), "")
        return base, note
    return hint, ""


_SCALARS: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
    None: "null",
}


def _schema(hint: Any, where: str, outer: frozenset[type] = frozenset()) -> dict[str, Any]:
    """The JSON schema of a type hint (plain types, lists of types, no references);
    ``outer``: the records (attrs classes, dataclasses) being described around it."""
    hint, _ = _unannotated(hint)
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if hint is Any:
        return {}
    origin = typing.get_origin(hint)
    arguments = typing.get_args(hint)
    if origin is typing.Literal:
        values = list(arguments)
        if not all(isinstance(v, str | int | bool) for v in values):
            raise ToolDefinitionError(f"{where}: Literal values must be str, int or bool")
        return {"enum": values}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = [member.value for member in hint]
        if not all(isinstance(v, str | int) for v in values):
            raise ToolDefinitionError(f"{where}: an Enum's values must be str or int")
        return {"enum": values}
    if origin in (typing.Union, types.UnionType):
        others = [a for a in arguments if a is not type(None)]
        if len(others) == 1 and len(arguments) == 2:
            inner = _schema(others[0], where, outer)
            kind = inner.get("type")
            if isinstance(kind, str):
                return {**inner, "type": [kind, "null"]}
            if "enum" in inner:
                return {**inner, "enum": [*inner["enum"], None]}
        raise ToolDefinitionError(
            f"{where}: unions other than 'X | None' (of a typed X) cannot be described"
        )
    if origin in (list, set, frozenset, Sequence) or (
        origin is tuple and len(arguments) == 2 and arguments[1] is Ellipsis
    ):
        item = arguments[0] if arguments else Any
        return {"type": "array", "items": _schema(item, where, outer)}
    if origin is tuple:
        raise ToolDefinitionError(f"{where}: use tuple[X, ...] (fixed-length tuples are not)")
    if origin in (dict, Mapping) or hint in (dict, list):
        if hint is list:
            return {"type": "array"}
        if arguments and arguments[0] is not str:
            raise ToolDefinitionError(f"{where}: a dict's keys must be str (JSON's are)")
        return {"type": "object"}
    if isinstance(hint, type) and (attrs.has(hint) or dataclasses.is_dataclass(hint)):
        if hint in outer:
            # A record that holds itself (a tree's node): its schema would never end
            # (this recursed until a RecursionError).
            raise ToolDefinitionError(
                f"{where}: {hint.__name__!r} contains itself; a recursive type cannot be "
                "described in JSON (take a dict, or a str of JSON)"
            )
        return _record_schema(hint, where, outer | {hint})
    raise ToolDefinitionError(
        f"{where}: type {getattr(hint, '__name__', hint)!r} cannot be described in JSON "
        "(use str, int, float, bool, list, dict, Literal, an Enum, X | None, or an attrs "
        "class or dataclass of those)"
    )


def _record_schema(cls: type, where: str, outer: frozenset[type]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    properties: dict[str, Any] = {}
    required: list[str] = []
    if attrs.has(cls):
        fields = [(f.name, f.default is attrs.NOTHING) for f in attrs.fields(cls)]
    else:
        fields = [
            (
                f.name,
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(cls)
        ]
    for field_name, is_required in fields:
        hint = hints[field_name]
        base, note = _unannotated(hint)
        schema = _schema(base, f"{where}.{field_name}", outer)
        if note:
            schema = {"description": note, **schema}
        properties[field_name] = schema
        if is_required:
            required.append(field_name)
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


# ------------------------------------------------------------------ docstrings

_GOOGLE_ARGS = ("args:", "arguments:", "parameters:", "params:", "keyword args:")
_GOOGLE_SECTIONS = (
    "returns:",
    "return:",
    "yields:",
    "raises:",
    "examples:",
    "example:",
    "note:",
    "notes:",
    "see also:",
    "attributes:",
)
_NUMPY_SECTIONS = ("parameters", "returns", "yields", "raises", "examples", "notes", "see also")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """A docstring's text before its sections, and each parameter's description.

    Reads Google style (``Args:`` then ``name (type): text`` lines, continuation lines
    indented further), NumPy style (``Parameters`` underlined by dashes, then ``name :
    type`` and indented text) and reST (``:param name: text``).
    """
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    summary: list[str] = []
    params: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        lowered = stripped.lower()
        is_numpy = (
            lowered in _NUMPY_SECTIONS and i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"}
        )
        if lowered in _GOOGLE_ARGS or (is_numpy and lowered == "parameters"):
            i += 2 if is_numpy else 1
            i = _read_params(lines, i, params, numpy=is_numpy)
            continue
        if lowered in _GOOGLE_SECTIONS or is_numpy or lowered.startswith((":return", ":raise")):
            i = _skip_section(lines, i + (2 if is_numpy else 1), numpy=is_numpy)
            continue
        if lowered.startswith(":param "):
            head, _, rest = stripped[len(":param ") :].partition(":")
            pname = head.split()[-1] if head.split() else ""
            text = [rest.strip()]
            i += 1
            while i < len(lines) and lines[i].startswith((" ", "\t")) and lines[i].strip():
                text.append(lines[i].strip())
                i += 1
            params[pname] = " ".join(t for t in text if t)
            continue
        if lowered.startswith((":type ", ":rtype")):
            i += 1
            continue
        summary.append(line)
        i += 1
    return "\n".join(summary).strip(), params


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _skip_section(lines: list[str], i: int, *, numpy: bool) -> int:
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if _indent(line) == 0 and not numpy:
            return i
        if numpy and _indent(line) == 0:
            lowered = line.strip().lower()
            if lowered in _NUMPY_SECTIONS and i + 1 < len(lines):
                return i
        i += 1
    return i


def _read_params(lines: list[str], i: int, params: dict[str, str], *, numpy: bool) -> int:
    # Google: entries indented below the header, "name (type): text"; NumPy: entries at
    # the header's indentation, "name : type", text indented below.
    entry_indent: int | None = None
    current: str | None = None
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            if numpy and current is None:
                continue
            if i < len(lines) and lines[i].strip() and _indent(lines[i]) == 0 and not numpy:
                return i
            continue
        indent = _indent(line)
        if not numpy and indent == 0:
            return i
        if (
            numpy
            and indent == 0
            and ":" not in line
            and i + 1 < len(lines)
            and set(lines[i + 1].strip()) == {"-"}
        ):
            return i
        if entry_indent is None:
            entry_indent = indent
        if indent == entry_indent:
            text = line.strip()
            if numpy:
                current = text.split(":")[0].strip()
                params[current] = ""
            else:
                head, sep, rest = text.partition(":")
                if not sep:
                    i += 1
                    continue
                current = head.split("(")[0].strip().lstrip("*")
                params[current] = rest.strip()
        elif current is not None and indent > entry_indent:
            params[current] = (params[current] + " " + line.strip()).strip()
        i += 1
    return i
