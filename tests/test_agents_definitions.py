"""Agent definition files: Claude Code's format read as is, fanfold's keys, problems
with their lines, lookup order and `fanfold agents`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from fanfold.agents import AgentDefinition, PromptMode, load_agents, parse_definition
from fanfold.cli import cli
from fanfold.statemachine.permissions import Rule

CLAUDE_FILE = """\
---
name: code-reviewer
description: Expert code review specialist. Use right after writing code.
tools: Read, Grep, Glob, Bash
model: inherit
color: blue
---
You are a senior code reviewer.

Check for bugs.
"""


def _parse(text: str, path: str = "a.md") -> tuple[AgentDefinition | None, list[str]]:
    definition, problems = parse_definition(text, path)
    return definition, [str(p) for p in problems]


def test_a_claude_code_file_is_read_as_is() -> None:
    definition, problems = _parse(CLAUDE_FILE)
    assert definition is not None
    assert definition.name == "code-reviewer"
    assert definition.description.startswith("Expert code review")
    assert definition.allow == (Rule("read_file"), Rule("grep"), Rule("glob"), Rule("bash"))
    assert definition.model is None  # inherit: the parent's
    assert definition.prompt == "You are a senior code reviewer.\n\nCheck for bugs."
    assert definition.prompt_mode is PromptMode.EXTEND
    # Keys fanfold does not use are warnings, with their lines.
    assert problems == ["a.md:6: unknown key 'color' ignored"]


def test_fanfold_keys_and_yaml_lists() -> None:
    definition, problems = _parse(
        "---\n"
        "name: writer\n"
        "description: writes sources\n"
        "tools:\n"
        "  - read-only\n"
        "  - write_file(src/**)\n"
        "  - Bash(git diff:*)\n"
        "disallowedTools: [bash(git diff --output*)]\n"
        "model: small\n"
        "maxTurns: 5\n"
        "max_tokens: 2000\n"
        "timeout: 30\n"
        "may_delegate: false\n"
        "prompt_mode: replace\n"
        "---\n"
        "Write.\n"
    )
    assert problems == []
    assert definition == AgentDefinition(
        name="writer",
        description="writes sources",
        prompt="Write.",
        prompt_mode=PromptMode.REPLACE,
        allow=(Rule("read-only"), Rule("write_file", "src/**"), Rule("bash", "git diff*")),
        deny=(Rule("bash", "git diff --output*"),),
        model="small",
        max_rounds=5,
        max_tokens=2000,
        timeout=30.0,
        may_delegate=False,
        source="a.md",
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no front matter\n", ["a.md:1: no front matter: the file must start with a line '---'"]),
        ("---\nname: x\n", ["a.md:1: the front matter is not closed by a line '---'"]),
        ("---\n- a\n---\n", ["a.md:2: the front matter must be a mapping of keys"]),
        ("---\nname: x\n---\n", ["a.md:2: required key 'description' is missing"]),
        (
            "---\nname: x\ndescription: y\nmax_rounds: '3'\n---\n",
            ["a.md:4: max_rounds: expected a whole number >= 1, got '3'"],
        ),
        (
            "---\nname: x\ndescription: y\nmay_delegate: 1\ntimeout: .inf\n---\n",
            [
                "a.md:4: may_delegate: expected true or false, got 1",
                "a.md:5: timeout: expected a number of seconds > 0, got inf",
            ],
        ),
        (
            "---\nname: x\ndescription: y\n\ntools: bash(\n---\n",
            [
                "a.md:5: tools: rule 'bash(': a pattern goes in parentheses at the end, "
                "like bash(git *)"
            ],
        ),
        (
            "---\nname: x\ndescription: y\ntools: think(deep)\n---\n",
            [
                "a.md:4: tools: rule 'think(deep)': only bash (a command), read_file, "
                "write_file, edit_file (a path) and web_fetch (domain:HOST) take a pattern"
            ],
        ),
        (
            "---\nname: x\ndescription: y\ndisallowed_tools: read-only\n---\n",
            ["a.md:4: read-only is an allow rule (in tools)"],
        ),
        (
            "---\nname: x\ndescription: y\ncontext: everything\n---\n",
            ["a.md:4: context 'everything': use task_only, full or summary"],
        ),
        (
            "---\nname: a b\ndescription: y\n---\n",
            ["a.md:2: name 'a b': use letters, digits, '-', '_', '.'"],
        ),
        # A key given twice was once taken silently from its last line (YAML's rule):
        # `tools: read-only` then `tools: bash` gave the agent bash.
        (
            "---\nname: x\ndescription: y\ntools: read-only\ntools: bash\n---\n",
            ["a.md:5: 'tools' is given twice (first on line 4)"],
        ),
        (
            "---\nname: x\ndescription: y\ndisallowed_tools: bash\ndisallowedTools: think\n---\n",
            ["a.md:5: 'disallowedTools' gives 'disallowed_tools' again"],
        ),
        (
            "---\nname: x\ndescription: y\nprompt_mode: [a]\n---\n",
            ["a.md:4: prompt_mode: expected 'extend' or 'replace', got ['a']"],
        ),
        (
            "---\nname: x\ndescription: &d y\nmodel: *d\n---\n",
            ["a.md:4: YAML aliases (*name) are not allowed"],
        ),
        ("---\nname: x\ndescription: [y\n---\n", None),  # a YAML error, with its line
        ("---\nname: !!python/object:os.system x\ndescription: y\n---\n", None),
    ],
)
def test_invalid_files_name_the_line_and_the_problem(text: str, expected: list[str] | None) -> None:
    definition, problems = _parse(text)
    assert definition is None
    if expected is None:
        assert len(problems) == 1 and problems[0].startswith("a.md:") and "YAML" in problems[0]
    else:
        assert problems == expected


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def _agent(name: str, description: str) -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\n"


def test_lookup_order_project_overrides_user_overrides_built_in(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    env = {"HOME": str(home)}
    _write(home / ".config" / "fanfold" / "agents", "r.md", _agent("reviewer", "user's"))
    _write(home / ".claude" / "agents", "r.md", _agent("reviewer", "user's claude"))
    _write(home / ".claude" / "agents", "mine.md", _agent("mine", "user only"))
    _write(project / ".claude" / "agents", "e.md", _agent("explorer", "project claude"))
    _write(project / ".fanfold" / "agents", "e.md", _agent("explorer", "project fanfold"))
    catalog = load_agents(project, env)
    by_name = {a.name: a for a in catalog.agents}
    assert sorted(by_name) == ["explorer", "general-purpose", "mine", "reviewer"]
    assert by_name["reviewer"].description == "user's"
    assert by_name["explorer"].description == "project fanfold"
    assert by_name["general-purpose"].source == "built-in"
    assert by_name["explorer"].source == str(project / ".fanfold" / "agents" / "e.md")
    assert [a.description for a in catalog.overridden if a.name == "explorer"][-1] == (
        "project claude"
    )
    assert catalog.problems == ()


def test_bad_files_are_reported_and_left_out(tmp_path: Path) -> None:
    folder = tmp_path / ".fanfold" / "agents"
    _write(folder, "a.md", _agent("good", "fine"))
    _write(folder, "b.md", _agent("good", "a second of the name"))
    _write(folder, "c.md", "---\nname: broken\ndescription: x\nmax_tokens: -5\n---\n")
    (folder / "d.md").write_bytes(b"---\nname: x\ndescription: \xff\n---\n")
    (folder / "e.md").write_bytes(b"x" * (300 * 1024))
    os.mkfifo(folder / "f.md")  # would block a plain open()
    _write(folder, "notes.txt", "not a definition")
    catalog = load_agents(tmp_path, {"HOME": str(tmp_path / "nohome")})
    assert "good" in {a.name for a in catalog.agents}
    assert "broken" not in {a.name for a in catalog.agents}
    messages = {Path(p.path).name: (p.line, p.message, p.warning) for p in catalog.problems}
    assert messages["b.md"][2] is True and "also defined in" in messages["b.md"][1]
    assert messages["c.md"] == (4, "max_tokens: expected a whole number >= 1, got -5", False)
    assert messages["d.md"] == (3, "not UTF-8 text", False)
    assert "larger than" in messages["e.md"][1]
    assert messages["f.md"][1] == "not a regular file; ignored"
    assert "notes.txt" not in messages
    # A problem of the whole file has no line: not "e.md:0: larger than ...".
    whole = {str(p) for p in catalog.problems if Path(p.path).name in ("e.md", "f.md")}
    assert whole == {
        f"{folder / 'e.md'}: larger than 262144 bytes; not read",
        f"{folder / 'f.md'}: not a regular file; ignored",
    }


def test_fanfold_agents_lists_agents_and_invalid_files(tmp_path: Path) -> None:
    folder = tmp_path / ".fanfold" / "agents"
    _write(folder, "mine.md", _agent("mine", "my own agent"))
    _write(folder, "bad.md", "---\nname: bad\ndescription: x\ntools: bash(\n---\n")
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    runner = CliRunner()
    result = runner.invoke(cli, ["agents", "--cwd", str(tmp_path), "--json"], env=env)
    assert result.exit_code == 1, result.output
    listing = json.loads(result.stdout)
    names = {a["name"]: a["source"] for a in listing["agents"]}
    assert names == {
        "explorer": "built-in",
        "general-purpose": "built-in",
        "reviewer": "built-in",
        "mine": str(folder / "mine.md"),
    }
    assert listing["problems"] == [
        {
            "path": str(folder / "bad.md"),
            "line": 4,
            "message": "tools: rule 'bash(': a pattern goes in parentheses at the end, "
            "like bash(git *)",
            "severity": "error",
        }
    ]
    text = runner.invoke(cli, ["agents", "--cwd", str(tmp_path)], env=env)
    assert text.exit_code == 1
    assert "bad.md:4: tools: rule 'bash('" in " ".join(text.output.split())
    (folder / "bad.md").unlink()
    clean = runner.invoke(cli, ["agents", "--cwd", str(tmp_path)], env=env)
    assert clean.exit_code == 0, clean.output
    assert "mine" in clean.output


def test_the_built_ins_parse_without_problems() -> None:
    catalog = load_agents(folders=[])
    assert catalog.problems == ()
    explorer = {a.name: a for a in catalog.agents}["explorer"]
    assert explorer.allow == (Rule("read-only"),) and not explorer.may_delegate


def test_the_agents_guide_example_file_is_valid() -> None:
    guide = Path(__file__).parent.parent / "docs" / "how-to" / "agents.md"
    readme = guide.read_text(encoding="utf-8")
    block = readme.split("`.fanfold/agents/doc-writer.md`:\n\n```markdown\n", 1)[1]
    text = block.split("\n```\n", 1)[0] + "\n"
    definition, problems = _parse(text, "doc-writer.md")
    assert problems == []
    assert definition is not None and definition.name == "doc-writer"
    assert definition.allow == (
        Rule("read-only"),
        Rule("write_file", "docs/**"),
        Rule("edit_file", "docs/**"),
        Rule("bash", "git diff*"),
    )
    assert (definition.max_rounds, definition.max_tokens, definition.timeout) == (8, 40000, 300)
    assert not definition.may_delegate and definition.model == "small"
    assert definition.context == "summary"


def test_fanfold_agents_shows_whole_sources_and_rules_and_the_context_mode(
    tmp_path: Path,
) -> None:
    """`fanfold agents` once cut a definition's source to ".fanfold/agents/…" and its
    rules to "write_file(docs/…" in an 80-column terminal, so it did not say where an
    agent comes from; and it left out a definition's context mode (also in --json)."""
    folder = tmp_path / ".fanfold" / "agents"
    _write(
        folder,
        "a-long-definition-file-name.md",
        "---\nname: writer\ndescription: writes\ncontext: full\n"
        "tools: read-only, write_file(documentation/**)\n---\n",
    )
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    runner = CliRunner()
    listing = json.loads(
        runner.invoke(cli, ["agents", "--cwd", str(tmp_path), "--json"], env=env).stdout
    )
    contexts = {a["name"]: a["context"] for a in listing["agents"]}
    assert contexts == {
        "explorer": "task_only",
        "general-purpose": "task_only",
        "reviewer": "task_only",
        "writer": "full",
    }
    from fanfold.cli.output import console

    width = console.width
    console.width = 80
    try:
        result = runner.invoke(cli, ["agents", "--cwd", str(tmp_path)], env=env)
    finally:
        console.width = width
    assert result.exit_code == 0, result.output
    # The table folds long cells over lines: join each column's pieces in the
    # writer's rows (the last, in name order).
    lines = result.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("│ writer "))
    cells = ["", "", "", ""]
    for line in lines[first:]:
        if not line.startswith("│"):
            break
        for column, cell in enumerate(line.split("│")[1:5]):
            cells[column] += cell.strip()
    name, source, tools, _ = cells
    assert name == "writer"
    assert source == str(folder / "a-long-definition-file-name.md").replace(" ", "")
    assert tools.replace(" ", "") == "read-only,write_file(documentation/**)(contextfull)"


