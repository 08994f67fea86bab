"""Every real number on the command line is finite: click's FloatRange lets ``nan``
through (no comparison with it is true) and an unbounded range lets ``inf`` through;
``wait --timeout nan`` waited for ever, ``worker --lease nan`` would renew never."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from fanfold.cli import cli


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--timeout", "nan", "task"],
        ["wait", "x", "--timeout", "nan"],
        ["wait", "x", "--timeout", "inf"],
        ["worker", "--lease", "nan"],
        ["worker", "--lease", "inf"],
        ["worker", "--poll", "nan"],
        ["ui", "--poll", "nan"],
    ],
)
def test_nan_and_infinities_are_refused_naming_the_option(tmp_path: Path, args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, "--db", str(tmp_path / "x.db")])
    assert result.exit_code == 2, result.output
    assert f"'{args[-2] if args[-1] != 'task' else args[-3]}'" in result.output
    assert "finite" in result.output
    assert not (tmp_path / "x.db").exists()
