"""Where a forked conversation came from, wherever its log is now.

A fork's row names its source (``forked_from``, ``forked_at_seq``), but the column
``forked_from`` is a key of the conversations table: a fork imported into a database
that does not hold its source (yet) cannot name it there. ``import_raw`` keeps
``forked_at_seq`` and leaves ``forked_from`` empty then; the source's id is in the
fork's own seq 0 ``ConversationForked`` (``source_id``), which this reads. So ``show``,
``ls``, ``diff``, ``transcript``, the trace page and ``export`` name the same source
in every database the fork is in, and an export of an imported fork is the file it was
imported from (issue 34).
"""

from __future__ import annotations

import attrs

from fanfold.db import ConversationRow, Store
from fanfold.statemachine import (
    ApprovalDenied,
    ApprovalGranted,
    Conversation,
    ConversationForked,
    DecisionEdit,
    Edit,
    ForkEdited,
    LimitsEdit,
    ReplyEdit,
    SystemPromptEdit,
    TaskEdit,
    ToolResultEdit,
    UserAnswered,
)
from fanfold.statemachine.state import tree_path


@attrs.frozen
class Lineage:
    """A fork's source conversation ``source_id`` and the seq ``seq`` it was forked after."""

    source_id: str
    seq: int


def lineage(store: Store, row: ConversationRow) -> Lineage | None:
    """The source of the conversation ``row`` if it is a fork, else None.

    Reads the fork's seq 0 only for a row whose source is not stored here (an imported
    fork: ``forked_at_seq`` without ``forked_from``); every other row answers from its
    columns."""
    if row.forked_from is not None:
        return Lineage(row.forked_from, int(row.forked_at_seq or 0))
    if row.forked_at_seq is None:
        return None
    forked = first_event(store, row.id)
    return None if forked is None else Lineage(forked.source_id, forked.source_seq)


def first_event(store: Store, conversation_id: str) -> ConversationForked | None:
    """The conversation's seq 0 if it is a ``ConversationForked``, else None."""
    first = store.events(conversation_id, limit=1)
    event = first[0].event if first else None
    return event if isinstance(event, ConversationForked) else None


def fork_edit(store: Store, conversation_id: str) -> Edit | None:
    """The edit a fork's conversation was made with: the one in its seq 0 (a tree
    fork's), or a root at rest's, recorded as ``ForkEdited`` at its seq 1."""
    events = store.events(conversation_id, limit=2)
    if not events or not isinstance(events[0].event, ConversationForked):
        return None
    if events[0].event.edit is not None:
        return events[0].event.edit
    if len(events) > 1 and isinstance(events[1].event, ForkEdited):
        return events[1].event.edit
    return None


@attrs.frozen
class ForkOrigin:
    """Where a fork's tree was made: its root's ``source`` (``Lineage``), the
    conversation the user picked (``agent``: its place in the fork's tree, ``root`` for
    a root forked at rest) and that conversation's step ``seq`` in the source, and the
    fork's ``edit`` if any (``edit_text``: a short description of it, ``describe_edit``).
    ``agent``/``seq`` are the root's for a tree fork written before forks recorded the
    picked conversation (issue 34) and made without an edit."""

    source: Lineage
    agent: str
    seq: int
    edit: Edit | None
    edit_text: str | None


def fork_origin(store: Store, root_id: str) -> ForkOrigin | None:
    """The ``ForkOrigin`` of the tree whose root is ``root_id``, None if it is no fork.

    Reads seq 0 (and a root's seq 1) of the fork's conversations: the picked one is
    the one whose ``ConversationForked`` says ``picked`` (or, in an older fork, holds
    the edit)."""
    row = store.conversation(root_id)
    source = lineage(store, row)
    if source is None:
        return None
    forked = first_event(store, root_id)
    picked_id, picked = root_id, forked
    if forked is not None and not forked.picked and forked.edit is None:
        for other in store.tree(root_id):
            if other.id == root_id or (other.forked_from is None and other.forked_at_seq is None):
                continue  # the root, or a conversation the fork started itself
            event = first_event(store, other.id)
            if event is not None and (event.picked or event.edit is not None):
                picked_id, picked = other.id, event
                break
    edit = fork_edit(store, picked_id)
    seq = picked.source_seq if picked is not None else source.seq
    before = picked.state if picked is not None else None
    return ForkOrigin(
        source,
        tree_path(picked_id, root_id),
        seq,
        edit,
        None if edit is None else describe_edit(edit, before),
    )


def _decision_text(decision: ApprovalGranted | ApprovalDenied | UserAnswered) -> str:
    match decision:
        case ApprovalGranted(call=call, arguments_json=str(arguments)):
            return f"call {call} approved with {_quoted(arguments)}"
        case ApprovalGranted(call=call):
            return f"call {call} approved"
        case ApprovalDenied(call=call, reason=reason):
            return f"call {call} denied: {_quoted(reason)}"
        case UserAnswered(call=call, text=text):
            return f"call {call} answered: {_quoted(text)}"
    return f"call {decision.call}"  # pragma: no cover - the decisions are exhausted


def describe_edit(edit: Edit, before: Conversation | None = None) -> str:
    """A short description of ``edit`` for a listing (recorded text cut to a few
    words; the caller escapes it): ``reply: "..."``, ``reply: calls bash``, ``result
    of CALL``, ``task: "..."``, ``system prompt``, ``limits: max_rounds 25 -> 10``
    (the fields that differ from ``before``'s limits, when given)."""
    match edit:
        case ReplyEdit(reply=reply):
            if reply.tool_calls:
                return "reply: calls " + ", ".join(c.name for c in reply.tool_calls)
            return f"reply: {_quoted(reply.text)}"
        case ToolResultEdit(result=result):
            return f"result of {result.tool_call_id}: {_quoted(result.content)}"
        case DecisionEdit(decision=decision):
            return _decision_text(decision)
        case TaskEdit(task=task):
            return f"task: {_quoted(task)}"
        case SystemPromptEdit():
            return "system prompt"
        case LimitsEdit(limits=limits):
            old = before.limits if before is not None else None
            changed = [
                f"{f.name} {getattr(old, f.name)!r} -> {getattr(limits, f.name)!r}"
                if old is not None
                else f"{f.name}={getattr(limits, f.name)!r}"
                for f in attrs.fields(type(limits))
                if old is None or getattr(old, f.name) != getattr(limits, f.name)
            ]
            return "limits: " + (", ".join(changed) if changed else "unchanged")
    return type(edit).__name__  # pragma: no cover - the edits are exhausted


def _quoted(text: str, limit: int = 40) -> str:
    line = " ".join(text.split())
    return '"' + (line if len(line) <= limit else line[: limit - 3] + "...") + '"'
