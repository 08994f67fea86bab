"""``fanfold diff A B``: two trees side by side, agent by agent.

An original and its fork, or any two runs of one task: each agent (matched by its
place in the tree) with its outcome, rounds, tokens and cost in each tree, and the
first message where the two conversations part. Read from the log alone; every
recorded text is escaped (``printable``; ``--json`` with ``ensure_ascii``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from fanfold.cli.database import Target, db_option, open_store

# What a command runs with (rich, the log, the reducer, the runtime, the providers) is
# imported in the functions that use it: `--help` imports none of it (issue 36,
# tests/test_cli_startup.py).
if TYPE_CHECKING:
    from fanfold.cli.show_view import ShowNode
    from fanfold.db import Store
    from fanfold.providers.config import Config
    from fanfold.replay.compare import AgentPair, Said
    from fanfold.replay.lineage import ForkOrigin


@click.command(
    name="diff",
    epilog=(
        "\b\nExamples:\n"
        "  fanfold diff 3f9a0c61d2b4 what-if\n"
        "  fanfold diff 3f9a0c61d2b4 what-if --json\n"
    ),
)
@click.argument("a")
@click.argument("b")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable (texts in full).")
@db_option
def diff_command(a: str, b: str, as_json: bool, db: Target | None) -> None:
    """Compare the trees of A and B (an original and its fork, or two runs of a task):
    per agent, the first message where they part, outcomes, rounds, tokens and costs.

    Agents are matched by their place in the tree (root, root/1, root/1/2). Tool-call
    ids and the trees' own ids inside texts are not differences.
    """
    from fanfold.cli.replay_commands import _errors
    from fanfold.replay.compare import compare
    from fanfold.replay.lineage import fork_origin

    with _errors(), open_store(db, read_only=True) as store:
        nodes = _nodes(store, a) | _nodes(store, b)
        pairs = compare(store, a, b)
        roots = (store.conversation(a).root_id, store.conversation(b).root_id)
        made = [fork_origin(store, root) for root in roots]
    report = {
        "a": roots[0],
        "b": roots[1],
        # Like with like: a fork's state counts what its source had spent before the
        # fork, so each side's whole total is compared (not a fork's spend since).
        "tokens_compared": TOKENS_COMPARED,
        "agents": [_pair_json(pair, nodes) for pair in pairs],
        # Where each tree was forked, if it is a fork: the agent picked, its seq in
        # its source, and the edit (issue 34).
        "a_fork": _fork_json(made[0]),
        "b_fork": _fork_json(made[1]),
    }
    if as_json:
        click.echo(json.dumps(report, indent=2, ensure_ascii=True))
        return
    _show(report)


def _fork_json(made: ForkOrigin | None) -> dict[str, Any] | None:
    if made is None:
        return None
    return {
        "source": made.source.source_id,
        "source_seq": made.source.seq,
        "agent": made.agent,
        "agent_seq": made.seq,
        "edit": made.edit_text,
    }


TOKENS_COMPARED = (
    "each conversation's whole total: a fork's includes what it inherited from its "
    "source, as the source's includes what it spent before the fork moment"
)


def _nodes(store: Store, conversation_id: str) -> dict[str, ShowNode]:
    """Each conversation of the tree, as ``show`` builds it, but with its whole
    state's counts and cost: ``show`` gives a fork's spend since the fork, and a
    comparison with its source must count both sides alike."""
    from fanfold.cli.show_view import _show_node, _trusted_config

    root = store.conversation(conversation_id).root_id
    config = _trusted_config(store, root)
    found: dict[str, ShowNode] = {}
    stack = [_show_node(store, root, config)]
    while stack:
        node = stack.pop()
        if node.forked is not None:
            node = _whole(store, node, config)
        found[node.state.id] = node
        stack.extend(node.children)
    return found


def _whole(store: Store, node: ShowNode, config: Config | None) -> ShowNode:
    """``node`` with its conversation's whole state (tokens since it began)."""
    import attrs

    state = store.load_state(node.state.id)
    cost = node.cost
    if config is not None:
        prices = config.resolve(state.model, state.depth)[0].prices
        if prices is not None:
            cost = prices.cost(state.usage_input, state.usage_cached, state.usage_output)
    return attrs.evolve(node, state=state, cost=cost)


