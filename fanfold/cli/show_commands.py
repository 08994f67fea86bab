"""``fanfold ls`` and ``fanfold show``: what the log holds, as a table and a tree."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fanfold.cli.database import Target, db_option, db_path, open_store
from fanfold.cli.errors import user_errors
from fanfold.cli.text import clip, printable, short

# The views (rich), the log and the reducer's types are imported where they are used:
# `ls --help` and `show --help` need none of them, and neither command imports the
# runtime, the providers, Trio or httpx (tests/test_cli_startup.py).
if TYPE_CHECKING:
    from fanfold.db import ConversationRow, Store


@click.command(
    name="ls",
    epilog=("\b\nExamples:\n  fanfold ls --db demo.db\n  fanfold ls --json\n"),
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@db_option
def list_conversations(as_json: bool, db: Target | None) -> None:
    """List root conversations (sub-agents are shown by `fanfold show`).

    The origin column marks forks (`fork of ID@SEQ`, the root's seq; for a fork made
    at a sub-agent also its place and seq, `root/3@1`; and the edit, if any) and
    imported trees (inert records, never resumed); it is empty for a tree started here.
    """
    from rich.table import Table
    from rich.text import Text

    from fanfold.cli.output import console, hint
    from fanfold.db import EmptyLog

    columns = ("id", "status", "created", "sub-agents", "origin", "task")
    with user_errors():
        try:
            store = open_store(db, read_only=True)
        except EmptyLog as empty:
            # Nothing recorded yet (a run stopped before its first write): no
            # conversations, said as such, not an error.
            if as_json:
                click.echo("[]")
                return
            hint(str(empty), style="dim")
            console.print(Table(*columns))
            return
        try:
            listed = [_listed(store, row) for row in store.list_roots()]
        finally:
            store.close()
        # A tree running in the log while no runtime has the file open was left by a
        # process that died (kill -9, a crash): it goes on only with `fanfold resume`.
        # (A PostgreSQL log's trees are run by workers: not known from here.)
        from fanfold.runtime.presence import runtime_open

        path = db_path(db)
        live = runtime_open(path) if isinstance(path, Path) else None
        for item in listed:
            item["runtime_open"] = live if item["status"] == "running" else None
    if as_json:
        # ensure_ascii: ids and tasks are anyone's text (see show --json).
        click.echo(json.dumps(listed, indent=2, ensure_ascii=True))
        return
    table = Table(*columns)
    for item in listed:
        # Cells are plain Text: a str cell would be read as rich markup, and an id
        # comes from the log (an imported one is anyone's text).
        table.add_row(
            Text(printable(item["id"])),
            _status_cell(item),
            _when(item["created_at"]),
            str(item["sub_agents"]),
            Text(_origin_cell(item)),
            Text(short(item["task"] or "", 50)),
        )
    console.print(table)


def _status_cell(item: dict[str, Any]) -> str:
    if item["status"] == "running" and item["runtime_open"] is False:
        return "running (no runtime: fanfold resume)"
    # "cancelled": TurnOutcome.CANCELLED's value (ls imports no reducer, issue 36).
    if item["status"] == "idle" and item["last_turn"] == "cancelled":
        return "idle (cancelled)"
    return str(item["status"])


def _listed(store: Store, row: ConversationRow) -> dict[str, Any]:
    """A root as ``ls --json`` gives it. ``origin``: ``run`` (started here), ``fork``
    (``forked_from``/``forked_at_seq`` name its source) or ``imported`` (from the file
    ``imported_from``; an imported fork keeps its source's id when the file had it).
    ``forked_agent``/``forked_agent_seq``: for a fork, the agent it was made at (its
    place, ``root`` for a root forked at rest) and that agent's step; ``edit``: a short
    description of its edit (None: none).
    ``last_turn``: for a root at rest, how its latest turn ended (``answered``,
    ``cancelled``: Ctrl-C or ``cancel``; ``error``), None if none did. ``runtime_open``
    (set by the caller): for a running tree, whether a runtime has its database open
    (False: its process died, ``fanfold resume`` goes on with it; None: not known)."""
    from fanfold.db import DatabaseError, Status
    from fanfold.db.provenance import Origin

    record = store.tree_record(row.id)
    imported = record is not None and record.origin == Origin.IMPORTED
    source = made = None
    if row.forked_from is not None or row.forked_at_seq is not None:
        # Only a fork's row names a source (lineage): a tree started here needs no
        # fanfold.replay, whose package imports every replay module (0.19 G, issue 36).
        from fanfold.replay.lineage import fork_origin, lineage

        source = lineage(store, row)
        made = fork_origin(store, row.id) if source is not None else None
    origin = "imported" if imported else "fork" if source is not None else "run"
    turn = None
    if row.status in (Status.IDLE, Status.ERROR):
        # A damaged log: ``verify`` names it; the list still shows the tree. The
        # outcome is read from its column where the log holds it (no event decoded).
        with contextlib.suppress(DatabaseError):
            turn = store.last_outcome(row.id)
    return {
        "id": row.id,
        "status": str(row.status),
        "last_turn": turn,
        "created_at": row.created_at,
        "sub_agents": len(store.tree(row.id)) - 1,
        "origin": origin,
        "forked_from": None if source is None else source.source_id,
        "forked_at_seq": None if source is None else source.seq,
        # The agent the fork was made at (its place, `root` for a root at rest), its
        # seq in the source, and the edit (issue 34: the root's seq alone told forks
        # of root/3 at seq 1 and 2 apart from nothing).
        "forked_agent": None if made is None else made.agent,
        "forked_agent_seq": None if made is None else made.seq,
        "edit": None if made is None else made.edit_text,
        "imported_from": record.source if imported and record is not None else None,
        "task": row.task,
    }


def _origin_cell(item: dict[str, Any]) -> str:
    fork = ""
    if item["forked_from"] is not None:
        fork = f"fork of {printable(item['forked_from'])}@{item['forked_at_seq']}"
        if item.get("forked_agent") not in (None, "root"):
            # The root's seq is the moment in its log; the agent's is the step picked.
            fork += f", {printable(item['forked_agent'])}@{item['forked_agent_seq']}"
        if item.get("edit"):
            fork += f", edit {printable(item['edit'])}"
    if item["origin"] == "imported":
        return "imported" + (f", {fork}" if fork else "")
    return fork


def _when(ts: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


@click.command(
    epilog=(
        "\b\nExamples:\n"
        "  fanfold show 3f9a0c61d2b4 --db demo.db\n"
        "  fanfold show 3f9a0c61d2b4 --full --json\n"
    ),
)
@click.argument("conversation_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (texts in full).")
@click.option("--full", is_flag=True, help="Show long answers in full instead of cut.")
@db_option
def show(conversation_id: str, as_json: bool, full: bool, db: Target | None) -> None:
    """Print a conversation and its sub-agent tree with outcomes.

    An answer longer than a few thousand characters is shown cut (its beginning and
    end); --full shows all of it, as does `fanfold export`.
    """
    from rich.text import Text
    from rich.tree import Tree

    from fanfold.cli.display import write_text
    from fanfold.cli.output import console
    from fanfold.cli.show_view import (
        _add_nodes,
        _add_not_run,
        _money,
        _show_node,
        _trusted_config,
        finite_json,
    )
    from fanfold.statemachine import Idle

    with user_errors():
        store = open_store(db, read_only=True)
        try:
            row = store.conversation(conversation_id)
            node = _show_node(store, conversation_id, _trusted_config(store, row.root_id))
        finally:
            store.close()
    if as_json:
        # ensure_ascii: every control character and lone surrogate becomes a \\u
        # escape, so the output is valid JSON, ASCII only, and harmless on a terminal.
        # allow_nan=False after finite_json: a log on disk (an old or edited one) may
        # hold an infinite time or count, and NaN/Infinity are not JSON.
        click.echo(
            json.dumps(finite_json(node.to_json()), indent=2, ensure_ascii=True, allow_nan=False)
        )
        return
    tree = Tree(node.label(), highlight=False)
    _add_nodes(tree, node.children)
    _add_not_run(tree, node)
    console.print(tree)
    total = node.tree_cost()
    if total is not None:
        console.print(Text(f"cost: {_money(total)} (at the prices of the profiles used)"))
    if isinstance(node.state.phase, Idle) and node.outcome():
        console.rule("answer")
        write_text(console, clip(node.outcome(), full=full))
