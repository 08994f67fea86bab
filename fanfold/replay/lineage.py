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
from fanfold.statemachine import ConversationForked, Edit, ForkEdited


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
