"""Issue 34: ``replay --verify`` catches every change in what the reducer decides, at its
step, and names the field.

Each test writes a log with the unchanged reducer (a root fanning out to three
sub-agents, each with a time limit and a token budget), then replaces one decision of
the reducer (``monkeypatch`` of ``fanfold.statemachine.transition``, the module the
public ``transition`` dispatches into) and verifies: the first divergence must be the
first step whose output changed, and its report must name the field. Before version-7
fingerprints a changed timer delay verified "identical" and a changed token count was
reported steps later, without the field.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from click.testing import CliRunner
from db_scenarios import BASH, ChildPlan, Driver
from replay_helpers import write

from fanfold import replay
from fanfold.cli import cli
from fanfold.db import Store
from fanfold.db.fingerprint import version
from fanfold.statemachine import (
    Conversation,
    ConversationCreated,
    Limits,
    ScheduleRetry,
    SpawnSubAgent,
    StartTimer,
    ToolCall,
    ToolResult,
    UserMessaged,
)
from fanfold.statemachine.permissions import UNRESTRICTED

REDUCER = importlib.import_module("fanfold.statemachine.transition")

Patch = Callable[[pytest.MonkeyPatch], None]


def _tree(driver: Driver) -> None:
    """The root r delegates three tasks (600 s time limit each, a token budget shared
    among them): r.1 runs a tool and submits, r.2 retries once, r.3 answers."""
    limits = Limits(max_tokens=90_000, max_depth=1)
    driver.create(ConversationCreated("r", cwd="/work", task=None, limits=limits, tools=(BASH,)))
    driver.feed("r", UserMessaged("go"))
    tasks = [{"task": f"part {i}", "timeout": 600} for i in range(3)]
    driver.reply("r", "delegating", ToolCall.of("r-spawn", "spawn_agents", {"tasks": tasks}))
    children = driver.spawn_children("r")
    plans: tuple[ChildPlan, ...] = ("tool", "retry", "result")
    for child, plan in zip(children, plans, strict=True):
        driver.run_child(child, plan)
        driver.deliver_outcome(child)
    driver.reply("r", "all done")


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Driver]:
    driver = Driver(snapshot_every=3)
    _tree(driver)
    path = tmp_path_factory.mktemp("verify34") / "log.db"
    write(path, driver.steps)
    return path, driver


def _first(driver: Driver, kind: type[Any]) -> tuple[str, int]:
    """The conversation and seq of the first step whose effects hold a ``kind``."""
    for step in driver.steps:
        if any(isinstance(e, kind) for e in step.effects):
            return step.conversation_id, step.seq
    raise AssertionError(f"no {kind.__name__} in the log")


def _first_saying(driver: Driver, text: str) -> tuple[str, int]:
    """The conversation and seq of the first step whose state's history holds ``text``."""
    for step in driver.steps:
        if any(text in str(message) for message in step.state.history):
            return step.conversation_id, step.seq
    raise AssertionError(f"no step says {text!r}")


def _wrapped(name: str, change: Callable[..., Any]) -> Patch:
    def patch(monkeypatch: pytest.MonkeyPatch) -> None:
        original = getattr(REDUCER, name)
        monkeypatch.setattr(REDUCER, name, lambda *a, **k: change(original(*a, **k), *a, **k))

    return patch


def _one_more_output_token(made: Any, *_: Any) -> Any:
    after, effects = made
    return after.evolve(usage_output=after.usage_output + 1), effects


def _budget_share(monkeypatch: pytest.MonkeyPatch) -> None:
    original = REDUCER._spawn_effect

    def changed(state: Any, spec: Any, budget: int | None, children: Any = None) -> Any:
        return original(state, spec, None if budget is None else budget - 1, children)

    monkeypatch.setattr(REDUCER, "_spawn_effect", changed)


def _submitted_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        REDUCER, "_submitted", lambda call: ToolResult(call.id, call.name, "submitted.")
    )


