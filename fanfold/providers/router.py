"""Providers from profiles: ``build_provider`` (one profile's provider) and
``ProviderRouter``, the Provider that picks a profile per call.

HTTP providers (httpx, Trio) are imported only when a profile needs one: reading a
configuration (`fanfold show`) imports neither (issue 36).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from fanfold.providers.base import CallContext, Provider, ProviderError
from fanfold.providers.settings import (
    ANTHROPIC_BASE_URL,
    OPENAI_BASE_URL,
    POOL_SIZE,
    Secret,
    valid_api_key,
)
from fanfold.statemachine import ErrorKind, ModelError, ModelReply, ModelRequest

# httpx, Trio and the HTTP providers are imported by the functions that need them,
# so that reading a configuration (`fanfold show`) imports none of them (issue 36).
if TYPE_CHECKING:
    import httpx

    from fanfold.providers.http1 import ConnectionPool
    from fanfold.providers.slots import CallSlots
from fanfold.providers.profiles import (
    Config,
    ConfigError,
    MissingApiKey,
    Profile,
)


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
