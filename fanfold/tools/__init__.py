"""fanfold's ordinary tools and the ToolSet the runtime runs them through.

``ToolSet.default(policy=PathPolicy())`` offers ``bash``, ``read_file``, ``write_file``,
``edit_file``, ``think``, ``grep`` and ``glob`` (and ``web_fetch`` given
``web_domains``); ``fanfold.tool`` makes more of Python functions. The control tools
(``spawn_agents``, ``submit_result``, ``submit_error``) are not here: the reducer
handles them.
"""

from typing import TYPE_CHECKING, Any

from fanfold.tools.base import ToolRunner
from fanfold.tools.bash import BashTool
from fanfold.tools.files import EditFileTool, ReadFileTool, WriteFileTool
from fanfold.tools.output import HeadTailBuffer
from fanfold.tools.paths import PathMode, PathPolicy
from fanfold.tools.registry import ToolSet
from fanfold.tools.schema import SchemaError, check_schema, validate, validate_arguments
from fanfold.tools.search import GlobTool, GrepTool, SearchLimits
from fanfold.tools.secrets import EnvPolicy, Redactor
from fanfold.tools.think import ThinkTool
from fanfold.tools.tool import Confinable, Tool, ToolInputError, ToolOutput

__all__ = [
    "BashTool",
    "Confinable",
    "EditFileTool",
    "EnvPolicy",
    "GlobTool",
    "GrepTool",
    "HeadTailBuffer",
    "PathMode",
    "PathPolicy",
    "ReadFileTool",
    "Redactor",
    "SchemaError",
    "SearchLimits",
    "ThinkTool",
    "Tool",
    "ToolInputError",
    "ToolOutput",
    "ToolRunner",
    "ToolSet",
    "WebFetchTool",
    "WriteFileTool",
    "check_schema",
    "validate",
    "validate_arguments",
]

if TYPE_CHECKING:
    from fanfold.tools.web import WebFetchTool


def __getattr__(name: str) -> Any:
    # ``web_fetch`` (httpx, httpcore) is imported when first named (issue 36).
    if name == "WebFetchTool":
        from fanfold.tools.web import WebFetchTool

        return WebFetchTool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
