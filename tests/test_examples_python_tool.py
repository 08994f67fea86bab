"""examples/python_tool runs offline: a sub-agent calls a Python function tool (and
grep), and the tree replays identically without the function."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fanfold.db import Store
from fanfold.replay.verify import verify
from fanfold.statemachine import ToolResultMessage

EXAMPLE = Path(__file__).parent.parent / "examples" / "python_tool" / "tools_example.py"


async def test_the_python_tool_example_runs_offline(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("tools_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    database = tmp_path / "tools.db"
    root = await module.main(str(database))
    with Store.open(database) as store:
        child = store.load_state(root + ".1")
        results = [m.result for m in child.history if isinstance(m, ToolResultMessage)]
        assert [(r.name, r.content, r.is_error) for r in results[:2]] == [
            ("lookup_issue", "#23 Open the tool world (open)", False),
            ("lookup_issue", "lookup_issue: KeyError: 99", True),
        ]
        assert results[2].content == (
            "examples/python_tool/script.json\nexamples/python_tool/tools_example.py"
        )
        assert "lookup_issue" in [t.name for t in child.tools]
        assert verify(store, root, tree=True).ok
