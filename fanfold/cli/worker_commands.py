"""``fanfold worker`` and ``fanfold wait``: trees on DBOS (issue 25).

The ``postgres`` extra (DBOS, psycopg) is imported only when ``worker`` runs (and by
``run --detach``); ``wait`` reads fanfold's log, and asks DBOS's queue only when a tree
is not in the log (is it queued, or is the id wrong?) and a queue is given.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import click

from fanfold.cli.database import Target, db_option, default_db
from fanfold.cli.errors import CliError, user_errors
from fanfold.cli.logs import open_logs
from fanfold.cli.options import dbos_db_option as dbos_db_option
from fanfold.cli.options import model_options
from fanfold.cli.python_tools import load_tools, tools_option
from fanfold.cli.seconds import FiniteFloatRange

# What a command runs with (rich, the log, the reducer, the runtime, the providers) is
# imported in the functions that use it: `--help` imports none of it (issue 36,
# tests/test_cli_startup.py).
if TYPE_CHECKING:
    from fanfold.db import Store
    from fanfold.statemachine import Conversation

EXIT_TIMEOUT = 124
"""``fanfold wait --timeout``: the tree was not at rest in time (``timeout(1)``'s code)."""

WAIT_POLL = 0.2
"""How often ``fanfold wait`` reads the log (seconds)."""

ASKING_POLLS = 10
"""``fanfold wait`` looks for the tree's open requests every this many reads."""


POSTGRES_EXTRA = "needs the postgres extra: pip install 'fanfold[postgres]'"


def system_url(dbos_db: str | None, log: Target | None = None) -> str:
    """The DBOS system database's URL: ``--dbos-db``, else the log's own database when
    the log is in PostgreSQL (DBOS's tables in its ``dbos`` schema beside fanfold's),
    else a one-line error saying how to give it."""
    from fanfold.db import DatabaseUrl

    if not dbos_db:
        if isinstance(log, DatabaseUrl):
            return log.secret
        raise CliError(
            "give the workers' PostgreSQL database: --db postgresql://... (the log and the "
            "queue in one database), or --dbos-db URL / $FANFOLD_DBOS_DB beside a log file"
        )
    if urlsplit(dbos_db).scheme not in ("postgresql", "postgres"):
        raise CliError("--dbos-db must be a postgresql:// URL")
    return dbos_db


def scrubbed(text: str, url: str) -> str:
    """``text`` without the URL's password (an error from a driver may quote it)."""
    from fanfold.db.targets import without_password

    return without_password(text, url)


def _first_line(exc: BaseException) -> str:
    """The error's type and first line; for a group (a Trio nursery's), its first leaf's:
    "ExceptionGroup: Exceptions from Trio nursery" says nothing of what went wrong."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


@click.command(
    epilog=(
        "\b\nExamples:\n"
        "  fanfold worker --db postgresql://fanfold@db.internal/agents --config team.toml\n"
        "  fanfold worker --config team.toml --concurrency 8 --allow-cwd /srv/checkouts\n"
    ),
)
@model_options
@dbos_db_option
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Trees this worker runs at once.",
)
@click.option(
    "--lease",
    type=FiniteFloatRange(min=0.5),
    default=15.0,
    show_default=True,
    help="Seconds without a renewal after which other workers take this one's trees.",
)
@click.option(
    "--poll",
    type=FiniteFloatRange(min=0.01, max=10.0),
    default=0.2,
    show_default=True,
    help="Seconds between two looks at the queue.",
)
@click.option(
    "--spread-at",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="A step spawning more children than this places them in chunks that any "
    "worker runs (a PostgreSQL log only).",
)
@click.option(
    "--chunk-size",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Children per chunk.",
)
@click.option(
    "--chunk-concurrency",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Chunks of placed children this worker runs at once.",
)
@click.option(
    "--json-log",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write structured JSON logs here (default: next to the database).",
)
@click.option(
    "--allow-cwd",
    "allow_cwd",
    multiple=True,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="A folder (and those below it) a queued tree may run in; repeatable. "
    "Default: the worker's own folder. A tree asking for another is refused.",
)
@click.option(
    "--allow-existing-root",
    is_flag=True,
    help="Run a queued tree whose id names a tree the log holds already (resume it, "
    "taking it over). Default: refused.",
)
@tools_option
@db_option
def worker(
    script: Path | None,
    config_path: Path | None,
    profile: str | None,
    model: str | None,
    dbos_db: str | None,
    concurrency: int,
    lease: float,
    poll: float,
    spread_at: int,
    chunk_size: int,
    chunk_concurrency: int,
    json_log: Path | None,
    allow_cwd: tuple[Path, ...],
    allow_existing_root: bool,
    tool_refs: tuple[str, ...],
    db: Target | None,
) -> None:
    """Run trees from the workers' queue (fanfold run --detach) until stopped.

    Every worker on the same database (--db postgresql://..., or --dbos-db beside a
    log file) shares the queue; a worker that dies (or stops renewing its lease) has
    its trees resumed from the log by another. On a PostgreSQL log a step spawning
    more than --spread-at children puts them on the queue in chunks that any worker
    runs (a big fan-out spreads over the workers). The MCP servers declared for this
    folder and configuration (as for run; a project's once trusted) start with the
    worker and serve every tree it runs; a tree's own folder's are never started.
    Whoever can write to the queue chooses a tree's task and folder: a tree runs only
    in a folder under --allow-cwd (default: the worker's own), never takes over a
    tree the log holds already (unless --allow-existing-root), and a pickled queue
    entry is refused, never unpickled. Ctrl-C, SIGTERM or SIGHUP drains it: it
    stops taking trees, stops its running ones at a step boundary and hands them to
    the other workers at once (exit 0). Exit 3: its lease was taken over while it
    was unreachable or frozen, and it stopped.
    """
    path = db or default_db()
    url = system_url(dbos_db, path)
    open_logs(path, json_log)
    code: int
    try:
        placing = {"spread_at": spread_at, "chunk": chunk_size,
                   "chunk_concurrency": chunk_concurrency}  # fmt: skip
        folders = tuple(os.path.realpath(f) for f in allow_cwd or (Path.cwd(),))
        admission = {"allow_cwd": folders, "allow_existing_root": allow_existing_root}
        code = _serve(path, url, script, config_path, profile, model, concurrency, lease, poll,
                      tool_refs, placing, admission)  # fmt: skip
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    from fanfold.runtime.logging import flush
    from fanfold.worker.dbos_worker import flush_and_exit

    flush()
    flush_and_exit(code)


def _serve(
    path: Target,
    url: str,
    script: Path | None,
    config_path: Path | None,
    profile: str | None,
    model: str | None,
    concurrency: int,
    lease: float,
    poll: float,
    tool_refs: tuple[str, ...],
    placing: dict[str, Any],
    admission: dict[str, Any],
) -> int:
    from fanfold.cli.agents_in_effect import agents_in_effect
    from fanfold.cli.mcp_tools import (
        declarations_for,
        unserved_agent_servers,
        with_server_secrets,
        worker_tools,
    )
    from fanfold.cli.models import choose_model
    from fanfold.cli.output import hint
    from fanfold.cli.signals import run_trio
    from fanfold.runtime import Runtime

    try:
        from fanfold.worker import dbos_worker
    except ImportError:
        raise CliError(f"fanfold worker {POSTGRES_EXTRA}") from None
    from fanfold.worker.spec import TreeSpec

    with user_errors(path):
        python_tools = load_tools(tool_refs)
        home = Path.cwd()
        choice = choose_model(script, config_path, profile, model, home)
        # The worker's own MCP servers: those `fanfold run` would start here with this
        # --config, under the same trust rules; never a tree's folder's (its
        # .mcp.json, its agent files' servers), which whoever enqueued it chose.
        servers = declarations_for(home, config_path)
        choice = with_server_secrets(choice, servers)
        names = [t.spec.name for t in python_tools]
        settings = dbos_worker.WorkerSettings(
            log=path,
            system_url=url,
            executor_id=dbos_worker.new_executor_id(),
            concurrency=concurrency,
            lease=lease,
            poll=poll,
            ask=tuple(choice.ask),
            **placing,
            **admission,
        )
        executor = settings.executor_id

        def say(text: str) -> None:
            hint(f"worker {executor}: {text}", style="dim")

        def ready() -> None:
            click.echo(f"worker {executor} ready (log: {path})")

        def make_limits(spec: TreeSpec) -> Any:
            import attrs

            limits = choice.retry.apply(spec.make_limits())
            if spec.approval_timeout is None and choice.approval_timeout is not None:
                # The tree's own (run --detach --approval-timeout) first, else the worker's.
                limits = attrs.evolve(limits, approval_timeout=choice.approval_timeout)
            return limits

        def agents_for(cwd: str) -> Any:
            agents = agents_in_effect(Path(cwd), dict(choice.model_aliases), names)
            for line in unserved_agent_servers(agents, servers, cwd):
                hint(line, style="yellow")
            return agents

        @asynccontextmanager
        async def open_runtime() -> AsyncIterator[Any]:
            # A profile's max_concurrent_calls holds across every worker: its calls
            # take slots in a table of the queue's database (providers/pg_slots.py).
            from fanfold.providers.pg_slots import shared_slots

            base = choice.tools(python_tools)
            async with (
                shared_slots(choice.provider, url),
                # Started once, before the runtime opens; stopped after it closes.
                worker_tools(servers, home, choice.env_policy, base) as tools,
                Runtime.open(
                    path,
                    choice.provider,
                    tools,
                    redact=choice.redactor(),
                    provider_description=choice.recorded,
                ) as runtime,
            ):
                yield runtime

        hint(f"model: {choice.description}; log: {path}", style="dim")
        try:
            return run_trio(
                dbos_worker.serve, settings, open_runtime, make_limits, agents_for,
                choice.system_prompt, say, ready, choice.aclose,
            )  # fmt: skip
        except CliError:
            raise
        except Exception as exc:
            # DBOS or PostgreSQL refused (a wrong URL, a server down): one line, and
            # never the password the URL may hold.
            raise CliError(f"the worker stopped: {scrubbed(_first_line(exc), url)}") from None


@click.command(
    epilog=("\b\nExamples:\n  fanfold wait 3f9a0c61d2b4 --timeout 600\n"),
)
@click.argument("tree_id")
@click.option(
    "--timeout",
    type=FiniteFloatRange(min=0),
    default=None,
    help="Give up after this many seconds (exit 124).",
)
@dbos_db_option
@db_option
def wait(tree_id: str, timeout: float | None, dbos_db: str | None, db: Target | None) -> None:
    """Wait until the tree TREE_ID (fanfold run --detach printed it) is at rest,
    reading the log, and print its outcome as run does (exit 1 if it ended in
    error). A tree not in the log yet is waited for if it is on the workers' queue
    (the log's own database, or --dbos-db beside a log file); an id in neither is an
    error (exit 2)."""
    from fanfold.cli.output import hint
    from fanfold.cli.turns import print_result
    from fanfold.db import DatabaseUrl

    if not tree_id.strip():
        raise click.UsageError("TREE_ID is empty: give the id `fanfold run --detach` printed")
    path = db or default_db()
    queue = path.secret if isinstance(path, DatabaseUrl) else dbos_db
    if isinstance(path, Path) and not path.exists() and not queue:
        # No log, and no queue a worker could start the tree from (and make the log).
        raise CliError(f"no database at {path} (run `fanfold run` first, or pass --db)")

    def absent() -> None:
        if not queue:
            raise CliError(
                f"{tree_id} is not in the log {path}, and no queue is given that a worker "
                "could start it from (--dbos-db or $FANFOLD_DBOS_DB beside a log file)"
            )
        if not _queued(queue, tree_id):
            where = "" if isinstance(path, DatabaseUrl) else " (--dbos-db)"
            raise CliError(
                f"{tree_id} is neither in the log {path} nor on the workers' queue{where}"
            )
        hint(
            f"{tree_id} is not in the log {path} yet: waiting for a worker to start it",
            style="dim",
        )

    def asking(count: int) -> None:
        if count:
            where = "" if db is None else f" --db {db}"
            hint(
                f"{tree_id} waits for a person: {count} open request(s); "
                f"see them with `fanfold pending{where}`, decide with `fanfold approve`, "
                "`deny` or `answer`",
                style="yellow",
            )

    with user_errors(path):
        state = wait_at_rest(path, tree_id, timeout, absent, asking=asking)
    print_result(tree_id, state, None, db=path)


def _queued(url: str, tree_id: str) -> bool:
    """Whether DBOS's queue at ``url`` holds the tree ``tree_id`` (its workflow, in any
    state). A database no worker has set up holds none."""
    try:
        from dbos import DBOSClient

        from fanfold.worker.spec import APP_NAME
    except ImportError:
        raise CliError(f"fanfold wait on a queue {POSTGRES_EXTRA}") from None
    try:
        client = DBOSClient(system_database_url=url, application_name=APP_NAME)
    except Exception as exc:
        raise CliError(
            f"cannot read the workers' queue: {scrubbed(_first_line(exc), url)}"
        ) from None
    try:
        found = client.list_workflows(workflow_ids=[tree_id], load_input=False, load_output=False)
    except Exception as exc:
        if "does not exist" in str(exc):  # no dbos schema: nothing was ever queued
            return False
        raise CliError(
            f"cannot read the workers' queue: {scrubbed(_first_line(exc), url)}"
        ) from None
    finally:
        with contextlib.suppress(Exception):
            client.destroy()
    return bool(found)


def wait_at_rest(
    path: Target,
    tree_id: str,
    timeout: float | None,
    absent: Callable[[], None],
    *,
    asking: Callable[[int], None] | None = None,
) -> Conversation:
    """Read the log every ``WAIT_POLL`` seconds until the root ``tree_id`` is at rest;
    its state then. ``absent`` is called once if the tree is not in the log yet;
    ``asking``, if given, with the number of the tree's open requests (approvals and
    questions) each time that number changes while it runs (looked at every
    ``ASKING_POLLS`` reads)."""
    from fanfold.db import DatabaseUrl, EmptyLog, UnknownConversation, open_store

    deadline = None if timeout is None else time.monotonic() + timeout
    told = False
    store: Store | None = None
    polls, open_before = 0, 0
    try:
        while True:
            if store is None and (isinstance(path, DatabaseUrl) or os.path.exists(path)):
                # A log no run has written to yet has no tables: nothing to read yet.
                with contextlib.suppress(EmptyLog):
                    store = open_store(path, read_only=True)
            row = None
            if store is not None:
                with contextlib.suppress(UnknownConversation):
                    row = store.conversation(tree_id)
            if row is None and not told:
                absent()
                told = True
            if row is not None and row.parent_id is not None:
                raise CliError(
                    f"{tree_id} is a sub-agent; wait for its tree: fanfold wait {row.root_id}"
                )
            if store is not None and row is not None and row.status != "running":
                return store.load_state(tree_id)
            if asking is not None and row is not None and polls % ASKING_POLLS == 0:
                from fanfold.cli.approvals import open_requests

                now_open = sum(1 for r, _ in open_requests(path) if r.tree == tree_id)
                if now_open != open_before:
                    asking(now_open)
                    open_before = now_open
            polls += 1
            if deadline is not None and time.monotonic() >= deadline:
                raise click.exceptions.Exit(_timed_out(tree_id, timeout))
            time.sleep(WAIT_POLL)
    finally:
        if store is not None:
            store.close()


def _timed_out(tree_id: str, timeout: float | None) -> int:
    from fanfold.cli.output import hint

    hint(f"error: {tree_id} was not at rest after {timeout:g} s", style="red")
    return EXIT_TIMEOUT
