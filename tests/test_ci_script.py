"""CI runs the README's test command as the README writes it, and installs nothing more.

On 6da5079 the README said ``pip install -e '.[test]'`` while ``.ci/run`` installed every
extra: CI passed, and a newcomer following the README collected 0 tests (two modules
imported psycopg at module level). These checks keep the two from drifting apart again.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Extras that are not the suite's: the benchmark's peers, the mutation run and the
# documentation site (built by .ci/run in a venv of its own).
# `docs` is in `dev`: CI builds the site in the README's venv.
NOT_TESTED_BY_THE_SUITE = {"bench", "mutation", "test", "dev"}


def _readme_test_command() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.rstrip().endswith("-m pytest")]
    assert len(lines) == 1, f"the README should give one test command, found {lines}"
    return lines[0].strip()


def test_ci_runs_the_readmes_test_command_verbatim() -> None:
    command = _readme_test_command()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert command in [line.strip() for line in ci], (
        f".ci/run must run the README's test command as written: {command!r}"
    )


def test_ci_installs_the_project_only_as_the_readme_says() -> None:
    """Every ``pip install`` of the project in .ci/run is the README's, the base-only
    check (``'.[test]'``, which installs less, never more); the documentation site is
    built in the README's venv (``dev`` holds ``docs``)."""
    command = _readme_test_command()
    readme_install = re.search(r"pip install (.+?) &&", command)
    assert readme_install is not None
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    installs = re.findall(r"pip install(?: --quiet)? (-e )?'(\.\[[^\]]*\])'", ci)
    targets = {target for _, target in installs}
    assert targets == {".[dev]", ".[test]"}, targets
    assert re.search(r"\.venv/bin/mkdocs build --strict", ci)
    assert "'.[dev]'" in readme_install.group(1)


def test_the_dev_extra_holds_every_extra_the_suite_tests() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    (dev,) = extras["dev"]
    match = re.fullmatch(r"fanfold\[([^\]]*)\]", dev)
    assert match is not None, dev
    in_dev = {name.strip() for name in match.group(1).split(",")}
    assert "test" in in_dev
    assert in_dev - {"test"} == set(extras) - NOT_TESTED_BY_THE_SUITE


def test_ci_builds_the_documentation_site_strictly() -> None:
    """`mkdocs build --strict` fails on a warning only when the warnings are logged:
    with `--quiet` a broken link passed (seen on the first draft of .ci/run)."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    (build,) = [line for line in ci if "mkdocs build" in line and not line.startswith("#")]
    assert "--strict" in build.split()
    assert not {"--quiet", "-q"} & set(build.split())
