"""``fanfold replay``, ``fork``, ``export`` and ``import``: debugging from the log alone.

Every command here reads or writes the SQLite log through ``fanfold.replay``; none of
them calls a model or runs a tool. Errors are one line on stderr (exit code 2), never
a traceback.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import click

from fanfold.cli.database import (
    Target,
    db_option,
    db_path,
    open_store,
    refuse_writing_over_the_log,
    write_output,
)
from fanfold.cli.errors import CliError, sqlite_message, user_errors
from fanfold.cli.options import model_options
from fanfold.cli.otel_export import content_option, endpoint_option, export_otlp, format_option
from fanfold.cli.python_tools import load_tools, tools_option

# What a command runs with (rich, the log, the reducer, the runtime, the providers) is
# imported in the functions that use it: `--help` imports none of it (issue 36,
# tests/test_cli_startup.py).
if TYPE_CHECKING:
    from fanfold import replay
    from fanfold.db import Store
    from fanfold.replay.report import Divergence, ReplayStep, VerifyReport
    from fanfold.statemachine import Edit, Limits, ModelReply

# CliError prints one plain line at any width; the name stays for this module's use.
OneLineError = CliError


@contextmanager
def _errors(db: Target | None = None) -> Iterator[None]:
    """Turn every failure into a one-line error (exit code 2). ``db``: the log read,
    named in SQLite's errors (and read again to tell a failed read from damage)."""
    import sqlite3

    from fanfold import replay
    from fanfold.db import DatabaseError

    try:
        yield
    except OneLineError:
        raise
    except click.ClickException as exc:
        raise OneLineError(_one_line(exc.message)) from None
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        raise OneLineError(_one_line(f"{exc.strerror or exc}{where}")) from None
    except sqlite3.Error as exc:
        # SQLite quotes the whole unreadable value ("Could not decode to UTF-8 column
        # 'payload' with text '...'"): a damaged row, named in a line of bounded length.
        raise OneLineError(_one_line(sqlite_message(exc, _named(db)), limit=300)) from None
    except (
        replay.ReplayFailure,
        DatabaseError,
        ValueError,
        LookupError,
    ) as exc:
        raise OneLineError(_one_line(str(exc))) from None
    except Exception as exc:
        raise OneLineError(
            f"unexpected {type(exc).__name__}: {_one_line(str(exc))} (a bug in fanfold: "
            "please report it)"
        ) from None


def _named(db: Target | None) -> Path | None:
    """The SQLite file ``--db`` chose, if it is one (for error messages)."""
    try:
        path = db_path(db)
    except Exception:
        return None
    return path if isinstance(path, Path) else None


def _one_line(text: str, limit: int | None = None) -> str:
    line = " ".join(text.split())
    return line if limit is None or len(line) <= limit else line[: limit - 3] + "..."


def _line(text: str, style: str = "") -> None:
    """Print one line of log-derived text: printable, long ones cut, never markup."""
    from rich.text import Text

    from fanfold.cli.display import clip
    from fanfold.cli.output import console

    shown = clip(text, hint="`fanfold export` writes all of it")
    console.print(Text(shown, style=style), soft_wrap=True, highlight=False)


def _print_diff(divergence: Divergence) -> None:
    headline = divergence.headline()
    for line in divergence.diff().splitlines():
        style = ""
        if line.startswith(("+++", "---")):
            style = "bold"
        elif line.startswith("+"):
            style = "green"
        elif line.startswith("-"):
            style = "red"
        elif line.startswith("@@"):
            style = "cyan"
        elif line == headline:
            style = "bold red"
        _line(line, style)


# ------------------------------------------------------------------ replay


