"""The Runtime: run conversation trees over Trio, with every step in the SQLite log."""

from __future__ import annotations

import contextvars
import heapq
import os
import re
import sqlite3
import time
import uuid
from collections.abc import (
    AsyncIterator,
    Callable,
    Iterable,
    Mapping,
    Sequence,
    Set,
)
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import attrs
import trio

from fanfold.db import (
    ConversationRow,
    DatabaseError,
    Step,
    Store,
    StoreClosed,
    StoredEvent,
    TreeTakenOver,
    UnknownConversation,
    claim_unit,
    is_postgres,
    open_store,
)
from fanfold.db.codec import clear_memo
from fanfold.db.fingerprint import clear_cache as clear_fingerprint_cache
from fanfold.db.provenance import Origin, TreeRecord, UntrustedTree, UserKey, refusal
from fanfold.providers.base import Provider, StreamProgress
from fanfold.providers.description import ProviderDescription
from fanfold.runtime import collector
from fanfold.runtime.actor import Actor, NotRunning
from fanfold.runtime.approvals import (
    Decisions,
    MemoryDecisions,
    PendingRequest,
    decisions_of,
    open_request,
)
from fanfold.runtime.calls import Calls, Gate
from fanfold.runtime.collector import GC_POLICIES as GC_POLICIES
from fanfold.runtime.collector import GC_TUNED_THRESHOLD as GC_TUNED_THRESHOLD
from fanfold.runtime.collector import GC_YOUNG_PER_CONVERSATION as GC_YOUNG_PER_CONVERSATION
from fanfold.runtime.deciding import Deciding
from fanfold.runtime.engine import Engine
from fanfold.runtime.host import StepObserver
from fanfold.runtime.logging import flush as flush_log_lines
from fanfold.runtime.logging import library_logger
from fanfold.runtime.placement import Placement, PlacementSettings, Placer
from fanfold.runtime.presence import DatabaseInUse, Held, Presence
from fanfold.runtime.progress_rows import ProgressRows
from fanfold.runtime.results import MessageTooLong as MessageTooLong
from fanfold.runtime.results import MissingTools as MissingTools
from fanfold.runtime.results import NotAtRest as NotAtRest
from fanfold.runtime.results import ParkedTree as ParkedTree
from fanfold.runtime.results import ResumePlan as ResumePlan
from fanfold.runtime.results import SkippedTree as SkippedTree
from fanfold.runtime.results import TreeNode as TreeNode
from fanfold.runtime.results import TreeStep as TreeStep
from fanfold.runtime.results import TurnResult as TurnResult
from fanfold.runtime.results import check_message, missing_reason
from fanfold.runtime.resuming import (
    clock_set_back,
    environment_failure,
    one_line,
    pending_edit,
    timer_starts,
    units_of,
)
from fanfold.runtime.resuming import resume_plan as resume_plan
from fanfold.runtime.timers import Timers
from fanfold.runtime.writer import LogWriter, TreeDropped
from fanfold.statemachine import (
    SUB_AGENT_PROMPT,
    WORDING,
    ApprovalDenied,
    ApprovalGranted,
    CancelReason,
    CancelRequested,
    Conversation,
    ConversationCreated,
    ConversationForked,
    Edit,
    Effect,
    Event,
    ForkEdited,
    IllegalTransition,
    Limits,
    RuntimeResumed,
    SpawnSubAgent,
    SubAgentFinished,
    ToolCall,
    ToolExecuting,
    ToolResult,
    ToolsChanged,
    UserAnswered,
    UserMessaged,
    spawn_order,
    start,
    transition,
)
from fanfold.statemachine.agent_defs import AgentDefinition, with_own_tools, without_scoped
from fanfold.statemachine.delegation import capped_limits, child_setup
from fanfold.statemachine.permissions import Permissions, RuleSet, parse_rule
from fanfold.statemachine.state import tree_path
from fanfold.tools.base import AnswersInProcess, ToolRunner
from fanfold.tools.paths import inspect_workdir, outside_project
from fanfold.tools.registry import ToolSet, unsupplied
from fanfold.tools.secrets import NO_REDACTION, EnvPolicy
from fanfold.tools.tool import Tool

# The ``X as X`` imports above keep names importable from this module as they were
# before they had modules of their own: the collector's policy (``collector``), the
# API's values and errors (``results``) and ``resume_plan`` (``resuming``).

# Snapshots: a conversation's full state is stored whenever it comes to rest, and
# otherwise once the events logged since its last snapshot take more bytes than that
# snapshot did (see Actor). Recovery reads the snapshot and folds the events after
# it: never more than about twice the work of reading one snapshot, and the bytes of
# snapshots written never exceed the bytes of events logged. (A parent with a
# thousand children has snapshots of hundreds of KB: a fixed "every K steps" writes
# that many times over while its children report.)

_INFO = 20  # logging.INFO
_DEBUG = 10  # logging.DEBUG

# A caller-chosen root id (``start(conversation_id=...)``): it names files nowhere, but
# is printed, typed back by users, and used as a DBOS workflow id.
_ID_SHAPE = re.compile(r"[A-Za-z0-9_-]{1,64}")

Observer = Callable[[Conversation, Conversation, Event, tuple[Effect, ...]], None]

EVENTS_PAGE = 512
"""The most steps ``Runtime.events`` reads from the log at once (see there)."""


class _Commits:
    """Tells the readers of the log that a batch was committed: one ``trio.Event``
    set and replaced per batch. Its cost to the engine is the same whatever the
    number of readers or how far behind they are: it holds no step for anyone."""

    def __init__(self) -> None:
        self.signal = trio.Event()
        self.closed = False
        self.store_closed = False

    def committed(self) -> None:
        self.signal.set()
        self.signal = trio.Event()

    def close(self) -> None:
        self.closed = True
        self.committed()


