"""The process behind the ``grep`` and ``glob`` tools: one per call.

Run as ``python -I -S search_worker.py`` by :mod:`fanfold.tools.search`, the request as
JSON on stdin; it imports nothing but the standard library (and nothing of fanfold).
A process, not a thread: Python's ``re`` holds the interpreter lock for the whole of
a match, so a pattern that backtracks catastrophically would freeze fanfold's event
loop from any thread; a process is killed at the time limit, whatever it is doing.

- Its first act is ``setitimer(ITIMER_REAL, deadline)`` with SIGALRM left at its
  default action: the kernel ends it at the deadline even if fanfold has died
  (SIGKILL included) and nobody is left to kill it, and even inside a match.
- It walks ``target`` (inside ``root``, resolved by fanfold) without following any
  symbolic link (links are skipped, files and directories alike), skips ``.git``,
  honours the ``.gitignore`` files from ``root`` down (negations, ``/``-anchored and
  directory-only patterns, ``**``), opens files ``O_NOFOLLOW | O_NONBLOCK``, reads
  regular files of at most ``max_file_bytes`` only, skips binary files (a NUL in the
  first 8 KiB), and stops after ``max_entries`` directory entries.
- It prints the result, already bounded (``max_chars``), and exits 0; a problem it
  reports (a bad pattern) exits 2 with the message.
"""

import json
import os
import re
import signal
import stat
import sys
from collections.abc import Callable, Iterator
from typing import Any

BINARY_PROBE = 8192

Rule = tuple[re.Pattern[str], bool, bool, str]
MAX_GITIGNORE_BYTES = 1 << 20


def _translate(pattern: str) -> re.Pattern[str]:
    """A gitignore glob (no leading ``!``, no trailing ``/``) as a regex over a path
    relative to the directory of its ``.gitignore``."""
    anchored = "/" in pattern.rstrip("/")
    pattern = pattern.lstrip("/")
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                out.append(re.escape(c))
                i += 1
            else:
                body = pattern[i + 1 : end].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body + "]")
                i = end + 1
        elif c == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    body = "".join(out)
    prefix = "" if anchored else "(?:.*/)?"
    return re.compile(prefix + body + r"\Z", re.DOTALL)


def parse_gitignore(text: str, base: str) -> list[Rule]:
    """Rules of one ``.gitignore`` whose directory is ``base`` (relative to the walk's
    root, "" for the root): (regex, negated, directories only, base)."""
    rules = []
    for line in text.splitlines():
        line = line.rstrip("\r")
        if not line or line.startswith("#"):
            continue
        if not line.endswith("\\ "):
            line = line.rstrip(" ")
        negated = line.startswith("!")
        if negated or line.startswith("\\!") or line.startswith("\\#"):
            line = line[1:]
        directory_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        try:
            rules.append((_translate(line), negated, directory_only, base))
        except re.error:
            continue
    return rules


def ignored(rules: list[Rule], relative: str, is_dir: bool) -> bool:
    """Whether ``relative`` (to the root) is ignored: the last rule matching it wins."""
    verdict = False
    for regex, negated, directory_only, base in rules:
        if directory_only and not is_dir:
            continue
        if base:
            if not relative.startswith(base + "/"):
                continue
            path = relative[len(base) + 1 :]
        else:
            path = relative
        if regex.match(path):
            verdict = not negated
    return verdict


def name_filter(pattern: str | None) -> Callable[[str, str], bool] | None:
    """A filter for ``glob``: a pattern without ``/`` matches a file's name, else its
    path relative to the search directory."""
    if not pattern:
        return None
    regex = _translate(pattern)
    if "/" in pattern:
        return lambda relative, _name: bool(regex.match(relative))
    return lambda _relative, name: bool(regex.match(name))


def _read_gitignore(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, MAX_GITIGNORE_BYTES).decode("utf-8", "replace")
    finally:
        os.close(fd)


