"""Placement: a big fan-out's children run in chunks, on whichever worker takes them.

DESIGN.md, "The unit of distribution", gives the reasons. In short:

- **Where a child runs is the runtime's decision, not the reducer's.** The reducer
  decides how many children run (``max_concurrent``), which and when: the
  ``SpawnSubAgent`` effects of a step. When one step issues more than ``spread_at``
  of them, the runtime that has a placement (``Runtime.use_placement``: ``fanfold
  worker`` on a PostgreSQL log) does not create them itself: it records each child
  with the effect its parent issued (``PostgresStore.place``, a ``placements`` row
  per child) in chunks of up to ``chunk`` children, and puts each chunk on the
  workers' queue (a ``Placer``). Fewer spawns in a step run where their parent runs.
- **A chunk is a unit with its own claim.** The runtime that runs a chunk
  (``run_chunk``) claims the chunk's id in the log (``PostgresStore.claim``) and its
  conversations' commits are fenced by that claim, not the tree's
  (``Store.units``); the tree's runtime never writes them. A chunk's children spawn
  their own children where they run (no placement below a chunk: a chunk never
  waits for the queue, so the queue cannot deadlock).
- **Outcomes go through the log.** A child's terminal step is its outcome, committed
  once. The parent's runtime watches its placed children (``at_rest_among`` every
  ``poll`` seconds, and at once when the log notifies a placed child's end:
  ``PostgresStore.listen``) and delivers each one's outcome to the parent once
  (``SubAgentFinished``), exactly as a restart re-delivers it.
- **Cancels go through the log.** A parent's cancel of a placed child is a
  ``cancels`` row; the chunk's runtime reads them every ``poll`` (and when notified)
  and delivers ``CancelRequested`` to its children, including those it creates after the row was
  written (a chunk still queued when its parent was cancelled).
"""

from __future__ import annotations

import contextvars
import math
import threading
from collections.abc import Sequence, Set
from typing import Any, Protocol

import attrs
import trio

from fanfold.db.codec import decode_effect, encode_effect
from fanfold.db.errors import CodecError, DatabaseError
from fanfold.statemachine import (
    CancelReason,
    CancelRequested,
    Conversation,
    Effect,
    Event,
    SpawnSubAgent,
    SubAgentFinished,
)


class Spawning(Protocol):
    """The conversation whose step's effects ``take`` is given (an ``Actor``)."""

    @property
    def state(self) -> Conversation: ...

    @property
    def log(self) -> Any: ...


class PlacingRuntime(Protocol):
    """What a placement uses of its runtime (``Runtime``: a protocol here, so that the
    runtime's modules import each other one way only)."""

    store: Any
    logger: Any

    def deliver(self, conversation_id: str, event: Event) -> None: ...

    def deliver_between(self, conversation_id: str, event: Event) -> None: ...

    def loaded_ids(self) -> Set[str]: ...

    async def resume_unit(self, root_id: str, chunk: str, children: Sequence[str]) -> list[str]: ...

    def spawn_child(
        self,
        effect: SpawnSubAgent,
        *,
        reissued: bool = False,
        context: contextvars.Context | None = None,
        parent_cwd: str | None = None,
    ) -> None: ...

    def created_cwd(self, conversation_id: str) -> str: ...

    async def wait_loaded(self, conversation_id: str) -> None: ...


class Placer(Protocol):
    """Puts chunks on the workers' queue (``fanfold worker``: a DBOS queue)."""

    def enqueue(self, chunks: Sequence[tuple[str, str]]) -> None:
        """Enqueue each ``(chunk id, root id)``; one already queued (or done) is left
        as it is. Blocking: called from a thread."""

    def ended(self, chunks: Sequence[str]) -> list[str]:
        """Which of ``chunks`` no worker will run any more (their workflow ended, in
        success or not). Blocking: called from a thread."""


class PlacementError(ValueError):
    """A chunk that cannot be run (unknown, or its rows are not what a parent placed)."""


