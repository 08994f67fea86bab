"""``ToolSet``: the runtime's ToolRunner over a fixed set of named tools."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import trio

from fanfold.statemachine import CONTROL_TOOLS, ToolCall, ToolResult, ToolSpec
from fanfold.statemachine.permissions import MCP_RESOURCE_TOOLS, mcp_server_of
from fanfold.tools.bash import BashTool
from fanfold.tools.files import EditFileTool, ReadFileTool, WriteFileTool
from fanfold.tools.function import function_tool
from fanfold.tools.output import HeadTailBuffer
from fanfold.tools.paths import PathPolicy
from fanfold.tools.schema import check_schema, validate_spec_arguments
from fanfold.tools.search import GlobTool, GrepTool
from fanfold.tools.secrets import EnvPolicy
from fanfold.tools.think import ThinkTool
from fanfold.tools.tool import (
    Confinable,
    InProcess,
    Tool,
    ToolInputError,
    ToolOutput,
    valid_tool_name,
)

DEFAULT_POLICY = PathPolicy()
MAX_OUTPUT_CHARS = 100_000
"""The most a tool's output may hold when it reaches the log and the model: a backstop
for tools that do not cap their own (a program's own ``Tool``, later an MCP server's);
bash, read_file, grep, glob, web_fetch and function tools cap theirs lower."""
DEFAULT_ENV = EnvPolicy()


class ToolSet:
    """A fixed set of tools, looked up by name; implements :class:`ToolRunner`.

    ``run`` returns an error result (``is_error=True``), never raises, for: an unknown
    tool, arguments that are not a JSON object or break the tool's schema, a
    :class:`ToolInputError` from the tool, an ``OSError`` or ``UnicodeDecodeError``, and
    ``trio.TooSlowError``. ``trio.Cancelled`` and every other exception propagate: those
    are cancellation or bugs in fanfold, and must not be disguised as a tool result.
    """

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]]) -> None:
        """Build from ``tools``: tool objects, or functions, which are made tools as
        ``@fanfold.tool`` would. Raises ``ValueError`` on duplicate or control-tool
        names, on a name a model cannot call, on a tool whose name is a built-in's
        (``bash`` and the rest of ``BUILT_IN_NAMES``) unless it is that built-in, and
        :class:`~fanfold.tools.schema.SchemaError` on a schema that is not a valid JSON
        Schema (fanfold's own tools' schemas are fixed, and checked by the tests)."""
        self._tools: dict[str, Tool] = {}
        self._specs: dict[str, ToolSpec] = {}
        self._conforms: dict[str, Callable[[object], bool]] = {}
        # The tools that answer in-process (``InProcess``): their ``answer``, by name.
        self._answers: dict[str, Callable[[Mapping[str, Any], str], ToolOutput]] = {}
        for given in tools:
            tool = _as_tool(given)
            spec = tool.spec
            if spec.name in BUILT_IN_NAMES and not _built_in(tool):
                raise ValueError(
                    f"tool {spec.name!r} clashes with fanfold's built-in tool of that name; "
                    "give yours another (@fanfold.tool(name=...))"
                )
            if spec.name in self._tools:
                raise ValueError(f"duplicate tool name {spec.name!r}")
            if spec.name in CONTROL_TOOLS:
                raise ValueError(f"{spec.name!r} is a control tool, handled by the reducer")
            if not valid_tool_name(spec.name):
                raise ValueError(
                    f"tool name {spec.name!r}: a name is 1-64 letters, digits, '_' or '-'"
                )
            own = _built_in(tool)
            if getattr(tool, "read_only", False) and not spec.read_only and not own:
                # What the tool says of itself goes into its recorded spec, where the
                # reducer's ``read-only`` rule reads it. fanfold's own reading tools are
                # in ``READING_TOOLS``: their specs stay as older logs hold them.
                spec = attrs.evolve(spec, read_only=True)
            schema = spec.input_schema()
            if not own:
                # (fanfold's own schemas are not re-checked at every start: checking
                # loads ``jsonschema``, and a run whose calls pass the fast check
                # below never needs it.)
                check_schema(schema, spec.name)
            self._tools[spec.name] = tool
            self._specs[spec.name] = spec
            self._conforms[spec.name] = _compile_check(schema)
            if isinstance(tool, InProcess):
                self._answers[spec.name] = tool.answer

    @classmethod
    def default(
        cls,
        policy: PathPolicy = DEFAULT_POLICY,
        env_policy: EnvPolicy = DEFAULT_ENV,
        *,
        extra: Iterable[Tool | Callable[..., Any]] = (),
        web_domains: Iterable[str] = (),
    ) -> ToolSet:
        """bash, read_file, write_file, edit_file, think, grep and glob, file and search
        tools under ``policy``,
        bash commands' environments under ``env_policy``; ``web_fetch`` too when
        ``web_domains`` names hosts it may fetch from (``docs.python.org``,
        ``*.python.org``); then the ``extra`` tools (tool objects or functions, see
        ``fanfold.tool``) beside them."""
        domains = tuple(web_domains)
        return cls(
            [
                BashTool(env_policy=env_policy),
                ReadFileTool(policy),
                WriteFileTool(policy),
                EditFileTool(policy),
                ThinkTool(),
                GrepTool(policy),
                GlobTool(policy),
                *_web_fetch(domains),
                *extra,
            ]
        )

    def read_only(self, name: str) -> bool:
        """Whether the tool ``name`` says it changes nothing (its ``read_only``
        attribute; tools without one do not)."""
        return bool(getattr(self._tools.get(name), "read_only", False))

    def idempotent(self, name: str) -> bool:
        """Whether the tool ``name`` says a second call with the same arguments is
        harmless (its ``idempotent`` attribute; tools without one do not)."""
        return bool(getattr(self._tools.get(name), "idempotent", False))

    @property
    def names(self) -> tuple[str, ...]:
        """The tool names, in the order the tools were given."""
        return tuple(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or None."""
        return self._tools.get(name)

    def specs(self) -> tuple[ToolSpec, ...]:
        """The specs offered to conversations, in order."""
        return tuple(self._specs.values())

    async def run(self, call: ToolCall, cwd: str, *, confined: bool = False) -> ToolResult:
        """Validate and run ``call`` in ``cwd``; bad input becomes an error result.
        Output longer than ``MAX_OUTPUT_CHARS`` is cut to its head and tail, whatever
        the tool (each built-in caps its own output lower).

        ``confined``: the calling agent's bash runs only through allow patterns; a
        tool that can be confined (:class:`~fanfold.tools.tool.Confinable`, the bash
        tool) runs in its confined form."""
        prepared = self._prepare(call, confined)
        if isinstance(prepared, ToolOutput):
            return _result(call, prepared)
        tool, arguments = prepared
        try:
            output = await tool.run(arguments, cwd)
        except _INPUT_ERRORS as e:
            output = _input_error(call.name, e)
        return _result(call, output)

    def in_process(self, name: str) -> bool:
        """Whether a call to ``name`` is answered without I/O or waiting (``answer``):
        its tool is :class:`~fanfold.tools.tool.InProcess` (``think``), or there is no
        tool of that name (the call gets an error result)."""
        return name in self._answers or name not in self._tools

    def answer(self, call: ToolCall, cwd: str, *, confined: bool = False) -> ToolResult:
        """The result of a call ``in_process`` says is answered in-process, at once:
        what ``run`` would return. A call to any other tool is refused (ValueError)."""
        prepared = self._prepare(call, confined)
        if isinstance(prepared, ToolOutput):
            return _result(call, prepared)
        answer = self._answers.get(call.name)
        if answer is None:
            raise ValueError(f"{call.name!r} is not answered in-process: run it")
        try:
            output = answer(prepared[1], cwd)
        except _INPUT_ERRORS as e:
            output = _input_error(call.name, e)
        return _result(call, output)

    def _prepare(self, call: ToolCall, confined: bool) -> tuple[Tool, dict[str, Any]] | ToolOutput:
        """The tool to run and the call's validated arguments, or the error output of a
        call that no tool runs (unknown tool, arguments that are not valid)."""
        tool = self._tools.get(call.name)
        if tool is None:
            server = mcp_server_of(call.name)
            if server is not None:
                # A recorded MCP tool (a resumed tree's) whose server is not declared
                # now: declared ones are bound, and answer for themselves.
                return ToolOutput.error(
                    f"MCP server {server!r} is not declared in this run's configuration; "
                    f"its tool {call.name!r} cannot run"
                )
            available = ", ".join(self._tools) or "none"
            return ToolOutput.error(f"unknown tool {call.name!r}. Available tools: {available}")
        if confined and isinstance(tool, Confinable):
            tool = tool.confined()
        arguments = _parse(call)
        if isinstance(arguments, ToolOutput):
            return arguments
        if not self._conforms[call.name](arguments):
            schema_json = self._specs[call.name].input_schema_json
            problem = validate_spec_arguments(call.name, schema_json, arguments)
            if problem is not None:
                return ToolOutput.error(problem)
        return tool, arguments


