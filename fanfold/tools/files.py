"""The file tools: ``read_file``, ``write_file`` and ``edit_file``.

Paths go through a :class:`~fanfold.tools.paths.PathPolicy` first. Files are UTF-8 text;
line endings are preserved exactly on write and edit. Only regular files are read or
written: a FIFO, device, socket or directory is refused before it is opened (opening a
FIFO or a terminal blocks, reading /dev/zero never ends), and files are opened with
``O_NONBLOCK | O_NOFOLLOW`` and checked again with ``fstat``, so a path swapped for one
between the check and the open is refused too. The file work runs in a worker thread
that a cancellation abandons (``cancellable=True``): a stop signal always ends the
process, whatever the file system does.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NoReturn

import attrs
import trio

from fanfold.regular_files import kind
from fanfold.statemachine import ToolSpec
from fanfold.tools.paths import PathPolicy
from fanfold.tools.tool import ToolInputError, ToolOutput


def _path_property(policy: PathPolicy) -> dict[str, object]:
    inside = " (must be inside the working directory)" if policy.mode == "cwd" else ""
    return {
        "type": "string",
        "minLength": 1,
        "description": f"File path, relative to the working directory or absolute{inside}",
    }


def _fail(error: OSError, shown: str, *, create_hint: bool = False) -> NoReturn:
    """Re-raise an OS error about ``shown`` as a model-facing ToolInputError."""
    if isinstance(error, FileNotFoundError):
        hint = "; use write_file to create a new file" if create_hint else ""
        message = f"'{shown}' does not exist{hint}"
    elif isinstance(error, IsADirectoryError):
        message = f"'{shown}' is a directory, not a file"
    elif isinstance(error, NotADirectoryError):
        message = f"a parent of '{shown}' is a file, not a directory"
    elif isinstance(error, PermissionError):
        message = f"permission denied for '{shown}'"
    else:
        message = f"'{shown}': {error.strerror or error}"
    raise ToolInputError(message) from error


def _not_text(shown: str) -> NoReturn:
    raise ToolInputError(
        f"'{shown}' is not UTF-8 text (it looks like a binary file); "
        "inspect it with bash instead (e.g. `file`, `xxd | head`)"
    )


async def _in_thread(work: Callable[[], str]) -> str:
    # Abandoned on cancellation: a thread stuck in the file system (a hung network
    # mount) must not keep a cancelled call, or a signalled process, waiting.
    return await trio.to_thread.run_sync(work, abandon_on_cancel=True)


def _refuse(shown: str, mode: int) -> NoReturn:
    if stat.S_ISDIR(mode):
        raise ToolInputError(f"'{shown}' is a directory, not a file")
    raise ToolInputError(
        f"'{shown}' is {kind(mode)}, not a regular file; the file tools only read and "
        "write regular files"
    )


def _check_regular(resolved: str, shown: str) -> bool:
    """Whether ``resolved`` exists; refuse it (without opening it) unless it is a regular
    file. ``resolved`` has no symbolic links left (the policy resolved them)."""
    try:
        mode = os.lstat(resolved).st_mode
    except FileNotFoundError:
        return False
    except OSError as e:
        _fail(e, shown)
    if not stat.S_ISREG(mode):
        _refuse(shown, mode)
    return True


@contextmanager
def _open_regular(resolved: str, shown: str, flags: int, mode: str) -> Iterator[Any]:
    """Open ``resolved`` as a regular file, never blocking on a FIFO or following a
    link swapped in after the policy's check; refuse anything else."""
    try:
        fd = os.open(resolved, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.ELOOP):
            # ENXIO: a FIFO without a reader, or a socket; ELOOP: a symbolic link.
            raise ToolInputError(f"'{shown}' is not a regular file") from e
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            _refuse(shown, info.st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    if "b" in mode:
        with open(fd, mode) as f:
            yield f
    else:
        with open(fd, mode, encoding="utf-8", newline="") as text:
            yield text


def _number(n: int, line: str) -> str:
    return f"{n:6}\t{line}"


@attrs.frozen
class ReadFileTool:
    """Reads a UTF-8 text file, numbering lines like ``cat -n``.

    At most ``limit`` lines (default ``max_lines``) are shown from line ``offset``; lines
    longer than ``max_line_chars`` are cut, and the whole output stops before
    ``max_output_chars``. When not everything is shown, a last line says which lines
    were shown and which ``offset`` reads on.
    """

    policy: PathPolicy = PathPolicy()
    max_lines: int = 2000
    max_line_chars: int = 2000
    max_output_chars: int = 50_000
    read_only = True  # changes nothing (ToolSet.read_only)
    idempotent = True

    @property
    def spec(self) -> ToolSpec:
        """The tool's name, description and schema."""
        return ToolSpec.from_schema(
            "read_file",
            "Read a UTF-8 text file. Each line is shown with its line number, a tab, then "
            "the line's text (the numbers are not part of the file). Reads up to "
            f"{self.max_lines} lines from the start by default; for a long file use "
            "`offset` and `limit` to read a specific range. Lines longer than "
            f"{self.max_line_chars} characters are cut. Read a file before editing it.",
            {
                "type": "object",
                "required": ["path"],
                "additionalProperties": False,
                "properties": {
                    "path": _path_property(self.policy),
                    "offset": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "Line number to start reading from (1-based, default 1)",
                    },
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "description": (
                            f"Maximum number of lines to read (default {self.max_lines})"
                        ),
                    },
                },
            },
        )

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        """Read ``args["path"]`` from line ``offset`` for ``limit`` lines."""
        shown: str = args["path"]
        resolved = self.policy.resolve(shown, cwd)
        offset = int(args.get("offset", 1))
        limit = int(args.get("limit", self.max_lines))
        return ToolOutput.ok(await _in_thread(lambda: self._read(resolved, shown, offset, limit)))

    def _read(self, resolved: str, shown: str, offset: int, limit: int) -> str:
        try:
            _check_regular(resolved, shown)
            with _open_regular(resolved, shown, os.O_RDONLY, "rb") as f:
                if b"\0" in f.read(8192):
                    _not_text(shown)
                f.seek(0)
                return self._numbered(f, shown, offset, limit)
        except OSError as e:
            _fail(e, shown)
        except UnicodeDecodeError:
            _not_text(shown)

    def _numbered(self, lines: Any, shown: str, offset: int, limit: int) -> str:
        out: list[str] = []
        size = 0
        total = 0
        for total, raw in enumerate(lines, 1):
            if total < offset or len(out) >= limit or size >= self.max_output_chars:
                continue
            line = raw.decode("utf-8").removesuffix("\n").removesuffix("\r")
            if len(line) > self.max_line_chars:
                cut = len(line) - self.max_line_chars
                line = f"{line[: self.max_line_chars]}... [line cut: {cut} more characters]"
            entry = _number(total, line)
            if out and size + len(entry) + 1 > self.max_output_chars:
                size = self.max_output_chars
                continue
            out.append(entry)
            size += len(entry) + 1
        if total == 0:
            return f"('{shown}' is empty)"
        if offset > total:
            raise ToolInputError(
                f"offset {offset} is past the end of '{shown}', which has {total} line(s)"
            )
        last = offset + len(out) - 1
        if offset > 1 or last < total:
            out.append(
                f"[showing lines {offset}-{last} of {total}"
                + (f"; use offset={last + 1} to read on]" if last < total else "]")
            )
        return "\n".join(out)


