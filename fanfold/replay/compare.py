"""Two trees side by side: where each agent's conversation parts from its counterpart.

``compare(store, a, b)`` matches the conversations of two trees by their place in the
tree (``root``, ``root/1``, ``root/1/2``) and, for each pair, replays both logs (the
reducer only; nothing runs) and finds the first thing the model was sent or said that
differs: a user message, a reply's text, a tool call (name and arguments), a tool
result (name, content, error flag). Tool-call ids and the tree's own id inside texts
(``<root>.1`` in a fan-in result) are left out of the comparison: two runs of one task
get fresh ids, and a fork gets a new root id, without anything having changed.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence

import attrs

from fanfold.db import RawLog, Store, UnknownConversation
from fanfold.replay.core import replay_log
from fanfold.replay.errors import LogCorrupt
from fanfold.replay.lineage import lineage
from fanfold.replay.report import Finding, ReplayStep
from fanfold.replay.stepping import steps
from fanfold.statemachine import AssistantMessage, Message, ToolResultMessage, UserMessage
from fanfold.statemachine.state import tree_path


@attrs.frozen
class Said:
    """One item of a conversation as compared: ``kind`` (``user``, ``assistant``,
    ``tool_call``, ``tool_result``), ``text`` as recorded (a tool call: its name and
    argument JSON), and ``seq``, the step it entered the history."""

    seq: int
    kind: str
    text: str
    key: str = attrs.field(repr=False, eq=False)  # what is compared (ids left out)


@attrs.frozen
class Parting:
    """Where two conversations part: the ``index``-th item of each (None: that one has
    no item there, it ended or stopped earlier)."""

    index: int
    a: Said | None
    b: Said | None


@attrs.frozen
class AgentPair:
    """The conversations at ``path`` in each tree (None: none there) and where they
    part (None: they said the same things, or one of them does not exist)."""

    path: str
    a_id: str | None
    b_id: str | None
    parting: Parting | None
    # What each conversation was sent and said (``said``), kept for a view that shows
    # the two side by side (the trace page); empty for a conversation not there.
    a_items: tuple[Said, ...] = attrs.field(default=(), repr=False, eq=False)
    b_items: tuple[Said, ...] = attrs.field(default=(), repr=False, eq=False)


def said(store: Store, conversation_id: str) -> list[Said]:
    """What ``conversation_id``'s model was sent and said, item by item, each with the
    seq it entered the history (replayed from the log)."""
    own_ids = _own_ids(store, store.conversation(conversation_id).root_id)
    return _said(steps(store, conversation_id), own_ids)


def _own_ids(store: Store, root: str) -> re.Pattern[str]:
    """The tree's id followed by a child's number: "<root>.1" in a fan-in result; a
    fork's history holds its source tree's ids, so those too."""
    roots = _ancestry(store, root)
    names = "|".join(re.escape(root) for root in sorted(roots, key=len, reverse=True))
    return re.compile(f"(?:{names})" + r"(?=\.\d)")


def _said(replayed: Iterable[ReplayStep], own_ids: re.Pattern[str]) -> list[Said]:
    items: list[Said] = []
    length = 0
    for step in replayed:
        history = step.after_state.history
        # The reducer only appends to a history; should a step ever shorten it, what
        # follows is read from its start again.
        length = length if len(history) >= length else 0
        for message in history[length:]:
            items.extend(_items(step.seq, message, own_ids))
        length = len(history)
    return items


def _checked(log: RawLog) -> Iterator[ReplayStep]:
    """A conversation's replayed steps (as ``steps``); LogCorrupt where it is damaged."""
    for outcome in replay_log(log):
        if isinstance(outcome, Finding):
            raise LogCorrupt(outcome)
        yield outcome


def _ancestry(store: Store, root: str) -> set[str]:
    """``root`` and the roots of the trees it was forked from, and theirs."""
    found = {root}
    source = _source_of(store, root)
    while source is not None and source not in found:
        found.add(source)
        try:
            row = store.conversation(source)
        except UnknownConversation:
            break  # a fork imported without its source: its id is all there is
        found.add(row.root_id)
        source = _source_of(store, row.root_id)
    return found


def _source_of(store: Store, conversation_id: str) -> str | None:
    # The lineage, not the row's column: an imported fork's source may have come in
    # later (issue 34), and its column stays empty.
    source = lineage(store, store.conversation(conversation_id))
    return None if source is None else source.source_id


