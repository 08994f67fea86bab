"""The Runtime: run conversation trees over Trio, with every step in the SQLite log."""

from __future__ import annotations

import contextvars
import gc
import os
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import attrs
import trio

from fanfold.db import ConversationRow, DatabaseError, Step, Store, UnknownConversation
from fanfold.db.codec import clear_memo
from fanfold.db.fingerprint import clear_cache as clear_fingerprint_cache
from fanfold.db.provenance import Origin, TreeRecord, UntrustedTree, UserKey, refusal
from fanfold.providers.base import Provider, StreamProgress
from fanfold.providers.description import ProviderDescription
from fanfold.runtime.actor import Actor
from fanfold.runtime.calls import Calls
from fanfold.runtime.engine import Engine
from fanfold.runtime.host import StepObserver
from fanfold.runtime.logging import flush as flush_log_lines
from fanfold.runtime.logging import library_logger
from fanfold.runtime.presence import DatabaseInUse, Presence
from fanfold.runtime.timers import Timers
from fanfold.runtime.writer import LogWriter
from fanfold.statemachine import (
    SUB_AGENT_PROMPT,
    CancelReason,
    CancelRequested,
    Conversation,
    ConversationCreated,
    Effect,
    Event,
    ForkEdited,
    Limits,
    RuntimeResumed,
    SpawnSubAgent,
    SubAgentFinished,
    ToolCall,
    ToolResult,
    UserMessaged,
    spawn_order,
    start,
)
from fanfold.statemachine.agent_defs import AgentDefinition, with_reading_tools
from fanfold.statemachine.delegation import capped_limits, child_setup
from fanfold.statemachine.permissions import MCP_PREFIX
from fanfold.tools.base import AnswersInProcess, ToolRunner
from fanfold.tools.paths import inspect_workdir, outside_project
from fanfold.tools.registry import ToolSet
from fanfold.tools.secrets import NO_REDACTION, EnvPolicy
from fanfold.tools.tool import Tool

# Snapshots: a conversation's full state is stored whenever it comes to rest, and
# otherwise once the events logged since its last snapshot take more bytes than that
# snapshot did (see Actor). Recovery reads the snapshot and folds the events after
# it: never more than about twice the work of reading one snapshot, and the bytes of
# snapshots written never exceed the bytes of events logged. (A parent with a
# thousand children has snapshots of hundreds of KB: a fixed "every K steps" writes
# that many times over while its children report.)

_INFO = 20  # logging.INFO
_DEBUG = 10  # logging.DEBUG

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

# The thresholds before the first "tuned" runtime opened, and how many are open: the
# last to close restores them (runtimes may be open at once, nested or side by side).
_gc_saved: tuple[int, int, int] | None = None
_gc_open = 0
_gc_frozen = False


def _tune_collector() -> None:
    global _gc_saved, _gc_open, _gc_frozen
    if _gc_open == 0:
        _gc_saved = gc.get_threshold()
        gc.set_threshold(GC_TUNED_THRESHOLD, *_gc_saved[1:])
    _gc_open += 1
    if not _gc_frozen:
        # Once per process: what is alive at the first open (imported modules, the
        # configuration, the tool registry) lives as long as the process; moving it to
        # the permanent generation spares every full collection a scan of it.
        _gc_frozen = True
        gc.collect()
        gc.freeze()


def _untune_collector() -> None:
    global _gc_saved, _gc_open
    _gc_open -= 1
    if _gc_open == 0 and _gc_saved is not None:
        gc.set_threshold(*_gc_saved)
        _gc_saved = None


Observer = Callable[[Conversation, Conversation, Event, tuple[Effect, ...]], None]


# SQLite result codes of a failing environment rather than a damaged log: they stop
# ``resume`` instead of skipping a tree (busy, locked, I/O error, disk full, read-only).
_ENVIRONMENT_CODES = frozenset({5, 6, 8, 10, 13})


