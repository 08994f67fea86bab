"""``fork``: a new tree that starts from a stored state.

A root at rest is forked alone (a new tree of one conversation). Any other step of any
conversation (a sub-agent, or a conversation with work in flight) forks its whole tree
as it was at the moment that step was taken: every conversation of the tree that
existed then, in its state then, under the fork's ids. The runtime continues such a
fork as it recovers a tree after a crash (``RuntimeResumed`` re-issues what was in
flight); nothing is written to the source. See DESIGN.md, "Time travel".
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

import attrs

from fanfold.db import Step, Store, UnknownConversation
from fanfold.db.provenance import Origin, TreeRecord, UserKey, refusal
from fanfold.replay.core import replay_conversation
from fanfold.replay.errors import EditRefused, ForkRefused, LogCorrupt, LogDiverged, NoSuchStep
from fanfold.replay.report import Divergence, Finding
from fanfold.replay.stepping import state_at, steps
from fanfold.replay.transcript import agent_id
from fanfold.statemachine import (
    CancelReason,
    CancelRequested,
    Conversation,
    ConversationForked,
    Edit,
    Error,
    Event,
    ForkEdited,
    Idle,
    IllegalTransition,
    Message,
    Roster,
    SubAgentFinished,
    ToolCall,
    ToolExecuting,
    ToolResult,
    ToolResultMessage,
    spawn_order,
    start,
    transition,
)
from fanfold.statemachine.messages import canonical_json
from fanfold.statemachine.state import tree_path


def _at_rest(state: Conversation) -> bool:
    return state.parent_id is None and isinstance(state.phase, Idle | Error)


def fork(
    store: Store,
    conversation_id: str,
    at_seq: int,
    *,
    new_id: str | None = None,
    now: float | None = None,
    key: UserKey | None = None,
    edit: Edit | None = None,
    rerun_siblings: bool = False,
) -> str:
    """Fork ``conversation_id`` after its event ``at_seq``; returns the new root's id
    (``new_id`` or a fresh one).

    ``edit``: an edit of ``conversation_id``, written in the fork's own transaction
    (a fork is never in the log without it): for a root at rest as a ``ForkEdited``
    event at the fork's seq 1, for a tree fork in that conversation's
    ``ConversationForked`` (delivered as the fork goes on; ``fork_tree``). The caller
    checks it first (``fork_at``); the reducer refuses one that does not fit.

    A root at rest there: a new root conversation whose state is the source's (below).
    Anything else: the whole tree as it was at the moment of that step, the
    conversations off the picked one's chain taking their recorded future from the
    source unless ``rerun_siblings`` (see
    ``fork_tree``).

    The fork's seq 0 is ``ConversationForked`` holding that state, and its row links
    to the source (``forked_from``, ``forked_at_seq``). The source is not touched. A
    fork continues like any stored conversation: send it a user message through the
    runtime. The fork is a new tree marked with ``key`` (default: this user's key,
    ``UserKey.load()``), so a runtime of this user may continue it, whatever the
    source's provenance: a root at rest has nothing in flight, so nothing of the
    source's log runs without the model being asked first.

    A tree another user or machine wrote (or an imported one) is forked at any step
    too, into a tree of this user's whose live part starts at the fork (``fork_tree``
    with ``own=False``: nothing its log decided runs; ForkRefused where a recorded
    tool call would). Also raises NoSuchStep, UnknownConversation, LogCorrupt or
    LogDiverged (the state at ``at_seq`` must replay identically), and ForkRefused if
    ``new_id`` is taken.
    """
    row = store.conversation(conversation_id)
    if not 0 <= at_seq <= row.last_seq:
        raise NoSuchStep(conversation_id, at_seq, row.last_seq)
    if new_id is not None and _exists(store, new_id):
        raise ForkRefused(
            f"cannot fork {conversation_id!r} as {new_id!r}: that id is taken",
            conversation_id=conversation_id,
            seq=at_seq,
        )
    key = key if key is not None else UserKey.load()
    own = refusal(store.tree_record(row.root_id), key, store.instance_id, row.root_id) is None

    def with_its_tree() -> str:
        return fork_tree(
            store,
            conversation_id,
            at_seq,
            new_id=new_id,
            now=now,
            key=key,
            edit=edit,
            own=own,
            rerun_siblings=rerun_siblings,
        )

    if row.is_sub_agent:
        return with_its_tree()
    state: Conversation | None = None
    for outcome in replay_conversation(store, conversation_id):
        if isinstance(outcome, Finding):
            if state is None:
                raise LogCorrupt(outcome)
            break  # the state to fork is sound; only later suggestions are lost
        if not outcome.matches:
            if state is None:
                raise LogDiverged(Divergence.of(outcome))
            break
        if outcome.seq == at_seq:
            state = outcome.after_state
            break
    if state is None:  # pragma: no cover - the row's last_seq bounds at_seq
        raise NoSuchStep(conversation_id, at_seq, row.last_seq)
    if not _at_rest(state):
        return with_its_tree()
    fork_id = new_id or uuid.uuid4().hex[:12]
    event = ConversationForked(fork_id, conversation_id, at_seq, state)
    forked, effects = start(event)
    stamp = time.time() if now is None else now
    tree = TreeRecord(fork_id, Origin.RUNTIME, mark=key.mark(store.instance_id, fork_id))
    written = [Step(fork_id, 0, event, effects, forked, stamp, user_initiated=True, tree=tree)]
    if edit is not None:
        # At rest: nothing in flight, so the edit takes effect from the next turn on,
        # recorded at seq 1 in the same transaction as the fork.
        edited, edit_effects = transition(forked, ForkEdited(edit))
        assert edit_effects == ()  # at rest: nothing to re-issue, nothing to run
        written.append(
            Step(fork_id, 1, ForkEdited(edit), (), edited, stamp, snapshot=True, before=forked)
        )
    store.append(written)
    return fork_id


@attrs.frozen
class Forked:
    """What ``fork_at`` made.

    ``fork_id`` is the new tree's root; ``edited_id`` the picked conversation's id in
    the fork. ``goes_on``: the fork has work in flight (a tree fork), continued by
    ``resume``; False for a root forked at rest, continued by a new user message.
    The edit, if any, is in the log with the fork (``fork``): ``resume`` of the fork
    delivers it."""

    fork_id: str
    edited_id: str
    goes_on: bool


def fork_at(
    store: Store,
    conversation_id: str,
    at_seq: int,
    *,
    agent: str | None = None,
    edit: Edit | None = None,
    new_id: str | None = None,
    going_on: bool = False,
    now: float | None = None,
    key: UserKey | None = None,
    rerun_siblings: bool = False,
) -> Forked:
    """Fork the tree of ``conversation_id`` after step ``at_seq`` of its conversation
    ``agent`` (a place, ``root/1/2`` or ``1/2``, or an id of that tree; None:
    ``conversation_id`` itself), with at most one ``edit`` of that conversation.

    The one implementation of ``fanfold fork`` and ``Runtime.fork``. The edit is
    checked first against the conversation's state at ``at_seq`` with the reducer
    itself (the transition table's ``ForkEdited`` column): one it refuses raises
    EditRefused naming where it is legal, before anything is written. A root at rest
    is forked alone (``fork``) and its edit recorded at once, at the fork's seq 1.
    Anything else forks the whole tree (``fork_tree``) and the edit, written in the
    fork's transaction, takes effect as the fork goes on (``resume`` delivers it in
    place of that conversation's ``RuntimeResumed``): that needs ``going_on`` (the
    caller continues the fork at once), else EditRefused and nothing is written.
    ``rerun_siblings``: the conversations off the picked one's chain go on live from
    the moment too, instead of taking their recorded future from the source.
    Raises what ``fork`` raises, and LookupError for an ``agent`` not in the tree.
    """
    target = agent_id(store, conversation_id, agent)
    if edit is not None:
        state = state_at(store, target, at_seq)
        try:
            transition(state, ForkEdited(edit))
        except IllegalTransition as exc:
            raise EditRefused(
                f"cannot edit {target} at seq {at_seq}: {exc.reason}",
                conversation_id=target,
                seq=at_seq,
            ) from None
        if not (state.parent_id is None and state.at_rest) and not going_on:
            raise EditRefused(
                "an edit of a conversation with work in flight takes effect as the fork "
                "goes on: add --continue (Runtime.fork: go_on=True); nothing was written",
                conversation_id=target,
                seq=at_seq,
            )
    source_root = store.conversation(target).root_id
    # The fork and its edit are one transaction (issue 32.2): a fork written first and
    # its edit only once it ran could be killed between, and then resumed unedited,
    # running the very reply the user replaced.
    forked = fork(
        store,
        target,
        at_seq,
        new_id=new_id,
        now=now,
        key=key,
        edit=edit,
        rerun_siblings=rerun_siblings,
    )
    goes_on = len(store.tree(forked)) > 1 or not store.load_state(forked).at_rest
    edited_id = forked + target[len(source_root) :]
    return Forked(forked, edited_id, goes_on)


def _exists(store: Store, conversation_id: str) -> bool:
    try:
        store.conversation(conversation_id)
    except UnknownConversation:
        return False
    return True


def fork_tree(
    store: Store,
    conversation_id: str,
    at_seq: int,
    *,
    new_id: str | None = None,
    now: float | None = None,
    key: UserKey | None = None,
    edit: Edit | None = None,
    own: bool = True,
    rerun_siblings: bool = False,
) -> str:
    """Fork the tree of ``conversation_id`` at the moment its event ``at_seq`` was
    taken; returns the new root's id.

    ``own``: the source is a tree this user's key marks. False for a tree from
    elsewhere (imported, copied): the fork is still this user's tree, but it records
    no provider (it goes on only with the one the user names: ``fork --continue
    --script/--config/...`` or ``resume --script ...``), and it is refused
    (ForkRefused, nothing written) where one of its conversations, in the state the
    fork copies, would start a tool call the log decided: a round's calls after the
    running one (``recorded_calls_that_would_run``). A conversation taking its
    recorded future holds the results the log recorded for its calls (data: nothing
    is called), so only calls the source has no result for are refused; the refusal
    says when the other way of copying the siblings (``rerun_siblings``) starts none.
    A running call with no recorded result gets the "not run in this fork" result as
    in every fork (``Runtime`` never runs it again); a model call in flight is asked
    again of the user's provider. So what runs is what the user's edit and the user's
    model decide from the fork on (issue 34; DESIGN, "Security model").

    ``edit``: an edit of ``conversation_id`` as the fork goes on, written in its copy's
    ``ConversationForked`` (the fork's transaction); ``Runtime.resume`` delivers it as
    ``ForkEdited`` in place of that copy's ``RuntimeResumed``. The reducer's ``start``
    refuses (IllegalTransition) an edit its state does not admit.

    The moment is a place in the tree's interleaved log (``steps(tree=True)``: by
    recorded time, then write order): every conversation of the tree created by then
    is copied in its state then, under the fork's ids (the root's id replaced by the
    new one, ``R.1.2`` -> ``F.1.2``), each with a seq 0 ``ConversationForked`` naming
    its source and the source's seq. The picked conversation and its ancestors (the
    chain) are copied as they were then: they go on live. Every other conversation
    (siblings, their sub-agents, the picked one's own children) takes its recorded
    future from the source (``_copied_states``): it is copied in its state at the
    last step of the source that the edit cannot have changed (``forked_at_seq``
    names it), so a sibling whose tool finished after the moment keeps that result
    and a sibling that finished keeps its outcome (delivered to its parent on resume
    if the parent had not accepted it yet); the sub-agents such a sibling started
    after the moment are copied too. ``rerun_siblings``: every conversation is
    copied as it was at the moment instead, and what it had in flight runs again
    live. A child its parent had asked for but that did not exist yet is created
    when the fork is resumed. The source is not touched.

    The fork continues through the runtime's ``resume`` (``RuntimeResumed`` re-issues
    each conversation's work in flight: model calls, sub-agents, tools not started;
    a tool that was running there, with no result taken from the source, is not run
    again: its result says so, ``FORKED_TOOL_RESULT``). Raises LogCorrupt or
    LogDiverged if the tree up to that moment (or a copied future) does not replay
    identically, NoSuchStep, UnknownConversation.
    """
    row = store.conversation(conversation_id)
    if not 0 <= at_seq <= row.last_seq:
        raise NoSuchStep(conversation_id, at_seq, row.last_seq)
    root = row.root_id
    states = _copied_states(store, root, conversation_id, at_seq, rerun_siblings=rerun_siblings)
    fork_id = new_id or uuid.uuid4().hex[:12]
    if new_id is not None and _exists(store, new_id):
        raise ForkRefused(
            f"cannot fork {conversation_id!r} as {new_id!r}: that id is taken",
            conversation_id=conversation_id,
            seq=at_seq,
        )
    if not own:
        # Checked on the states the fork copies: a conversation taking its recorded
        # future holds the results its source recorded (data, nothing called), so
        # only a call with no result there would run (DESIGN, "Time travel").
        would_run = _would_run(states)
        if would_run:
            named = ", ".join(
                f"{tree_path(cid, root)} {call.name} ({call.id})" for cid, call in would_run
            )
            # The other way of copying the siblings may start none: say so.
            other = _copied_states(
                store, root, conversation_id, at_seq, rerun_siblings=not rerun_siblings
            )
            instead = ""
            if not _would_run(other):
                instead = (
                    "; without --rerun-siblings"
                    if rerun_siblings
                    else "; or --rerun-siblings (they go on from that moment)"
                )
                instead += " none would run"
            raise ForkRefused(
                f"cannot fork {conversation_id!r} at seq {at_seq}: the tree was not written "
                f"by this runtime, and going on from that moment would run tool calls its "
                f"log decided and has no result for: {named}; fork the step before the "
                "reply that asked for them (with --reply, or --continue to ask the model "
                f"again){instead}",
                conversation_id=conversation_id,
                seq=at_seq,
            )
    rename = _renamer(root, fork_id)
    stamp = time.time() if now is None else now
    key = key if key is not None else UserKey.load()
    # The fork goes on with its source's provider unless `resume` is told another:
    # the source is this user's own tree (``fork`` checks), so its record is trusted.
    source_record = store.tree_record(root)
    provider = source_record.provider if source_record is not None and own else None
    tree = TreeRecord(
        fork_id, Origin.RUNTIME, mark=key.mark(store.instance_id, fork_id), provider=provider
    )
    written = []
    # Parents before children (a child's row names its parent), in spawn order.
    for source_id in sorted(states, key=lambda cid: (cid.count("."), spawn_order(cid))):
        source_seq, state = states[source_id]
        copied = _renamed(state, rename)
        assert isinstance(copied, Conversation)
        picked = source_id == conversation_id
        pending = edit if picked else None
        event = ConversationForked(copied.id, source_id, source_seq, copied, pending, picked)
        forked, effects = start(event)
        is_root = forked.parent_id is None
        written.append(
            Step(
                forked.id,
                0,
                event,
                effects,
                forked,
                stamp,
                user_initiated=is_root,
                tree=tree if is_root else None,
            )
        )
    store.append(written)
    return fork_id


def _would_run(states: dict[str, tuple[int, Conversation]]) -> list[tuple[str, ToolCall]]:
    """The recorded tool calls (with their conversation's source id) that going on
    with these copied states would start without a model asked."""
    return [
        (source_id, call)
        for source_id, (_, state) in states.items()
        for call in recorded_calls_that_would_run(state)
    ]


def recorded_calls_that_would_run(state: Conversation) -> tuple[ToolCall, ...]:
    """The tool calls of ``state`` that going on from it would start without a model
    asked: a round's calls after the running one (``RuntimeResumed`` runs them in
    order, as after a crash; an edit of the conversation too, but a reply edit, which
    replaces the round). The running call is not among them: a fork's copy still at
    its seq 0 gets the "not run in this fork" result for it (``Runtime``)."""
    phase = state.phase
    return phase.remaining if isinstance(phase, ToolExecuting) else ()


def _copied_states(
    store: Store, root: str, picked: str, at_seq: int, *, rerun_siblings: bool
) -> dict[str, tuple[int, Conversation]]:
    """Each conversation the fork copies, by source id: the seq and state it is copied
    in.

    Up to the moment (``picked``'s step ``at_seq`` in the tree's interleaved log)
    every conversation's state then. After it, unless ``rerun_siblings``, the source's
    recorded future of every conversation off the chain (``picked`` and its
    ancestors, which go on live), step by step in the same order, as long as nothing
    that goes on live can have reached it. Only two events reach a conversation from
    outside itself: a cancel from its parent, and the outcome of one of its children.
    So a conversation's future stops (it goes on live from there) at the first cancel
    whose sender goes on live (its parent, unless the cancel is the user's own), or
    at the first outcome of a child that goes on live. A sub-agent created after the
    moment is copied if its parent's copied state had started it (the parent on the
    chain at the moment, or still copied then): its creation carries out a decision
    taken before the edit could reach the parent; one started later by a parent that
    goes on live is made again by it. The chain goes on live from the moment: the
    picked conversation is edited there, and each ancestor waits for the outcome of a
    child that goes on live.
    """
    states: dict[str, tuple[int, Conversation]] = {}
    replayed = steps(store, root, tree=True)
    for step in replayed:
        if not step.matches:
            raise LogDiverged(Divergence.of(step))
        states[step.conversation_id] = (step.seq, step.after_state)
        if step.conversation_id == picked and step.seq == at_seq:
            break
    if rerun_siblings:
        return states
    live = _chain(states, picked)
    try:
        for step in replayed:
            cid = step.conversation_id
            if cid in live:
                continue
            if not step.matches:
                # Today's reducer does not reproduce this step: the copy stops before
                # it (a fork's state must replay identically), and it goes on live.
                live.add(cid)
            elif step.seq == 0:
                parent = step.after_state.parent_id
                if parent is not None and parent in states and _started(states[parent][1], cid):
                    states[cid] = (0, step.after_state)
                else:
                    live.add(cid)  # started by a live decision after the moment: made again
            elif cid not in states or _reached_by(step.event, states[cid][1], live):
                live.add(cid)
            else:
                states[cid] = (step.seq, step.after_state)
    except LogCorrupt:
        pass  # a damaged log after the moment: what was copied so far is sound
    return states


def _started(parent: Conversation, child: str) -> bool:
    """Whether ``parent`` (its state copied into the fork) had started ``child``: the
    child's creation carries out a decision taken in that state, not after it."""
    children = parent.children
    return children is not None and any(
        pending.started and pending.spec.id == child for pending in children.pending
    )


