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

__all__ = ["COMMANDS", "cli", "main"]

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
    signal after the work was done and reported.
    """
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
    sys.exit(code)