class Walk:
    def __init__(self, request: dict[str, Any]) -> None:
        self.root: str = request["root"]
        self.max_entries: int = request["max_entries"]
        self.entries = 0
        self.stopped = False
        self.rules: list[Rule] = []
        self.use_gitignore = request.get("gitignore", True)

    def _load_rules(self, directory: str, relative: str) -> None:
        if self.use_gitignore:
            text = _read_gitignore(os.path.join(directory, ".gitignore"))
            if text:
                self.rules = self.rules + parse_gitignore(text, relative)

    def files(self, target: str) -> Iterator[tuple[str, str]]:
        """(relative path to root, absolute path) of every file to look at, in order."""
        target_relative = os.path.relpath(target, self.root)
        target_relative = "" if target_relative == "." else target_relative
        # .gitignore files from the root down to the target apply to it.
        parts = target_relative.split("/") if target_relative else []
        directory = self.root
        self._load_rules(directory, "")
        for i, part in enumerate(parts[:-1]):  # the target's own: read by _walk
            directory = os.path.join(directory, part)
            self._load_rules(directory, "/".join(parts[: i + 1]))
        if not os.path.isdir(target):
            yield target_relative, target
            return
        yield from self._walk(target, target_relative)

    def _walk(self, directory: str, relative: str) -> Iterator[tuple[str, str]]:
        saved = self.rules
        if relative:
            self._load_rules(directory, relative)
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            self.rules = saved
            return
        for entry in entries:
            self.entries += 1
            if self.entries > self.max_entries:
                self.stopped = True
                break
            child = f"{relative}/{entry.name}" if relative else entry.name
            try:
                if entry.is_symlink():
                    continue
                is_dir = entry.is_dir(follow_symlinks=False)
                is_file = entry.is_file(follow_symlinks=False)
            except OSError:
                continue
            if is_dir and entry.name == ".git":
                continue
            if self.rules and ignored(self.rules, child, is_dir):
                continue
            if is_dir:
                yield from self._walk(entry.path, child)
                if self.stopped:
                    break
            elif is_file:
                yield child, entry.path
        self.rules = saved


def _read_text(path: str, max_bytes: int) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            return None
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        data = b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
    if b"\0" in data[:BINARY_PROBE]:
        return None
    return data.decode("utf-8", "replace")


class Output:
    def __init__(self, max_chars: int, max_items: int) -> None:
        self.lines: list[str] = []
        self.chars = 0
        self.max_chars = max_chars
        self.max_items = max_items
        self.dropped = 0

    @property
    def full(self) -> bool:
        return self.chars >= self.max_chars or len(self.lines) >= self.max_items

    def add(self, line: str) -> None:
        if self.full:
            self.dropped += 1
            return
        self.lines.append(line)
        self.chars += len(line) + 1


def grep(request: dict[str, Any]) -> tuple[int, str]:
    flags = re.IGNORECASE if request.get("ignore_case") else 0
    try:
        regex = re.compile(request["pattern"], flags | re.MULTILINE)
    except (re.error, OverflowError, RecursionError, ValueError) as exc:
        return 2, f"the pattern is not a valid regular expression: {exc}"
    walk = Walk(request)
    keep = name_filter(request.get("glob"))
    mode = request.get("output_mode", "files_with_matches")
    out = Output(request["max_chars"], request["max_items"])
    line_chars = request["max_line_chars"]
    base = request["display_base"]
    files = 0
    for relative, path in walk.files(request["target"]):
        shown = os.path.relpath(os.path.join(walk.root, relative), base)
        local = os.path.relpath(path, request["target"]) if relative else relative
        if keep is not None and not keep(local, os.path.basename(relative)):
            continue
        text = _read_text(path, request["max_file_bytes"])
        if text is None:
            continue
        files += 1
        if mode == "files_with_matches":
            if regex.search(text):
                out.add(shown)
        elif mode == "count":
            count = sum(1 for _ in regex.finditer(text))
            if count:
                out.add(f"{shown}:{count}")
        else:
            for number, line in enumerate(text.splitlines(), 1):
                if regex.search(line):
                    if len(line) > line_chars:
                        line = line[:line_chars] + f"... [{len(line) - line_chars} more]"
                    out.add(f"{shown}:{number}:{line}")
                    if out.full:
                        out.dropped += 1
                        break
        if out.full and mode == "content":
            break
    return 0, _report(out, walk, f"no matches in {files} file(s)")


def glob(request: dict[str, Any]) -> tuple[int, str]:
    walk = Walk(request)
    keep = name_filter(request["pattern"])
    out = Output(request["max_chars"], request["max_items"])
    base = request["display_base"]
    for relative, path in walk.files(request["target"]):
        local = os.path.relpath(path, request["target"])
        if keep is None or keep(local, os.path.basename(relative)):
            out.add(os.path.relpath(os.path.join(walk.root, relative), base))
    return 0, _report(out, walk, "no files match")


def _report(out: Output, walk: Walk, nothing: str) -> str:
    text = "\n".join(out.lines) if out.lines else nothing
    notes = []
    if out.dropped:
        notes.append(f"output cut: {out.dropped} more result(s) not shown; narrow the search")
    if walk.stopped:
        notes.append(f"stopped after {walk.max_entries} directory entries; search a subdirectory")
    if notes:
        text += "\n[" + "; ".join(notes) + "]"
    return text


def main() -> int:
    request = json.loads(sys.stdin.buffer.read())
    # Ends the process at the deadline whatever it is doing (default SIGALRM action).
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, float(request["deadline"]))
    code, text = (grep if request["mode"] == "grep" else glob)(request)
    sys.stdout.write(text)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