def _items(seq: int, message: Message, own_ids: re.Pattern[str]) -> Iterator[Said]:
    def item(kind: str, text: str, key: str) -> Said:
        return Said(seq, kind, text, own_ids.sub("<root>", key))

    match message:
        case UserMessage(text=text):
            yield item("user", text, text)
        case AssistantMessage(text=text, tool_calls=calls):
            if text or not calls:
                yield item("assistant", text, text)
            for call in calls:
                shown = f"{call.name} {call.arguments_json}"
                yield item("tool_call", shown, shown)
        case ToolResultMessage(result=result):
            shown = f"{result.name}{' (error)' if result.is_error else ''}: {result.content}"
            yield item("tool_result", shown, shown)


def first_parting(a: list[Said], b: list[Said]) -> Parting | None:
    """The first index where ``a`` and ``b`` differ (by kind and compared text), or
    None if they are the same."""
    for index in range(max(len(a), len(b))):
        left = a[index] if index < len(a) else None
        right = b[index] if index < len(b) else None
        if left is None or right is None or (left.kind, left.key) != (right.kind, right.key):
            return Parting(index, left, right)
    return None


def _path_order(path: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in path.split("/")[1:])


def compare(
    store: Store,
    a: str,
    b: str,
    *,
    with_items: bool = False,
    replayed: Mapping[str, Sequence[ReplayStep]] | None = None,
) -> list[AgentPair]:
    """The conversations of the trees of ``a`` and ``b`` (any of their conversations),
    matched by place, each pair with where it parts; ordered by place, root first.
    ``with_items``: each pair keeps what each side said (``a_items``, ``b_items``),
    a conversation in one tree only included. ``replayed``: conversations the caller
    has already replayed whole and undamaged (their steps, by id), not replayed again
    (the trace page has replayed the tree it shows)."""
    known = replayed or {}
    trees = []
    for tree in (a, b):
        root = store.conversation(tree).root_id
        ids = [row.id for row in store.tree(root)]
        # A tree's logs are read in one go (a 1,000-agent tree's one by one cost four
        # times its replay), and only if the caller has not replayed it already.
        logs = {} if known.keys() >= set(ids) else {log.row.id: log for log in store.raw_tree(root)}
        trees.append(({tree_path(cid, root): cid for cid in ids}, logs, _own_ids(store, root)))

    def items(cid: str, logs: dict[str, RawLog], own_ids: re.Pattern[str]) -> list[Said]:
        return _said(known[cid] if cid in known else _checked(logs[cid]), own_ids)

    (left, a_logs, a_ids), (right, b_logs, b_ids) = trees
    pairs = []
    for path in sorted({*left, *right}, key=_path_order):
        a_id, b_id = left.get(path), right.get(path)
        both = a_id is not None and b_id is not None
        a_items = items(a_id, a_logs, a_ids) if a_id and (both or with_items) else []
        b_items = items(b_id, b_logs, b_ids) if b_id and (both or with_items) else []
        parting = first_parting(a_items, b_items) if both else None
        kept = (tuple(a_items), tuple(b_items)) if with_items else ((), ())
        pairs.append(AgentPair(path, a_id, b_id, parting, *kept))
    return pairs


LINE_DIFF_LIMIT = 5000
"""Items with more lines than this are not compared line by line (a line diff is
quadratic at worst): every line of both counts as differing."""


def differing_lines(a: Said, b: Said) -> tuple[list[int], list[int]]:
    """The lines (0-based, of ``text.split("\\n")``) of ``a`` and of ``b`` that the
    other does not have where they are aligned: what a side-by-side view marks.

    Lines are compared as items are (``key``: the trees' own ids left out), so a line
    that differs only by the tree's id is not marked.
    """
    a_lines, b_lines = _lines(a), _lines(b)
    if max(len(a_lines), len(b_lines)) > LINE_DIFF_LIMIT:
        return list(range(len(a_lines))), list(range(len(b_lines)))
    matcher = difflib.SequenceMatcher(None, a_lines, b_lines, autojunk=False)
    a_marked: list[int] = []
    b_marked: list[int] = []
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag != "equal":
            a_marked.extend(range(a0, a1))
            b_marked.extend(range(b0, b1))
    return a_marked, b_marked


def _lines(item: Said) -> list[str]:
    # The key's lines, unless replacing ids changed how many there are (an id holding
    # a line break): then the text's, so that line numbers are the shown text's.
    shown, compared = item.text.split("\n"), item.key.split("\n")
    return compared if len(compared) == len(shown) else shown
