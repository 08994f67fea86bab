"""The offline example of examples/agents: a root delegates to the built-in explorer and
reviewer in sequence, each making a call its permissions refuse, then races two
explorers (quorum 1); the log records it all, replay reproduces it, and `fanfold show`
displays it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from fanfold.cli import cli
from fanfold.db import Store
from fanfold.statemachine import ToolResultMessage, UserMessage


def tree_messages(db: Path, conversation_id: str) -> list[str]:
    """The tool results in a conversation's history."""
    with Store.open(db) as store:
        history = store.load_state(conversation_id).history
    return [m.result.content for m in history if isinstance(m, ToolResultMessage)]


EXAMPLE = Path(__file__).parent.parent / "examples" / "agents" / "script.json"


def test_the_agents_example_runs_offline_and_show_displays_it(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'x'\n", encoding="utf-8")
    script = shutil.copy(EXAMPLE, tmp_path / "script.json")
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    db = tmp_path / "agents.db"
    runner = CliRunner()
    args = ["run", "--db", str(db), "--script", str(script), "--cwd", str(project), "--no-live"]
    result = runner.invoke(cli, [*args, "Look at this repository"], env=env)
    assert result.exit_code == 0, result.output
    assert not (project / "notes.md").exists()  # the explorer's write was refused
    with Store.open(db) as store:
        (root,) = store.list_roots()
    shown = runner.invoke(cli, ["show", root.id, "--db", str(db), "--json"], env=env)
    tree = json.loads(shown.output)
    explorer, reviewer, quick, slow = tree["children"]
    assert [(c["parent"], c["mode"], c["context"]) for c in tree["children"]] == [
        (root.id, "sequential", "task_only"),
        (root.id, "sequential", "summary"),
        (root.id, "race", "task_only"),
        (root.id, "race", "task_only"),
    ]
    assert (explorer["agent"], explorer["tools"], explorer["refused_calls"]) == (
        "explorer",
        ["read_file", "think", "grep", "glob", "submit_result", "submit_error"],
        1,
    )
    assert "[project]" in explorer["outcome"]  # its read was allowed
    assert reviewer["agent"] == "reviewer" and reviewer["refused_calls"] == 1
    assert "spawn_agents" not in reviewer["tools"]  # may_delegate: false
    text = runner.invoke(cli, ["show", root.id, "--db", str(db)], env=env).output
    assert "Sub-agent [explorer] (sequential)" in text and "Sub-agent [reviewer]" in text
    assert "Sub-agent [explorer] (race)" in text
    assert text.count("1 tool call refused by its permissions") == 2
    with Store.open(db) as store:
        history = store.load_state(root.id + ".1").history
    results = [m.result.content for m in history if isinstance(m, ToolResultMessage)]
    refusals = [r for r in results if "refused" in r]
    assert len(refusals) == 1
    assert refusals[0].startswith(
        "write_file refused: no allow rule of agent 'explorer' matches this call"
    )
    # The sequential pair: the reviewer was given the explorer's outcome with its task.
    assert reviewer["task"].startswith("Review the most recent commit\n\nThe earlier steps")
    assert "[project]" in reviewer["task"]
    # ...and began with the summary of the root's conversation, one call of the root.
    with Store.open(db) as store:
        briefing = store.load_state(root.id + ".2").history[0]
    assert isinstance(briefing, UserMessage)
    assert briefing.text.endswith("then you to review the most recent commit.")
    # The race: the quick explorer won; the slow one was cancelled by its parent.
    assert (quick["agent"], quick["phase"], quick["outcome"]) == (
        "explorer",
        "Completed",
        "MIT (from pyproject.toml)",
    )
    assert (slow["phase"], slow["failure"]) == (
        "Failed",
        {"kind": "cancelled", "reason": "parent"},
    )
    answer = [m for m in tree_messages(db, root.id) if '"spawn_agents"' in m or "quorum" in m]
    assert any("the quorum of 1 successful sub-agent(s) was reached" in m for m in answer)
    verify = runner.invoke(cli, ["replay", root.id, "--db", str(db), "--verify", "--tree"])
    assert verify.exit_code == 0, verify.output
    # The trace page names each sub-agent's agent and its refused calls (it once gave
    # neither: only `fanfold show` did).
    from fanfold.trace import build_trace

    with Store.open(db) as store:
        agents = build_trace(store, root.id)["agents"]
    assert [(a["agent"], a["refused_calls"]) for a in agents] == [
        (None, 0),
        ("explorer", 1),
        ("reviewer", 1),
        ("explorer", 0),
        ("explorer", 0),
    ]


def test_an_invalid_definition_never_stops_a_run_and_a_project_agent_is_used(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    agents = project / ".fanfold" / "agents"
    agents.mkdir(parents=True)
    (agents / "broken.md").write_text("---\nname: broken\ntools: [\n---\n", encoding="utf-8")
    (agents / "lister.md").write_text(
        "---\nname: lister\ndescription: lists files\ntools: bash(ls*)\n---\nList.\n",
        encoding="utf-8",
    )
    script = {
        "agents": [
            {
                "match": {"path": "root"},
                "replies": [
                    {
                        "tool_calls": [
                            {
                                "name": "spawn_agents",
                                "arguments": {"tasks": [{"task": "list", "agent": "lister"}]},
                            }
                        ]
                    },
                    {"text": "listed"},
                ],
            },
            {
                "match": {"depth": 1},
                "replies": [
                    {
                        "tool_calls": [
                            {"name": "bash", "arguments": {"command": "ls"}},
                            {"name": "bash", "arguments": {"command": "ls; touch pwned"}},
                        ]
                    }
                ],
            },
        ]
    }
    script_path = tmp_path / "script.json"
    script_path.write_text(json.dumps(script), encoding="utf-8")
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    db = tmp_path / "run.db"
    args = ["run", "--db", str(db), "--script", str(script_path), "--cwd", str(project)]
    result = CliRunner().invoke(cli, [*args, "--no-live", "go"], env=env)
    assert result.exit_code == 0, result.output
    assert "agent definition left out:" in result.output and "broken.md:4: YAML" in result.output
    assert not (project / "pwned").exists()
    with Store.open(db) as store:
        (root,) = store.list_roots()
        child = store.load_state(root.id + ".1")
    assert child.agent == "lister" and child.refused_calls == 1
    assert [t.name for t in child.tools] == ["bash", "submit_result", "submit_error"]


def test_the_agents_guide_points_to_the_example() -> None:
    """README's "Agent definitions and permissions" once never named examples/agents:
    a reader of it could not find the example that shows it all. That text is now the
    site's guide, docs/how-to/agents.md."""
    guide = Path(__file__).parent.parent / "docs" / "how-to" / "agents.md"
    section = guide.read_text(encoding="utf-8")
    assert "fanfold run --script examples/agents/script.json" in section
    # Which folder is "the project": the run's --cwd, not a parent (a user in src/
    # once found their project's agents missing).
    assert "the folder the run works in (`--cwd`" in " ".join(section.split())
    assert EXAMPLE.exists()
