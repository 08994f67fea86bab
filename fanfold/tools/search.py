"""The ``grep`` and ``glob`` tools (Claude Code's ``Grep`` and ``Glob``).

Both search the files under the conversation's working directory, in a separate
process per call (:mod:`fanfold.tools.search_worker`) that is killed at its time
limit or on cancellation: a regular expression that backtracks catastrophically
costs one process its time limit, never the event loop. The ``path`` argument is
resolved by the :class:`~fanfold.tools.paths.PathPolicy` (``..`` and symbolic links
followed, refused outside the working directory); below it, no symbolic link is
followed. ``.gitignore`` files are honoured, ``.git`` is skipped, the output is
bounded.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from fanfold.statemachine import ToolSpec
from fanfold.tools.paths import PathPolicy
from fanfold.tools.tool import ToolInputError, ToolOutput

WORKER = Path(__file__).with_name("search_worker.py")

MAX_PATTERN_CHARS = 1000


@attrs.frozen
class SearchLimits:
    """Bounds of one search: time, output, what is read."""

    timeout: float = 20.0
    max_chars: int = 30_000
    max_items: int = 1000
    max_line_chars: int = 500
    max_file_bytes: int = 4 << 20
    max_entries: int = 200_000


async def _search(
    mode: str,
    request: dict[str, Any],
    cwd: str,
    policy: PathPolicy,
    limits: SearchLimits,
) -> ToolOutput:
    root = os.path.realpath(cwd)
    if not os.path.isdir(root):
        raise ToolInputError(f"the working directory '{cwd}' does not exist")
    path = request.pop("path", None) or "."
    target = policy.resolve(path, cwd)
    if not os.path.exists(target):
        raise ToolInputError(f"'{path}' does not exist")
    if policy.mode == "any" and not (target == root or target.startswith(root + "/")):
        root = target if os.path.isdir(target) else os.path.dirname(target)
    payload = {
        **request,
        "mode": mode,
        "root": root,
        "target": target,
        "display_base": root,
        # The worker's own deadline (a second after ours): it ends itself if nobody
        # is left to kill it.
        "deadline": limits.timeout + 1.0,
        "max_chars": limits.max_chars,
        "max_items": limits.max_items,
        "max_line_chars": limits.max_line_chars,
        "max_file_bytes": limits.max_file_bytes,
        "max_entries": limits.max_entries,
    }

    async def kill(process: trio.Process) -> None:
        process.kill()

    try:
        with trio.fail_after(limits.timeout):
            done = await trio.run_process(
                [sys.executable, "-I", "-S", str(WORKER)],
                stdin=json.dumps(payload).encode(),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                cwd=root,
                env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C.UTF-8"},
                deliver_cancel=kill,
            )
    except trio.TooSlowError:
        raise ToolInputError(
            f"timed out after {limits.timeout:g} s (a pattern that backtracks heavily, or "
            "too many files: search a subdirectory, or simplify the pattern)"
        ) from None
    text = done.stdout.decode("utf-8", "replace")
    if done.returncode == 2:
        raise ToolInputError(text.strip())
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        return ToolOutput.error(f"the search failed ({' '.join(tail) or done.returncode})")
    return ToolOutput.ok(text)


_PATH_PROPERTY = {
    "type": "string",
    "description": "File or directory to search in, relative to the working directory "
    "(default: the working directory)",
}


@attrs.frozen
class GrepTool:
    """``grep``: a regular expression (Python's syntax) over the files under the
    working directory."""

    policy: PathPolicy = PathPolicy()
    limits: SearchLimits = SearchLimits()
    read_only = True
    idempotent = True

    @property
    def spec(self) -> ToolSpec:
        """The tool's name, description and schema."""
        return ToolSpec.from_schema(
            "grep",
            "Search file contents with a regular expression (Python syntax) under the "
            "working directory. Files ignored by .gitignore, binary files and symbolic "
            "links are skipped. output_mode: files_with_matches (default: the paths), "
            "content (path:line:text), count (path:matches). Output is capped at "
            f"{self.limits.max_items} results.",
            {
                "type": "object",
                "required": ["pattern"],
                "additionalProperties": False,
                "properties": {
                    "pattern": {
                        "type": "string",
                        "minLength": 1,
                        "description": "The regular expression to search for",
                    },
                    "path": _PATH_PROPERTY,
                    "glob": {
                        "type": "string",
                        "description": "Only files whose name matches this glob "
                        "(e.g. '*.py'; with a '/', the path: 'src/**/*.ts')",
                    },
                    "output_mode": {
                        "enum": ["files_with_matches", "content", "count"],
                        "description": "What to show (default files_with_matches)",
                    },
                    "ignore_case": {"type": "boolean", "description": "Case-insensitive"},
                },
            },
        )

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        """Search ``args["pattern"]`` under ``args.get("path")``."""
        if len(args["pattern"]) > MAX_PATTERN_CHARS:
            raise ToolInputError(f"the pattern is longer than {MAX_PATTERN_CHARS} characters")
        return await _search("grep", dict(args), cwd, self.policy, self.limits)


@attrs.frozen
class GlobTool:
    """``glob``: the files under the working directory whose path matches a glob."""

    policy: PathPolicy = PathPolicy()
    limits: SearchLimits = SearchLimits()
    read_only = True
    idempotent = True

    @property
    def spec(self) -> ToolSpec:
        """The tool's name, description and schema."""
        return ToolSpec.from_schema(
            "glob",
            "Find files by name under the working directory: '*.py' matches names, "
            "'src/**/*.ts' paths ('**' any directories). Files ignored by .gitignore and "
            f"symbolic links are skipped; at most {self.limits.max_items} paths are listed.",
            {
                "type": "object",
                "required": ["pattern"],
                "additionalProperties": False,
                "properties": {
                    "pattern": {
                        "type": "string",
                        "minLength": 1,
                        "description": "The glob to match",
                    },
                    "path": _PATH_PROPERTY,
                },
            },
        )

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        """List the files matching ``args["pattern"]`` under ``args.get("path")``."""
        if len(args["pattern"]) > MAX_PATTERN_CHARS:
            raise ToolInputError(f"the pattern is longer than {MAX_PATTERN_CHARS} characters")
        return await _search("glob", dict(args), cwd, self.policy, self.limits)


__all__ = ["GlobTool", "GrepTool", "SearchLimits"]
