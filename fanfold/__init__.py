"""fanfold: LLM-agent conversations that delegate to sub-agents, driven by a pure,
replayable state machine.

``fanfold.tool`` makes a tool of a typed Python function (``@fanfold.tool``); pass it
to ``Runtime.open`` in a list, or beside the built-ins with
``ToolSet.default(extra=[...])``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from fanfold.tools.function import FunctionTool, ToolDefinitionError, function_tool, tool

__all__ = ["FunctionTool", "ToolDefinitionError", "function_tool", "tool"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: ``import fanfold.statemachine`` (the pure core) or
    # ``fanfold.replay`` must not pull in the tools, Trio and cattrs with it.
    if name in __all__:
        from fanfold.tools import function

        return getattr(function, name)
    raise AttributeError(f"module 'fanfold' has no attribute {name!r}")
