"""What one tool is: a spec, an async ``run`` over validated arguments, and its output.

A :class:`Tool` never sees raw JSON: :class:`~fanfold.tools.registry.ToolSet` parses and
validates the arguments against ``spec.input_schema()`` first, so a tool may index its
arguments by the schema's types. A tool reports bad input it can only detect while
running (a missing file, a path outside the working directory) by raising
:class:`ToolInputError`; the tool set turns that into an error result for the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from fanfold.statemachine import ToolSpec


def valid_tool_name(name: str) -> bool:
    """Whether ``name`` is a name providers accept for a tool: 1-64 ASCII letters,
    digits, ``_`` or ``-`` (Anthropic's and OpenAI's rule)."""
    return 0 < len(name) <= 64 and all(c.isascii() and (c.isalnum() or c in "_-") for c in name)


class ToolInputError(Exception):
    """Bad input found while running a tool; ``message`` is shown to the model.

    The message should say what was wrong and, where possible, what to do instead. The
    tool set prefixes it with the tool's name (``"read_file: ..."``).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@attrs.frozen
class ToolOutput:
    """What a tool returns: the text the model will see, and whether it is an error."""

    content: str
    is_error: bool = False

    @classmethod
    def ok(cls, content: str) -> ToolOutput:
        """A successful result."""
        return cls(content, False)

    @classmethod
    def error(cls, content: str) -> ToolOutput:
        """A failed result the model should notice (a timeout, a non-zero exit)."""
        return cls(content, True)


class Tool(Protocol):
    """One ordinary tool. ``args`` already conform to ``spec``'s input schema.

    A tool may also have boolean ``read_only`` (it changes nothing) and ``idempotent``
    (a second call with the same arguments is harmless) attributes: its own claims,
    which ``ToolSet.read_only``/``ToolSet.idempotent`` read (absent: false). Python
    functions become tools with ``fanfold.tool``.
    """

    @property
    def spec(self) -> ToolSpec:
        """Name, description and JSON input schema offered to the model."""
        ...

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        """Run with validated ``args`` in the conversation's working directory ``cwd``."""
        ...


@runtime_checkable
class InProcess(Protocol):
    """A tool that answers in-process: no I/O, no waiting, nothing to cancel (``think``).

    It declares so by having ``answer``, a plain function of its validated arguments;
    its ``run`` must return what ``answer`` does. The runtime answers its calls in the
    engine's round, without a task or a cancel scope (DESIGN.md, "The runtime"). A tool
    that reads a file, runs a process or waits on anything must not have ``answer``.
    """

    def answer(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        """The output for validated ``args``, at once."""
        ...


@runtime_checkable
class Confinable(Protocol):
    """A tool with a form for agents confined to allow patterns (the bash tool: git
    runs with what the repository's configuration could start switched off)."""

    def confined(self) -> Tool:
        """This tool as a confined agent runs it."""
        ...
