"""Checking a ``fanfold ...`` command line written in a help page or a document:
parsed by click as the real command would parse it, without running it.

A line names a command and options that must exist, with values of their types (a
wrong option name, a removed command or a flag given a value is caught); placeholders
for ids (``ID``, ``3f9a0c61d2b4``) are plain arguments and parse. Used by
tests/test_cli_help.py (the epilogs) and tests/test_doc_examples.py (the shell blocks).
"""

from __future__ import annotations

import re
import shlex

import click

# What a shell line may carry around the command: `VAR=value` before it, a comment,
# a redirection or a pipe after it, `&` at its end, `$ ` as a console prompt.
_ASSIGNMENTS = re.compile(
    r"""^(?:[A-Za-z_][A-Za-z0-9_]*=(?:\$\([^)]*\)|"[^"]*"|'[^']*'|\S*)\s+)*"""
)
_PLACEHOLDER = re.compile(r"'[A-Z][A-Z_]*' is not a valid")
_ENDS = {">", ">>", "|", "&&", "||", ";", "&", "2>", "2>&1"}


def fanfold_lines(source: str) -> list[str]:
    """The lines of a shell or console block that run ``fanfold`` (after any
    ``VAR=value`` prefix or ``$ `` prompt), continuation backslashes joined."""
    joined = re.sub(r"\\\n\s*", " ", source)
    found: list[str] = []
    for raw in joined.splitlines():
        line = raw.strip()
        if line.startswith("$ "):
            line = line[2:]
        words = _ASSIGNMENTS.sub("", line).split()
        if words and _is_fanfold(words[0]):
            found.append(" ".join(words))
        # `a && fanfold b`: the second command too.
        for part in re.split(r"&&|\|\|", line)[1:]:
            if part.split()[:1] and _is_fanfold(part.split()[0]):
                found.append(part.strip())
    return found


def _is_fanfold(word: str) -> bool:
    """``fanfold``, or a path to it (``.venv/bin/fanfold``)."""
    return word == "fanfold" or word.endswith("/fanfold")


def parse_fanfold_line(line: str) -> click.Command:
    """Parse ``line`` (``fanfold COMMAND ...``) with the real CLI; return the command.

    Raises ``click.UsageError`` (or a subclass) when an option or command does not
    exist or a value does not fit.
    """
    from fanfold.cli import cli

    words = shlex.split(_ASSIGNMENTS.sub("", line), comments=True)
    assert words and _is_fanfold(words[0]), line
    # `[--agent root/1]`: an optional part, written in the brackets of a usage line.
    args = [w[1:] if w.startswith("[-") else w for w in words[1:]]
    args = [w[:-1] if w.endswith("]") and not w.startswith("[") else w for w in args]
    for index, word in enumerate(args):
        if word in _ENDS or word.startswith((">", "2>")):
            args = args[:index]
            break
    if args and args[-1].endswith("&"):
        args[-1] = args[-1].rstrip("&")
    with cli.make_context("fanfold", list(args), resilient_parsing=False) as ctx:
        rest = [*ctx._protected_args, *ctx.args]  # click 8: the command and its args
        if not rest:
            return cli
        name, *sub_args = rest
        command = cli.get_command(ctx, name)
        if command is None:
            raise click.UsageError(f"no command {name!r} in {line!r}")
        # A placeholder such as ID is a value like any: parsing checks the names
        # of the options and the types of their values, and runs nothing.
        try:
            command.make_context(name, sub_args, parent=ctx).close()
        except click.BadParameter as exc:
            # A path the reader has (--allow-cwd /srv/checkouts), not this machine,
            # or a placeholder for a number (--at SEQ): the option exists.
            message = exc.format_message()
            if "does not exist" not in message and not _PLACEHOLDER.search(message):
                raise
        return command
