"""What the Runtime's API returns and raises: turn results, tree views and steps, the
resume plan, and the errors a call refuses with. Values only: nothing here touches the
log or Trio."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from fanfold.statemachine import Conversation, Effect, Event, Phase, TurnOutcome
from fanfold.statemachine.control_tools import MAX_TASK_CHARS


@attrs.frozen
class ParkedTree:
    """A tree ``Runtime.unload_tree`` let go while it waits for people."""

    root_id: str
    requests: tuple[str, ...]
    """The ids of its open requests."""
    due: float | None
    """When its earliest timer (a time limit, an approval timeout) is due, in seconds
    since the epoch (the runtime's clock); None: no timer."""


class NotAtRest(ValueError):
    """The conversation has work in flight; ``resume()`` it instead of attaching."""


class MessageTooLong(ValueError):
    """A user message (``start``'s task, ``send``'s text) longer than
    ``MAX_TASK_CHARS`` (1,000,000 characters), the limit a model's ``delegate_task``
    and ``spawn_agents`` tasks have: refused before anything is recorded (issue 33.9:
    a 50 MB task grew the log by 420 MB)."""

    def __init__(self, length: int) -> None:
        self.length = length
        super().__init__(
            f"the message is too long ({length:,} characters, at most {MAX_TASK_CHARS:,})"
        )


def check_message(text: str) -> None:
    if len(text) > MAX_TASK_CHARS:
        raise MessageTooLong(len(text))


class MissingTools(ValueError):
    """The tree recorded Python function tools this runtime's tool runner does not
    have: continued, every call of one would get an "unknown tool" error result.
    ``root_id`` is the tree, ``names`` the tools (in recorded order). Raised, before
    anything is recorded, by ``resume(roots=...)``, ``send`` and ``attach``; a plain
    ``resume()`` skips such a tree instead (``resume_plan``). Open the runtime with
    the tools the tree was started with."""

    def __init__(self, root_id: str, names: Sequence[str]) -> None:
        self.root_id = root_id
        self.names = tuple(names)
        super().__init__(f"tree {root_id}: {missing_reason(self.names)}")


def missing_reason(names: Sequence[str]) -> str:
    listed = ", ".join(repr(n) for n in names)
    return (
        f"it recorded Python tool(s) {listed} that this runtime's tools do not include: "
        "open the runtime with the tools the tree was started with"
    )


@attrs.frozen
class TurnResult:
    """How a root's turn or a sub-agent's life ended.

    ``outcome`` is the ``TurnOutcome`` of the latest finished turn (a ``StrEnum``, so
    ``result.outcome == "answered"`` still holds), or None for a conversation at rest
    that has finished no turn yet (a fork of a root at rest, before its first message).
    ``text`` is that turn's answer or error ("" with no turn); ``phase`` the name of
    the conversation's phase."""

    conversation_id: str
    outcome: TurnOutcome | None
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


@attrs.frozen
class TreeStep:
    """One committed step of a tree, as ``Runtime.events`` yields it.

    ``path`` is the conversation's place (``root``, ``root/1/2``); ``event`` and
    ``effects`` are what the log holds at ``seq``; ``at`` its logged time. ``phase``
    is the conversation's phase after the step, folded by the reducer from its seq
    0, or None from a step today's reducer does not reproduce on (a log of an older
    fanfold: the event itself is still given)."""

    conversation_id: str
    path: str
    seq: int
    event: Event
    effects: tuple[Effect, ...]
    phase: Phase | None
    at: float