# What a tool may raise for bad input (``ToolSet``'s docstring): an error result.
_INPUT_ERRORS = (ToolInputError, UnicodeDecodeError, OSError, trio.TooSlowError)


def _input_error(name: str, e: Exception) -> ToolOutput:
    if isinstance(e, ToolInputError):
        return ToolOutput.error(f"{name}: {e.message}")
    if isinstance(e, UnicodeDecodeError):
        return ToolOutput.error(f"{name}: input is not valid UTF-8 text ({e.reason})")
    if isinstance(e, OSError):
        where = f" ({e.filename})" if e.filename else ""
        return ToolOutput.error(f"{name}: {e.strerror or e}{where}")
    return ToolOutput.error(f"{name}: timed out")


def _result(call: ToolCall, output: ToolOutput) -> ToolResult:
    """``output`` as the call's result, cut to ``MAX_OUTPUT_CHARS`` (head and tail)."""
    content = output.content
    if len(content) > MAX_OUTPUT_CHARS:
        buffer = HeadTailBuffer(MAX_OUTPUT_CHARS)
        buffer.feed(content.encode("utf-8", "surrogatepass"))
        content = buffer.text()
    return ToolResult(call.id, call.name, content, output.is_error)


_ANNOTATIONS = frozenset({"description", "title", "default", "examples"})