@click.command(
    name="replay",
    epilog=(
        "\b\nExamples:\n"
        "  fanfold replay 3f9a0c61d2b4 --verify --tree   # exit 0: identical, 1: diverged\n"
        "  fanfold replay 3f9a0c61d2b4 --agent root/1 --step --until 5\n"
    ),
)
@click.argument("conversation_id")
@click.option("--verify", "check", is_flag=True, help="Check the log replays identically.")
@click.option("--step", "walk", is_flag=True, help="Show the history one transition at a time.")
@click.option("--at", type=click.IntRange(min=0), help="Show only step SEQ, with the full state.")
@click.option("--until", type=click.IntRange(min=0), help="Show the steps up to SEQ.")
@click.option("--tree", is_flag=True, help="Include every sub-agent, interleaved by time.")
@click.option("--full", is_flag=True, help="With --at: long texts of the state in full.")
@click.option(
    "--agent",
    "path",
    default=None,
    help="The conversation of the tree to replay: root, root/1, 1/2 or an id "
    "(default: CONVERSATION_ID).",
)
@db_option
def replay_command(
    conversation_id: str,
    check: bool,
    walk: bool,
    at: int | None,
    until: int | None,
    tree: bool,
    full: bool,
    path: str | None,
    db: Target | None,
) -> None:
    """Replay a conversation's recorded log through today's reducer; nothing is executed.

    --verify exits 0 if every recorded effect and state is reproduced, 1 on a
    divergence (with a diff), 2 if the log itself is damaged. --step shows each
    transition: event, phase before -> after, effects and state. --agent picks a
    conversation of CONVERSATION_ID's tree by its place (as transcript and fork do).
    """
    from fanfold import replay
    from fanfold.replay.transcript import agent_id

    if check and walk:
        raise OneLineError("give one of --verify and --step")
    if at is not None and until is not None:
        raise OneLineError("give one of --at and --until")
    if check and (at is not None or until is not None):
        raise OneLineError("--at and --until go with --step, not --verify")
    if not check and not walk:
        if at is None and until is None:
            raise OneLineError("give --verify or --step (see fanfold replay --help)")
        walk = True
    if check:
        with _errors(db), open_store(db, read_only=True) as store:
            started = time.perf_counter()
            conversation_id = agent_id(store, conversation_id, path)
            report = replay.verify(store, conversation_id, tree=tree)
            elapsed = time.perf_counter() - started
        # Nothing is left to do after the report: the script's entry point ends the
        # process without freeing the tree's states one by one (``quick_exit``); the
        # report (every conversation's final state) is held until then.
        from fanfold.cli import quick_exit

        quick_exit.request(report)
        raise SystemExit(_show_report(report, elapsed))
    with _errors(db), open_store(db, read_only=True) as store:
        conversation_id = agent_id(store, conversation_id, path)
        _show_steps(store, conversation_id, at=at, until=until, tree=tree, full=full)


def _show_report(report: VerifyReport, elapsed: float) -> int:
    from rich.text import Text

    from fanfold.cli.display import clip
    from fanfold.cli.output import console, err_console

    rate = report.events / elapsed if elapsed > 0 else float("inf")
    timing = f"in {elapsed:.3f}s ({rate:,.0f} events/s)"
    if report.ok:
        console.print(
            Text.assemble(("✓ ", "green"), f"{report.summary()} {timing}"),
            highlight=False,
            soft_wrap=True,
        )
        return 0
    first = report.first_divergence
    if first is not None:
        _print_diff(first)
        for other in report.divergences:
            if other is not first:
                _line(f"also: {other.headline()}", "red")
    for finding in report.findings:
        err_console.print(
            Text.assemble(("error: ", "red"), clip(str(finding))), soft_wrap=True, highlight=False
        )
    verdict = "the log is damaged" if report.corrupt else "the log and the reducer diverge"
    console.print(Text.assemble(("✗ ", "red"), f"{verdict}: {report.summary()}"), soft_wrap=True)
    return 2 if report.corrupt else 1