# name: (the change; where its first step is: (conversation, seq), an effect type whose
# first appearance is the step, or a text its history first holds there; the field the
# report must name)
CASES: dict[str, tuple[Patch, tuple[str, int] | type[Any] | str, str]] = {
    "child deadline 600 s instead of 660 s": (
        lambda mp: mp.setattr(REDUCER, "_backstop_grace", lambda state: 0.0),
        StartTimer,
        "StartTimer.delay",
    ),
    "one more output token per reply": (
        _wrapped("_on_model_replied", _one_more_output_token),
        ("r", 2),
        "state.usage_output",
    ),
    "a changed retry delay": (
        _wrapped("_backoff", lambda delay, *a: delay + 1.0),
        ScheduleRetry,
        "ScheduleRetry.delay",
    ),
    "a changed budget share": (_budget_share, SpawnSubAgent, "SpawnSubAgent.limits"),
    "a changed permission set handed to a child": (
        _wrapped(
            "_spawn_effect", lambda effect, *a, **k: attrs.evolve(effect, permissions=UNRESTRICTED)
        ),
        SpawnSubAgent,
        "SpawnSubAgent.permissions",
    ),
    "a changed message text": (
        _submitted_text,
        "submitted; the conversation ends",
        "state.history",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_changed_reducer_is_reported_at_its_first_step_and_field(
    logged: tuple[Path, Driver], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    path, driver = logged
    patch, where, field = CASES[name]
    if isinstance(where, type):
        expected = _first(driver, where)
    elif isinstance(where, str):
        expected = _first_saying(driver, where)
    else:
        expected = where
    with Store.open(path) as store:
        assert replay.verify(store, "r", tree=True).ok  # the unchanged reducer
        patch(monkeypatch)
        report = replay.verify(store, "r", tree=True)
    divergences = [r.divergence for r in report.results if r.divergence is not None]
    assert divergences, f"{name}: verify found nothing"
    # The tree's first divergence in log order is the first changed step.
    order = {(s.conversation_id, s.seq): i for i, s in enumerate(driver.steps)}
    first = min(divergences, key=lambda d: order[(d.conversation_id, d.seq)])
    assert (first.conversation_id, first.seq) == expected, first.headline()
    assert field in first.headline(), first.headline()
    assert field in first.diff()


def test_the_cli_names_the_child_deadline_that_verified_identical(
    logged: tuple[Path, Driver], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's first case through the command a CI job runs: exit status 1, the
    step and the field in its output."""
    path, driver = logged
    runner = CliRunner()
    same = runner.invoke(cli, ["replay", "r", "--verify", "--tree", "--db", str(path)])
    assert same.exit_code == 0, same.output
    monkeypatch.setattr(REDUCER, "_backstop_grace", lambda state: 0.0)
    changed = runner.invoke(cli, ["replay", "r", "--verify", "--tree", "--db", str(path)])
    assert changed.exit_code != 0, changed.output
    cid, seq = _first(driver, StartTimer)
    assert f"conversation {cid}, seq {seq}" in changed.output
    assert "StartTimer.delay" in changed.output


def test_a_log_written_without_the_state_before_lists_every_field(tmp_path: Path) -> None:
    """A step that does not carry the state before it (a writer that has not got it)
    lists every state field; verify checks each, and the log verifies identical."""
    driver = Driver()
    _tree(driver)
    steps = [attrs.evolve(step, before=None) for step in driver.steps]
    path = tmp_path / "whole.db"
    write(path, steps)
    with Store.open(path) as store:
        marks = [e.fingerprint for e in store.events("r")]
        assert replay.verify(store, "r", tree=True).ok
    assert all(version(m) == 7 for m in marks)
    # Every field listed at every step after the creation, not only the changed ones
    # (seq 0 lists the fields not at their defaults, whatever the writer).
    assert {len(m.split()[-2].split(",")) for m in marks[1:]} == {len(attrs.fields(Conversation))}
    assert len(marks[0].split()[-2].split(",")) < len(attrs.fields(Conversation))
