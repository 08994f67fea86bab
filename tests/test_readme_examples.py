"""What the Python examples of the guides claim, beyond running (tests/test_doc_examples.py
runs every block). They were README.md's; the README now links to these pages."""

from __future__ import annotations

import linecache
import re
from pathlib import Path
from typing import Any

DOCS = Path(__file__).parent.parent / "docs" / "how-to"
TOOLS = DOCS / "tools-and-mcp.md"
PROPERTY_TESTING = DOCS / "property-testing.md"


def _block(marker: str, page: Path = TOOLS) -> str:
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    (found,) = [b for b in blocks if marker in b]
    return str(found)


def _compiled(source: str, name: str) -> Any:
    """``source`` compiled as file ``name``, with its lines registered in linecache so
    that tracebacks and Hypothesis (which reads a test's source) see the block itself,
    not the lines of the real page at the same numbers."""
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    return compile(source, name, "exec")


def test_property_testing_example_catches_the_wrong_check_as_the_readme_says() -> None:
    """The guide: checking "/stop" as the plain UserMessaged it arrived as fails at once,
    naming the invariant (Hypothesis shrinks it to the simplest state)."""
    import pytest

    source = _block("def my_transition", PROPERTY_TESTING).replace(
        "testing.check_transition(state, meaning(event), after, effects)",
        "testing.check_transition(state, event, after, effects)",
    )
    assert "check_transition(state, event," in source
    namespace: dict[str, Any] = {}
    exec(_compiled(source, "<docs: property testing, wrong check>"), namespace)
    with pytest.raises(AssertionError) as caught:
        namespace["test_stop_keeps_every_invariant"]()
    claim = re.search(
        r"and says\s+why: `(.*?)`", PROPERTY_TESTING.read_text(encoding="utf-8"), re.S
    )
    assert claim is not None
    assert claim.group(1) in str(caught.value)


async def test_the_python_tool_example_runs_and_makes_the_tool_it_describes() -> None:
    namespace: dict[str, Any] = {"__name__": "readme"}
    exec(_compiled(_block("def lookup_issue"), "<docs: adding tools>"), namespace)
    from fanfold.statemachine import ToolCall

    tools = namespace["tools"]
    assert tools.names[-1] == "lookup_issue" and "bash" in tools
    assert namespace["only_mine"].names == ("lookup_issue",)
    result = await tools.run(ToolCall("c", "lookup_issue", '{"number": 23}'), "/")
    assert (result.content, result.is_error) == ("issue 23: any state", False)
    bad = await tools.run(ToolCall("c", "lookup_issue", '{"number": 1, "state": "x"}'), "/")
    assert bad.is_error and "argument 'state' must be one of" in bad.content


async def test_the_pydantic_tool_example_runs_as_the_readme_says(monkeypatch: Any) -> None:
    import sys
    import types

    # A module of its own, as a user's file is: pydantic resolves a model's
    # annotations through sys.modules[its __module__].
    module = types.ModuleType("readme_pydantic_tool")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(_compiled(_block("def book("), "<docs: pydantic tool>"), module.__dict__)
    namespace = module.__dict__
    from fanfold.statemachine import ToolCall
    from fanfold.tools import ToolSet

    tools = ToolSet([namespace["book"]])
    good = '{"to": {"city": "Oslo", "zip": "0150"}, "day": "2026-12-24"}'
    result = await tools.run(ToolCall("c", "book", good), "/")
    assert (result.content, result.is_error) == ('{"city": "Oslo", "zip": "0150"}', False)
    bad = '{"to": {"city": "Oslo", "zip": "015000"}, "day": "2026-12-24"}'
    result = await tools.run(ToolCall("c", "book", bad), "/")
    assert result.is_error
    assert "argument 'to.zip' must be at most 5 characters long" in result.content


async def test_the_mcp_servers_example_runs(tmp_path: Path, monkeypatch: Any) -> None:
    """The guide, "An MCP server": ``Runtime.open(..., mcp_servers="fanfold.toml")`` with
    the SDK's server of the tests declared there; the tree calls its tool."""
    import json
    import sys

    import pytest

    pytest.importorskip("mcp")
    from fanfold.db import Store
    from fanfold.providers.scripted import ScriptedProvider
    from fanfold.statemachine import ToolResultMessage

    server = Path(__file__).with_name("mcp_test_server.py")
    (tmp_path / "fanfold.toml").write_text(
        f"[mcp_servers.ok]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = {json.dumps([str(server), 'ok', str(tmp_path)])}\n"
    )
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "readme"}
    exec(_compiled(_block("mcp_servers="), "<docs: MCP servers>"), namespace)
    call = {"name": "mcp__ok__echo", "arguments": {"text": "open"}}
    replies = [{"text": "", "tool_calls": [call]}, {"text": "none"}]
    await namespace["main"](ScriptedProvider({"agents": [{"match": {}, "replies": replies}]}))
    with Store.open(tmp_path / "log.db") as store:
        (row,) = store.list_roots()
        state = store.load_state(row.id)
    (result,) = [m.result for m in state.history if isinstance(m, ToolResultMessage)]
    assert (result.content, result.is_error) == ("echo: open", False)