def _chain(states: dict[str, tuple[int, Conversation]], picked: str) -> set[str]:
    """``picked`` and its ancestors (source ids)."""
    chain: set[str] = set()
    current: str | None = picked
    while current is not None and current not in chain and current in states:
        chain.add(current)
        current = states[current][1].parent_id
    return chain


def _reached_by(event: Event, state: Conversation, live: set[str]) -> bool:
    """Whether ``event`` of a conversation in ``state`` came from one that goes on
    live (so the fork cannot take it, nor what follows it, from the source)."""
    match event:
        case CancelRequested(reason=reason):
            # A sub-agent is cancelled by its parent (its time limit, its own cancel,
            # a failed sequential step); the user's own cancel is the source's fact.
            return reason is not CancelReason.USER and (
                state.parent_id is None or state.parent_id in live
            )
        case SubAgentFinished(child_id=child):
            return child in live
    return False


def _renamer(root: str, fork_id: str) -> Any:
    """The function from an id of the source tree (``R``, ``R.1.2``) to the fork's;
    any other text is returned as it is."""
    pattern = re.compile(re.escape(root) + r"((?:\.\d+)*)")

    def rename(text: str) -> str:
        match = pattern.fullmatch(text)
        return text if match is None else fork_id + match.group(1)

    return rename


