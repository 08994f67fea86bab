"""The configuration a tree recorded, read for its profiles' prices (`fanfold show`,
`export --otel`): the configuration's parser only, without the HTTP providers, httpx or
Trio (issue 36). ``fanfold.cli.models`` re-exports ``recorded_config``."""

from __future__ import annotations

from fanfold.providers.config import Config, ConfigError, load_config
from fanfold.providers.description import CONFIG, DescriptionError, ProviderDescription


def recorded_config(recorded: str | None) -> Config | None:
    """The configuration a tree ran on, from its recorded provider description (JSON),
    for reading its profiles (prices): None for a scripted tree, or when the recorded
    config file is gone or changed (its profiles may no longer be the ones used)."""
    if recorded is None:
        return None
    try:
        description = ProviderDescription.from_json(recorded)
        if description.kind != CONFIG or description.problems():
            return None
        path = description.config.local_path() if description.config else None
        return load_config(path).with_overrides(
            profile=description.profile,
            sub_agents=description.sub_agents,
            model=description.model,
            origin="the recorded profiles",
        )
    except (DescriptionError, ConfigError, OSError):
        return None
