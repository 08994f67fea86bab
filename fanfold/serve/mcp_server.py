"""fanfold's delegation served over MCP (``fanfold mcp``).

Six tools, over one ``Runtime`` and the same database as the CLI:

- ``delegate_task(agent, task, context, budget, background)``: start a tree whose root
  runs as the agent definition ``agent`` (its prompt, rules, model and caps; a plain
  root, as ``fanfold run`` starts, when left out) on ``task`` (``context`` put before it),
  ``budget`` the tree's token budget. It answers with the result when the tree comes
  to rest, or at once with the tree's id when ``background`` is true.
- ``list_sub_agents()``: the agent definitions in effect for the server's folder.
- ``get_delegation_result(delegation_id, wait)``: a delegation's status and result;
  a running delegation that waits for a person's decision (issue 35: an ask rule, a
  tool needing approval, ``ask_user``) lists its open ``requests``, and ``wait``
  returns once it can go on only after one.
- ``approve_request(request_id, arguments)``, ``deny_request(request_id, reason)``,
  ``answer_request(request_id, text)``: take that decision (a row of the log's
  decisions table, as ``fanfold approve`` writes: the first decision wins). A host
  whose client supports MCP elicitation is asked each request directly instead
  (``elicitation_asker``) while a foreground delegation or a ``wait`` waits.

A delegation is an ordinary tree: written ahead like every other (``fanfold ls``,
``show`` and the trace page show it), resumed when the server starts again after a
crash. The ids of the trees the server started are kept in a ledger file beside the
database (``DelegationLedger``): on start, the unfinished ones among them are resumed,
and only they (an unfinished ``fanfold run`` is its user's to resume).

A foreground delegation belongs to its request: when the host cancels the request
(``notifications/cancelled``) or goes away without waiting for the answer, the tree is
cancelled (a recorded cancel that reaches every sub-agent) before the handler ends.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from fanfold.agents import AgentDefinition
from fanfold.db import UnknownConversation
from fanfold.db.records import Status
from fanfold.regular_files import kind, read_regular
from fanfold.runtime import Runtime
from fanfold.runtime.approvals import PendingRequest
from fanfold.statemachine import CancelReason, Limits
from fanfold.statemachine.control_tools import MAX_TASK_CHARS
from fanfold.statemachine.phases import Error

__all__ = ["CANCEL_GRACE", "DelegationError", "DelegationLedger", "DelegationService"]

WAITING_POLL = 0.25
"""Seconds between two looks at whether a delegation waits only for a person."""

CANCEL_GRACE = 30.0
"""Seconds a cancelled request's handler waits for its tree to record the cancel."""


class DelegationError(ValueError):
    """A delegation request the server refuses; the message says why (one line)."""


