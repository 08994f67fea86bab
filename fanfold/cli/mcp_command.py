"""``fanfold mcp``: serve fanfold's delegation to MCP hosts (the ``mcp`` extra)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fanfold.cli.database import Target, beside_log, db_option, default_db
from fanfold.cli.errors import CliError, user_errors
from fanfold.cli.logs import open_logs
from fanfold.cli.options import model_options
from fanfold.cli.python_tools import load_tools, tools_option
from fanfold.cli.seconds import FiniteFloatRange

# What a command runs with (rich, the log, the reducer, the runtime, the providers) is
# imported in the functions that use it: `--help` imports none of it (issue 36,
# tests/test_cli_startup.py).
if TYPE_CHECKING:
    from fanfold.cli.models import ModelChoice
    from fanfold.statemachine import Limits

TOKEN_VARIABLE = "FANFOLD_MCP_TOKEN"


@click.command(
    "mcp",
    epilog=(
        "\b\nExamples:\n"
        "  fanfold mcp --db ~/.local/share/fanfold/fanfold.db --cwd .   # stdio, for a host\n"
        "  fanfold mcp --http --port 8766\n"
        "  fanfold mcp --ask 'Bash(git push:*)' --approval-timeout 600   # the host decides\n"
    ),
)
@model_options
@click.option(
    "--cwd",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Working directory of the delegated trees (and where agent files are found).",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Token budget of each delegated tree (a task's budget may lower it).",
)
@click.option("--http", is_flag=True, help="Serve Streamable HTTP on a loopback port, not stdio.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=0, help="--http port on 127.0.0.1 (0: any)."
)
@click.option(
    "--ask",
    "ask_rules",
    multiple=True,
    metavar="PATTERN",
    help="A call matching this rule ('Bash(git push:*)') waits for a decision, taken with "
    "approve_request/deny_request; repeatable (with [permissions] ask in fanfold.toml).",
)
@click.option(
    "--approval-timeout",
    type=FiniteFloatRange(min=0, min_open=True, max=365 * 86400.0),
    default=None,
    metavar="SECONDS",
    help="A call of a delegated tree waiting for a decision longer is denied (default: "
    "[permissions] approval_timeout, else none: it waits).",
)
@tools_option
@db_option
def mcp_command(
    script: Path | None,
    config_path: Path | None,
    profile: str | None,
    model: str | None,
    cwd: Path,
    max_tokens: int | None,
    http: bool,
    port: int,
    ask_rules: tuple[str, ...],
    approval_timeout: float | None,
    tool_refs: tuple[str, ...],
    db: Target | None,
) -> None:
    """Serve delegation over MCP: delegate_task, list_sub_agents, get_delegation_result.

    Over stdio by default (an MCP host starts `fanfold mcp` as a subprocess); with
    --http, Streamable HTTP on 127.0.0.1, every request needing the bearer token
    printed at start (or taken from $FANFOLD_MCP_TOKEN). Delegations are trees in the
    database like `fanfold run`'s; the unfinished ones this server started are
    resumed when it starts again.
    """
    from fanfold.cli.agents_in_effect import agents_in_effect
    from fanfold.cli.mcp_tools import declarations_for, with_server_secrets
    from fanfold.cli.models import choose_model
    from fanfold.cli.output import hint
    from fanfold.cli.signals import run_trio
    from fanfold.statemachine import Limits

    try:
        import mcp  # noqa: F401
    except ImportError:
        raise CliError("fanfold mcp needs the MCP SDK: pip install 'fanfold[mcp]'") from None
    if not cwd.is_dir():
        raise CliError(f"--cwd {cwd} is not a directory")
    path = db or default_db()
    if isinstance(path, Path):
        path.parent.mkdir(parents=True, exist_ok=True)
    # Logs go to the file beside the database: stdout is the protocol's.
    open_logs(path, None)
    with user_errors(path):
        python_tools = load_tools(tool_refs)
        choice = choose_model(script, config_path, profile, model, cwd)
        from fanfold.statemachine.permissions import parse_rule

        ask = (*choice.ask, *ask_rules)
        for text in ask:
            if isinstance(parse_rule(text), str):
                raise CliError(f"--ask: {parse_rule(text)}")
        overrides: dict[str, Any] = {"max_tokens": max_tokens} if max_tokens else {}
        # Every tree this server starts waits at most this long for a decision.
        waited = approval_timeout if approval_timeout is not None else choice.approval_timeout
        if waited is not None:
            overrides["approval_timeout"] = waited
        limits = choice.retry.apply(Limits(**overrides))
        agents = agents_in_effect(cwd)
        # The folder's MCP servers' tools are offered to delegated trees too.
        servers = declarations_for(cwd, config_path)
        from fanfold.mcp.client import UNDER_FANFOLD  # the mcp extra: imported late

        if servers and os.environ.get(UNDER_FANFOLD):
            hint(
                "started as an MCP server of another fanfold: not starting MCP servers "
                "of its own (a fanfold that names itself would start copies without end)",
                style="yellow",
            )
            servers = ()
        choice = with_server_secrets(choice, servers)
        token = None
        if http:
            token = os.environ.get(TOKEN_VARIABLE) or None
            if token is not None and len(token) < 16:
                raise CliError(f"${TOKEN_VARIABLE} is too short: give at least 16 characters")
        run_trio(
            _serve,
            path,
            choice,
            cwd.resolve(),
            limits,
            agents,
            http,
            port,
            token,
            servers,
            python_tools,
            ask,
        )


async def _serve(
    stop: tuple[int, ...],
    path: Target,
    choice: ModelChoice,
    cwd: Path,
    limits: Limits,
    agents: Any,
    http: bool,
    port: int,
    token: str | None,
    servers: tuple[Any, ...] = (),
    python_tools: Sequence[Any] = (),
    ask: tuple[str, ...] = (),
) -> None:
    import trio

    from fanfold.cli.mcp_tools import refreshing, scoped_mcp_tools
    from fanfold.cli.output import hint
    from fanfold.cli.signals import stop_signal_receiver
    from fanfold.loopback import new_token
    from fanfold.runtime import Runtime
    from fanfold.runtime.presence import DatabaseInUse
    from fanfold.serve.mcp_server import DelegationLedger, DelegationService, mcp_server

    try:
        with stop_signal_receiver(stop) as signals:
            async with (
                scoped_mcp_tools(servers, cwd, choice.env_policy, agents) as (agents, extra),
                Runtime.open(
                    path,
                    choice.provider,
                    refreshing(choice.tools([*python_tools, *extra]), extra),
                    redact=choice.redactor(),
                    limits=limits,
                    provider_description=choice.recorded,
                ) as runtime,
            ):
                service = DelegationService(
                    runtime,
                    cwd=cwd,
                    agents=agents,
                    limits=limits,
                    system_prompt=choice.system_prompt,
                    ask=ask,
                    ledger=DelegationLedger(
                        path if isinstance(path, Path) else beside_log(path, "")
                    ),
                )
                try:
                    resumed = await service.resume_own()
                except DatabaseInUse as exc:
                    hint(f"not resuming earlier delegations: {exc}", style="yellow")
                    resumed = []
                if resumed:
                    hint(f"resumed {len(resumed)} conversation(s) of earlier delegations")
                server = mcp_server(service)
                async with trio.open_nursery() as nursery:

                    async def on_signal() -> None:
                        async for _ in signals:
                            # A signal stops the server, not the work: the trees stay
                            # unfinished in the log and are resumed at the next start.
                            service.stopping = True
                            nursery.cancel_scope.cancel()

                    nursery.start_soon(on_signal)
                    if http:
                        from fanfold.serve.mcp_http import serve_http

                        await serve_http(
                            server, port, token or new_token(), show_token=token is None
                        )
                    else:
                        await server.run_stdio_async()
                    nursery.cancel_scope.cancel()
    finally:
        await choice.aclose()
