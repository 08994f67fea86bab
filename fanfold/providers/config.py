"""Provider configuration: profiles in a TOML file, overridden by environment variables,
and ``ProviderRouter``, the Provider that picks a profile per call.

The file (see ``examples/fanfold.toml``)::

    default = "local"           # profile of root conversations
    sub_agents = "small"        # profile of sub-agents (optional; default: `default`)

    [retry]                     # optional; see RetryPolicy (how long it waits)
    max_attempts = 4

    [tools.bash]                # optional
    pass_env = ["GITHUB_TOKEN"] # secret-looking variables bash commands may see

    [tools.web_fetch]           # optional; without it there is no web_fetch tool
    domains = ["docs.python.org", "*.readthedocs.io"]   # hosts it may fetch from

    [model_aliases]             # optional: what agent files' model names mean
    sonnet = "big"              # a profile or a model; Claude Code's sonnet, opus and
    haiku = "small"             # haiku are refused unless they are mapped here

    [profiles.local]
    provider = "openai"         # "openai" | "anthropic" | "scripted"
    base_url = "http://127.0.0.1:8080/v1"
    model = "qwen2.5-7b-instruct"
    api_key_env = "LOCAL_KEY"   # NAME of the variable holding the key, never the key
    stream = true
    max_tokens = 2048
    temperature = 0.2
    timeouts = { connect = 5, read = 120, total = 900 }
    stop = ["</tool_call>"]     # request parameters: stop, top_p, seed, tool_choice,
    parallel_tool_calls = false # parallel_tool_calls, reasoning_effort
    extra_body = { cache_prompt = true }          # other body fields (checked)
    extra_headers = { "X-Title" = "fanfold" }     # never credentials
    retry = { max_attempts = 8, cap = 10 }        # this profile's retries (optional)

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

Every problem is a ``ConfigError`` naming the file (or variable) and the key.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from fanfold.providers.base import CallContext, Provider, ProviderError
from fanfold.providers.settings import (
    ANTHROPIC_BASE_URL,
    OPENAI_BASE_URL,
    POOL_SIZE,
    RequestSettings,
    Secret,
    Timeouts,
    looks_like_key,
    valid_api_key,
)
from fanfold.regular_files import read_regular
from fanfold.statemachine import ErrorKind, Limits, ModelError, ModelReply, ModelRequest
from fanfold.statemachine.permissions import DOMAIN, domain_problem, parse_rule
from fanfold.trust import TrustFileError, TrustStore, file_digest

# Reading a configuration (``load_config``: `fanfold show` reads the profiles' prices)
# imports neither httpx nor Trio nor the HTTP providers: those are imported by the
# functions that build providers (issue 36).
if TYPE_CHECKING:
    import httpx

    from fanfold.providers.http1 import ConnectionPool
    from fanfold.providers.slots import CallSlots

PROVIDERS = ("openai", "anthropic", "scripted")
OFFLINE_PROFILE = "offline"
ENV_PROFILE = "env"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ConfigError(Exception):
    """A configuration problem. ``path`` is the file (or variable), ``key`` the setting."""

    def __init__(self, problem: str, *, path: str | None = None, key: str | None = None) -> None:
        self.problem = problem
        self.path = path
        self.key = key
        where = ": ".join(part for part in (path, key) if part)
        super().__init__(f"{where}: {problem}" if where else problem)


class MissingApiKey(ConfigError):
    """A profile's ``api_key_env`` names a variable that is not set."""


@attrs.frozen
class RetryPolicy:
    """Retry settings from ``[retry]`` or a profile's ``[profiles.NAME.retry]``; None
    leaves the value underneath (the file's ``[retry]``, then fanfold's default).

    - ``max_attempts``: attempts of one model round, retries included (default 4).
    - ``base`` / ``cap``: backoff in seconds (defaults 1 and 60). The wait before
      attempt ``n`` (n >= 2) is ``min(cap, base * 2**(n-2))`` scaled by a jitter between
      0.5 and 1; a server's Retry-After replaces it (still at most ``cap``).

    So a policy waits, in all, between half and all of
    ``sum(min(cap, base * 2**k) for k in range(max_attempts - 1))`` seconds (plus the
    attempts' own time) before giving up: ``total_wait`` computes it. The default
    waits 1 + 2 + 4 s at most (3.5 to 7 s); ``max_attempts = 8, base = 1, cap = 10``
    rides out a local server's restart of up to about 22 to 45 s.
    """

    max_attempts: int | None = None
    base: float | None = None
    cap: float | None = None

    def apply(self, limits: Limits) -> Limits:
        """``limits`` with these settings in place."""
        changes: dict[str, Any] = {}
        if self.max_attempts is not None:
            changes["max_attempts"] = self.max_attempts
        if self.base is not None:
            changes["retry_base"] = self.base
        if self.cap is not None:
            changes["retry_cap"] = self.cap
        return attrs.evolve(limits, **changes)

    def over(self, under: RetryPolicy) -> RetryPolicy:
        """This policy, with ``under``'s settings where this one has none."""
        return RetryPolicy(
            under.max_attempts if self.max_attempts is None else self.max_attempts,
            under.base if self.base is None else self.base,
            under.cap if self.cap is None else self.cap,
        )

    def total_wait(self, limits: Limits | None = None) -> tuple[float, float]:
        """The least and most seconds of backoff, in all, between a round's first
        failure and giving up (every attempt failing without a Retry-After), with this
        policy applied to ``limits`` (fanfold's defaults if None)."""
        applied = self.apply(limits if limits is not None else Limits())
        most = sum(
            min(applied.retry_cap, applied.retry_base * 2.0**k)
            for k in range(applied.max_attempts - 1)
        )
        return most / 2, most


