"""Bookkeeping of the sub-agents one tool round spawned, and the fan-in result."""

from __future__ import annotations

import enum
import functools
import operator
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any, Generic, TypeVar, overload

import attrs

from fanfold.statemachine.errors import CancelReason, ErrorKind
from fanfold.statemachine.messages import ToolResult, canonical_json

# ``since``: the log schema version that added a field; older documents decode with
# the field's default (see fanfold.db.codec).
_SINCE_2 = {"since": 2}
# Written only when False: outcomes that existed before encode as they did.
_SINCE_5_OMITTED_AT_DEFAULT = {"since": 5, "omitted_at_default": True}
# Written only when True, likewise.
_SINCE_6_OMITTED_AT_DEFAULT = {"since": 6, "omitted_at_default": True}
# The summary of context mode "summary" (schema 7), written only when there is one.
_SINCE_7_OMITTED_AT_DEFAULT = {"since": 7, "omitted_at_default": True}


@attrs.frozen
class ChildSucceeded:
    """A sub-agent finished its task. ``tokens``: what it and its own sub-agents used.

    ``submitted`` is False when it never called ``submit_result`` and its final plain
    text (possibly empty) stands as the result: a chat model that ignores tools.
    ``truncated``: that final text was cut off at the output token limit.
    """

    result: str
    tokens: int = attrs.field(default=0, metadata=_SINCE_2)
    submitted: bool = attrs.field(default=True, metadata=_SINCE_5_OMITTED_AT_DEFAULT)
    truncated: bool = attrs.field(default=False, metadata=_SINCE_6_OMITTED_AT_DEFAULT)


@attrs.frozen
class ChildFailed:
    """A sub-agent ended without a result. ``reason`` is set when it was cancelled.
    ``tokens``: what it and its own sub-agents used."""

    error: str
    kind: ErrorKind
    reason: CancelReason | None = None
    tokens: int = attrs.field(default=0, metadata=_SINCE_2)


ChildOutcome = ChildSucceeded | ChildFailed


class Mode(enum.StrEnum):
    """How the children of one ``spawn_agents`` call run."""

    PARALLEL = "parallel"
    SEQUENTIAL = "sequential"
    RACE = "race"


@attrs.frozen
class SpawnMode:
    """The execution mode of one ``spawn_agents`` call (absent: parallel).

    - ``sequential``: one child at a time, in order; each later task is given the
      outcomes of the earlier ones; a failure stops the rest (``not_run``) unless
      ``keep_going``.
    - ``race``: the parent stops waiting once ``quorum`` children have succeeded; the
      others are cancelled (written off, recorded ``cancelled``).
    """

    mode: Mode
    quorum: int = 1
    keep_going: bool = False


@attrs.frozen
class ChildSpec:
    """What a parent asked of one child, fixed when the ``spawn_agents`` call is read."""

    id: str
    task: str
    cwd: str
    timeout: float | None
    max_rounds: int
    spawn_call_id: str
    model: str | None = None
    # The agent definition the task named (issue 12; written only when set).
    agent: str | None = attrs.field(default=None, metadata={"since": 6, "omitted_at_default": True})
    # Its context mode when not task_only ("full" or "summary"; issue 12, written only
    # when set; "summary" since schema 7).
    context: str | None = attrs.field(
        default=None, metadata={"since": 6, "omitted_at_default": True}
    )
    # The mode of its spawn_agents call (None: parallel; issue 12, written only when set).
    mode: SpawnMode | None = attrs.field(
        default=None, metadata={"since": 6, "omitted_at_default": True}
    )


@attrs.frozen
class PendingChild:
    """A child without an outcome yet: ``started`` once its SpawnSubAgent was emitted.

    ``deadline_timer`` is the parent's backstop timer for a child with a time limit.
    ``budget``: the tokens set aside for a started child out of a parent's token
    budget (its own ``max_tokens``); None when the parent has no budget.
    """

    spec: ChildSpec
    started: bool = False
    deadline_timer: int | None = None
    budget: int | None = attrs.field(default=None, metadata=_SINCE_2)


@attrs.frozen
class FinishedChild:
    spec: ChildSpec
    outcome: ChildOutcome


@attrs.frozen
class RejectedTask:
    """A task of a ``spawn_agents`` call that was refused (over the per-call limit...)."""

    spawn_call_id: str
    task: str
    error: str