def test_a_billion_laughs_file_is_refused_at_once() -> None:
    """Nine lists of nine references, nine deep: `fanfold agents` (and every `fanfold
    run`, which reads the same folders) once spent minutes and gigabytes building
    its error message ("description: expected a string, got [[[..."); aliases are
    refused before anything is built."""
    import time

    levels = ["a: &a [" + ",".join(['"lol"'] * 9) + "]"]
    for previous, name in zip("abcdefg", "bcdefgh", strict=True):
        levels.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    text = "---\nname: lol\n" + "\n".join(levels) + "\ndescription: [" + ",".join(["*h"] * 9)
    started = time.monotonic()
    definition, problems = _parse(text + "]\n---\n")
    assert time.monotonic() - started < 5
    assert definition is None
    assert problems == ["a.md:4: YAML aliases (*name) are not allowed"]


def test_replacing_the_prompt_with_nothing_is_a_warning() -> None:
    """`prompt_mode: replace` and no body once gave the agent an empty system prompt
    without a word: it was not even told to call submit_result."""
    definition, problems = _parse("---\nname: x\ndescription: y\nprompt_mode: replace\n---\n\n")
    assert definition is not None and definition.system_prompt("the role") == ""
    assert problems == [
        "a.md:4: prompt_mode replace with no body below the front matter: the agent gets "
        "no system prompt (not even the role that tells it to call submit_result)"
    ]
    kept, none = _parse("---\nname: x\ndescription: y\nprompt_mode: replace\n---\nBe brief.\n")
    assert kept is not None and none == []


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "-rf", "_x", "a" * 65])
def test_a_name_that_is_no_identifier_is_refused(name: str) -> None:
    """Issue 22, item 17: `..` was a valid agent name. A name starts with an ASCII
    letter or digit and has at most 64 characters."""
    definition, problems = _parse(f"---\nname: '{name}'\ndescription: y\n---\n")
    assert definition is None
    assert problems == [
        f"a.md:2: name {name!r}: start with a letter or digit; at most 64 characters"
    ]