@attrs.frozen
class Prices:
    """What a model costs, in US dollars (or any one currency) per million tokens:
    ``input`` (not read from the prompt cache), ``cached_input`` (read from it; the
    input price if not set) and ``output``."""

    input: float
    output: float
    cached_input: float | None = None

    def cost(self, input_tokens: int, cached_input_tokens: int, output_tokens: int) -> float:
        """The cost of a usage (``input_tokens`` includes the cached ones)."""
        cached_price = self.input if self.cached_input is None else self.cached_input
        fresh = max(0, input_tokens - cached_input_tokens)
        try:
            return (
                fresh * self.input
                + cached_input_tokens * cached_price
                + output_tokens * self.output
            ) / 1_000_000
        except OverflowError:
            # Counts beyond a float (only a damaged or edited log holds them).
            return math.inf


@attrs.frozen
class Profile:
    """One way of calling a model: provider, endpoint, model and call settings.

    ``base_url`` None means the vendor's own endpoint. ``api_key_env`` is the name of
    the environment variable that holds the key (None: send no key).
    ``max_tokens_param`` is for OpenAI-compatible servers: ``max_tokens`` or
    ``max_completion_tokens``. ``settings`` are the other request parameters
    (``stop``, ``extra_body``, ``extra_headers``...; see ``RequestSettings``).
    ``retry`` is the profile's own retry policy (see ``Config.retry_policy``).
    ``prices`` (optional) let ``fanfold show`` give what each agent and tree cost.
    ``max_concurrent_calls`` (optional): at most this many of the profile's model
    calls in flight at once in this process (or, with a shared slot table, across
    every worker using it: ``fanfold.providers.slots``); the others wait for a slot.
    """

    name: str
    provider: str
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    timeouts: Timeouts = Timeouts()
    stream: bool = True
    max_tokens: int | None = None
    temperature: float | None = None
    max_tokens_param: str = "max_tokens"
    settings: RequestSettings = RequestSettings()
    retry: RetryPolicy = RetryPolicy()
    prices: Prices | None = None
    max_concurrent_calls: int | None = None


@attrs.frozen
class Config:
    """Profiles, which one root conversations and sub-agents use, and retry settings.

    ``source`` says where it came from (a file path, or "environment"/"built-in").
    """

    profiles: tuple[Profile, ...]
    default: str
    sub_agents: str | None = None
    retry: RetryPolicy = RetryPolicy()
    source: str = "built-in"
    pass_env: tuple[str, ...] = ()
    replaced_key_variables: tuple[str, ...] = ()
    web_domains: tuple[str, ...] = ()
    """``[tools.web_fetch] domains``: the hosts ``web_fetch`` may fetch from (none:
    the tool is not offered)."""
    model_aliases: tuple[tuple[str, str], ...] = ()
    """``[model_aliases]``: (alias, profile or model) pairs for agent files' ``model``."""
    system_prompt: str = ""
    """The root conversations' system prompt (``system_prompt`` at the top of the
    file); ``fanfold run --system``/``--system-file`` replace it."""
    own_profiles: bool = True
    """False for a file without ``[profiles]``: its profiles are those of no file."""
    ask: tuple[str, ...] = ()
    """``[permissions] ask``: rules (Claude Code's syntax) whose calls wait for a
    person's decision in every tree run with this file (issue 35)."""
    approval_timeout: float | None = None
    """``[permissions] approval_timeout``: seconds a call waits for a decision before
    it is denied (none: for ever)."""

    def __attrs_post_init__(self) -> None:
        names = self.names()
        if len(set(names)) != len(names):
            raise ConfigError("duplicate profile names", path=self.source, key="profiles")
        for key, name in (("default", self.default), ("sub_agents", self.sub_agents)):
            if name is not None and name not in names:
                raise ConfigError(
                    f"no profile named {name!r} (profiles: {', '.join(names)})",
                    path=self.source,
                    key=key,
                )

    def resolve(self, model: str | None, depth: int = 0) -> tuple[Profile, str | None]:
        """The profile and model a model call goes to, given ``request.model`` (the
        conversation's ``model``) and the conversation's depth:

        - None: the default profile for a root (``depth == 0``), the sub-agent profile
          for a sub-agent.
        - A profile name: that profile, with its model.
        - A model name that some profile lists as its ``model``: the first such profile.
        - Any other model name: the profile None would pick, with that model.
        """
        base = self.sub_agent_profile() if depth > 0 else self.default_profile()
        if model is None:
            return base, base.model
        if model in self.names():
            profile = self.profile(model)
            return profile, profile.model
        for profile in self.profiles:
            if profile.model == model:
                return profile, model
        return base, model

    def retry_policy(self) -> RetryPolicy:
        """The retry policy of trees whose root runs on the default profile: the
        profile's ``[profiles.NAME.retry]`` settings over the file's ``[retry]``.
        Sub-agents inherit their root's limits, so the whole tree retries alike."""
        return self.default_profile().retry.over(self.retry)

    def key_variables(self) -> tuple[str, ...]:
        """Every variable a profile names as its key (``api_key_env``), including one
        an override replaced: they hold keys, whichever profile is used."""
        names = [p.api_key_env for p in self.profiles if p.api_key_env is not None]
        return tuple(dict.fromkeys([*names, *self.replaced_key_variables]))

    def names(self) -> tuple[str, ...]:
        """Profile names, in file order."""
        return tuple(profile.name for profile in self.profiles)

    def profile(self, name: str) -> Profile:
        """The profile called ``name``; ConfigError if there is none."""
        for profile in self.profiles:
            if profile.name == name:
                return profile
        raise ConfigError(
            f"no profile named {name!r} (profiles: {', '.join(self.names())})", path=self.source
        )

    def default_profile(self) -> Profile:
        """The profile of root conversations."""
        return self.profile(self.default)

    def sub_agent_profile(self) -> Profile:
        """The profile of sub-agents (the default profile unless ``sub_agents`` is set)."""
        return self.profile(self.sub_agents or self.default)

    def with_overrides(
        self,
        *,
        profile: str | None = None,
        sub_agents: str | None = None,
        model: str | None = None,
        base_url: str | None = None,
        api_key_env: str | None = None,
        origin: str = "override",
    ) -> Config:
        """A copy with another default/sub-agent profile, and ``model``/``base_url``/
        ``api_key_env`` replaced in the (new) default profile. ``origin`` names the
        source of the overrides in error messages (a variable, a CLI option)."""
        config = self
        if profile is not None or sub_agents is not None:
            try:
                config = attrs.evolve(
                    config,
                    default=profile if profile is not None else config.default,
                    sub_agents=sub_agents if sub_agents is not None else config.sub_agents,
                )
            except ConfigError as exc:
                raise ConfigError(exc.problem, path=origin) from None
        changes: dict[str, Any] = {}
        if model is not None:
            changes["model"] = model
        if base_url is not None:
            changes["base_url"] = _check_url(base_url, origin, "base_url")
        if api_key_env is not None:
            changes["api_key_env"] = _check_env_name(api_key_env, origin, "api_key_env")
        if not changes:
            return config
        target = config.default_profile()
        updated = attrs.evolve(target, **changes)
        profiles = tuple(updated if p is target else p for p in config.profiles)
        replaced = config.replaced_key_variables
        if target.api_key_env is not None and updated.api_key_env != target.api_key_env:
            replaced = (*replaced, target.api_key_env)
        return attrs.evolve(config, profiles=profiles, replaced_key_variables=replaced)


