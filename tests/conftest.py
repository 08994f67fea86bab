"""Hypothesis profiles for the whole suite.

- ``default``: 100 examples per property, for an ordinary local run;
- ``ci``: 300 examples, loaded whenever ``CI`` is set (the state-machine tests stay
  well under a minute on two cores);
- ``dev``: 20 examples, for quick iterations (``HYPOTHESIS_PROFILE=dev``);
- ``mutation``: 100 examples, derandomized and without the example database, for the
  mutation run (``HYPOTHESIS_PROFILE=mutation``, see DESIGN.md "Mutation testing"):
  a mutant is killed or not by the same examples every time.

``deadline=None`` everywhere: one example walks a conversation through dozens of
reducer steps and checks every invariant after each, so its run time is legitimately
tens of milliseconds and varies with the machine; a deadline would only make CI flaky.
No health check is suppressed here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("default", max_examples=100, deadline=None)
settings.register_profile("ci", max_examples=300, deadline=None, print_blob=True)
settings.register_profile("dev", max_examples=20, deadline=None)
settings.register_profile(
    "mutation", max_examples=100, deadline=None, derandomize=True, database=None
)
settings.load_profile(
    "ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "default")
)


@pytest.fixture(autouse=True)
def provenance_key(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every test's runtimes, forks and CLI processes (which inherit the environment)
    mark and check trees with a key file of the test session, never the user's own."""
    path = tmp_path_factory.getbasetemp() / "provenance.key"
    monkeypatch.setenv("FANFOLD_KEY_FILE", str(path))
    return path


@pytest.fixture(autouse=True)
def trust_record(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test trusts project configuration files in a record of its own
    (``$FANFOLD_TRUST_FILE``), never the user's ~/.config/fanfold/trusted.json."""
    path = tmp_path_factory.mktemp("trust") / "trusted.json"
    monkeypatch.setenv("FANFOLD_TRUST_FILE", str(path))
    return path
