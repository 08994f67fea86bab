"""``fanfold run`` and ``fanfold send``: start a turn and watch it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fanfold.cli.approvals import EXIT_WAITING
from fanfold.cli.database import Target, db_option, db_path, default_db
from fanfold.cli.errors import CliError, user_errors
from fanfold.cli.options import SectionedCommand, dbos_db_option, model_options
from fanfold.cli.python_tools import tools_option
from fanfold.cli.seconds import FiniteFloatRange
from fanfold.regular_files import read_regular

# The runtime, the providers, the tools and the views are imported by the functions
# that run a turn: `run --help` and `send --help` need only the options above.
if TYPE_CHECKING:
    from fanfold.agents import AgentDefinition
    from fanfold.cli.models import ModelChoice
    from fanfold.cli.signals import Interruption
    from fanfold.statemachine import Conversation, Limits

# A turn's time limit: up to a year (more is a slip; NaN and infinities never).
MAX_TURN_SECONDS = 365 * 86400.0


@click.command(
    cls=SectionedCommand,
    # The basic options first; the model's, the limits and the workers' apart.
    sections={
        "Model and tools": ("script", "config_path", "profile", "model", "tool_refs"),
        "Limits": (
            "max_rounds",
            "max_concurrent",
            "max_tasks_per_call",
            "max_depth",
            "max_tokens",
            "timeout",
            "context_modes",
        ),
        "Workers (a tree for `fanfold worker`)": ("detach", "dbos_db"),
    },
    epilog=(
        "\b\nExamples:\n"
        '  fanfold run --db demo.db "Review this repository"   # offline: the demo script\n'
        '  fanfold run --config team.toml --max-tokens 200000 "Fix the failing test"\n'
    ),
)
@click.argument("task", required=False)
@click.option(
    "--file",
    "task_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Read the task from a file.",
)
@model_options
@click.option(
    "--cwd",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Working directory for tools.",
)
@click.option(
    "--max-rounds",
    type=click.IntRange(min=1),
    default=None,
    help="Model rounds per turn (sub-agents: per life; default: 20).",
)
@click.option(
    "--max-concurrent",
    type=click.IntRange(min=1),
    default=None,
    help="Sub-agents of one parent running at once (default: 10).",
)
@click.option(
    "--max-tasks-per-call",
    type=click.IntRange(min=1),
    default=None,
    help="Tasks one spawn_agents call may give (default: 10; a wide fan-out needs more).",
)
@click.option(
    "--max-depth",
    type=click.IntRange(min=0),
    default=None,
    help="Deepest sub-agent level (default: 1, only the root spawns).",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Token budget of the whole tree: the root and every sub-agent together (default: none).",
)
@click.option(
    "--json-log",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write structured JSON logs here (default: next to the database).",
)
@click.option(
    "--system",
    "system_text",
    default=None,
    help="System prompt of the root conversation (default: system_prompt in the config).",
)
@click.option(
    "--system-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Read the root's system prompt from a file.",
)
@click.option(
    "--context-modes",
    default=None,
    metavar="MODES",
    help="The context modes sub-agent tasks may ask for, comma-separated: task_only and "
    "any of full, summary (default: all three; both cost tokens).",
)
@click.option(
    "--timeout",
    type=FiniteFloatRange(min=0, min_open=True, max=MAX_TURN_SECONDS),
    default=None,
    metavar="SECONDS",
    help="Time limit of each turn: past it the turn ends in error timed_out, its "
    "sub-agents cancelled (default: none).",
)
@click.option("--no-live", is_flag=True, help="No live tree; print the result only.")
@click.option(
    "--ask",
    "ask_rules",
    multiple=True,
    metavar="PATTERN",
    help="A call matching this rule (Claude Code's syntax: 'Bash(git push:*)', "
    "'mcp__github__create_issue', 'Write(src/**)') waits for your decision, anywhere in "
    "the tree; repeatable (with [permissions] ask in fanfold.toml).",
)
@click.option(
    "--ask-user",
    is_flag=True,
    help="Offer the ask_user tool: agents may ask you a question and wait for the answer.",
)
@click.option(
    "--approval-timeout",
    type=FiniteFloatRange(min=0, min_open=True, max=MAX_TURN_SECONDS),
    default=None,
    metavar="SECONDS",
    help="A call waiting for a decision longer is denied (default: [permissions] "
    "approval_timeout, else none: it waits).",
)
@click.option(
    "--no-wait",
    is_flag=True,
    help="Never ask here: once the tree can go on only after a decision, print the open "
    "requests and exit with status 75 (as without a terminal).",
)
@click.option(
    "--detach",
    is_flag=True,
    help="Put the tree on the workers' queue (--dbos-db) and print its id; "
    "`fanfold wait ID` prints its outcome. The workers' model and tools run it.",
)
@dbos_db_option
@tools_option
@db_option
def run(
    task: str | None,
    task_file: Path | None,
    script: Path | None,
    config_path: Path | None,
    profile: str | None,
    model: str | None,
    cwd: Path,
    max_rounds: int | None,
    max_concurrent: int | None,
    max_tasks_per_call: int | None,
    max_depth: int | None,
    max_tokens: int | None,
    json_log: Path | None,
    system_text: str | None,
    system_file: Path | None,
    context_modes: str | None,
    timeout: float | None,
    no_live: bool,
    ask_rules: tuple[str, ...],
    ask_user: bool,
    approval_timeout: float | None,
    no_wait: bool,
    detach: bool,
    dbos_db: str | None,
    tool_refs: tuple[str, ...],
    db: Target | None,
) -> None:
    """Start a conversation on TASK and show its sub-agent tree live.

    Ctrl-C, SIGTERM or SIGHUP cancels it cleanly: every sub-agent is cancelled and
    recorded; the exit status is then 128 + the signal (130, 143, 129).

    A call that must wait for a person (--ask, [permissions] ask, a tool that needs
    approval, an ask_user question) is asked here in a terminal (y / n / edit);
    without one, or with --no-wait, the run stops once the tree can go on only after
    a decision: exit status 75, the requests printed; decide with `fanfold approve`,
    `deny` or `answer`, then go on with `fanfold resume`.
    """
    from fanfold.cli.agents_in_effect import agents_in_effect
    from fanfold.cli.logs import open_logs
    from fanfold.cli.mcp_tools import declarations_for, with_server_secrets
    from fanfold.cli.models import choose_model
    from fanfold.cli.output import hint
    from fanfold.cli.python_tools import load_tools
    from fanfold.cli.signals import run_trio
    from fanfold.cli.turns import print_result
    from fanfold.statemachine import Limits

    if (task is None) == (task_file is None):
        raise CliError("give a TASK or --file (one of them)")
    text = task if task is not None else _read_task(task_file)  # type: ignore[arg-type]
    if not text.strip():
        raise CliError("the task is empty")
    if not cwd.is_dir():
        raise CliError(f"--cwd {cwd} is not a directory")
    if system_text is not None and system_file is not None:
        raise CliError("give --system or --system-file, not both")
    system = system_text
    if system_file is not None:
        system = _read_text(system_file, "--system-file")
    # The limits given on the command line (for a run here, or a detached tree's spec).
    numbers = {
        k: v
        for k, v in {
            "max_rounds": max_rounds,
            "max_concurrent": max_concurrent,
            "max_tasks_per_call": max_tasks_per_call,
            "max_depth": max_depth,
            "max_tokens": max_tokens,
        }.items()
        if v is not None
    }
    if detach and (ask_user or no_wait):
        # (--ask and --approval-timeout go with the tree: its spec carries them.)
        raise CliError(
            "--detach: --ask-user and --no-wait are for a run here (ask_user is a tool, "
            "and a detached tree's tools are the workers'; a detached tree never asks "
            "in a terminal: decide with fanfold pending / approve / deny)"
        )
    if detach:
        given = [o for o, v in (("--script", script), ("--config", config_path),
                                ("--profile", profile), ("--model", model),
                                ("--tools", tool_refs), ("--json-log", json_log)) if v]  # fmt: skip
        if given:
            raise CliError(
                f"--detach: {', '.join(given)} belong to the workers (fanfold worker "
                "chooses the model and tools of the trees it runs)"
            )
        modes = _context_modes(context_modes) if context_modes is not None else None
        asked = _ask_rules(ask_rules)
        _detach(text, cwd, system, numbers, modes, timeout, dbos_db, db, asked, approval_timeout)
        return
    path = db or default_db()
    open_logs(path, json_log)
    with user_errors(path):
        python_tools = load_tools(tool_refs)
        # A run in --cwd is a run in that folder: its fanfold.toml, as its .mcp.json
        # and agent files.
        choice = choose_model(script, config_path, profile, model, cwd)
        overrides: dict[str, Any] = dict(numbers)
        if context_modes is not None:
            overrides["context_modes"] = _context_modes(context_modes)
        waited = approval_timeout if approval_timeout is not None else choice.approval_timeout
        if waited is not None:
            overrides["approval_timeout"] = waited
        asked = _ask_rules((*choice.ask, *ask_rules))
        limits = choice.retry.apply(Limits(**overrides))
        hint(f"model: {choice.description}; log: {path}", style="dim")
        if system is None:
            system = choice.system_prompt
        agents = agents_in_effect(
            cwd, dict(choice.model_aliases), [t.spec.name for t in python_tools]
        )
        servers = declarations_for(cwd, config_path)
        choice = with_server_secrets(choice, servers)
        result = run_trio(
            _run_main,
            path,
            choice,
            text,
            cwd,
            limits,
            system,
            not no_live,
            agents,
            servers,
            python_tools,
            timeout,
            asked,
            ask_user,
            no_wait,
        )
    if result[3]:
        raise SystemExit(EXIT_WAITING)
    print_result(*result[:3], db=path)


def _detach(
    text: str,
    cwd: Path,
    system: str | None,
    limits: dict[str, int],
    context_modes: tuple[str, ...] | None,
    timeout: float | None,
    dbos_db: str | None,
    db: Target | None,
    ask: tuple[str, ...] = (),
    approval_timeout: float | None = None,
) -> None:
    """``run --detach``: enqueue the tree for the workers; print its id on stdout."""
    import uuid

    from fanfold.cli.output import hint
    from fanfold.cli.worker_commands import POSTGRES_EXTRA, scrubbed, system_url
    from fanfold.db import is_postgres
    from fanfold.worker.spec import TreeSpec

    url = system_url(dbos_db, db if db is not None else default_db())
    spec = TreeSpec(
        root_id=uuid.uuid4().hex[:12],
        task=text,
        cwd=str(cwd.resolve()),
        system_prompt=system,
        limits=tuple(sorted(limits.items())),
        context_modes=context_modes,
        timeout=timeout,
        ask=ask,
        approval_timeout=approval_timeout,
    )
    try:
        spec.make_limits()  # the limits' own checks, before anything is queued
    except ValueError as exc:
        raise CliError(f"limits: {exc}") from None
    try:
        from fanfold.worker.client import QueueNotReady, enqueue_tree
    except ImportError:
        raise CliError(f"fanfold run --detach {POSTGRES_EXTRA}") from None
    try:
        tree_id = enqueue_tree(url, spec)
    except QueueNotReady as exc:
        # Workers still setting the database up were waited for (a bounded time).
        raise CliError(f"could not queue the tree: {scrubbed(str(exc), url)}") from None
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        if "dbos.workflow_status" in first and "does not exist" in first:
            raise CliError(
                "could not queue the tree: no worker has set up that database yet "
                "(start `fanfold worker` on it first)"
            ) from None
        raise CliError(
            f"could not queue the tree: {scrubbed(f'{type(exc).__name__}: {first}', url)}"
        ) from None
    click.echo(tree_id)
    where = f" --db {db}" if db is not None else ""
    if not is_postgres(db if db is not None else default_db()):
        # wait asks the queue about a tree not in the log yet (else: an unknown id).
        where += " --dbos-db URL (or $FANFOLD_DBOS_DB, as here)"
    hint(f"queued; its outcome: fanfold wait {tree_id}{where}", style="dim")


def _read_task(task_file: Path) -> str:
    return _read_text(task_file, "--file")


def _read_text(path: Path, option: str) -> str:
    try:
        # read_regular: a FIFO is refused, never waited on. Newlines as read_text.
        data = read_regular(path).decode("utf-8")
        return data.replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError:
        raise CliError(f"{option} {path} is not UTF-8 text") from None
    except OSError as exc:
        raise CliError(f"cannot read {option} {path}: {exc.strerror or exc}") from None


async def _run_main(
    stop: tuple[int, ...],
    path: Path,
    choice: ModelChoice,
    text: str,
    cwd: Path,
    limits: Limits,
    system: str,
    live: bool,
    agents: tuple[AgentDefinition, ...] = (),
    servers: tuple[Any, ...] = (),
    python_tools: Sequence[Any] = (),
    timeout: float | None = None,
    ask: tuple[str, ...] = (),
    ask_user: bool = False,
    no_wait: bool = False,
) -> tuple[str, Conversation, Interruption | None, list[str]]:
    from fanfold.cli.approvals import say_waiting
    from fanfold.cli.display import TreeView
    from fanfold.cli.mcp_tools import mcp_tools, refreshing, scoped_to_agents
    from fanfold.cli.signals import stop_signal_receiver
    from fanfold.cli.turns import People, watch
    from fanfold.runtime import Runtime
    from fanfold.tools.ask_user import AskUserTool

    view = TreeView()
    try:
        # The receiver stays open until the runtime has shut down: a signal arriving
        # meanwhile waits (it is delivered after) instead of killing the process before
        # the shutdown has stopped its bash commands.
        with stop_signal_receiver(stop) as signals:
            async with mcp_tools(servers, cwd, choice.env_policy) as served:
                scoped_agents, extra = scoped_to_agents(agents, served)
                asking = [AskUserTool()] if ask_user else []
                async with Runtime.open(
                    path,
                    choice.provider,
                    refreshing(choice.tools([*python_tools, *asking, *extra]), extra),
                    redact=choice.redactor(),
                    limits=limits,
                    observer=view.observe,
                    on_progress=view.progress,
                    provider_description=choice.recorded,
                ) as runtime:
                    conversation_id = await runtime.start(
                        text,
                        cwd=cwd,
                        limits=limits,
                        system_prompt=system,
                        agents=scoped_agents,
                        timeout=timeout,
                        ask=ask,
                    )
                    people = People(no_wait=no_wait)
                    interruption = await watch(
                        runtime, conversation_id, view, live, signals, people
                    )
                    if people.blocked:
                        say_waiting(runtime, path)
                    state = runtime.state(conversation_id)
                    return conversation_id, state, interruption, people.blocked
    finally:
        await choice.aclose()


@click.command(
    epilog=('\b\nExamples:\n  fanfold send 3f9a0c61d2b4 "Now write the fix" --db demo.db\n'),
)
@click.argument("conversation_id")
@click.argument("text")
@model_options
@click.option("--no-live", is_flag=True, help="No live tree; print the result only.")
@tools_option
@db_option
def send(
    conversation_id: str,
    text: str,
    script: Path | None,
    config_path: Path | None,
    profile: str | None,
    model: str | None,
    no_live: bool,
    tool_refs: tuple[str, ...],
    db: Target | None,
) -> None:
    """Send TEXT as the next user message of a stored root conversation (or a fork)."""
    from fanfold.cli.logs import open_logs
    from fanfold.cli.mcp_tools import recorded_declarations, recorded_specs, with_server_secrets
    from fanfold.cli.models import choose_model
    from fanfold.cli.output import hint
    from fanfold.cli.python_tools import load_tools, missing_message
    from fanfold.cli.signals import run_trio
    from fanfold.cli.turns import print_result
    from fanfold.db import open_store
    from fanfold.tools.registry import unsupplied

    path = db_path(db)
    open_logs(path, None)
    with user_errors(path):
        _refuse_sub_agent(path, conversation_id)
        with open_store(path) as store:
            state = store.load_state(conversation_id)
        python_tools = load_tools(tool_refs)
        # The tree goes on with the tools it recorded: a Python tool it names that is not
        # supplied would answer every call "unknown tool"; say so now, and how.
        missing = unsupplied(state.tools, [t.spec.name for t in python_tools])
        if missing:
            raise CliError(missing_message(f"conversation {conversation_id}", missing))
        choice = choose_model(script, config_path, profile, model, Path(state.cwd))
        hint(f"model: {choice.description}; log: {path}", style="dim")
        recorded = ((state.cwd, recorded_specs(state)),)
        servers = recorded_declarations(recorded, config_path)
        choice = with_server_secrets(choice, servers)
        result = run_trio(
            _send_main,
            path,
            choice,
            conversation_id,
            text,
            not no_live,
            recorded,
            servers,
            python_tools,
        )
    print_result(*result, db=path)


def _refuse_sub_agent(path: Target, conversation_id: str) -> None:
    """A user message to a sub-agent: say so plainly, and name the root to send to.

    (The reducer refuses it too, but in its own terms, naming the phase it was in.)
    """
    from fanfold.db import open_store

    with open_store(path) as store:
        row = store.conversation(conversation_id)
    if row.parent_id is not None:
        raise CliError(
            f"{conversation_id} is a sub-agent, and sub-agents cannot take user messages; "
            f"send to its root conversation instead: fanfold send {row.root_id} TEXT "
            f"--db {path}"
        )


async def _send_main(
    stop: tuple[int, ...],
    path: Path,
    choice: ModelChoice,
    conversation_id: str,
    text: str,
    live: bool,
    recorded: tuple[tuple[str, Any], ...] = (),
    servers: tuple[Any, ...] = (),
    python_tools: Sequence[Any] = (),
) -> tuple[str, Conversation, Interruption | None]:
    from fanfold.cli.display import TreeView
    from fanfold.cli.mcp_tools import recorded_mcp_tools, refreshing
    from fanfold.cli.signals import stop_signal_receiver
    from fanfold.cli.turns import watch
    from fanfold.runtime import Runtime

    view = TreeView()
    try:
        with stop_signal_receiver(stop) as signals:  # open until the runtime shut down
            async with (
                # The tree's recorded MCP tools, on the servers its folder declares now.
                recorded_mcp_tools(recorded, servers, choice.env_policy) as extra,
                Runtime.open(
                    path,
                    choice.provider,
                    # A server's tools/list_changed is taken between rounds, as in `run`.
                    refreshing(choice.tools([*python_tools, *extra]), extra),
                    redact=choice.redactor(),
                    observer=view.observe,
                    on_progress=view.progress,
                    provider_description=choice.recorded,
                ) as runtime,
            ):
                await runtime.send(conversation_id, text)
                interruption = await watch(runtime, conversation_id, view, live, signals)
                return conversation_id, runtime.state(conversation_id), interruption
    finally:
        await choice.aclose()


def _ask_rules(texts: tuple[str, ...]) -> tuple[str, ...]:
    """The ask rules given (``--ask``, ``[permissions] ask``), each checked."""
    from fanfold.statemachine.permissions import parse_rule

    for text in texts:
        rule = parse_rule(text)
        if isinstance(rule, str):
            raise CliError(f"--ask: {rule}")
    return texts


def _context_modes(text: str) -> tuple[str, ...]:
    """``--context-modes``: ``task_only`` first, then the others given, in order."""
    from fanfold.statemachine.limits import CONTEXT_MODES

    given = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in given if m not in CONTEXT_MODES]
    if unknown:
        raise CliError(
            f"--context-modes: unknown mode(s) {', '.join(unknown)}; use task_only, full, summary"
        )
    return ("task_only", *dict.fromkeys(m for m in given if m != "task_only"))