OFFLINE = Config(profiles=(Profile(OFFLINE_PROFILE, "scripted"),), default=OFFLINE_PROFILE)


# ------------------------------------------------------------------ parsing

_TOP_KEYS = {
    "default",
    "sub_agents",
    "profiles",
    "retry",
    "tools",
    "system_prompt",
    "model_aliases",
    "mcp_servers",  # read by fanfold.mcp.config
    "permissions",
}
_PROFILE_KEYS = {
    "provider",
    "base_url",
    "model",
    "api_key_env",
    "timeouts",
    "stream",
    "max_tokens",
    "max_tokens_param",
    "temperature",
    "stop",
    "top_p",
    "seed",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning_effort",
    "extra_body",
    "extra_headers",
    "prompt_caching",
    "retry",
    "prices",
    "max_concurrent_calls",
}
_PRICE_KEYS = {"input", "cached_input", "output"}
_TIMEOUT_KEYS = {"connect", "read", "total"}
_RETRY_KEYS = {"max_attempts", "base", "cap"}


def _unknown(table: Mapping[str, Any], allowed: set[str], path: str, prefix: str) -> None:
    for key in table:
        if key not in allowed:
            full = f"{prefix}{key}"
            if key in ("api_key", "key", "token"):
                raise ConfigError(
                    "API keys do not belong in the config file; set api_key_env to the "
                    "name of an environment variable holding the key",
                    path=path,
                    key=full,
                )
            raise ConfigError(
                f"unknown setting (expected one of: {', '.join(sorted(allowed))})",
                path=path,
                key=full,
            )


def _string(value: Any, path: str, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError("must be a non-empty string", path=path, key=key)
    return value.strip()


# Upper bounds of the numeric settings. TOML reads `nan`, `inf` and `1e308` as
# floats; none of them is a setting anyone means, and each broke something downstream
# (`show` printed "$nan", `--json` wrote NaN, a retry loop of 1e9 attempts or a wait
# capped at 1e308 s never ends). The bounds are far above any real use, so they refuse
# typing slips only. DESIGN.md ("Numbers are finite and bounded") lists them.
MAX_PRICE = 100_000.0
"""Dollars per million tokens (the dearest models cost a few hundred)."""
MAX_ATTEMPTS = 100
"""Attempts of one model round (``retry.max_attempts``)."""
MAX_RETRY_SECONDS = 3600.0
"""``retry.base`` and ``retry.cap``: an hour between two attempts."""
MAX_TIMEOUT_SECONDS = 86_400.0
"""``timeouts.connect``/``read``/``total``: a day."""
MAX_OUTPUT_TOKENS = 100_000_000
MAX_CONCURRENT_CALLS = 100_000
"""``max_tokens`` of one reply."""


def _number(
    value: Any, path: str, key: str, *, minimum: float, inclusive: bool, maximum: float
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError("must be a number", path=path, key=key)
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"must be a finite number, got {value!r}", path=path, key=key)
    if value < minimum or (not inclusive and value == minimum):
        relation = ">=" if inclusive else ">"
        raise ConfigError(f"must be {relation} {minimum:g}, got {value!r}", path=path, key=key)
    if value > maximum:
        raise ConfigError(f"must be <= {maximum:g}, got {value!r}", path=path, key=key)
    return float(value)


def _integer(value: Any, path: str, key: str, *, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"must be an integer >= 1, got {value!r}", path=path, key=key)
    if value > maximum:
        raise ConfigError(f"must be <= {maximum}, got {value!r}", path=path, key=key)
    return value


def _check_url(value: Any, path: str, key: str) -> str:
    url = _string(value, path, key)
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"must start with http:// or https://, got {url!r}", path=path, key=key)
    return url.rstrip("/")


