"""``fanfold resume``: go on with every unfinished tree after a crash or kill."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fanfold.cli.approvals import EXIT_WAITING, say_waiting, wait_or_blocked
from fanfold.cli.database import Target, db_option, db_path
from fanfold.cli.errors import user_errors
from fanfold.cli.logs import open_logs
from fanfold.cli.options import model_options
from fanfold.cli.python_tools import load_tools, missing_message, tools_option

# What a command runs with (rich, the log, the reducer, the runtime, the providers) is
# imported in the functions that use it: `--help` imports none of it (issue 36,
# tests/test_cli_startup.py).
if TYPE_CHECKING:
    from fanfold.cli.models import ModelChoice
    from fanfold.cli.signals import Interruption
    from fanfold.db import Store
    from fanfold.runtime import SkippedTree
    from fanfold.statemachine import Conversation


@click.command(
    epilog=(
        "\b\nExamples:\n"
        "  fanfold resume --db demo.db          # each tree with the provider it ran on\n"
        "  fanfold resume --script other.json   # every tree on this script instead\n"
    ),
)
@model_options
@tools_option
@db_option
def resume(
    script: Path | None,
    config_path: Path | None,
    profile: str | None,
    model: str | None,
    tool_refs: tuple[str, ...],
    db: Target | None,
) -> None:
    """Resume every unfinished conversation tree after a crash or kill.

    Each tree goes on with the provider configuration recorded for it (script or
    config file, checked against its recorded sha256); --script, --config, --profile
    or --model choose one explicitly for every tree instead (and are recorded).
    Trees this runtime did not write (imported, copied, edited) are never resumed:
    they are listed with the reason. A tree that ran with Python tools (--tools of
    run, or a program's own) goes on only when --tools supplies them again; one that
    lacks them is listed with the names and left for a later resume.

    Exit status: 0 if every tree that may be resumed was (inert trees listed aside);
    1 if a tree was left because its recorded provider configuration cannot be
    rebuilt or its log cannot be read (damaged: named, with the reason; the other
    trees are resumed all the same); 2 on an error; 75 when the trees can go on only
    after a person's decision (printed: decide with `fanfold approve`, `deny` or
    `answer`, then resume again); 128 + the signal after Ctrl-C,
    SIGTERM or SIGHUP, which stop the process cleanly (nothing left running) and
    leave the trees resumable.
    """
    from fanfold.cli.models import choose_model
    from fanfold.cli.signals import run_trio

    path = db_path(db)
    open_logs(path, None)
    with user_errors(path):
        override = None
        if script or config_path or profile or model:
            override = choose_model(script, config_path, profile, model)
        python_tools = load_tools(tool_refs)
        code = run_trio(_resume_main, path, override, config_path, None, tuple(python_tools))
    if code:
        raise SystemExit(code)


def _provider_refusal(root_id: str, recorded: str | None) -> tuple[ModelChoice | None, str]:
    """The rebuilt provider of tree ``root_id``, or why it cannot be rebuilt."""
    from fanfold.cli.models import rebuilt_choice
    from fanfold.providers.config import ConfigError
    from fanfold.providers.description import DescriptionError, ProviderDescription
    from fanfold.providers.scripted import ScriptError

    advice = "resume it with --script PATH or --config PATH to choose one explicitly"
    if recorded is None:
        return None, (
            "no provider configuration is recorded for it (started through the Python "
            f"API, or by a fanfold that did not record it); {advice}"
        )
    try:
        description = ProviderDescription.from_json(recorded)
        return rebuilt_choice(description), ""
    except (DescriptionError, ConfigError, ScriptError) as exc:
        return None, f"cannot rebuild the provider configuration it ran on: {exc}; {advice}"


def _say_skipped(skipped: SkippedTree) -> None:
    from rich.text import Text

    from fanfold.cli.display import printable
    from fanfold.cli.output import err_console, quietly

    quietly(
        lambda: err_console.print(
            Text.assemble(
                ("skipped ", "yellow"),
                f"tree {printable(skipped.root_id)}: ",
                printable(skipped.reason),
            ),
            soft_wrap=True,
            highlight=False,
        )
    )


def _recorded_tools(store: Store, root_id: str) -> tuple[str, tuple[Any, ...]]:
    """The root's folder and its recorded tool specs (none if its log cannot be read:
    the resume itself reports that tree)."""
    from fanfold.cli.mcp_tools import recorded_specs

    try:
        state = store.load_state(root_id)
    except Exception:  # a damaged tree: Runtime.resume names it
        return ".", ()
    return state.cwd, recorded_specs(state)


def _declarations(
    roots: tuple[str, ...],
    recorded_tools: list[tuple[str, tuple[Any, ...]]],
    chosen: list[str],
    choices_of: dict[str, ModelChoice],
    config_path: Path | None,
) -> tuple[Any, ...]:
    """The MCP servers the resumed trees' recorded tools are bound to: those of
    ``--config`` when given; else, for each tree, those of the configuration file
    recorded for it (a ``run --script ... --config F`` tree's F, as ``run`` read its
    servers), or of the usual lookup when none is recorded. A name is the first
    tree's."""
    from fanfold.cli.mcp_tools import recorded_declarations

    if config_path is not None or not choices_of:
        return recorded_declarations(recorded_tools, config_path)
    groups: dict[Path | None, list[tuple[str, tuple[Any, ...]]]] = {}
    for root_id, tree in zip(roots, recorded_tools, strict=True):
        if root_id in chosen:
            recorded = choices_of[root_id].recorded.config
            groups.setdefault(recorded.local_path() if recorded else None, []).append(tree)
    declared: dict[str, Any] = {}
    for path, trees in groups.items():
        for declaration in recorded_declarations(trees, path):
            declared.setdefault(declaration.name, declaration)
    return tuple(declared.values())


