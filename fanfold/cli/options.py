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


class SectionedCommand(click.Command):
    """A command whose ``--help`` lists its options in named sections.

    click has no option groups: ``sections`` maps a section's title to the names of
    its parameters, in order; the others stay under "Options", first. A subclass of
    click's own command rather than the ``click-option-group`` package: only the help
    page changes (parsing, errors and defaults are click's), and the base install gains
    no dependency for a dozen lines.
    """

    def __init__(
        self, *args: Any, sections: dict[str, tuple[str, ...]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.sections = dict(sections or {})
        named = {param.name for param in self.params}
        unknown = [n for names in self.sections.values() for n in names if n not in named]
        if unknown:  # a renamed option would otherwise vanish from the help page
            raise ValueError(f"{self.name}: sections name unknown parameters {unknown}")

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        placed = {name for names in self.sections.values() for name in names}
        plain: list[tuple[str, str]] = []
        records: dict[str, tuple[str, str]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record is None:
                continue
            if param.name in placed:
                records[str(param.name)] = record
            else:
                plain.append(record)
        if plain:
            with formatter.section("Options"):
                formatter.write_dl(plain)
        for title, names in self.sections.items():
            rows = [records[name] for name in names if name in records]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