def _runner(tools: ToolRunner | Iterable[Tool | Callable[..., Any]]) -> ToolRunner:
    """``tools`` as a runner: a list of tools and functions becomes a ``ToolSet``."""
    if hasattr(tools, "specs") and hasattr(tools, "run"):
        return cast(ToolRunner, tools)
    return ToolSet(tools)


class Runtime(Deciding):
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
        writer.taken_over = self._taken_over
        self._commits = _Commits()
        self.engine = Engine(writer, flush_log_lines, self._commits.committed)
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
        self.timers = Timers()
        self.calls = Calls(nursery.start_soon, self.timers)
        """The calls in flight, on a pool of worker tasks or, for a provider that
        ``RepliesAtOnce``, on the timers (``calls.py``)."""
        at_once = getattr(provider, "calls_at_once", None)
        self.model_call_gate: Gate | None = (
            Gate(at_once) if isinstance(at_once, int) and at_once > 0 else None
        )
        """For a provider that ``LimitsCallsAtOnce``: its model calls past the limit
        wait as data in this gate's queue, not in a task each (``calls.py``)."""
        self._actors: dict[str, Actor] = {}  # conversations loaded: work in flight
        self._project_cwds: dict[str, str] = {}  # root id -> its cwd (it never changes)
        self._trusted: set[str] = set()  # roots whose provenance mark verified
        self._tools_supplied: set[tuple[str, tuple[str, ...]]] = set()  # (root, tools)
        # Trees (claim units) another runtime took over, which this one dropped, until
        # it claims one again (``resume``, ``attach``).
        self._dropped: dict[str, TreeTakenOver] = {}
        self._presence: Held | None = None
        self._gc_tuned = False  # the collector's threshold follows what is loaded
        self._gc_counted = 0  # conversations loaded, as counted in the threshold
        self.placement: Placement | None = None
        """Where big fan-outs' children run (``use_placement``); None: here."""
        self.resume_damaged: tuple[SkippedTree, ...] = ()
        """The trees the last ``resume()`` skipped because their log cannot be rebuilt
        (each with the reason); they stay unfinished in the log, untouched."""
        self.progress_rows = ProgressRows(
            store, self._actors.__contains__, logger, clock, nursery.start_soon
        )
        """Copies the latest progress of this runtime's tool calls into the log's side
        table for the trace page (``progress_rows.py``)."""
        # A human in the loop (issue 35; runtime/approvals.py): the requests open in
        # the conversations loaded here, the decisions table (the log's for a file,
        # this process's otherwise), who waits for new requests, and the decisions
        # being turned into their events now.
        self.decisions: Decisions = MemoryDecisions()
        """Where decisions are written and read (``FileDecisions`` for an SQLite file,
        ``PgDecisions`` for a PostgreSQL log:
        another process's ``fanfold approve`` writes there)."""
        self.decision_poll = 0.2
        """Seconds between two reads of the decisions table while a request is open."""
        self._open_requests: dict[str, PendingRequest] = {}
        self._request_watchers: list[trio.MemorySendChannel[PendingRequest]] = []
        self._applying: set[str] = set()
        self._closed_why: dict[str, str] = {}
        self._unmarked: dict[str, str] = {}  # stale marks not yet written
        """Why each of the latest requests closed without a decision, by id."""
        self._polling = False
        """Whether the decisions poll runs: only while a request is open (a runtime
        with nothing to decide holds no task for it: test_runtime_tasks.py)."""

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
        mcp_servers: Iterable[Any] | str | os.PathLike[str] | None = None,
    ) -> AsyncIterator[Runtime]:
        """Open a runtime over the SQLite file ``database`` (":memory:" for a throwaway),
        or the PostgreSQL log at a ``postgresql://`` URL (the ``postgres`` extra).

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

        ``mcp_servers`` (the ``mcp`` extra): MCP servers whose tools are offered
        beside ``tools``, as ``mcp__SERVER__TOOL``: a path to a configuration file
        (its ``[mcp_servers]``, as fanfold.toml declares them) or a ``.mcp.json``, or
        the ``ServerDeclaration`` values ``fanfold.mcp.config.declared_servers(cwd)``
        returns (the CLI's, trust included: a project's server waiting for trust is
        not started). Nothing starts here: the servers start at the first ``start``
        (a root's tool set lists their tools) or, for a tree that ``resume``, ``send``
        or ``attach`` continues, at the first call of one of its recorded MCP tools;
        all are stopped when the runtime closes. A server that cannot start is logged
        (``mcp_problem``) and its tools are not offered. The variables the servers'
        ``env`` and ``headers`` name are redacted from the log by default.

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
        if mcp_servers is None:
            async with cls._opened(
                database, provider, runner, limits=limits, system_prompt=system_prompt,
                sub_agent_prompt=sub_agent_prompt, logger=logger, observer=observer,
                on_progress=on_progress, clock=clock, threaded_writes=threaded_writes,
                key=key, provider_description=provider_description, redact=redact,
                gc_policy=gc_policy, step_observers=step_observers,
            ) as runtime:  # fmt: skip
                yield runtime
            return
        from fanfold.runtime.served import declarations_of, served_tools

        declarations = declarations_of(mcp_servers)
        from fanfold.mcp.config import secret_variables

        # The variables the servers' env and headers name are secrets: their values are
        # redacted from the log (a server echoing its token writes no token there), and
        # kept from the servers' own environments but where declared, as for the CLI.
        policy = EnvPolicy(key_variables=secret_variables(declarations))
        if redact is None:
            redact = policy.redactor(os.environ)
        # The hub closes after the runtime: its conversations' calls are cancelled first,
        # then each server is stopped with everything it started.
        async with (
            served_tools(runner, declarations, policy) as served,
            cls._opened(
                database, provider, served, limits=limits, system_prompt=system_prompt,
                sub_agent_prompt=sub_agent_prompt, logger=logger, observer=observer,
                on_progress=on_progress, clock=clock, threaded_writes=threaded_writes,
                key=key, provider_description=provider_description, redact=redact,
                gc_policy=gc_policy, step_observers=step_observers,
            ) as runtime,
        ):  # fmt: skip
            yield runtime

    @classmethod
    @asynccontextmanager
    async def _opened(
        cls,
        database: str | Path,
        provider: Provider,
        runner: ToolRunner,
        *,
        limits: Limits | None,
        system_prompt: str,
        sub_agent_prompt: str | None,
        logger: Any,
        observer: Observer | None,
        on_progress: Callable[[StreamProgress], None] | None,
        clock: Callable[[], float],
        threaded_writes: bool | None,
        key: UserKey | None,
        provider_description: ProviderDescription | None,
        redact: Callable[[str], str] | None,
        gc_policy: str,
        step_observers: Sequence[StepObserver],
    ) -> AsyncIterator[Runtime]:
        """``open`` with its tool runner made."""
        key = key if key is not None else UserKey.load()
        memory = str(database) == ":memory:"
        postgres = is_postgres(database)
        store = Store.memory() if memory else open_store(database)
        presence: Held | None = None
        runtime: Runtime | None = None
        tuned = gc_policy == "tuned"
        if tuned:
            collector.tune()
        try:
            if postgres:
                # A PostgresStore's advisory lock (``PgPresence``): no file to lock.
                presence = cast(Any, store).presence()
            elif not memory:
                presence = Presence(database)
            threaded = not memory if threaded_writes is None else threaded_writes
            writer = LogWriter(store.append, threaded=threaded, units=store.units)
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
                runtime._gc_tuned = tuned
                if not memory:
                    # The log's decisions table: a file's, or the PostgreSQL
                    # database's (``PgDecisions``), which other processes write.
                    runtime.decisions = decisions_of(database)
                nursery.start_soon(runtime.engine.run)
                nursery.start_soon(runtime.timers.run)
                try:
                    yield runtime
                finally:
                    nursery.cancel_scope.cancel()
                    # ``events`` readers end (nothing more will be committed here).
                    runtime._commits.close()
        finally:
            if runtime is not None:
                runtime._commits.store_closed = True  # readers stop before the store goes
                runtime.progress_rows.close()  # its calls' progress rows go with it
            flush_log_lines()
            if tuned:
                if runtime is not None:  # what it still had loaded is no longer counted
                    collector.loaded_changed(-runtime._gc_counted)
                    runtime._gc_counted = 0
                collector.untune()
            if presence is not None:
                presence.close()
            if runtime is not None:
                runtime._flush_closed_marks()
                runtime.decisions.close()
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
        timeout: float | None = None,
        conversation_id: str | None = None,
        ask: Sequence[str] = (),
    ) -> str:
        """Start a root conversation with its first user message; returns its id.

        ``ask``: rules (``Bash(git push:*)``, ``mcp__github__create_issue``,
        ``Write(src/**)``) whose calls, anywhere in the tree, wait for a person's
        decision (``pending``, ``approve``, ``deny``; DESIGN.md "A human in the
        loop"); recorded in the root's creation event as its first permission layer,
        so every sub-agent's rules include them. A rule that is not one: ValueError.

        ``timeout``: seconds each of its turns may take (None: no limit); a turn past
        it ends in error ``timed_out``, its sub-agents cancelled first. ``agent``'s
        own ``timeout`` caps it, as it caps a child spawned as that definition.
        ``conversation_id``: the id to give it (default: a new random one). A caller
        that must name the tree before it exists gives it (``fanfold run --detach``
        prints the id its queued workflow is known by): 1 to 64 letters, digits, ``-``
        or ``_``, and not already in the log, else ValueError, nothing recorded.

        ``agents``: the agent definitions its ``spawn_agents`` tasks may name
        (``fanfold.agents.load_agents``), recorded in its creation event.
        ``agent``: a definition the root itself runs as (``fanfold mcp``'s
        ``delegate_task``): its prompt, rules, model and caps apply to the root as they
        would to a sub-agent spawned as it (``delegation.child_setup``).
        Returns once the message is in the log; use ``wait`` for the answer. A message
        longer than ``MAX_TASK_CHARS``: MessageTooLong (a ValueError), nothing recorded.
        """
        check_message(text)
        ask_rules = []
        for written in ask:
            rule = parse_rule(written)
            if isinstance(rule, str):
                raise ValueError(rule)
            ask_rules.append(rule)
        if conversation_id is None:
            conversation_id = uuid.uuid4().hex[:12]
        else:
            self._require_new_id(conversation_id)
        resolved = str(Path(cwd).resolve())
        discover = getattr(self.tools, "discover", None)
        if discover is not None:  # MCP servers (``mcp_servers``): started for a first tree
            for problem in await discover():
                self.logger.warning("mcp_problem", problem=problem)
        # ``read-only`` takes a tool whose recorded spec says it is read-only (a function
        # tool's read_only=True, an MCP server's readOnlyHint): the reducer reads the
        # specs of the creation event. (Logs before ToolSpec.read_only recorded the
        # definitions widened with those MCP tools' names instead, which still holds.)
        prompt = self.system_prompt if system_prompt is None else system_prompt
        chosen = limits or self.limits
        tools = self.tools.specs()
        scoped_specs = getattr(self.tools, "scoped_specs", None)
        if scoped_specs is not None:
            # Servers declared in agent files serve the agents whose definitions name
            # them: their tools go into those definitions (recorded with the
            # catalogue), and a server no definition names serves nobody.
            scoped = scoped_specs()
            agents = with_own_tools(agents, scoped)
            if agent is not None:
                (agent,) = with_own_tools((agent,), scoped)
            owned = {t.name for a in (*agents, *([agent] if agent else [])) for t in a.own_tools}
            unowned = {t.name for t in scoped} - owned
            tools = tuple(t for t in tools if t.name not in unowned)
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
            # The definition caps the time limit and the rounds as it caps a spawned
            # child's (one rule, the reducer's); a root's time limit is per turn.
            timeout, rounds = capped_limits(agent, timeout, chosen.max_rounds)
            chosen = attrs.evolve(chosen, max_rounds=rounds)
            model = model if model is not None else agent.model
        else:
            # A root is offered no agent-scoped server's tools (delegation.child_setup
            # gives them to the agents whose definitions name the server).
            tools = without_scoped(tools, agents)
        if ask_rules:
            # The run's ask rules come first: every layer below (an agent's, a
            # child's) adds to them, none lifts them.
            layer = RuleSet(source="the run's ask rules", base=resolved, ask=tuple(ask_rules))
            below = () if permissions is None else permissions.layers
            permissions = Permissions((layer, *below))
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
            timeout=timeout,
            # Today's wording of the reducer's texts (refusals), recorded: the tree
            # replays with it whatever a later fanfold words them.
            wording=WORDING,
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

    def _require_new_id(self, conversation_id: str) -> None:
        """A caller's id for a new root: well formed, and no conversation has it."""
        if not _ID_SHAPE.fullmatch(conversation_id):
            raise ValueError(
                f"conversation id {conversation_id!r}: use 1 to 64 letters, digits, - or _"
            )
        if conversation_id in self._actors:
            raise ValueError(f"conversation {conversation_id!r} already exists")
        try:
            self.store.conversation(conversation_id)
        except UnknownConversation:
            return
        raise ValueError(f"conversation {conversation_id!r} already exists")

    def _idempotent_tools(self) -> tuple[str, ...]:
        """The tools the tool runner says may be called twice (``ToolSet.idempotent``)."""
        idempotent = getattr(self.tools, "idempotent", None)
        if idempotent is None:
            return ()
        return tuple(sorted(s.name for s in self.tools.specs() if idempotent(s.name)))

    async def send(self, conversation_id: str, text: str) -> None:
        """Send a further user message to an idle (or errored) root conversation.

        A conversation not loaded (at rest, from this process or an earlier one, or a
        fork) is attached first. Raises IllegalTransition (nothing recorded) if the
        conversation is busy or is a sub-agent, UntrustedTree if its tree was not
        written by this runtime, MissingTools if it recorded Python tools this
        runtime lacks (see ``attach``; nothing recorded either way). The runtime's
        provider description is recorded as the one the tree now runs on. A text
        longer than ``MAX_TASK_CHARS``: MessageTooLong, nothing recorded.
        """
        check_message(text)
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
        what someone else wrote into its log; MissingTools if the tree recorded Python
        tools this runtime's tool runner lacks (each call of one would otherwise get
        "unknown tool").
        """
        if conversation_id in self._actors:
            return
        row = self.store.conversation(conversation_id)
        self._require_trusted(row.root_id)
        if row.status == "running":
            raise NotAtRest(f"conversation {conversation_id!r} has work in flight: resume it")
        self._require_tools(row.root_id)
        self.store.claim(row.root_id)  # before reading it (see ``resume``)
        self._dropped.pop(claim_unit(row, self.store.units), None)
        row = self.store.conversation(conversation_id)  # as it is now the tree is ours
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
            outcome=turn.outcome if turn else None,
            text=turn.text if turn else "",
            phase=type(state.phase).__name__,
        )

    async def events(self, tree_id: str, *, phases: bool = True) -> AsyncIterator[TreeStep]:
        """The committed steps of the tree of ``tree_id`` (its root or any of its
        conversations), as they are committed: an async iterator of ``TreeStep``.

        It yields the steps already in the log (from every conversation's seq 0, so a
        reader that starts mid-run misses nothing), then each new one once it is
        committed, every step once, in seq order per conversation (and across
        conversations, in logged time within what it reads at once). It ends when
        every conversation of the tree is at rest in the log (a root Idle or in
        Error, its sub-agents ended) and all their steps were given, when this
        runtime closes, or when the reader stops (``break``, a cancel). A tree at
        rest ends it after its logged steps: to follow a further turn, call it again
        once ``send`` has returned (the turn is then in the log, the tree running).

        ``phases``: give the phase after each step (``TreeStep.phase``), False gives
        None. Either way the reader folds each conversation through the reducer from
        its seq 0, once (as much CPU as the run's own folds, in this process): the
        effects of an events-only log are derived from the state each page starts
        from, so a page costs its own events, not the conversation's whole log.

        Back-pressure: the reader reads the log, not a queue. The engine sets one
        ``trio.Event`` per committed batch and buffers nothing for readers; a reader
        wakes, reads what was committed since it last read (at most ``EVENTS_PAGE``
        steps at a time) from the database, and yields it. A slow or paused reader
        only falls behind in the log, holding no more than a page, and a cancelled
        one leaves the run as it was. A reader that keeps up shares this process's
        CPU and the store's lock with the run (DESIGN.md gives the cost measured).
        Only this runtime's commits wake it: a tree another process is running is
        read again when this runtime commits or closes.

        Raises UnknownConversation for an unknown id; a damaged row raises what
        ``Store.events`` raises (ReplayError naming the seq).
        """
        root = self.store.conversation(tree_id).root_id
        seen: dict[str, int] = {}  # conversation -> last seq given
        states: dict[str, Conversation | None] = {}  # folded; None: not reproduced
        while True:
            signal, closed = self._commits.signal, self._commits.closed
            if self._commits.store_closed:
                return  # the runtime is gone: what it committed is in the log
            try:
                if self.writer.threaded:
                    # In a worker thread, like the writes: a read that waits for the
                    # store's lock while a batch is written never stops the event loop.
                    rows, read = await trio.to_thread.run_sync(self._read_page, root, seen, states)
                else:
                    rows, read = self._read_page(root, seen, states)
            except StoreClosed:
                return  # the runtime closed while this read waited for the lock
            pages: list[list[TreeStep]] = []
            for conversation_id, stored in read:
                pages.append(
                    [self._tree_step(conversation_id, root, s, states, phases) for s in stored]
                )
                seen[conversation_id] = stored[-1].seq
            budget = EVENTS_PAGE - sum(len(stored) for _, stored in read)
            # heapq.merge keeps each conversation's own order whatever the times say.
            for step in heapq.merge(*pages, key=lambda s: s.at):
                yield step
            if budget <= 0:
                continue  # more is committed: read on before waiting
            caught_up = all(seen.get(row.id, -1) >= row.last_seq for row in rows)
            if caught_up and (closed or all(row.status != "running" for row in rows)):
                return
            await signal.wait()

    def _read_page(
        self, root: str, seen: Mapping[str, int], states: Mapping[str, Conversation | None]
    ) -> tuple[list[ConversationRow], list[tuple[str, list[StoredEvent]]]]:
        """The tree's rows, and the events after ``seen`` of those with new ones: at
        most ``EVENTS_PAGE`` events in all, by conversation in creation order
        (``states``: each conversation's state after its ``seen`` event, if folded)."""
        rows = self.store.tree(root)
        budget = EVENTS_PAGE
        read: list[tuple[str, list[StoredEvent]]] = []
        for row in rows:
            after = seen.get(row.id, -1)
            if row.last_seq <= after or budget <= 0:
                continue
            stored = self.store.events(row.id, after, limit=budget, after_state=states.get(row.id))
            if stored:
                budget -= len(stored)
                read.append((row.id, stored))
        return rows, read

    @staticmethod
    def _tree_step(
        conversation_id: str,
        root: str,
        stored: StoredEvent,
        states: dict[str, Conversation | None],
        phases: bool,
    ) -> TreeStep:
        """``stored`` as a TreeStep, its phase, if ``phases``, folded from the
        conversation's state before it (``states``, updated either way)."""
        after: Conversation | None = None
        before = states.get(conversation_id)
        forked_or_created = isinstance(stored.event, ConversationCreated | ConversationForked)
        try:
            if stored.seq == 0 and forked_or_created:
                after, _ = start(stored.event)  # type: ignore[arg-type]
            elif before is not None and not forked_or_created:
                after, _ = transition(before, stored.event)
        except IllegalTransition:
            after = None  # a log this reducer does not reproduce: no phase from here on
        states[conversation_id] = after
        return TreeStep(
            conversation_id=conversation_id,
            path=tree_path(conversation_id, root),
            seq=stored.seq,
            event=stored.event,
            effects=stored.effects,
            phase=None if after is None or not phases else after.phase,
            at=stored.at,
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
        (see the module-level ``resume_plan``). A tree that recorded Python tools this
        runtime's tool runner lacks is skipped too (see ``MissingTools``)."""
        plan = resume_plan(self.store, self.key)
        self._trusted.update(plan.roots)
        roots: list[str] = []
        skipped = list(plan.skipped)
        for root_id in plan.roots:
            missing = self._missing_tools(root_id)
            if missing:
                skipped.append(SkippedTree(root_id, missing_reason(missing)))
            else:
                roots.append(root_id)
        return ResumePlan(tuple(roots), tuple(skipped))

    async def resume(
        self,
        roots: Sequence[str] | None = None,
        *,
        claimed: bool = False,
    ) -> list[str]:
        """Resume the unfinished conversations of trees this runtime may continue
        (see ``resume_plan``); returns their ids. Skipped trees are logged
        (``resume_skipped``) and left as they are.

        ``roots`` limits it to those trees; naming one that may not be continued raises
        UntrustedTree, and one that recorded Python tools this runtime's tool runner
        lacks raises MissingTools (nothing recorded; a plain ``resume()`` skips such a
        tree, logging ``resume_skipped``, and resumes the others). States are rebuilt
        from snapshots and events; each conversation then gets a RuntimeResumed event
        so the reducer re-issues what was in flight. Outcomes that finished children
        committed but their parents never accepted are re-delivered. The runtime's
        provider description, if any, is recorded as the one each resumed tree now
        runs on.

        A tree whose log cannot be rebuilt (undecodable or refused events, a damaged
        database page) is left as it is, logged (``resume_damaged``) and listed in
        ``resume_damaged`` with the reason; the other trees are resumed all the same.

        A forked conversation still at its seq 0 whose ``ConversationForked`` holds an
        edit (``replay.fork_at``, written with the fork) gets ``ForkEdited(edit)``
        instead of its RuntimeResumed: it goes on with the edit in place of what was in
        flight, and what the edit starts (an edited reply's tool calls) runs live. So
        the edit takes effect whenever the fork first goes on, ``fork --continue`` or a
        ``resume`` after that was killed.
        Any other fork's conversation still at its seq 0 gets
        ``RuntimeResumed(forked=True)``: nothing restarted, what it has in flight was in
        flight in its source (a running tool's result says so), and no idempotent tool
        is named in it: a fork never runs its source's running call again.

        Raises DatabaseInUse, and resumes nothing, while another runtime (in this
        process or another) has the database open: its unfinished conversations may be
        its live work rather than orphans of a crash. ``claimed=True`` (with ``roots``)
        skips that check: the caller holds an exclusive claim on those trees that any
        runtime running them holds too (``fanfold worker``'s per-tree lock).
        """
        if claimed and roots is None:
            raise ValueError("claimed=True needs the roots the claim is on")
        # ``claimed``: the caller holds an exclusive claim on these trees that no other
        # runtime can hold at once (``fanfold worker``'s per-tree lock, taken before it
        # starts or resumes a tree and held until the tree is at rest). That claim, not
        # the database-wide check, is then what keeps live work from running twice:
        # other runtimes on the log are other workers running other trees.
        if not claimed and self._presence is not None and not self._presence.alone():
            raise DatabaseInUse(
                f"another fanfold runtime has {self.store.path} open (a run, send or resume "
                "still going?); resuming now would run its conversations twice. Resume "
                "once it has ended"
            )
        if roots is not None:
            for root_id in roots:
                self._require_trusted(root_id)
            for root_id in roots:
                self._require_tools(root_id)
        plan = self.resume_plan()
        for skip in plan.skipped:
            self.logger.warning("resume_skipped", root_id=skip.root_id, reason=skip.reason)
        chosen = set(plan.roots if roots is None else roots)
        # Taken before they are read (a PostgreSQL log's per-tree claim: whoever ran one
        # before writes nothing more of it, so what is read here stays the tree's state).
        for root_id in sorted(chosen):
            self.store.claim(root_id)
            self._dropped.pop(root_id, None)  # ours again, if it was taken from us
        # Each tree is rebuilt on its own, and entirely before any of it runs: a tree
        # whose log cannot be read (a damaged row, a reducer that refuses an event) is
        # skipped and reported, and never stops the others (issue 10.2).
        by_root: dict[str, list[ConversationRow]] = {}
        for row in self.store.unfinished():
            if row.root_id in chosen and row.id not in self._actors:
                by_root.setdefault(row.root_id, []).append(row)
        for root_id, tree_rows in by_root.items():
            by_root[root_id] = self._own_unit(root_id, tree_rows)
        loaded: list[tuple[ConversationRow, Conversation, dict[int, float]]] = []
        damaged: list[SkippedTree] = []
        for root_id, tree_rows in by_root.items():
            try:
                back = clock_set_back(self.store, root_id, self.now)
                rebuilt = [
                    (row, self.store.load_state(row.id), timer_starts(self.store, row.id, back))
                    for row in tree_rows
                ]
            except (DatabaseError, sqlite3.DatabaseError) as exc:
                if environment_failure(exc):
                    raise
                skip = SkippedTree(root_id, f"its log cannot be rebuilt: {one_line(exc)}")
                self.logger.warning("resume_damaged", root_id=root_id, reason=skip.reason)
                damaged.append(skip)
                continue
            loaded += rebuilt
        self.resume_damaged = tuple(damaged)
        description = self._description_json()
        if description is not None:
            for root_id in dict.fromkeys(row.root_id for row, _, _ in loaded):
                self.store.record_provider(root_id, description)
        return self._launch_loaded(loaded)

    def _launch_loaded(
        self, loaded: list[tuple[ConversationRow, Conversation, dict[int, float]]]
    ) -> list[str]:
        resumed = []
        edits: dict[str, ForkEdited] = {}
        first: set[str] = set()  # a fork's conversations going on for the first time
        context = contextvars.copy_context()  # one for all: they share call workers
        for row, state, started in loaded:
            pending = pending_edit(self.store, row)
            if pending is not None:
                edits[row.id] = pending
            if row.last_seq == 0 and (row.forked_from is not None or row.forked_at_seq is not None):
                # A fork's copy going on for the first time: a tool its source had
                # running is never run again here, not even one declared idempotent:
                # the fork's source may be a tree from elsewhere, whose log decided the
                # call (issue 34), and a fork re-running a call unasked is what the
                # fork rules exclude (DESIGN, "Time travel").
                first.add(row.id)
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
            # A fork's conversation still at its seq 0 never ran here: what it has in
            # flight was in flight in its source, and the reducer says so (a fact of
            # the log, like the pending edit), rather than speak of a restart; and it
            # re-runs no idempotent tool (above).
            forked = conversation_id in first
            resumed_event = RuntimeResumed(() if forked else again, forked=forked)
            self.deliver(conversation_id, edits.get(conversation_id) or resumed_event)
        for conversation_id in resumed:
            self._redeliver_outcomes(self._actors[conversation_id].state)
        return resumed

    def _own_unit(self, root_id: str, rows: list[ConversationRow]) -> list[ConversationRow]:
        """Of a tree's unfinished ``rows``, those this runtime resumes with the tree.

        Children placed in chunks (``placement.py``) and their descendants are the
        chunks' own units. A runtime with a placement leaves them to the chunks'
        runtimes (its parents watch their outcomes in the log). One without (``fanfold
        resume``) takes them all back: it claims each chunk, so a worker still running
        one is fenced from then on, and runs them here like any child.
        """
        placements = self.store.placements(root_id)
        if not placements:
            return rows
        units = units_of(self.store, rows, placements)
        if self.placement is not None:
            self.placement.placed_before(placements)
            return [row for row in rows if row.id not in units]
        for chunk in sorted(set(placements.values())):
            self.store.claim(chunk)
        self.store.units.update(placements)
        self.store.units.update(units)
        return rows

    async def resume_unit(self, root_id: str, chunk: str, children: Sequence[str]) -> list[str]:
        """Resume the unfinished conversations of tree ``root_id`` that chunk
        ``chunk`` (of placed ``children``) holds (``placement.py``), claiming the chunk
        first (its previous runtime writes nothing more of them); returns their ids."""
        self._require_trusted(root_id)
        self._require_tools(root_id)
        self.store.claim(chunk)
        self._dropped.pop(chunk, None)  # ours again, if it was taken from us
        if not self.store.created_among(children):  # type: ignore[attr-defined]
            return []  # its first run: nothing of it in the log (the common case)
        rows = [
            row
            for row in self.store.unfinished()
            if row.root_id == root_id and row.id not in self._actors
        ]
        placements = self.store.placements(root_id)
        units = units_of(self.store, rows, placements)
        mine = [row for row in rows if units.get(row.id) == chunk]
        for row in mine:
            self.store.units[row.id] = chunk
        back = clock_set_back(self.store, root_id, self.now)
        loaded = [
            (row, self.store.load_state(row.id), timer_starts(self.store, row.id, back))
            for row in mine
        ]
        return self._launch_loaded(loaded)

    def use_placement(self, placer: Placer, settings: PlacementSettings | None = None) -> None:
        """Place big fan-outs' children in chunks that ``placer`` puts on the workers'
        queue (``placement.py``). Needs a PostgreSQL log: the chunks' claims, their
        rows and cancels are in it."""
        if not hasattr(self.store, "place"):
            raise ValueError("placing children in chunks needs a PostgreSQL log")
        self.placement = Placement(self, placer, settings or PlacementSettings())
        self._nursery.start_soon(self.placement.run)

    def loaded_ids(self) -> Set[str]:
        """The ids of the conversations loaded here (work in flight)."""
        return self._actors.keys()

    async def wait_loaded(self, conversation_id: str) -> None:
        """Return once ``conversation_id`` is at rest, if it is loaded here."""
        actor = self._actors.get(conversation_id)
        if actor is not None:
            await actor.wait_at_rest()

    async def fork(
        self,
        conversation_id: str,
        at_seq: int,
        *,
        agent: str | None = None,
        edit: Edit | None = None,
        new_id: str | None = None,
        go_on: bool = False,
        rerun_siblings: bool = False,
    ) -> str:
        """Fork a tree after step ``at_seq`` of one of its conversations; returns the
        new tree's root id. ``fanfold fork`` with its options, as one implementation
        (``replay.fork_at``).

        ``conversation_id`` is a tree's root or any conversation of it; ``agent`` the
        conversation whose step is meant: a place (``root``, ``root/1/2``, ``1/2``) or
        an id of that tree (None: ``conversation_id`` itself). ``edit`` changes that
        conversation as the fork goes on: ``ReplyEdit``, ``ToolResultEdit``,
        ``TaskEdit``, ``SystemPromptEdit``, ``LimitsEdit`` or ``DecisionEdit``; one the
        reducer refuses at that step raises ``replay.EditRefused`` naming where it is legal, and
        nothing is written.

        A root at rest is forked alone (its edit recorded at once): go on with
        ``send``. Any other step forks the whole tree as it was at that moment, every
        conversation off the picked one's chain (the picked one and its ancestors)
        taking its recorded future from the source where the edit cannot have changed
        it, so the fork differs from its source only downstream of the edit
        (``rerun_siblings``: they go on live from the moment instead); with
        ``go_on`` it is continued at once on this runtime (its provider and tools),
        as ``fanfold fork --continue`` does: ``resume`` of the fork, the edit
        delivered in place of that conversation's ``RuntimeResumed``. Without
        ``go_on`` it waits in the log for a ``resume``; an edit then is refused
        (EditRefused): it takes effect only as the fork goes on. Wait for the fork
        with ``wait(fork_id)``; follow it with ``events(fork_id)``.

        Also raises ``replay.ForkRefused`` (a tree another user or machine wrote,
        forked elsewhere than at a root's rest; ``new_id`` taken),
        ``replay.NoSuchStep``, ``replay.LogDiverged``, ``replay.LogCorrupt``,
        UnknownConversation, LookupError for an ``agent`` not in the tree, and, with
        ``go_on``, MissingTools (nothing written) if the source tree recorded Python
        tools this runtime lacks (see ``resume``). The source tree is never written.
        """
        from fanfold.replay.fork import fork_at  # loaded when used: not at start-up

        if go_on:
            # The fork records the source's tools: refused here, before it is written,
            # rather than by the resume that follows (which would leave the fork behind).
            self._require_tools(self.store.conversation(conversation_id).root_id)
        made = fork_at(
            self.store,
            conversation_id,
            at_seq,
            agent=agent,
            edit=edit,
            new_id=new_id,
            going_on=go_on,
            now=self.now(),
            key=self.key,
            rerun_siblings=rerun_siblings,
        )
        if go_on and made.goes_on:
            await self.resume([made.fork_id])
        return made.fork_id

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
        at_rest: bool | None = None,
    ) -> Step:
        """The step to log; with a snapshot if asked, at seq 0 and at rest
        (``at_rest``: ``state.at_rest``, when the caller has it already)."""
        if at_rest is None:
            at_rest = state.at_rest
        snapshot = snapshot or seq == 0 or at_rest
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
        placement = self.placement
        if placement is not None and placement.forwards(conversation_id, event):
            return
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
        parent_cwd: str | None = None,
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
        ``parent_cwd``: the parent's working directory, when the parent is not loaded
        here (a chunk's child: ``placement.py``).
        """
        if effect.child_id in self._actors:
            return
        if reissued and self.store.exists(effect.child_id):
            return
        units = self.store.units
        if units:
            # A chunk's conversation's children are the chunk's (its claim fences them).
            unit = units.get(effect.parent_id)
            if unit is not None:
                units[effect.child_id] = unit
        if parent_cwd is None:
            parent_cwd = self.state(effect.parent_id).cwd
        found = inspect_workdir(effect.cwd, parent_cwd, self.project_cwd(effect.root_id))
        self._create(effect.created_event(found), user_initiated=False, context=context)

    def project_cwd(self, root_id: str) -> str:
        """The working directory of the tree's root: the project no tool leaves."""
        cwd = self._project_cwds.get(root_id)
        if cwd is None:
            cwd = self._project_cwds[root_id] = self.created_cwd(root_id)
        return cwd

    def created_cwd(self, conversation_id: str) -> str:
        """A conversation's working directory (set at its creation, never changed):
        its state's if loaded, else its first event's (not its whole state: a chunk
        of a big fan-out would fold its parent's thousands of events for it)."""
        actor = self._actors.get(conversation_id)
        if actor is not None:
            return actor.state.cwd
        first = self.store.events(conversation_id, limit=1)
        event = first[0].event if first else None
        if not isinstance(event, ConversationCreated):
            return self.state(conversation_id).cwd  # a fork's first event: fold it
        return event.cwd

    def tool_cwd_problem(self, state: Conversation, cwd: str) -> str | None:
        """Why no tool may run in ``cwd`` for ``state`` (see ``outside_project``)."""
        project = self.project_cwd(state.root_id)
        return None if cwd == project else outside_project(cwd, project)

    async def refresh_tools(self) -> None:
        """After a tool call: if an MCP server said its tools changed
        (``ServedTools.tool_changes``), every loaded conversation is given a
        ``ToolsChanged`` with its tools as listed now, queued before the call's own
        result, so the next model call of each offers them (the reducer decides, from
        the conversation's rules; the event is recorded, so replay needs no server)."""
        changes = getattr(self.tools, "tool_changes", None)
        if changes is None:
            return
        for server, specs in await changes():
            for actor in list(self._actors.values()):
                if not actor.state.is_terminal:
                    actor.deliver(ToolsChanged(server, specs))

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
            self._loaded_changed()
            units = self.store.units
            if units:
                units.pop(conversation_id, None)  # it writes nothing more
            if self.placement is not None:
                self.placement.unloaded(conversation_id)
        # No more call workers than conversations that might call: none once at rest.
        self.calls.trim(len(self._actors))
        if not self._actors:
            # The codec's memo shares the text of values consecutive steps of loaded
            # conversations repeat; with none loaded it only keeps ended ones alive.
            clear_memo()

    def _taken_over(self, taken: TreeTakenOver) -> None:
        """A batch was refused: another runtime claimed the tree ``taken`` names since
        this one did (a PostgreSQL log's per-tree claim). Drop every loaded
        conversation of it (``Actor.drop``: calls, timers and tools stopped, waiters
        told ``TreeDropped``); the writer then commits the batch's other steps. The
        rest of the runtime goes on: one tree lost to another owner is not a reason to
        stop the others (a worker holds many)."""
        unit = taken.root_id
        self._dropped[unit] = taken
        units = self.store.units
        dropped = [a for a in self._actors.values() if claim_unit(a.state, units) == unit]
        for actor in dropped:
            actor.drop(taken)
        self.logger.warning(
            "tree_dropped", root_id=unit, conversations=len(dropped), reason=one_line(taken)
        )

    def _loaded_changed(self) -> None:
        """The conversations loaded changed: under the tuned collector policy, the
        young threshold follows how many are loaded (``GC_YOUNG_PER_CONVERSATION``)."""
        if self._gc_tuned:
            loaded = len(self._actors)
            collector.loaded_changed(loaded - self._gc_counted)
            self._gc_counted = loaded

    def observe(
        self, before: Conversation, after: Conversation, event: Event, effects: tuple[Effect, ...]
    ) -> None:
        """Tell the ``observer`` given to ``open`` of a committed step."""
        if type(before.phase) is ToolExecuting and before.phase.asking is not None:
            closed = open_request(before)
            if closed is not None and open_request(after) != closed:
                self._open_requests.pop(closed.id, None)
                if getattr(event, "call", None) != closed.call or not isinstance(
                    event, ApprovalGranted | ApprovalDenied | UserAnswered
                ):
                    self._closed_without_decision(closed, after)
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

    def _missing_tools(self, root_id: str) -> list[str]:
        """The Python tools tree ``root_id`` recorded (its root's tools and its agent
        definitions' own, as ``fanfold resume`` reads them) that this runtime could not
        run: neither built-in, control, MCP (bound on first call, or answered with an
        error naming the server) nor in the tool runner as it is now. A tree whose log
        cannot be read gives none here: ``resume`` reports it as damaged."""
        try:
            state = self.store.load_state(root_id)
        except (DatabaseError, sqlite3.DatabaseError) as exc:
            if environment_failure(exc):
                raise
            return []
        recorded = (*state.tools, *(t for a in state.agents for t in a.own_tools))
        return unsupplied(recorded, (spec.name for spec in self.tools.specs()))

    def _require_tools(self, root_id: str) -> None:
        # A tree's tools are those its root recorded: checked once per set of tools
        # this runtime has (a worker checks for each chunk of a fan-out, and the
        # root's state is the biggest to load).
        key = (root_id, tuple(spec.name for spec in self.tools.specs()))
        if key in self._tools_supplied:
            return
        missing = self._missing_tools(root_id)
        if missing:
            raise MissingTools(root_id, missing)
        self._tools_supplied.add(key)

    def _at_rest_in_log(self, conversation_id: str) -> bool:
        """Whether the log has the conversation at rest (raises UnknownConversation)."""
        return self.store.conversation(conversation_id).status != "running"

    def _actor(self, conversation_id: str) -> Actor:
        actor = self._actors.get(conversation_id)
        if actor is None:
            # Raises UnknownConversation; and a tree that may not be continued says so.
            row = self.store.conversation(conversation_id)
            self._require_trusted(row.root_id)
            taken = self._dropped.get(claim_unit(row, self.store.units))
            if taken is not None:
                raise TreeDropped(taken)
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
        self._loaded_changed()
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
        bind = getattr(self.tools, "bind", None)
        if bind is not None:  # its recorded MCP tools, on the servers of those names
            state = actor.state
            bind((*state.tools, *(t for a in state.agents for t in a.own_tools)))
        self._actors[actor.state.id] = actor
        self._loaded_changed()
        self.engine.ready(actor)

    def _redeliver_outcomes(self, state: Conversation) -> None:
        children = state.children
        if children is None:
            return
        for pending in children.pending:
            child_id = pending.spec.id
            if not pending.started or child_id in self._actors:
                continue
            if self.placement is not None and self.placement.is_placed(child_id):
                continue  # placed: its outcome is watched for in the log (placement.py)
            try:
                child = self.store.load_state(child_id)
            except UnknownConversation:
                continue  # never created: the re-issued SpawnSubAgent creates it
            # The outcome its NotifyParent carried (tokens included: a tree budget
            # must be charged for them).
            outcome = child.outcome
            if outcome is not None:
                self.deliver(state.id, SubAgentFinished(child_id, outcome))
