"""Cut the long strings of a JSON text while it streams in, so that a server's large
answer is read in bounded memory and arrives cut, not refused.

A tool result of a few MB is one JSON-RPC line of twice that (the SDK's servers repeat
a text result as structured content, ``{"result": <the text>}``). Its size is in its
strings, which the model never sees whole anyway (MCP results are cut to 30,000
characters). :class:`Shrinker` copies the JSON's structure and every string up to
``limit`` bytes as they are, and keeps of a longer string its first and last ``keep``
bytes with a note between them (``[... fanfold cut N bytes ...]``): still valid JSON,
the same message, a bounded size. The two copies of one text are cut alike, so the
result's text and its structured copy still compare equal and are counted once.

Cuts fall between characters and outside escape sequences (a surrogate pair's two
escapes count as one): the head's cut by walking the string from its start, the tail's
at a byte that starts a UTF-8 character with no backslash in the eleven bytes before
it. A tail with no such byte (a string of backslashes) is dropped: its head is kept.
"""

from __future__ import annotations

import re

__all__ = ["Shrinker"]

_SPECIAL = re.compile(rb'["\\]')


class Shrinker:
    """One JSON text, fed in chunks (``feed``), rewritten with each string longer than
    ``limit`` bytes (as written, escapes included) cut to its head and tail of ``keep``
    bytes each. ``size()`` is what it holds; ``text()`` the result. The input is
    assumed to be JSON: anything else comes out as mangled as it went in."""

    def __init__(self, limit: int = 256 * 1024, keep: int = 64 * 1024) -> None:
        if keep * 2 + 64 > limit:
            raise ValueError("limit must exceed twice keep")
        self.limit = limit
        self.keep = keep
        self.out = bytearray()
        self.cut = 0
        """Bytes of string content cut so far."""
        self._in_string = False
        self._escaped = False  # the previous byte inside the string was a backslash
        self._current = bytearray()  # the string so far, while it is short
        self._head = b""
        self._tail = bytearray()
        self._length = 0  # of the current string's content
        self._long = False

    def size(self) -> int:
        return len(self.out) + len(self._current) + len(self._head) + len(self._tail)

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n:
            if not self._in_string:
                j = data.find(b'"', i)
                if j < 0:
                    self.out += data[i:]
                    return
                self.out += data[i : j + 1]
                self._start_string()
                i = j + 1
                continue
            if self._escaped:
                self._content(data[i : i + 1])
                self._escaped = False
                i += 1
                continue
            match = _SPECIAL.search(data, i)
            if match is None:
                self._content(data[i:])
                return
            j = match.start()
            self._content(data[i:j])
            if data[j] == ord('"'):
                self._end_string()
                self.out += b'"'
            else:
                self._content(b"\\")
                self._escaped = True
            i = j + 1

    def text(self) -> bytes:
        """The rewritten JSON (a string still open at the end is closed as it is)."""
        if self._in_string:
            self._end_string()
        return bytes(self.out)

    def _start_string(self) -> None:
        self._in_string = True
        self._escaped = False
        self._current.clear()
        self._length = 0
        self._long = False

    def _content(self, data: bytes) -> None:
        if not data:
            return
        self._length += len(data)
        if not self._long:
            self._current += data
            if len(self._current) > self.limit:
                self._long = True
                self._head = bytes(self._current[: self.keep + 8])
                self._tail = bytearray(self._current[-(self.keep + 8) :])
                self._current.clear()
            return
        self._tail += data
        if len(self._tail) > 4 * self.keep:
            del self._tail[: len(self._tail) - (self.keep + 8)]

    def _end_string(self) -> None:
        self._in_string = False
        if not self._long:
            self.out += self._current
            self._current.clear()
            return
        head = self._head[: _boundary_at_or_before(self._head, self.keep)]
        tail = bytes(self._tail[-(self.keep + 8) :])
        start = _boundary_at_or_after(tail, len(tail) - self.keep)
        tail = tail[start:] if start is not None else b""
        cut = self._length - len(head) - len(tail)
        self.cut += cut
        self.out += head
        self.out += f"\\n[... fanfold cut {cut} bytes of this text ...]\\n".encode()
        self.out += tail
        self._head, self._tail = b"", bytearray()
        self._long = False


def _unit(data: bytes, at: int) -> int:
    """The length of the character or escape starting at ``at`` (a surrogate pair's two
    escapes, ``\\ud83d\\ude00``, are one: cut apart they would decode to halves)."""
    byte = data[at]
    if byte == 0x5C:  # a backslash
        if data[at + 1 : at + 2] != b"u":
            return 2
        if data[at + 2 : at + 3].lower() == b"d" and data[at + 3 : at + 4].lower() in b"89ab":
            return 12  # a high surrogate, and its low one after it
        return 6
    if byte >= 0xF0:
        return 4
    if byte >= 0xE0:
        return 3
    if byte >= 0xC0:
        return 2
    return 1


def _boundary_at_or_before(data: bytes, at: int) -> int:
    """The last boundary of a character or escape at or before ``at``, counted from
    the string's start (whose alignment is known)."""
    i = 0
    while True:
        step = _unit(data, i) if i < len(data) else 1
        if i + step > at:
            return i
        i += step


def _boundary_at_or_after(data: bytes, at: int) -> int | None:
    """A boundary at or after ``at`` in a string's kept tail, whose alignment with the
    escapes before it is unknown: a byte that starts a UTF-8 character with no
    backslash in the eleven bytes before it (an escape is at most six bytes, a
    surrogate pair twelve), so that nothing that started before it reaches it."""
    at = max(at, 11)
    while at < len(data):
        if data[at] & 0xC0 != 0x80 and b"\\" not in data[at - 11 : at]:
            return at
        at += 1
    return None
