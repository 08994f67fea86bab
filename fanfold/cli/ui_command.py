"""``fanfold ui``: the trace pages of a whole database, served on this machine."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import click

from fanfold.cli.database import Target, db_option, db_path
from fanfold.cli.errors import CliError, user_errors
from fanfold.cli.seconds import FiniteFloatRange

# What a command runs with (rich, the log, the reducer, the runtime, the providers) is
# imported in the functions that use it: `--help` imports none of it (issue 36,
# tests/test_cli_startup.py).
if TYPE_CHECKING:
    import trio

    from fanfold.db import Store

# Addresses that listen on every interface: the machine's other addresses and names
# reach the server too (the Host check accepts the address a connection arrived at).
_WILDCARDS = ("0.0.0.0", "::", "[::]", "")


def tree_summaries(store: Store) -> list[dict[str, Any]]:
    """The list page's rows, with each tree's tokens and cost as `fanfold show` has
    them (cost only for the user's own trees whose recorded profiles have prices)."""
    from fanfold.cli.show_view import _show_node, _trusted_config
    from fanfold.db import DatabaseError
    from fanfold.serve.ui_server import default_summaries, finite

    rows = default_summaries(store)
    for row in rows:
        try:
            node = _show_node(store, row["id"], _trusted_config(store, row["id"]))
        except DatabaseError:
            # A damaged tree (its trace page says where) keeps its row without tokens
            # and cost, and never takes the list of the other trees down with it.
            continue
        row["tokens"] = node.state.tokens_spent
        row["cost"] = finite(node.tree_cost())
    return rows


async def _stop_on_signal(scope: trio.CancelScope) -> None:
    """Ctrl-C, SIGTERM or SIGHUP stops the server (nothing to clean up: it only reads)."""
    import trio

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async for _ in signals:
            scope.cancel()
            return


@click.command(
    name="ui",
    epilog=(
        "\b\nExamples:\n"
        "  fanfold ui --db demo.db              # prints http://127.0.0.1:8765/?token=...\n"
        "  FANFOLD_UI_TOKEN=... fanfold ui --port 9000\n"
    ),
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    default=8765,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port to listen on (0: a free one; the URL printed names it).",
)
@click.option(
    "--poll",
    default=0.5,
    show_default=True,
    type=FiniteFloatRange(0.05, 60),
    help="Seconds between looks at the database for live updates.",
)
@click.option(
    "--token",
    envvar="FANFOLD_UI_TOKEN",
    show_envvar=True,
    default=None,
    help="The secret every request must carry (16+ characters of A-Z a-z 0-9 . _ ~ -); "
    "a fresh random one per launch by default. Prefer the variable: a command line is "
    "visible to other users of the machine.",
)
@db_option
def ui_command(host: str, port: int, poll: float, token: str | None, db: Target | None) -> None:
    """Serve the trace pages of every tree in the database, live, on this machine.

    Lists the trees (status, duration, agents, tokens, cost); each tree's page is the
    one `fanfold trace` writes, updated as a running tree goes on. Read-only. Listens
    on 127.0.0.1 unless --host says otherwise. Open the printed URL: it holds a token,
    random per launch, without which every request is refused (the browser keeps it in
    a cookie); requests naming another host or coming from another site are refused
    too. Needs the `ui` extra (`pip install 'fanfold[ui]'`).
    """
    import trio

    from fanfold.cli.output import console
    from fanfold.db import open_store
    from fanfold.loopback import new_token
    from fanfold.serve.ui_server import BadToken, TraceServer, check_token

    try:
        import hypercorn  # noqa: F401
    except ImportError:
        raise CliError("fanfold ui needs the ui extra: pip install 'fanfold[ui]'") from None
    from fanfold.serve.ui_server import serve

    try:
        secret = new_token() if token is None else check_token(token)
    except BadToken as exc:
        raise CliError(f"--token / FANFOLD_UI_TOKEN: {exc}") from None
    with user_errors(db):
        path = db_path(db)
        open_store(path, read_only=True).close()  # a clear error now, not per request
    app = TraceServer(path, token=secret, hosts=(host,), summaries=tree_summaries, poll=poll)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signal, nursery.cancel_scope)
            binds = await nursery.start(serve, app, host, port)
            # The only place the token is written: Hypercorn's access log is off.
            for bind in binds:
                console.print(
                    f"fanfold ui: {bind}/?token={secret} (Ctrl-C to stop)",
                    highlight=False,
                    soft_wrap=True,
                )
            if host not in ("127.0.0.1", "localhost", "::1"):
                everywhere = " on every interface" if host in _WILDCARDS else ""
                console.print(
                    f"warning: listening beyond this machine{everywhere}, over plain HTTP: "
                    "whoever sees the traffic sees the token and every page",
                    style="yellow",
                    highlight=False,
                )

    try:
        trio.run(main)
    except (OSError, BaseExceptionGroup) as exc:
        # Hypercorn's bind fails inside nested nurseries: the OSError (a port in use,
        # an unknown host) arrives wrapped in exception groups.
        failed = _os_error(exc)
        if failed is None:
            raise
        raise CliError(f"cannot listen on {host}:{port}: {failed.strerror or failed}") from None


def _os_error(exc: BaseException) -> OSError | None:
    """``exc`` if it is an OSError, or the first of a group made only of OSErrors."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        leaves = [_os_error(inner) for inner in exc.exceptions]
        if leaves and all(leaf is not None for leaf in leaves):
            return leaves[0]
    return None
