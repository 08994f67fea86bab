"""Stop signals (Ctrl-C, SIGTERM, SIGHUP) around ``trio.run``: a clean, recorded stop."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import attrs
import trio

from fanfold.cli.signal_set import stop_signals

T = TypeVar("T")


def run_trio(main: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``trio.run(main, stop, *args)``, ``stop`` being the stop signals to receive.

    From before ``trio.run`` starts until after it has returned, the stop signals are
    ignored except while ``main`` listens for them (``stop_signal_receiver``); their
    real handlers come back only once ``trio.run`` has returned. A signal caught just
    before the receiver closes is handed to it by a callback that may run after the
    close; the receiver then raises it again, with whatever handler is in place by
    then. Were that the real one, a second Ctrl-C during a shutdown would surface as a
    KeyboardInterrupt after the clean stop (click's "Aborted!", exit 1) and a second
    SIGTERM would kill the process. Ignored until ``trio.run`` has returned, it is
    dropped: the stop it asks for is already under way, or done.
    """
    stop = stop_signals()
    originals = {s: signal.getsignal(s) for s in stop}
    for s in stop:
        signal.signal(s, signal.SIG_IGN)
    try:
        return trio.run(main, stop, *args)
    finally:
        for s, handler in originals.items():
            if handler is not None:  # None: not installed from Python; nothing to restore
                signal.signal(s, handler)


@contextmanager
def stop_signal_receiver(stop: tuple[int, ...]) -> Iterator[AsyncIterator[int]]:
    """Trio's receiver of the stop signals (one that never fires if there are none).

    Used inside ``run_trio``, which ignores the stop signals around it: when the
    receiver closes, Trio puts back "ignore" and re-raises the signals still queued
    (they arrived after the stop was handled, during the runtime's shutdown); ignored,
    they can neither kill the process nor raise KeyboardInterrupt at its very end.
    """
    if not stop:
        yield _no_signals()
        return
    with trio.open_signal_receiver(*stop) as receiver:
        yield receiver


async def _no_signals() -> AsyncIterator[int]:
    await trio.sleep_forever()
    yield 0  # pragma: no cover  (never reached; makes this an async generator)


@attrs.frozen
class Interruption:
    """The signal that stopped a turn; ``forced`` if a second one cut the cancel short."""

    signum: int
    forced: bool = False

    @property
    def name(self) -> str:
        return "Ctrl-C" if self.signum == signal.SIGINT else signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal number, the shell's convention for a command it stopped."""
        return 128 + self.signum
