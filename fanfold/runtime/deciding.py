"""The runtime's side of a human in the loop (issue 35): the requests open in the
conversations loaded here, the decisions that answer them (written by this process or
another's ``fanfold approve``, polled from the decisions table, turned into events),
and trees parked while they wait only for people. ``Runtime`` has these methods from
``Deciding``; what the requests and decisions are is ``approvals.py``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import trio

from fanfold.db import Store
from fanfold.runtime.actor import Actor
from fanfold.runtime.approvals import (
    ANSWER,
    CLOSED_BEFORE,
    DENY,
    GRANT,
    Decision,
    Decisions,
    PendingRequest,
    RequestClosed,
    UnknownRequest,
    check_decision,
    closed_why,
    open_request,
    split_request_id,
    stale_mark,
)
from fanfold.runtime.placement import Placement
from fanfold.runtime.results import ParkedTree
from fanfold.statemachine import (
    AwaitingRetry,
    AwaitingSubAgents,
    CancellingSubAgents,
    Conversation,
    IllegalTransition,
    LlmRequesting,
    ToolExecuting,
    canonical_json,
)


class Deciding:
    """The requests and decisions of the conversations a ``Runtime`` has loaded (a part
    of ``Runtime``, not used alone): its attributes below are set by ``Runtime``."""

    store: Store
    logger: Any
    placement: Placement | None
    decisions: Decisions
    decision_poll: float
    _nursery: trio.Nursery
    _actors: dict[str, Actor]
    _open_requests: dict[str, PendingRequest]
    _request_watchers: list[trio.MemorySendChannel[PendingRequest]]
    _applying: set[str]
    _closed_why: dict[str, str]
    _unmarked: dict[str, str]
    _polling: bool

    def now(self) -> float:
        """The runtime's clock (``Runtime.now``)."""
        raise NotImplementedError

    def request_opened(self, state: Conversation) -> None:
        """A conversation's call waits for a person (its RequestApproval or AskUser
        effect, first issued or re-issued by a restart): show it, and read the
        decisions table for it."""
        request = open_request(state, self.now())
        if request is None or request.id in self._open_requests:
            return
        self._open_requests[request.id] = request
        for channel in list(self._request_watchers):
            try:
                channel.send_nowait(request)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                self._request_watchers.remove(channel)
        if not self._polling:
            self._polling = True
            self._nursery.start_soon(self._poll_decisions)

    def _closed_without_decision(self, request: PendingRequest, after: Conversation) -> None:
        """``request`` closed without a decision (a cancel, its approval timeout, a
        fork's edit): a decision row written for it that this runtime has not taken
        (written just before the close, after the last poll) would stay ``new`` for
        ever; it is marked stale with the reason, after the close's commit. A row
        written after this mark is settled by its writer (``approvals.settle``): one
        of the two always sees the other."""
        why = closed_why(after, request.tool_call_id)
        self._closed_why[request.id] = why
        if len(self._closed_why) > 1000:  # only the latest matter (a racing decision)
            del self._closed_why[next(iter(self._closed_why))]
        self._unmarked[request.id] = stale_mark(why)
        self._nursery.start_soon(self._mark_closed, request.id)

    async def _mark_closed(self, request: str) -> None:
        mark = self._unmarked.get(request)
        if mark is not None:
            await trio.to_thread.run_sync(self.decisions.mark_new, request, mark)
            self._unmarked.pop(request, None)

    def _flush_closed_marks(self) -> None:
        """The stale marks a closing runtime had not written yet (its nursery was
        cancelled first): written now, so none is lost to a run that stops at once."""
        for request, mark in list(self._unmarked.items()):
            with contextlib.suppress(Exception):  # a closing runtime reports nothing more
                self.decisions.mark_new(request, mark)
        self._unmarked.clear()

    def waiting_for_people(self, root_id: str) -> bool:
        """Whether tree ``root_id`` can go on only after a person's decision: it has an
        open request, and no conversation of it loaded here has work of its own in
        flight (a model call, a retry, a running tool, a cancel) or events queued.
        ``fanfold run --no-wait`` stops there (and ``resume`` too)."""
        if not any(r.tree == root_id for r in self._open_requests.values()):
            return False
        tree = [a for a in self._actors.values() if a.state.root_id == root_id]
        for actor in tree:
            if actor.queued or actor.has_inbox:
                return False
            phase = actor.state.phase
            match phase:
                case ToolExecuting(asking=None) | LlmRequesting() | AwaitingRetry():
                    return False
                case CancellingSubAgents():
                    return False
                case AwaitingSubAgents(children=children) if children.summary is not None:
                    return False
        return True

    def unload_tree(self, root_id: str) -> ParkedTree | None:
        """Forget tree ``root_id`` while it waits only for people (``waiting_for_people``),
        so that waiting costs this runtime nothing; None (and nothing changed) if it does
        not wait only for people, a decision of it is being applied, or children of it
        run in chunks elsewhere (``placement.py``: their outcomes come to it here).

        Its conversations' timers are stopped and their open requests dropped from
        ``pending``; the log holds the tree as it was (``running``, its requests open).
        ``resume([root_id], ...)`` takes it back: ``RuntimeResumed`` re-issues each
        request and timer (a time limit or approval timeout keeping its first start:
        downtime counts). The result names the requests (a decision written for one
        is the reason to resume it) and the earliest timer deadline, on this runtime's
        clock (``now``): resume it then, and what was due fires (``fanfold worker``
        does both; DESIGN.md "A human in the loop", "On workers")."""
        if not self.waiting_for_people(root_id):
            return None
        requests = [r for r in self._open_requests.values() if r.tree == root_id]
        if any(r.id in self._applying for r in requests):
            return None
        if self.placement is not None and self.store.placements(root_id):
            return None
        tree = [a for a in self._actors.values() if a.state.root_id == root_id]
        for request in requests:
            del self._open_requests[request.id]
        now, clock = self.now(), trio.current_time()
        dues = [due for due in (actor.park() for actor in tree) if due is not None]
        due = now + max(0.0, min(dues) - clock) if dues else None
        self.logger.info("tree_unloaded", root_id=root_id, requests=len(requests), due=due)
        return ParkedTree(root_id, tuple(r.id for r in requests), due)

    def pending(self) -> list[PendingRequest]:
        """The requests open in the conversations loaded here, oldest first."""
        return list(self._open_requests.values())

    async def requests(self) -> AsyncGenerator[PendingRequest, None]:
        """Every request open now, then each new one as it is asked, for as long as the
        caller iterates (a web app or a chat bot asking its user)."""
        send, receive = trio.open_memory_channel[PendingRequest](10_000)
        for request in self.pending():
            send.send_nowait(request)
        self._request_watchers.append(send)
        try:
            async with receive:
                async for request in receive:
                    yield request
        finally:
            if send in self._request_watchers:
                self._request_watchers.remove(send)

    async def approve(
        self,
        request: PendingRequest | str,
        arguments: Mapping[str, Any] | None = None,
        *,
        by: str = "",
    ) -> None:
        """Approve ``request`` (a ``PendingRequest`` or its id): its call runs, with
        ``arguments`` instead of the model's when given (checked against the tool's
        schema and the rules again). Returns once the decision is in the log.
        Raises UnknownRequest (no such open request here), AlreadyDecided (someone
        decided first: another process, another caller), BadDecision (a question, or
        arguments the schema refuses)."""
        text = None if arguments is None else canonical_json(dict(arguments))
        await self._decide(request, GRANT, text, "", by)

    async def deny(self, request: PendingRequest | str, reason: str, *, by: str = "") -> None:
        """Deny ``request``: its call never runs; its result is "denied by the user:
        ``reason``" (a question denied too: the person declines to answer). Raises as
        ``approve`` does."""
        await self._decide(request, DENY, None, reason, by)

    async def answer(self, request: PendingRequest | str, text: str, *, by: str = "") -> None:
        """Answer the ``ask_user`` question ``request``: ``text`` is its result. Raises
        as ``approve`` does (BadDecision for a request that is not a question)."""
        await self._decide(request, ANSWER, None, text, by)

    async def _decide(
        self, request: PendingRequest | str, kind: str, arguments: str | None, text: str, by: str
    ) -> None:
        key = request if isinstance(request, str) else request.id
        found = self._open_requests.get(key)
        if found is None:
            if key in self._closed_why:
                raise RequestClosed(CLOSED_BEFORE + self._closed_why[key])
            raise UnknownRequest(f"no open request {key!r} in this runtime")
        actor = self._actors.get(found.conversation_id)
        if actor is None:
            raise UnknownRequest(f"no open request {key!r} in this runtime")
        check_decision(actor.state, found, kind, arguments)
        decision = Decision(key, kind, arguments, text, by, self.now())
        self._applying.add(key)
        try:
            await trio.to_thread.run_sync(self.decisions.write, decision)
            problem = await self._apply_decision(decision)
        finally:
            self._applying.discard(key)
        if problem is not None:
            if key in self._closed_why:
                raise RequestClosed(CLOSED_BEFORE + self._closed_why[key])
            raise UnknownRequest(f"request {key!r}: {problem}")

    async def _apply_decision(
        self, decision: Decision, marks: list[tuple[str, str]] | None = None
    ) -> str | None:
        """Turn ``decision`` into its event and mark its row (or add the mark to
        ``marks``, written by the caller); the reducer's refusal (the request ended or
        was decided meanwhile) is returned, its row marked stale."""
        split = split_request_id(decision.request)
        actor = None if split is None else self._actors.get(split[0])
        if actor is None:
            return "its conversation is not loaded here"
        problem = None
        try:
            await actor.submit(decision.event())
            state = "applied"
        except IllegalTransition as exc:
            problem = exc.reason
            why = self._closed_why.get(decision.request)
            # Closed before it (a cancel, a timeout committed first): say so, as the
            # close's own mark does.
            state = f"stale: {exc.reason}" if why is None else stale_mark(why)
        if marks is not None:
            marks.append((decision.request, state))
        else:
            await trio.to_thread.run_sync(self.decisions.mark, decision.request, state)
        return problem

    async def _poll_decisions(self) -> None:
        """Read the decisions written for the requests open here (by this process or
        another: ``fanfold approve``) and turn each into its event, once. Runs while
        a request is open; ``request_opened`` starts it again for the next."""
        while True:
            if not self._open_requests:
                # Checked and cleared with no await between: a request opened after
                # this starts a new poll.
                self._polling = False
                return
            waiting = [r for r in self._open_requests if r not in self._applying]
            found = await trio.to_thread.run_sync(self.decisions.new, waiting)
            found = [d for d in found if d.request not in self._applying]
            if found:
                for decision in found:
                    self._applying.add(decision.request)
                marks: list[tuple[str, str]] = []
                try:
                    async with trio.open_nursery() as nursery:
                        for decision in found:
                            nursery.start_soon(self._apply_decision, decision, marks)
                    await trio.to_thread.run_sync(self.decisions.mark_many, marks)
                finally:
                    for decision in found:
                        self._applying.discard(decision.request)
            await trio.sleep(self.decision_poll)
