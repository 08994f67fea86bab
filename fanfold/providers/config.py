"""Provider configuration: profiles in a TOML file, overridden by environment variables,
and ``ProviderRouter``, the Provider that picks a profile per call.

Its names, one place to import them from; each lives in the module of its concern:

- ``fanfold.providers.profiles``: what a configuration says (``Config``, ``Profile``,
  ``RetryPolicy``, ``Prices``) and ``parse_config``, which checks it; its docstring
  is the file's format (see also ``examples/fanfold.toml``).
- ``fanfold.providers.config_files``: where the file is, how it is read and
  trusted, and the environment variables applied after it (``load_config``).
- ``fanfold.providers.router``: ``build_provider`` and ``ProviderRouter``.

None of them imports httpx, Trio or the HTTP providers: building an HTTP provider
imports them (``fanfold show`` reads a configuration without them; issue 36).
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
