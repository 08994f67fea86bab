"""Every code block of README.md and of the documentation site (docs/) runs here
(issue 37): a renamed function, option or command can no longer leave a wrong example.

Sybil (tests extra) reads the Markdown: each fenced block is one test, in the order of
its document, and the blocks of one document share a namespace (a later block may use
what an earlier one defined). What each kind of block does:

- ``python``: executed. A block with ``await`` at its top level runs in Trio, inside a
  runtime opened for it (``runtime``: the offline demo's script, without its pauses,
  and the default tools, on a log in the document's own folder); a name a block
  leaves (``root_id``) is there for the next. ``<!-- invisible-code-block: python
  -->`` comments hold a document's hidden set-up and the checks of what a block
  claims.
- ``console``: run. Each ``$ `` line is a shell command run with bash in the document's
  own folder (``fanfold`` of this venv first on ``PATH``, ``HOME`` and the data folders
  there too); the lines under it are its expected output, ``...`` standing for any
  text. Each command must exit 0.
- ``sh``: every ``fanfold ...`` line is parsed by the real command line (commands,
  options, the types of their values), not run: these blocks are references with
  placeholders (``ID``).
- ``toml`` and ``json``: parsed; ``markdown`` (an agent definition file): loaded by
  fanfold's own parser, without a problem or a warning.

A block that needs what CI has not (a real model, the network, a PostgreSQL server, a
file of the reader's) is marked ``<!-- skip: next "the reason" -->`` and reported as
skipped with that reason, never silently left out.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import logging
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
from doc_commands import fanfold_lines, parse_fanfold_line
from sybil import Document, Example, Sybil
from sybil.evaluators.python import pad
from sybil.parsers.markdown import CodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _python(example: Example) -> None:
    source = pad(example.parsed, example.line + example.parsed.line_offset)
    code = compile(
        source, example.path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
    )
    namespace = example.namespace
    if code.co_flags & inspect.CO_COROUTINE:
        trio.run(_in_a_runtime, code, namespace)
    else:
        exec(code, namespace)
    namespace.pop("__builtins__", None)


async def _in_a_runtime(code: Any, namespace: dict[str, Any]) -> None:
    """Run a block holding top-level ``await`` with ``runtime`` bound: the offline
    demo's provider and the default tools, unless the document's set-up gave its own
    ``open_doc_runtime`` (a function returning ``Runtime.open(...)``)."""
    from fanfold.examples import CODE_REVIEW_SCRIPT
    from fanfold.providers.scripted import ScriptedProvider
    from fanfold.runtime import Runtime
    from fanfold.tools.registry import ToolSet

    opener = namespace.get("open_doc_runtime")
    if opener is not None:
        runtime_cm = opener()
    else:
        # The demo's script without its pauses (0.3 s a reply, there to be watched).
        script = json.loads(Path(CODE_REVIEW_SCRIPT).read_text(encoding="utf-8"))
        script["latency"] = 0
        for agent in script["agents"]:
            for reply in agent["replies"]:
                reply.pop("latency", None)
        runtime_cm = Runtime.open("doc.db", ScriptedProvider(script), ToolSet.default())
    async with runtime_cm as runtime:
        namespace["runtime"] = runtime
        try:
            await eval(code, namespace)
        finally:
            del namespace["runtime"]


_WILDCARD = "..."


def _matches(expected: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` (output lines) fits ``expected``, where a line ``...`` stands
    for any number of lines and ``...`` inside a line for any text."""
    pattern = "\n".join(
        r"(?:.*\n)*?.*" if line.strip() == _WILDCARD else re.escape(line).replace(r"\.\.\.", ".*")
        for line in expected
    )
    return re.fullmatch(pattern + r"\n?", "\n".join(actual) + "\n", re.S) is not None


def _console(example: Example) -> str | None:
    commands: list[tuple[str, list[str]]] = []
    for line in str(example.parsed).splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        elif commands:
            commands[-1][1].append(line)
    folder = example.namespace["__folder__"]
    for command, expected in commands:
        for line in fanfold_lines(command):
            parse_fanfold_line(line)
        run = subprocess.run(
            ["bash", "-c", command],
            cwd=folder,
            env=example.namespace["__env__"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        output = [line.rstrip() for line in run.stdout.rstrip("\n").splitlines()]
        if run.returncode != 0:
            return f"$ {command}\nexit {run.returncode}\n{run.stdout}{run.stderr}"
        if expected and not _matches([e.rstrip() for e in expected], output):
            return f"$ {command}\nexpected:\n" + "\n".join(expected) + "\ngot:\n" + run.stdout
    return None


def _shell(example: Example) -> None:
    for line in fanfold_lines(str(example.parsed)):
        parse_fanfold_line(line)


def _toml(example: Example) -> None:
    tomllib.loads(str(example.parsed))


def _json(example: Example) -> None:
    json.loads(str(example.parsed))


def _agent_file(example: Example) -> None:
    """A ``markdown`` block is an agent definition file: it must load, without a
    problem or a warning."""
    from fanfold.agents import parse_definition

    definition, problems = parse_definition(str(example.parsed), "agent.md")
    assert definition is not None and not problems, problems


SYBIL = Sybil(
    parsers=[
        SkipParser(),
        CodeBlockParser("python", _python),
        CodeBlockParser("console", _console),
        CodeBlockParser("sh", _shell),
        CodeBlockParser("toml", _toml),
        CodeBlockParser("json", _json),
        CodeBlockParser("markdown", _agent_file),
    ],
)


def _examples() -> Iterator[Any]:
    for path in DOCUMENTS:
        document = SYBIL.parse(path)
        for example in document.examples():
            name = f"{path.relative_to(ROOT)}:{example.line}"
            yield pytest.param(document, example, id=name)


@contextlib.contextmanager
def _document_folder(
    document: Document, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """The document's own folder (made for its first block) as the working directory."""
    namespace = document.namespace
    if "__folder__" not in namespace:
        folder = tmp_path_factory.mktemp(Path(document.path).stem)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("FANFOLD_", "XDG_", "OTEL_")) and k != "HOME"
        }
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["HOME"] = str(folder)
        env["COLUMNS"] = "100"
        namespace["__folder__"] = folder
        namespace["__env__"] = env
        namespace["__file__"] = document.path  # a block may read its own page
    before = Path.cwd()
    os.chdir(namespace["__folder__"])
    try:
        yield namespace["__folder__"]
    finally:
        os.chdir(before)


@pytest.mark.parametrize(("document", "example"), list(_examples()))
def test_code_block(
    document: Document,
    example: Example,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The blocks' own files (databases, keys, logs) stay in the document's folder.
    with _document_folder(document, tmp_path_factory) as folder:
        monkeypatch.setenv("HOME", str(folder))
        monkeypatch.setenv("XDG_DATA_HOME", str(folder / ".local" / "share"))
        monkeypatch.setenv("XDG_CONFIG_HOME", str(folder / ".config"))
        try:
            example.evaluate()
        finally:
            # A block may configure logging globally; leave no handler behind.
            logging.getLogger("fanfold").handlers.clear()
            structlog.reset_defaults()


def test_every_document_has_blocks_and_each_skip_gives_its_reason() -> None:
    """A skip marker without a reason would skip silently: each names why."""
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        for marker in re.findall(r"<!--\s*skip:\s*(.*?)\s*-->", text):
            assert re.fullmatch(r'next\s+".{10,}"', marker), f"{path.name}: skip: {marker}"
    assert sum(1 for _ in _examples()) >= 60
