"""Options shared by several commands, in a module that imports only click: a
command's ``--help`` needs its options, not what they lead to (the providers, the
queue). ``cli.models`` and ``cli.worker_commands`` re-export them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click


def model_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--script, --config, --profile and --model, shared by the commands that run models."""
    for option in reversed(
        [
            click.option(
                "--script",
                type=click.Path(dir_okay=False, path_type=Path),
                help="Offline scripted replies (JSON) instead of a real model.",
            ),
            click.option(
                "--config",
                "config_path",
                type=click.Path(dir_okay=False, path_type=Path),
                help="Model configuration (TOML; default: $FANFOLD_CONFIG, "
                "./fanfold.toml, ~/.config/fanfold/config.toml).",
            ),
            click.option("--profile", help="Configuration profile for the root conversation."),
            click.option("--model", help="Model (or profile) name for the root conversation."),
        ]
    ):
        command = option(command)
    return command


dbos_db_option = click.option(
    "--dbos-db",
    envvar="FANFOLD_DBOS_DB",
    default=None,
    metavar="URL",
    help="PostgreSQL URL of DBOS's system database, the queue the workers share "
    "($FANFOLD_DBOS_DB). Prefer the variable or a ~/.pgpass to a password in the URL.",
)