@attrs.frozen
class WriteFileTool:
    """Writes a whole UTF-8 text file, creating missing parent directories."""

    policy: PathPolicy = PathPolicy()

    @property
    def spec(self) -> ToolSpec:
        """The tool's name, description and schema."""
        return ToolSpec.from_schema(
            "write_file",
            "Create a file, or replace a file's entire content, with the given text. "
            "Missing parent directories are created. To change part of an existing file "
            "use edit_file instead, which is safer and cheaper.",
            {
                "type": "object",
                "required": ["path", "content"],
                "additionalProperties": False,
                "properties": {
                    "path": _path_property(self.policy),
                    "content": {
                        "type": "string",
                        "description": "The complete new content of the file",
                    },
                },
            },
        )

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        """Write ``args["content"]`` to ``args["path"]``."""
        shown: str = args["path"]
        content: str = args["content"]
        resolved = self.policy.resolve(shown, cwd)
        return ToolOutput.ok(await _in_thread(lambda: _write(resolved, shown, content)))


def _write(resolved: str, shown: str, content: str) -> str:
    try:
        existed = _check_regular(resolved, shown)
        os.makedirs(os.path.dirname(resolved), exist_ok=True)
        # Truncated only once known to be a regular file.
        with _open_regular(resolved, shown, os.O_WRONLY | os.O_CREAT, "w") as f:
            f.truncate()
            f.write(content)
    except FileExistsError as e:  # makedirs met a file where a directory should be
        raise ToolInputError(f"a parent of '{shown}' is a file, not a directory") from e
    except OSError as e:
        _fail(e, shown)
    lines = content.count("\n") + (1 if content and not content.endswith("\n") else 0)
    size = len(content.encode("utf-8"))
    return f"{'Overwrote' if existed else 'Created'} '{shown}' ({lines} lines, {size} bytes)"


