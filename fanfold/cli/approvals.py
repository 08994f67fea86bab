"""A human in the loop (issue 35) at the command line: ``fanfold pending``,
``approve``, ``deny`` and ``answer``, and how ``run``/``resume`` wait for a person.

A decision is a row of the log's decisions table (``fanfold.runtime.approvals``):
written here, taken by the runtime that holds the request (a running ``fanfold run``
or ``resume`` polls for it), or by the next ``fanfold resume`` when none runs.
"""

from __future__ import annotations

import json
import os
import select
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fanfold.cli.database import Target, db_option, db_path
from fanfold.cli.errors import CliError, user_errors

if TYPE_CHECKING:
    from fanfold.runtime import Runtime
    from fanfold.runtime.approvals import PendingRequest

EXIT_WAITING = 75
"""Exit status of ``fanfold run``/``resume`` that stopped because the tree can go on
only after a person's decision (sysexits' EX_TEMPFAIL: try again later, here after
``fanfold approve``/``deny``/``answer``, with ``fanfold resume``)."""


# ------------------------------------------------------------------ reading the log


def open_requests(path: Target) -> list[tuple[PendingRequest, Any]]:
    """Every open request in the log at ``path`` (an SQLite file or a PostgreSQL
    URL), with its conversation's state, oldest first."""
    from fanfold.db import open_store
    from fanfold.runtime.approvals import asked_at_in, open_request

    found = []
    with open_store(path, read_only=True) as store:
        for row in store.unfinished():
            if row.phase != "ToolExecuting":
                continue
            state = store.load_state(row.id)
            request = open_request(state, asked_at_in(store, row.id))
            if request is not None:
                found.append((request, state))
    found.sort(key=lambda pair: (pair[0].asked_at or 0.0, pair[0].id))
    return found


def _choose(
    path: Target, target: str, call: str | None, decide_all: bool = False
) -> list[tuple[PendingRequest, Any]]:
    """The request(s) ``TARGET [CALL]`` names: TARGET a request's own id, or a tree
    (or conversation) id with CALL a request id, a call number or an agent path;
    without CALL, the tree's only open request (``--all``: every one)."""
    requests = open_requests(path)
    exact = [p for p in requests if p[0].id == target]
    if exact:
        return exact
    mine = [p for p in requests if target in (p[0].tree, p[0].conversation_id)]
    if not mine:
        raise CliError(f"no open request for {target!r} (see: fanfold pending --db {path})")
    if call is not None:
        chosen = [
            p for p in mine if call in (p[0].id, str(p[0].call), p[0].path, p[0].conversation_id)
        ]
        if len(chosen) != 1:
            ids = ", ".join(p[0].id for p in mine)
            raise CliError(f"{target!r} has no single open request {call!r} (open: {ids})")
        return chosen
    if decide_all:
        return mine
    if len(mine) > 1:
        ids = ", ".join(p[0].id for p in mine[:10]) + (" ..." if len(mine) > 10 else "")
        raise CliError(
            f"tree {target!r} has {len(mine)} open requests ({ids}): name one (ID CALL, or "
            "the request's own id), or give --all"
        )
    return mine


def _decide(
    path: Target,
    target: str,
    call: str | None,
    kind: str,
    arguments: str | None,
    text: str,
    decide_all: bool = False,
) -> dict[str, str]:
    """Write the decision(s) and return what became of each: request id -> ``new``
    (to be taken by the runtime holding it, or the next ``fanfold resume``),
    ``applied``, or ``stale: ...`` (its request closed before it)."""
    from fanfold.runtime.approvals import (
        AlreadyDecided,
        BadDecision,
        Decision,
        check_decision,
        decisions_of,
    )

    chosen = _choose(path, target, call, decide_all)
    decisions = []
    for request, state in chosen:
        try:
            check_decision(state, request, kind, arguments)
        except BadDecision as exc:
            raise CliError(str(exc)) from None
        decisions.append(Decision(request.id, kind, arguments, text, _who(), time.time()))
    table = decisions_of(path)
    try:
        if len(decisions) == 1:
            try:
                table.write(decisions[0])
            except AlreadyDecided as exc:
                raise CliError(str(exc)) from None
            taken: list[str] = []
        else:
            taken = table.write_many(decisions)
        if taken:
            click.echo(f"already decided, left as they were: {', '.join(taken)}", err=True)
        written = [r for r, _ in chosen if r.id not in taken]
        return _outcomes(path, table, written)
    finally:
        table.close()


