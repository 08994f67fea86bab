"""``fanfold trust``: trust a project's configuration file, list or revoke trust."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from fanfold.cli.errors import CliError
from fanfold.cli.text import printable

# The configuration parsers (the providers', MCP's) and the trust record are imported
# by the functions that use them: `trust --help` needs none of them.
if TYPE_CHECKING:
    from fanfold.trust import TrustStore


@click.command(
    name="trust",
    epilog=(
        "\b\nExamples:\n"
        "  fanfold trust                 # ./fanfold.toml, as it is now\n"
        "  fanfold trust .mcp.json\n"
        "  fanfold trust --list\n"
    ),
)
@click.argument("path", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--list", "as_list", is_flag=True, help="List the trusted files.")
@click.option("--revoke", is_flag=True, help="Stop trusting PATH.")
def trust_command(path: Path | None, as_list: bool, revoke: bool) -> None:
    """Trust PATH (default: ./fanfold.toml), a project's configuration, as it is now.

    PATH may also be a project's .mcp.json or an agent file (.md) declaring
    mcpServers: its MCP servers start only once trusted (as do the [mcp_servers] of a
    project's fanfold.toml); the commands are shown.

    A project's fanfold.toml that sends an API key (or the conversation) to a host
    your own configuration does not name, or passes variables to bash commands, is
    refused until you trust it. Trust is kept by path and content (sha256) in
    ~/.config/fanfold/trusted.json ($FANFOLD_TRUST_FILE): a changed file needs
    trusting again. A file is trusted where it is found: a symbolic link to it from
    another project is another file, and a link you trust is trusted while it leads
    where it led. The files the servers run from the project (srv.py of "python
    srv.py") are trusted with it, by content: another srv.py is not. Each server's
    command, folder, env and headers are shown as written (a ${VARIABLE} there is
    handed to the server when it starts).
    """
    from fanfold.cli.output import hint
    from fanfold.trust import TrustFileError, TrustStore

    store = TrustStore.default()
    try:
        if as_list:
            if path is not None or revoke:
                raise CliError("--list takes no PATH and no --revoke")
            _list(store)
            return
        target = path if path is not None else Path("fanfold.toml")
        if revoke:
            if not store.revoke(target):
                raise CliError(f"{printable(str(target))} is not trusted")
            hint(f"no longer trusted: {printable(str(target))}")
            return
        _trust(store, target)
    except TrustFileError as exc:
        raise CliError(str(exc)) from None


def _trust(store: TrustStore, target: Path) -> None:
    from fanfold.cli.output import hint
    from fanfold.mcp.config import MCP_JSON, run_files, servers_in
    from fanfold.providers.config import ConfigError, parse_config_bytes
    from fanfold.trust import canonical, project_folder

    # Parse it first: a file fanfold cannot read as a configuration is not trusted.
    # The bytes parsed, and shown below, are the bytes trusted.
    data = store.read(target)
    config = None
    try:
        # A project's .mcp.json declares MCP servers only (fanfold.mcp.config).
        if target.name != MCP_JSON and target.suffix != ".md":
            config = parse_config_bytes(data, target)
        servers = servers_in(data, target)
    except ConfigError as exc:
        raise CliError(f"not trusted: {exc}") from None
    # The files the servers run, from the folder that uses this file (where `fanfold
    # run` starts them): trusted with it, by content. A server whose command, args or
    # url names variables is trusted as they expand now (the launch shown): a variable
    # changed later makes it wait for trust again.
    folder = os.path.realpath(project_folder(target))
    per_server = [run_files(server, folder) for server in servers]
    runs = {path: digest for files in per_server for path, digest in files.items()}
    launches = {s.name: s.launch.digest() for s in servers if s.written is not None}
    entry = store.trust(target, data, runs, launches)
    hint(f"trusted {printable(entry.path)} (sha256 {entry.sha256[:16]}...)")
    if entry.target != entry.path:
        hint(f"  a link to {printable(canonical(target))}: trusted while it leads there")
    for server, files in zip(servers, per_server, strict=True):
        verb = "reaches" if server.command is None else "runs"
        hint(f"  MCP server {printable(server.name)} {verb}: {printable(server.launch.shown())}")
        if server.written is not None:
            hint(f"    (as written: {printable(server.written.shown())})")
        where = os.path.normpath(os.path.join(folder, server.cwd or ""))
        if server.command:
            hint(f"    in {printable(where)}")
        for key, pairs in (("env", server.env), ("headers", server.headers)):
            for name, value in pairs:
                hint(f"    {key} {printable(name)}={printable(value)}")
        for path, digest in sorted(files.items()):
            hint(f"    runs {printable(path)} (sha256 {digest[:16]}...)")
    if config is None:
        return
    for profile in config.profiles:
        if profile.provider == "scripted":
            continue
        key = profile.api_key_env or "no key"
        where = profile.base_url or f"the {profile.provider} API"
        hint(f"  profiles.{printable(profile.name)}: {key} -> {printable(where)}")
    if config.pass_env:
        hint(f"  bash commands see: {', '.join(config.pass_env)}")


def _list(store: TrustStore) -> None:
    from fanfold.cli.output import console, hint
    from fanfold.trust import TrustFileError, canonical, file_digest

    entries = store.entries()
    if not entries:
        hint(f"no trusted files ({store.path})")
        return
    for entry in entries:
        try:
            current: str | None = file_digest(store.read(entry.path))
        except TrustFileError:
            current = None
        state = "" if current == entry.sha256 else (" (gone)" if current is None else " (changed)")
        if not state and entry.target and canonical(entry.path) != entry.target:
            state = " (a link that leads elsewhere now)"
        console.print(
            f"{printable(entry.path)}  sha256 {entry.sha256[:16]}...  {entry.trusted_at}{state}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