@attrs.frozen
class EditFileTool:
    """Replaces an exact string in a UTF-8 text file.

    ``old_string`` must occur exactly once, unless ``replace_all`` is true. If the file
    uses CRLF line endings and ``old_string`` does not, ``\\n`` in both strings is read
    as ``\\r\\n``. The result names the changed lines and shows the edited region.
    """

    policy: PathPolicy = PathPolicy()
    context_lines: int = 3

    @property
    def spec(self) -> ToolSpec:
        """The tool's name, description and schema."""
        return ToolSpec.from_schema(
            "edit_file",
            "Edit a text file by replacing an exact string. `old_string` must match the "
            "file's text exactly, including whitespace and indentation, and must occur "
            "exactly once: include enough surrounding lines to make it unique, or set "
            "`replace_all` to change every occurrence. Copy the text from read_file output "
            "without the line-number prefix. To create a file use write_file.",
            {
                "type": "object",
                "required": ["path", "old_string", "new_string"],
                "additionalProperties": False,
                "properties": {
                    "path": _path_property(self.policy),
                    "old_string": {
                        "type": "string",
                        "minLength": 1,
                        "description": "The exact text to replace",
                    },
                    "new_string": {
                        "type": "string",
                        "description": "The text to put in its place (may be empty)",
                    },
                    "replace_all": {
                        "type": "boolean",
                        "description": "Replace every occurrence instead of exactly one "
                        "(default false)",
                    },
                },
            },
        )

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        """Replace ``old_string`` by ``new_string`` in ``args["path"]``."""
        shown: str = args["path"]
        old: str = args["old_string"]
        new: str = args["new_string"]
        replace_all = bool(args.get("replace_all", False))
        if old == new:
            raise ToolInputError("old_string and new_string are identical; nothing to change")
        resolved = self.policy.resolve(shown, cwd)
        return ToolOutput.ok(
            await _in_thread(lambda: self._edit(resolved, shown, old, new, replace_all))
        )

    def _edit(self, resolved: str, shown: str, old: str, new: str, replace_all: bool) -> str:
        try:
            if not _check_regular(resolved, shown):
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", resolved)
            with _open_regular(resolved, shown, os.O_RDONLY, "r") as f:
                text = f.read()
        except OSError as e:
            _fail(e, shown, create_hint=True)
        except UnicodeDecodeError:
            _not_text(shown)
        if old not in text and "\r\n" in text and "\r\n" not in old:
            old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
        starts = _occurrences(text, old)
        if not starts:
            raise ToolInputError(_not_found(shown, text, old))
        lines = [text.count("\n", 0, i) + 1 for i in starts]
        if len(starts) > 1 and not replace_all:
            raise ToolInputError(
                f"old_string occurs {len(starts)} times in '{shown}' (at lines "
                f"{_list(lines)}); include more surrounding text to make it unique, "
                "or set replace_all to true to replace every occurrence"
            )
        updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
        try:
            with _open_regular(resolved, shown, os.O_WRONLY, "w") as f:
                f.truncate()
                f.write(updated)
        except OSError as e:
            _fail(e, shown)
        where = "line" if len(lines) == 1 else "lines"
        count = "1 occurrence" if len(lines) == 1 else f"{len(lines)} occurrences"
        return (
            f"Edited '{shown}': replaced {count} (at {where} {_list(lines)}). "
            f"The edited region now reads:\n{self._snippet(updated, starts[0], new)}"
        )

    def _snippet(self, text: str, start: int, new: str) -> str:
        all_lines = text.splitlines()
        first = text.count("\n", 0, start)
        last = first + new.count("\n")
        lo = max(0, first - self.context_lines)
        hi = min(len(all_lines), last + self.context_lines + 1)
        return "\n".join(_number(n + 1, all_lines[n]) for n in range(lo, hi))


def _occurrences(text: str, needle: str) -> list[int]:
    """Start offsets of the non-overlapping occurrences of ``needle``."""
    starts = []
    i = text.find(needle)
    while i != -1:
        starts.append(i)
        i = text.find(needle, i + len(needle))
    return starts


def _list(numbers: list[int], most: int = 10) -> str:
    shown = ", ".join(str(n) for n in numbers[:most])
    return shown + (f" and {len(numbers) - most} more" if len(numbers) > most else "")


def _not_found(shown: str, text: str, old: str) -> str:
    message = f"old_string was not found in '{shown}'. It must match the file exactly"
    stripped = old.strip()
    if stripped and stripped != old and stripped in text:
        return (
            f"{message}; the text without its leading/trailing whitespace does occur, so "
            "check indentation and line breaks. Read the file again and copy the text."
        )
    return (
        f"{message}, including whitespace and indentation. Read the file again and copy the text."
    )
