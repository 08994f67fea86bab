"""``fanfold help [TOPIC]``: what several commands share, written once.

Every command that reads the log takes ``--db``; its help line is one sentence that
points here, instead of the same paragraph under each of them. A topic's text is plain
text: it imports nothing but click (``script`` reads the scripted provider's module
docstring, the one place the format is described, from its source without importing it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import click

DATABASE = """\
The event log: every command that reads or writes trees takes --db.

  --db PATH      an SQLite file (created by the first `fanfold run`)
  --db URL       postgresql://USER@HOST:PORT/DATABASE (or postgres://), with the
                 postgres extra: pip install 'fanfold[postgres]'

Default: $FANFOLD_DB, else ~/.local/share/fanfold/fanfold.db. The flag wins over
the variable.

A PostgreSQL log keeps fanfold's tables in a `fanfold` schema, created on first use;
its rows are those of the SQLite log, so `replay --verify` reports the same and
`export`/`import` move trees between the two. Keep the password off the command line,
where other users of the machine can read it: in ~/.pgpass or in $FANFOLD_DB. fanfold
never prints or logs it.

Beside a file, fanfold writes its JSON logs (*.log.jsonl: lifecycle, model-call and
tool-call lines; `fanfold --log-level debug` adds one line per step) and
<db>-committed, the mark of the last step committed: if the log's -wal file is later
deleted, cut or damaged, resume, run and replay --verify say the log lost committed
steps (exit 2) instead of running them again; removing <db>-committed accepts the log
as it is. The JSON log of a command on PostgreSQL goes to
~/.local/share/fanfold/fanfold-pg-*.log.jsonl.

One `fanfold resume` at a time: it refuses while another fanfold has the database
open, under any of its names (a symbolic or hard link, a linked folder).
"""


def _script_format() -> str:
    """The ``--script`` file format: the scripted provider's module docstring."""
    source = Path(__file__).parent.parent / "providers" / "scripted.py"
    doc = ast.get_docstring(ast.parse(source.read_text(encoding="utf-8"))) or ""
    return doc.replace("::\n", ":\n").replace("``", "`") + "\n"


TOPICS = {
    "database": "--db: the event log, an SQLite file or a PostgreSQL URL",
    "script": "--script: the offline scripted model's JSON format",
}


@click.command(
    name="help",
    epilog=(
        "\b\nExamples:\n"
        "  fanfold help database   # --db, for every command\n"
        "  fanfold help script     # the --script file's format\n"
        "  fanfold help run        # as fanfold run --help\n"
    ),
)
@click.argument("topic", required=False)
@click.pass_context
def help_command(ctx: click.Context, topic: str | None) -> None:
    """Show a help topic (database, script) or a command's help."""
    group = ctx.parent.command if ctx.parent is not None else None
    if topic == "database":
        click.echo(DATABASE, nl=False)
        return
    if topic == "script":
        click.echo(_script_format(), nl=False)
        return
    if topic is not None and isinstance(group, click.Group):
        assert ctx.parent is not None
        command = group.get_command(ctx.parent, topic)
        if command is not None:
            with click.Context(command, info_name=topic, parent=ctx.parent) as sub:
                click.echo(command.get_help(sub))
            return
    if topic is not None:
        raise click.UsageError(
            f"no help topic or command {topic!r} (topics: {', '.join(TOPICS)})", ctx
        )
    click.echo("Topics:")
    for name, what in TOPICS.items():
        click.echo(f"  {name:10} {what}")
    click.echo("\nEvery command has its own: fanfold help COMMAND, or fanfold COMMAND --help.")
