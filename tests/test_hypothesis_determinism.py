"""The mutation profile generates the same examples whatever the process imported
first (issue 26): a derandomized property test run alone in a fresh process, and run
after collecting the whole mutation selection the way mutmut's runner does (which
imports ``fanfold.cli`` and every selected test module), must see the same examples.
Before the fix, Hypothesis' pool of constants scanned from the imported modules made
them differ from about the thirtieth example on, so a mutant could be killed in one
process and survive in the other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A property test that draws strings and JSON (where the scanned constants showed up)
# and is quick: one parameter of it, so the check stays well under a minute.
TEST = "tests/test_sm_hardening.py::test_a_tool_call_holding_a_non_finite_number_is_refused"
SELECT = "test_a_tool_call_holding_a_non_finite_number_is_refused and bash"


def _selection() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    files: list[str] = config["tool"]["mutmut"]["pytest_add_cli_args_test_selection"]
    return files


def _start(files: list[str], digest: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "HYPOTHESIS_PROFILE": "mutation",
        "FANFOLD_EXAMPLES_DIGEST": str(digest),
    }
    env.pop("CI", None)  # CI would load the ci profile instead
    command = [sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider"]
    return subprocess.Popen(
        [*command, *files, "-k", SELECT],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_the_mutation_profile_generates_the_same_examples_after_any_imports(
    tmp_path: Path,
) -> None:
    alone, collected = tmp_path / "alone.json", tmp_path / "collected.json"
    runs = [_start([TEST.split("::")[0]], alone), _start(_selection(), collected)]
    for run in runs:
        output, _ = run.communicate()
        assert run.returncode == 0, output.decode(errors="replace")
    first, second = json.loads(alone.read_text()), json.loads(collected.read_text())
    assert list(first) == [f"{TEST}[bash]"]
    assert first[f"{TEST}[bash]"][0] >= 100  # every example was recorded
    assert first == second
