"""Reading and writing the files a user names (``--config``, ``--script``, ``import``,
``-o``...) without ever blocking on one that is not a regular file.

Opening a FIFO blocks until another process opens its other end: ``--config pipe``
or ``trace -o pipe`` with nobody on the other side used to hang for ever. Every file
here is opened with ``O_NONBLOCK`` (an open never waits) and checked with ``fstat``
before a byte moves, so a path swapped between a check and the open changes nothing:

- ``read_regular``: inputs must be regular files; a FIFO, device, socket or
  directory is refused (``NotARegularFile``, an ``OSError`` whose ``strerror`` says
  what it is).
- ``open_output``: an output is a regular file (new or replaced), or a character
  device (``/dev/null``, ``/dev/stdout``); a FIFO only when a reader is already on
  its other end (``O_NONBLOCK`` makes the open fail with ENXIO otherwise), so
  ``-o >(gzip > x)`` works and a FIFO nobody reads is one line, never a hang.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO, TextIO

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words ("a FIFO (named pipe)")."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


class NotARegularFile(OSError):
    """The path names a FIFO, device, socket or directory where a regular file is
    needed. ``strerror`` says which; ``filename`` is the path."""

    def __init__(self, path: str | os.PathLike[str], mode: int, *, writing: bool = False) -> None:
        what = "write" if writing else "read"
        super().__init__(
            errno.EINVAL,
            f"{kind(mode)}, not a regular file (fanfold only {what}s regular files there)",
            os.fspath(path),
        )


def read_regular(path: str | os.PathLike[str], *, limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit`` + 1 of them when a
    limit is given, so a caller can tell "too large"). Never blocks on a FIFO;
    ``NotARegularFile`` for anything but a regular file, ``OSError`` as ``open``."""
    with open_regular_bytes(path) as handle:
        return handle.read() if limit is None else handle.read(limit + 1)


def _open_regular_fd(path: str | os.PathLike[str]) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(path, info.st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular_text(path: str | os.PathLike[str], *, newline: str | None = None) -> TextIO:
    """The regular file ``path`` opened for reading UTF-8 text (``newline`` as
    ``open``'s), never blocking on a FIFO; ``NotARegularFile`` for anything else."""
    return open(_open_regular_fd(path), encoding="utf-8", newline=newline)


def open_regular_bytes(path: str | os.PathLike[str]) -> BinaryIO:
    """The regular file ``path`` opened for reading bytes, never blocking on a FIFO;
    ``NotARegularFile`` for anything else."""
    return open(_open_regular_fd(path), "rb")


def is_special(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` exists (following links) and is no regular file."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def open_output(path: str | os.PathLike[str]) -> TextIO:
    """``path`` opened for writing UTF-8 text, as it is: truncated if a regular file,
    written through if a character device or a FIFO with a reader. ``NotARegularFile``
    for a directory, socket, block device, or a FIFO that nobody reads (instead of
    waiting for one); ``OSError`` as ``open``. Callers that want a regular file
    replaced atomically write a temporary file and rename it instead (see
    ``is_special``)."""
    try:
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC | os.O_TRUNC, 0o666
        )
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            # A FIFO without a reader (or a socket): waiting would hang.
            try:
                mode = os.stat(path).st_mode
            except OSError:
                raise exc from None
            error = NotARegularFile(path, mode, writing=True)
            if stat.S_ISFIFO(mode):
                error.strerror = "a FIFO (named pipe) that no process is reading"
            raise error from None
        raise
    try:
        info = os.fstat(fd)
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISCHR(info.st_mode)) and not (
            stat.S_ISFIFO(info.st_mode)
        ):
            raise NotARegularFile(path, info.st_mode, writing=True)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "w", encoding="utf-8")


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same resolved path, or (both
    existing) the same inode, as a hard link makes."""
    try:
        if a.resolve() == b.resolve():
            return True
    except (OSError, RuntimeError):  # a symbolic link loop
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
