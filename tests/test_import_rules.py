"""The pure core does no I/O, reads no clock and draws no randomness: its modules import
nothing that could, and importing it loads none of the runtime's libraries."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import fanfold.statemachine

PACKAGE = Path(fanfold.statemachine.__file__).parent
MODULES = sorted(PACKAGE.glob("*.py"))

FORBIDDEN = {
    # named by the design
    "trio",
    "httpx",
    "sqlite_utils",
    "structlog",
    "time",
    "random",
    "uuid",
    "os",
    "socket",
    "subprocess",
    "asyncio",
    "threading",
    "datetime",
    # the same hazards under other names
    "secrets",
    "pathlib",
    "io",
    "shutil",
    "tempfile",
    "sqlite3",
    "logging",
    "signal",
    "select",
    "multiprocessing",
    "concurrent",
    "urllib",
    "http",
    "importlib",
    "hypothesis",
}
# Everything the core may import: attrs, itself, and side-effect-free standard modules.
ALLOWED = {
    "__future__",
    "attrs",
    "enum",
    "hashlib",
    "json",
    "math",
    "re",  # regular expressions: pure (messages.may_hold_non_finite scans with one)
    "functools",  # pure: cached_property keeps a tool call's decoded arguments (messages.ToolCall)
    "typing",
    "sys",
    "types",  # the package's module class (its lazily imported reducer functions)
    "collections",
    "itertools",  # pure: Roster.as_tuple flattens its chunks in C
    "operator",  # pure: Roster.as_tuple's hole filter
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in ``path``; relative imports are resolved."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append((node.lineno, "fanfold.statemachine." + (node.module or "")))
            else:
                assert node.module is not None
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id != "__import__", f"{path.name}:{node.lineno} imports dynamically"
    return found


def test_the_scan_sees_every_module() -> None:
    names = {p.stem for p in MODULES}
    assert {"__init__", "transition", "state", "events", "effects", "phases"} <= names
    assert any(module == "attrs" for _, module in _imports(PACKAGE / "transition.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_statemachine_module_imports_io_clock_or_randomness(path: Path) -> None:
    for line, module in _imports(path):
        top = module.split(".")[0]
        where = f"{path.name}:{line} imports {module}"
        assert top not in FORBIDDEN, where
        if top == "fanfold":
            assert module.startswith("fanfold.statemachine"), where
        else:
            assert top in ALLOWED, where + " (not on the list of pure modules)"


def test_importing_the_core_loads_no_runtime_library() -> None:
    code = (
        "import sys, fanfold.statemachine\n"
        "roots = {m.split('.')[0] for m in sys.modules}\n"
        "bad = roots & {'trio', 'httpx', 'sqlite_utils', 'structlog', 'hypothesis', 'anyio'}\n"
        "bad |= {m for m in sys.modules if m.startswith('fanfold.') and\n"
        "        not m.startswith('fanfold.statemachine')}\n"
        "print(','.join(sorted(bad)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "", f"import fanfold.statemachine loaded: {done.stdout}"


def test_fanfold_testing_is_where_hypothesis_lives() -> None:
    code = "import sys, fanfold.testing; print('hypothesis' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "True"


def test_the_scan_catches_a_forbidden_import(tmp_path: Path) -> None:
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("from os import environ\nimport time as clock\nfrom . import state\n")
    assert _imports(sneaky) == [(1, "os"), (2, "time"), (3, "fanfold.statemachine.")]
