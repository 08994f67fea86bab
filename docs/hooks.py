"""MkDocs hook: the command-line reference is each command's own ``--help``.

A page holding ``<!-- fanfold-cli -->`` gets, in its place, ``fanfold --help`` and then
every command's help (examples and option sections included), exactly as a terminal
80 columns wide shows them: the reference cannot drift from the commands.
"""

from __future__ import annotations

from typing import Any

MARKER = "<!-- fanfold-cli -->"


def _help(args: list[str]) -> str:
    from click.testing import CliRunner

    from fanfold.cli import COMMANDS, cli

    assert all(a in COMMANDS for a in args[:1])
    result = CliRunner().invoke(cli, [*args, "--help"], prog_name="fanfold", terminal_width=80)
    if result.exit_code != 0:
        raise RuntimeError(f"fanfold {' '.join(args)} --help failed: {result.output}")
    return result.output.rstrip()


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace the marker with the help of the group and of each command."""
    if MARKER not in markdown:
        return markdown
    from fanfold.cli import COMMANDS

    parts = ["## fanfold\n", "```text", _help([]), "```\n"]
    for name in COMMANDS:
        parts += [f"## fanfold {name}\n", "```text", _help([name]), "```\n"]
    return markdown.replace(MARKER, "\n".join(parts))
