"""A refusal's wording is a recorded fact (``Conversation.wording``, issue 33): a
``read-only`` refusal of an MCP tool says that its server does not mark it
``readOnlyHint`` in a tree written today, and keeps the wording an older fanfold
recorded in a tree written then, so that both verify identical.

``tests/fixtures/logs/s7-mcp-read-only.db`` was written at 7fa2ef8 (before the new
wording) by ``s7-mcp-read-only-writer.py``; the second test runs the same writer with
today's fanfold."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from fanfold import statemachine
from fanfold.db import Store
from fanfold.replay import verify
from fanfold.statemachine import ToolResultMessage

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
WRITER = FIXTURES / "s7-mcp-read-only-writer.py"
SERVER = Path(__file__).with_name("mcp_notify_server.py")
# (Read so, not imported, so that this file runs against the code before the wording
# was recorded, and fails there by what it checks.)
WORDING: int = getattr(statemachine, "WORDING", 1)
OLD = (
    "mcp__notes__echo refused: no allow rule of agent 'reader' matches this call "
    "(allowed: read-only)"
)


def _refusals(store: Store, conversation_id: str) -> list[str]:
    state = store.load_state(conversation_id)
    return [
        m.result.content
        for m in state.history
        if isinstance(m, ToolResultMessage) and "refused" in m.result.content
    ]


def test_an_old_logs_read_only_refusal_of_an_mcp_tool_verifies_as_recorded(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    shutil.copyfile(FIXTURES / "s7-mcp-read-only.db", path)
    with Store.open(path) as store:
        (root,) = store.list_roots()
        report = verify(store, root.id, tree=True)
        assert report.ok, report
        assert _refusals(store, root.id + ".1") == [OLD]
        assert getattr(store.load_state(root.id + ".1"), "wording", 0) == 0


async def test_a_tree_written_today_records_its_wording_and_its_children_inherit_it(
    tmp_path: Path,
) -> None:
    pytest.importorskip("mcp")
    spec = importlib.util.spec_from_file_location("s7_writer", WRITER)
    assert spec is not None and spec.loader is not None
    writer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(writer)
    path = tmp_path / "new.db"
    await writer.main(str(path), str(tmp_path / "key"), str(SERVER))
    with Store.open(path) as store:
        (root,) = store.list_roots()
        child = root.id + ".1"
        assert store.load_state(root.id).wording == store.load_state(child).wording == WORDING
        assert _refusals(store, child) == [
            OLD + "; read-only takes an MCP tool only if its server marks it readOnlyHint, "
            "and server 'notes' does not mark 'mcp__notes__echo'"
        ]
        assert verify(store, root.id, tree=True).ok
