"""The reducer, not the runtime, decides how a tool call runs: ``RunTool.confined``
(bash only through allow patterns: the git guard) and ``RunTool.path_rules`` (the
rules a file tool's path must pass once the runtime has resolved its symbolic links)."""

from __future__ import annotations

import importlib

import attrs
import pytest
from sm_support import replied, root, step, steps, tool, user

from fanfold.agents.builtin import REVIEWER
from fanfold.agents.definitions import parse_definition
from fanfold.statemachine import RuntimeResumed, RunTool, ToolSpec
from fanfold.statemachine.permissions import (
    PathRules,
    Permissions,
    Rule,
    RuleSet,
    allows_tool,
    reading_tools,
)

BASH = ToolSpec.from_schema("bash", "Run a shell command", {"type": "object"})
READ = ToolSpec.from_schema("read_file", "Read a file", {"type": "object"})
WRITE = ToolSpec.from_schema("write_file", "Write a file", {"type": "object"})
PEEK = ToolSpec.from_schema("peek", "Read a value", {"type": "object"}, read_only=True)
TOOLS = (BASH, READ, WRITE, PEEK)


def _reviewer_permissions() -> Permissions:
    reviewer, problems = parse_definition(REVIEWER, "built-in")
    assert reviewer is not None, problems
    return Permissions((RuleSet(reviewer.allow, reviewer.deny, "agent 'reviewer'", "/work"),))


# An agent allowed bash by name (every command): not confined, but its file tools
# still have rules to pass.
BUILDER = Permissions(
    (
        RuleSet(
            (Rule("bash"), Rule("read-only"), Rule("write_file", "docs/**")),
            (),
            "agent 'builder'",
            "/work",
        ),
    )
)


def _offered(permissions: Permissions | None) -> tuple[ToolSpec, ...]:
    """The tools the rules let a conversation be offered (what the runtime records)."""
    reading = reading_tools(TOOLS)
    return tuple(t for t in TOOLS if allows_tool(permissions, t.name, reading))


def _first_run(permissions: Permissions | None, *calls: object) -> RunTool:
    state = steps(root(tools=_offered(permissions), permissions=permissions), user("go"))
    _, effects = step(state, replied(state, *calls))  # type: ignore[arg-type]
    (run,) = [e for e in effects if isinstance(e, RunTool)]
    return run


def test_a_confined_agents_bash_call_says_so_and_an_unconfined_ones_does_not() -> None:
    git = tool("a", command="git diff")
    assert _first_run(_reviewer_permissions(), git).confined is True
    assert _first_run(BUILDER, git).confined is False
    assert _first_run(None, git).confined is False


def test_a_file_tool_of_an_agent_with_rules_carries_them_for_the_link_check() -> None:
    """The rules and what ``read-only`` stood for (the built-ins and the specs marked
    read-only), exactly what the reducer matched the spelled path against."""
    run = _first_run(BUILDER, tool("a", "write_file", path="docs/x.md", content="y"))
    assert run.path_rules == PathRules(BUILDER, ("glob", "grep", "peek", "read_file", "think"))
    # A call that is not a file tool's, or a conversation without rules: no check.
    assert _first_run(BUILDER, tool("a", command="ls")).path_rules is None
    assert _first_run(None, tool("a", "read_file", path="x")).path_rules is None


def test_a_tool_run_again_after_a_restart_keeps_its_decisions() -> None:
    """An idempotent tool re-issued by ``RuntimeResumed`` runs as it first would."""
    permissions = _reviewer_permissions()
    state = steps(root(tools=_offered(permissions), permissions=permissions), user("go"))
    state, effects = step(state, replied(state, tool("a", "read_file", path="x")))
    (first,) = [e for e in effects if isinstance(e, RunTool)]
    assert first.confined and first.path_rules is not None
    _, effects = step(state, RuntimeResumed(idempotent_tools=("read_file",)))
    assert [e for e in effects if isinstance(e, RunTool)] == [first]


def test_the_shipped_invariants_catch_a_reducer_that_forgets_either_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``fanfold.testing`` checks every RunTool against the rules, spelled out on its
    own: a rule that issued a reviewer's call without its decisions is caught."""
    reducer = importlib.import_module("fanfold.statemachine.transition")
    issue = reducer._run_tool
    permissions = _reviewer_permissions()
    state = steps(root(tools=_offered(permissions), permissions=permissions), user("go"))
    for forgotten, invariant in (
        ({"confined": False}, "RunTool is confined as its rules say"),
        ({"path_rules": None}, "a file tool carries its conversation's rules"),
    ):
        monkeypatch.setattr(
            reducer, "_run_tool", lambda *a, f=forgotten: attrs.evolve(issue(*a), **f)
        )
        with pytest.raises(AssertionError, match=invariant):
            step(state, replied(state, tool("a", "read_file", path="x")))
