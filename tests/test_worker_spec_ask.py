"""``run --detach --ask`` (issue 35): a detached tree's spec carries its ask rules and
approval timeout, as input version 2 (a worker of before refuses it rather than run
the tree without asking); the queue's input is checked field by field. No worker here:
``test_worker_parking.py`` runs one."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from fanfold.cli import cli
from fanfold.worker.spec import SpecError, TreeSpec

pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")

URL = "postgresql://u@127.0.0.1:1/q"


def _queued(monkeypatch: Any) -> list[TreeSpec]:
    import fanfold.worker.client

    queued: list[TreeSpec] = []

    def enqueue(_url: str, spec: TreeSpec) -> str:
        queued.append(spec)
        return "id1"

    monkeypatch.setattr(fanfold.worker.client, "enqueue_tree", enqueue)
    return queued


def test_run_detach_carries_ask_rules_and_approval_timeout(monkeypatch: Any) -> None:
    queued = _queued(monkeypatch)
    done = CliRunner().invoke(
        cli,
        ["run", "--detach", "--dbos-db", URL, "--ask", "Bash(git push:*)", "--ask", "deploy",
         "--approval-timeout", "30", "x"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    [spec] = queued
    assert spec.ask == ("Bash(git push:*)", "deploy") and spec.approval_timeout == 30.0
    data = json.loads(json.dumps(spec.to_input()))
    assert data["version"] == 2
    assert TreeSpec.from_input(data) == spec
    assert spec.make_limits().approval_timeout == 30.0
    # Without them the input is version 1, as before.
    assert TreeSpec("abc", "t", "/x").to_input()["version"] == 1


def test_run_detach_refuses_what_only_a_run_here_can_do(monkeypatch: Any) -> None:
    queued = _queued(monkeypatch)
    for extra in (["--ask-user"], ["--no-wait"]):
        done = CliRunner().invoke(cli, ["run", "--detach", "--dbos-db", URL, *extra, "x"])
        assert done.exit_code != 0 and "--ask-user and --no-wait" in done.output, done.output
    bad = CliRunner().invoke(cli, ["run", "--detach", "--dbos-db", URL, "--ask", "Bash(", "x"])
    assert bad.exit_code != 0 and bad.output.startswith("error: --ask: "), bad.output
    assert "Traceback" not in bad.output and queued == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"ask": "bash"}, "ask"),
        ({"ask": ["Bash("]}, "ask"),
        ({"ask": [3]}, "ask"),
        ({"ask": ["bash"] * 101}, "ask"),
        ({"approval_timeout": 0}, "approval_timeout"),
        ({"approval_timeout": True}, "approval_timeout"),
        ({"approval_timeout": float("inf")}, "approval_timeout"),
        ({"version": 1}, "version 2"),  # rules under version 1: a worker of before drops them
    ],
)
def test_a_malformed_ask_from_the_queue_is_refused(change: dict[str, Any], named: str) -> None:
    data = {**TreeSpec("abc", "t", "/x", ask=("bash",)).to_input(), **change}
    with pytest.raises(SpecError, match=named):
        TreeSpec.from_input(data)


def test_a_wake_names_a_tree_and_generation_and_is_due_by_decision_or_time() -> None:
    from fanfold.worker.parking import WaitingTree, due, wake_id
    from fanfold.worker.spec import wake_from_input, wake_input

    assert wake_from_input(wake_input("abc", 3)) == ("abc", 3)
    assert wake_id("abc", 3) == "wake:abc:3"
    for bad in ({"version": 1, "root_id": "../x", "generation": 1},
                {"version": 1, "root_id": "abc", "generation": 0},
                {"version": 1, "root_id": "abc", "generation": True}, ["abc", 1]):  # fmt: skip
        with pytest.raises(SpecError):
            wake_from_input(bad)
    trees = [
        WaitingTree("a", 1, ("a:1",), None),
        WaitingTree("b", 1, ("b:1",), 100.0),
        WaitingTree("c", 2, ("c:1", "c:2"), 300.0),
    ]
    assert [t.root_id for t in due(trees, set(), now=50.0)] == []
    assert [t.root_id for t in due(trees, {"c:2"}, now=200.0)] == ["b", "c"]
    assert [t.root_id for t in due(trees, {"a:1"}, now=0.0)] == ["a"]