def _say_undeclared(
    roots: tuple[str, ...],
    recorded_tools: list[tuple[str, tuple[Any, ...]]],
    chosen: list[str],
    servers: tuple[Any, ...],
) -> None:
    """One yellow line per resumed tree whose recorded MCP tools name a server that is
    not declared now: each of their calls will be an error result naming it."""
    from fanfold.cli.display import printable
    from fanfold.cli.output import hint
    from fanfold.statemachine.permissions import mcp_server_of

    declared = {d.name for d in servers}
    for root_id, (_, specs) in zip(roots, recorded_tools, strict=True):
        names = {mcp_server_of(s.name) for s in specs} - {None} - declared
        if root_id in chosen and names:
            listed = ", ".join(repr(n) for n in sorted(n for n in names if n))
            hint(
                printable(
                    f"MCP: tree {root_id} recorded tools of server {listed}, not declared "
                    "now: each call of one will be an error result naming it"
                ),
                style="yellow",
            )


def _print_answers(finished: dict[str, Conversation], path: Target) -> None:
    """Each resumed tree's outcome as ``run`` prints it: its answer, or its error."""
    from rich.text import Text

    from fanfold.cli.display import printable
    from fanfold.cli.output import console, hint, quietly
    from fanfold.cli.turns import print_outcome
    from fanfold.statemachine import Error

    def show() -> None:
        for root, state in finished.items():
            if len(finished) > 1 or isinstance(state.phase, Error):
                console.print(Text(f"tree {printable(root)}:", style="bold"), highlight=False)
            print_outcome(root, state, title=f"answer of {printable(root)}")
            shown = printable(root)
            hint(f"inspect it with: fanfold show {shown} --db {path}", to=console, style="dim")

    quietly(show)


