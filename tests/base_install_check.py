"""The suite in a venv with only the ``test`` extra: it must collect and pass, skipping
(saying so) every test of an optional part that is not installed.

Run by ``.ci/run`` in a venv of its own (``pip install -e '.[test]'``), before the README's
test command runs the whole suite with every extra (``.[dev]``). On 6da5079 this venv
collected 0 tests (two modules imported psycopg at module level) and the PostgreSQL
fixture gave errors instead of skips, while CI, which installed every extra, never saw it.

    .venv-base/bin/python tests/base_install_check.py [pytest options]

Exit status: pytest's, or 3 when an optional part is installed (then this is not the
check it claims to be) or when nothing was skipped (the optional tests were not reached).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

# The top-level modules of the optional extras (pyproject.toml): none may be importable.
OPTIONAL = {
    "hypercorn": "ui, mcp",
    "opentelemetry": "otel",
    "playwright": "browser",
    "mcp": "mcp",
    "mcp_server_time": "test-mcp-published",
    "dbos": "postgres",
    "psycopg": "postgres",
}


class _Count:
    """Counts the tests skipped."""

    def __init__(self) -> None:
        self.skipped = 0

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped:
            self.skipped += 1

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        # A module skipped whole (``pytest.importorskip`` at its top) is skipped here.
        if report.skipped:
            self.skipped += 1


def main(argv: list[str]) -> int:
    present = sorted(name for name in OPTIONAL if importlib.util.find_spec(name) is not None)
    if present:
        print(
            "base_install_check: these optional modules are installed, so this venv is not "
            f"the base one: {', '.join(f'{n} ({OPTIONAL[n]})' for n in present)}",
            file=sys.stderr,
        )
        return 3
    root = Path(__file__).resolve().parent.parent
    count = _Count()
    args = ["-p", "no:cacheprovider", "-rs", str(root / "tests"), *argv]
    status = int(pytest.main(args, plugins=[count]))
    if status == 0 and count.skipped == 0:
        print(
            "base_install_check: no test was skipped: the optional parts were not reached",
            file=sys.stderr,
        )
        return 3
    print(
        f"base_install_check: pytest exit {status},"
        f" {count.skipped} skipped without the optional extras"
    )
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