@attrs.frozen
class Summary:
    """The summary of a parent's conversation that its children of context mode
    ``summary`` start with: one model call of the parent per tool round, shared by
    every such child of the round (the parent's history does not change during a
    round, so neither would the summary).

    Exactly one of these is set: ``call``, the model call in flight; ``timer``, the
    retry timer before attempt ``attempt`` (``delay`` its backoff, re-issued as is
    after a restart); ``text``, the summary made; ``error``, why none could be made
    (``kind``: its typed kind, which the children waiting for it fail with; while a
    retry waits, the kind of the failure it follows).
    ``attempt``: the attempt of ``call``, or the one ``timer`` starts.
    """

    call: int | None = None
    attempt: int = 1
    timer: int | None = None
    delay: float | None = None
    text: str | None = None
    error: str | None = None
    kind: ErrorKind | None = None

    @property
    def in_flight(self) -> int | None:
        """The number of the model call or retry timer awaited, if any."""
        return self.call if self.call is not None else self.timer


Item = TypeVar("Item", "PendingChild", "FinishedChild")

_CHUNK = 64  # items per chunk of a _Chunked vector
_NOT_NONE = functools.partial(operator.is_not, None)


_T = TypeVar("_T")


class _Chunked(Generic[_T]):
    """An immutable vector of items (or holes, None) kept as a tuple of tuples of
    ``_CHUNK`` items each: a change copies one chunk and the outer tuple (N/64 + 64
    references, not N). Built of tuples so that the collector sees it shallowly: a
    new outer tuple refers to the chunks (old objects, not traversed again), where a
    C vector's traversal visits every item (pyrsistent's pvector, tried first: at
    N = 10,000 its young copies doubled the collector's time per step)."""

    __slots__ = ("_chunks", "_size")

    _chunks: tuple[tuple[_T, ...], ...]
    _size: int

    @classmethod
    def of(cls, values: tuple[_T, ...]) -> _Chunked[_T]:
        return cls._made(
            tuple(values[i : i + _CHUNK] for i in range(0, len(values), _CHUNK)), len(values)
        )

    @classmethod
    def _made(cls, chunks: tuple[tuple[_T, ...], ...], size: int) -> _Chunked[_T]:
        new = object.__new__(cls)
        new._chunks = chunks
        new._size = size
        return new

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: int) -> _T:
        if index < 0:
            index += self._size
        if not 0 <= index < self._size:
            raise IndexError(index)
        return self._chunks[index // _CHUNK][index % _CHUNK]

    def __iter__(self) -> Iterator[_T]:
        return (item for chunk in self._chunks for item in chunk)

    def set(self, index: int, value: _T) -> _Chunked[_T]:
        outer, inner = divmod(index, _CHUNK)
        chunks = self._chunks
        chunk = chunks[outer]
        # Concatenations run in C: no unpacking item by item.
        changed = chunk[:inner] + (value,) + chunk[inner + 1 :]  # noqa: RUF005
        return _Chunked._made(chunks[:outer] + (changed,) + chunks[outer + 1 :], self._size)  # noqa: RUF005

    def append(self, value: _T) -> _Chunked[_T]:
        chunks = self._chunks
        if self._size % _CHUNK == 0:
            return _Chunked._made(chunks + ((value,),), self._size + 1)  # noqa: RUF005
        last = chunks[-1] + (value,)
        return _Chunked._made(chunks[:-1] + (last,), self._size + 1)  # noqa: RUF005


class Roster(Generic[Item]):
    """An immutable sequence of a round's children (pending or finished), in order,
    built for a parent with thousands of them: appending one, dropping one or
    replacing one costs the same at any length (issue 21).

    A tuple costs a copy of every item on each of those: a parent with N children
    copied two N-item tuples per child outcome (165 us at N = 10000). A Roster keeps
    its items in a persistent vector (``_Chunked``: a tuple of 64-item tuples, each
    change copies one chunk and the outer tuple) where a dropped item leaves a hole (``None``),
    so positions never move: ``find`` computes a child's position from its spawn
    number (``"<parent>.<n>"``) while the ids are consecutive, as the reducer makes
    them, and scans otherwise. It counts its items and its started ones as it
    changes, so ``len`` and ``Children.running`` read a number.

    A value like a tuple of its items: equal to another Roster or tuple with the
    same items (holes never count), hashable, iterable, indexable (an index counts
    items, not holes; a slice is a tuple). The codec stores it as a JSON array.
    """

    __slots__ = ("_base", "_items", "_live", "_started")

    _items: _Chunked[Item | None]
    _live: int
    _started: int
    _base: int

    def __init__(self, items: Iterable[Item] = ()) -> None:
        values = tuple(items)
        base = _spawn_number(values[0].spec.id) if values else -1
        for offset, item in enumerate(values):
            if base < 0 or _spawn_number(item.spec.id) != base + offset:
                base = -1
                break
        self._items = _Chunked.of(values)
        self._live = len(values)
        self._started = sum(1 for item in values if getattr(item, "started", False))
        self._base = base

    @classmethod
    def _of(cls, items: _Chunked[Item | None], live: int, started: int, base: int) -> Roster[Item]:
        # Immutable by contract: the attributes are set here and in __init__ only, and
        # no method changes them (a __setattr__ guard would make each change cost
        # four slow calls; the vector itself is immutable).
        new = object.__new__(cls)
        new._items = items
        new._live = live
        new._started = started
        new._base = base
        return new

    def as_tuple(self) -> tuple[Item, ...]:
        """The items in order, holes left out, as one tuple built in C (iterating a
        Roster runs a generator in Python: a fingerprint reads its items every step)."""
        flat = tuple(chain.from_iterable(self._items._chunks))
        if self._live == len(flat):
            return flat  # type: ignore[return-value]
        return tuple(filter(_NOT_NONE, flat))  # type: ignore[arg-type]

    def chunks(self) -> tuple[tuple[Item | None, ...], ...]:
        """The items as the roster keeps them: chunks of up to 64, a dropped item a hole
        (None). A chunk is the same object from one roster to the next while no item of
        it changes (a fingerprint keeps each chunk's digest by identity); how items are
        chunked depends on the roster's history, not only on its items."""
        return self._items._chunks

    # ------------------------------------------------------------- the sequence

    def __len__(self) -> int:
        return self._live

    def __bool__(self) -> bool:
        return self._live > 0

    def __iter__(self) -> Iterator[Item]:
        if self._live == len(self._items):
            return iter(self._items)  # type: ignore[arg-type]
        return (item for item in self._items if item is not None)

    @overload
    def __getitem__(self, index: int) -> Item: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Item, ...]: ...
    def __getitem__(self, index: int | slice) -> Item | tuple[Item, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        if self._live == len(self._items):
            item = self._items[index]  # no holes: the vector's own index
            assert item is not None
            return item
        return tuple(self)[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Roster):
            return self._live == other._live and tuple(self) == tuple(other)
        if isinstance(other, tuple):
            return tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Roster({tuple(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Roster, (tuple(self),))

    # ------------------------------------------------------------- changes

    @property
    def started(self) -> int:
        """How many items are started pending children."""
        return self._started

    def find(self, child_id: str) -> int:
        """The position of child ``child_id`` (for ``at``, ``without``, ``replaced``),
        or -1: computed from its spawn number while the ids are consecutive, else a
        scan. Positions only grow with the spawn order."""
        items = self._items
        if self._base >= 0:
            offset = _spawn_number(child_id) - self._base
            if 0 <= offset < len(items):
                item = items[offset]
                if item is not None and item.spec.id == child_id:
                    return offset
            return -1
        for position, item in enumerate(items):
            if item is not None and item.spec.id == child_id:
                return position
        return -1

    def at(self, position: int) -> Item:
        """The item at ``position`` (from ``find``)."""
        item = self._items[position]
        assert item is not None
        return item

    def positions(self) -> Iterator[tuple[int, Item]]:
        """Every item with its position, in order."""
        for position, item in enumerate(self._items):
            if item is not None:
                yield position, item

    def without(self, position: int) -> Roster[Item]:
        """The roster without the item at ``position``."""
        item = self.at(position)
        if self._live == 1:
            return _EMPTY
        started = self._started - (1 if getattr(item, "started", False) else 0)
        return Roster._of(self._items.set(position, None), self._live - 1, started, self._base)

    def replaced(self, position: int, item: Item) -> Roster[Item]:
        """The roster with ``item`` in place of the one at ``position`` (the same child)."""
        old = self.at(position)
        started = (
            self._started
            + (1 if getattr(item, "started", False) else 0)
            - (1 if getattr(old, "started", False) else 0)
        )
        return Roster._of(self._items.set(position, item), self._live, started, self._base)

    def appended(self, item: Item) -> Roster[Item]:
        """The roster with ``item`` after the others."""
        if not self._items:
            return Roster((item,))
        items = self._items
        base = self._base
        if base >= 0 and _spawn_number(item.spec.id) != base + len(items):
            base = -1
        started = self._started + (1 if getattr(item, "started", False) else 0)
        return Roster._of(items.append(item), self._live + 1, started, base)


_EMPTY: Roster[Any] = Roster()


def _roster(items: Iterable[Any]) -> Roster[Any]:
    if isinstance(items, Roster):
        return items
    values = tuple(items)
    return Roster(values) if values else _EMPTY


def pending_roster(items: Iterable[PendingChild]) -> Roster[PendingChild]:
    """``items`` as a Roster (a Roster as it is): the converter of ``Children.pending``,
    so that tuples given by callers (tests, older code) keep working."""
    return _roster(items)


def finished_roster(items: Iterable[FinishedChild]) -> Roster[FinishedChild]:
    """The same for ``Children.finished``."""
    return _roster(items)


@attrs.frozen
class Children:
    """The children of one tool round. ``pending`` + ``finished`` is every accepted child.

    ``pending`` (spawn order) and ``finished`` (the order their outcomes came) are
    Rosters: a child outcome moves one child from the one to the other at a cost
    that does not grow with the number of children (see Roster).

    ``summary``: the summary their children of context mode ``summary`` start with,
    once one of them waits for it (None before that, and in rounds without one).
    """

    pending: Roster[PendingChild] = attrs.field(default=_EMPTY, converter=pending_roster)
    finished: Roster[FinishedChild] = attrs.field(default=_EMPTY, converter=finished_roster)
    rejected: tuple[RejectedTask, ...] = ()
    summary: Summary | None = attrs.field(default=None, metadata=_SINCE_7_OMITTED_AT_DEFAULT)

    @property
    def running(self) -> int:
        return self.pending.started

    @property
    def total(self) -> int:
        return len(self.pending) + len(self.finished)

    @property
    def reserved(self) -> int:
        """Tokens set aside for the children running now (see PendingChild.budget)."""
        return sum(p.budget for p in self.pending if p.budget is not None)

    def pending_ids(self) -> tuple[str, ...]:
        return tuple(p.spec.id for p in self.pending)

    def index_of(self, child_id: str) -> int:
        """The position of pending child ``child_id`` in ``pending`` (for
        ``pending.at`` and ``finish_at``), or -1. Positions follow the spawn order."""
        return self.pending.find(child_id)

    def find_pending(self, child_id: str) -> PendingChild | None:
        index = self.pending.find(child_id)
        return self.pending.at(index) if index >= 0 else None

    def is_finished(self, child_id: str) -> bool:
        return self.finished.find(child_id) >= 0

    def finish(self, child_id: str, outcome: ChildOutcome) -> Children:
        """Move one pending child to finished. The caller checked it is pending."""
        index = self.pending.find(child_id)
        assert index >= 0
        return self.finish_at(index, outcome)

    def finish_at(self, index: int, outcome: ChildOutcome) -> Children:
        """Move the pending child at ``index`` (from ``index_of``) to finished."""
        # O(1) in the number of children: one change to each persistent list.
        pending = self.pending
        done = FinishedChild(pending.at(index).spec, outcome)
        return Children(
            pending.without(index), self.finished.appended(done), self.rejected, self.summary
        )

    def started(self, index: int, child: PendingChild) -> Children:
        """``child`` (started now) in place of the pending child at ``index``."""
        pending = self.pending.replaced(index, child)
        return Children(pending, self.finished, self.rejected, self.summary)


def _spawn_number(child_id: str) -> int:
    """The n of a child id ``"<parent>.<n>"``; -1 if it has none."""
    tail = child_id[child_id.rfind(".") + 1 :]
    return int(tail) if tail.isascii() and tail.isdigit() else -1


def spawn_order(child_id: str) -> tuple[int, str]:
    """A sort key putting sub-agents in the order their parent spawned them
    (``root.2`` before ``root.10``); an id that is not ``"<parent>.<n>"`` sorts first."""
    number = _spawn_number(child_id)
    return (number, child_id[: child_id.rfind(".")]) if number >= 0 else (0, child_id)


def _cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"... [truncated {len(text) - limit} characters]"


def fan_in_result(spawn_call_id: str, children: Children, result_cap: int) -> ToolResult:
    """The one aggregated tool result the model sees for a ``spawn_agents`` call.

    Children appear in the order they were requested; every child has a status and
    either a result or an error, each capped at ``result_cap`` characters. A child that
    ended with plain text instead of calling ``submit_result`` has the status
    ``completed_without_submit``: its text is its result, but it never said it was done;
    ``completed_truncated`` if that text was cut off at the output token limit.
    """
    entries: list[dict[str, str]] = []
    ok = 0
    for fin in children.finished:
        if fin.spec.spawn_call_id != spawn_call_id:
            continue
        entry = {"agent_id": fin.spec.id, "task": _cap(fin.spec.task, result_cap)}
        match fin.outcome:
            case ChildSucceeded(result=result, submitted=submitted, truncated=truncated):
                ok += 1
                status = "completed" if submitted else "completed_without_submit"
                if truncated:
                    status = "completed_truncated"
                entry.update(status=status, result=_cap(result, result_cap))
            case ChildFailed(error=error, kind=kind):
                entry.update(status="failed", error=_cap(error, result_cap), error_kind=kind)
        entries.append(entry)
    entries.sort(key=lambda e: spawn_order(e["agent_id"]))
    rejected = [
        {"task": _cap(r.task, result_cap), "status": "rejected", "error": r.error}
        for r in children.rejected
        if r.spawn_call_id == spawn_call_id
    ]
    payload: dict[str, object] = {"sub_agent_results": entries}
    if rejected:
        payload["rejected_tasks"] = rejected
    return ToolResult(
        tool_call_id=spawn_call_id,
        name="spawn_agents",
        content=canonical_json(payload),
        # The call as a whole is an error only when nothing it asked for succeeded.
        is_error=ok == 0,
    )
