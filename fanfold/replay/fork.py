"""``fork``: a new tree that starts from a stored state.

A root at rest is forked alone (a new tree of one conversation). Any other step of any
conversation (a sub-agent, or a conversation with work in flight) forks its whole tree
as it was at the moment that step was taken: every conversation of the tree that
existed then, in its state then, under the fork's ids. The runtime continues such a
fork as it recovers a tree after a crash (``RuntimeResumed`` re-issues what was in
flight); nothing is written to the source. See DESIGN.md, "Time travel".
"""

from __future__ import annotations

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
    Conversation,
    ConversationForked,
    Edit,
    Error,
    ForkEdited,
    Idle,
    IllegalTransition,
    Roster,
    ToolCall,
    ToolResult,
    spawn_order,
    start,
    transition,
)


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
) -> str:
    """Fork ``conversation_id`` after its event ``at_seq``; returns the new root's id
    (``new_id`` or a fresh one).

    ``edit``: an edit of ``conversation_id``, written in the fork's own transaction
    (a fork is never in the log without it): for a root at rest as a ``ForkEdited``
    event at the fork's seq 1, for a tree fork in that conversation's
    ``ConversationForked`` (delivered as the fork goes on; ``fork_tree``). The caller
    checks it first (``fork_at``); the reducer refuses one that does not fit.

    A root at rest there: a new root conversation whose state is the source's (below).
    Anything else, for a tree this user's key marks (``key``): the whole tree as it
    was at the moment of that step (see ``fork_tree``).

    The fork's seq 0 is ``ConversationForked`` holding that state, and its row links
    to the source (``forked_from``, ``forked_at_seq``). The source is not touched. A
    fork continues like any stored conversation: send it a user message through the
    runtime. The fork is a new tree marked with ``key`` (default: this user's key,
    ``UserKey.load()``), so a runtime of this user may continue it, whatever the
    source's provenance: a root at rest has nothing in flight, so nothing of the
    source's log runs without the model being asked first.

    A tree another user or machine wrote (or an imported one) is forked only at a
    root's rest: otherwise raises ForkRefused naming the nearest seqs where it can be
    (its work in flight would run, tools included, with no model asked first). Also
    raises NoSuchStep, UnknownConversation, LogCorrupt or LogDiverged (the state at
    ``at_seq`` must replay identically), and ForkRefused if ``new_id`` is taken.
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
    if row.is_sub_agent:
        if not own:
            raise ForkRefused(
                f"cannot fork {conversation_id!r}: it is a sub-agent of a tree this "
                f"runtime did not write (root {row.root_id!r}); such a tree is forked only "
                "at its root's rest",
                conversation_id=conversation_id,
                seq=at_seq,
            )
        return fork_tree(store, conversation_id, at_seq, new_id=new_id, now=now, key=key, edit=edit)
    state: Conversation | None = None
    at_rest: list[int] = []
    for outcome in replay_conversation(store, conversation_id):
        if isinstance(outcome, Finding):
            if state is None:
                raise LogCorrupt(outcome)
            break  # the state to fork is sound; only later suggestions are lost
        if not outcome.matches:
            if state is None:
                raise LogDiverged(Divergence.of(outcome))
            break
        if _at_rest(outcome.after_state):
            at_rest.append(outcome.seq)
        if outcome.seq == at_seq:
            state = outcome.after_state
            if _at_rest(state):
                break
    if state is None:  # pragma: no cover - the row's last_seq bounds at_seq
        raise NoSuchStep(conversation_id, at_seq, row.last_seq)
    if not _at_rest(state) and own:
        return fork_tree(store, conversation_id, at_seq, new_id=new_id, now=now, key=key, edit=edit)
    if not _at_rest(state):
        before = max((s for s in at_rest if s < at_seq), default=None)
        after = min((s for s in at_rest if s > at_seq), default=None)
        nearest = " and ".join(str(s) for s in (before, after) if s is not None)
        hint = f"the nearest seqs where it can be are {nearest}" if nearest else "none can be"
        raise ForkRefused(
            f"cannot fork {conversation_id!r} at seq {at_seq}: it is "
            f"{type(state.phase).__name__} there, with work in flight; a conversation can "
            f"be forked only at rest (Idle or Error): {hint}",
            conversation_id=conversation_id,
            seq=at_seq,
            before=before,
            after=after,
        )
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
    forked = fork(store, target, at_seq, new_id=new_id, now=now, key=key, edit=edit)
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
) -> str:
    """Fork the tree of ``conversation_id`` at the moment its event ``at_seq`` was
    taken; returns the new root's id.

    ``edit``: an edit of ``conversation_id`` as the fork goes on, written in its copy's
    ``ConversationForked`` (the fork's transaction); ``Runtime.resume`` delivers it as
    ``ForkEdited`` in place of that copy's ``RuntimeResumed``. The reducer's ``start``
    refuses (IllegalTransition) an edit its state does not admit.

    The moment is a place in the tree's interleaved log (``steps(tree=True)``: by
    recorded time, then write order): every conversation of the tree created by then
    is copied in its state then, under the fork's ids (the root's id replaced by the
    new one, ``R.1.2`` -> ``F.1.2``), each with a seq 0 ``ConversationForked`` naming
    its source and the source's seq. Ancestors are copied waiting as they were;
    siblings as they were: a finished one keeps its outcome (delivered to its parent
    on resume if the parent had not accepted it yet), a running one is continued. A
    child its parent had asked for but that did not exist yet is created when the
    fork is resumed. The source is not touched.

    The fork continues through the runtime's ``resume`` (``RuntimeResumed`` re-issues
    each conversation's work in flight: model calls, sub-agents, tools not started;
    a tool that was running gets the interrupted result, as after a crash). Raises
    LogCorrupt or LogDiverged if the tree up to that moment does not replay
    identically, NoSuchStep, UnknownConversation.
    """
    row = store.conversation(conversation_id)
    if not 0 <= at_seq <= row.last_seq:
        raise NoSuchStep(conversation_id, at_seq, row.last_seq)
    root = row.root_id
    states: dict[str, tuple[int, Conversation]] = {}
    for step in steps(store, root, tree=True):
        if not step.matches:
            raise LogDiverged(Divergence.of(step))
        states[step.conversation_id] = (step.seq, step.after_state)
        if step.conversation_id == conversation_id and step.seq == at_seq:
            break
    fork_id = new_id or uuid.uuid4().hex[:12]
    if new_id is not None and _exists(store, new_id):
        raise ForkRefused(
            f"cannot fork {conversation_id!r} as {new_id!r}: that id is taken",
            conversation_id=conversation_id,
            seq=at_seq,
        )
    rename = _renamer(root, fork_id)
    stamp = time.time() if now is None else now
    key = key if key is not None else UserKey.load()
    # The fork goes on with its source's provider unless `resume` is told another:
    # the source is this user's own tree (``fork`` checks), so its record is trusted.
    source_record = store.tree_record(root)
    provider = source_record.provider if source_record is not None else None
    tree = TreeRecord(
        fork_id, Origin.RUNTIME, mark=key.mark(store.instance_id, fork_id), provider=provider
    )
    written = []
    # Parents before children (a child's row names its parent), in spawn order.
    for source_id in sorted(states, key=lambda cid: (cid.count("."), spawn_order(cid))):
        source_seq, state = states[source_id]
        copied = _renamed(state, rename)
        assert isinstance(copied, Conversation)
        pending = edit if source_id == conversation_id else None
        event = ConversationForked(copied.id, source_id, source_seq, copied, pending)
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
    if isinstance(value, ToolCall | ToolResult):
        return value  # a call's id is the provider's, not a conversation's
    if attrs.has(type(value)):
        changes = {
            field.name: _renamed(getattr(value, field.name), rename)
            for field in attrs.fields(type(value))
            if field.name not in _TEXT_FIELDS
        }
        changed = {k: v for k, v in changes.items() if v is not getattr(value, k)}
        return attrs.evolve(value, **changed) if changed else value
    return value
