"""Format 7's caches and a waiting sub-agent's heap (issue 21's 4 KiB, kept under issue
34): what the fingerprint keeps per conversation shares the digests a tree's
conversations have in common, and a pending child's roster item leaves no memoised
text behind (``tests/test_runtime_memory.py`` measures the whole heap)."""

from __future__ import annotations

import importlib

from fanfold.db import codec
from fanfold.statemachine import Conversation, Limits, LlmRequesting
from fanfold.statemachine.children import ChildSpec, PendingChild
from fanfold.statemachine.messages import ToolSpec, UserMessage

F = importlib.import_module("fanfold.db.fingerprint")
C = importlib.import_module("fanfold.db.codec")


def _memoised(value: object) -> bool:
    memos = (C._compact_memo.entries, C._untagged_memo.entries)
    return any(id(value) in entries and entries[id(value)][0] is value for entries in memos)


def test_an_unkept_compact_text_leaves_the_memos_as_they_were() -> None:
    spec = ChildSpec("r.1", "task 1", "/w", None, 5, "s")
    child = PendingChild(spec, True)
    text = codec.compact_text_unkept(child)
    assert not _memoised(child) and not _memoised(spec)
    assert text == codec.compact_text(
        PendingChild(ChildSpec("r.1", "task 1", "/w", None, 5, "s"), True)
    )
    # A text memoised before the call stays memoised.
    codec.compact_text(PendingChild(spec, False))
    assert _memoised(spec)
    codec.compact_text_unkept(PendingChild(spec, True))
    assert _memoised(spec)


def test_a_pending_childs_roster_item_is_digested_without_memoising_it() -> None:
    F.clear_cache()
    spec = ChildSpec("r.2", "task 2", "/w", None, 5, "s")
    child = PendingChild(spec, True)
    assert F._chunks.digest(("r", 0), (child,)) == F._chunks.digest(
        ("x", 0), (PendingChild(spec, True),)
    )
    assert not _memoised(child) and not _memoised(spec)


def _child_state(number: int, tools: tuple[ToolSpec, ...], limits: Limits) -> Conversation:
    # Each child's own str objects for the values a tree shares, as a log decodes them.
    return Conversation(
        id=f"root.{number}",
        parent_id="".join(["ro", "ot"]),
        root_id="".join(["ro", "ot"]),
        depth=1,
        cwd="".join(["/w", "ork"]),
        task=f"task {number}",
        system_prompt="you are a sub-agent",
        model=None,
        limits=limits,
        tools=tools,
        history=(UserMessage(f"task {number}"),),
        phase=LlmRequesting(1),
    )


def test_conversations_of_a_tree_share_their_common_field_digests() -> None:
    F.clear_cache()
    tools = (ToolSpec("bash", "run a command", '{"type":"object"}'),)
    limits = Limits()
    states = [_child_state(n, tools, limits) for n in (1, 2)]
    for state in states:
        F.state_changes(state, None)
    first, second = (F._state_digests.entries[s.id][1] for s in states)
    names = F._STATE_FIELDS
    for name in ("parent_id", "root_id", "cwd", "tools", "limits", "system_prompt", "timeout"):
        index = names.index(name)
        assert first[index] == second[index], name
        assert first[index] is second[index], name  # one str object, not one per child
    for name in ("id", "task", "history"):
        index = names.index(name)
        assert first[index] != second[index], name


def test_a_replay_keeps_a_pending_childs_texts_and_only_within_it() -> None:
    F.clear_cache()
    spec = ChildSpec("r.3", "task 3", "/w", None, 5, "s")
    with F.texts_kept():
        F._chunks.digest(("r", 0), (PendingChild(spec, True),))
        assert _memoised(spec)  # for the finished item the replay digests next
    assert F._item_bytes.keeping == 0
    other = ChildSpec("r.4", "task 4", "/w", None, 5, "s")
    F._chunks.digest(("r", 0), (PendingChild(other, True),))
    assert not _memoised(other)
