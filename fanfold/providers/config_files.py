"""Where fanfold's configuration file is, how it is read (size and nesting limits,
TOML), whether a project's file is trusted, and the environment variables applied
after it: ``load_config``. What a configuration says is ``fanfold.providers.profiles``.

Where the file is: ``load_config(path)``, else ``$FANFOLD_CONFIG``, else
``./fanfold.toml``, else ``$XDG_CONFIG_HOME/fanfold/config.toml`` (``~/.config/...``).
With no file and no variables the single profile is ``offline`` (the scripted provider).

Environment variables, applied after the file:

- ``FANFOLD_PROFILE``: the default profile; ``FANFOLD_SUB_AGENT_PROFILE``: the
  sub-agent profile.
- ``FANFOLD_BASE_URL``, ``FANFOLD_MODEL``, ``FANFOLD_API_KEY_ENV``: override those
  fields of the default profile.
- With no file, ``FANFOLD_BASE_URL``/``FANFOLD_MODEL``/``FANFOLD_PROVIDER`` make a
  profile named ``env`` (provider ``FANFOLD_PROVIDER``, default ``openai``). Its key
  variable is ``FANFOLD_API_KEY_ENV`` if set; otherwise ``OPENAI_API_KEY`` /
  ``ANTHROPIC_API_KEY``, but only when no base URL is given, so a vendor key is never
  sent to some other server by default.
"""

from __future__ import annotations

import os
import re
import shlex
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from fanfold.providers.profiles import (
    ENV_PROFILE,
    OFFLINE,
    Config,
    ConfigError,
    Profile,
    _check_env_name,
    _check_url,
    parse_config,
)
from fanfold.providers.settings import (
    ANTHROPIC_BASE_URL,
    OPENAI_BASE_URL,
)
from fanfold.regular_files import read_regular
from fanfold.trust import TrustFileError, TrustStore, file_digest

USER_CONFIG = "user"
"""``find_config`` kinds: the user's own file (``$XDG_CONFIG_HOME/fanfold/config.toml``),"""
EXPLICIT_CONFIG = "explicit"
"""a file the user named (``load_config(path)``, ``--config``, ``$FANFOLD_CONFIG``),"""
PROJECT_CONFIG = "project"
"""or ``./fanfold.toml``: the project's, which anyone who wrote the project chose."""


def user_config_path(environ: Mapping[str, str]) -> Path:
    """Where the user's own configuration is: ``$XDG_CONFIG_HOME/fanfold/config.toml``
    (default ``~/.config/fanfold/config.toml``), whether it exists or not."""
    xdg = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")) / ".config")
    return Path(xdg).expanduser() / "fanfold" / "config.toml"


def find_config(environ: Mapping[str, str], cwd: Path) -> tuple[Path, str] | None:
    """The config file to read and its kind (``EXPLICIT_CONFIG`` for
    ``$FANFOLD_CONFIG``, ``PROJECT_CONFIG`` for ``./fanfold.toml``, ``USER_CONFIG``);
    None if there is none."""
    explicit = environ.get("FANFOLD_CONFIG")
    if explicit:
        path = Path(explicit).expanduser()
        if not path.exists():
            raise ConfigError(f"no such file: {explicit}", path="FANFOLD_CONFIG")
        return path, EXPLICIT_CONFIG
    local = cwd / "fanfold.toml"
    if local.exists():
        return local, PROJECT_CONFIG
    user = user_config_path(environ)
    return (user, USER_CONFIG) if user.exists() else None


def config_path(environ: Mapping[str, str], cwd: Path) -> Path | None:
    """The config file to read: ``$FANFOLD_CONFIG``, ``./fanfold.toml`` or the user's
    ``$XDG_CONFIG_HOME/fanfold/config.toml``; None if there is none."""
    found = find_config(environ, cwd)
    return None if found is None else found[0]


_MAX_CONFIG_BYTES = 4 * 1024 * 1024


