"""fanfold's packages stand in layers and every import runs one way: down (issue 37, "The
house"). A module imports its own package or one on a lower layer, never one beside it
or above it; lazy imports inside functions and ``TYPE_CHECKING`` imports count too, so
an upward arrow cannot hide in a function body. DESIGN.md's packages table lists the
same layers."""

from __future__ import annotations

import ast
from pathlib import Path

import fanfold

ROOT = Path(fanfold.__file__).parent

# Bottom to top. A new package or top-level module must be placed here.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("statemachine", "regular_files", "loopback", "logger", "examples"),
    ("trust", "tools", "db", "agents", "testing"),
    ("providers", "replay"),
    ("mcp", "otel", "trace"),
    ("runtime",),
    ("worker", "serve"),
    ("cli",),
)


def parts(root: Path) -> set[str]:
    """The packages and top-level modules of the tree at ``root`` (its ``__init__.py``,
    the package's face, aside)."""
    found = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    found |= {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    return found


def _part_of(module: str, known: set[str]) -> str | None:
    """The part of fanfold that a dotted module name lies in, if it names one."""
    pieces = module.split(".")
    if pieces[0] != "fanfold" or len(pieces) < 2 or pieces[1] not in known:
        return None
    return pieces[1]


def imports_between_parts(root: Path) -> list[tuple[str, str, str]]:
    """(part, imported part, where) for every import of one part of the tree at ``root``
    by another: anywhere in a module (a function's body included); ``from fanfold
    import replay`` names the part ``replay``."""
    known = parts(root)
    found: list[tuple[str, str, str]] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] == "__init__.py":
            continue
        me = rel.parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
                if _part_of(node.module, known) is None:  # from fanfold import replay
                    names = [f"{node.module}.{a.name}" for a in node.names]
            else:  # a relative import: fanfold uses none
                found.append((me, "?", f"{rel}:{node.lineno} (a relative import)"))
            for name in names:
                other = _part_of(name, known)
                if other is not None and other != me:
                    found.append((me, other, f"{rel}:{node.lineno} imports {name}"))
    return found


def wrong_way(
    root: Path,
    layers: tuple[tuple[str, ...], ...],
    imports: list[tuple[str, str, str]] | None = None,
) -> list[str]:
    """Each import (of ``imports``, or those read from ``root``) that runs up a layer or
    across one (to a part beside it)."""
    layer = {part: n for n, names in enumerate(layers) for part in names}
    wrong = []
    for me, other, where in imports if imports is not None else imports_between_parts(root):
        if other == "?" or layer.get(other, len(layers)) >= layer.get(me, -1):
            wrong.append(
                f"{where}: {me} (layer {layer.get(me)}) -> {other} (layer {layer.get(other)})"
            )
    return sorted(set(wrong))


def test_every_part_of_fanfold_is_on_one_layer() -> None:
    placed = [part for names in LAYERS for part in names]
    assert len(placed) == len(set(placed))
    assert set(placed) == parts(ROOT)


def test_every_import_runs_down_the_layers() -> None:
    imports = imports_between_parts(ROOT)
    assert wrong_way(ROOT, LAYERS, imports) == []
    # The scan sees the arrows it should: the runtime uses the log and the MCP client.
    seen = {(me, other) for me, other, _ in imports}
    assert {("runtime", "db"), ("runtime", "mcp"), ("serve", "runtime")} <= seen


def test_the_scan_finds_an_import_up_or_across(tmp_path: Path) -> None:
    root = tmp_path / "fanfold"
    for package in ("core", "low", "mid", "side", "top"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "__init__.py").write_text("from fanfold.top import x\n")  # the face: not scanned
    (root / "low" / "a.py").write_text(
        "from fanfold.core import x\n"
        "def f():\n"
        "    from fanfold.top.server import Server  # lazy, and still up\n"
    )
    (root / "mid" / "b.py").write_text("from fanfold import side, low\nimport fanfold.core.y\n")
    (root / "top" / "c.py").write_text("from fanfold import mid\nimport json\n")
    layers = (("core",), ("low",), ("mid", "side"), ("top",))
    assert wrong_way(root, layers) == [
        "low/a.py:3 imports fanfold.top.server: low (layer 1) -> top (layer 3)",
        "mid/b.py:1 imports fanfold.side: mid (layer 2) -> side (layer 2)",
    ]
    # A part on no layer is reported too.
    assert wrong_way(root, (("core",), ("low",), ("mid",), ("top",))) != []


def test_the_testing_package_imports_only_the_modules_before_it() -> None:
    # fanfold.testing's docstring promises it: generators, then the state's invariants,
    # the sub-agents' step checks, the step checks, the table.
    order = ("strategies", "invariants", "delegation", "checks", "table")
    assert {p.stem for p in (ROOT / "testing").glob("*.py")} == {"__init__", *order}
    wrong = []
    for n, name in enumerate(order):
        path = ROOT / "testing" / f"{name}.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "fanfold.testing."
            ):
                other = (node.module or "").split(".")[2]
                if other not in order[:n]:
                    wrong.append(f"{name}.py:{node.lineno} imports {node.module}")
    assert wrong == []