def _check_env_name(value: Any, path: str, key: str) -> str:
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        # Never echo the value: it may be a key pasted in by mistake.
        raise ConfigError(
            "must be the NAME of an environment variable (letters, digits, _), not the key itself",
            path=path,
            key=key,
        )
    return value


def _timeouts(value: Any, path: str, key: str) -> Timeouts:
    if not isinstance(value, dict):
        raise ConfigError(
            "must be a table: { connect = 10, read = 300, total = 900 }", path=path, key=key
        )
    _unknown(value, _TIMEOUT_KEYS, path, f"{key}.")
    default = Timeouts()
    connect = value.get("connect", default.connect)
    read = value.get("read", default.read)
    total = value.get("total")
    return Timeouts(
        connect=_number(
            connect, path, f"{key}.connect", minimum=0, inclusive=False, maximum=MAX_TIMEOUT_SECONDS
        ),
        read=_number(
            read, path, f"{key}.read", minimum=0, inclusive=False, maximum=MAX_TIMEOUT_SECONDS
        ),
        total=None
        if total is None
        else _number(
            total, path, f"{key}.total", minimum=0, inclusive=False, maximum=MAX_TIMEOUT_SECONDS
        ),
    )


def _profile(name: str, table: Any, path: str) -> Profile:
    prefix = f"profiles.{name}"
    if not isinstance(table, dict):
        raise ConfigError("must be a table", path=path, key=prefix)
    _unknown(table, _PROFILE_KEYS, path, f"{prefix}.")
    if "provider" not in table:
        raise ConfigError(
            f"missing (one of: {', '.join(PROVIDERS)})", path=path, key=f"{prefix}.provider"
        )
    provider = table["provider"]
    if provider not in PROVIDERS:
        raise ConfigError(
            f"must be one of {', '.join(PROVIDERS)}, got {provider!r}",
            path=path,
            key=f"{prefix}.provider",
        )
    fields: dict[str, Any] = {}
    if "model" in table:
        fields["model"] = _string(table["model"], path, f"{prefix}.model")
    if "base_url" in table:
        fields["base_url"] = _check_url(table["base_url"], path, f"{prefix}.base_url")
    if "api_key_env" in table:
        fields["api_key_env"] = _check_env_name(table["api_key_env"], path, f"{prefix}.api_key_env")
    if "timeouts" in table:
        fields["timeouts"] = _timeouts(table["timeouts"], path, f"{prefix}.timeouts")
    if "stream" in table:
        if not isinstance(table["stream"], bool):
            raise ConfigError("must be true or false", path=path, key=f"{prefix}.stream")
        fields["stream"] = table["stream"]
    if "max_tokens" in table:
        fields["max_tokens"] = _integer(
            table["max_tokens"], path, f"{prefix}.max_tokens", maximum=MAX_OUTPUT_TOKENS
        )
    if "max_tokens_param" in table:
        param = table["max_tokens_param"]
        if param not in ("max_tokens", "max_completion_tokens"):
            raise ConfigError(
                "must be max_tokens or max_completion_tokens",
                path=path,
                key=f"{prefix}.max_tokens_param",
            )
        fields["max_tokens_param"] = param
    if "temperature" in table:
        temperature = _number(
            table["temperature"],
            path,
            f"{prefix}.temperature",
            minimum=0,
            inclusive=True,
            maximum=math.inf,  # the message below says the range
        )
        if temperature > 2:
            raise ConfigError("must be between 0 and 2", path=path, key=f"{prefix}.temperature")
        fields["temperature"] = temperature
    settings = _settings(table, provider, path, prefix)
    if settings != RequestSettings():
        fields["settings"] = settings
    if "retry" in table:
        fields["retry"] = _retry(table["retry"], path, f"{prefix}.retry")
    if "prices" in table:
        fields["prices"] = _prices(table["prices"], path, f"{prefix}.prices")
    if "max_concurrent_calls" in table:
        fields["max_concurrent_calls"] = _integer(
            table["max_concurrent_calls"],
            path,
            f"{prefix}.max_concurrent_calls",
            maximum=MAX_CONCURRENT_CALLS,
        )
    return Profile(name=name, provider=provider, **fields)


def _prices(value: Any, path: str, key: str) -> Prices:
    if not isinstance(value, dict):
        raise ConfigError(
            "must be a table: input, output (and cached_input), per million tokens",
            path=path,
            key=key,
        )
    unknown = sorted(set(value) - _PRICE_KEYS)
    if unknown:
        raise ConfigError(
            f"unknown price(s) {', '.join(unknown)} (known: cached_input, input, output)",
            path=path,
            key=key,
        )
    for needed in ("input", "output"):
        if needed not in value:
            raise ConfigError(f"needs {needed} (per million tokens)", path=path, key=key)
    numbers = {
        name: _number(item, path, f"{key}.{name}", minimum=0, inclusive=True, maximum=MAX_PRICE)
        for name, item in value.items()
    }
    return Prices(numbers["input"], numbers["output"], numbers.get("cached_input"))