BUILT_IN_NAMES = frozenset(
    {"bash", "read_file", "write_file", "edit_file", "think", "grep", "glob", "web_fetch"}
)
"""fanfold's own tools' names: a tool of another kind may not take one."""


def unsupplied(recorded: Iterable[ToolSpec], supplied: Iterable[str]) -> list[str]:
    """The recorded tools a continued tree would call in vain, in recorded order: neither
    fanfold's own (``BUILT_IN_NAMES``: the configuration decides those, web_fetch's
    domains included), nor control tools, nor MCP tools (bound to the servers declared
    now, or answered by an error result naming the server), nor among ``supplied``.

    Shared by ``fanfold resume``/``send`` (``--tools``) and ``Runtime.resume``/``send``/
    ``attach`` (the runtime's tool runner), so both refuse the same trees."""
    have = set(supplied)
    missing: list[str] = []
    for spec in recorded:
        name = spec.name
        if name in BUILT_IN_NAMES or name in CONTROL_TOOLS or mcp_server_of(name) is not None:
            continue
        if name in MCP_RESOURCE_TOOLS:  # bound like MCP tools (fanfold.mcp.resources)
            continue
        if name not in have and name not in missing:
            missing.append(name)
    return missing


_BUILT_IN_TYPES = (
    BashTool,
    ReadFileTool,
    WriteFileTool,
    EditFileTool,
    ThinkTool,
    GrepTool,
    GlobTool,
)


def _web_fetch(domains: tuple[str, ...]) -> list[Tool]:
    """``web_fetch`` if ``domains`` names hosts, its module imported only then."""
    if not domains:
        return []
    from fanfold.tools.web import WebFetchTool

    return [WebFetchTool(domains)]


def _built_in(tool: object) -> bool:
    """Whether ``tool`` is one of fanfold's built-in tools. ``web_fetch``'s module
    (httpx, httpcore: a quarter of a scripted run's start-up, issue 36) is imported
    only for a configuration that offers it; a tool of its class cannot exist unless
    it was, so it is looked for among the modules already imported."""
    if isinstance(tool, _BUILT_IN_TYPES):
        return True
    web = sys.modules.get("fanfold.tools.web")
    return web is not None and isinstance(tool, web.WebFetchTool)