@attrs.frozen
class PlacementSettings:
    """When and how a runtime places children (see the module)."""

    spread_at: int = 1000
    """A step spawning more children than this places them in chunks."""
    chunk: int = 64
    """Children per chunk."""
    poll: float = 0.2
    """Seconds between two reads of the log for placed children's outcomes and
    cancels."""
    listen: bool = True
    """Also wake at once on the log's notifications (``PostgresStore.listen``: a
    placed child ended, a cancel was asked) instead of only every ``poll``, which stays
    as the fallback for a notification missed or a listener's connection lost."""
    orphans_every: int = 10
    """Every this many polls, ask the queue which chunks of children still due have
    ended: those are taken back (``take_back``)."""

    def __attrs_post_init__(self) -> None:
        if self.spread_at < 1 or self.chunk < 1:
            raise ValueError("spread_at and chunk must be at least 1")
        if not (math.isfinite(self.poll) and self.poll > 0):
            raise ValueError("poll must be a finite number of seconds above 0")


def chunk_id(first: SpawnSubAgent, last: SpawnSubAgent) -> str:
    """A chunk's id: its parent and its first and last children's numbers (child ids
    are ``PARENT.N``). Never a conversation's id (``:`` is in none)."""
    return f"chunk:{first.child_id}:{last.child_id.rsplit('.', 1)[-1]}"


