"""The ``fanfold`` command line: run, resume, list and show conversation trees.

Each command lives in the module of its concern (``run_commands``, ``resume_command``,
``show_commands``, ``replay_commands``); this module builds the group from them
explicitly, so importing a command module registers nothing by side effect.
"""

from __future__ import annotations

import signal
import sys
from typing import Any, NoReturn

import click

from fanfold.cli import logs
from fanfold.cli.agents_command import agents_command
from fanfold.cli.output import err_console, lenient_output, quietly
from fanfold.cli.replay_commands import export_command, fork_command, import_command, replay_command
from fanfold.cli.resume_command import resume
from fanfold.cli.run_commands import run, send
from fanfold.cli.show_commands import list_conversations, show
from fanfold.cli.signals import stop_signals
from fanfold.cli.trace_command import trace_command
from fanfold.cli.trust_command import trust_command
from fanfold.cli.ui_command import ui_command

__all__ = ["cli", "main"]


@click.group()
@click.version_option(package_name="fanfold")
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
    logs.set_file_level(log_level)
    lenient_output()


for _command in (
    run,
    send,
    resume,
    list_conversations,
    show,
    replay_command,
    fork_command,
    export_command,
    import_command,
    trace_command,
    agents_command,
    ui_command,
    trust_command,
):
    cli.add_command(_command)


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
        quietly(lambda: err_console.print("interrupted"))
        code = 130
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    except SystemExit as exc:
        code = exc.code
    for signum in stop_signals():
        signal.signal(signum, signal.SIG_IGN)
    sys.exit(code)
