"""Which signals stop a run: a module of its own, so that ``main`` reads them without
importing Trio (``fanfold --version`` imports nothing it does not use)."""

from __future__ import annotations

import signal

__all__ = ["stop_signals"]


def stop_signals() -> tuple[int, ...]:
    """Signals that stop a turn the way Ctrl-C does: a clean, recorded cancel of the tree.

    SIGTERM is what kill, systemd and container runtimes send; SIGHUP arrives when the
    terminal goes away. Left to their default action they would kill the process with
    the tree still `running` and its bash commands orphaned. A signal the process was
    started with ignored stays ignored, deliberately: that is what whoever started it
    asked for (``nohup``: survive the terminal going away; a shell's background job:
    ignore the terminal's Ctrl-C, which is meant for the foreground).
    """
    wanted = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    return tuple(s for s in wanted if signal.getsignal(s) is not signal.SIG_IGN)
