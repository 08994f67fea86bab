"""``notifications/tools/list_changed`` during ``fanfold send`` and ``fanfold resume``
(issue 33, item 8): these commands bind the tools a tree recorded, and now also take
what a server lists anew after it said its tools changed, between rounds, as ``fanfold
run`` does (a ``ToolsChanged`` recorded in the log, so verify needs no server). The
server is a real process (tests/mcp_notify_server.py): its ``grow`` adds ``late``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio
from runtime_helpers import reply

pytest.importorskip("mcp")

from fanfold.db import Store
from fanfold.mcp.config import ServerDeclaration
from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import ToolFinished
from fanfold.tools.registry import ToolSet

SERVER = Path(__file__).with_name("mcp_notify_server.py")


def _results(db: Path, conversation_id: str) -> list[tuple[str, str, bool]]:
    with Store.open(db, read_only=True) as store:
        return [
            (e.event.result.name, e.event.result.content, e.event.result.is_error)
            for e in store.events(conversation_id)
            if isinstance(e.event, ToolFinished)
        ]


def _kinds(db: Path, conversation_id: str) -> list[str]:
    with Store.open(db, read_only=True) as store:
        return [e.type for e in store.raw_log(conversation_id).events]


@pytest.mark.slow
def test_send_and_resume_offer_a_tool_the_server_adds_from_the_next_round(
    tmp_path: Path,
) -> None:
    """Two trees recorded with the server's tools (``late`` not among them): ``first``
    at rest, ``second`` interrupted with its model call in flight. ``fanfold send`` to
    the first and ``fanfold resume`` of the second each run ``grow`` then, in the next
    round, ``late``, answered by the server; each log holds the ``ToolsChanged``, and
    ``replay --verify --tree`` says identical once the server's declaration is gone."""
    from click.testing import CliRunner

    from fanfold.cli import cli

    declared = ServerDeclaration(
        "notes", "test", command=sys.executable, args=(str(SERVER), str(tmp_path))
    )
    db = tmp_path / "run.db"
    at_first = ScriptedProvider(
        {
            "agents": [
                {"match": {"task": "first"}, "replies": [reply("hi")]},
                {"match": {"task": "second"}, "replies": [reply("never", latency=60)]},
            ]
        }
    )

    async def make_trees() -> tuple[str, str]:
        async with Runtime.open(
            db, at_first, ToolSet.default(), logger=quiet_logger(), mcp_servers=[declared]
        ) as runtime:
            first = await runtime.start("first", cwd=tmp_path)
            assert (await runtime.wait(first)).text == "hi"
            second = await runtime.start("second", cwd=tmp_path)
            # Closed with the second's model call in flight: unfinished in the log.
            return first, second

    first, second = trio.run(make_trees)
    with Store.open(db, read_only=True) as store:
        recorded = {t.name for t in store.load_state(second).tools}
    assert "mcp__notes__grow" in recorded and "mcp__notes__late" not in recorded

    config = tmp_path / "mine.toml"
    config.write_text(
        "[mcp_servers.notes]\n"
        + f"command = {json.dumps(sys.executable)}\n"
        + f"args = [{json.dumps(str(SERVER))}, {json.dumps(str(tmp_path))}]\n"
    )
    grow_then_late = [
        {"tool_calls": [{"name": "mcp__notes__grow", "arguments": {}}]},
        {"tool_calls": [{"name": "mcp__notes__late", "arguments": {}}]},
    ]
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "agents": [
                    {
                        "match": {"task": "first"},
                        "replies": [{"text": "hi"}, *grow_then_late, {"text": "one"}],
                    },
                    {"match": {"task": "second"}, "replies": [*grow_then_late, {"text": "two"}]},
                ]
            }
        )
    )
    runner = CliRunner()
    options = ["--script", str(script), "--config", str(config), "--db", str(db)]
    sent = runner.invoke(cli, ["send", first, "more", *options, "--no-live"])
    assert sent.exit_code == 0, sent.output
    resumed = runner.invoke(cli, ["resume", *options])
    assert resumed.exit_code == 0, resumed.output
    expected = [
        ("mcp__notes__grow", "grown", False),
        ("mcp__notes__late", "late answer", False),
    ]
    assert _results(db, first) == expected
    assert _results(db, second) == expected
    for tree in (first, second):
        kinds = _kinds(db, tree)
        # Folded before grow's result: the next request offered ``late``.
        assert kinds[kinds.index("ToolsChanged") + 1] == "ToolFinished"
    assert (tmp_path / "calls").read_text().split() == ["grow", "late", "grow", "late"]
    config.unlink()
    for tree in (first, second):
        verify = runner.invoke(cli, ["replay", tree, "--db", str(db), "--verify", "--tree"])
        assert verify.exit_code == 0, verify.output
        assert "identical" in verify.output