def _show_steps(
    store: Store,
    conversation_id: str,
    *,
    at: int | None,
    until: int | None,
    tree: bool,
    full: bool = False,
) -> None:
    from rich.highlighter import JSONHighlighter
    from rich.text import Text

    from fanfold import replay
    from fanfold.cli.display import SHOWN_CHARS, json_printable, printable, write_text
    from fanfold.cli.output import console
    from fanfold.replay import render
    from fanfold.replay.report import Divergence

    first_at = store.conversation(conversation_id).created_at
    diverged = False
    shown: ReplayStep | None = None
    # What each call and timer number stands for, learnt from the steps before: with
    # --at those are replayed too (not shown), so the step's AbortCall names its timer.
    numbers = render.Numbers()
    stepped = replay.steps(store, conversation_id, until=until if at is None else at, tree=tree)
    for step in stepped:
        if at is not None and (step.conversation_id != conversation_id or step.seq != at):
            numbers.learn(step.conversation_id, step.effects)
            continue
        label = f"{step.conversation_id} " if tree and at is None else ""
        before = type(step.before_state.phase).__name__ if step.before_state else "(new)"
        after = type(step.after_state.phase).__name__
        # Every line is log text (ids, tool names, model text): printable, never markup.
        console.print(
            Text.assemble(
                (printable(f"{label}seq {step.seq}"), "bold"),
                f"  t+{step.at - first_at:.3f}s  ",
                (printable(numbers.describe(step.conversation_id, step.event)), "cyan"),
            ),
            soft_wrap=True,
            highlight=False,
        )
        _line(f"    {before} → {after}")
        numbers.learn(step.conversation_id, step.effects)
        effects = [numbers.describe(step.conversation_id, e, width=30) for e in step.effects] or [
            "(none)"
        ]
        lines = [f"    effects: {effects[0]}"] if len(effects) == 1 else ["    effects:"]
        lines += [f"      - {e}" for e in effects] if len(effects) > 1 else []
        for line in lines:
            _line(line)
        _line(f"    state: {render.summary(step.after_state)}")
        if not step.matches:
            console.print(Text("    ✗ the reducer does not reproduce this step", style="red"))
            if not diverged:
                _print_diff(Divergence.of(step))
            diverged = True
        shown = step
    if at is not None and shown is not None:
        console.rule(f"state after seq {shown.seq}")
        # Model text inside JSON strings: controls and lone surrogates as \\u escapes
        # (still valid JSON); long strings cut unless --full.
        text = json_printable(render.pretty(shown.after_state, limit=None if full else SHOWN_CHARS))
        if full:
            write_text(console, text)  # no layout, no highlighting: linear in its size
        else:
            console.print(JSONHighlighter()(Text(text)), soft_wrap=True)


# ------------------------------------------------------------------ fork


