"""Provider configuration: profiles in a TOML file, overridden by environment variables,
and ``ProviderRouter``, the Provider that picks a profile per call.

Its names, one place to import them from; each lives in the module of its concern:
``fanfold.providers.profiles`` (what a configuration says, ``parse_config``),
``fanfold.providers.config_files`` (finding, reading and trusting the file, the
environment's overrides: ``load_config``) and ``fanfold.providers.router``
(``build_provider``, ``ProviderRouter``). None of them imports httpx or Trio.

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

from fanfold.providers.config_files import (
    EXPLICIT_CONFIG,
    MAX_TOML_DEPTH,
    MAX_TOML_KEY_PARTS,
    PROJECT_CONFIG,
    USER_CONFIG,
    UntrustedConfig,
    config_path,
    find_config,
    load_config,
    load_toml,
    parse_config_bytes,
    read_config_file,
    user_config_path,
)
from fanfold.providers.profiles import (
    ENV_PROFILE,
    MAX_ATTEMPTS,
    MAX_CONCURRENT_CALLS,
    MAX_OUTPUT_TOKENS,
    MAX_PRICE,
    MAX_RETRY_SECONDS,
    MAX_TIMEOUT_SECONDS,
    OFFLINE,
    OFFLINE_PROFILE,
    PROVIDERS,
    Config,
    ConfigError,
    MissingApiKey,
    Prices,
    Profile,
    RetryPolicy,
    parse_config,
)
from fanfold.providers.router import ProviderRouter, api_key, build_provider

__all__ = [
    "ENV_PROFILE",
    "EXPLICIT_CONFIG",
    "MAX_ATTEMPTS",
    "MAX_CONCURRENT_CALLS",
    "MAX_OUTPUT_TOKENS",
    "MAX_PRICE",
    "MAX_RETRY_SECONDS",
    "MAX_TIMEOUT_SECONDS",
    "MAX_TOML_DEPTH",
    "MAX_TOML_KEY_PARTS",
    "OFFLINE",
    "OFFLINE_PROFILE",
    "PROJECT_CONFIG",
    "PROVIDERS",
    "USER_CONFIG",
    "Config",
    "ConfigError",
    "MissingApiKey",
    "Prices",
    "Profile",
    "ProviderRouter",
    "RetryPolicy",
    "UntrustedConfig",
    "api_key",
    "build_provider",
    "config_path",
    "find_config",
    "load_config",
    "load_toml",
    "parse_config",
    "parse_config_bytes",
    "read_config_file",
    "user_config_path",
]