class DelegationLedger:
    """The ids of the trees ``fanfold mcp`` started, one a line, in a file beside the
    database (``<db>.mcp-delegations``); none for ``:memory:``.

    An id is appended (and synced) once the tree's creation is in the log, so a crash
    between the two leaves a tree that ``fanfold resume`` continues, never an id
    without a tree. The file is read as untrusted text: a line that is not an id is
    skipped.
    """

    def __init__(self, database: Path | str) -> None:
        self.path = None if str(database) == ":memory:" else Path(f"{database}.mcp-delegations")
        # An ordered set: a list's `in` made reading a ledger of 200,000 lines
        # quadratic (over a minute before the server answered).
        self._ids: dict[str, None] = {}
        if self.path is None:
            return
        try:
            # Never blocks: a FIFO (or a device) there is refused, not waited on.
            data = read_regular(self.path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise DelegationError(
                f"cannot read the delegation ledger {self.path}: {exc.strerror or exc}"
            ) from None
        for line in data.decode("utf-8", errors="replace").splitlines():
            line = line.strip()
            if line.isalnum() and len(line) <= 64:
                self._ids.setdefault(line)

    def add(self, root_id: str) -> None:
        """Record ``root_id`` as started by this server (synced before it returns).
        DelegationError if the ledger is not a regular file that can be written."""
        self._ids.setdefault(root_id)
        if self.path is None:
            return
        try:
            # O_NONBLOCK: a FIFO nobody reads fails at once (ENXIO) instead of hanging
            # the server on its first delegation; one somebody reads is refused below.
            fd = os.open(
                self.path,
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC,
                0o666,
            )
        except OSError as exc:
            raise DelegationError(
                f"cannot write the delegation ledger {self.path}: {exc.strerror or exc}"
            ) from None
        with open(fd, "a", encoding="utf-8") as f:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise DelegationError(
                    f"cannot write the delegation ledger {self.path}: it is {kind(mode)}"
                )
            os.set_blocking(fd, True)
            f.write(root_id + "\n")
            f.flush()
            os.fsync(f.fileno())

    def __contains__(self, root_id: object) -> bool:
        return root_id in self._ids

    def roots(self) -> tuple[str, ...]:
        """Every id recorded, oldest first."""
        return tuple(self._ids)


Decided = tuple[str, dict[str, Any] | None, str]
"""A person's decision as elicitation brings it: ``(kind, arguments, text)``, kind
``grant``, ``deny`` or ``answer``."""

Asker = Callable[[PendingRequest, str], Awaitable[Decided | None]]
"""Puts one open request to the host's user (MCP elicitation), with why their last
answer to it was not taken ("" the first time); None: put off (the user cancelled
the form), left to the host's model and the decision tools."""


def _with_not_taken(outcome: dict[str, Any], not_taken: list[str]) -> dict[str, Any]:
    """``outcome``, with the host's user's answers that were not taken and why."""
    return {**outcome, "not_taken": not_taken} if not_taken else outcome


class DelegationService:
    """What the MCP tools do, over an open ``Runtime``."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        cwd: Path,
        agents: tuple[AgentDefinition, ...],
        limits: Limits,
        system_prompt: str,
        ledger: DelegationLedger,
        ask: tuple[str, ...] = (),
    ) -> None:
        self.runtime = runtime
        self.ask = ask
        """Ask rules of every delegated tree (``fanfold mcp --ask``, ``[permissions] ask``)."""
        self.cwd = cwd
        self.agents = agents
        self.limits = limits
        self.system_prompt = system_prompt
        self.ledger = ledger
        self.stopping = False
        """Set when the server is stopped by a signal: the requests then cancelled
        leave their trees unfinished, to be resumed at the next start."""

    def sub_agents(self) -> list[dict[str, Any]]:
        """The agent definitions ``delegate_task`` may name."""
        return [
            {
                "name": a.name,
                "description": a.description,
                "model": a.model,
                "source": a.source,
                "may_delegate": a.may_delegate,
            }
            for a in self.agents
        ]

    def _definition(self, name: str | None) -> AgentDefinition | None:
        if name is None:
            return None  # a plain root, as `fanfold run` starts
        for definition in self.agents:
            if definition.name == name:
                return definition
        known = ", ".join(a.name for a in self.agents) or "none"
        raise DelegationError(f"no agent named {name!r} (agents: {known})")

    async def start(
        self, agent: str | None, task: str, context: str | None, budget: int | None
    ) -> str:
        """Start a delegation; returns its id once its creation is in the log."""
        if not task.strip():
            raise DelegationError("the task is empty")
        if budget is not None and budget < 1:
            raise DelegationError("budget must be a positive number of tokens")
        definition = self._definition(agent)
        limits = self.limits
        if budget is not None:
            cap = budget if limits.max_tokens is None else min(budget, limits.max_tokens)
            limits = Limits(**{**_limits_fields(limits), "max_tokens": cap})
        text = task if not context or not context.strip() else f"{context.strip()}\n\n{task}"
        if len(text) > MAX_TASK_CHARS:
            # Refused before anything is written: the model gets an error result.
            with_context = " with its context" if text is not task else ""
            raise DelegationError(
                f"the task is too long ({len(text)} characters{with_context}, at most "
                f"{MAX_TASK_CHARS}): give the agent the gist, or a file to read"
            )
        root_id = await self.runtime.start(
            text,
            cwd=self.cwd,
            limits=limits,
            system_prompt=self.system_prompt,
            agents=self.agents,
            agent=definition,
            ask=self.ask,
        )
        self.ledger.add(root_id)
        return root_id

    async def delegate(
        self,
        agent: str | None,
        task: str,
        context: str | None,
        budget: int | None,
        background: bool,
        asker: Asker | None = None,
    ) -> dict[str, Any]:
        """``delegate_task``: the result, or the id at once when ``background``.
        ``asker``: the host's user asked each request (elicitation) while it waits."""
        root_id = await self.start(agent, task, context, budget)
        if background:
            return {"delegation_id": root_id, "status": "running"}
        try:
            not_taken = await self.until_rest_or_asked(root_id, asker)
        except trio.Cancelled:
            if self.stopping:
                raise
            # The request was cancelled (or its host went away): the tree is
            # cancelled with it, recorded, every sub-agent reached, before the
            # handler ends. Shielded, bounded: a stuck tree cannot hold the server.
            with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_GRACE):
                await self.runtime.cancel(root_id, CancelReason.USER)
                await self.runtime.wait(root_id)
            raise
        return _with_not_taken(self.outcome(root_id), not_taken)

    async def result(
        self, delegation_id: str, wait: bool, asker: Asker | None = None
    ) -> dict[str, Any]:
        """``get_delegation_result``: the status, and the result once at rest."""
        if delegation_id not in self.ledger:
            raise DelegationError(f"{delegation_id!r} is not a delegation of this server")
        not_taken = await self.until_rest_or_asked(delegation_id, asker) if wait else []
        return _with_not_taken(self.outcome(delegation_id), not_taken)

    async def until_rest_or_asked(self, root_id: str, asker: Asker | None) -> list[str]:
        """``until_rest_or_waiting``; with ``asker`` (a host that supports
        elicitation), each open request of the tree is then put to the host's user and
        their decision taken, until the tree is at rest or its requests are left to
        the host's model (the user cancelled the elicitation: ``get_delegation_result``
        lists them, ``approve_request`` & co. decide). Returns why each answer that
        was not taken was not (``REQUEST: why``): the host's user is told."""
        put_off: set[str] = set()
        refused: dict[str, int] = {}
        problems: dict[str, str] = {}
        not_taken: list[str] = []
        while True:
            await self.until_rest_or_waiting(root_id)
            if asker is None:
                return not_taken
            asking = [
                r for r in self.runtime.pending() if r.tree == root_id and r.id not in put_off
            ]
            if not asking:
                return not_taken
            for request in asking:
                if request.id not in {r.id for r in self.runtime.pending()}:
                    continue  # decided meanwhile (another process, a timeout)
                closed, decided = await self._ask_while_open(
                    asker, request, problems.pop(request.id, "")
                )
                if closed:
                    continue  # closed while the form was open: withdrawn
                if decided is None:
                    put_off.add(request.id)
                    continue
                kind, arguments, text = decided
                try:
                    await self.decide(request.id, kind, arguments, text, by="mcp elicitation")
                except DelegationError as exc:
                    # Decided elsewhere first, closed (a timeout), or edited arguments
                    # the schema refuses: the request, if still open, is asked again
                    # with the reason (three times at most, then left to the host's
                    # model); the answer is reported as not taken.
                    not_taken.append(f"{request.id}: {exc}")
                    problems[request.id] = str(exc)
                    refused[request.id] = refused.get(request.id, 0) + 1
                    if refused[request.id] >= 3:
                        put_off.add(request.id)

    async def _ask_while_open(
        self, asker: Asker, request: PendingRequest, last: str
    ) -> tuple[bool, Decided | None]:
        """``asker(request, last)``, withdrawn (the elicitation's request cancelled:
        the host closes its form) once ``request`` is no longer open here (decided
        elsewhere, its approval timeout, a cancel). Returns (closed meanwhile, the
        answer)."""
        done = False
        scope = trio.CancelScope()

        async def watch() -> None:
            # A system task, not a nursery's: a cancel of the tool call must reach
            # ``delegate`` as a plain Cancelled (see until_rest_or_waiting).
            while not done:
                if not any(r.id == request.id for r in self.runtime.pending()):
                    scope.cancel()
                    return
                await trio.sleep(WAITING_POLL)

        trio.lowlevel.spawn_system_task(watch)
        try:
            with scope:
                return False, await asker(request, last)
        finally:
            done = True
        return True, None

    async def until_rest_or_waiting(self, root_id: str) -> None:
        """Wait until tree ``root_id`` is at rest, or can go on only after a person's
        decision (twice in a row, a poll apart: nothing moved in between)."""
        # No nursery: a cancel of the request must reach ``delegate`` as a plain
        # Cancelled (a nursery would hand it on inside an exception group).
        calm = 0
        while True:
            with trio.move_on_after(WAITING_POLL):
                await self.runtime.wait(root_id)
                return
            calm = calm + 1 if self.runtime.waiting_for_people(root_id) else 0
            if calm >= 2:
                return

    def requests(self, root_id: str) -> list[dict[str, Any]]:
        """The open requests of tree ``root_id`` (as ``fanfold pending --json``)."""
        import json

        return [
            {
                "request_id": r.id,
                "agent": r.path,
                "tool": r.tool,
                "arguments": json.loads(r.arguments_json),
                "rule": r.rule,
                "question": r.question,
                "choices": list(r.choices),
            }
            for r in self.runtime.pending()
            if r.tree == root_id
        ]

    async def decide(
        self,
        request_id: str,
        kind: str,
        arguments: dict[str, Any] | None,
        text: str,
        by: str = "mcp",
    ) -> dict[str, Any]:
        """``approve_request``/``deny_request``/``answer_request``: the decision is
        written (first writer wins) and turned into its event; returns the
        delegation's status."""
        from fanfold.runtime.approvals import DecisionError

        found = next((r for r in self.runtime.pending() if r.id == request_id), None)
        if found is None or found.tree not in self.ledger:
            raise DelegationError(
                f"no open request {request_id!r} in a delegation of this server "
                "(see get_delegation_result)"
            )
        try:
            if kind == "grant":
                await self.runtime.approve(found, arguments, by=by)
            elif kind == "deny":
                await self.runtime.deny(found, text, by=by)
            else:
                await self.runtime.answer(found, text, by=by)
        except DecisionError as exc:
            raise DelegationError(str(exc)) from None
        return self.outcome(found.tree)

    def outcome(self, root_id: str) -> dict[str, Any]:
        """A delegation's status (``running``, ``completed``, ``cancelled``,
        ``failed``) and, at rest, its answer or error."""
        try:
            row = self.runtime.store.conversation(root_id)
        except UnknownConversation:
            raise DelegationError(f"{root_id!r} is not in the database") from None
        answer: dict[str, Any] = {"delegation_id": root_id}
        if row.status is Status.RUNNING:
            requests = self.requests(root_id)
            if requests:
                # It waits for a person: the host decides (approve_request, ...).
                return {**answer, "status": "running", "requests": requests}
            return {**answer, "status": "running"}
        state = self.runtime.state(root_id)
        turn = self.runtime.store.last_turn(root_id)
        outcome = turn.outcome if turn is not None else ""
        if isinstance(state.phase, Error):
            status = "cancelled" if outcome == "cancelled" else "failed"
            return {**answer, "status": status, "error": state.phase.error}
        if outcome == "cancelled":
            return {**answer, "status": "cancelled"}
        return {**answer, "status": "completed", "result": turn.text if turn else ""}

    async def resume_own(self) -> list[str]:
        """Resume the unfinished trees this server started (ids of the conversations
        resumed); the others are left to ``fanfold resume``."""
        unfinished = {row.root_id for row in self.runtime.store.unfinished()}
        mine = [r for r in self.ledger.roots() if r in unfinished]
        plan = self.runtime.resume_plan()
        mine = [r for r in mine if r in plan.roots]
        if not mine:
            return []
        return await self.runtime.resume(mine)


