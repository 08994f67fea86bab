"""``--tools MODULE:ATTR``: a program's own Python tools for ``fanfold run``, ``resume``
and ``send``, and the check that a continued tree gets every tool it recorded.

The user names the code on the command line (their explicit choice, as running
``python mytools.py`` would be): ``--tools mytools:lookup`` imports the installed or
importable module ``mytools``; ``--tools ./mytools.py:lookup`` (a path, told apart by
its ``.py``) loads that file. The attribute may be a tool (``@fanfold.tool``), a
plain typed function (made a tool as ``@fanfold.tool`` would), or a list, tuple or
``ToolSet`` of them. Nothing else names Python code to import: no configuration key,
no environment variable, since a project's ``fanfold.toml`` is the repository's text,
and importing a module it named would run the repository's code.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import uuid
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import click

from fanfold.cli.errors import CliError

F = TypeVar("F", bound=Callable[..., Any])

HOW = "--tools MODULE:ATTR (or --tools FILE.py:ATTR)"
"""How a user supplies a Python tool, for the messages that ask for one."""


def tools_option(command: F) -> F:
    """The ``--tools`` option (repeatable) of ``run``, ``resume`` and ``send``."""
    return click.option(
        "--tools",
        "tool_refs",
        multiple=True,
        metavar="MODULE:ATTR",
        help="Your own Python tools beside the built-ins: a tool, a typed function, or a "
        "list of them, from an importable module (mytools:lookup) or a file "
        "(./mytools.py:lookup). Repeatable. Resuming a tree needs the tools it ran with.",
    )(command)


def load_tools(refs: Iterable[str]) -> list[Any]:
    """The tools ``refs`` name (``MODULE:ATTR`` or ``FILE.py:ATTR``), each checked as a
    ``ToolSet`` would (schema, name, clash with a built-in); ``CliError`` (one line)
    for anything wrong. An exception raised by the module while it is imported is the
    user's code failing: reported in one line, with its type and message. A
    ``ToolDefinitionWarning`` (a parameter without a description) is one line on
    stderr, ``warning: --tools: ...``."""
    from fanfold.tools.function import ToolDefinitionWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ToolDefinitionWarning)
        try:
            return _load(refs)
        finally:
            for warning in caught:
                if issubclass(warning.category, ToolDefinitionWarning):
                    # One line each, as the CLI's other warnings (no source line).
                    click.echo(f"warning: --tools: {warning.message}", err=True)
                else:  # somebody else's: shown as it would have been
                    warnings.showwarning(
                        warning.message,
                        warning.category,
                        warning.filename,
                        warning.lineno,
                        warning.file,
                        warning.line,
                    )


def _load(refs: Iterable[str]) -> list[Any]:
    from fanfold.tools.registry import ToolSet  # the tools' libraries: only when used

    tools: list[Any] = []
    for ref in refs:
        value = _attribute(ref)
        if isinstance(value, ToolSet):
            items: list[Any] = [value.get(name) for name in value.names]
        else:
            items = list(value) if isinstance(value, list | tuple) else [value]
        for item in items:
            try:
                made = ToolSet([item])  # a function becomes a tool; the checks run
            except (TypeError, ValueError) as exc:  # ToolDefinitionError, SchemaError too
                raise CliError(f"--tools {ref}: {_one_line(exc)}") from None
            tools.extend(made.get(name) for name in made.names)
    try:
        ToolSet.default(extra=tools)
    except (TypeError, ValueError) as exc:  # two tools of one name
        raise CliError(f"--tools: {_one_line(exc)}") from None
    return tools


def _attribute(ref: str) -> Any:
    where, sep, attribute = ref.rpartition(":")
    if not sep or not where or not attribute:
        raise CliError(f"--tools {ref}: expected MODULE:ATTR or FILE.py:ATTR")
    module = _module(ref, where)
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise CliError(f"--tools {ref}: {where} has no attribute {attribute!r}")
        value = getattr(value, part)
    return value


def _module(ref: str, where: str) -> Any:
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise CliError(f"--tools {ref}: no such file {where}")
            # A name of its own: two files called tools.py do not replace each other.
            name = f"fanfold_tools_{path.stem}_{uuid.uuid4().hex[:8]}"
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise CliError(f"--tools {ref}: cannot load {where} as a Python module")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            return module
        return importlib.import_module(where)
    except CliError:
        raise
    except ModuleNotFoundError as exc:
        hint = "; a file in this folder is --tools ./FILE.py:ATTR" if "." not in where else ""
        raise CliError(f"--tools {ref}: cannot import {where}: {_one_line(exc)}{hint}") from None
    except BaseException as exc:  # the user's module failed (SystemExit included)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise CliError(
            f"--tools {ref}: importing {where} failed: {type(exc).__name__}: {_one_line(exc)}"
        ) from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def missing_message(what: str, missing: list[str]) -> str:
    """One line: ``what`` recorded tools that nothing supplies, and how to supply them."""
    names = ", ".join(repr(n) for n in missing)
    return (
        f"{what} recorded Python tool(s) {names} that are not supplied here: "
        f"pass the tools it was started with, {HOW}"
    )