# Settings that have no equivalent in an API: refused rather than silently dropped.
_UNSUPPORTED = {
    "anthropic": ("seed", "reasoning_effort"),
    # OpenAI and compatible servers cache prompts by themselves; nothing to mark.
    "openai": ("prompt_caching",),
}
_TOOL_CHOICES = ("auto", "required", "none")
_REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
_MAX_STOP = 16
# extra_body keys fanfold sets itself: a profile must not replace the conversation.
_BODY_OWNED = frozenset({"model", "messages", "tools", "stream", "stream_options", "system"})
# extra_body keys that have a typed setting: use that (it is checked and documented).
_BODY_TYPED = {
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens (with max_tokens_param)",
    "temperature": "temperature",
    "stop": "stop",
    "stop_sequences": "stop",
    "top_p": "top_p",
    "seed": "seed",
    "tool_choice": "tool_choice",
    "parallel_tool_calls": "parallel_tool_calls",
    "reasoning_effort": "reasoning_effort",
}
# Headers that carry credentials (keys come only from environment variables) or that
# fanfold sets or HTTP itself owns.
_HEADER_CREDENTIAL_WORDS = ("auth", "key", "token", "secret", "cookie", "password")
_HEADER_OWNED = frozenset(
    {
        "content-type",
        "content-length",
        "content-encoding",
        "transfer-encoding",
        "accept",
        "accept-encoding",
        "host",
        "connection",
        "anthropic-version",
    }
)
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _settings(table: Mapping[str, Any], provider: str, path: str, prefix: str) -> RequestSettings:
    for key in _UNSUPPORTED.get(provider, ()):
        if key in table:
            raise ConfigError(
                f"not supported by the {provider} API (use extra_body for its own parameters)",
                path=path,
                key=f"{prefix}.{key}",
            )
    fields: dict[str, Any] = {}
    if "stop" in table:
        fields["stop"] = _stop(table["stop"], path, f"{prefix}.stop")
    if "top_p" in table:
        top_p = _number(
            table["top_p"], path, f"{prefix}.top_p", minimum=0, inclusive=False, maximum=math.inf
        )
        if top_p > 1:
            raise ConfigError("must be > 0 and <= 1", path=path, key=f"{prefix}.top_p")
        fields["top_p"] = top_p
    if "seed" in table:
        seed = table["seed"]
        if isinstance(seed, bool) or not isinstance(seed, int) or abs(seed) >= 2**63:
            raise ConfigError("must be an integer", path=path, key=f"{prefix}.seed")
        fields["seed"] = seed
    for key, choices in (
        ("tool_choice", _TOOL_CHOICES),
        ("reasoning_effort", _REASONING_EFFORTS),
    ):
        if key in table:
            if table[key] not in choices:
                raise ConfigError(
                    f"must be one of {', '.join(choices)}, got {table[key]!r}",
                    path=path,
                    key=f"{prefix}.{key}",
                )
            fields[key] = table[key]
    if "parallel_tool_calls" in table:
        if not isinstance(table["parallel_tool_calls"], bool):
            raise ConfigError(
                "must be true or false", path=path, key=f"{prefix}.parallel_tool_calls"
            )
        fields["parallel_tool_calls"] = table["parallel_tool_calls"]
    if "prompt_caching" in table:
        if not isinstance(table["prompt_caching"], bool):
            raise ConfigError("must be true or false", path=path, key=f"{prefix}.prompt_caching")
        fields["prompt_caching"] = table["prompt_caching"]
    if "extra_body" in table:
        fields["extra_body"] = _extra_body(table["extra_body"], path, f"{prefix}.extra_body")
    if "extra_headers" in table:
        fields["extra_headers"] = _extra_headers(
            table["extra_headers"], path, f"{prefix}.extra_headers"
        )
    return RequestSettings(**fields)


