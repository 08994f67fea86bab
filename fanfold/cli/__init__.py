"""The ``fanfold`` command line: run, resume, list and show conversation trees.

Each command lives in the module of its concern (``run_commands``, ``resume_command``,
``show_commands``, ``replay_commands``); this module names them in one table and the
group imports a command's module only when that command is looked up, so that
``fanfold --version`` (or a command that reads no log) does not pay for importing the
runtime, the providers, the codec and the reducer. Importing a command module
registers nothing by side effect.
"""

from __future__ import annotations

import importlib
import signal
import sys
from typing import Any, NoReturn

import click

from fanfold import __version__
from fanfold.cli import logs
from fanfold.cli.signal_set import stop_signals

__all__ = ["COMMANDS", "SUMMARIES", "cli", "main"]

# name -> (module under fanfold.cli, attribute): the commands, in the order of --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run_commands", "run"),
    "send": ("run_commands", "send"),
    "resume": ("resume_command", "resume"),
    "ls": ("show_commands", "list_conversations"),
    "show": ("show_commands", "show"),
    "replay": ("replay_commands", "replay_command"),
    "fork": ("replay_commands", "fork_command"),
    "export": ("replay_commands", "export_command"),
    "import": ("replay_commands", "import_command"),
    "transcript": ("transcript_command", "transcript_command"),
    "diff": ("diff_command", "diff_command"),
    "trace": ("trace_command", "trace_command"),
    "agents": ("agents_command", "agents_command"),
    "tools": ("tools_command", "tools_command"),
    "ui": ("ui_command", "ui_command"),
    "trust": ("trust_command", "trust_command"),
    "mcp": ("mcp_command", "mcp_command"),
    "worker": ("worker_commands", "worker"),
    "wait": ("worker_commands", "wait"),
    "help": ("help_command", "help_command"),
    "pending": ("approvals", "pending"),
    "approve": ("approvals", "approve"),
    "deny": ("approvals", "deny"),
    "answer": ("approvals", "answer"),
}


# name -> the first paragraph of the command's help (whitespace collapsed): what
# `fanfold --help` shortens into its list of commands, as click shortens the command's
# own help. Listing them this way imports no command module (a test checks that each
# matches its command's help, for every width).
SUMMARIES: dict[str, str] = {
    "run": "Start a conversation on TASK and show its sub-agent tree live.",
    "send": "Send TEXT as the next user message of a stored root conversation (or a fork).",
    "resume": "Resume every unfinished conversation tree after a crash or kill.",
    "ls": "List root conversations (sub-agents are shown by `fanfold show`).",
    "show": "Print a conversation and its sub-agent tree with outcomes.",
    "replay": "Replay a conversation's recorded log through today's reducer; nothing is executed.",
    "fork": "Fork CONVERSATION_ID's tree after step --at SEQ of one of its conversations.",
    "export": (
        "Write the log of CONVERSATION_ID's whole tree as JSON Lines (a portable bug report),"
        " or with --format otlp send its OpenTelemetry spans to an OTLP/HTTP endpoint."
    ),
    "import": "Load an exported log (FILE, or - for stdin) into the database; prints the root id.",
    "transcript": (
        "Print one agent's conversation: system prompt, messages, tool calls with their "
        "arguments and results, sub-agent outcomes, model errors and token usage."
    ),
    "diff": (
        "Compare the trees of A and B (an original and its fork, or two runs of a task): per "
        "agent, the first message where they part, outcomes, rounds, tokens and costs."
    ),
    "trace": "Write a conversation tree's trace as one HTML page (no network needed).",
    "agents": (
        "List the agents sub-agents can be delegated to (name, where it comes from, tools), "
        "and every invalid definition file with its path, line and problem."
    ),
    "tools": (
        "List the tools `fanfold run` offers: each with where it comes from, whether it only "
        "reads, and which agents' permission rules allow it (the root has no rules: it may "
        "call every tool)."
    ),
    "ui": "Serve the trace pages of every tree in the database, live, on this machine.",
    "trust": "Trust PATH (default: ./fanfold.toml), a project's configuration, as it is now.",
    "mcp": "Serve delegation over MCP: delegate_task, list_sub_agents, get_delegation_result.",
    "worker": "Run trees from the workers' queue (fanfold run --detach) until stopped.",
    "wait": (
        "Wait until the tree TREE_ID (fanfold run --detach printed it) is at rest, reading "
        "the log, and print its outcome as run does (exit 1 if it ended in error). A tree not"
        " in the log yet is waited for if it is on the workers' queue (the log's own "
        "database, or --dbos-db beside a log file); an id in neither is an error (exit 2)."
    ),
    "help": "Show a help topic (database, script) or a command's help.",
    "pending": (
        "List every open request for a person's decision: tree, agent, tool, arguments, "
        "the rule that asks, and how long it has waited."
    ),
    "approve": (
        "Approve an open request: its call runs (with --args instead of the model's "
        "arguments, checked against the tool's schema and the rules again)."
    ),
    "deny": (
        'Deny an open request: its call never runs; its result is "denied by the user: '
        'REASON". ID and CALL as for `fanfold approve`.'
    ),
    "answer": (
        "Answer an agent's question (its ask_user call): TEXT is the call's result. ID and "
        "CALL as for `fanfold approve`."
    ),
}