SETTLE_WAIT = 5.0
"""Seconds ``fanfold approve``/``deny``/``answer`` waits, while a runtime has the log
open, for it to take the decision (it reads the table every 0.2 s), so that what it
prints is what became of it."""


def _outcomes(path: Target, table: Any, requests: list[PendingRequest]) -> dict[str, str]:
    """What became of the decisions just written for ``requests`` (``settle``): a
    request the log shows closed (a cancel or a timeout committed between our look
    and our write) gets its row marked stale here; while a runtime has the log open
    (SQLite), we wait a moment for it to take or refuse the others."""
    from fanfold.db import is_postgres, open_store
    from fanfold.runtime.approvals import settle
    from fanfold.runtime.presence import runtime_open

    marks: dict[str, str] = {}
    deadline = time.monotonic() + SETTLE_WAIT
    todo = list(requests)
    while True:
        with open_store(path, read_only=True) as store:
            for request in todo:
                marks[request.id] = settle(store, table, request)
        todo = [r for r in todo if marks[r.id] == "new"]
        if not todo or time.monotonic() > deadline:
            return marks
        if is_postgres(path) or not runtime_open(path):
            return marks  # nobody to take it now: the next resume will
        time.sleep(0.1)


def _who() -> str:
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no user name (a container): still a CLI decision
        return "cli"


def _decided(path: Target, done: dict[str, str], what: str, go_on: bool = False) -> None:
    """Tell the person what became of each decision; a decision whose request was
    closed before it (cancelled, timed out, its tree ended) is said so and the
    command exits with status 2."""
    from fanfold.cli.output import hint
    from fanfold.runtime.approvals import closed_message

    refused = {r: closed_message(m) for r, m in done.items()}
    taken = [r for r, message in refused.items() if message is None]
    waiting = [r for r in taken if done[r] == "new"]
    for request in taken:
        click.echo(f"{what} {request}")
    problems = [f"{r}: {message}" for r, message in refused.items() if message is not None]
    if problems and not taken:
        raise CliError("; ".join(problems))
    for problem in problems:
        CliError(problem).show()
    if go_on and taken:
        _continue(path, taken)
    elif waiting:
        hint(
            "no fanfold has taken it yet; if none runs, go on with: "
            f"fanfold resume --db {path} (or decide with --continue)",
            style="dim",
        )
    if problems:
        raise SystemExit(CliError.exit_code)


def _continue(path: Target, done: list[str]) -> None:
    """``--continue``: resume the decided requests' trees here (as ``fanfold resume``
    does for them alone); exits with its status."""
    from fanfold.cli.logs import open_logs
    from fanfold.cli.resume_command import _resume_main
    from fanfold.cli.signals import run_trio
    from fanfold.db import open_store

    trees = []
    with open_store(path, read_only=True) as store:
        for request in done:
            conversation = request.rpartition(":")[0]
            trees.append(store.conversation(conversation).root_id)
    open_logs(path, None)
    code = 0
    with user_errors(path):
        for tree in dict.fromkeys(trees):
            code = run_trio(_resume_main, path, None, None, tree, ()) or code
    if code:
        raise SystemExit(code)


_CONTINUE = click.option(
    "--continue",
    "go_on",
    is_flag=True,
    help="Then go on with the tree here, as `fanfold resume` (when no fanfold runs it).",
)