@click.command(
    name="fork",
    epilog=(
        "\b\nExamples:\n"
        "  fanfold fork 3f9a0c61d2b4 --at 7                 # a root at rest: then fanfold send\n"
        "  fanfold fork 3f9a0c61d2b4 --agent 1 --at 0 --reply better.json --continue\n"
        "  fanfold fork 3f9a0c61d2b4 --at 4 --approve --continue   # run what was denied\n"
    ),
)
@click.argument("conversation_id")
@click.option(
    "--at", "at_seq", type=click.IntRange(min=0), required=True, help="Fork after event SEQ."
)
@click.option(
    "--agent",
    "path",
    default=None,
    help="The conversation of the tree whose step SEQ is meant: root, root/1, 1/2 or an "
    "id (default: CONVERSATION_ID).",
)
@click.option("--id", "new_id", default=None, help="Id of the fork (default: a fresh one).")
@click.option(
    "--reply",
    "reply_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help='Edit: the awaited model reply is FILE\'s text (a .json file: {"text": ..., '
    '"tool_calls": [{"name": ..., "arguments": {...}}]}).',
)
@click.option(
    "--tool-result",
    "tool_result",
    metavar="CALL=FILE",
    help="Edit: the running tool call CALL (its id) returns FILE's text.",
)
@click.option("--task", "task", help="Edit: a sub-agent before its first reply works on TEXT.")
@click.option(
    "--system-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Edit: the system prompt is FILE's text from the next model call on.",
)
@click.option(
    "--limit",
    "limit_texts",
    multiple=True,
    metavar="KEY=VALUE",
    help="Edit: the picked conversation's limit KEY (max_rounds, max_attempts, "
    "child_timeout, max_tokens...) is VALUE from now on ('none': no limit); repeatable, "
    "one edit with --limits.",
)
@click.option(
    "--limits",
    "limits_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Edit: the limits in FILE (a TOML table, or a .json object, of KEY = VALUE) "
    "from now on; --limit settings override it.",
)
@click.option(
    "--approve",
    "approve",
    is_flag=True,
    help="Edit: the request the picked conversation waits on at SEQ (--at the step that "
    "asked) is approved in the fork (what the source denied runs), with --args if given.",
)
@click.option(
    "--args",
    "approve_args",
    metavar="JSON",
    default=None,
    help="With --approve: run the call with these arguments (a JSON object) instead.",
)
@click.option(
    "--deny",
    "deny_reason",
    metavar="REASON",
    default=None,
    help="Edit: that request is denied in the fork (what the source approved never runs); "
    "the model reads REASON.",
)
@click.option(
    "--answer",
    "answer_text",
    metavar="TEXT",
    default=None,
    help="Edit: that request (an ask_user question) is answered TEXT in the fork.",
)
@click.option(
    "--continue",
    "go_on",
    is_flag=True,
    help="Go on with the forked tree at once (live, like resume), with the edit if any.",
)
@click.option(
    "--rerun-siblings",
    is_flag=True,
    help="The conversations other than the picked one and its ancestors go on live from "
    "the moment too (default: they take their recorded results from the source, up to "
    "where the edit can reach them).",
)
@model_options
@tools_option
@db_option
def fork_command(
    conversation_id: str,
    at_seq: int,
    path: str | None,
    new_id: str | None,
    reply_file: Path | None,
    tool_result: str | None,
    task: str | None,
    system_file: Path | None,
    limit_texts: tuple[str, ...],
    limits_file: Path | None,
    approve: bool,
    approve_args: str | None,
    deny_reason: str | None,
    answer_text: str | None,
    go_on: bool,
    rerun_siblings: bool,
    script: Path | None,
    config_path: Path | None,
    profile: str | None,
    model: str | None,
    tool_refs: tuple[str, ...],
    db: Target | None,
) -> None:
    """Fork CONVERSATION_ID's tree after step --at SEQ of one of its conversations.

    A root at rest there is forked alone: continue it with `fanfold send NEW_ID
    "message"`. Any other step (a sub-agent's, or one with work in flight) forks the
    whole tree as it was at that moment: --continue goes on with it at once (with
    --script/--config/--profile/--model, else the source's provider; for a tree from
    elsewhere, an imported one, your configuration), or later `fanfold resume`. Only
    the picked conversation and its ancestors go on live; the others take their
    recorded results from the source until the edit can reach them (--rerun-siblings:
    they go on live too). In a tree from elsewhere no tool call its log decided runs
    (a fork that would start one the source has no result for is refused). At most
    one edit (--reply, --tool-result, --task,
    --system-file, --limit/--limits, --approve/--deny/--answer) changes the picked
    conversation as it goes on. --approve/--deny/--answer decide the request it waits
    on at SEQ otherwise than the source did: fork --at the step that asked.
    Prints the new root's id. The source is untouched.
    """
    from fanfold import replay
    from fanfold.cli.display import printable
    from fanfold.cli.output import hint
    from fanfold.db.provenance import UserKey, refusal
    from fanfold.replay.transcript import agent_id
    from fanfold.statemachine import LimitsEdit

    settings = _limit_settings(limit_texts, limits_file)
    decision = _decision_kind(approve, approve_args, deny_reason, answer_text)
    if decision is not None and settings is not None:
        raise OneLineError("give at most one edit: --limit/--limits or --approve/--deny/--answer")
    edit = _edit(
        reply_file,
        tool_result,
        task,
        system_file,
        limits=settings is not None or decision is not None,
    )
    override = None
    if (script or config_path or profile or model) and not go_on:
        raise OneLineError("--script, --config, --profile and --model go with --continue")
    with _errors(), open_store(db) as store:
        key = UserKey.load()
        target = agent_id(store, conversation_id, path)
        source_root = store.conversation(target).root_id
        foreign = refusal(store.tree_record(source_root), key, store.instance_id, source_root)
        if settings is not None:
            # The limits it had at that step, with the settings in place.
            base = replay.state_at(store, target, at_seq).limits
            edit = LimitsEdit(_limits_with(base, settings))
        if decision is not None:
            edit = _decision_edit(replay.state_at(store, target, at_seq), *decision)
        # One implementation with Runtime.fork: the edit checked by the reducer, the
        # fork, and a root at rest's edit recorded at once.
        made = replay.fork_at(
            store,
            conversation_id,
            at_seq,
            agent=path,
            edit=edit,
            new_id=new_id,
            going_on=go_on,
            key=key,
            rerun_siblings=rerun_siblings,
        )
        forked, whole_tree = made.fork_id, made.goes_on
        cwd = store.load_state(forked).cwd
        path_text = store.path  # a URL without its password
    click.echo(forked)
    if foreign is not None:
        # The fork is this user's tree now, but its working directory, system prompt
        # and history are what the source's log says: someone else's words.
        hint(
            f"note: {conversation_id} was not written by this runtime; the fork keeps its "
            f"working directory ({printable(cwd)}), system prompt and history: check them "
            f"(fanfold replay {forked} --at 0 --db {path_text}) before sending to it",
        )
    if whole_tree and go_on:
        from fanfold.cli.logs import open_logs
        from fanfold.cli.models import choose_model
        from fanfold.cli.resume_command import _resume_main
        from fanfold.cli.signals import run_trio

        log_path = db_path(db)  # (a URL's secret too: ``store.path`` has no password)
        open_logs(log_path, None)
        with user_errors(log_path):
            # A fork of a tree from elsewhere records no provider: it goes on with
            # this user's (the one named, else this user's configuration).
            if script or config_path or profile or model or foreign is not None:
                override = choose_model(script, config_path, profile, model)
            python_tools = tuple(load_tools(tool_refs))
            code = run_trio(_resume_main, log_path, override, config_path, forked, python_tools)
        if code:
            raise SystemExit(code)
        return
    if go_on and not whole_tree:
        hint(f"{forked} is at rest: nothing to go on with; send it a message")
    if whole_tree:
        provider = (
            "with your provider: --script/--config/--profile"
            if foreign is not None
            else "with the source's provider, or --script/--profile"
        )
        hint(
            f"forked the tree of {printable(target)} at its seq {at_seq} as {forked}; "
            f"continue it ({provider}) with:\n"
            f"  fanfold resume --db {path_text}",
        )
        return
    hint(
        f"forked {printable(target)} at seq {at_seq} as {forked}; continue it with:\n"
        f"  fanfold send {forked} 'your message' --db {path_text}",
    )


