"""Every command's --help (issue 37): examples in its epilog that parse as written,
shared options described once (`--db` in one line pointing at `fanfold help
database`), defaults shown, and `run`'s options in sections (the workers' apart)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from doc_commands import fanfold_lines, parse_fanfold_line

from fanfold.cli import COMMANDS, cli


def _help(*args: str) -> str:
    result = CliRunner().invoke(cli, [*args, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_has_one_to_three_examples_that_parse(name: str) -> None:
    text = _help(name)
    assert "\n  Examples:\n" in text, f"fanfold {name} --help has no examples"
    examples = fanfold_lines(text.split("\n  Examples:\n", 1)[1])
    assert 1 <= len(examples) <= 3, examples
    for line in examples:
        assert parse_fanfold_line(line).name == name, line


def test_the_db_option_is_one_sentence_and_the_rest_is_a_help_topic() -> None:
    runner = CliRunner()
    for name in ("run", "ls", "show", "replay", "worker", "ui"):
        text = " ".join(_help(name).split())
        (line,) = re.findall(r"--db PATH\|URL (.*?)(?= --\w)", text)
        assert line.count(". ") == 0 and line.endswith("see `fanfold help database`."), line
        assert "~/.pgpass" not in line
    topic = runner.invoke(cli, ["help", "database"])
    assert topic.exit_code == 0
    for needed in ("postgresql://", "~/.pgpass", "$FANFOLD_DB", "-committed", "fanfold.db"):
        assert needed in topic.output, needed


def test_help_topics_and_commands() -> None:
    runner = CliRunner()
    script = runner.invoke(cli, ["help", "script"])
    assert script.exit_code == 0 and '"fail_first"' in script.output
    assert "``" not in script.output
    as_topic = runner.invoke(cli, ["help", "ls"], terminal_width=100).output
    assert as_topic.split("\n", 1)[1] == _help("ls").split("\n", 1)[1]  # past "Usage:"
    listing = runner.invoke(cli, ["help"])
    assert "database" in listing.output and "script" in listing.output
    unknown = runner.invoke(cli, ["help", "nope"])
    assert unknown.exit_code == 2 and "no help topic or command 'nope'" in unknown.output


def _sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
            sections[current] = []
        elif current and line.startswith("  -"):
            sections[current].append(line.split()[0])
    return sections


def test_run_lists_its_options_in_sections_with_the_workers_apart() -> None:
    sections = _sections(_help("run"))
    assert next(iter(sections)) == "Options"
    workers = [s for s in sections if s.startswith("Workers")]
    assert workers and sections[workers[0]] == ["--detach", "--dbos-db"]
    assert "--detach" not in sections["Options"] and "--db" in sections["Options"]
    assert sections["Limits"][:5] == [
        "--max-rounds",
        "--max-concurrent",
        "--max-tasks-per-call",
        "--max-depth",
        "--max-tokens",
    ]
    assert "--script" in sections["Model and tools"]
    every = [option for options in sections.values() for option in options]
    assert len(every) == len(set(every))  # each option once


def test_the_limits_show_the_defaults_the_reducer_applies() -> None:
    from fanfold.statemachine import Limits

    text = " ".join(_help("run").split())
    defaults = Limits()
    for option, value in [
        ("--max-rounds", defaults.max_rounds),
        ("--max-concurrent", defaults.max_concurrent),
        ("--max-tasks-per-call", defaults.max_tasks_per_call),
        ("--max-depth", defaults.max_depth),
        ("--max-tokens", defaults.max_tokens),
    ]:
        shown = re.search(re.escape(option) + r" INTEGER RANGE .*?default: (\w+)", text)
        assert shown is not None, option
        assert shown.group(1) == ("none" if value is None else str(value)), option


def test_ui_port_has_help() -> None:
    text = " ".join(_help("ui").split())
    assert re.search(r"--port INTEGER RANGE Port to listen on", text), text


def test_the_example_checker_refuses_what_the_cli_would() -> None:
    """The checker the examples go through (here and in tests/test_doc_examples.py)
    fails on a wrong option, command or value, and passes placeholders and shell
    around the command."""
    import click

    for wrong in (
        "fanfold run --nope x",
        "fanfold nope",
        "fanfold replay ID --at seven",
        "fanfold ls --json=yes",
    ):
        with pytest.raises(click.UsageError):
            parse_fanfold_line(wrong)
    for right in (
        "fanfold replay ID --at SEQ --tree   # a comment",
        "FANFOLD_UI_TOKEN=$(openssl rand -hex 24) fanfold ui --port 9000",
        "fanfold transcript ID --markdown > bug.md",
        "fanfold replay ID --step [--until SEQ] [--tree]",
        ".venv/bin/fanfold run --db demo.db 'Review this repository'",
    ):
        parse_fanfold_line(fanfold_lines(right)[0])
    found = fanfold_lines("fanfold trace what-if && fanfold trace ID\nls\n$ fanfold ls")
    assert found == ["fanfold trace what-if && fanfold trace ID", "fanfold trace ID", "fanfold ls"]