def _stop(value: Any, path: str, key: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if (
        not isinstance(items, list)
        or not items
        or not all(isinstance(item, str) and item for item in items)
    ):
        raise ConfigError(
            'must be a non-empty string or a list of them, e.g. ["</tool_call>"]',
            path=path,
            key=key,
        )
    if len(items) > _MAX_STOP:
        raise ConfigError(f"at most {_MAX_STOP} stop sequences", path=path, key=key)
    return tuple(items)


def _extra_body(value: Any, path: str, key: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise ConfigError("must be a table of request body fields", path=path, key=key)
    pairs: list[tuple[str, str]] = []
    for name, item in value.items():
        where = f"{key}.{name}"
        if name in _BODY_OWNED:
            raise ConfigError(
                "fanfold sets this field itself; it cannot be replaced", path=path, key=where
            )
        if name in _BODY_TYPED:
            raise ConfigError(
                f"use the profile setting {_BODY_TYPED[name]} instead", path=path, key=where
            )
        pairs.append((name, _json_value(item, path, where)))
    return tuple(pairs)


def _json_value(value: Any, path: str, key: str) -> str:
    """``value`` (from TOML) as JSON text; refuses what JSON cannot hold and keys."""

    def check(item: Any, where: str) -> None:
        if isinstance(item, dict):
            for name, inner in item.items():
                check(inner, f"{where}.{name}")
        elif isinstance(item, list):
            for index, inner in enumerate(item):
                check(inner, f"{where}[{index}]")
        elif isinstance(item, float) and not math.isfinite(item):
            raise ConfigError("must be a finite number", path=path, key=where)
        elif isinstance(item, str):
            if looks_like_key(item):
                raise ConfigError(
                    "looks like an API key; keys do not belong in the config file",
                    path=path,
                    key=where,
                )
        elif not isinstance(item, bool | int | float):
            raise ConfigError(
                f"must be a string, number, boolean, array or table, not {type(item).__name__}",
                path=path,
                key=where,
            )

    check(value, key)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _extra_headers(value: Any, path: str, key: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise ConfigError('must be a table: { "X-Title" = "fanfold" }', path=path, key=key)
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, item in value.items():
        where = f"{key}.{name}"
        lower = name.lower()
        if not _HEADER_NAME.fullmatch(name):
            raise ConfigError("is not a valid HTTP header name", path=path, key=where)
        if any(word in lower for word in _HEADER_CREDENTIAL_WORDS):
            raise ConfigError(
                "credentials do not belong in the config file; the key is sent from the "
                "environment variable named by api_key_env",
                path=path,
                key=where,
            )
        if lower in _HEADER_OWNED:
            raise ConfigError("fanfold sets this header itself", path=path, key=where)
        if lower in seen:
            raise ConfigError("given twice (header names ignore case)", path=path, key=where)
        seen.add(lower)
        # Never echo the value: it may be a secret pasted in by mistake.
        if not isinstance(item, str) or not all(0x20 <= ord(ch) <= 0x7E for ch in item):
            raise ConfigError("must be printable ASCII text", path=path, key=where)
        if looks_like_key(item):
            raise ConfigError(
                "looks like an API key; keys do not belong in the config file",
                path=path,
                key=where,
            )
        pairs.append((name, item.strip()))
    return tuple(pairs)


def _retry(value: Any, path: str, key: str = "retry") -> RetryPolicy:
    if not isinstance(value, dict):
        raise ConfigError("must be a table", path=path, key=key)
    _unknown(value, _RETRY_KEYS, path, f"{key}.")
    return RetryPolicy(
        max_attempts=None
        if "max_attempts" not in value
        else _integer(value["max_attempts"], path, f"{key}.max_attempts", maximum=MAX_ATTEMPTS),
        base=None
        if "base" not in value
        else _number(
            value["base"], path, f"{key}.base", minimum=0, inclusive=True, maximum=MAX_RETRY_SECONDS
        ),
        cap=None
        if "cap" not in value
        else _number(
            value["cap"], path, f"{key}.cap", minimum=0, inclusive=True, maximum=MAX_RETRY_SECONDS
        ),
    )


def _pass_env(value: Any, path: str) -> tuple[str, ...]:
    """``[tools.bash] pass_env``: names of variables bash commands may see."""
    if not isinstance(value, dict):
        raise ConfigError("must be a table", path=path, key="tools")
    _unknown(value, {"bash", "web_fetch"}, path, "tools.")
    bash = value.get("bash", {})
    if not isinstance(bash, dict):
        raise ConfigError("must be a table", path=path, key="tools.bash")
    _unknown(bash, {"pass_env"}, path, "tools.bash.")
    names = bash.get("pass_env", [])
    if not isinstance(names, list):
        raise ConfigError(
            'must be a list of variable names, e.g. ["GITHUB_TOKEN"]',
            path=path,
            key="tools.bash.pass_env",
        )
    return tuple(
        _check_env_name(name, path, f"tools.bash.pass_env[{i}]") for i, name in enumerate(names)
    )


def _web_domains(value: Any, path: str) -> tuple[str, ...]:
    """``[tools.web_fetch] domains``: hosts (``docs.python.org``, ``*.python.org``)."""
    if not isinstance(value, dict):
        raise ConfigError("must be a table", path=path, key="tools")
    table = value.get("web_fetch", {})
    if not isinstance(table, dict):
        raise ConfigError("must be a table", path=path, key="tools.web_fetch")
    _unknown(table, {"domains"}, path, "tools.web_fetch.")
    domains = table.get("domains", [])
    if not isinstance(domains, list) or not all(isinstance(d, str) for d in domains):
        raise ConfigError(
            'must be a list of host names, e.g. ["docs.python.org", "*.python.org"]',
            path=path,
            key="tools.web_fetch.domains",
        )
    out = []
    for i, domain in enumerate(domains):
        pattern = domain.strip() if domain.strip().startswith(DOMAIN) else DOMAIN + domain.strip()
        problem = domain_problem(pattern)
        if problem is not None:
            raise ConfigError(problem, path=path, key=f"tools.web_fetch.domains[{i}]")
        out.append(domain.strip())
    return tuple(out)


def _model_aliases(value: Any, path: str) -> tuple[tuple[str, str], ...]:
    """``[model_aliases]``: alias = "profile or model"."""
    if not isinstance(value, dict):
        raise ConfigError("must be a table of alias = \"profile or model\"", path=path,
                          key="model_aliases")  # fmt: skip
    out = []
    for alias, target in value.items():
        if not isinstance(target, str) or not target.strip():
            raise ConfigError(
                "must be a profile or model name", path=path, key=f"model_aliases.{alias}"
            )
        out.append((str(alias).strip().lower(), target.strip()))
    return tuple(out)


def parse_config(data: Mapping[str, Any], *, source: str = "config") -> Config:
    """A Config from parsed TOML ``data``; ``source`` names it in error messages."""
    _unknown(data, _TOP_KEYS, source, "")
    tables = data.get("profiles")
    if tables is None:
        # A file that sets only other things (MCP servers, tools, aliases, a prompt):
        # the models are those of no file at all (``load_config`` puts the environment's
        # profile in when it names one), so naming a profile here means nothing.
        for key in ("default", "sub_agents"):
            if key in data:
                raise ConfigError(
                    "names a profile, but the file has no [profiles.NAME] table",
                    path=source,
                    key=key,
                )
        tables, own_profiles = {}, False
    elif not isinstance(tables, dict) or not tables:
        raise ConfigError(
            "at least one [profiles.NAME] table is required", path=source, key="profiles"
        )
    else:
        own_profiles = True
    profiles = tuple(_profile(name, table, source) for name, table in tables.items())
    if not own_profiles:
        profiles = OFFLINE.profiles
    names = [profile.name for profile in profiles]
    if "default" in data:
        default = _string(data["default"], source, "default")
    elif len(names) == 1:
        default = names[0]
    else:
        raise ConfigError(
            f"missing: which profile is the default? (profiles: {', '.join(names)})",
            path=source,
            key="default",
        )
    sub_agents = _string(data["sub_agents"], source, "sub_agents") if "sub_agents" in data else None
    retry = _retry(data["retry"], source) if "retry" in data else RetryPolicy()
    pass_env = _pass_env(data["tools"], source) if "tools" in data else ()
    web_domains = _web_domains(data["tools"], source) if "tools" in data else ()
    aliases = _model_aliases(data["model_aliases"], source) if "model_aliases" in data else ()
    system_prompt = (
        _text(data["system_prompt"], source, "system_prompt") if "system_prompt" in data else ""
    )
    ask, approval_timeout = (
        _permissions(data["permissions"], source) if "permissions" in data else ((), None)
    )
    return Config(
        profiles,
        default,
        sub_agents,
        retry,
        source,
        pass_env,
        system_prompt=system_prompt,
        web_domains=web_domains,
        model_aliases=aliases,
        own_profiles=own_profiles,
        ask=ask,
        approval_timeout=approval_timeout,
    )


def _permissions(value: Any, path: str) -> tuple[tuple[str, ...], float | None]:
    """``[permissions]``: ``ask`` (rules whose calls wait for a person) and
    ``approval_timeout`` (seconds; none: wait for ever)."""
    if not isinstance(value, dict):
        raise ConfigError("must be a table", path=path, key="permissions")
    _unknown(value, {"ask", "approval_timeout"}, path, "permissions.")
    rules = value.get("ask", [])
    if not isinstance(rules, list):
        raise ConfigError(
            'must be a list of rules, e.g. ["Bash(git push:*)"]', path=path, key="permissions.ask"
        )
    for i, text in enumerate(rules):
        rule = parse_rule(text)
        if isinstance(rule, str):
            raise ConfigError(rule, path=path, key=f"permissions.ask[{i}]")
    timeout = None
    if "approval_timeout" in value:
        timeout = _number(
            value["approval_timeout"],
            path,
            "permissions.approval_timeout",
            minimum=0,
            inclusive=False,
            maximum=365 * 86_400,
        )
    return tuple(str(r).strip() for r in rules), timeout


def _text(value: Any, path: str, key: str) -> str:
    """A string, empty allowed (a prompt); refused if it is not one."""
    if not isinstance(value, str):
        raise ConfigError("must be a string", path=path, key=key)
    return value


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


# ------------------------------------------------------------------ providers


def api_key(profile: Profile, environ: Mapping[str, str]) -> Secret | None:
    """The key of ``profile`` from ``environ``; MissingApiKey if its variable is unset."""
    if profile.api_key_env is None:
        return None
    value = environ.get(profile.api_key_env, "").strip()
    if not value:
        raise MissingApiKey(
            f"environment variable {profile.api_key_env} (api_key_env) is not set",
            key=f"profiles.{profile.name}",
        )
    if not valid_api_key(value):
        raise ConfigError(
            f"environment variable {profile.api_key_env} holds spaces, control or "
            "non-ASCII characters; it cannot be sent as a header",
            key=f"profiles.{profile.name}",
        )
    return Secret(value)


def build_provider(
    profile: Profile,
    *,
    environ: Mapping[str, str] | None = None,
    client: httpx.AsyncClient | None = None,
    scripted: Provider | None = None,
    pool: ConnectionPool | None = None,
) -> Provider:
    """The provider for ``profile``. HTTP providers share ``client`` (httpx) or
    ``pool`` (``fanfold.providers.http1``) if given.

    A ``scripted`` profile uses the ``scripted`` provider passed in (fanfold's offline
    provider); ConfigError without one, or if the profile's key variable is unset.
    """
    env = os.environ if environ is None else environ
    if profile.provider == "scripted":
        if scripted is None:
            raise ConfigError("no scripted provider was supplied", key=f"profiles.{profile.name}")
        return scripted
    key = api_key(profile, env)
    # The HTTP providers (httpx, Trio) are imported only for a profile that uses one.
    if profile.provider == "openai":
        from fanfold.providers.openai import OpenAIProvider

        return OpenAIProvider(
            base_url=profile.base_url or OPENAI_BASE_URL,
            model=profile.model,
            api_key=key,
            timeouts=profile.timeouts,
            stream=profile.stream,
            max_tokens=profile.max_tokens,
            temperature=profile.temperature,
            max_tokens_param=profile.max_tokens_param,
            settings=profile.settings,
            client=client,
            profile=profile.name,
            pool=pool,
        )
    if profile.provider == "anthropic":
        from fanfold.providers.anthropic import AnthropicProvider

        return AnthropicProvider(
            base_url=profile.base_url or ANTHROPIC_BASE_URL,
            model=profile.model,
            api_key=key,
            timeouts=profile.timeouts,
            stream=profile.stream,
            max_tokens=profile.max_tokens,
            temperature=profile.temperature,
            settings=profile.settings,
            client=client,
            profile=profile.name,
            pool=pool,
        )
    raise ConfigError(f"unknown provider {profile.provider!r}", key=f"profiles.{profile.name}")


class ProviderRouter:
    """A Provider that picks a profile for each call from ``request.model``.

    - None: the default profile for a root conversation (``context.depth == 0``), the
      sub-agent profile for a sub-agent.
    - A profile name: that profile, with its model.
    - A model name that some profile lists as its ``model``: the first such profile.
    - Any other model name: the profile None would pick, with that model.

    The default and sub-agent profiles are built at once (a missing key is a
    ConfigError now); others on first use (a missing key is then an AUTH failure of
    that call). HTTP providers share one ``ConnectionPool`` (or the ``httpx.AsyncClient``
    given, or one made for a proxy); ``aclose()`` closes what the router made.
    """

    def __init__(
        self,
        config: Config,
        *,
        environ: Mapping[str, str] | None = None,
        scripted: Provider | None = None,
        client: httpx.AsyncClient | None = None,
        slots: CallSlots | None = None,
    ) -> None:
        from fanfold.providers.slots import LocalSlots

        self.config = config
        # A profile's ``max_concurrent_calls`` is counted here (this process) unless
        # the caller shares a count (``fanfold.providers.pg_slots`` for workers).
        self.slots: CallSlots = LocalSlots() if slots is None else slots
        env = os.environ if environ is None else environ
        # Keep only the key variables the profiles name, never the whole environment.
        self._keys = _Masked(
            {
                p.api_key_env: env[p.api_key_env]
                for p in config.profiles
                if p.api_key_env is not None and p.api_key_env in env
            }
        )
        self._scripted = scripted
        self._owns_client = client is None
        # Made when the first HTTP profile is built: a scripted configuration (the
        # offline demo's) needs no client, nor httpx (issue 36).
        self._client = client
        self._pool: ConnectionPool | None = None
        self._providers: dict[str, Provider] = {}
        for profile in (config.default_profile(), config.sub_agent_profile()):
            self.provider(profile)

    @property
    def calls_at_once(self) -> int | None:
        """``LimitsCallsAtOnce``: the shared client's pool (``new_client``); None (no
        limit) when a scripted provider answers every profile."""
        return None if self._scripted is not None else POOL_SIZE

    def __repr__(self) -> str:
        return f"ProviderRouter(profiles={self.config.names()!r}, default={self.config.default!r})"

    def _build(self, profile: Profile) -> Provider:
        if self._client is None and self._pool is None and profile.provider != "scripted":
            from fanfold.providers.http import new_client, proxy_in_environment

            # The providers' own HTTP/1.1 path, unless a proxy is configured: httpx honours it.
            if proxy_in_environment():
                self._client = new_client()
            else:
                from fanfold.providers.http1 import ConnectionPool

                self._pool = ConnectionPool()
        return build_provider(
            profile,
            environ=self._keys,
            client=self._client,
            scripted=self._scripted,
            pool=self._pool,
        )

    def resolve(self, model: str | None, depth: int = 0) -> tuple[Profile, str | None]:
        """The profile and model a call with ``request.model == model`` goes to
        (``Config.resolve``)."""
        return self.config.resolve(model, depth)

    def provider(self, profile: Profile) -> Provider:
        """The (cached) provider of ``profile``; raises ConfigError."""
        if profile.name not in self._providers:
            self._providers[profile.name] = self._build(profile)
        return self._providers[profile.name]

    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply:
        """Route the call (see the class docstring) and make it."""
        profile, model = self.resolve(request.model, context.depth)
        try:
            provider = self.provider(profile)
        except MissingApiKey as exc:
            raise ProviderError(ModelError(ErrorKind.AUTH, str(exc))) from None
        except ConfigError as exc:
            raise ProviderError(ModelError(ErrorKind.INVALID_REQUEST, str(exc))) from None
        routed = attrs.evolve(request, model=model)
        capacity = profile.max_concurrent_calls
        if capacity is None:
            return await provider.complete(routed, context)
        async with self.slots.hold(profile.name, capacity):
            return await provider.complete(routed, context)

    async def aclose(self) -> None:
        """Close the shared HTTP client or connections if the router made them."""
        if self._owns_client and self._client is not None:
            await self._client.aclose()
        if self._pool is not None:
            await self._pool.aclose()


class _Masked(Mapping[str, str]):
    """A read-only mapping of key variables whose repr shows no values."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = dict(values)

    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self) -> Any:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"_Masked({sorted(self._values)!r})"