# Fields that hold recorded text (model, user or tool words, prompts, paths) rather
# than ids: never rewritten, even where one equals an id of the tree.
_TEXT_FIELDS = frozenset(
    {
        "history",
        "task",
        "system_prompt",
        "sub_agent_prompt",
        "tools",
        "agents",
        "permissions",
        "cwd",
        "result",
        "error",
        "text",
        "model",
        "agent",
        "message",
        "content",
        "stop_details",
        "description",
    }
)


def _renamed(value: Any, rename: Any) -> Any:
    """``value`` with every id of the source tree it holds as an id (a conversation's
    own, its parent's and root's, its children's in its phase, those it wrote off)
    replaced by the fork's."""
    if type(value) is str:  # an enum's value (a StrEnum) is no id
        return rename(value)
    if isinstance(value, tuple | Roster):  # a Roster comes back a tuple: Children converts it
        return tuple(_renamed(item, rename) for item in value)
    if isinstance(value, ToolResult):
        return _fan_in_renamed(value, rename)
    if isinstance(value, ToolCall):
        return value  # a call's id is the provider's, not a conversation's
    if attrs.has(type(value)):
        changes = {
            field.name: _renamed(getattr(value, field.name), rename)
            for field in attrs.fields(type(value))
            if field.name not in _TEXT_FIELDS
        }
        if isinstance(value, Conversation):
            changes["history"] = _history_renamed(value.history, rename)
        changed = {k: v for k, v in changes.items() if v is not getattr(value, k)}
        return attrs.evolve(value, **changed) if changed else value
    return value


