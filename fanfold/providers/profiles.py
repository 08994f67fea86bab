"""Provider profiles: what a configuration says (``Config``, ``Profile``, retries,
prices) and ``parse_config``, which checks every key and number of one.

Where the file is found and how it is read is ``fanfold.providers.config_files``;
building providers from profiles is ``fanfold.providers.router``.

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

Every problem is a ``ConfigError`` naming the file (or variable) and the key.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import attrs

from fanfold.providers.settings import (
    RequestSettings,
    Timeouts,
    looks_like_key,
)
from fanfold.statemachine import Limits
from fanfold.statemachine.permissions import DOMAIN, domain_problem, parse_rule

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