@pytest.mark.parametrize("name", ["a", "reviewer", "x.y-z_2", "2fast", "a" * 64])
def test_identifier_names_are_accepted(name: str) -> None:
    definition, problems = _parse(f"---\nname: '{name}'\ndescription: y\n---\n")
    assert definition is not None and definition.name == name, problems


def test_a_link_to_a_file_outside_the_folder_is_skipped_with_a_warning(tmp_path: Path) -> None:
    """Issue 22, item 17: an agent file that is a symbolic link to a file outside its
    folder (a cloned repository's link to the user's files) was read and became an
    agent's prompt. It is skipped, with a warning naming where it leads; a link to a
    file inside the folder, and a folder that is itself a link, still work."""
    secret = tmp_path / "secret.md"
    secret.write_text(_agent("stolen", "the user's private file"))
    real = tmp_path / "real-agents"
    _write(real, "inside.md", _agent("inside", "fine"))
    (real / "alias.md").symlink_to(real / "inside.md")
    (real / "outside.md").symlink_to(secret)
    (real / "relative.md").symlink_to(Path("..") / "secret.md")
    project = tmp_path / "project"
    (project / ".fanfold").mkdir(parents=True)
    (project / ".fanfold" / "agents").symlink_to(real)  # the folder itself is a link
    catalog = load_agents(project, {"HOME": str(tmp_path / "nohome")})
    names = {a.name for a in catalog.agents}
    assert "inside" in names and "stolen" not in names
    found = {Path(p.path).name: p for p in catalog.problems}
    for link in ("outside.md", "relative.md"):
        assert found[link].warning is True
        assert found[link].message == f"a symbolic link to {secret}, outside this folder; ignored"
    # The link inside the folder is read (a second file of the name: its usual warning).
    assert "also defined in" in found["inside.md"].message or "also defined in" in (
        found["alias.md"].message
    )


@pytest.mark.parametrize("command", ["agents", "tools"])
def test_json_listings_escape_what_a_project_agent_file_could_do_to_a_terminal(
    tmp_path: Path, command: str
) -> None:
    """json.dumps leaves C1 controls (U+009B is CSI) and bidirectional ones raw:
    `agents --json` and `tools --json` wrote them to the terminal as they were (a
    description, a folder's name in a left-out file's path)."""
    hostile = "a \u009b2J b \u202e c"
    project = tmp_path / hostile
    _write(project / ".fanfold" / "agents", "e.md", _agent("evil", json.dumps(hostile)))
    _write(project / ".fanfold" / "agents", "bad.md", "---\nname: bad\ntools: bash(\n---\n")
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    result = CliRunner().invoke(cli, [command, "--cwd", str(project), "--json"], env=env)
    assert result.exit_code in (0, 1), result.output
    assert not any(c in result.stdout for c in "\u009b\u202e"), result.stdout
    listing = json.loads(result.stdout)  # still the same JSON
    if command == "agents":
        (evil,) = [a for a in listing["agents"] if a["name"] == "evil"]
        assert evil["description"] == hostile
    else:
        assert [hostile in path for path in listing["agents_left_out"]] == [True]
