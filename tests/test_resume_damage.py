"""One damaged tree never stops ``resume`` from recovering the others (issue 10.2).

Two trees are left unfinished by a runtime that closed mid-work; one of them is then
damaged the way an older fanfold could leave it (a bare NaN in a stored effect, which
SQLite's JSON functions call malformed) or the way a disk can (an event row that no
longer decodes). ``resume`` continues the healthy tree and names the damaged one with
the reason, leaving it untouched.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio
import trio.testing
from click.testing import CliRunner
from replay_helpers import as_format_5
from runtime_helpers import open_runtime, reply, script, spawn, submit

from fanfold.cli import cli
from fanfold.db import Store
from fanfold.statemachine import Idle


def _provider() -> object:
    return script(
        1.0, root=[reply("", spawn("a")), reply("done")], c1=[reply("", submit("a"), latency=30.0)]
    )


DAMAGE = {
    # An older fanfold wrote a model's NaN timeout into the log as a bare NaN.
    "nan in an effect": (
        'UPDATE effects SET payload = replace(payload, \'"delay":\', \'"delay":NaN,"x":\')'
        " WHERE type = 'StartTimer' AND conversation_id LIKE ?1"
    ),
    # A flipped byte: the latest event of the tree's root no longer decodes.
    "undecodable event": (
        "UPDATE events SET payload = substr(payload, 1, 20)"
        " WHERE conversation_id = ?1 AND seq = (SELECT max(seq) FROM events"
        " WHERE conversation_id = ?1)"
    ),
}


async def _two_unfinished_trees(tmp_path: Path) -> tuple[str, str]:
    async with open_runtime(tmp_path, _provider()) as runtime:
        first = await runtime.start("first", cwd=tmp_path)
        second = await runtime.start("second", cwd=tmp_path)
        await trio.sleep(5.0)  # both children are calling the model: both trees unfinished
    return first, second


def _damage(tmp_path: Path, root: str, how: str) -> None:
    if how == "nan in an effect":
        # Effect rows are in logs written before the events-only log: rewrite it so.
        as_format_5(tmp_path / "log.db")
    conn = sqlite3.connect(tmp_path / "log.db")
    with conn:
        pattern = f"{root}%" if how == "nan in an effect" else root
        changed = conn.execute(DAMAGE[how], [pattern]).rowcount
    conn.close()
    assert changed >= 1


@pytest.mark.parametrize("how", sorted(DAMAGE))
async def test_resume_skips_a_damaged_tree_and_resumes_the_others(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, how: str
) -> None:
    damaged, healthy = await _two_unfinished_trees(tmp_path)
    _damage(tmp_path, damaged, how)
    async with open_runtime(tmp_path, _provider()) as runtime:
        resumed = await runtime.resume()
        assert sorted(resumed) == [healthy, f"{healthy}.1"]
        (skipped,) = runtime.resume_damaged
        assert skipped.root_id == damaged
        assert "its log cannot be rebuilt" in skipped.reason
        result = await runtime.wait(healthy)
    assert result.text == "done"
    with Store.open(tmp_path / "log.db") as store:
        assert isinstance(store.load_state(healthy).phase, Idle)
        assert store.conversation(damaged).status == "running"  # left as it was


def test_cli_resume_names_the_damaged_tree_and_goes_on(tmp_path: Path) -> None:
    """``fanfold resume``: one line naming the damaged tree and why, the healthy tree
    resumed, exit status 1 (a tree was left)."""
    damaged, healthy = trio.run(_two_unfinished_trees_cli, tmp_path)
    _damage(tmp_path, damaged, "nan in an effect")
    result = CliRunner().invoke(
        cli, ["resume", "--script", str(tmp_path / "script.json"), "--db", str(tmp_path / "log.db")]
    )
    assert result.exit_code == 1, result.output
    assert f"skipped tree {damaged}: its log cannot be rebuilt" in result.output
    assert "resuming 2 conversation(s) in 1 tree(s)" in result.output
    with Store.open(tmp_path / "log.db") as store:
        assert isinstance(store.load_state(healthy).phase, Idle)


async def _two_unfinished_trees_cli(tmp_path: Path) -> tuple[str, str]:
    import json

    quick = {
        "latency": 0.0,
        "agents": [
            {"match": {"path": "root"}, "replies": [reply("", spawn("a")), reply("done")]},
            {"match": {"path": "root/1"}, "replies": [reply("", submit("a"))]},
        ],
    }
    (tmp_path / "script.json").write_text(json.dumps(quick))
    slow = script(
        1.0, root=[reply("", spawn("a")), reply("done")], c1=[reply("", submit("a"), latency=30.0)]
    )
    async with open_runtime(tmp_path, slow) as runtime:
        first = await runtime.start("first", cwd=tmp_path)
        second = await runtime.start("second", cwd=tmp_path)
        await trio.sleep(2.0)
    return first, second