async def _resume_main(
    stop: tuple[int, ...],
    path: Path,
    override: ModelChoice | None,
    config_path: Path | None,
    only: str | None = None,
    python_tools: tuple[Any, ...] = (),
) -> int:
    """Resume and wait for every unfinished tree (``only``: that tree alone, as
    ``fork --continue`` does; a fork's edit, in its log, is delivered by ``resume``).

    A stop signal (Ctrl-C, SIGTERM, SIGHUP) stops this process, not the work: the
    runtime closes (model calls and bash commands are cancelled, nothing is left
    running) and the trees stay unfinished in the log for the next ``resume``. Unlike
    ``run``, whose turn the user started here and now, what is resumed is earlier work
    that a signal aimed at this process should not throw away.
    """
    import attrs
    import trio

    from fanfold.cli.display import TreeView
    from fanfold.cli.mcp_tools import recorded_mcp_tools, refreshing
    from fanfold.cli.models import ProviderPerTree
    from fanfold.cli.output import console, hint, quietly, say
    from fanfold.cli.signals import Interruption, stop_signal_receiver
    from fanfold.db import open_store
    from fanfold.db.provenance import UserKey
    from fanfold.mcp.config import secret_variables
    from fanfold.runtime import Runtime, SkippedTree, resume_plan
    from fanfold.tools.registry import ToolSet, unsupplied
    from fanfold.tools.secrets import EnvPolicy

    view = TreeView()
    stopped: Interruption | None = None
    per_tree = ProviderPerTree()
    choices: dict[str, ModelChoice] = {}  # rebuilt providers, by recorded description
    unbuildable = 0
    # Which trees may be continued, and on which provider, is settled before the
    # runtime opens: its tool set must keep the key variables of every configuration
    # it resumes out of bash commands, and its redactor must know their values.
    key = UserKey.load()
    with open_store(path) as store:
        plan = resume_plan(store, key)
        if only is not None:
            plan = attrs.evolve(
                plan,
                roots=tuple(r for r in plan.roots if r == only),
                skipped=tuple(s for s in plan.skipped if s.root_id == only),
            )
        recorded_for = {}
        recorded_tools = []
        lacking: dict[str, list[str]] = {}
        supplied = [t.spec.name for t in python_tools]
        for root_id in plan.roots:
            record = store.tree_record(root_id)
            recorded_for[root_id] = record.provider if record is not None else None
            recorded_tools.append(_recorded_tools(store, root_id))
            missing = unsupplied(recorded_tools[-1][1], supplied)
            if missing:
                lacking[root_id] = missing
    for skipped in plan.skipped:
        _say_skipped(skipped)
    # A tree that recorded Python tools not supplied here is left unfinished, named with
    # them: resumed, its next call of one would get "unknown tool" as its result.
    for root_id, missing in lacking.items():
        _say_skipped(SkippedTree(root_id, missing_message("it", missing)))
        unbuildable += 1
    ready = [r for r in plan.roots if r not in lacking]
    chosen = list(ready)
    choices_of: dict[str, ModelChoice] = {}  # each tree's rebuilt choice
    if override is None:
        chosen = []
        for root_id in ready:
            recorded = recorded_for[root_id]
            choice = choices.get(recorded) if recorded is not None else None
            if choice is None:
                choice, reason = _provider_refusal(root_id, recorded)
                if choice is None:
                    _say_skipped(SkippedTree(root_id, reason))
                    unbuildable += 1
                    continue
                assert recorded is not None
                choices[recorded] = choice
            per_tree.by_root[root_id] = choice.provider
            choices_of[root_id] = choice
            chosen.append(root_id)
    used = [override] if override is not None else list(choices.values())
    # The MCP servers the trees' recorded tools name: the variables their env and
    # headers take are kept from bash and redacted, like key variables.
    servers = _declarations(plan.roots, recorded_tools, chosen, choices_of, config_path)
    _say_undeclared(plan.roots, recorded_tools, chosen, servers)
    server_secrets = secret_variables(servers)
    policy = EnvPolicy(
        frozenset().union(*(c.env_policy.key_variables for c in used)) | server_secrets,
        # A variable passes only if every configuration resumed here lets it pass.
        (frozenset.intersection(*(c.env_policy.pass_env for c in used)) if used else frozenset())
        - server_secrets,
    )
    # A domain is fetched from only if every configuration resumed here allows it.
    web_domains = (
        tuple(sorted(set.intersection(*(set(c.web_domains) for c in used)))) if used else ()
    )
    try:
        # Open until the runtime has shut down: a second signal during the shutdown
        # waits (and is delivered after it) instead of killing the process before its
        # bash commands are stopped.
        with stop_signal_receiver(stop) as signals:
            async with (
                recorded_mcp_tools(recorded_tools, servers, policy) as extra,
                Runtime.open(
                    path,
                    override.provider if override is not None else per_tree,
                    # A server's tools/list_changed is taken between rounds, as in `run`.
                    refreshing(
                        ToolSet.default(
                            env_policy=policy,
                            web_domains=web_domains,
                            extra=[*python_tools, *extra],
                        ),
                        extra,
                    ),
                    redact=policy.redactor(os.environ),
                    observer=view.observe,
                    key=key,
                    provider_description=override.recorded if override is not None else None,
                ) as runtime,
            ):
                ids = await runtime.resume(chosen) if chosen else []
                for damaged in runtime.resume_damaged:
                    _say_skipped(damaged)
                unbuildable += len(runtime.resume_damaged)
                if not ids:
                    skipped_any = unbuildable or plan.skipped
                    console.print("nothing resumed" if skipped_any else "nothing to resume")
                    return 1 if unbuildable else 0
                roots = sorted({runtime.state(i).root_id for i in ids})
                console.print(f"resuming {len(ids)} conversation(s) in {len(roots)} tree(s)")
                blocked: list[str] = []
                async with trio.open_nursery() as nursery:

                    async def on_signal() -> None:
                        nonlocal stopped
                        async for signum in signals:
                            stopped = stopped or Interruption(signum)
                            nursery.cancel_scope.cancel()

                    nursery.start_soon(on_signal)
                    # A tree that can go on only after a person's decision stops
                    # here too (issue 35): `fanfold approve`, then resume again.
                    blocked = await wait_or_blocked(runtime, roots)
                    nursery.cancel_scope.cancel()
                if blocked and stopped is None:
                    say_waiting(runtime, path)
                    return EXIT_WAITING
                finished = {root: runtime.state(root) for root in roots}
            if stopped is None:
                say(view.render(), to=console)
                _print_answers(finished, path)
    finally:
        for choice in used:
            await choice.aclose()
    if stopped is not None:
        say(f"[yellow]stopped by {stopped.name}: the unfinished trees stay in the log[/yellow]")
        quietly(lambda: hint(f"go on with: fanfold resume --db {path}"))
        return stopped.exit_code
    return 1 if unbuildable else 0