def _read_bytes(path: Path) -> bytes:
    """The file's bytes; never blocks on a FIFO (``--config pipe``), refuses anything
    but a regular file, and a file too large to be a configuration."""
    try:
        data = read_regular(path, limit=_MAX_CONFIG_BYTES)
    except FileNotFoundError:
        raise ConfigError("no such file", path=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", path=str(path)) from None
    if len(data) > _MAX_CONFIG_BYTES:
        raise ConfigError(f"larger than {_MAX_CONFIG_BYTES} bytes", path=str(path))
    return data


def load_toml(data: bytes, path: str | Path) -> dict[str, Any]:
    """The table of the TOML file's bytes ``data`` (``path`` names it in errors):
    every reader of a configuration file goes through here, so that each refuses a
    file nested too deeply for tomllib (``ConfigError``) instead of crashing on it."""
    problem = _nesting_problem(data)
    if problem is not None:
        raise ConfigError(f"invalid TOML: {problem}", path=str(path))
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError("not UTF-8 text", path=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML: {exc}", path=str(path)) from None
    except RecursionError:  # a backstop: _nesting_problem refuses such files first
        raise ConfigError("invalid TOML: nested too deeply", path=str(path)) from None


def parse_config_bytes(data: bytes, path: str | Path) -> Config:
    """A Config from the bytes of a TOML file (``path`` names it in errors)."""
    return parse_config(load_toml(data, path), source=str(path))


# What a TOML file holds outside its strings and comments, for _nesting_problem: each
# string (of the four kinds) and comment is one token, so brackets and dots inside
# them are not counted; a closing """ may be followed by one or two quotes of content.
_TOML_TOKENS = re.compile(
    rb'"""(?:[^"\\]|\\.|"(?!""))*"""(?:""?)?'
    rb"|'''(?:[^']|'(?!''))*'''(?:''?)?"
    rb'|"(?:[^"\\\n]|\\.)*"'
    rb"|'[^'\n]*'"
    rb"|#[^\n]*"
    rb"|[\[\]{}.=,\n]",
    re.DOTALL,
)
MAX_TOML_DEPTH = 32
"""Arrays and inline tables nested deeper than this refuse the file."""
MAX_TOML_KEY_PARTS = 32
"""Dotted keys (``a.b.c``, ``[a.b.c]``) of more parts than this refuse the file."""


def _nesting_problem(raw: bytes) -> str | None:
    """Why ``raw`` nests too deeply for tomllib, or None; one pass of a C regex.

    tomllib reads arrays and inline tables recursively (``x = [[[...]]]`` 100,000 deep
    ended in a RecursionError traceback, issue 22.5), and a dotted key costs it time
    quadratic in its parts (100,000 parts: minutes of CPU). No configuration needs
    more than a few of either."""
    depth = parts = 0
    for match in _TOML_TOKENS.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            parts = 0
            if depth > MAX_TOML_DEPTH:
                return f"arrays or tables nested more than {MAX_TOML_DEPTH} deep"
        elif token in (b"]", b"}"):
            depth -= 1
            parts = 0
        elif token == b".":
            parts += 1
            if parts >= MAX_TOML_KEY_PARTS:
                return f"a dotted key of more than {MAX_TOML_KEY_PARTS} parts"
        elif token in (b"=", b",", b"\n"):
            parts = 0
    return None


def read_config_file(path: str | Path) -> Config:
    """Parse one TOML config file (no environment overrides)."""
    path = Path(path)
    return parse_config_bytes(_read_bytes(path), path)


class UntrustedConfig(ConfigError):
    """A project's ``./fanfold.toml`` would send a key (or the conversation) to a
    host the user's own configuration does not name, or hand secret variables to bash
    commands, and the user has not trusted it (``fanfold trust``)."""


def _origin(url: str) -> str:
    """``scheme://host:port`` of ``url``, the port made explicit, the host lowercased:
    what a key is sent to."""
    import httpx  # a project's configuration only (see _project_problem)

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError):
        return url  # matches no known host (and the request would fail anyway)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    host = parsed.host.lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{parsed.scheme}://{host}:{port}"


def _known_origins(environ: Mapping[str, str]) -> set[str]:
    """The hosts a key may go to without trusting a project file: the providers' own,
    those the user's own configuration names, and ``$FANFOLD_BASE_URL``'s."""
    origins = {_origin(OPENAI_BASE_URL), _origin(ANTHROPIC_BASE_URL)}
    if environ.get("FANFOLD_BASE_URL"):
        origins.add(_origin(environ["FANFOLD_BASE_URL"]))
    user = user_config_path(environ)
    if user.exists():
        try:
            own = read_config_file(user)
        except ConfigError:
            own = None  # a broken file of the user's names nothing: trust is asked
        for profile in own.profiles if own is not None else ():
            if profile.base_url is not None:
                origins.add(_origin(profile.base_url))
    return origins


def _project_problem(config: Config, environ: Mapping[str, str]) -> str | None:
    """What in a project's configuration needs the user's trust (None: nothing)."""
    known = _known_origins(environ)
    for profile in config.profiles:
        if profile.provider == "scripted":
            continue
        default = OPENAI_BASE_URL if profile.provider == "openai" else ANTHROPIC_BASE_URL
        url = profile.base_url or default
        if _origin(url) not in known:
            what = (
                f"the key in {profile.api_key_env}"
                if profile.api_key_env is not None
                else "the conversation"
            )
            return (
                f"profiles.{profile.name} sends {what} to {url}, a host your own "
                "configuration does not name"
            )
    if config.pass_env:
        return f"tools.bash.pass_env hands {', '.join(config.pass_env)} to bash commands"
    if config.web_domains:
        # A URL the model builds can carry what it read to the host that serves it.
        return f"tools.web_fetch.domains lets web_fetch reach {', '.join(config.web_domains)}"
    return None


def _check_project(
    config: Config, data: bytes, path: Path, environ: Mapping[str, str], trust: TrustStore | None
) -> None:
    """Refuse a project file that needs trust and is not trusted with these bytes."""
    problem = _project_problem(config, environ)
    if problem is None:
        return
    store = trust if trust is not None else TrustStore.default(environ)
    try:
        if store.is_trusted(path, file_digest(data)):
            return
        changed = store.trusted_digest(path) is not None
    except TrustFileError as exc:
        raise ConfigError(str(exc)) from None
    state = "changed since you trusted it" if changed else "not trusted"
    raise UntrustedConfig(
        f"{problem}; this file is the project's, {state}: if you trust it, run "
        f"`fanfold trust {shlex.quote(str(path))}`",
        path=str(path),
    )


def _env_profile(environ: Mapping[str, str]) -> Profile:
    provider = environ.get("FANFOLD_PROVIDER", "openai")
    if provider not in ("openai", "anthropic"):
        raise ConfigError(f"must be openai or anthropic, got {provider!r}", path="FANFOLD_PROVIDER")
    base_url = environ.get("FANFOLD_BASE_URL") or None
    key_env = environ.get("FANFOLD_API_KEY_ENV") or None
    if key_env is None and base_url is None:
        key_env = "OPENAI_API_KEY" if provider == "openai" else "ANTHROPIC_API_KEY"
    model = environ.get("FANFOLD_MODEL") or None
    if model is None:
        raise ConfigError("a model is required when no config file is used", path="FANFOLD_MODEL")
    return Profile(
        ENV_PROFILE,
        provider,
        model=model,
        base_url=None if base_url is None else _check_url(base_url, "FANFOLD_BASE_URL", ""),
        api_key_env=None
        if key_env is None
        else _check_env_name(key_env, "FANFOLD_API_KEY_ENV", ""),
    )


def load_config(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    trust: TrustStore | None = None,
) -> Config:
    """The effective configuration: the file (``path`` or found by ``find_config``),
    then the ``FANFOLD_*`` environment variables. No file and no variables: ``OFFLINE``.

    A project's ``./fanfold.toml`` (found, not given) is checked against ``trust``
    (default: the user's record, ``TrustStore.default``): ``UntrustedConfig`` if it
    sends a key or the conversation to a host that neither the user's own
    configuration nor ``$FANFOLD_BASE_URL`` names (the providers' own hosts are
    always known), or passes variables to bash, unless the user trusted these bytes.
    """
    env = os.environ if environ is None else environ
    if path is not None:
        found: tuple[Path, str] | None = (Path(path), EXPLICIT_CONFIG)
    else:
        found = find_config(env, Path(cwd).absolute() if cwd else Path.cwd())
    if found is not None:
        # One read: the bytes checked for trust are the bytes parsed.
        data = _read_bytes(found[0])
        config = parse_config_bytes(data, found[0])
        if not config.own_profiles and _names_env_model(env):
            config = attrs.evolve(config, profiles=(_env_profile(env),), default=ENV_PROFILE)
        if found[1] == PROJECT_CONFIG:
            _check_project(config, data, found[0], env, trust)
    elif _names_env_model(env):
        config = Config((_env_profile(env),), ENV_PROFILE, source="environment")
    else:
        config = OFFLINE
    for variable, field in (
        ("FANFOLD_PROFILE", "profile"),
        ("FANFOLD_SUB_AGENT_PROFILE", "sub_agents"),
    ):
        if env.get(variable):
            config = config.with_overrides(**{field: env[variable]}, origin=variable)
    for variable, field in (
        ("FANFOLD_BASE_URL", "base_url"),
        ("FANFOLD_MODEL", "model"),
        ("FANFOLD_API_KEY_ENV", "api_key_env"),
    ):
        if env.get(variable):
            config = config.with_overrides(**{field: env[variable]}, origin=variable)
    return _validated(config)


def _names_env_model(env: Mapping[str, str]) -> bool:
    return any(env.get(name) for name in ("FANFOLD_BASE_URL", "FANFOLD_MODEL", "FANFOLD_PROVIDER"))


def _validated(config: Config) -> Config:
    for profile in config.profiles:
        if profile.provider != "scripted" and not profile.model:
            raise ConfigError(
                "missing: a model is required for this provider",
                path=config.source,
                key=f"profiles.{profile.name}.model",
            )
    return config
