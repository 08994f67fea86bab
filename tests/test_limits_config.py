"""Limits from the user's words (``fanfold fork --limit``/``--limits``): each value of
the field's kind, finite and bounded, or a one-line ConfigError naming it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from fanfold.providers.config import ConfigError
from fanfold.providers.limits_config import limit_setting, limits_with, read_limits_file
from fanfold.statemachine import Limits


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max_rounds=10", ("max_rounds", 10)),
        (" retry_cap = 0.5 ", ("retry_cap", 0.5)),
        ("child_timeout=none", ("child_timeout", None)),
        ("max_tokens=NULL", ("max_tokens", None)),
        ('context_modes=["task_only", "full"]', ("context_modes", ["task_only", "full"])),
        ("context_modes=task_only,full", ("context_modes", "task_only,full")),
        ("max_rounds=10\nmax_depth=3", ("max_rounds", "10\nmax_depth=3")),  # one value only
    ],
)
def test_a_setting_reads_its_value_as_toml(text: str, expected: tuple[str, Any]) -> None:
    assert limit_setting(text) == expected


@pytest.mark.parametrize("text", ["max_rounds", "=3", ""])
def test_a_setting_without_key_and_value_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--limit takes KEY=VALUE"):
        limit_setting(text)


def test_settings_replace_fields_of_the_base() -> None:
    base = Limits(max_rounds=5, max_tokens=100)
    settings = {"max_rounds": 7, "child_timeout": "none", "context_modes": "task_only, summary"}
    limits = limits_with(base, settings, source="--limit")
    assert (limits.max_rounds, limits.child_timeout) == (7, None)
    assert limits.context_modes == ("task_only", "summary")
    assert limits.max_tokens == 100  # what is not set stays
    assert limits_with(base, {"retry_cap": 3}, source="x").retry_cap == 3.0  # an int: seconds


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_rounds": float("nan")}, "max_rounds: must be an integer, got nan"),
        ({"max_rounds": True}, "max_rounds: must be an integer, got True"),
        ({"max_rounds": 0}, "max_rounds: must be from 1 to 10000, got 0"),
        ({"max_rounds": 10**30}, "max_rounds: must be from 1 to 10000"),
        ({"retry_cap": float("inf")}, "retry_cap: must be a finite number, got inf"),
        ({"retry_cap": 1e308}, "retry_cap: must be <= 3600"),
        ({"retry_base": -1}, "retry_base: must be >= 0"),
        ({"child_timeout": 0}, "child_timeout: must be > 0"),
        ({"max_tokens": 0}, "max_tokens: must be from 1 to"),
        ({"max_depth": 101}, "max_depth: must be from 0 to 100"),
        ({"context_modes": ["full"]}, "context_modes: must list task_only"),
        ({"context_modes": 3}, "context_modes: must be a list of context modes"),
        ({"max_turns": 10}, "max_turns: unknown limit (the limits are max_rounds, "),
    ],
)
def test_a_bad_value_is_one_line_naming_it(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        limits_with(Limits(), settings, source="--limit")
    text = str(refused.value)
    assert "\n" not in text and text.startswith("--limit: ")
    assert message in text


def test_files_are_toml_tables_or_json_objects(tmp_path: Path) -> None:
    toml = tmp_path / "limits.toml"
    toml.write_text('max_rounds = 3\nchild_timeout = "none"\n')
    assert read_limits_file(toml) == {"max_rounds": 3, "child_timeout": "none"}
    as_json = tmp_path / "limits.JSON"
    as_json.write_text('{"max_rounds": 3, "max_tokens": null}')
    assert read_limits_file(as_json) == {"max_rounds": 3, "max_tokens": None}


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("l.json", "[1, 2]", "must be a JSON object of limits"),
        ("l.json", "{", "invalid JSON"),
        ("l.json", "[" * 100_000, "invalid JSON"),
        ("l.json", b"\xff", "not UTF-8 text"),
        ("l.toml", "max_rounds = ", "invalid TOML"),
        ("l.toml", "a = " + "[" * 100_000, "invalid TOML"),
    ],
)
def test_a_bad_file_is_one_line(
    tmp_path: Path, name: str, content: str | bytes, message: str
) -> None:
    file = tmp_path / name
    if isinstance(content, bytes):
        file.write_bytes(content)
    else:
        file.write_text(content)
    with pytest.raises(ConfigError, match=message) as refused:
        read_limits_file(file)
    assert "\n" not in str(refused.value)


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "limits.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError):
        read_limits_file(fifo)