class Placement:
    """A runtime's placement of children (``Runtime.use_placement``)."""

    def __init__(
        self, runtime: PlacingRuntime, placer: Placer, settings: PlacementSettings
    ) -> None:
        self._runtime = runtime
        self._store: Any = runtime.store  # a PostgresStore (checked by use_placement)
        self._placer = placer
        self.settings = settings
        self._placed: dict[str, str] = {}  # child -> chunk, of parents loaded here
        self.watched: dict[str, str] = {}
        """Each placed child whose outcome is still due, and its parent."""
        self._chunks: dict[str, tuple[str, ...]] = {}  # chunks run here -> children
        self._cancelled: set[str] = set()  # chunk children a cancel was delivered to
        self._run_here: set[str] = set()  # placed children loaded here (by run_chunk)
        self._todo: list[tuple[list[tuple[str, str, str, str, str]], list[tuple[str, str]]]] = []
        self._cancels: list[tuple[list[str], str]] = []
        self._wake = trio.Event()

    # ------------------------------------------------------------ in the engine

    def take(
        self, actor: Spawning, effects: tuple[Effect, ...], reissued: bool
    ) -> tuple[Effect, ...]:
        """The effects of a step that the actor still executes itself: the
        ``SpawnSubAgent`` effects this placement took are gone from them."""
        spawns = [e for e in effects if type(e) is SpawnSubAgent]
        if not spawns or actor.state.id in self._store.units:
            # No spawns, or a chunk's conversation: its children run here.
            return effects
        if reissued:
            # After a restart: children placed before it stay placed (their chunk is
            # enqueued again: a chunk queued or done is left as it is).
            placed = self._store.placed_among([s.child_id for s in spawns])
            if not placed:
                return effects
            again = {placed[s.child_id]: s.root_id for s in spawns if s.child_id in placed}
            for s in spawns:
                if s.child_id in placed:
                    self._placed[s.child_id] = placed[s.child_id]
                    self.watched[s.child_id] = s.parent_id
            self._todo.append(([], sorted(again.items())))
            self._wake.set()
            return tuple(
                e for e in effects if not (type(e) is SpawnSubAgent and e.child_id in placed)
            )
        if len(spawns) <= self.settings.spread_at:
            return effects
        size = self.settings.chunk
        rows: list[tuple[str, str, str, str, str]] = []
        chunks: list[tuple[str, str]] = []
        for start in range(0, len(spawns), size):
            group = spawns[start : start + size]
            chunk = chunk_id(group[0], group[-1])
            chunks.append((chunk, group[0].root_id))
            for s in group:
                rows.append((s.child_id, chunk, s.root_id, s.parent_id, encode_effect(s)))
                self._placed[s.child_id] = chunk
                self.watched[s.child_id] = s.parent_id
        self._todo.append((rows, chunks))
        self._wake.set()
        actor.log.info("children_placed", children=len(spawns), chunks=len(chunks))
        return tuple(e for e in effects if type(e) is not SpawnSubAgent)

    def forwards(self, conversation_id: str, event: Event) -> bool:
        """Whether a message to a conversation not loaded here goes through the log
        instead: a cancel to a placed child (a ``cancels`` row), an outcome to the
        parent of a chunk's child (the child's terminal step is that outcome; its
        parent's runtime reads it)."""
        if type(event) is CancelRequested and conversation_id in self._placed:
            self._cancels.append(([conversation_id], event.reason.value))
            self._wake.set()
            return True
        if type(event) is SubAgentFinished and event.child_id in self._run_here:
            # Also when the parent is loaded here (this worker runs the tree and took
            # the chunk too, or took it back): the parent's watch delivers it, from the
            # log, and must be the only one. Woken now, so that it reads at once.
            if event.child_id in self.watched:
                self._wake.set()
            return True
        return False

    def placed_before(self, placements: dict[str, str]) -> None:
        """A tree being resumed placed these children (child to chunk): their
        outcomes come only through the watch its re-issued spawns start (``take``),
        never also from the restart's re-delivery (``Runtime._redeliver_outcomes``)."""
        self._placed.update(placements)

    def is_placed(self, child_id: str) -> bool:
        """Whether ``child_id`` (of a parent loaded here) runs in a chunk."""
        return child_id in self._placed

    def unloaded(self, conversation_id: str) -> None:
        """A conversation came to rest and was unloaded (its effects all started)."""
        self._run_here.discard(conversation_id)

    # ------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Write placements and cancels, enqueue chunks, deliver placed children's
        outcomes and chunks' cancels: every ``poll`` seconds, or at once when asked
        or notified (``PlacementSettings.listen``)."""
        async with trio.open_nursery() as nursery:
            if self.settings.listen and hasattr(self._store, "listen"):
                nursery.start_soon(self._listen)
            await self._loop()

    async def _listen(self) -> None:
        # The store's listener blocks in a thread of its own; each notification it hears
        # wakes the loop, which then reads the log as a poll would. Abandoned when the
        # runtime stops: it sees ``stop`` within ``LISTEN_STOP_S`` and closes.
        stop = threading.Event()
        token = trio.lowlevel.current_trio_token()

        def woken(payload: str) -> None:
            try:
                trio.from_thread.run_sync(self._notified, payload, trio_token=token)
            except BaseException:  # the run is over (or this thread abandoned): stop
                stop.set()

        try:
            # A limiter of its own: the thread is held for the runtime's life and must not
            # take one of the default limiter's tokens from the log's writes.
            await trio.to_thread.run_sync(
                self._store.listen,
                stop,
                woken,
                abandon_on_cancel=True,
                limiter=trio.CapacityLimiter(1),
            )
        finally:
            stop.set()

    def _notified(self, payload: str) -> None:
        # Only what this runtime waits for: an end when it watches placed children, a
        # cancel when it runs chunks (every runtime on the log hears every notification).
        if payload == "outcome" and not self.watched:
            return
        if payload == "cancel" and not self._chunks:
            return
        self._wake.set()

    async def _loop(self) -> None:
        log = self._runtime.logger
        polls = 0
        while True:
            with trio.move_on_after(self.settings.poll):
                await self._wake.wait()
            self._wake = trio.Event()
            try:
                await self._flush()
            except Exception as exc:
                # The log or the queue away for now (a PostgreSQL restart: DBOS's client
                # raises its driver's errors): what is left is done next time, in order.
                log.warning("placement_retry", error=_first_line(exc))
            try:
                await self._outcomes()
                await self._deliver_cancels()
            except DatabaseError as exc:
                log.warning("placement_retry", error=_first_line(exc))
            polls += 1
            if polls % self.settings.orphans_every == 0 and self.watched:
                try:
                    await self._orphans()
                except Exception as exc:  # the queue away for now: next time
                    log.warning("placement_retry", error=_first_line(exc))

    async def _flush(self) -> None:
        while self._todo:
            rows, chunks = self._todo[0]
            if rows:
                await trio.to_thread.run_sync(self._store.place, rows)
            if chunks:
                await trio.to_thread.run_sync(self._placer.enqueue, chunks)
            self._todo.pop(0)
        while self._cancels:
            ids, reason = self._cancels[0]
            await trio.to_thread.run_sync(self._store.request_cancels, ids, reason)
            self._cancels.pop(0)

    async def _outcomes(self) -> None:
        if not self.watched:
            return
        done = await trio.to_thread.run_sync(self._store.at_rest_among, list(self.watched))
        if not done:
            return
        # Every finished child's state first, then every delivery with no checkpoint
        # between them: the parents' steps for these outcomes are then one batch, one
        # commit. (Read and delivered one by one, each delivery was committed alone
        # while the next child was read: a fan-out of 128 placed children spent 128
        # write transactions and some 1.3 s on its fan-in; bench/README.md,
        # "Placement of chunks".) A read that fails delivers nothing: all are read
        # again at the next poll.
        store, runtime = self._store, self._runtime
        states = await trio.to_thread.run_sync(lambda: [store.load_state(c) for c in done])
        loaded = runtime.loaded_ids()
        for child_id, state in zip(done, states, strict=True):
            parent_id = self.watched.get(child_id)
            if parent_id is None:
                continue  # delivered meanwhile (never: one watch per runtime; defensive)
            outcome = state.outcome
            if outcome is None:
                # At rest with no outcome: not a sub-agent's end. Kept watched (dropping
                # it, as this once did, would leave its parent waiting for ever) and said.
                runtime.logger.warning("placed_child_without_outcome", child=child_id)
                continue
            del self.watched[child_id]
            self._placed.pop(child_id, None)
            if parent_id not in loaded:
                # The parent is no longer this runtime's (its tree was taken over and
                # dropped here: the new owner's re-issued spawns watch the child), or
                # it ended. Nothing to hand over here.
                runtime.logger.info("placed_outcome_not_here", child=child_id, parent=parent_id)
                continue
            # Once: the child leaves the watched set as its outcome is handed over. Not
            # through ``deliver_between``: its ``forwards`` takes an outcome of a child
            # run here for the in-process one and swallows it, and then nobody delivered
            # it (issue 32: a chunk taken over by the tree's own worker lost the outcomes
            # its dead runner had committed).
            runtime.deliver(parent_id, SubAgentFinished(child_id, outcome))

    async def _orphans(self) -> None:
        """Take back the chunks whose workflow ended while children of them are still
        due: no worker will run those children (a worker that could not run the chunk,
        its tree's key or tools not its own, ended it with the reason), and a parent
        must never wait for ever for a child."""
        chunks = sorted({self._placed[c] for c in self.watched if c in self._placed})
        if not chunks:
            return
        ended = await trio.to_thread.run_sync(self._placer.ended, chunks)
        for chunk in ended:
            await self.take_back(chunk)

    async def take_back(self, chunk: str) -> list[str]:
        """Run a chunk's children still due here, where their parents are: claim the
        chunk (a runner still at it is fenced), resume those the log has unfinished,
        create those never created. Every outcome of the chunk, of those run here
        too, reaches its parent through the watch (from the log, once); a cancel
        reaches those run here in the process. Returns those run here."""
        runtime = self._runtime
        effects = await self._chunk_spawns(chunk)
        children = [e.child_id for e in effects]
        # Their outcomes still come through the watch, from the log, like those of a
        # chunk run here (``forwards``): one that ends while it is brought up would
        # otherwise reach its parent in the process and again from the watch.
        self._run_here.update(children)
        try:
            await self._bring_up(chunk, effects)
        finally:
            loaded = runtime.loaded_ids()
            self._run_here.difference_update([c for c in children if c not in loaded])
        here = [c for c in children if c in runtime.loaded_ids()]
        for child_id in here:
            # A cancel reaches it here, in the process, no longer through a row.
            self._placed.pop(child_id, None)
        # Cancels its parent asked for while it was placed: nobody else reads them now.
        # Also those asked while it was being brought up (still placed then, so they
        # became rows) that the loop has not written yet: read from the queue before the
        # rows, as the loop drops an entry only once it is written. (Read from the rows
        # alone, such a cancel could be missed and its child wait for ever; found by
        # reading the code after a hang of
        # test_a_cancel_reaches_children_taken_back_before_or_after_it at a load of 20,
        # whose cause was not confirmed.)
        queued = [(ids, reason) for ids, reason in self._cancels]
        asked = await trio.to_thread.run_sync(self._store.cancels_among, here)
        for ids, reason in queued:
            for conversation_id in ids:
                if conversation_id in here:
                    asked.setdefault(conversation_id, reason)
        for conversation_id, reason in asked.items():
            if conversation_id in runtime.loaded_ids():  # not come to rest meanwhile
                runtime.deliver(conversation_id, CancelRequested(_reason(reason)))
        runtime.logger.warning("chunk_taken_back", chunk=chunk, children=len(here))
        return here

    async def _deliver_cancels(self) -> None:
        # Only the children loaded here: one that ``run_chunk`` has not created yet
        # gets its cancel at the next read after its creation.
        loaded = self._runtime.loaded_ids()
        waiting = [
            c
            for ids in self._chunks.values()
            for c in ids
            if c in loaded and c not in self._cancelled
        ]
        if not waiting:
            return
        asked = await trio.to_thread.run_sync(self._store.cancels_among, waiting)
        for conversation_id, reason in asked.items():
            if conversation_id not in self._runtime.loaded_ids():
                continue  # came to rest meanwhile
            self._cancelled.add(conversation_id)
            self._runtime.deliver(conversation_id, CancelRequested(_reason(reason)))

    # ------------------------------------------------------------ a chunk

    async def _chunk_spawns(self, chunk: str) -> list[SpawnSubAgent]:
        """A chunk's spawns from its rows, each checked to name its row's child,
        parent and tree (PlacementError if not, or if there is no such chunk)."""
        rows = await trio.to_thread.run_sync(self._store.chunk, chunk)
        if not rows:
            raise PlacementError(f"no chunk {chunk!r} in the log")
        root_id = rows[0][1]
        effects: list[SpawnSubAgent] = []
        for child_id, root, parent_id, text in rows:
            try:
                effect: Any = decode_effect(text)
            except (CodecError, DatabaseError) as exc:
                raise PlacementError(
                    f"chunk {chunk!r}: its row for {child_id!r} is not a spawn ({exc})"
                ) from None
            if (
                type(effect) is not SpawnSubAgent
                or effect.child_id != child_id
                or effect.root_id != root_id
                or root != root_id
                or effect.parent_id != parent_id
            ):
                raise PlacementError(f"chunk {chunk!r}: its row for {child_id!r} is not a spawn")
            effects.append(effect)
        return effects

    async def _bring_up(self, chunk: str, effects: Sequence[SpawnSubAgent]) -> None:
        """Load a chunk's work here under its claim: resume the conversations the log
        has unfinished, create the children never created (each a conversation of the
        chunk's unit, ``Store.units``, and so are their own children)."""
        store, runtime = self._store, self._runtime
        children = [e.child_id for e in effects]
        for child_id in children:
            store.units[child_id] = chunk
        await runtime.resume_unit(effects[0].root_id, chunk, children)
        cwds: dict[str, str] = {}
        for effect in effects:
            if effect.child_id in runtime.loaded_ids():
                continue
            if await trio.to_thread.run_sync(store.exists, effect.child_id):
                continue  # at rest already (an unfinished one was resumed above)
            parent_cwd = cwds.get(effect.parent_id)
            if parent_cwd is None:
                parent_cwd = cwds[effect.parent_id] = await trio.to_thread.run_sync(
                    runtime.created_cwd, effect.parent_id
                )
            runtime.spawn_child(effect, parent_cwd=parent_cwd)

    async def run_chunk(self, chunk: str) -> list[str]:
        """Run chunk ``chunk`` here until each of its children is at rest: claim it,
        resume its conversations the log has unfinished, create the children not
        created yet. Returns the chunk's children."""
        effects = await self._chunk_spawns(chunk)
        children = tuple(e.child_id for e in effects)
        runtime = self._runtime
        self._run_here.update(children)
        self._chunks[chunk] = children
        try:
            await self._bring_up(chunk, effects)
            self._wake.set()  # cancels asked already reach them at once
            for child_id in children:
                await runtime.wait_loaded(child_id)
        finally:
            del self._chunks[chunk]
            self._cancelled.difference_update(children)
            loaded = runtime.loaded_ids()
            self._run_here.difference_update([c for c in children if c not in loaded])
        return list(children)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


def _reason(text: str) -> CancelReason:
    try:
        return CancelReason(text)
    except ValueError:
        return CancelReason.USER  # a row no fanfold wrote: still a cancel
