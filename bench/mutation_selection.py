"""The test files mutmut runs against the pure core's mutants, by a rule (tests/README.md,
"Mutation testing"): ``python bench/mutation_selection.py`` prints them,
``--check`` exits 1 when ``[tool.mutmut]`` in pyproject.toml lists others, ``--write``
rewrites that list.

The rule, on each ``tests/test_*.py`` (imports read with ``ast``, anywhere in the file):

1. it imports ``fanfold.statemachine`` or one of its modules;
2. it is a test file of the core: its name starts with one of ``CORE_PREFIXES`` (the
   reducer ``test_sm_``, its table ``test_transition_``, permissions and confinement
   ``test_permissions_``, forks' edits ``test_fork_``, the agents' rules
   ``test_agents_``), or it imports a module under ``fanfold/statemachine`` by its own
   name (``fanfold.statemachine.<module>``: a test written against that module);
3. it runs no layer above the reducer: it imports none of ``RUNNING_LAYERS`` (the
   runtime, the worker, replay, tracing, MCP, the servers, and the tests' helpers that
   drive them).
   Those tests reach the reducer through I/O; its rules are tested by the files above.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE_PREFIXES = ("test_sm_", "test_transition_", "test_permissions_", "test_fork_", "test_agents_")
RUNNING_LAYERS = (
    "fanfold.runtime",
    "fanfold.worker",
    "fanfold.replay",
    "fanfold.trace",
    "fanfold.mcp",
    "fanfold.serve",
    "runtime_helpers",
    "replay_helpers",
    "db_scenarios",
)
CORE = "fanfold.statemachine"


def imported_modules(source: str, *, members: bool) -> set[str]:
    """Every module a Python source names in an import, anywhere in it; with
    ``members``, ``from a.b import c`` gives ``a.b.c`` too (``c`` may be a module, as
    in ``from fanfold import replay``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
            if members:
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def core_modules(root: Path = ROOT) -> set[str]:
    """The dotted names of the modules under ``fanfold/statemachine``."""
    folder = root / "fanfold" / "statemachine"
    return {f"{CORE}.{path.stem}" for path in folder.glob("*.py") if path.stem != "__init__"}


def selected(name: str, source: str, modules: set[str]) -> bool:
    """Whether the test file ``name`` with this source is in the selection (the rule)."""
    imports = imported_modules(source, members=True)
    if not any(_under(module, CORE) for module in imports):
        return False
    # By name only: ``from fanfold.statemachine import transition`` is the function.
    by_name = imported_modules(source, members=False)
    own_test = name.startswith(CORE_PREFIXES) or bool(by_name & modules)
    runs_layers = any(_under(module, layer) for module in imports for layer in RUNNING_LAYERS)
    return own_test and not runs_layers


def selection(root: Path = ROOT) -> list[str]:
    """The selection, as paths relative to ``root``, sorted."""
    modules = core_modules(root)
    return sorted(
        f"tests/{path.name}"
        for path in (root / "tests").glob("test_*.py")
        if selected(path.name, path.read_text(encoding="utf-8"), modules)
    )


_LIST = re.compile(r"(?ms)^pytest_add_cli_args_test_selection = \[\n(.*?)^\]\n")


def listed(pyproject: str) -> list[str]:
    """The test files ``[tool.mutmut]`` lists in this pyproject.toml text."""
    found = _LIST.search(pyproject)
    if found is None:
        raise ValueError("pyproject.toml has no pytest_add_cli_args_test_selection list")
    return re.findall(r'"([^"]+)"', found.group(1))


def with_list(pyproject: str, files: list[str]) -> str:
    """The pyproject.toml text with ``files`` as the selection."""
    body = "".join(f'    "{name}",\n' for name in files)
    found = _LIST.search(pyproject)
    if found is None:
        raise ValueError("pyproject.toml has no pytest_add_cli_args_test_selection list")
    return pyproject[: found.start(1)] + body + pyproject[found.end(1) :]


def main(argv: list[str] | None = None) -> int:
    """Print, check or write the selection; 1 when ``--check`` finds a difference."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true")
    group.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    wanted = selection()
    path = ROOT / "pyproject.toml"
    text = path.read_text(encoding="utf-8")
    if args.write:
        path.write_text(with_list(text, wanted), encoding="utf-8")
    elif args.check:
        have = listed(text)
        missing = [name for name in wanted if name not in have]
        extra = [name for name in have if name not in wanted]
        for name in missing:
            print(f"missing from [tool.mutmut]: {name}")
        for name in extra:
            print(f"not in the rule's selection: {name}")
        return 1 if missing or extra else 0
    else:
        print("\n".join(wanted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