def _history_renamed(history: tuple[Message, ...], rename: Any) -> tuple[Message, ...]:
    """``history`` with the fan-in results it holds naming the fork's agents; every
    other message (model, user and tool words) as recorded. The same tuple if nothing
    changed."""
    renamed = tuple(
        ToolResultMessage(_fan_in_renamed(m.result, rename))
        if isinstance(m, ToolResultMessage)
        else m
        for m in history
    )
    return history if renamed == history else renamed


def _fan_in_renamed(result: ToolResult, rename: Any) -> ToolResult:
    """A ``spawn_agents`` fan-in result (the reducer's own JSON, ``fan_in_result``)
    with each ``agent_id`` that is an id of the source tree replaced by the fork's;
    any other result as it is (issue 34: a fork's conversations name the fork's agents,
    as the conversations it goes on with do)."""
    if result.name != "spawn_agents":
        return result
    try:
        payload = json.loads(result.content)
    except ValueError:
        return result  # an error result in words: no ids to rename
    entries = payload.get("sub_agent_results") if isinstance(payload, dict) else None
    if not isinstance(entries, list):
        return result
    changed = False
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("agent_id"), str):
            new = rename(entry["agent_id"])
            changed = changed or new != entry["agent_id"]
            entry["agent_id"] = new
    if not changed:
        return result
    return attrs.evolve(result, content=canonical_json(payload))
