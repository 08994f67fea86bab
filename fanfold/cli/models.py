"""The model a command runs on: ``--script``, ``--config``, ``--profile``, ``--model``,
or the provider configuration recorded for a tree."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from fanfold.cli.errors import CliError
from fanfold.cli.options import model_options as model_options
from fanfold.cli.recorded import recorded_config as recorded_config
from fanfold.examples import CODE_REVIEW_SCRIPT
from fanfold.providers.base import CallContext, Provider, ProviderError
from fanfold.providers.config import Config, ProviderRouter, RetryPolicy, load_config
from fanfold.providers.description import (
    CONFIG,
    SCRIPT,
    DescriptionError,
    FileDigest,
    ProviderDescription,
)
from fanfold.providers.scripted import ScriptedProvider
from fanfold.statemachine import ErrorKind, ModelError, ModelReply, ModelRequest
from fanfold.tools.registry import ToolSet
from fanfold.tools.secrets import EnvPolicy, Redactor

DEFAULT_SCRIPT = CODE_REVIEW_SCRIPT


@attrs.frozen
class ModelChoice:
    """The provider the options chose, how to describe it (to the user, and in the
    log: ``recorded``), and its retry policy."""

    provider: Provider
    description: str
    recorded: ProviderDescription
    retry: RetryPolicy = RetryPolicy()
    env_policy: EnvPolicy = EnvPolicy()
    system_prompt: str = ""
    web_domains: tuple[str, ...] = ()
    model_aliases: tuple[tuple[str, str], ...] = ()
    ask: tuple[str, ...] = ()
    """``[permissions] ask`` of the configuration (issue 35)."""
    approval_timeout: float | None = None
    """``[permissions] approval_timeout`` of the configuration."""

    def tools(self, extra: Iterable[Any] = ()) -> ToolSet:
        """The tool set, bash commands' environments under ``env_policy``, web_fetch
        from ``web_domains`` (none: no web_fetch); ``extra`` (MCP servers' tools)
        beside them."""
        return ToolSet.default(
            env_policy=self.env_policy, web_domains=self.web_domains, extra=extra
        )

    def redactor(self) -> Redactor:
        """What to redact from the log: the values of this process's secrets."""
        return self.env_policy.redactor(os.environ)

    async def aclose(self) -> None:
        close = getattr(self.provider, "aclose", None)
        if close is not None:
            await close()


def choose_model(
    script: Path | None,
    config_path: Path | None,
    profile: str | None,
    model: str | None,
    cwd: Path | None = None,
) -> ModelChoice:
    """The model a command runs: ``--script``'s, or the configuration's
    (``config_path``, else ``$FANFOLD_CONFIG``, the ``fanfold.toml`` of ``cwd`` (the
    run's folder, default the process's), the user's own file).

    A ``--script`` run takes everything of that configuration but its model profiles:
    retries, the system prompt, ``[model_aliases]``, ``[tools.web_fetch]`` domains,
    ``[tools.bash] pass_env`` (and, through the caller, its MCP servers), as
    ``fanfold agents`` and ``fanfold tools`` show them in effect."""
    if script is not None:
        if profile or model:
            raise CliError(
                "--script runs offline: it cannot be combined with --profile or --model "
                "(they choose a model)"
            )
        provider = ScriptedProvider.from_file(script)
        config = load_config(config_path, cwd=cwd)
        from_file = config.source not in ("built-in", "environment")
        # The settings' file is recorded beside the script (its sha256 too): a resume
        # rebuilds the same settings from it (``rebuilt_choice``), servers included.
        recorded = ProviderDescription(
            SCRIPT,
            script=FileDigest.of(script),
            config=FileDigest.of(config.source) if from_file else None,
        )
        return _scripted_choice(provider, script, config, recorded)
    config = load_config(config_path, cwd=cwd).with_overrides(
        profile=profile, model=model, origin="--profile/--model"
    )
    return _model_choice(config, model, DEFAULT_SCRIPT)


def _scripted_choice(
    provider: Provider, script: Path, config: Config, recorded: ProviderDescription
) -> ModelChoice:
    """A ``--script`` run's choice: the script's replies with everything of ``config``
    but its model profiles (``choose_model``)."""
    settings = "" if config.source in ("built-in", "environment") else config.source
    return ModelChoice(
        provider,
        f"scripted ({script})" + (f"; settings of {settings}" if settings else ""),
        recorded,
        config.retry,  # the file's [retry]; a profile's own retry is the profile's
        # Its profiles' key variables stay hidden from bash, as in a run on them.
        EnvPolicy(frozenset(config.key_variables()), frozenset(config.pass_env)),
        config.system_prompt,
        config.web_domains,
        config.model_aliases,
        config.ask,
        config.approval_timeout,
    )


def _model_choice(config: Config, model: str | None, demo_script: Path) -> ModelChoice:
    """The choice made by ``config`` (profiles, the demo script for scripted ones)."""
    demo = ScriptedProvider.from_file(demo_script)
    chosen = config.default_profile()
    if chosen.provider == "scripted" and model is not None:
        raise CliError(
            f"--model {model}: no model provider is configured; write a config file "
            "(see examples/fanfold.toml) or set FANFOLD_BASE_URL and FANFOLD_PROVIDER"
        )
    if chosen.provider == "scripted":
        what = "scripted (built-in demo script; configure a model: see examples/fanfold.toml)"
    else:
        what = f"{chosen.name}: {chosen.provider} {chosen.model} ({config.source})"
    from_file = config.source not in ("built-in", "environment")
    scripted = any(p.provider == "scripted" for p in config.profiles)
    recorded = ProviderDescription(
        CONFIG,
        script=FileDigest.of(demo_script) if scripted else None,
        config=FileDigest.of(config.source) if from_file else None,
        profile=config.default,
        sub_agents=config.sub_agent_profile().name,
        model=chosen.model,
    )
    env_policy = EnvPolicy(frozenset(config.key_variables()), frozenset(config.pass_env))
    return ModelChoice(
        ProviderRouter(config, scripted=demo),
        what,
        recorded,
        config.retry_policy(),
        env_policy,
        config.system_prompt,
        config.web_domains,
        config.model_aliases,
        config.ask,
        config.approval_timeout,
    )


def rebuilt_choice(recorded: ProviderDescription) -> ModelChoice:
    """The provider a tree ran on, rebuilt from its recorded description. Raises
    DescriptionError if a file it was built from is missing or changed, ConfigError or
    ScriptError if it no longer loads, each naming what differs."""
    problems = recorded.problems()
    if problems:
        raise DescriptionError("; ".join(problems))
    if recorded.kind == SCRIPT:
        assert recorded.script is not None
        path = recorded.script.local_path()
        if recorded.config is None:
            # Recorded without settings (none were found, or by a fanfold that did
            # not record them): the script alone, as before.
            return ModelChoice(ScriptedProvider.from_file(path), f"scripted ({path})", recorded)
        # The settings it ran with (``run --script ... --config F``), as ``run`` used
        # them: the file's retries, prompt, aliases, web_fetch domains, pass_env.
        config = load_config(recorded.config.local_path())
        return _scripted_choice(ScriptedProvider.from_file(path), path, config, recorded)
    config = load_config(recorded.config.local_path() if recorded.config else None)
    found = config.source not in ("built-in", "environment")
    if recorded.config is None and found:
        raise DescriptionError(f"it ran without a config file, and {config.source} is found now")
    config = config.with_overrides(
        profile=recorded.profile,
        sub_agents=recorded.sub_agents,
        model=recorded.model,
        origin="the recorded profiles",
    )
    demo = recorded.script.local_path() if recorded.script is not None else DEFAULT_SCRIPT
    choice = _model_choice(config, None, demo)
    if choice.recorded != recorded:
        raise DescriptionError(
            f"the configuration resolves to {choice.recorded.summary()} now, not "
            f"{recorded.summary()} as recorded"
        )
    return choice


class ProviderPerTree:
    """A Provider that sends each call to the provider of its tree (``resume`` of trees
    recorded with different configurations). A call of a tree it has none for is a
    fanfold bug: it fails as ``provider_failure``."""

    def __init__(self) -> None:
        self.by_root: dict[str, Provider] = {}

    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply:
        provider = self.by_root.get(context.root_id)
        if provider is None:
            raise ProviderError(
                ModelError(ErrorKind.PROVIDER_FAILURE, f"no provider for tree {context.root_id!r}")
            )
        return await provider.complete(request, context)
