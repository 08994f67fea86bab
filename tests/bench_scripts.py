"""A script of ``bench/`` loaded as a module, for the tests of its detectors and
workloads (bench/ is not a package: its scripts run as files)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).parent.parent / "bench"


def load_bench(name: str) -> ModuleType:
    """``bench/NAME.py`` as a module named ``NAME``."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
