"""``fanfold worker``: DBOS workflows as thin durable envelopes around one Trio runtime.

DESIGN.md, "Beyond one machine (issue 25)", gives the reasons; in short:

- **One runtime per process.** ``serve`` runs Trio in the main thread with one
  ``Runtime`` over fanfold's log. DBOS (launched once the runtime is open) runs each
  tree's workflow in a thread of its executor pool; that thread hands the tree to the
  Trio loop (``trio.from_thread.run``) and blocks until the tree is at rest. The
  workflow threads only wait: ``--concurrency`` (the queue's ``worker_concurrency``) is
  the number of trees this worker holds at once.
- **A workflow per tree, one step.** Its id is the tree's root id (``fanfold run
  --detach`` chose it and printed it), its one argument the ``TreeSpec``. The step
  resumes the root if fanfold's log holds it (an execution after a recovery: DBOS runs
  the step again, the log knows how far the tree got), else starts it under that id;
  then waits for rest. The step is never retried by DBOS: a tree's failure is the
  tree's, recorded in its log.
- **Leases** (``leases.py``): this worker's row renewed every third of ``lease``; an
  expired row of another worker is claimed and that worker's PENDING workflows are
  re-enqueued (``DBOS.resume_workflow``), as DBOS's open-source library never notices
  a dead executor. A renewal that finds this worker's own row claimed (it was frozen
  past its lease) stops the runtime at once, exit 3.
- **A tree taken over** (its commit refused, ``TreeTakenOver``): the runtime drops
  it and goes on; its workflow's step ends with ``DroppedTree``, which DBOS records
  only if this execution still owns the workflow (see ``DroppedTree``). The worker
  keeps running its other trees.
- **Drain** (SIGINT, SIGTERM, SIGHUP): stop taking work (DBOS is shut down first, so
  nothing more is dequeued), close the runtime (its trees stop at a step boundary,
  left ``running`` in the log, exactly as after a crash but with every commit
  finished and every bash command stopped), end the lease at once. The workflows stay
  PENDING on this executor and the next worker to renew its lease takes them over
  and resumes their trees from the log; a tool call that was in flight is recorded as
  interrupted there (``RuntimeResumed``), never run twice. Waiting for the trees to
  finish instead would hold a deploy for as long as the slowest tree's model calls.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio
from dbos import DBOS, DBOSClient, DBOSConfig, EnqueueOptions

from fanfold.agents import AgentDefinition
from fanfold.db import LogUnavailable, UnknownConversation
from fanfold.db.errors import CodecError
from fanfold.db.postgres import PostgresStore
from fanfold.db.provenance import UntrustedTree
from fanfold.db.targets import without_password
from fanfold.runtime import Runtime, TreeDropped
from fanfold.runtime.placement import PlacementError, PlacementSettings
from fanfold.runtime.runtime import MissingTools
from fanfold.statemachine import Limits
from fanfold.worker.leases import Leases, TreeLocks
from fanfold.worker.parking import Parking, WaitingTree, due, wake_id
from fanfold.worker.serialization import SERIALIZER, check_pickle_refused, refuse_pickle
from fanfold.worker.spec import (
    APP_NAME,
    APP_VERSION,
    CHUNK_QUEUE,
    CHUNK_WORKFLOW,
    QUEUE,
    WAKE_WORKFLOW,
    WORKFLOW,
    SpecError,
    TreeSpec,
    chunk_from_input,
    chunk_input,
    wake_from_input,
    wake_input,
)

STEP = "fanfold.run_to_rest"
ADMIT_STEP = "fanfold.admit_tree"
CHUNK_STEP = "fanfold.run_chunk"
WAKE_STEP = "fanfold.wake_tree"

EXIT_DRAINED = 0
EXIT_LEASE_LOST = 3

# How long a worker waits between two tries of a tree's lock that another holds.
_CLAIM_RETRY = 0.5

# How often a tree's step looks whether its tree now waits only for people (two looks
# in a row: then it lets the tree go).
_PARK_CHECK = 0.25

RENEW_RETRY = 0.25
"""Seconds between two tries of a lease renewal that failed (the server away): at most
a third of the lease."""


@attrs.frozen
class WorkerSettings:
    """What ``fanfold worker`` was asked for."""

    log: Path | str
    system_url: str = attrs.field(repr=False)  # may hold a password: never shown
    executor_id: str
    concurrency: int = 8
    lease: float = 15.0
    poll: float = 0.2
    chunk_concurrency: int = 32
    """Chunks of placed children this worker runs at once (the chunks' queue)."""
    spread_at: int = 1000
    """A step spawning more children than this places them in chunks (a PostgreSQL
    log only)."""
    chunk: int = 64
    """Children per chunk."""
    allow_cwd: tuple[str, ...] = ()
    """The folders (resolved) a queued tree's ``cwd`` must be inside (``--allow-cwd``;
    the CLI's default: the worker's own folder)."""
    ask: tuple[str, ...] = ()
    """Ask rules of every tree this worker starts (its ``[permissions] ask``), before
    the tree's own (``run --detach --ask``)."""
    allow_existing_root: bool = False
    """Whether a queued tree may name a tree the log holds already (``resume`` it:
    take it over). Off: only a workflow's own tree is resumed, after a recovery."""


class DroppedTree(Exception):
    """Raised out of a tree's workflow step when this worker dropped the tree: another
    runtime claimed it (``TreeDropped``), its commit here was refused, and the worker
    goes on with its other trees. A plain exception of one message (DBOS pickles what
    a step raises, and a ``TreeDropped`` does not unpickle).

    What DBOS records of it (DESIGN.md, "Workers ... leases", "A tree taken over"):
    nothing, when another execution of the workflow owns it now (the takeover of a
    worker re-enqueued the workflow and another worker dequeued it): DBOS refuses the
    step's record from an execution that no longer owns the workflow and parks this
    one until the owner records the outcome. The step's error and the workflow's
    ERROR only when this execution still owns the workflow: the claim came from
    outside DBOS (a program on the log), which holds the tree from then on."""


class StepFailed(Exception):
    """What a workflow step raises for any other error: its type and message as one
    plain text. DBOS pickles what a step raises, and many of fanfold's errors (and
    others') take more than a message and do not unpickle: ``UntrustedTree`` raised out
    of a step was recorded, then could not be read back (a ``TypeError``)."""


def step_error(exc: BaseException) -> BaseException:
    """``exc`` as a step may raise it: a ``DroppedTree`` or ``StepFailed`` as it is,
    anything that is not an ``Exception`` (a cancellation, a ``KeyboardInterrupt``) as
    it is, every other error as a ``StepFailed``."""
    if isinstance(exc, DroppedTree | StepFailed) or not isinstance(exc, Exception):
        return exc
    lines = str(exc).strip().splitlines()
    return StepFailed(f"{type(exc).__name__}: {lines[0] if lines else ''}")


def new_executor_id() -> str:
    """A DBOS executor id unique to this process: host, pid and a random part (DBOS's
    default, "local", is the same for every worker, which would make them one)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class _Host:
    """The process's one runtime, as the workflow threads see it."""

    def __init__(
        self,
        runtime: Runtime,
        token: trio.lowlevel.TrioToken,
        make_limits: Callable[[TreeSpec], Limits],
        agents_for: Callable[[str], tuple[AgentDefinition, ...]],
        system_prompt: str,
        say: Callable[[str], None],
        locks: TreeLocks,
        settings: WorkerSettings | None = None,
        parking: Parking | None = None,
    ) -> None:
        self.runtime = runtime
        self.parking = parking
        """Where trees waiting only for people are let go (None: they are held)."""
        self.settings = settings
        self.locks = locks
        self.token = token
        self.make_limits = make_limits
        self.agents_for = agents_for
        self.system_prompt = system_prompt
        self.say = say
        self.draining = threading.Event()
        """Set once the worker stops: a workflow thread whose tree the stop interrupted
        then records nothing in DBOS (its workflow stays PENDING, for another worker)."""

    async def run_to_rest(self, spec: TreeSpec) -> dict[str, Any]:
        """Claim the tree, resume it if the log holds it, else start it; wait until it
        is at rest, then let it go."""
        return await self._holding(spec.root_id, f"tree {spec.root_id}", self._run_claimed, spec)

    async def run_chunk(self, chunk: str) -> dict[str, Any]:
        """Claim a chunk of placed children (``fanfold/runtime/placement.py``), run
        them here until each is at rest, then let it go."""
        return await self._holding(chunk, f"chunk {chunk}", self._run_chunk_claimed, chunk)

    async def _holding(
        self, key: str, what: str, body: Callable[[Any], Awaitable[dict[str, Any]]], arg: Any
    ) -> dict[str, Any]:
        """``body(arg)`` while holding ``key``'s lock (a tree's or a chunk's)."""
        told = False
        while not await self._try_claim(key):
            # Another worker holds it: one frozen, or dying, after its lease was taken.
            if not told:
                self.say(f"waiting for {what}'s previous worker to let it go")
                told = True
            await trio.sleep(_CLAIM_RETRY)
        try:
            told = False
            while True:
                try:
                    return await body(arg)
                except TreeDropped as exc:
                    # Another runtime claimed the tree (or chunk) and this one dropped
                    # it (its commit refused, nothing of it written): the worker goes on
                    # with its other work; the lock goes below, for the new owner.
                    self.say(f"{what}: taken over by another runtime; dropped")
                    raise DroppedTree(str(exc)) from None
                except LogUnavailable as exc:
                    # The log went away (a PostgreSQL restart) while the tree was
                    # being started or resumed: try again once it is back, holding
                    # the tree. Raised out of the step, DBOS would record the workflow
                    # ERROR for good and nobody would ever resume the tree (seen in
                    # test_worker_crash.py). Idempotent: a start that did commit is
                    # found in the log and resumed.
                    if not told:
                        self.say(f"{what}: the log is unavailable; retrying")
                        told = True
                    if self.draining.is_set():  # the worker stops: hand the tree over
                        raise exc from None
                    await trio.sleep(_CLAIM_RETRY)
        finally:
            # At rest, or failed to start or resume (an untrusted or damaged tree):
            # let it go. Not when the worker stops: its trees are being handed over,
            # and the locks go with the connection once the runtime has closed.
            if not self.draining.is_set():
                self.locks.release(key)

    async def _run_chunk_claimed(self, chunk: str) -> dict[str, Any]:
        placement = self.runtime.placement
        if placement is None:
            return {"error": "this worker does not run chunks (its log is not PostgreSQL)"}
        children = await placement.run_chunk(chunk)
        return {"chunk_id": chunk, "children": len(children)}

    async def _run_claimed(self, spec: TreeSpec) -> dict[str, Any]:
        runtime = self.runtime
        try:
            runtime.store.conversation(spec.root_id)
            known = True
        except UnknownConversation:
            known = False
        if known:
            # Claimed: the other workers on the log run other trees, so the log's
            # database-wide rule (refuse while another runtime is open) would wait for
            # ever; the tree's lock is what keeps it from running twice.
            # (On a PostgreSQL log ``resume`` also takes the tree's claim in the log,
            # its epoch raised past the previous owner's, before it reads the tree.)
            await runtime.resume([spec.root_id], claimed=True)
            self.say(f"resumed tree {spec.root_id}")
        else:
            agents = await trio.to_thread.run_sync(self.agents_for, spec.cwd)
            await runtime.start(
                spec.task,
                cwd=spec.cwd,
                limits=self.make_limits(spec),
                system_prompt=spec.system_prompt
                if spec.system_prompt is not None
                else self.system_prompt,
                agents=agents,
                conversation_id=spec.root_id,
                timeout=spec.timeout,
                ask=(*(self.settings.ask if self.settings else ()), *spec.ask),
            )
            self.say(f"started tree {spec.root_id}")
        return await self._to_rest(spec.root_id, {"resumed": known})

    async def wake(self, named: tuple[str, int]) -> dict[str, Any]:
        """Take back a tree let go while it waited for people (``parking.py``), if it
        is still let go in generation ``named[1]``: resume it, run it to rest or to
        its next wait."""
        root_id = named[0]
        return await self._holding(root_id, f"tree {root_id}", self._run_woken, named)

    async def _run_woken(self, named: tuple[str, int]) -> dict[str, Any]:
        root_id, generation = named
        parking = self.parking
        if parking is None:
            return {"error": "this worker lets no tree go"}
        now = await trio.to_thread.run_sync(parking.generation, root_id)
        if now != generation:
            # Woken already (by another wake of this generation), or at rest.
            return {"root_id": root_id, "skipped": f"generation {now}, not {generation}"}
        await self.runtime.resume([root_id], claimed=True)
        self.say(f"took back tree {root_id} (it waited for people)")
        return await self._to_rest(root_id, {"resumed": True, "woken": generation})

    async def _to_rest(self, root_id: str, extra: dict[str, Any]) -> dict[str, Any]:
        """Wait until the tree is at rest; or, once it waits only for people (seen
        twice in a row), let it go: unloaded from the runtime, recorded in
        ``fanfold.waiting_trees``, the step ends (its slot and the tree's lock go)."""
        runtime = self.runtime
        calm = 0
        while True:
            with trio.move_on_after(_PARK_CHECK if self.parking is not None else math.inf):
                result = await runtime.wait(root_id)
                if self.parking is not None and extra.get("resumed"):
                    # (A tree started here has no row; one resumed may: let go before.)
                    await self._parked(self.parking.done, root_id)
                return {"root_id": root_id, "phase": result.phase, **extra}
            calm = calm + 1 if runtime.waiting_for_people(root_id) else 0
            if calm < 2:
                continue
            parked = runtime.unload_tree(root_id)
            if parked is None:
                calm = 0
                continue
            assert self.parking is not None
            generation = await self._parked(self.parking.park, root_id, parked.requests, parked.due)
            self.say(f"tree {root_id} waits for people ({len(parked.requests)}): let go")
            return {
                "root_id": root_id,
                "phase": "waiting",
                "requests": list(parked.requests),
                "due": parked.due,
                "generation": generation,
                **extra,
            }

    async def _parked(self, write: Callable[..., Any], *args: Any) -> Any:
        """``write(*args)`` on the waiting trees' table, tried again while the queue's
        database is away (the tree is unloaded: a step failing now would leave it
        waiting with no row to wake it). A stop of the worker ends the tries: the
        workflow stays PENDING and its next execution resumes the tree from the log."""
        while True:
            try:
                return await trio.to_thread.run_sync(write, *args)
            except Exception as exc:
                if self.draining.is_set():
                    raise
                self.say(f"cannot record a waiting tree now ({type(exc).__name__}); retrying")
                await trio.sleep(_CLAIM_RETRY)

    async def known(self, root_id: str) -> bool:
        """Whether the log holds the tree ``root_id``. A log that is unavailable (a
        PostgreSQL restart) is asked again until it is back: raised out of the
        admission step, the workflow would end in ERROR for good (as in ``_holding``)."""
        while True:
            try:
                self.runtime.store.conversation(root_id)
            except UnknownConversation:
                return False
            except LogUnavailable:
                if self.draining.is_set():
                    raise
                await trio.sleep(_CLAIM_RETRY)
                continue
            return True

    async def _try_claim(self, root_id: str) -> bool:
        try:
            return await trio.to_thread.run_sync(self.locks.try_claim, root_id)
        except Exception as exc:  # PostgreSQL unreachable: not claimed, try again
            self.say(f"cannot claim {root_id} now ({type(exc).__name__})")
            return False


_HOST: _Host | None = None


@DBOS.step(name=ADMIT_STEP)
def admit_step(data: dict[str, Any]) -> dict[str, Any]:
    """Whether this worker runs the queued tree: ``{"cwd": resolved folder, "existed":
    bool}``, or ``{"error": why not}``. Recorded by DBOS, so a recovery of the workflow
    reads the first execution's answer: ``existed`` tells the workflow's own tree (it
    started it, then was interrupted) from a tree the queue writer named."""
    host = _HOST
    if host is None or host.draining.is_set():
        _hold_forever()
        raise AssertionError("unreachable")  # _hold_forever never returns
    settings = host.settings or WorkerSettings("", "", "")
    try:
        spec = TreeSpec.from_input(data)
        spec.make_limits()  # the reducer's own checks of the limits, before anything
        if spec.root_id != DBOS.workflow_id:
            # Another workflow's id naming this root: it would take over that tree.
            raise SpecError(f"root_id {spec.root_id!r} is not the workflow's id")
        cwd = spec.admitted_cwd(settings.allow_cwd)
    except (SpecError, ValueError, TypeError) as exc:
        # Nothing to run and nothing in the log: the workflow ends with the reason.
        host.say(f"refused a queued tree: {exc}")
        return {"error": f"not a tree this worker can start: {exc}"}
    try:
        existed = trio.from_thread.run(host.known, spec.root_id, trio_token=host.token)
    except BaseException as exc:
        # As for the tree's step: a stop of the worker records nothing in DBOS (the
        # workflow stays PENDING for a takeover); any other error as DBOS can keep it.
        if host.draining.is_set():
            _hold_forever()
        raise step_error(exc) from None
    if existed and not settings.allow_existing_root:
        host.say(f"refused tree {spec.root_id}: the log holds it already")
        return {
            "error": f"not a tree this worker can start: the log holds {spec.root_id} "
            "already, and this worker does not take over trees it was not given "
            "(fanfold worker --allow-existing-root)"
        }
    return {"cwd": cwd, "existed": existed}


@DBOS.step(name=STEP)
def run_to_rest_step(data: dict[str, Any]) -> dict[str, Any]:
    """The whole tree as one step, run in the worker's Trio runtime, once admitted."""
    host = _HOST
    if host is None or host.draining.is_set():
        _hold_forever()
        raise AssertionError("unreachable")  # _hold_forever never returns
    spec = TreeSpec.from_input(data)
    try:
        # Checked again, not taken from the admission's record: a record in the system
        # database is only as good as whoever could write there.
        cwd = spec.admitted_cwd((host.settings or WorkerSettings("", "", "")).allow_cwd)
    except SpecError as exc:
        host.say(f"refused tree {spec.root_id}: {exc}")
        return {"error": f"not a tree this worker can start: {exc}"}
    return _in_runtime(host, host.run_to_rest, attrs.evolve(spec, cwd=cwd))


def _in_runtime(
    host: _Host,
    body: Callable[[Any], Awaitable[dict[str, Any]]],
    arg: Any,
    cannot_run: tuple[type[Exception], ...] = (),
) -> dict[str, Any]:
    """``body(arg)`` in the worker's Trio runtime, from a workflow's thread. An error of
    ``cannot_run`` ends the workflow with its reason; a stop of the worker holds the
    thread (nothing recorded in DBOS: the workflow stays PENDING for a takeover); any
    other error is raised as DBOS can keep it (``step_error``)."""
    try:
        out: dict[str, Any] = trio.from_thread.run(body, arg, trio_token=host.token)
    except cannot_run as exc:
        return {"error": f"cannot run here: {exc}"}
    except BaseException as exc:
        if host.draining.is_set():
            _hold_forever()
        raise step_error(exc) from None
    return out


@DBOS.workflow(name=WORKFLOW)
def tree_workflow(data: dict[str, Any]) -> dict[str, Any]:
    """A tree per workflow (workflow id = the tree's root id): admitted, then run."""
    admitted = admit_step(data)
    if "error" in admitted:
        return admitted
    return run_to_rest_step(data)


@DBOS.step(name=WAKE_STEP)
def wake_step(data: dict[str, Any]) -> dict[str, Any]:
    """A tree let go while it waited for people, taken back and run as one step."""
    host = _HOST
    if host is None or host.draining.is_set():
        _hold_forever()
        raise AssertionError("unreachable")  # _hold_forever never returns
    try:
        named = wake_from_input(data)
        if wake_id(*named) != DBOS.workflow_id:
            raise SpecError(f"the wake of {named} is not the workflow {DBOS.workflow_id!r}")
    except SpecError as exc:
        return {"error": f"not a wake this worker can run: {exc}"}
    # Only a tree a worker let go (a row of fanfold.waiting_trees in that generation)
    # is resumed: a queue writer naming another tree finds no row (``_run_woken``).
    return _in_runtime(host, host.wake, named)


@DBOS.workflow(name=WAKE_WORKFLOW)
def wake_workflow(data: dict[str, Any]) -> dict[str, Any]:
    """A waiting tree taken back (workflow id ``wake:ROOT:GENERATION``)."""
    return wake_step(data)


@DBOS.step(name=CHUNK_STEP)
def run_chunk_step(data: dict[str, Any]) -> dict[str, Any]:
    """A chunk of placed children as one step, run in the worker's Trio runtime."""
    host = _HOST
    if host is None or host.draining.is_set():
        _hold_forever()
        raise AssertionError("unreachable")  # _hold_forever never returns
    try:
        chunk = chunk_from_input(data)
    except SpecError as exc:
        return {"error": f"not a chunk this worker can run: {exc}"}
    # Nothing of a chunk that cannot run here runs: its workflow ends with the reason,
    # and the parent's runtime takes the chunk back (``Placement.take_back``).
    return _in_runtime(
        host, host.run_chunk, chunk, (PlacementError, UntrustedTree, MissingTools, CodecError)
    )


@DBOS.workflow(name=CHUNK_WORKFLOW)
def chunk_workflow(data: dict[str, Any]) -> dict[str, Any]:
    """A chunk of a fan-out's children per workflow (workflow id = the chunk's id)."""
    return run_chunk_step(data)


class DbosPlacer:
    """Puts chunks on the chunks' queue with a DBOS client (its own connections, and
    no workflow context: a chunk is a workflow of its own, not a child of the tree's)."""

    def __init__(self, system_url: str) -> None:
        self._url = system_url
        self._client: Any = None
        self._lock = threading.Lock()

    def enqueue(self, chunks: Sequence[tuple[str, str]]) -> None:
        """Enqueue each chunk under its id; DBOS keeps one workflow per id, so a chunk
        enqueued again (after a restart) is the one already there."""
        with self._lock:
            if self._client is None:
                self._client = DBOSClient(
                    system_database_url=self._url, application_name=APP_NAME, serializer=SERIALIZER
                )
            for chunk, _root in chunks:
                options: EnqueueOptions = {
                    "workflow_name": CHUNK_WORKFLOW,
                    "queue_name": CHUNK_QUEUE,
                    "workflow_id": chunk,
                    "app_version": APP_VERSION,
                }
                try:
                    self._client.enqueue(options, chunk_input(chunk))
                except Exception as exc:
                    # (The placement logs it and tries again: never with the password
                    # the URL may hold.)
                    raise PlacementError(without_password(str(exc), self._url)) from None

    def ended(self, chunks: Sequence[str]) -> list[str]:
        """The chunks among ``chunks`` whose workflow ended (any end: a chunk that
        could not run here ends in success with the reason as its output)."""
        with self._lock:
            if self._client is None:
                self._client = DBOSClient(
                    system_database_url=self._url, application_name=APP_NAME, serializer=SERIALIZER
                )
            try:
                found = self._client.list_workflows(
                    workflow_ids=list(chunks),
                    status=["SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"],
                    load_input=False,
                    load_output=False,
                )
            except Exception as exc:
                raise PlacementError(without_password(str(exc), self._url)) from None
            return [status.workflow_id for status in found]

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                with contextlib.suppress(Exception):
                    self._client.destroy()
                self._client = None


class Waker:
    """Enqueues the wake of each waiting tree that has a decision written or a timer
    due (``parking.py``), with a DBOS client of its own. Every worker runs one; DBOS
    keeps one workflow per id, so two wakes of a generation are one."""

    def __init__(self, system_url: str) -> None:
        self._url = system_url
        self._client: Any = None
        self._sent: set[tuple[str, int]] = set()

    def run_once(self, parking: Parking, decisions: Any) -> list[WaitingTree]:
        """Look at the waiting trees once; enqueue and return those to wake."""
        rows = parking.waiting()
        present = {(t.root_id, t.generation) for t in rows}
        self._sent &= present  # a generation ended or woken elsewhere: forgotten
        trees = [t for t in rows if (t.root_id, t.generation) not in self._sent]
        if not trees:
            return []
        decided = {d.request for d in decisions.new([r for t in trees for r in t.requests])}
        woken = due(trees, decided)
        if woken and self._client is None:
            self._client = DBOSClient(
                system_database_url=self._url, application_name=APP_NAME, serializer=SERIALIZER
            )
        for tree in woken:
            options: EnqueueOptions = {
                "workflow_name": WAKE_WORKFLOW,
                "queue_name": QUEUE,
                "workflow_id": wake_id(tree.root_id, tree.generation),
                "app_version": APP_VERSION,
            }
            self._client.enqueue(options, wake_input(tree.root_id, tree.generation))
            self._sent.add((tree.root_id, tree.generation))
        return woken

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.destroy()
            self._client = None


async def _keep_waking(
    host: _Host, parking: Parking, waker: Waker, every: float, say: Callable[[str], None]
) -> None:
    """Every ``every`` seconds, wake the waiting trees whose decision or timer came."""
    told = False
    while True:
        await trio.sleep(every)
        try:
            woken = await trio.to_thread.run_sync(waker.run_once, parking, host.runtime.decisions)
        except Exception as exc:  # the queue's database or the log away: next time
            if not told:
                say(f"cannot look at the waiting trees now ({type(exc).__name__})")
                told = True
            continue
        told = False
        for tree in woken:
            say(f"tree {tree.root_id}: a decision or a timer came; queued to go on")


def wake_every(poll: float) -> float:
    """Seconds between two looks at the waiting trees: five queue polls, within
    0.25 s and 2 s (a decision reaches a waiting tree within that and a dequeue)."""
    return min(max(poll * 5, 0.25), 2.0)


def _hold_forever() -> None:
    # The worker is stopping: this thread must neither run a tree nor let DBOS record
    # an outcome for it. It waits until the process exits (``serve`` ends with
    # ``os._exit``); the workflow stays PENDING on this executor for a takeover.
    threading.Event().wait()


def _launch_dbos(settings: WorkerSettings) -> None:
    config: DBOSConfig = {
        "name": APP_NAME,
        "system_database_url": settings.system_url,
        "executor_id": settings.executor_id,
        "application_version": APP_VERSION,
        "log_level": "WARNING",
        "notification_listener_polling_interval_sec": settings.poll,
        # JSON in and out; a pickled row is refused, never unpickled (serialization.py).
        "serializer": SERIALIZER,
    }
    refuse_pickle()
    why = check_pickle_refused()
    if why is not None:
        raise RuntimeError(
            f"this DBOS release would unpickle what a queue writer wrote ({why}): the "
            "worker does not start"
        )
    DBOS(config=config)
    DBOS.launch()
    # Queues are rows of the system database in DBOS 3: registered once it is up.
    DBOS.register_queue(
        QUEUE, worker_concurrency=settings.concurrency, polling_interval_sec=settings.poll
    )
    DBOS.register_queue(
        CHUNK_QUEUE,
        worker_concurrency=settings.chunk_concurrency,
        polling_interval_sec=settings.poll,
    )


def _take_over(leases: Leases, dead: str, say: Callable[[str], None]) -> int:
    """Re-enqueue a dead worker's PENDING workflows, then forget its row."""
    pending = DBOS.list_workflows(
        status="PENDING", executor_id=dead, load_input=False, load_output=False
    )
    for status in pending:
        # Back onto its queue (the trees' or the chunks'): DBOS's default is its
        # internal queue, which has no per-worker cap, so a worker taking over could
        # hold more than --concurrency trees.
        queue = CHUNK_QUEUE if status.name == CHUNK_WORKFLOW else QUEUE
        DBOS.resume_workflow(status.workflow_id, queue_name=queue)
    leases.forget(dead)
    say(f"took over {len(pending)} tree(s) or chunk(s) of worker {dead} (its lease expired)")
    return len(pending)


async def _keep_lease(
    leases: Leases,
    locks: TreeLocks,
    settings: WorkerSettings,
    say: Callable[[str], None],
    lost: trio.Event,
    launched: trio.Event,
) -> None:
    """Renew this worker's lease, and once DBOS is up (``launched``) take over expired
    ones; set ``lost`` if this worker's own lease was claimed by another (it was taken
    for dead)."""
    told = False
    while True:
        try:
            if not await trio.to_thread.run_sync(leases.renew):
                say("this worker's lease was taken over by another worker: stopping")
                lost.set()
                return
            if not await trio.to_thread.run_sync(locks.still_held):
                say("a tree it held is another worker's since its lock connection was lost")
                lost.set()
                return
            expired = (
                await trio.to_thread.run_sync(leases.claim_expired) if launched.is_set() else []
            )
            for dead in expired:
                await trio.to_thread.run_sync(_take_over, leases, dead, say)
        except Exception as exc:
            # PostgreSQL unreachable for now (a restart, a network cut): tried again at
            # once and often, not a third of the lease later. Two renewals cut short in
            # a row put the next at the very end of the lease, where a worker looking
            # for expired leases took this one for dead (issue 32: a healthy worker
            # pushed out by a 3 s restart, exit 3). Nobody can claim the lease while
            # the server is away, so the first renewal that reaches it wins.
            if not told:
                say(f"lease renewal failed ({type(exc).__name__}); retrying")
                told = True
            await trio.sleep(min(settings.lease / 3, RENEW_RETRY))
            continue
        if told:
            say("lease renewed again")
            told = False
        await trio.sleep(settings.lease / 3)


async def serve(
    stop: tuple[int, ...],
    settings: WorkerSettings,
    open_runtime: Callable[[], Any],
    make_limits: Callable[[TreeSpec], Limits],
    agents_for: Callable[[str], tuple[AgentDefinition, ...]],
    system_prompt: str,
    say: Callable[[str], None],
    ready: Callable[[], None],
    before_close: Callable[[], Awaitable[None]] | None = None,
) -> int:
    """Run the worker until a stop signal or a lost lease; returns the exit code.

    ``open_runtime()`` is the runtime's async context manager (the CLI's choice of
    log, provider and tools). The caller must end the process with ``os._exit`` after
    this returns: workflow threads of a stopped worker are held for ever (see
    ``_hold_forever``) and DBOS's executor would otherwise wait for them.
    """
    global _HOST
    leases = Leases(settings.system_url, settings.executor_id, settings.lease)
    locks = TreeLocks(settings.system_url)
    parking = Parking(settings.system_url)
    waker = Waker(settings.system_url)
    await trio.to_thread.run_sync(leases.register, os.getpid())
    lost = trio.Event()
    code = EXIT_DRAINED
    with trio.open_signal_receiver(*stop) if stop else _no_receiver() as signals:
        try:
            async with open_runtime() as runtime:
                # Opening the runtime can take longer than a lease: the worker's MCP
                # servers start there (up to their startup_timeout), and a lease that
                # ran out meanwhile was claimed by a running worker, which made this one
                # stop at its first renewal (exit 3). So the lease is taken afresh now.
                # Safe: DBOS is not launched yet, so this executor owns no workflow a
                # claimer could have re-enqueued, and the upsert clears a claim (the
                # claimer's delete then matches nothing).
                await trio.to_thread.run_sync(leases.register, os.getpid())
                host = _Host(
                    runtime, trio.lowlevel.current_trio_token(), make_limits, agents_for,
                    system_prompt, say, locks, settings, parking,
                )  # fmt: skip
                _HOST = host
                placer: DbosPlacer | None = None
                if isinstance(runtime.store, PostgresStore):
                    # Big fan-outs spread over the workers (placement.py); a file log
                    # has no claims per chunk, so its trees run whole where they run.
                    placer = DbosPlacer(settings.system_url)
                    runtime.use_placement(
                        placer,
                        PlacementSettings(
                            spread_at=settings.spread_at, chunk=settings.chunk, poll=settings.poll
                        ),
                    )
                try:
                    async with trio.open_nursery() as nursery:
                        # The lease is renewed from before DBOS launches: a launch takes
                        # seconds under load, longer than a short lease, and a worker whose
                        # lease ran out while it started would be taken for dead.
                        launched = trio.Event()
                        nursery.start_soon(
                            _keep_lease, leases, locks, settings, say, lost, launched
                        )

                        async def on_signal() -> None:
                            async for signum in signals:
                                say(f"signal {signum}: draining (this worker's trees go to others)")
                                nursery.cancel_scope.cancel()
                                return

                        nursery.start_soon(on_signal)
                        await trio.to_thread.run_sync(_launch_dbos, settings)
                        launched.set()
                        nursery.start_soon(
                            _keep_waking, host, parking, waker, wake_every(settings.poll), say
                        )
                        ready()
                        await lost.wait()
                        nursery.cancel_scope.cancel()
                    code = EXIT_LEASE_LOST if lost.is_set() else EXIT_DRAINED
                finally:
                    host.draining.set()
                    # No more dequeues before the runtime goes: a tree taken now would be
                    # held, never run (it stays PENDING for the takeover all the same).
                    await trio.to_thread.run_sync(
                        lambda: DBOS.destroy(workflow_completion_timeout_sec=0)
                    )
                    if before_close is not None:
                        await before_close()
                    if placer is not None:
                        await trio.to_thread.run_sync(placer.close)
                    await trio.to_thread.run_sync(waker.close)
                    await trio.to_thread.run_sync(parking.close)
        finally:
            # The runtime is closed (also when the worker stopped on an error, which
            # used to skip this: its lease row then stayed as the claimer left it):
            # its trees stopped at a step boundary, the log's lock released. Now
            # others may take them: their locks go, then the lease ends.
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(locks.close)
                # Also when the lease was lost: trees this worker dequeued after another
                # claimed its lease would otherwise be PENDING on an executor nobody
                # claims.
                try:
                    await trio.to_thread.run_sync(leases.release)
                except Exception as exc:
                    say(f"could not end the lease ({type(exc).__name__}); it expires by itself")
                await trio.to_thread.run_sync(leases.close)
    return code


class _no_receiver:
    """A signal receiver that never fires (no stop signals on this platform)."""

    def __enter__(self) -> Any:
        return _never()

    def __exit__(self, *_: object) -> None:
        return None


async def _never() -> Any:
    await trio.sleep_forever()
    yield 0  # pragma: no cover


def flush_and_exit(code: int, streams: Sequence[Any] = (sys.stdout, sys.stderr)) -> None:
    """End the process now (see ``serve``): flush what was printed, then ``os._exit``."""
    for stream in streams:
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