# ------------------------------------------------------------------ commands


def _sqlite(db: Target | None) -> Target:
    """The log the user chose: an SQLite file or a PostgreSQL URL (whose decisions
    table, ``PgDecisions``, every runtime on that database reads)."""
    return db_path(db)


@click.command(
    epilog=(
        "\b\nExamples:\n"
        "  fanfold pending                       # every open request of the log\n"
        "  fanfold pending --json --db team.db   # one JSON object per request\n"
    ),
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per request.")
@db_option
def pending(as_json: bool, db: Target | None) -> None:
    """List every open request for a person's decision: tree, agent, tool, arguments,
    the rule that asks, and how long it has waited."""
    path = _sqlite(db)
    with user_errors(path):
        requests = open_requests(path)
    now = time.time()
    if as_json:
        for request, _ in requests:
            click.echo(
                json.dumps(
                    {
                        "id": request.id,
                        "tree": request.tree,
                        "agent": request.path,
                        "tool": request.tool,
                        "arguments": json.loads(request.arguments_json),
                        "rule": request.rule,
                        "question": request.question,
                        "choices": list(request.choices),
                        "asked_at": request.asked_at,
                    },
                    sort_keys=True,
                )
            )
        return
    if not requests:
        click.echo("no open requests")
        return
    from fanfold.cli.text import printable

    for request, _ in requests:
        age = "" if request.asked_at is None else f"  {_age(now - request.asked_at)}"
        click.echo(f"{request.id}  tree {request.tree}  {request.path}{age}")
        if request.question is not None:
            click.echo(f"  asks: {printable(request.question)}")
            if request.choices:
                click.echo(f"  choices: {printable(' | '.join(request.choices))}")
        else:
            click.echo(f"  {request.tool} {printable(request.arguments_json)[:300]}")
            click.echo(f"  because of {printable(request.rule)}")


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


@click.command(
    epilog=(
        "\b\nExamples:\n"
        "  fanfold approve 3f2a9c1b7d20                # the tree's only open request\n"
        '  fanfold approve 3f2a9c1b7d20:5 --args \'{"command": "git push origin fix"}\'\n'
    ),
)
@click.argument("target", metavar="ID")
@click.argument("call", required=False)
@click.option(
    "--args", "arguments", default=None, metavar="JSON", help="Run it with these arguments instead."
)
@click.option("--all", "decide_all", is_flag=True, help="Every open request of the tree.")
@_CONTINUE
@db_option
def approve(
    target: str,
    call: str | None,
    arguments: str | None,
    decide_all: bool,
    go_on: bool,
    db: Target | None,
) -> None:
    """Approve an open request: its call runs (with --args instead of the model's
    arguments, checked against the tool's schema and the rules again).

    ID is the request's own id (see `fanfold pending`) or a tree id; CALL names one
    of the tree's requests (its id, call number or agent path); without it, the
    tree's only open request."""
    if arguments is not None:
        try:
            value = json.loads(arguments)
        except ValueError as exc:
            raise CliError(f"--args is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise CliError("--args must be a JSON object")
        from fanfold.statemachine import canonical_json

        arguments = canonical_json(value)
    path = _sqlite(db)
    with user_errors(path):
        done = _decide(path, target, call, "grant", arguments, "", decide_all)
    _decided(path, done, "approved", go_on)


@click.command(
    epilog=(
        "\b\nExamples:\n"
        '  fanfold deny 3f2a9c1b7d20 --reason "not on a Friday"   # the model reads the reason\n'
    ),
)
@click.argument("target", metavar="ID")
@click.argument("call", required=False)
@click.option("--reason", required=True, help="Why: the model reads it.")
@click.option("--all", "decide_all", is_flag=True, help="Every open request of the tree.")
@_CONTINUE
@db_option
def deny(
    target: str, call: str | None, reason: str, decide_all: bool, go_on: bool, db: Target | None
) -> None:
    """Deny an open request: its call never runs; its result is "denied by the
    user: REASON". ID and CALL as for `fanfold approve`."""
    path = _sqlite(db)
    with user_errors(path):
        done = _decide(path, target, call, "deny", None, reason, decide_all)
    _decided(path, done, "denied", go_on)


@click.command(
    epilog=(
        "\b\nExamples:\n"
        '  fanfold answer 3f2a9c1b7d20 "use the staging database"\n'
        "  fanfold answer 3f2a9c1b7d20 --continue yes   # answer and carry on\n"
    ),
)
@click.argument("target", metavar="ID")
@click.argument("parts", nargs=-1, required=True, metavar="[CALL] TEXT")
@_CONTINUE
@db_option
def answer(target: str, parts: tuple[str, ...], go_on: bool, db: Target | None) -> None:
    """Answer an agent's question (its ask_user call): TEXT is the call's result.
    ID and CALL as for `fanfold approve`."""
    if len(parts) > 2:
        raise CliError("give ID [CALL] TEXT (quote the text)")
    call, text = (None, parts[0]) if len(parts) == 1 else parts
    path = _sqlite(db)
    with user_errors(path):
        done = _decide(path, target, call, "answer", None, text)
    _decided(path, done, "answered", go_on)


# ------------------------------------------------------------------ run and resume


def say_waiting(runtime: Runtime, path: Path | str) -> None:
    """What a run or resume that stops for a person prints: the open requests, and
    how to decide them and go on."""
    from fanfold.cli.output import console, hint
    from fanfold.cli.text import printable

    for request in runtime.pending():
        what = (
            f"asks: {printable(request.question)}"
            if request.question is not None
            else f"{request.tool} {printable(request.arguments_json)[:200]} "
            f"({printable(request.rule)})"
        )
        console.print(
            f"[yellow]waiting for a decision[/yellow] {request.id} {request.path}: {what}",
            highlight=False,
            markup=True,
        )
    hint(
        f"decide with: fanfold approve ID / fanfold deny ID --reason TEXT / fanfold answer "
        f"ID TEXT (--db {path}); then go on with: fanfold resume --db {path}",
        to=console,
    )


async def wait_or_blocked(runtime: Runtime, roots: list[str], poll: float = 0.25) -> list[str]:
    """Wait until every tree of ``roots`` is at rest (returns []), or until those
    still busy can go on only after a person's decision and none is written yet
    (returns them)."""
    import trio

    done: set[str] = set()

    async def one(root: str) -> None:
        await runtime.wait(root)
        done.add(root)

    async with trio.open_nursery() as nursery:
        for root in roots:
            nursery.start_soon(one, root)
        calm = 0
        while len(done) < len(roots):
            await trio.sleep(poll)
            busy = [r for r in roots if r not in done]
            blocked = busy and all(runtime.waiting_for_people(r) for r in busy)
            if blocked:
                ids = [r.id for r in runtime.pending()]
                written = await trio.to_thread.run_sync(runtime.decisions.new, ids)
                blocked = not written
            calm = calm + 1 if blocked else 0
            if calm >= 2:  # twice in a row: nothing moved in between
                nursery.cancel_scope.cancel()
                return busy
        nursery.cancel_scope.cancel()
    return []


async def prompt_decisions(runtime: Runtime, stop_view: Any, start_view: Any) -> None:
    """In a terminal: show each new request and ask y / n / edit (a question: its
    answer), until cancelled. A request decided elsewhere meanwhile (``fanfold
    approve`` in another shell) ends its prompt."""
    import trio

    from fanfold.cli.output import console
    from fanfold.runtime.approvals import DecisionError

    async for request in runtime.requests():
        if request.id not in {r.id for r in runtime.pending()}:
            continue
        stop_view()
        try:
            await _prompt_one(runtime, request, console, trio, DecisionError)
        finally:
            start_view()


def escape(text: str) -> str:
    """``text`` safe inside rich markup."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


async def _prompt_one(
    runtime: Runtime, request: PendingRequest, console: Any, trio: Any, errors: Any
) -> None:
    from fanfold.cli.text import printable

    def still_open() -> bool:
        return any(r.id == request.id for r in runtime.pending())

    console.print(
        f"[yellow]{request.path} waits for your decision[/yellow] ({request.id})", highlight=False
    )
    if request.question is not None:
        console.print(f"  asks: {printable(request.question)}", markup=False, highlight=False)
        for i, choice in enumerate(request.choices, 1):
            console.print(f"  {i}. {printable(choice)}", markup=False, highlight=False)
    else:
        console.print(
            f"  {request.tool} {printable(request.arguments_json)}", markup=False, highlight=False
        )
        console.print(f"  because of {printable(request.rule)}", markup=False, highlight=False)
    while still_open():
        if request.question is not None:
            line = await _ask_line(runtime, still_open, "answer (empty: decline): ")
            if line is None:
                break
            text = line.strip()
            if text.isdigit() and 1 <= int(text) <= len(request.choices):
                text = request.choices[int(text) - 1]
            try:
                if text:
                    await runtime.answer(request, text, by="terminal")
                else:
                    await runtime.deny(request, "the user declined to answer", by="terminal")
            except errors as exc:
                console.print(f"[red]{escape(printable(str(exc)))}[/red]", highlight=False)
            return
        line = await _ask_line(runtime, still_open, "approve? [y]es / [n]o / [e]dit: ")
        if line is None:
            break
        choice = line.strip().lower()
        try:
            if choice in ("y", "yes"):
                await runtime.approve(request, by="terminal")
                return
            if choice in ("n", "no"):
                reason = await _ask_line(runtime, still_open, "reason: ")
                if reason is None:
                    break
                await runtime.deny(request, reason.strip() or "no", by="terminal")
                return
            if choice in ("e", "edit"):
                edited = await _ask_line(runtime, still_open, "arguments (JSON): ")
                if edited is None:
                    break
                try:
                    value = json.loads(edited)
                except ValueError as exc:
                    console.print(f"[red]not JSON: {escape(str(exc))}[/red]", highlight=False)
                    continue
                if not isinstance(value, dict):
                    console.print("[red]arguments must be a JSON object[/red]", highlight=False)
                    continue
                await runtime.approve(request, value, by="terminal")
                return
        except errors as exc:
            console.print(f"[red]{escape(printable(str(exc)))}[/red]", highlight=False)
            if not still_open():
                return
    console.print(f"[dim]{request.id} was decided elsewhere[/dim]", highlight=False)


async def _ask_line(runtime: Runtime, still_open: Any, prompt: str) -> str | None:
    """A line typed by the user, or None once the request is no longer open (decided
    by another process, cancelled) or the input ended."""
    import trio

    from fanfold.cli.output import console

    console.print(prompt, end="", markup=False, highlight=False)
    closed = threading.Event()

    async def watch() -> None:
        while still_open():
            await trio.sleep(0.2)
        closed.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            # Abandoned on a cancel (the turn ended meanwhile): ``closed`` then ends
            # the thread's wait within a select's timeout, before it reads anything.
            line = await trio.to_thread.run_sync(_read_line, closed, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()
    finally:
        closed.set()
    if line is None:
        console.print("")
    return line


def _read_line(closed: threading.Event) -> str | None:
    """A line of standard input, waiting in short selects so that ``closed`` ends the
    wait (a thread blocked in a read could not be stopped)."""
    fd = sys.stdin.fileno()
    chunks = b""
    while not closed.is_set():
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            continue
        data = os.read(fd, 4096)
        if not data:
            return None
        chunks += data
        if b"\n" in chunks:
            return chunks.split(b"\n", 1)[0].decode("utf-8", "replace")
    return None


__all__ = ["EXIT_WAITING", "answer", "approve", "deny", "pending"]
