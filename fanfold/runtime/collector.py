"""The garbage collector's policy while a runtime is open (``Runtime.open(gc_policy=...)``).

A "tuned" runtime raises the first generation's threshold and scales it with the
conversations loaded; the last tuned runtime to close restores what was there before.
The runtime calls ``tune`` on opening, ``untune`` on closing and ``loaded_changed`` as
conversations load and unload."""

from __future__ import annotations

import gc

GC_POLICIES = ("tuned", "untouched")
GC_TUNED_THRESHOLD = 100_000
"""The first generation's threshold while a "tuned" runtime is open (CPython's
default is 700): a step allocates a few hundred container objects, almost all of
them still alive when a young collection runs (states, events, effects kept in the
actor and the writer's batch), so frequent young collections mostly scan survivors.
100,000 rather than 10,000 (2026-11-26): a parent's state holds tuples of all its
children, a new one per child outcome, and every round's states stay alive until
its commit; each young and middle collection walked them again (at N = 10000, 245
young and 22 middle collections took 3.0 s of a 16 s fan-out; with 100,000, 1.5 s;
at N = 1000, 9 -> 4 us per step). Only cyclic garbage waits longer for it."""

GC_YOUNG_PER_CONVERSATION = 100
"""While more than ``GC_TUNED_THRESHOLD / GC_YOUNG_PER_CONVERSATION`` conversations are
loaded (in all "tuned" runtimes of the process), the young threshold is this many
containers per loaded conversation. A round of the engine can hold a step of every
loaded conversation, each with its new state, event, effects and log rows (about 100
containers, alive until the round's commit), so at a fixed threshold the number of
young collections per step grew with N: at N = 10,000, 41 young collections of about
100,000 survivors each, 8-10 us per step, where N = 1,000 had none (2026-11-28,
issue 21, ``bench/bench_gc.py``). Scaled with what is loaded, a round's objects no
longer fill the young generation, and the collector's work per step stays flat. Cyclic
garbage (rare: most is freed by reference counting) then waits for up to this many
containers per conversation, in proportion to the live heap, as a collector that runs
when the heap grew by a fraction does; once nothing is loaded the threshold is
``GC_TUNED_THRESHOLD`` again, and what waited is collected then."""

# The thresholds before the first "tuned" runtime opened, and how many are open: the
# last to close restores them (runtimes may be open at once, nested or side by side).
_gc_saved: tuple[int, int, int] | None = None
_gc_open = 0
_gc_frozen = False
# Conversations loaded in the "tuned" runtimes open, and the young threshold set now.
_gc_loaded = 0
_gc_young = GC_TUNED_THRESHOLD


def loaded_changed(delta: int) -> None:
    """``delta`` more (or fewer) conversations are loaded in a tuned runtime: scale the
    young threshold with the most loaded at once (``GC_YOUNG_PER_CONVERSATION``). It
    grows in steps of at least a quarter (not set at every load) and goes back to
    ``GC_TUNED_THRESHOLD`` only once nothing is loaded: while a fan-out's children
    end one by one, what they made is still alive (the parent's outcomes, the log's
    rows), and a threshold that shrank with them collected it again (measured: a young
    collection of 120 ms at the end of a 10,000-child fan-out)."""
    global _gc_loaded, _gc_young
    _gc_loaded += delta
    if _gc_saved is None:
        return
    wanted = max(GC_TUNED_THRESHOLD, GC_YOUNG_PER_CONVERSATION * _gc_loaded)
    if wanted > _gc_young:
        young = max(wanted, _gc_young + _gc_young // 4)
    elif not _gc_loaded and _gc_young != GC_TUNED_THRESHOLD:
        young = GC_TUNED_THRESHOLD
    else:
        return
    _gc_young = young
    gc.set_threshold(young, *_gc_saved[1:])


def tune() -> None:
    global _gc_saved, _gc_open, _gc_frozen, _gc_young
    if _gc_open == 0:
        _gc_saved = gc.get_threshold()
        _gc_young = GC_TUNED_THRESHOLD
        gc.set_threshold(GC_TUNED_THRESHOLD, *_gc_saved[1:])
    _gc_open += 1
    if not _gc_frozen:
        # Once per process: what is alive at the first open (imported modules, the
        # configuration, the tool registry) lives as long as the process; moving it to
        # the permanent generation spares every full collection a scan of it.
        _gc_frozen = True
        gc.collect()
        gc.freeze()


def untune() -> None:
    global _gc_saved, _gc_open
    _gc_open -= 1
    if _gc_open == 0 and _gc_saved is not None:
        gc.set_threshold(*_gc_saved)
        _gc_saved = None
