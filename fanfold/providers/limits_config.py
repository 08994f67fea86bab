"""Limits from the user's words: ``--limit KEY=VALUE`` and a TOML or JSON file of them
(``fanfold fork --limit``/``--limits``), checked like configuration values.

Each setting names a field of ``Limits``; its value must be of the field's kind and
within bounds far above any real use, like the provider configuration's numbers
(``MAX_ATTEMPTS``, ``MAX_RETRY_SECONDS``...): NaN, infinity, ``1e308`` and bools are
refused with one line naming the setting (``ConfigError``), never stored in a log.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from fanfold.providers.config_files import _read_bytes, load_toml
from fanfold.providers.profiles import (
    MAX_ATTEMPTS,
    MAX_RETRY_SECONDS,
    MAX_TIMEOUT_SECONDS,
    ConfigError,
    _number,
)
from fanfold.statemachine import Limits
from fanfold.statemachine.limits import CONTEXT_MODES

MAX_ROUNDS = 10_000
"""``max_rounds``, ``max_concurrent`` and ``max_tasks_per_call``: far above any run."""
MAX_DEPTH = 100
"""``max_depth``: levels of sub-agents below the root."""
MAX_RESULT_CHARS = 100_000_000
"""``child_result_cap``: characters of a child's result in its parent's fan-in."""
MAX_TOKEN_BUDGET = 10**12
"""``max_tokens``: a conversation's token budget."""


def _count(minimum: int, maximum: int) -> Callable[[Any, str, str], int]:
    def check(value: Any, path: str, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"must be an integer, got {value!r}", path=path, key=key)
        if not minimum <= value <= maximum:
            raise ConfigError(
                f"must be from {minimum} to {maximum}, got {value!r}", path=path, key=key
            )
        return value

    return check


def _seconds(maximum: float, *, zero: bool) -> Callable[[Any, str, str], float]:
    def check(value: Any, path: str, key: str) -> float:
        return _number(value, path, key, minimum=0, inclusive=zero, maximum=maximum)

    return check


def _or_none(check: Callable[[Any, str, str], Any]) -> Callable[[Any, str, str], Any]:
    def optional(value: Any, path: str, key: str) -> Any:
        # TOML has no null: "none" says "no limit" there (and anywhere).
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
        return check(value, path, key)

    return optional


def _modes(value: Any, path: str, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",")]
    if not isinstance(value, list | tuple) or not all(isinstance(m, str) for m in value):
        raise ConfigError("must be a list of context modes", path=path, key=key)
    modes = tuple(value)
    if (
        "task_only" not in modes
        or not set(modes) <= set(CONTEXT_MODES)
        or len(set(modes)) < len(modes)
    ):
        raise ConfigError(
            f"must list task_only and any of full, summary once each, got {list(modes)!r}",
            path=path,
            key=key,
        )
    return modes


_CHECKS: dict[str, Callable[[Any, str, str], Any]] = {
    "max_rounds": _count(1, MAX_ROUNDS),
    "max_attempts": _count(1, MAX_ATTEMPTS),
    "retry_base": _seconds(MAX_RETRY_SECONDS, zero=True),
    "retry_cap": _seconds(MAX_RETRY_SECONDS, zero=True),
    "max_concurrent": _count(1, MAX_ROUNDS),
    "max_tasks_per_call": _count(1, MAX_ROUNDS),
    "max_depth": _count(0, MAX_DEPTH),
    "child_timeout": _or_none(_seconds(MAX_TIMEOUT_SECONDS, zero=False)),
    "cancel_grace": _seconds(MAX_TIMEOUT_SECONDS, zero=True),
    "child_result_cap": _count(1, MAX_RESULT_CHARS),
    "max_tokens": _or_none(_count(1, MAX_TOKEN_BUDGET)),
    "context_modes": _modes,
    # Issue 35: how long a call waits for a person's decision (none: for ever).
    "approval_timeout": _or_none(_seconds(365 * 86_400, zero=False)),
}
# Every field of Limits has its check, and nothing else does (a new field must be
# given one before it can be edited).
assert set(_CHECKS) == {field.name for field in attrs.fields(Limits)}

LIMIT_NAMES = tuple(_CHECKS)
"""The settings ``--limit`` takes: the fields of ``Limits``."""


def limits_with(base: Limits, settings: Mapping[str, Any], *, source: str) -> Limits:
    """``base`` with ``settings`` (a field of ``Limits`` -> its value, as TOML or JSON
    gives it; None is "no limit" where a field allows it) in place, each value
    checked (see the module); raises ConfigError naming ``source`` and the setting."""
    changes: dict[str, Any] = {}
    for key, value in settings.items():
        check = _CHECKS.get(key)
        if check is None:
            raise ConfigError(
                f"unknown limit (the limits are {', '.join(LIMIT_NAMES)})", path=source, key=key
            )
        changes[key] = check(value, source, key)
    try:
        return attrs.evolve(base, **changes)
    except (TypeError, ValueError) as exc:  # pragma: no cover - the checks above are stricter
        raise ConfigError(str(exc), path=source) from None


def limit_setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--limit``: the value read as a TOML value (``10``, ``0.5``,
    ``["task_only", "full"]``), ``none`` for no limit, or else as it is written
    (``task_only,full``). Raises ConfigError for text without ``=``."""
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key:
        raise ConfigError(f"--limit takes KEY=VALUE (a limit: {', '.join(LIMIT_NAMES)})")
    if raw.lower() in ("none", "null"):
        return key, None
    try:
        parsed = tomllib.loads(f"value = {raw}")
    except tomllib.TOMLDecodeError:
        return key, raw
    if set(parsed) != {"value"}:
        return key, raw
    return key, parsed["value"]


def read_limits_file(path: Path) -> dict[str, Any]:
    """The settings of a limits file: a TOML table, or for a ``.json`` file a JSON
    object, of ``Limits`` fields ("no limit": ``"none"``, or JSON's ``null``). Read
    like a configuration file (a regular file, bounded in size and nesting); raises
    ConfigError."""
    data = _read_bytes(path)
    if path.suffix.lower() != ".json":
        return load_toml(data, path)
    try:
        loaded = json.loads(data.decode("utf-8"))  # NaN, Infinity: refused by the checks
    except UnicodeDecodeError:
        raise ConfigError("not UTF-8 text", path=str(path)) from None
    except RecursionError:
        raise ConfigError("invalid JSON: nested too deeply", path=str(path)) from None
    except ValueError as exc:
        raise ConfigError(f"invalid JSON: {exc}", path=str(path)) from None
    if not isinstance(loaded, dict):
        raise ConfigError("must be a JSON object of limits", path=str(path))
    return loaded
