"""Claude Code agent files: Task read as delegation, model aliases through the
configuration's [model_aliases], and `fanfold run` warning about what it ignores."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from click.testing import CliRunner

from fanfold.agents import AgentDefinition, load_agents, parse_definition
from fanfold.cli import cli
from fanfold.db import Store
from fanfold.statemachine.permissions import Rule


def _parse(
    front: str, aliases: dict[str, str] | None = None
) -> tuple[AgentDefinition | None, list[str]]:
    text = f"---\nname: a\ndescription: an agent\n{front}---\nbody\n"
    definition, problems = parse_definition(text, "a.md", model_aliases=aliases)
    return definition, [str(p) for p in problems]


def test_task_in_tools_is_delegation_and_in_disallowed_tools_none() -> None:
    definition, problems = _parse("tools: Read, Task\nmay_delegate: true\n")
    assert problems == []
    assert definition is not None
    assert (definition.allow, definition.may_delegate) == ((Rule("read_file"),), True)
    definition, problems = _parse("disallowedTools: Task, Bash\n")
    assert problems == []
    assert definition is not None
    assert (definition.deny, definition.may_delegate) == ((Rule("bash"),), False)
    definition, _ = _parse("tools: Task\n")  # delegation and no ordinary tool
    assert definition is not None and (definition.allow, definition.may_delegate) == ((), True)


def test_task_contradicting_may_delegate_is_refused_with_its_line() -> None:
    assert _parse("tools: Read, Task\nmay_delegate: false\n") == (
        None,
        ["a.md:5: may_delegate: false contradicts Task in tools"],
    )
    assert _parse("tools: Task\ndisallowed_tools: Task\n") == (
        None,
        ["a.md:5: Task is in both tools and disallowed_tools"],
    )


def test_claude_model_aliases_go_through_the_table_or_the_file_is_refused() -> None:
    definition, problems = _parse("model: sonnet\n", {"sonnet": "big-profile"})
    assert problems == [] and definition is not None
    assert definition.model == "big-profile"
    definition, problems = _parse("model: Haiku\n", {"haiku": "claude-haiku-4-5"})
    assert definition is not None and definition.model == "claude-haiku-4-5"
    assert _parse("model: opus\n") == (
        None,
        [
            "a.md:4: model 'opus' is a Claude Code alias: map it to a profile or model in "
            'the configuration\'s [model_aliases] table (opus = "...")'
        ],
    )
    # Any name of the table is an alias; other names pass as they are.
    definition, _ = _parse("model: fast\n", {"fast": "small"})
    assert definition is not None and definition.model == "small"
    definition, _ = _parse("model: gpt-4o\n")
    assert definition is not None and definition.model == "gpt-4o"


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    folder = project / ".claude" / "agents"
    folder.mkdir(parents=True)
    (folder / "reviewer2.md").write_text(
        "---\nname: reviewer2\ndescription: reviews\ntools: Read, Grep, WebSearch, Task\n"
        "model: sonnet\ncolor: blue\nmcpServers:\n  github: {command: gh-mcp}\n---\nReview.\n"
    )
    return project


def test_fanfold_run_warns_about_every_ignored_key_and_tool_and_uses_the_alias_table(
    tmp_path: Path,
) -> None:
    project = _project(tmp_path)
    config = tmp_path / "fanfold.toml"
    config.write_text(
        'default = "offline"\n[profiles.offline]\nprovider = "scripted"\n'
        '[model_aliases]\nsonnet = "offline"\n'
    )
    env = {
        "HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
        "FANFOLD_CONFIG": str(config),
    }
    db = tmp_path / "run.db"
    args = ["run", "--db", str(db), "--cwd", str(project), "--no-live", "hello"]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    where = project / ".claude" / "agents" / "reviewer2.md"
    warnings = [line for line in result.stderr.splitlines() if line.startswith("agent definition")]
    assert warnings == [
        f"agent definition: {where}:6: unknown key 'color' ignored",
        f"agent definition: {where}:4: tools: fanfold has no tool 'WebSearch'; it is ignored "
        "(tools: bash, edit_file, glob, grep, read_file, think, web_fetch, write_file, "
        "read-only, Task)",
    ]
    # mcpServers declares a project server (issue 23): it waits for trust, never run;
    # without the MCP SDK (the `mcp` extra), run says so instead, and runs none either.
    if importlib.util.find_spec("mcp") is None:
        expected = "MCP servers are declared but the MCP SDK is missing: pip install 'fanfold[mcp]'"
    else:
        expected = f"MCP: MCP server 'github' waits for trust: declared by the project in {where}"
    assert expected in result.stderr.replace("\n", " ")
    with Store.open(db) as store:
        (root,) = store.list_roots()
        state = store.load_state(root.id)
    (mine,) = [a for a in state.agents if a.name == "reviewer2"]
    assert (mine.model, mine.allow, mine.may_delegate) == (
        "offline",
        (Rule("read_file"), Rule("grep")),
        True,
    )


def test_without_the_table_the_definition_is_left_out_with_one_line(tmp_path: Path) -> None:
    project = _project(tmp_path)
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    db = tmp_path / "run.db"
    args = ["run", "--db", str(db), "--cwd", str(project), "--no-live", "hello"]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    refused = [line for line in result.stderr.splitlines() if "left out" in line]
    assert len(refused) == 1
    assert refused[0].endswith(
        "model 'sonnet' is a Claude Code alias: map it to a profile or model in the "
        'configuration\'s [model_aliases] table (sonnet = "...")'
    )
    catalog = load_agents(project, {"HOME": env["HOME"], "XDG_CONFIG_HOME": env["XDG_CONFIG_HOME"]})
    assert "reviewer2" not in {a.name for a in catalog.agents}
    listing = CliRunner().invoke(cli, ["agents", "--cwd", str(project), "--json"], env=env)
    assert listing.exit_code == 1
    assert "[model_aliases]" in json.dumps(json.loads(listing.stdout))


def test_fanfold_tools_lists_each_tool_its_source_and_the_agents_allowed(tmp_path: Path) -> None:
    project = tmp_path / "project"
    folder = project / ".fanfold" / "agents"
    folder.mkdir(parents=True)
    (folder / "web.md").write_text(
        "---\nname: web\ndescription: reads the docs\n"
        "tools: WebFetch(domain:docs.python.org), Grep\n---\n"
    )
    config = tmp_path / "fanfold.toml"
    config.write_text(
        'default = "o"\n[profiles.o]\nprovider = "scripted"\n'
        '[tools.web_fetch]\ndomains = ["docs.python.org"]\n'
    )
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    args = ["tools", "--cwd", str(project), "--config", str(config), "--json"]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    tools = {t["name"]: t for t in listing["tools"]}
    assert list(tools) == [
        "bash", "read_file", "write_file", "edit_file", "think", "grep", "glob", "web_fetch"
    ]  # fmt: skip
    assert tools["web_fetch"]["source"] == (f"built-in; domains from [tools.web_fetch] of {config}")
    assert [n for n, t in tools.items() if t["read_only"]] == ["read_file", "think", "grep", "glob"]
    assert tools["web_fetch"]["agents"] == ["general-purpose", "web"]
    assert tools["grep"]["agents"] == ["explorer", "general-purpose", "reviewer", "web"]
    assert "web" not in tools["bash"]["agents"]
    plain = CliRunner().invoke(cli, ["tools", "--cwd", str(project)], env=env)
    assert plain.exit_code == 0
    assert "web_fetch: not offered (no [tools.web_fetch] domains configured)" in plain.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('default = "o"\n[profiles.o]\nprovider = "scripted"\n[tools.web_fetch]\nx = 1\n')
    failed = CliRunner().invoke(cli, ["tools", "--config", str(bad)], env=env)
    assert failed.exit_code == 2
    assert "tools.web_fetch.x" in failed.output


def test_rules_may_name_the_runtimes_python_tools() -> None:
    text = "---\nname: a\ndescription: d\ntools: Read, lookup_issue\n---\n"
    definition, problems = parse_definition(text, "a.md")
    assert definition is not None and definition.allow == (Rule("read_file"),)
    assert [p.message for p in problems] == [
        "tools: fanfold has no tool 'lookup_issue'; it is ignored (tools: bash, edit_file, "
        "glob, grep, read_file, think, web_fetch, write_file, read-only, Task)"
    ]
    definition, problems = parse_definition(text, "a.md", tools=["lookup_issue"])
    assert problems == ()
    assert definition is not None
    assert definition.allow == (Rule("read_file"), Rule("lookup_issue"))