def _side(conversation_id: str | None, nodes: dict[str, ShowNode]) -> dict[str, Any] | None:
    if conversation_id is None:
        return None
    node = nodes[conversation_id]
    state = node.state
    return {
        "id": conversation_id,
        "phase": type(state.phase).__name__,
        "status": node.status,
        "outcome": node.outcome(),
        "rounds": state.rounds,
        "tokens": state.usage.total,
        "cost": node.cost,
    }


def _said_json(item: Said | None) -> dict[str, Any] | None:
    return None if item is None else {"seq": item.seq, "kind": item.kind, "text": item.text}


def _pair_json(pair: AgentPair, nodes: dict[str, ShowNode]) -> dict[str, Any]:
    parting = pair.parting
    return {
        "path": pair.path,
        "a": _side(pair.a_id, nodes),
        "b": _side(pair.b_id, nodes),
        "same": pair.a_id is not None and pair.b_id is not None and parting is None,
        "parting": None
        if parting is None
        else {"index": parting.index, "a": _said_json(parting.a), "b": _said_json(parting.b)},
    }


def _both(agent: dict[str, Any], field: str, shown: Any = str) -> str:
    values = [
        "-" if side is None or side[field] is None else shown(side[field])
        for side in (agent["a"], agent["b"])
    ]
    return values[0] if values[0] == values[1] else f"{values[0]} → {values[1]}"


def _money(amount: float) -> str:
    return f"${amount:.4f}"


def _parts(agent: dict[str, Any]) -> str:
    if agent["a"] is None:
        return "only in B"
    if agent["b"] is None:
        return "only in A"
    parting = agent["parting"]
    if parting is None:
        return "same"
    where = [
        f"{side} seq {p['seq']}" for side, p in (("A", parting["a"]), ("B", parting["b"])) if p
    ]
    return f"item {parting['index']} ({', '.join(where)})"


def _show(report: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    from fanfold.cli.display import printable, short
    from fanfold.cli.output import console

    console.print(
        Text(f"A: {printable(report['a'])}   B: {printable(report['b'])}", style="bold"),
        soft_wrap=True,
        highlight=False,
    )
    for side in ("a", "b"):
        made = report[f"{side}_fork"]
        if made is not None:
            edit = f", edited: {made['edit']}" if made["edit"] else ", no edit"
            said = (
                f"{side.upper()} is a fork of {made['source']}@{made['source_seq']}, "
                f"made at {made['agent']} seq {made['agent_seq']}{edit}"
            )
            console.print(Text(printable(said), style="dim"), soft_wrap=True, highlight=False)
    console.print(
        Text(f"tokens and cost: {report['tokens_compared']}", style="dim"),
        soft_wrap=True,
        highlight=False,
    )
    table = Table("agent", "outcome", "rounds", "tokens", "cost", "parts at")
    for agent in report["agents"]:
        table.add_row(
            Text(printable(agent["path"])),
            Text(_both(agent, "phase")),
            Text(_both(agent, "rounds")),
            Text(_both(agent, "tokens")),
            Text(_both(agent, "cost", _money)),
            Text(_parts(agent)),
        )
    console.print(table)
    for agent in report["agents"]:
        parting = agent["parting"]
        if parting is None:
            continue
        console.print(
            Text(f"{printable(agent['path'])} parts at item {parting['index']}:", style="bold"),
            soft_wrap=True,
            highlight=False,
        )
        for side, style in (("a", "red"), ("b", "green")):
            item = parting[side]
            said = (
                "(nothing: it ends before)"
                if item is None
                else f"seq {item['seq']} {item['kind']}: {short(item['text'], 200)}"
            )
            console.print(
                Text(f"  {side.upper()} {printable(said)}", style=style),
                soft_wrap=True,
                highlight=False,
            )
        for side in ("a", "b"):
            outcome = agent[side]["outcome"] if agent[side] else ""
            if outcome:
                console.print(
                    Text(f"  {side.upper()} outcome: {short(outcome, 200)}", style="dim"),
                    soft_wrap=True,
                    highlight=False,
                )
