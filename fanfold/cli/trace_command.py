"""``fanfold trace``: a tree's log as one self-contained HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from fanfold.cli.database import (
    Target,
    db_option,
    open_store,
    refuse_writing_over_the_log,
    write_output,
)
from fanfold.cli.errors import user_errors

# What a command runs with (rich, the log, the reducer, the runtime, the providers) is
# imported in the functions that use it: `--help` imports none of it (issue 36,
# tests/test_cli_startup.py).


def default_output(conversation_id: str) -> Path:
    """``trace-<id>.html`` in the current directory (``fanfold.trace.html.file_name``)."""
    from fanfold.trace.html import file_name

    return Path(file_name(conversation_id))


@click.command(
    name="trace",
    epilog=(
        "\b\nExamples:\n"
        "  fanfold trace 3f9a0c61d2b4 -o trace.html\n"
        "  fanfold trace what-if --vs 3f9a0c61d2b4\n"
    ),
)
@click.argument("conversation_id")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The HTML file to write (default: trace-ID.html here; - for standard output).",
)
@click.option(
    "--vs",
    "vs",
    default=None,
    metavar="ID",
    help="Show this tree beside the tree of ID, agent by agent (as `fanfold diff ID0 ID`). "
    "A fork's page shows its original without it.",
)
@db_option
def trace_command(
    conversation_id: str, output: Path | None, vs: str | None, db: Target | None
) -> None:
    """Write a conversation tree's trace as one HTML page (no network needed).

    A timeline of every agent (model calls, tools, retries, waits, cancels,
    deadlines; zoom with Ctrl+wheel, + and -), each agent's prompt, messages and
    outcome, a search through every message, a slider over the steps of the replay,
    and the first divergence of a log that fails `replay --verify`. A fork's page
    links its original and shows the two side by side. Open it in any browser; it
    loads nothing from anywhere.
    """
    from fanfold.cli.display import printable
    from fanfold.cli.output import console
    from fanfold.trace import build_trace, render_html

    if output is not None and str(output) != "-":
        refuse_writing_over_the_log(output, db)
    with user_errors(db):
        store = open_store(db, read_only=True)
        try:
            data = build_trace(store, conversation_id, vs=vs)
        finally:
            store.close()
    page = render_html(data)
    if output is not None and str(output) == "-":
        click.echo(page, nl=False)
        return
    target = output or default_output(conversation_id)
    if output is None:
        refuse_writing_over_the_log(target, db)
    write_output(target, lambda out: out.write(page))
    agents = len(data["agents"])
    note = ""
    if data["divergence"] is not None:
        note = " (the log fails verify: the page shows the first divergence)"
    elif data["findings"]:
        note = " (the log is damaged: the page shows the steps before the damage)"
    note += _beside(data["compare"])
    console.print(
        f"wrote {printable(str(target))}: {agents} agent(s), {len(data['steps'])} step(s){note}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def _beside(compared: dict[str, Any] | None) -> str:
    """What the page says of the tree beside this one, in a few words (ids escaped)."""
    from fanfold.cli.display import printable

    if compared is None:
        return ""
    other = printable(compared["a"] if compared["this"] == "b" else compared["b"])
    if compared["error"]:
        return f"; not beside {other}: {printable(compared['error'])}"
    parting = [
        pair
        for pair in compared["agents"]
        if pair["parting"] is not None or pair["a"] is None or pair["b"] is None
    ]
    return f"; beside {other}: {len(parting)} agent(s) part (press c on the page)"