class LazyGroup(click.Group):
    """A group whose commands are imported from ``COMMANDS`` when first looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*COMMANDS, *(n for n in super().list_commands(ctx) if n not in COMMANDS)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        module_name, attribute = COMMANDS[cmd_name]
        module = importlib.import_module(f"fanfold.cli.{module_name}")
        command = getattr(module, attribute)
        if not isinstance(command, click.Command) or command.name != cmd_name:
            raise RuntimeError(f"fanfold.cli.COMMANDS[{cmd_name!r}] names {command!r}")
        self.add_command(command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # click's own listing (same layout and shortening), with the help of a command
        # not looked up yet read from SUMMARIES: no command module is imported.
        rows: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            if name in SUMMARIES and name not in self.commands:
                rows.append((name, click.Command(name, help=SUMMARIES[name])))
                continue
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, c.get_short_help_str(limit)) for name, c in rows])


@click.group(cls=LazyGroup)
@click.version_option(version=__version__, prog_name="fanfold")
@click.option(
    "--log-level",
    type=click.Choice(list(logs.LOG_LEVELS), case_sensitive=False),
    default="info",
    envvar="FANFOLD_LOG_LEVEL",
    show_default=True,
    help="Level of the JSON log file: info has lifecycle, model-call and tool-call "
    "lines; debug adds one `transition` line per step ($FANFOLD_LOG_LEVEL).",
)
def cli(log_level: str) -> None:
    """Run LLM-agent conversations that delegate to sub-agents, with a replayable log."""
    from fanfold.cli.output import lenient_output

    logs.set_file_level(log_level)
    lenient_output()


def main() -> NoReturn:
    """Entry point of the ``fanfold`` script.

    click's standalone mode turns a Ctrl-C outside the runtime (while a configuration
    loads, or as the answer is printed) into "Aborted!" and exit 1; here it is
    "interrupted" and 130, like a Ctrl-C during a run. Once the command has finished,
    the stop signals are ignored: a signal arriving during the interpreter's shutdown
    (flushing logs, closing files) would otherwise surface as a traceback or a death by
    signal after the work was done and reported. A command that asked for it
    (``replay --verify``) ends without the interpreter's teardown (``quick_exit``).
    """
    from fanfold.cli import quick_exit

    quick_exit.reset()  # a request belongs to this call's command only
    code: Any
    try:
        result = cli.main(standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except (KeyboardInterrupt, click.exceptions.Abort):
        from fanfold.cli.output import err_console, quietly

        quietly(lambda: err_console.print("interrupted"))
        code = 130
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    except SystemExit as exc:
        code = exc.code
    except (MemoryError, RuntimeError) as exc:
        # Out of memory or threads outside a command's own error handling (loading a
        # command's modules): one line too, never a traceback.
        from fanfold.cli.errors import CliError, exhausted, exhausted_message

        if not exhausted(exc):
            raise
        error = CliError(exhausted_message(exc))
        error.show()
        code = error.exit_code
    for signum in stop_signals():
        signal.signal(signum, signal.SIG_IGN)
    if quick_exit.requested() and (code is None or isinstance(code, int)):
        quick_exit.end(code or 0)
    sys.exit(code)