def _decision_kind(
    approve: bool, arguments: str | None, reason: str | None, answer: str | None
) -> tuple[str, str | None, str] | None:
    """``(kind, edited arguments, text)`` of --approve [--args] / --deny / --answer, or
    None; a bad combination or --args that is no JSON object is one line now."""
    given = [approve, reason is not None, answer is not None]
    if sum(given) > 1:
        raise OneLineError("give one of --approve, --deny and --answer")
    if arguments is not None and not approve:
        raise OneLineError("--args goes with --approve")
    if approve:
        if arguments is not None:
            try:
                value = json.loads(arguments)
            except ValueError as exc:
                raise OneLineError(f"--args is not JSON: {exc}") from None
            if not isinstance(value, dict):
                raise OneLineError("--args must be a JSON object")
            from fanfold.statemachine import canonical_json

            arguments = canonical_json(value)
        return ("grant", arguments, "")
    if reason is not None:
        return ("deny", None, reason)
    if answer is not None:
        return ("answer", None, answer)
    return None


def _decision_edit(state: Any, kind: str, arguments: str | None, text: str) -> Edit:
    """The ``DecisionEdit`` of the request ``state`` holds open (its call number; the
    reducer refuses it, EditRefused, where none is open)."""
    from fanfold.statemachine import (
        ApprovalDenied,
        ApprovalGranted,
        DecisionEdit,
        ToolExecuting,
        UserAnswered,
    )

    phase = state.phase
    call = phase.call if isinstance(phase, ToolExecuting) else state.next_call
    by = "fork"
    if kind == "grant":
        return DecisionEdit(ApprovalGranted(call, arguments, by))
    if kind == "deny":
        return DecisionEdit(ApprovalDenied(call, text, by))
    return DecisionEdit(UserAnswered(call, text, by))