def _limits_fields(limits: Limits) -> dict[str, Any]:
    import attrs

    return attrs.asdict(limits, recurse=False)


ELICIT_TRIES = 3
"""How often a form whose edited arguments are not a JSON object is put again."""


def elicitation_asker(ctx: Any) -> Asker | None:
    """The ``Asker`` that puts a request to the host's user through MCP elicitation
    (``elicitation/create``, form mode, on the tool call's own request), or None when
    the host declared no elicitation support (then ``get_delegation_result`` lists
    the requests and the host's model decides with ``approve_request`` & co.).

    An approval request is a form ``{approve, reason?, arguments?}`` (``arguments``: a
    JSON object to run the call with instead, checked as ``approve_request``'s);
    declining the form denies the call ("declined by the user"). A question is a form
    ``{answer}`` (its choices in the message); declining it declines to answer.
    Cancelling the form puts the request off: it is left open for the host's model."""
    import json

    from pydantic import BaseModel, Field

    capabilities = ctx.client_capabilities
    if capabilities is None or capabilities.elicitation is None:
        return None

    class Approval(BaseModel):
        approve: bool = Field(description="Run the call (true) or deny it (false).")
        reason: str = Field(default="", description="Why, if you deny it (the agent reads it).")
        arguments: str = Field(
            default="", description="Optional: a JSON object to run the call with instead."
        )

    class Answer(BaseModel):
        answer: str = Field(description="Your answer (the agent reads it).")

    async def ask(request: PendingRequest, last: str) -> Decided | None:
        if request.question is not None:
            choices = f" (choices: {' | '.join(request.choices)})" if request.choices else ""
            again = f" (your last answer was not taken: {last})" if last else ""
            message = (
                f"fanfold: agent {request.path} asks ({request.id}): "
                f"{request.question}{choices}{again}"
            )
            answered = await ctx.elicit(message, Answer)
            if answered.action == "accept":
                return ("answer", None, answered.data.answer)
            if answered.action == "decline":
                return ("deny", None, "the user declined to answer")
            return None
        problem = f" (your last answer was not taken: {last})" if last else ""
        for _ in range(ELICIT_TRIES):
            message = (
                f"fanfold: agent {request.path} wants to run {request.tool} "
                f"{request.arguments_json} ({request.rule}; request {request.id}). "
                f"Approve it?{problem}"
            )
            decided = await ctx.elicit(message, Approval)
            if decided.action == "decline":
                return ("deny", None, "declined by the user")
            if decided.action != "accept":
                return None
            data = decided.data
            if not data.approve:
                return ("deny", None, data.reason.strip() or "no reason given")
            if not data.arguments.strip():
                return ("grant", None, "")
            try:
                edited = json.loads(data.arguments)
            except ValueError as exc:
                problem = f" (your arguments were not JSON: {exc}; try again)"
                continue
            if not isinstance(edited, dict):
                problem = " (the arguments must be a JSON object; try again)"
                continue
            return ("grant", edited, "")
        return None

    return ask


