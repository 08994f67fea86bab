"""The ``fanfold`` entry point: a Ctrl-C outside the runtime, and signals during exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PRELUDE = textwrap.dedent(
    """
    import atexit, os, signal, time
    import click
    from fanfold.cli import cli, main
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as an interactive shell
    """
)


def _run(body: str) -> subprocess.CompletedProcess[str]:
    code = PRELUDE + textwrap.dedent(body) + "\nmain()\n"
    return subprocess.run(
        [sys.executable, "-c", code, "late"], capture_output=True, text=True, timeout=60
    )


def test_a_ctrl_c_outside_the_runtime_is_interrupted_130_not_aborted() -> None:
    # click's standalone mode printed "Aborted!" and exited 1.
    done = _run(
        """
        @cli.command()
        def late() -> None:
            click.echo("answer")
            raise KeyboardInterrupt
        """
    )
    assert (done.returncode, done.stdout) == (130, "answer\n"), done.stderr
    assert "interrupted" in done.stderr
    assert "Aborted" not in done.stderr and "Traceback" not in done.stderr


def test_a_signal_during_shutdown_neither_kills_nor_prints_a_traceback() -> None:
    # A Ctrl-C that lands after the command finished (logs flushing at exit) killed the
    # process by SIGINT (-2) or printed a KeyboardInterrupt traceback.
    done = _run(
        """
        @atexit.register
        def flush() -> None:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            print("flushed")

        @cli.command()
        def late() -> None:
            click.echo("answer")
        """
    )
    assert (done.returncode, done.stdout) == (0, "answer\nflushed\n"), done.stderr
    assert "Traceback" not in done.stderr


def test_the_group_is_built_explicitly_from_command_modules() -> None:
    """Every command is named in fanfold/cli/__init__.py's table; no module registers
    itself on the group by being imported (`@cli.command` in a module the group must
    import), and each name leads to the command of that name in its own module."""
    from pathlib import Path

    import click

    import fanfold.cli as package
    from fanfold.cli import cli

    context = click.Context(cli)
    assert set(cli.list_commands(context)) == {
        "run", "send", "resume", "ls", "show", "replay", "fork", "export", "import", "trace",
        "transcript",
        "diff",
        "agents",
        "tools",
        "ui",
        "trust",
        "mcp",
        "worker",
        "wait",
        "help",
        "pending",
        "approve",
        "deny",
        "answer",
    }  # fmt: skip
    for name in cli.list_commands(context):
        command = cli.get_command(context, name)
        assert isinstance(command, click.Command), name
        assert command.name == name
        assert command.callback is not None
        assert command.callback.__module__ != "fanfold.cli", name  # defined in its module
    for module in Path(package.__file__).parent.glob("*.py"):
        source = module.read_text(encoding="utf-8")
        assert "@cli.command" not in source, module.name
        assert "@cli.group" not in source, module.name


def test_the_version_is_printed_without_importing_a_command() -> None:
    """`fanfold --version` imports no command module, nor Trio, httpx, rich or the
    reducer: the group imports a command's module only when it is looked up."""
    code = (
        "import sys\n"
        "from fanfold.cli import main\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    heavy = sorted(m for m in sys.modules if m.split('.')[0] in\n"
        "                   ('trio', 'httpx', 'rich', 'sqlite_utils', 'structlog')\n"
        "                   or m.startswith(('fanfold.statemachine', 'fanfold.runtime',\n"
        "                                    'fanfold.cli.run_commands', 'fanfold.db')))\n"
        "    print('heavy:', heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    from fanfold import __version__

    assert done.stdout.splitlines() == [f"fanfold, version {__version__}", "heavy: []"]