def _environment_failure(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and (code & 0xFF) in _ENVIRONMENT_CODES


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class NotRunning(LookupError):
    """The conversation exists but is not loaded in this runtime."""


class NotAtRest(ValueError):
    """The conversation has work in flight; ``resume()`` it instead of attaching."""


@attrs.frozen
class TurnResult:
    """How a root's turn or a sub-agent's life ended."""

    conversation_id: str
    outcome: str
    text: str
    phase: str


@attrs.frozen
class SkippedTree:
    """An unfinished tree ``resume`` leaves alone, and why (see ``fanfold.db.provenance``)."""

    root_id: str
    reason: str


@attrs.frozen
class ResumePlan:
    """The unfinished trees of the log: the roots ``resume`` continues, and the trees it
    skips (imported, copied, edited or unmarked: inert records)."""

    roots: tuple[str, ...]
    skipped: tuple[SkippedTree, ...]


@attrs.frozen
class TreeNode:
    """One conversation of a tree with its children, for displays."""

    state: Conversation
    children: tuple[TreeNode, ...]


def _runner(tools: ToolRunner | Iterable[Tool | Callable[..., Any]]) -> ToolRunner:
    """``tools`` as a runner: a list of tools and functions becomes a ``ToolSet``."""
    if hasattr(tools, "specs") and hasattr(tools, "run"):
        return cast(ToolRunner, tools)
    return ToolSet(tools)


def resume_plan(store: Store, key: UserKey) -> ResumePlan:
    """Which unfinished trees of ``store`` a runtime holding ``key`` may continue, and
    which it must skip, and why.

    A tree is continued only if its provenance mark verifies with this user's key:
    every other one (imported, copied from another user or machine, edited, or
    written before marks existed) is an inert record, since resuming it would run
    whatever its log says is in flight (a bash command, say) with no model involved.
    """
    roots: list[str] = []
    skipped: list[SkippedTree] = []
    for root_id in dict.fromkeys(row.root_id for row in store.unfinished()):
        reason = refusal(store.tree_record(root_id), key, store.instance_id, root_id)
        if reason is None:
            roots.append(root_id)
        else:
            skipped.append(SkippedTree(root_id, reason))
    return ResumePlan(tuple(roots), tuple(skipped))


class Runtime:
    """Runs conversations. Open it with ``Runtime.open(...)`` as an async context manager.

    Every event is persisted (with the effects it produced) before any of those effects
    runs. A conversation that comes to rest (a root Idle or in Error, a sub-agent
    Completed or Failed) ends its own tasks and is unloaded: the runtime keeps in memory
    only the conversations with work in flight, and reads the others from the log
    (``state``, ``tree``, ``wait``) or loads them again (``send``). Closing the runtime
    cancels every task and leaves the log consistent, ready for ``resume()``.
    """

    def __init__(
        self,
        store: Store,
        provider: Provider,
        tools: ToolRunner,
        nursery: trio.Nursery,
        *,
        writer: LogWriter,
        limits: Limits,
        system_prompt: str,
        logger: Any,
        sub_agent_prompt: str | None = SUB_AGENT_PROMPT,
        observer: Observer | None,
        on_progress: Callable[[StreamProgress], None] | None,
        clock: Callable[[], float],
        step_observers: Sequence[StepObserver] = (),
        key: UserKey,
        provider_description: ProviderDescription | None = None,
        redact: Callable[[str], str] = NO_REDACTION,
    ) -> None:
        self.store = store
        self.key = key
        """This user's provenance key: trees this runtime writes are marked with it,
        and only trees whose mark verifies with it are continued."""
        self.provider_description = provider_description
        """What ``provider`` is, recorded on every tree this runtime starts, sends to
        or resumes (None: nothing recorded)."""
        self.provider = provider
        self.tools = tools
        self.writer = writer
        self.engine = Engine(writer, flush_log_lines)
        """Folds, commits and starts the effects of every ready conversation."""
        self.limits = limits
        self.system_prompt = system_prompt
        self.sub_agent_prompt = sub_agent_prompt
        self.logger = logger
        self.on_progress = on_progress
        self.redact = redact
        """Applied to tool output and model text before they become logged events."""
        enabled = getattr(self.logger.bind(), "is_enabled_for", None)
        self.logs_transitions = True if enabled is None else bool(enabled(_DEBUG))
        """Whether the logger takes debug lines (one ``transition`` line per step)."""
        self.logs_lifecycle = True if enabled is None else bool(enabled(_INFO))
        """Whether the logger takes info lines: lifecycle (a conversation started, came
        to rest, failed) and one line per model call and per tool call."""
        self._observer = observer
        self.step_observers = tuple(step_observers)
        """Told of every step once it is committed (see ``StepObserver``)."""
        self._clock = clock
        self._nursery = nursery
        self.calls = Calls(nursery.start_soon)
        """The calls in flight, on a pool of worker tasks (``calls.py``)."""
        self.timers = Timers()
        self._actors: dict[str, Actor] = {}  # conversations loaded: work in flight
        self._project_cwds: dict[str, str] = {}  # root id -> its cwd (it never changes)
        self._trusted: set[str] = set()  # roots whose provenance mark verified
        self._presence: Presence | None = None
        self.resume_damaged: tuple[SkippedTree, ...] = ()
        """The trees the last ``resume()`` skipped because their log cannot be rebuilt
        (each with the reason); they stay unfinished in the log, untouched."""

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        database: str | Path,
        provider: Provider,
        tools: ToolRunner | Iterable[Tool | Callable[..., Any]],
        *,
        limits: Limits | None = None,
        system_prompt: str = "",
        sub_agent_prompt: str | None = SUB_AGENT_PROMPT,
        logger: Any = None,
        observer: Observer | None = None,
        on_progress: Callable[[StreamProgress], None] | None = None,
        clock: Callable[[], float] = time.time,
        threaded_writes: bool | None = None,
        key: UserKey | None = None,
        provider_description: ProviderDescription | None = None,
        redact: Callable[[str], str] | None = None,
        gc_policy: str = "tuned",
        step_observers: Sequence[StepObserver] = (),
    ) -> AsyncIterator[Runtime]:
        """Open a runtime over the SQLite file ``database`` (":memory:" for a throwaway).

        Batches are written from a worker thread for files (the event loop keeps going
        while SQLite writes, or waits for another process's write lock; the disk syncs
        of WAL checkpoints happen in the store's own background thread), in the loop
        for ":memory:". ``threaded_writes=False`` forces the latter, which tests on
        Trio's autojump clock need: time must not jump while a write is in flight.

        ``tools`` is a tool runner (``ToolSet.default()``; ``ToolSet.default(extra=
        [...])`` adds tools beside the built-ins), or a list of tools and functions
        (``@fanfold.tool``; plain functions are made tools as it would) offered
        instead of the built-ins. Their specs are recorded in each root's creation
        event, so replay needs none of them.

        ``key`` is this user's provenance key (default: ``UserKey.load()``, the key
        file in the user's fanfold data directory, created on first use);
        ``provider_description`` says what ``provider`` is, for ``fanfold resume`` to
        rebuild it (see ``fanfold.providers.description``).
        ``redact`` is applied to tool output and model text before they are logged;
        by default it removes the values of this process's secret-looking environment
        variables (:class:`~fanfold.tools.secrets.EnvPolicy`).

        ``system_prompt`` is the root conversations' system prompt;
        ``sub_agent_prompt`` the one every sub-agent below them gets (default
        ``SUB_AGENT_PROMPT``: its role, and to finish with ``submit_result`` or
        ``submit_error``; None: sub-agents get their parent's system prompt). Both are
        recorded in the root's creation event, so replay shows what each model was told.

        ``step_observers`` are told of every step once it is committed, with its
        logged time (``StepObserver``): ``fanfold.otel.SpanObserver`` makes live
        OpenTelemetry spans of them. ``observer`` is the older, simpler hook: the state
        before and after, the event and its effects.

        ``gc_policy`` is the collector policy while the runtime is open (DESIGN.md,
        "Memory and the collector"): "tuned" (the default) freezes the objects alive
        at the first open (modules, configuration: never collected again, no longer
        scanned) and raises the first generation's threshold to
        ``GC_TUNED_THRESHOLD``, restoring the previous thresholds when the last open
        runtime closes; "untouched" leaves the collector as the application set it.
        """
        if gc_policy not in GC_POLICIES:
            raise ValueError(f"gc_policy must be one of {GC_POLICIES}, not {gc_policy!r}")
        runner = _runner(tools)
        key = key if key is not None else UserKey.load()
        memory = str(database) == ":memory:"
        store = Store.memory() if memory else Store.open(database)
        presence = None
        tuned = gc_policy == "tuned"
        if tuned:
            _tune_collector()
        try:
            presence = None if memory else Presence(database)
            threaded = not memory if threaded_writes is None else threaded_writes
            writer = LogWriter(store.append, threaded=threaded)
            async with trio.open_nursery() as nursery:
                runtime = cls(
                    store,
                    provider,
                    runner,
                    nursery,
                    writer=writer,
                    limits=limits or Limits(),
                    system_prompt=system_prompt,
                    sub_agent_prompt=sub_agent_prompt,
                    logger=logger if logger is not None else library_logger(),
                    observer=observer,
                    on_progress=on_progress,
                    clock=clock,
                    key=key,
                    provider_description=provider_description,
                    redact=redact if redact is not None else EnvPolicy().redactor(os.environ),
                    step_observers=step_observers,
                )
                runtime._presence = presence
                nursery.start_soon(runtime.engine.run)
                nursery.start_soon(runtime.timers.run)
                try:
                    yield runtime
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            flush_log_lines()
            if tuned:
                _untune_collector()
            if presence is not None:
                presence.close()
            store.close()
            # The codec memoises the text of the messages it encoded by identity, for
            # as long as it has room: once the runtime is closed, its conversations'
            # entries only keep dead objects alive (and make every full garbage
            # collection slower). Likewise the fingerprint's kept history digests.
            clear_memo()
            clear_fingerprint_cache()

    # ---------------------------------------------------------------- public API

    async def start(
        self,
        text: str,
        *,
        cwd: str | Path = ".",
        limits: Limits | None = None,
        model: str | None = None,
        system_prompt: str | None = None,
        agents: tuple[AgentDefinition, ...] = (),
        agent: AgentDefinition | None = None,
    ) -> str:
        """Start a root conversation with its first user message; returns its id.

        ``agents``: the agent definitions its ``spawn_agents`` tasks may name
        (``fanfold.agents.load_agents``), recorded in its creation event.
        ``agent``: a definition the root itself runs as (``fanfold mcp``'s
        ``delegate_task``): its prompt, rules, model and caps apply to the root as they
        would to a sub-agent spawned as it (``delegation.child_setup``).
        Returns once the message is in the log; use ``wait`` for the answer.
        """
        conversation_id = uuid.uuid4().hex[:12]
        resolved = str(Path(cwd).resolve())
        # ``read-only`` takes an MCP tool only where its server marks it read-only: the
        # definitions are widened with those names here, as recorded data.
        reading = self._reading_mcp_tools()
        agents = with_reading_tools(agents, reading)
        if agent is not None:
            (agent,) = with_reading_tools((agent,), reading)
        prompt = self.system_prompt if system_prompt is None else system_prompt
        chosen = limits or self.limits
        tools = self.tools.specs()
        permissions = None
        if agent is not None:
            setup = child_setup(
                agent,
                parent_permissions=None,
                parent_agents=agents,
                tools=tools,
                default_prompt=prompt,
                limits=chosen,
                depth=0,
                cwd=resolved,
            )
            tools, prompt, chosen = setup.tools, setup.system_prompt, setup.limits
            permissions, agents = setup.permissions, setup.agents
            # The definition caps the rounds as it caps a spawned child's (one rule, the
            # reducer's). A root has no time limit of its own: the definition's
            # ``timeout`` is not applied here (see DESIGN.md, "fanfold mcp").
            _, rounds = capped_limits(agent, None, chosen.max_rounds)
            chosen = attrs.evolve(chosen, max_rounds=rounds)
            model = model if model is not None else agent.model
        created = ConversationCreated(
            conversation_id=conversation_id,
            cwd=resolved,
            task=text,
            system_prompt=prompt,
            model=model,
            limits=chosen,
            tools=tools,
            sub_agent_prompt=self.sub_agent_prompt,
            agents=agents,
            agent=agent.name if agent is not None else None,
            permissions=permissions,
        )
        tree = TreeRecord(
            conversation_id,
            Origin.RUNTIME,
            mark=self.key.mark(self.store.instance_id, conversation_id),
            provider=self._description_json(),
        )
        self._trusted.add(conversation_id)
        actor = self._create(created, user_initiated=True, tree=tree)
        await actor.submit(UserMessaged(text))
        return conversation_id

    def _idempotent_tools(self) -> tuple[str, ...]:
        """The tools the tool runner says may be called twice (``ToolSet.idempotent``)."""
        idempotent = getattr(self.tools, "idempotent", None)
        if idempotent is None:
            return ()
        return tuple(sorted(s.name for s in self.tools.specs() if idempotent(s.name)))

    def _reading_mcp_tools(self) -> tuple[str, ...]:
        """The MCP tools (``mcp__...``) the tool runner says are read-only."""
        read_only = getattr(self.tools, "read_only", None)
        if read_only is None:
            return ()
        return tuple(
            spec.name
            for spec in self.tools.specs()
            if spec.name.startswith(MCP_PREFIX) and read_only(spec.name)
        )

    async def send(self, conversation_id: str, text: str) -> None:
        """Send a further user message to an idle (or errored) root conversation.

        A conversation not loaded (at rest, from this process or an earlier one, or a
        fork) is attached first. Raises IllegalTransition (nothing recorded) if the
        conversation is busy or is a sub-agent, UntrustedTree if its tree was not
        written by this runtime (see ``attach``). The runtime's provider description
        is recorded as the one the tree now runs on.
        """
        if conversation_id not in self._actors:
            self.attach(conversation_id)
        actor = self._actor(conversation_id)
        description = self._description_json()
        if description is not None and actor.state.parent_id is None:
            record = self.store.tree_record(actor.state.root_id)
            if record is None or record.provider != description:
                self.store.record_provider(actor.state.root_id, description)
        await actor.submit(UserMessaged(text))

    def attach(self, conversation_id: str) -> None:
        """Load a stored conversation at rest so it can take new events here.

        Conversations with work in flight are resumed with ``resume()`` instead. One
        that is given nothing to do is unloaded again at once. Raises UntrustedTree if
        the tree's provenance mark does not verify with this user's key (imported,
        copied from elsewhere, edited, or older than marks): continuing it could run
        what someone else wrote into its log.
        """
        if conversation_id in self._actors:
            return
        row = self.store.conversation(conversation_id)
        self._require_trusted(row.root_id)
        if row.status == "running":
            raise NotAtRest(f"conversation {conversation_id!r} has work in flight: resume it")
        self._launch(
            Actor(self, self.store.load_state(conversation_id), row.last_seq, created=False)
        )

    async def cancel(self, conversation_id: str, reason: CancelReason = CancelReason.USER) -> None:
        """Ask a conversation to stop; its children are cancelled too.

        Returns once the request is in the log; ``wait`` returns when every child has
        acknowledged. A conversation at rest and not loaded has nothing to cancel: the
        call returns at once and records nothing. Raises UntrustedTree for a tree this
        runtime may not continue, at rest or not.
        """
        actor = self._actors.get(conversation_id)
        if actor is None:
            self._require_trusted(self.store.conversation(conversation_id).root_id)
            if self._at_rest_in_log(conversation_id):
                return
        await self._actor(conversation_id).submit(CancelRequested(reason))

    async def wait(self, conversation_id: str) -> TurnResult:
        """Wait until the conversation is at rest (Idle, Error, Completed or Failed).

        For a conversation at rest that is not loaded, the result is read from the log
        (its state, and the ``TurnFinished`` of its latest turn).
        """
        actor = self._actors.get(conversation_id)
        if actor is None and self._at_rest_in_log(conversation_id):
            state = self.store.load_state(conversation_id)
            turn = self.store.last_turn(conversation_id)
        else:
            actor = self._actor(conversation_id)
            await actor.wait_at_rest()
            state, turn = actor.state, actor.last_turn
        return TurnResult(
            conversation_id=conversation_id,
            outcome=turn.outcome if turn else "",
            text=turn.text if turn else "",
            phase=type(state.phase).__name__,
        )

    def state(self, conversation_id: str) -> Conversation:
        """The current state of a loaded conversation, else the stored one."""
        actor = self._actors.get(conversation_id)
        if actor is not None:
            return actor.state
        return self.store.load_state(conversation_id)

    def tree(self, conversation_id: str) -> TreeNode:
        """The conversation and its sub-agents, recursively."""
        state = self.state(conversation_id)
        kids = [row.id for row in self.store.children(conversation_id)]
        kids += [
            a.state.id
            for a in self._actors.values()
            if a.state.parent_id == conversation_id and a.state.id not in kids
        ]
        return TreeNode(state, tuple(self.tree(k) for k in sorted(kids, key=spawn_order)))

    def running(self) -> tuple[Conversation, ...]:
        """States of every conversation loaded in this runtime: those with work in
        flight (and, for a moment, those that just came to rest)."""
        return tuple(a.state for a in self._actors.values())

    def resume_plan(self) -> ResumePlan:
        """Which unfinished trees ``resume()`` continues and which it skips, and why
        (see the module-level ``resume_plan``)."""
        plan = resume_plan(self.store, self.key)
        self._trusted.update(plan.roots)
        return plan

    async def resume(
        self,
        roots: Sequence[str] | None = None,
        *,
        edits: Mapping[str, ForkEdited] | None = None,
    ) -> list[str]:
        """Resume the unfinished conversations of trees this runtime may continue
        (see ``resume_plan``); returns their ids. Skipped trees are logged
        (``resume_skipped``) and left as they are.

        ``roots`` limits it to those trees; naming one that may not be continued raises
        UntrustedTree. States are rebuilt from snapshots and events; each conversation
        then gets a RuntimeResumed event so the reducer re-issues what was in flight.
        Outcomes that finished children committed but their parents never accepted are
        re-delivered. The runtime's provider description, if any, is recorded as the
        one each resumed tree now runs on.

        A tree whose log cannot be rebuilt (undecodable or refused events, a damaged
        database page) is left as it is, logged (``resume_damaged``) and listed in
        ``resume_damaged`` with the reason; the other trees are resumed all the same.

        ``edits``: for a forked tree (``replay.fork``), the ``ForkEdited`` each named
        conversation gets instead of its RuntimeResumed: it goes on with the edit in
        place of what was in flight, and what the edit starts (an edited reply's tool
        calls) runs live. Each must name an unfinished conversation being resumed,
        else ValueError, before anything is resumed.

        Raises DatabaseInUse, and resumes nothing, while another runtime (in this
        process or another) has the database open: its unfinished conversations may be
        its live work rather than orphans of a crash.
        """
        if self._presence is not None and not self._presence.alone():
            raise DatabaseInUse(
                f"another fanfold runtime has {self.store.path} open (a run, send or resume "
                "still going?); resuming now would run its conversations twice. Resume "
                "once it has ended"
            )
        if roots is not None:
            for root_id in roots:
                self._require_trusted(root_id)
        plan = self.resume_plan()
        for skip in plan.skipped:
            self.logger.warning("resume_skipped", root_id=skip.root_id, reason=skip.reason)
        chosen = set(plan.roots if roots is None else roots)
        # Each tree is rebuilt on its own, and entirely before any of it runs: a tree
        # whose log cannot be read (a damaged row, a reducer that refuses an event) is
        # skipped and reported, and never stops the others (issue 10.2).
        by_root: dict[str, list[ConversationRow]] = {}
        for row in self.store.unfinished():
            if row.root_id in chosen and row.id not in self._actors:
                by_root.setdefault(row.root_id, []).append(row)
        loaded: list[tuple[ConversationRow, Conversation, dict[int, float]]] = []
        damaged: list[SkippedTree] = []
        for root_id, tree_rows in by_root.items():
            try:
                rebuilt = [
                    (row, self.store.load_state(row.id), self.store.timer_starts(row.id))
                    for row in tree_rows
                ]
            except (DatabaseError, sqlite3.DatabaseError) as exc:
                if _environment_failure(exc):
                    raise
                skip = SkippedTree(root_id, f"its log cannot be rebuilt: {_one_line(exc)}")
                self.logger.warning("resume_damaged", root_id=root_id, reason=skip.reason)
                damaged.append(skip)
                continue
            loaded += rebuilt
        self.resume_damaged = tuple(damaged)
        description = self._description_json()
        if description is not None:
            for root_id in dict.fromkeys(row.root_id for row, _, _ in loaded):
                self.store.record_provider(root_id, description)
        edits = dict(edits or {})
        unknown = sorted(set(edits) - {row.id for row, _, _ in loaded})
        if unknown:
            raise ValueError(
                f"cannot edit {unknown[0]!r}: it is not an unfinished conversation of a "
                "tree being resumed"
            )
        resumed = []
        context = contextvars.copy_context()  # one for all: they share call workers
        for row, state, started in loaded:
            self._launch(
                Actor(
                    self,
                    state,
                    row.last_seq,
                    created=False,
                    timers_started=started,
                    context=context,
                )
            )
            resumed.append(row.id)
        again = self._idempotent_tools()
        for conversation_id in resumed:
            self.deliver(conversation_id, edits.get(conversation_id) or RuntimeResumed(again))
        for conversation_id in resumed:
            self._redeliver_outcomes(self._actors[conversation_id].state)
        return resumed

    # ---------------------------------------------------------------- for actors and the engine

    @property
    def closing(self) -> bool:
        """True once the runtime is shutting down: no new effect may start."""
        return self._nursery.cancel_scope.cancel_called

    def now(self) -> float:
        """The runtime's clock (``time.time`` unless given): the ``at`` of every step."""
        return self._clock()

    def make_step(
        self,
        state: Conversation,
        seq: int,
        event: Event,
        effects: tuple[Effect, ...],
        *,
        user_initiated: bool = False,
        snapshot: bool = False,
    ) -> Step:
        """The step to log; with a snapshot if asked, at seq 0 and at rest."""
        snapshot = snapshot or seq == 0 or state.at_rest
        return Step(
            conversation_id=state.id,
            seq=seq,
            event=event,
            effects=effects,
            state=state,
            at=self._clock(),
            snapshot=snapshot,
            user_initiated=user_initiated,
        )

    def deliver_between(self, conversation_id: str, event: Event) -> None:
        """Deliver a message from one conversation to another (an outcome to a parent,
        a cancel to a child).

        After a restart only unfinished conversations are loaded. A message to one that
        is not loaded because it has ended (a child that finished before the restart,
        a parent that wrote a child off and ended) would be absorbed by its terminal or
        at-rest phase anyway: it is dropped, with a log line. A message to an unfinished
        conversation that is not loaded is a fanfold bug and raises NotRunning.
        """
        if conversation_id not in self._actors:
            try:
                row = self.store.conversation(conversation_id)
            except UnknownConversation:
                row = None
            if row is not None and row.status != "running":
                self.logger.info(
                    "delivery_dropped",
                    to=conversation_id,
                    event_type=type(event).__name__,
                    status=str(row.status),
                )
                return
        self.deliver(conversation_id, event)

    def deliver(self, conversation_id: str, event: Event) -> None:
        actor = self._actors.get(conversation_id)
        if actor is None:
            raise NotRunning(
                f"cannot deliver {type(event).__name__} to {conversation_id!r}: "
                "it is not running in this runtime"
            )
        actor.deliver(event)

    def spawn_child(
        self,
        effect: SpawnSubAgent,
        *,
        reissued: bool = False,
        context: contextvars.Context | None = None,
    ) -> None:
        """Create and start a child; an existing child is left alone (idempotent).

        ``reissued``: the effect was re-issued by ``RuntimeResumed``, so the child may
        exist already, loaded or only in the log (ended, or at rest). Every other
        ``SpawnSubAgent`` names a new child (ids come from the parent's spawn counter).
        A conversation is unloaded only once all its steps are committed, so the
        loaded ones and the log together hold every child ever created.

        Its creation carries what is really at its working directory (symbolic links
        followed): the reducer refuses one outside its parent's or the project.
        ``context``: its parent's (``contextvars``), which it shares (see ``calls.py``).
        """
        if effect.child_id in self._actors:
            return
        if reissued and self.store.exists(effect.child_id):
            return
        parent_cwd = self.state(effect.parent_id).cwd
        found = inspect_workdir(effect.cwd, parent_cwd, self.project_cwd(effect.root_id))
        self._create(effect.created_event(found), user_initiated=False, context=context)

    def project_cwd(self, root_id: str) -> str:
        """The working directory of the tree's root: the project no tool leaves."""
        cwd = self._project_cwds.get(root_id)
        if cwd is None:
            cwd = self._project_cwds[root_id] = self.state(root_id).cwd
        return cwd

    def tool_cwd_problem(self, state: Conversation, cwd: str) -> str | None:
        """Why no tool may run in ``cwd`` for ``state`` (see ``outside_project``)."""
        project = self.project_cwd(state.root_id)
        return None if cwd == project else outside_project(cwd, project)

    def answers_in_process(self, name: str) -> bool:
        """Whether the tool runner answers a call to ``name`` in-process (no I/O, no
        waiting: ``think``), so the call needs no task (``AnswersInProcess``)."""
        # Asked of ``tools`` as it is now (an application may swap the runner).
        in_process = getattr(self.tools, "in_process", None)
        return in_process is not None and in_process(name) is True

    def answer_tool(self, call: ToolCall, cwd: str, *, confined: bool) -> ToolResult:
        """The tool runner's in-process answer to ``call`` (see ``answers_in_process``);
        ``confined`` is passed on only when True, as ``run`` gets it."""
        answerer = cast(AnswersInProcess, self.tools)
        if confined:
            return answerer.answer(call, cwd, confined=True)
        return answerer.answer(call, cwd)

    def unloaded(self, conversation_id: str, actor: object) -> None:
        """The actor's conversation is settled (at rest, all committed, nothing
        queued) and its call and timers are stopped: forget it. The log holds its
        state."""
        if self._actors.get(conversation_id) is actor:
            del self._actors[conversation_id]
        # No more call workers than conversations that might call: none once at rest.
        self.calls.trim(len(self._actors))
        if not self._actors:
            # The codec's memo shares the text of values consecutive steps of loaded
            # conversations repeat; with none loaded it only keeps ended ones alive.
            clear_memo()

    def observe(
        self, before: Conversation, after: Conversation, event: Event, effects: tuple[Effect, ...]
    ) -> None:
        """Tell the ``observer`` given to ``open`` of a committed step."""
        if self._observer is not None:
            self._observer(before, after, event, effects)

    # ---------------------------------------------------------------- internals

    def _description_json(self) -> str | None:
        description = self.provider_description
        return None if description is None else description.to_json()

    def _refusal(self, root_id: str) -> str | None:
        """Why tree ``root_id`` may not be continued here (None: its mark verifies)."""
        if root_id in self._trusted:
            return None
        record = self.store.tree_record(root_id)
        reason = refusal(record, self.key, self.store.instance_id, root_id)
        if reason is None:
            self._trusted.add(root_id)
        return reason

    def _require_trusted(self, root_id: str) -> None:
        reason = self._refusal(root_id)
        if reason is not None:
            raise UntrustedTree(root_id, reason)

    def _at_rest_in_log(self, conversation_id: str) -> bool:
        """Whether the log has the conversation at rest (raises UnknownConversation)."""
        return self.store.conversation(conversation_id).status != "running"

    def _actor(self, conversation_id: str) -> Actor:
        actor = self._actors.get(conversation_id)
        if actor is None:
            # Raises UnknownConversation; and a tree that may not be continued says so.
            row = self.store.conversation(conversation_id)
            self._require_trusted(row.root_id)
            raise NotRunning(
                f"conversation {conversation_id!r} is not running in this runtime "
                "(resume() or attach() it)"
            )
        return actor

    def _create(
        self,
        created: ConversationCreated,
        *,
        user_initiated: bool,
        tree: TreeRecord | None = None,
        context: contextvars.Context | None = None,
    ) -> Actor:
        """Register a new conversation at once (so events can queue for it) and queue
        its creation step (with ``tree``, a root's provenance record, in the same
        transaction) for the writer, before anything else of it."""
        state, effects = start(created)
        actor = Actor(self, state, 0, created=True, context=context)
        self._actors[state.id] = actor
        first = self.make_step(state, 0, created, effects, user_initiated=user_initiated)
        if tree is not None:
            first = attrs.evolve(first, tree=tree)
        if self.logs_lifecycle:
            actor.log.info("conversation_started", root_id=state.root_id)
        self.observe(state, state, created, effects)
        actor.hand_over_first(first)
        return actor

    def _launch(self, actor: Actor) -> None:
        """Load a conversation from the log; one given nothing to do (an ``attach``
        that no event follows) is unloaded again in the engine's next round."""
        self._actors[actor.state.id] = actor
        self.engine.ready(actor)

    def _redeliver_outcomes(self, state: Conversation) -> None:
        children = state.children
        if children is None:
            return
        for pending in children.pending:
            child_id = pending.spec.id
            if not pending.started or child_id in self._actors:
                continue
            try:
                child = self.store.load_state(child_id)
            except UnknownConversation:
                continue  # never created: the re-issued SpawnSubAgent creates it
            # The outcome its NotifyParent carried (tokens included: a tree budget
            # must be charged for them).
            outcome = child.outcome
            if outcome is not None:
                self.deliver(state.id, SubAgentFinished(child_id, outcome))
