"""Ending the ``fanfold`` process without the interpreter's teardown (issue 34).

``fanfold replay --verify`` builds every state of a tree and the fingerprint's caches;
the interpreter's teardown at exit then frees them object by object (about 45 k
instructions per verified event, 15 % of the whole command). A command with nothing
left to do after its report asks for a quick exit (``request``); ``main`` then runs the
exit handlers (``logging.shutdown`` among them), flushes the standard streams and ends
the process with ``os._exit``. Only ``main`` (the script's entry point) does this: a
command called in-process (click's test runner) returns as usual. Not when a thread
other than the main one is alive: its work would be cut off.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn

_requested: list[object] = []


def request(*keep: object) -> None:
    """Ask ``main`` to end the process without the interpreter's teardown; ``keep``:
    values held until the end (so that nothing frees them object by object first)."""
    _requested.append(keep)


def reset() -> None:
    """Forget a request (``main`` calls it before running a command)."""
    _requested.clear()


def requested() -> bool:
    """True if a command asked for a quick exit and no other thread is alive."""
    return bool(_requested) and threading.active_count() == 1


def end(code: int) -> NoReturn:
    """Run the exit handlers, flush the standard streams, end the process (``code``)."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        # A closed pipe or stream: nothing left to write to.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