def _limit_settings(texts: tuple[str, ...], file: Path | None) -> dict[str, Any] | None:
    """The limit settings of ``--limits FILE`` then ``--limit KEY=VALUE`` (None: none
    given), each value checked now (a bad one is one line before anything is read)."""
    from fanfold.providers.config import ConfigError
    from fanfold.providers.limits_config import limit_setting, read_limits_file
    from fanfold.statemachine import Limits

    if not texts and file is None:
        return None
    try:
        settings = dict(read_limits_file(file)) if file is not None else {}
        settings.update(limit_setting(text) for text in texts)
    except ConfigError as exc:
        raise OneLineError(_one_line(str(exc))) from None
    _limits_with(Limits(), settings)
    return settings


def _limits_with(base: Limits, settings: dict[str, Any]) -> Limits:
    from fanfold.providers.config import ConfigError
    from fanfold.providers.limits_config import limits_with

    try:
        return limits_with(base, settings, source="--limit/--limits")
    except ConfigError as exc:
        raise OneLineError(_one_line(str(exc))) from None


def _edit(
    reply_file: Path | None,
    tool_result: str | None,
    task: str | None,
    system_file: Path | None,
    *,
    limits: bool = False,
) -> Edit | None:
    """The one edit the options ask for (files read now: a bad one is a one-line error
    before anything is written), or None. ``limits``: a limits edit is asked for too
    (made once the conversation's limits at that step are read)."""
    from fanfold.statemachine import (
        ReplyEdit,
        SystemPromptEdit,
        TaskEdit,
        ToolResult,
        ToolResultEdit,
    )

    given = [x for x in (reply_file, tool_result, task, system_file) if x is not None]
    if len(given) + limits > 1:
        raise OneLineError(
            "give at most one edit: --reply, --tool-result, --task, --system-file or "
            "--limit/--limits"
        )
    with _errors():
        if reply_file is not None:
            return ReplyEdit(_reply(reply_file))
        if tool_result is not None:
            call, sep, file = tool_result.partition("=")
            if not sep or not call or not file:
                raise OneLineError("--tool-result takes CALL=FILE (the tool call's id, a file)")
            content = Path(file).read_text(encoding="utf-8")
            return ToolResultEdit(ToolResult(call, "", content))
        if task is not None:
            return TaskEdit(task)
        if system_file is not None:
            return SystemPromptEdit(system_file.read_text(encoding="utf-8"))
    return None


def _reply(file: Path) -> ModelReply:
    """A reply from a file: its text, or for a ``.json`` file an object with ``text``
    and ``tool_calls`` (each a ``name`` and ``arguments``; ``id`` optional)."""
    from fanfold.statemachine import ModelReply, ToolCall

    text = file.read_text(encoding="utf-8")
    if file.suffix.lower() != ".json":
        return ModelReply(text=text)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise OneLineError(f"{file}: not JSON: {exc}") from None
    if not isinstance(data, dict) or not set(data) <= {"text", "tool_calls"}:
        raise OneLineError(f'{file}: a reply is an object with "text" and "tool_calls"')
    reply_text = data.get("text", "")
    calls = data.get("tool_calls", [])
    if not isinstance(reply_text, str) or not isinstance(calls, list):
        raise OneLineError(f'{file}: "text" is a string and "tool_calls" a list')
    made = []
    for n, call in enumerate(calls):
        if not (
            isinstance(call, dict)
            and isinstance(call.get("name"), str)
            and isinstance(call.get("arguments", {}), dict)
            and isinstance(call.get("id", ""), str)
            and set(call) <= {"id", "name", "arguments"}
        ):
            raise OneLineError(
                f'{file}: tool call {n}: an object with "name", "arguments" (an object) '
                'and optionally "id"'
            )
        made.append(
            ToolCall.of(call.get("id") or f"edit_{n}", call["name"], call.get("arguments", {}))
        )
    stop = "tool_use" if made else "end_turn"
    return ModelReply(text=reply_text, tool_calls=tuple(made), stop_reason=stop)


