"""``Runtime.open(..., mcp_servers=...)``: a program's MCP servers, started when a
tree first needs them and stopped when the runtime closes, as the CLI's are. The
server is the SDK's own (tests/mcp_test_server.py), a real subprocess over stdio."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import reply

pytest.importorskip("mcp")

from processes import alive

from fanfold.db import Store
from fanfold.mcp.config import ServerDeclaration
from fanfold.providers.scripted import ScriptedProvider
from fanfold.replay.verify import verify
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import ToolResultMessage
from fanfold.tools.registry import ToolSet

pytestmark = pytest.mark.slow

SERVER = Path(__file__).with_name("mcp_test_server.py")


def _provider(*replies: dict[str, Any]) -> ScriptedProvider:
    return ScriptedProvider({"agents": [{"match": {"path": "root"}, "replies": list(replies)}]})


def _results(state: Any) -> list[tuple[str, str, bool]]:
    return [
        (m.result.name, m.result.content, m.result.is_error)
        for m in state.history
        if isinstance(m, ToolResultMessage)
    ]


@pytest.mark.parametrize("given", ["declarations", "toml", "mcp.json"])
async def test_runtime_open_starts_servers_for_a_tree_and_stops_them_on_close(
    tmp_path: Path, given: str
) -> None:
    args = [str(SERVER), "ok", str(tmp_path)]
    servers: Any
    if given == "declarations":
        servers = [ServerDeclaration("ok", "test", command=sys.executable, args=tuple(args))]
    elif given == "toml":
        servers = tmp_path / "fanfold.toml"
        servers.write_text(
            f"[mcp_servers.ok]\ncommand = {json.dumps(sys.executable)}\nargs = {json.dumps(args)}\n"
        )
    else:
        servers = tmp_path / ".mcp.json"
        servers.write_text(
            json.dumps({"mcpServers": {"ok": {"command": sys.executable, "args": args}}})
        )
    provider = _provider(
        reply("", ("mcp__ok__echo", {"text": "hi"}), ("mcp__ok__spawn", {})), reply("done")
    )
    database = tmp_path / "log.db"
    started = tmp_path / "started-ok"
    async with Runtime.open(
        database, provider, ToolSet.default(), logger=quiet_logger(), mcp_servers=servers
    ) as runtime:
        assert not started.exists()  # nothing starts when the runtime opens
        root = await runtime.start("go", cwd=tmp_path)
        assert (await runtime.wait(root)).text == "done"
        state = runtime.state(root)
        assert started.exists()
        server_pid, grandchild_pid = map(int, (tmp_path / "pids").read_text().split())
        assert alive(server_pid)
    # Closed: the server and what it started are gone.
    assert not alive(server_pid)
    assert not alive(grandchild_pid)
    assert _results(state) == [
        ("mcp__ok__echo", "echo: hi", False),
        ("mcp__ok__spawn", "spawned", False),
    ]
    names = [t.name for t in state.tools]
    assert "mcp__ok__echo" in names and "bash" in names
    assert next(t for t in state.tools if t.name == "mcp__ok__echo").read_only
    with Store.open(database) as store:
        assert verify(store, root, tree=True).ok  # without the server


async def test_a_tree_sent_to_later_binds_its_recorded_mcp_tools(tmp_path: Path) -> None:
    """A second runtime continuing the tree (``send``) calls the recorded MCP tool on
    the server of that name, started at that first call."""
    servers = [
        ServerDeclaration(
            "ok", "test", command=sys.executable, args=(str(SERVER), "ok", str(tmp_path))
        )
    ]
    provider = _provider(
        reply("first"), reply("", ("mcp__ok__echo", {"text": "again"})), reply("second")
    )
    database = tmp_path / "log.db"
    options: dict[str, Any] = {"logger": quiet_logger(), "mcp_servers": servers}
    async with Runtime.open(database, provider, ToolSet.default(), **options) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        assert (await runtime.wait(root)).text == "first"
    (tmp_path / "started-ok").unlink()
    async with Runtime.open(database, provider, ToolSet.default(), **options) as runtime:
        await runtime.send(root, "more")
        assert (await runtime.wait(root)).text == "second"
        state = runtime.state(root)
    assert (tmp_path / "started-ok").exists()
    assert _results(state) == [("mcp__ok__echo", "echo: again", False)]


async def test_bad_mcp_servers_are_a_clear_error(tmp_path: Path) -> None:
    from fanfold.providers.config import ConfigError

    bad = tmp_path / "fanfold.toml"
    bad.write_text("[mcp_servers.x]\nargs = ['a']\n")
    with pytest.raises(ConfigError, match="give command"):
        async with Runtime.open(":memory:", _provider(), [], mcp_servers=bad):
            pass
    with pytest.raises(TypeError, match="not a ServerDeclaration"):
        async with Runtime.open(":memory:", _provider(), [], mcp_servers=[{"command": "x"}]):
            pass
