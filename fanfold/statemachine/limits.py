"""The limits a conversation runs under. Chosen at creation, carried in its state."""

from __future__ import annotations

import math
from typing import Any

import attrs


def seconds(value: object) -> float:
    """A number of seconds as a float: an int from Python (``cancel_grace=8``) is
    converted here, at the boundary. Stored as an int, it encodes as ``8`` and decodes
    as ``8.0``: the state rebuilt from the log then differs from the one recorded, and
    replay reports a divergence that never happened. A bool is refused (``True`` is an
    int to Python, never a number of seconds)."""
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise TypeError(f"expected a number of seconds, got {type(value).__name__} {value!r}")


def optional_seconds(value: object) -> float | None:
    """``seconds``, with None (no limit) kept."""
    return None if value is None else seconds(value)


def integer(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """attrs validator: an int (or None), never a bool or a float."""
    # A bool is an int to Python, never a count; a float (even 3.0) is refused, as the
    # log's decoder refuses it: stored, it could not be read back.
    if value is not None and type(value) is not int:
        raise TypeError(
            f"{attribute.name} must be an integer, got {type(value).__name__} {value!r}"
        )


def _positive(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    integer(_inst, attribute, value)
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, got {value}")


def finite(_inst: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    """attrs validator: a finite number >= 0 (or None)."""
    # NaN compares false with everything: a NaN limit would disable the check it
    # stands for, or reach a timer. Infinity is spelled None where it is allowed.
    if value is not None and not (0.0 <= value < math.inf):
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value}")


CONTEXT_MODES = ("task_only", "full", "summary")
"""Every context mode, in the order the tool's schema lists them."""

CONTEXT_MODES_BEFORE_7 = ("task_only", "full")
"""The modes offered before log schema 7 (``summary`` came with it)."""


def _context_modes(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not (
        isinstance(value, tuple)
        and "task_only" in value
        and all(mode in CONTEXT_MODES for mode in value)
        and len(set(value)) == len(value)
    ):
        raise ValueError(
            f"{attribute.name} must list task_only and any of full, summary once each, "
            f"got {value!r}"
        )


@attrs.frozen
class Limits:
    """Limits of one conversation; sub-agents inherit their parent's, with overrides.

    - ``max_rounds``: model rounds (not attempts) per turn for a root conversation,
      per lifetime for a sub-agent; one extra grace round follows.
    - ``max_attempts``: attempts of one model round, retries included.
    - ``retry_base`` / ``retry_cap``: exponential backoff, seconds.
    - ``max_concurrent``: children of one parent running at once; the rest queue.
    - ``max_tasks_per_call``: tasks accepted by one ``spawn_agents`` call.
    - ``max_depth``: deepest level a sub-agent may live at (root is 0), so 1 means
      the root can spawn and children cannot.
    - ``child_timeout``: default time limit of a child, seconds (None: no limit).
    - ``cancel_grace``: how long a parent waits for children to acknowledge a cancel,
      and how long past a child's time limit it waits before writing the child off.
    - ``child_result_cap``: characters of each child's result/error in the fan-in.
    - ``max_tokens``: token budget of this conversation (None: unlimited).
    - ``context_modes``: the context modes a ``spawn_agents`` task (or an agent
      definition) may ask for: ``task_only`` always, ``full`` and ``summary`` unless
      an operator leaves them out (both cost tokens: the parent's conversation, or a
      model call to summarise it). A log of schema 6 or older decodes to ``task_only,
      full``, the modes it offered, so its tool descriptions replay as recorded.
    - ``approval_timeout``: seconds a tool call waits for a person's decision before
      it is denied ("no decision within N s"); None (the default): it waits for ever.
      Sub-agents inherit it, so it is a tree-level setting (issue 35).
    """

    max_rounds: int = attrs.field(default=20, validator=_positive)
    max_attempts: int = attrs.field(default=4, validator=_positive)
    retry_base: float = attrs.field(default=1.0, converter=seconds, validator=finite)
    retry_cap: float = attrs.field(default=60.0, converter=seconds, validator=finite)
    max_concurrent: int = attrs.field(default=10, validator=_positive)
    max_tasks_per_call: int = attrs.field(default=10, validator=_positive)
    max_depth: int = attrs.field(default=1, validator=integer)
    child_timeout: float | None = attrs.field(
        default=600.0, converter=optional_seconds, validator=finite
    )
    cancel_grace: float = attrs.field(default=30.0, converter=seconds, validator=finite)
    child_result_cap: int = attrs.field(default=8000, validator=_positive)
    max_tokens: int | None = attrs.field(default=None, validator=integer)
    context_modes: tuple[str, ...] = attrs.field(
        default=CONTEXT_MODES,
        validator=_context_modes,
        metadata={"since": 7, "omitted_at_default": True, "before": CONTEXT_MODES_BEFORE_7},
    )
    approval_timeout: float | None = attrs.field(
        default=None,
        converter=optional_seconds,
        validator=finite,
        metadata={"since": 7, "omitted_at_default": True},
    )


def with_max_rounds(limits: Limits, max_rounds: int) -> Limits:
    """``attrs.evolve(limits, max_rounds=max_rounds)``, but the same object when asked
    for the same twice in a row (the children of one spawn share their limits)."""
    last = _last_with_rounds[0]
    if last is not None and last[0] is limits and last[1] == max_rounds:
        return last[2]
    changed = attrs.evolve(limits, max_rounds=max_rounds)
    _last_with_rounds[0] = (limits, max_rounds, changed)
    return changed


_last_with_rounds: list[tuple[Limits, int, Limits] | None] = [None]
