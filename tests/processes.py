"""Process checks shared by the tests that start real subprocesses."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie is dead for our purpose)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