# ------------------------------------------------------------------ export / import


@click.command(
    name="export",
    epilog=(
        "\b\nExamples:\n"
        "  fanfold export 3f9a0c61d2b4 -o bug.jsonl\n"
        "  fanfold export 3f9a0c61d2b4 --format otlp --endpoint http://localhost:4318\n"
    ),
)
@click.argument("conversation_id")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
    default=None,
    help="Write to FILE (default, or -: stdout).",
)
@format_option
@endpoint_option
@content_option
@db_option
def export_command(
    conversation_id: str,
    output: Path | None,
    export_format: str,
    endpoint: str | None,
    capture_content: bool,
    db: Target | None,
) -> None:
    """Write the log of CONVERSATION_ID's whole tree as JSON Lines (a portable bug report),
    or with --format otlp send its OpenTelemetry spans to an OTLP/HTTP endpoint."""
    from fanfold import replay
    from fanfold.cli.output import hint

    if export_format == "otlp":
        if output is not None:
            raise CliError("--format otlp sends to --endpoint; it writes no file (-o)")
        with _errors(), open_store(db, read_only=True) as store:
            export_otlp(store, conversation_id, endpoint, capture_content)
        return
    if output is not None and str(output) != "-":
        refuse_writing_over_the_log(output, db)
    with _errors(), open_store(db, read_only=True) as store:
        if output is None or str(output) == "-":
            try:
                replay.export_jsonl(store, conversation_id, sys.stdout)
                sys.stdout.flush()
            except BrokenPipeError:
                # The reader stopped reading (`| head`): its choice, not an error. Point
                # stdout at /dev/null so the interpreter's last flush does not fail too.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return
        summary = _export_to_file(store, conversation_id, output)
    hint(
        f"exported {summary.steps} step(s) of {summary.conversations} conversation(s) "
        f"(tree {summary.root_id}) to {output}"
    )


def _export_to_file(store: Store, conversation_id: str, output: Path) -> replay.ExportSummary:
    """Write the export through ``write_output`` (atomic for a regular file; a FIFO
    only with a reader, a device as it is)."""
    from fanfold import replay

    return write_output(output, lambda out: replay.export_jsonl(store, conversation_id, out))


@contextmanager
def _lines(file: Path) -> Iterator[BinaryIO]:
    """The lines of ``file`` (stdin for ``-``), opened before any database is.

    Binary: the import decodes each line itself (a line that is not UTF-8 is refused
    with its line number) and records the sha256 of the bytes, the file's own."""
    from fanfold.regular_files import open_regular_bytes

    if str(file) == "-":
        yield sys.stdin.buffer
        return
    # open_regular_bytes: a FIFO is refused, never waited on.
    with open_regular_bytes(file) as lines:
        yield lines


@click.command(
    name="import",
    epilog=("\b\nExamples:\n  fanfold import bug.jsonl --db elsewhere.db\n"),
)
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@db_option
def import_command(file: Path, db: Target | None) -> None:
    """Load an exported log (FILE, or - for stdin) into the database; prints the root id."""
    from fanfold import replay
    from fanfold.cli.display import printable
    from fanfold.cli.output import hint

    with _errors(), _lines(file) as lines, open_store(db, must_exist=False) as store:
        source = "stdin" if str(file) == "-" else str(file.resolve())
        root = replay.import_jsonl(store, lines, source=source)
        path = store.path
    root = printable(root)  # an id from the file: anyone's text
    click.echo(root)
    hint(
        f"imported tree {root}: an inert record (it is never resumed or continued; fork "
        f"it at rest to go on from it); check it with:\n"
        f"  fanfold replay {root} --verify --tree --db {path}",
    )