def mcp_server(service: DelegationService) -> Any:
    """The MCP server (the SDK's ``MCPServer``) offering the six tools over
    ``service``. Refusals are tool errors (``isError``), one line each."""
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import ToolAnnotations

    server: Any = MCPServer(
        "fanfold",
        instructions=(
            "Delegate work to fanfold's durable trees of sub-agents: list_sub_agents, "
            "then delegate_task (background: true returns an id at once; "
            "get_delegation_result reads it). A delegation waiting for a person's "
            "decision asks your user (elicitation) if your client supports it; "
            "otherwise it lists its requests: approve_request, deny_request or "
            "answer_request takes it."
        ),
        log_level="WARNING",
    )

    async def delegate_task(
        task: str,
        agent: str | None = None,
        context: str | None = None,
        budget: int | None = None,
        background: bool = False,
        ctx: Any = None,
    ) -> dict[str, Any]:
        """Hand a task to a fanfold agent (a durable tree of sub-agents).

        Args:
            task: What the agent is to do.
            agent: The agent definition to run as (see list_sub_agents); default: none.
            context: Background the agent needs, put before the task.
            budget: Token budget of the whole tree (the agent and its sub-agents).
            background: Return the delegation's id at once instead of waiting.
        """
        try:
            asker = None if ctx is None else elicitation_asker(ctx)
            return await service.delegate(agent, task, context, budget, background, asker)
        except DelegationError as exc:
            raise ToolError(str(exc)) from None

    async def list_sub_agents() -> list[dict[str, Any]]:
        """The agents delegate_task can hand work to, with what each is for."""
        return service.sub_agents()

    async def get_delegation_result(
        delegation_id: str, wait: bool = False, ctx: Any = None
    ) -> dict[str, Any]:
        """The status of a delegation and, once it has ended, its result.

        Args:
            delegation_id: The id delegate_task returned.
            wait: Wait until the delegation has ended.
        """
        try:
            asker = None if ctx is None or not wait else elicitation_asker(ctx)
            return await service.result(delegation_id, wait, asker)
        except DelegationError as exc:
            raise ToolError(str(exc)) from None

    async def approve_request(
        request_id: str, arguments: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Approve a delegation's request for a person's decision: its tool call runs.

        Args:
            request_id: A request id from get_delegation_result's requests.
            arguments: Run the call with these arguments instead of the agent's.
        """
        try:
            return await service.decide(request_id, "grant", arguments, "")
        except DelegationError as exc:
            raise ToolError(str(exc)) from None

    async def deny_request(request_id: str, reason: str) -> dict[str, Any]:
        """Deny a delegation's request: its tool call never runs; the agent reads why.

        Args:
            request_id: A request id from get_delegation_result's requests.
            reason: Why (the agent reads it).
        """
        try:
            return await service.decide(request_id, "deny", None, reason)
        except DelegationError as exc:
            raise ToolError(str(exc)) from None

    async def answer_request(request_id: str, text: str) -> dict[str, Any]:
        """Answer a delegation's question (its ask_user request): text is the answer.

        Args:
            request_id: A request id from get_delegation_result's requests.
            text: The answer.
        """
        try:
            return await service.decide(request_id, "answer", None, text)
        except DelegationError as exc:
            raise ToolError(str(exc)) from None

    # The SDK hands a tool its request's Context through a parameter annotated with
    # the class (read with get_type_hints): set here, where the SDK is imported.
    delegate_task.__annotations__["ctx"] = Context
    get_delegation_result.__annotations__["ctx"] = Context
    server.add_tool(delegate_task)
    server.add_tool(list_sub_agents, annotations=ToolAnnotations(read_only_hint=True))
    server.add_tool(get_delegation_result, annotations=ToolAnnotations(read_only_hint=True))
    server.add_tool(approve_request)
    server.add_tool(deny_request)
    server.add_tool(answer_request)
    return server
