"""Which MCP servers a folder declares, and whether each may start.

Three places declare servers:

- the configuration file (``[mcp_servers.NAME]``: ``command``, ``args``, ``env``,
  ``cwd``, or ``url`` and ``headers``; ``type``; and fanfold's own keys
  ``idempotent_tools``, ``include_tools``, ``exclude_tools``, ``ask_tools``, ``timeout``,
  ``startup_timeout``);
- a project's ``.mcp.json`` (``{"mcpServers": {NAME: {...}}}``, Claude Code's format,
  the same keys in camel case where it has them);
- agent files' front matter (``mcpServers:``, the same keys), in the folders
  ``fanfold.agents`` reads: the project's are the project's, the user's the user's.

A server declared by the project (``./fanfold.toml`` found in the folder, its
``.mcp.json``, or an agent file in its ``.claude/agents`` or ``.fanfold/agents``) is
code the repository chose to run on the user's machine: it starts only once the user
has trusted that file's bytes as found in this folder (``fanfold trust PATH``, the
record of ``fanfold.trust``: a link to a file trusted elsewhere is not trusted here),
and the files its command runs from the folder (``run_files``: ``srv.py`` of
``python srv.py``) are those the trust recorded, byte for byte. A project's server
starts in the folder its files were checked in (its ``cwd`` made absolute), whatever
the runtime's own folder. Servers of the user's own configuration, ``$FANFOLD_CONFIG``
or an explicit ``--config`` start as they are.

Values in ``command``, ``args``, ``url``, ``env`` and ``headers`` may name environment
variables, as Claude Code reads them: ``${VAR}`` (also inside a value, as in ``Bearer
${GITHUB_TOKEN}``), ``${VAR:-default}`` (the default when ``VAR`` is unset or empty),
or a whole ``$VAR``. Those in ``env`` and ``headers`` are secrets: read from fanfold's
environment when the server starts, never stored, logged or shown (``fanfold tools``
shows the names). Those in ``command``, ``args`` and ``url`` say what runs (or where
the headers go): they are expanded when the servers are declared, and a project's
server starts only if they expand as they did when the user trusted its file (the
trust record keeps a digest of the expansion, ``ServerDeclaration.launch_digest``):
a variable cannot change, under an earlier trust, what runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import attrs

from fanfold.agents.catalog import agent_folders
from fanfold.agents.definitions import front_matter
from fanfold.providers.config import (
    EXPLICIT_CONFIG,
    PROJECT_CONFIG,
    ConfigError,
    find_config,
    load_toml,
)
from fanfold.regular_files import read_regular
from fanfold.trust import TrustedFile, TrustFileError, TrustStore, file_digest

__all__ = [
    "DEFAULT_TIMEOUT",
    "MCP_JSON",
    "TRANSPORTS",
    "Declarations",
    "ServerDeclaration",
    "ServerLaunch",
    "declared_servers",
    "expand",
    "run_files",
    "secret_variables",
    "servers_in",
    "servers_of",
]

MCP_JSON = ".mcp.json"
DEFAULT_TIMEOUT = 120.0
"""Seconds one tool call may take (``timeout`` per server)."""
DEFAULT_STARTUP_TIMEOUT = 30.0
"""Seconds a server has to start and answer ``initialize`` and ``tools/list``."""
_NAME = re.compile(r"^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$")
_VARIABLE = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)$")
# ``${VAR}`` or ``${VAR:-default}`` (a default holds no ``}``).
_BRACED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_MAX_FILE = 1024 * 1024


TRANSPORTS = ("stdio", "http", "sse")
"""The ``type`` of a server: a program on stdin/stdout, Streamable HTTP, or the older
HTTP+SSE transport (the SDK's ``mcp.client.sse``)."""


@attrs.frozen
class ServerLaunch:
    """What a server's declaration says to run or reach: ``command`` and ``args`` (a
    stdio server) or ``url``."""

    command: str | None
    args: tuple[str, ...]
    url: str | None

    def digest(self) -> str:
        """The sha256 of this launch (canonical JSON), as the trust record keeps it."""
        text = json.dumps([self.command, list(self.args), self.url], ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()

    def shown(self) -> str:
        """The command line (shell-quoted) or the URL."""
        return shlex.join([self.command, *self.args]) if self.command else self.url or ""


@attrs.frozen
class ServerDeclaration:
    """One declared server. ``command``, ``args`` and ``url`` are what runs, their
    environment references expanded (``written``: the launch as the file wrote it,
    when it named variables; None when it named none). ``env`` and ``headers`` hold
    the values as written (an ``${VAR}`` is expanded only when the server starts).
    ``needs_trust``: declared by the project, and its file's bytes (or the expansion
    of its launch) are not trusted."""

    name: str
    source: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    idempotent_tools: tuple[str, ...] = ()
    timeout: float = DEFAULT_TIMEOUT
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    project: bool = False
    needs_trust: bool = False
    private: bool = False
    """Declared in an agent file's ``mcpServers``: it serves the agents whose
    definitions name it, not the whole run (``AgentDefinition.own_tools``)."""
    sse: bool = False
    """``type = "sse"``: the URL speaks the HTTP+SSE transport, not Streamable HTTP."""
    written: ServerLaunch | None = None
    include_tools: tuple[str, ...] = ()
    """Names or globs (``fnmatch``, case-sensitive) of the server's tools to offer;
    empty: all of them."""
    exclude_tools: tuple[str, ...] = ()
    """Names or globs of the server's tools never offered (they win over
    ``include_tools``)."""
    ask_tools: tuple[str, ...] = ()
    """Names or globs of the server's tools each call of which waits for a person's
    decision (``["*"]``: the whole server): their specs say ``needs_approval``
    (issue 35)."""

    def asks(self, tool: str) -> bool:
        """Whether every call of the server's tool ``tool`` (its own name) waits for a
        person's decision (``ask_tools``)."""
        return any(fnmatchcase(tool, p) for p in self.ask_tools)

    def offers(self, tool: str) -> bool:
        """Whether the server's tool named ``tool`` passes ``include_tools`` and
        ``exclude_tools`` (its own name, not ``mcp__SERVER__TOOL``)."""
        if self.include_tools and not any(fnmatchcase(tool, p) for p in self.include_tools):
            return False
        return not any(fnmatchcase(tool, p) for p in self.exclude_tools)

    @property
    def transport(self) -> str:
        """``stdio``, ``http`` (Streamable HTTP) or ``sse``."""
        if self.command is not None:
            return "stdio"
        return "sse" if self.sse else "http"

    @property
    def launch(self) -> ServerLaunch:
        """What runs (or is reached), expanded."""
        return ServerLaunch(self.command, self.args, self.url)


@attrs.frozen
class Declarations:
    """The servers in effect (by name: a later file's replaces an earlier one's) and
    the problems found (each one line, naming the file and the key)."""

    servers: tuple[ServerDeclaration, ...] = ()
    problems: tuple[str, ...] = ()


def secret_variables(declarations: Iterable[ServerDeclaration]) -> frozenset[str]:
    """The environment variables the declarations' ``env`` and ``headers`` name
    (``${VAR}``): kept from bash commands and redacted from the log like key variables."""
    names = set()
    for declaration in declarations:
        for _, value in (*declaration.env, *declaration.headers):
            names.update(_referenced(value))
    return frozenset(names)


def _referenced(value: str) -> list[str]:
    whole = _VARIABLE.match(value.strip())
    return [whole.group(1)] if whole else [m.group(1) for m in _BRACED.finditer(value)]


def expand(value: str, environ: Mapping[str, str], where: str) -> str:
    """``value`` with its environment references replaced by the variables' values:
    ``${VAR}`` anywhere (as in ``Bearer ${TOKEN}``), ``${VAR:-default}`` (``default``
    when ``VAR`` is unset or empty, as the shell reads it), or a whole ``$VAR``.
    Raises ``ConfigError`` naming the variable (never a value) if one without a
    default is not set."""
    whole = _VARIABLE.match(value.strip())
    if whole is not None:
        if whole.group(1) not in environ:
            raise ConfigError(f"needs ${whole.group(1)}, which is not set", path=where)
        return environ[whole.group(1)]
    for match in _BRACED.finditer(value):
        if match.group(2) is None and match.group(1) not in environ:
            raise ConfigError(f"needs ${match.group(1)}, which is not set", path=where)

    def value_of(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if default is not None and not environ.get(name):
            return default
        return environ[name]

    return _BRACED.sub(value_of, value)


def _names_variables(value: str) -> bool:
    return bool(_referenced(value))


def declared_servers(
    cwd: Path,
    config_path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    trust: TrustStore | None = None,
) -> Declarations:
    """The MCP servers declared for ``cwd``: the configuration file's (``config_path``,
    else the one ``fanfold run`` would read), then the folder's ``.mcp.json``."""
    env = os.environ if environ is None else environ
    store = trust if trust is not None else TrustStore.default(env)
    found: dict[str, ServerDeclaration] = {}
    problems: list[str] = []
    try:
        located = (
            (config_path, EXPLICIT_CONFIG) if config_path is not None else find_config(env, cwd)
        )
    except ConfigError as exc:
        problems.append(str(exc))
        located = None
    sources: list[tuple[Path, str, bool]] = []
    if located is not None:
        sources.append((located[0], "toml", located[1] == PROJECT_CONFIG))
    if (cwd / MCP_JSON).exists():
        sources.append((cwd / MCP_JSON, "json", True))
    # Agent files may declare servers too (``mcpServers`` in the front matter): the
    # project's folders' files are the project's (trust needed), the user's are not.
    project_folders = agent_folders(cwd, env)[2:]
    for folder in agent_folders(cwd, env):
        if folder.is_dir():
            for file in sorted(folder.glob("*.md")):
                sources.append((file, "agent", folder in project_folders))
    started_in = os.path.realpath(cwd)  # where a project's servers start
    for path, kind, project in sources:
        try:
            data = read_regular(path, limit=_MAX_FILE)
        except (OSError, ValueError) as exc:
            problems.append(f"{path}: cannot read it: {exc}")
            continue
        if len(data) > _MAX_FILE:
            problems.append(f"{path}: larger than {_MAX_FILE} bytes: not read")
            continue
        entry: TrustedFile | None = None
        if project:
            try:
                entry = store.entry(path, file_digest(data))
            except TrustFileError as exc:
                problems.append(f"{path}: {exc}")
        try:
            table = _servers_table(data, path, kind)
        except ConfigError as exc:
            problems.append(str(exc))
            continue
        for name, body in table.items():
            earlier = found.get(name) if isinstance(name, str) else None
            if kind == "agent" and earlier is not None and not earlier.private:
                # A run-wide server keeps its name: an agent file may not replace the
                # user's (or the project's) server of that name with its own command.
                problems.append(
                    f"{path}: mcpServers.{name}: {earlier.source} declares MCP server "
                    f"{name!r} already: this agent file's declaration is ignored (the "
                    "agent names that server)"
                )
                continue
            try:
                declared = _declaration(name, body, str(path), kind, project, False, env)
            except ConfigError as exc:
                problems.append(str(exc))
                continue
            if project:
                # It starts where its files were checked (the hub's own folder may be
                # another: a resume of trees from several folders), and only if the
                # file and every file its command runs from there are trusted, and what
                # its variables made of the launch too: an environment variable may not
                # change what runs under an earlier trust.
                declared = attrs.evolve(
                    declared, cwd=os.path.normpath(os.path.join(started_in, declared.cwd or ""))
                )
                runs = run_files(declared, started_in)
                trusted = entry is not None and entry.runs_trusted(runs)
                if trusted and entry is not None and declared.written is not None:
                    changed = _launch_not_trusted(entry, path, declared)
                    if changed is not None:
                        problems.append(changed)
                        trusted = False
                declared = attrs.evolve(declared, needs_trust=not trusted)
            found[name] = attrs.evolve(declared, private=True) if kind == "agent" else declared
    return Declarations(tuple(found.values()), tuple(problems))


def _launch_not_trusted(entry: TrustedFile, path: Path, declared: ServerDeclaration) -> str | None:
    """None if the trust ``entry`` of ``path`` holds the digest of ``declared``'s launch
    as expanded now; else the problem, one line (never a variable's value: the
    launch as written names the variables)."""
    recorded = dict(entry.launches).get(declared.name)
    if recorded == declared.launch.digest():
        return None
    assert declared.written is not None
    why = (
        "was trusted before fanfold recorded what its variables expand to"
        if recorded is None
        else "expands differently than when the file was trusted (an environment variable changed)"
    )
    return (
        f"{path}: MCP server {declared.name!r} ({declared.written.shown()}) {why}: it waits "
        f"for trust; run `fanfold trust {path}` to trust what it runs now"
    )


def run_files(declaration: ServerDeclaration, folder: str | os.PathLike[str]) -> dict[str, str]:
    """The files a stdio server's command runs from ``folder`` (where it starts), each
    with the sha256 of its bytes now: its command when that is a relative path
    (``./serve``), each relative argument naming a file there (``srv.py`` of ``python
    srv.py``, ``-m srv``'s ``srv.py`` or ``srv/__main__.py``). What trust records
    besides the declaring file, so that the same declaration in another checkout (a
    link to a trusted ``.mcp.json``) does not run that checkout's program. Not seen:
    files a program opens by itself (an import, a configuration it reads)."""
    if declaration.command is None:
        return {}
    base = os.path.join(os.fspath(folder), declaration.cwd or "")
    names: list[str] = []
    command = declaration.command
    if "/" in command and not os.path.isabs(command):
        names.append(command)
    module = False
    for arg in declaration.args:
        if module:
            stem = arg.replace(".", "/")
            names += [f"{stem}.py", f"{stem}/__main__.py", f"{stem}/__init__.py"]
        elif arg and not arg.startswith("-") and not os.path.isabs(arg):
            names.append(arg)
        module = arg == "-m"
    found: dict[str, str] = {}
    for name in names:
        path = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(path):
            found[path] = _file_sha256(path)
    return found


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        # Unreadable now: a digest no trusted file has, so the server is not trusted.
        return hashlib.sha256(f"unreadable: {exc.errno}".encode()).hexdigest()
    return digest.hexdigest()


def servers_in(
    data: bytes, path: Path, environ: Mapping[str, str] | None = None
) -> list[ServerDeclaration]:
    """The servers a file's bytes declare (``.mcp.json`` by its name, an agent file by
    its ``.md``, else TOML), their launch expanded in ``environ`` (default: fanfold's),
    for ``fanfold trust`` to show (and record) what it is trusting; ``ConfigError`` if
    one is invalid or names a variable that is not set."""
    env = os.environ if environ is None else environ
    kind = "json" if path.name == MCP_JSON else "agent" if path.suffix == ".md" else "toml"
    table = _servers_table(data, path, kind)
    return [_declaration(n, b, str(path), kind, True, False, env) for n, b in table.items()]


def servers_of(
    path: str | os.PathLike[str], environ: Mapping[str, str] | None = None
) -> tuple[ServerDeclaration, ...]:
    """The servers one file declares, for a program (``Runtime.open(mcp_servers=PATH)``):
    a fanfold configuration's ``[mcp_servers]``, a ``.mcp.json``'s ``mcpServers``
    (told apart by the ``.json`` suffix). The program names the file, as ``--config``
    does on the command line, so its servers start as they are (no trust record).
    ``ConfigError`` (one line, naming the file and the key) for anything wrong."""
    target = Path(path)
    try:
        data = read_regular(target, limit=_MAX_FILE)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read it: {exc}", path=str(target)) from None
    if len(data) > _MAX_FILE:
        raise ConfigError(f"larger than {_MAX_FILE} bytes: not read", path=str(target))
    kind = "json" if target.suffix == ".json" else "toml"
    table = _servers_table(data, target, kind)
    env = os.environ if environ is None else environ
    return tuple(_declaration(n, b, str(target), kind, False, False, env) for n, b in table.items())


def _servers_table(data: bytes, path: Path, kind: str) -> dict[str, Any]:
    if kind == "agent":
        return _agent_servers(data, path)
    if kind == "toml":
        # The configuration's own reader: it refuses a file nested too deeply first.
        document: Any = load_toml(data, path)
        key = "mcp_servers"
    else:
        try:
            document = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"not valid JSON: {exc}", path=str(path)) from None
        except RecursionError:  # a project's .mcp.json of 100,000 nested [
            raise ConfigError("not valid JSON: nested too deeply", path=str(path)) from None
        key = "mcpServers"
    if not isinstance(document, dict):
        raise ConfigError(f"not a {kind.upper()} object", path=str(path))
    table = document.get(key, {})
    if not isinstance(table, dict):
        raise ConfigError("must be a table of servers by name", path=str(path), key=key)
    return table


def _agent_servers(data: bytes, path: Path) -> dict[str, Any]:
    """An agent file's ``mcpServers``: a table of servers (a list of names refers to
    servers declared elsewhere and declares none)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {}  # fanfold agents reports the file
    # Read as `fanfold agents` reads it: a front matter nested 5,000 deep or full of
    # aliases is refused there (and declares nothing here), never a RecursionError.
    front = front_matter(text)
    if front is None:
        return {}  # fanfold agents reports the file
    table = front.get("mcpServers", front.get("mcp_servers"))
    if table is None or isinstance(table, list):
        return {}
    if not isinstance(table, dict):
        raise ConfigError("must be a table of servers by name", path=str(path), key="mcpServers")
    return table


_TOML_KEYS = {
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "idempotent_tools",
    "include_tools",
    "exclude_tools",
    "ask_tools",
    "timeout",
    "startup_timeout",
    "type",
}
_JSON_ALIASES = {
    "idempotentTools": "idempotent_tools",
    "startupTimeout": "startup_timeout",
    "includeTools": "include_tools",
    "excludeTools": "exclude_tools",
    "askTools": "ask_tools",
}


def _declaration(
    name: str,
    body: Any,
    source: str,
    kind: str,
    project: bool,
    needs_trust: bool,
    environ: Mapping[str, str],
) -> ServerDeclaration:
    where = f"mcp_servers.{name}" if kind == "toml" else f"mcpServers.{name}"
    if not isinstance(name, str):
        raise ConfigError("a server name must be a string", path=source, key=str(name))

    def fail(message: str) -> ConfigError:
        return ConfigError(message, path=source, key=where)

    if not _NAME.match(name) or len(name) > 32:
        raise fail(
            "a server name is 1-32 letters, digits, '-' or single '_' (tools are named "
            "mcp__SERVER__TOOL)"
        )
    if not isinstance(body, dict):
        raise fail("must be a table")
    body = {_JSON_ALIASES.get(k, k): v for k, v in body.items()}
    unknown = sorted(set(body) - _TOML_KEYS)
    if unknown and kind == "toml":
        raise fail(f"unknown key(s) {', '.join(unknown)}")
    command = body.get("command")
    url = body.get("url")
    if (command is None) == (url is None):
        raise fail("give command (a stdio server) or url (Streamable HTTP or SSE), one of them")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise fail("command must be a non-empty string")
    if url is not None and not isinstance(url, str):
        raise fail("url must be an http:// or https:// URL")
    args = body.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise fail("args must be a list of strings")
    transport = _transport(body.get("type"), command is not None, fail)
    written = ServerLaunch(command, tuple(args), url)
    launch = _expanded_launch(written, environ, f"{source}: {where}")
    command, args, url = launch.command, list(launch.args), launch.url
    if command is not None and not command.strip():
        raise fail("command must be a non-empty string (it expands to nothing)")
    if url is not None and not url.startswith(("http://", "https://")):
        raise fail("url must be an http:// or https:// URL")
    env = _string_table(body.get("env", {}), fail, "env")
    headers = _string_table(body.get("headers", {}), fail, "headers")
    cwd = body.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise fail("cwd must be a string")
    idempotent = body.get("idempotent_tools", [])
    if not isinstance(idempotent, list) or not all(isinstance(t, str) for t in idempotent):
        raise fail("idempotent_tools must be a list of tool names")
    filters = {}
    for key in ("include_tools", "exclude_tools", "ask_tools"):
        patterns = body.get(key, [])
        if (
            not isinstance(patterns, list)
            or len(patterns) > 1000
            or not all(isinstance(p, str) and 0 < len(p) <= 200 for p in patterns)
        ):
            raise fail(f'{key} must be a list of tool names or globs (such as "get_*")')
        filters[key] = tuple(patterns)
    timeouts = {}
    for key, default in (
        ("timeout", DEFAULT_TIMEOUT),
        ("startup_timeout", DEFAULT_STARTUP_TIMEOUT),
    ):
        value = body.get(key, default)
        if type(value) not in (int, float) or not 0 < value <= 86_400:
            raise fail(f"{key} must be a number of seconds between 0 and 86400")
        timeouts[key] = float(value)
    return ServerDeclaration(
        name,
        source,
        command=command,
        args=tuple(args),
        env=env,
        cwd=cwd,
        url=url,
        headers=headers,
        idempotent_tools=tuple(idempotent),
        timeout=timeouts["timeout"],
        startup_timeout=timeouts["startup_timeout"],
        project=project,
        needs_trust=needs_trust,
        sse=transport == "sse",
        written=written if written != launch else None,
        include_tools=filters["include_tools"],
        exclude_tools=filters["exclude_tools"],
        ask_tools=filters["ask_tools"],
    )


def _transport(value: Any, stdio: bool, fail: Any) -> str:
    """The ``type`` as given (Claude Code's ``stdio``, ``http``, ``sse``; fanfold
    also reads ``streamable-http``), checked against ``command``/``url``."""
    if value is None:
        return "stdio" if stdio else "http"
    if value == "streamable-http":
        value = "http"
    if value not in TRANSPORTS:
        raise fail(
            f"type must be one of {', '.join(TRANSPORTS)} (and streamable-http), not "
            f"{repr(value)[:40]}"
        )
    if (value == "stdio") != stdio:
        needs = "command" if value == "stdio" else "url"
        raise fail(f"type {value!r} needs {needs}")
    return str(value)


def _expanded_launch(written: ServerLaunch, environ: Mapping[str, str], where: str) -> ServerLaunch:
    """``written`` with the environment references of its command, args and url
    expanded; ConfigError naming a variable that is not set."""
    command = expand(written.command, environ, f"{where}.command") if written.command else None
    args = tuple(
        expand(arg, environ, f"{where}.args[{index}]") for index, arg in enumerate(written.args)
    )
    url = expand(written.url, environ, f"{where}.url") if written.url is not None else None
    return ServerLaunch(command if written.command is not None else None, args, url)


def _string_table(value: Any, fail: Any, key: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise fail(f"{key} must be a table of strings")
    return tuple(sorted(value.items()))