def _as_tool(given: Tool | Callable[..., Any]) -> Tool:
    if hasattr(given, "spec") and hasattr(given, "run"):
        return given
    if callable(given):
        return function_tool(given)
    raise TypeError(f"not a tool or a function: {given!r}")


def _compile_check(schema: dict[str, Any]) -> Callable[[object], bool]:
    """A fast test that is True only for arguments the full validator would find no
    problem with. It covers the built-ins' shape (an object of string, boolean, integer
    and number properties with simple bounds, and string enums); for anything else, and
    whenever it says False, the full validator decides (and writes the messages), so a
    run whose calls are all well formed never loads ``jsonschema``."""
    never: Callable[[object], bool] = lambda _: False  # noqa: E731
    if not set(schema) <= _ANNOTATIONS | {"type", "properties", "required", "additionalProperties"}:
        return never
    if schema.get("type", "object") != "object":
        return never
    if not isinstance(schema.get("additionalProperties", True), bool):
        return never
    properties = schema.get("properties", {})
    checks: dict[str, Callable[[object], bool]] = {}
    for name, sub in properties.items():
        check = _property_check(sub)
        if check is None:
            return never
        checks[name] = check
    required = tuple(schema.get("required", ()))
    closed = schema.get("additionalProperties", True) is False

    def conforms(arguments: object) -> bool:
        if not isinstance(arguments, dict):
            return False
        for name in required:
            if name not in arguments:
                return False
        for name, value in arguments.items():
            check = checks.get(name)
            if check is None:
                if closed:
                    return False
                continue
            if not check(value):
                return False
        return True

    return conforms


_BOUND_KEYS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})


def _property_check(sub: object) -> Callable[[object], bool] | None:
    """A fast test of one property's value, or None when its schema is not one of the
    simple shapes (the full validator decides then)."""
    if not isinstance(sub, dict):
        return None
    keys = set(sub) - _ANNOTATIONS
    kind = sub.get("type")
    if kind == "string" and keys <= {"type", "minLength"}:
        min_length = sub.get("minLength", 0)
        if type(min_length) is not int:
            return None
        return lambda v: isinstance(v, str) and len(v) >= min_length
    if kind == "boolean" and keys == {"type"}:
        return lambda v: isinstance(v, bool)
    if kind in ("integer", "number") and keys <= {"type"} | _BOUND_KEYS:
        bounds = {k: sub[k] for k in keys & _BOUND_KEYS}
        if not all(type(b) in (int, float) and math.isfinite(b) for b in bounds.values()):
            return None
        low, high = bounds.get("minimum"), bounds.get("maximum")
        above, below = bounds.get("exclusiveMinimum"), bounds.get("exclusiveMaximum")
        integral = kind == "integer"

        def number(v: object) -> bool:
            # Exact types only: a bool is not a number, a float that is whole (an
            # integer for the schema) or not finite goes to the full validator.
            if type(v) is not int and (integral or type(v) is not float or not math.isfinite(v)):
                return False
            n: float = v
            return (
                (low is None or n >= low)
                and (high is None or n <= high)
                and (above is None or n > above)
                and (below is None or n < below)
            )

        return number
    if keys == {"enum"} or (keys == {"enum", "type"} and kind == "string"):
        choices = sub["enum"]
        if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
            return None
        allowed = frozenset(choices)
        return lambda v: isinstance(v, str) and v in allowed
    return None


def _parse(call: ToolCall) -> dict[str, Any] | ToolOutput:
    """The call's arguments as an object, or an error output. Empty text means ``{}``."""
    if not call.arguments_json.strip():
        return {}
    try:
        arguments = call.arguments()
    except ValueError as e:
        return ToolOutput.error(
            f"{call.name}: the arguments are not valid JSON ({e}); send a JSON object"
        )
    if not isinstance(arguments, dict):
        got = json.dumps(arguments)[:40]
        return ToolOutput.error(f"{call.name}: the arguments must be a JSON object, got {got}")
    return arguments
