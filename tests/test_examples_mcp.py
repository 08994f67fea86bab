"""examples/mcp_tools runs offline: a sub-agent calls a tool of a local MCP server
(a real subprocess) and a Python function tool; the tree replays identically with
neither."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from fanfold.db import Store
from fanfold.replay.verify import verify
from fanfold.statemachine import ToolResultMessage

EXAMPLE = Path(__file__).parent.parent / "examples" / "mcp_tools" / "mcp_example.py"

pytestmark = pytest.mark.slow


async def test_the_mcp_example_runs_offline(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("mcp_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    database = tmp_path / "mcp.db"
    root = await module.main(str(database))
    with Store.open(database) as store:
        child = store.load_state(root + ".1")
        results = [m.result for m in child.history if isinstance(m, ToolResultMessage)]
        assert [(r.name, r.content, r.is_error) for r in results[:2]] == [
            ("mcp__weather__forecast", "Lyon: 18 °C tomorrow", False),
            ("to_fahrenheit", "64.4 °F", False),
        ]
        assert store.last_turn(root).text == "Lyon: 18 °C tomorrow, that is 64.4 °F."  # type: ignore[union-attr]
        # Replay needs neither the server nor the function: the hub is closed.
        assert verify(store, root, tree=True).ok
