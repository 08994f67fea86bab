"""MCP beyond tools (issue 33, item 8): a server's resources as ``list_mcp_resources``
and ``read_mcp_resource`` (permissioned as its tools, recorded like any result), its
prompts named by ``fanfold tools``, its progress notifications on the live view and its
log notifications in fanfold's log, both bounded. The servers are the SDK's own
(tests/mcp_extras_server.py), real subprocesses over stdio."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import reply

pytest.importorskip("mcp")

from fanfold.db import Store
from fanfold.mcp.config import ServerDeclaration
from fanfold.providers.scripted import ScriptedProvider
from fanfold.replay.verify import verify
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import ToolCall, ToolResultMessage
from fanfold.statemachine.permissions import (
    Permissions,
    RuleSet,
    allows_tool,
    parse_rule,
    reading_tools,
    refusal,
)
from fanfold.tools.registry import ToolSet

SERVER = Path(__file__).with_name("mcp_extras_server.py")
RAW_SERVER = Path(__file__).with_name("mcp_test_server.py")
"""Its ``badschema`` mode declares the ``tools`` capability alone (the SDK's
``MCPServer`` declares ``resources`` and ``prompts`` whatever it registers)."""


def _server(name: str, mode: str, where: Path, **kw: Any) -> ServerDeclaration:
    script = RAW_SERVER if mode == "badschema" else SERVER
    return ServerDeclaration(
        name, "test", command=sys.executable, args=(str(script), mode, str(where)), **kw
    )


def _provider(*replies: dict[str, Any]) -> ScriptedProvider:
    return ScriptedProvider({"agents": [{"match": {"path": "root"}, "replies": list(replies)}]})


def _results(state: Any) -> list[tuple[str, bool]]:
    return [
        (m.result.content, m.result.is_error)
        for m in state.history
        if isinstance(m, ToolResultMessage)
    ]


class _Lines:
    """A logger that keeps what it is given (``level``, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        def log(event: str, **fields: Any) -> None:
            self.lines.append((level, event, fields))

        return log


@pytest.mark.slow
async def test_resources_list_changed_progress_and_logs_in_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One run of two trees over the SDK's server (``notes``) and a server declaring
    tools alone (``plain``), replayed with both gone:

    - resources: ``list_mcp_resources``/``read_mcp_resource`` offered for ``notes``
      alone (the enum), text read whole, a blob described (MIME type, size), a long
      text cut to the result limit, a bad URI an error result naming the server;
    - list_changed: ``grow`` adds ``late`` and says so; tree 1's next request offers
      ``late`` (a ``ToolsChanged`` folded before ``grow``'s result) and calls it; tree
      2 is offered it from its start;
    - progress and log: ``busy`` sends 500 progress and 200 log notifications: the
      board holds that call's latest report only (one entry, under the call's
      conversation and number, gone when the call ends); fanfold's log gets at most
      LOG_BURST lines a second plus the count dropped; the result is the answer alone.
    """
    import fanfold.mcp.client as client
    from fanfold.mcp.client import LOG_BURST
    from fanfold.tools.progress import ProgressBoard

    class Recording(ProgressBoard):
        largest = 0
        keys: set[tuple[str, int]] = set()
        last: Any = None

        def report(self, key: tuple[str, int], *args: Any) -> None:
            super().report(key, *args)
            Recording.largest = max(Recording.largest, len(self))
            Recording.keys.add(key)
            Recording.last = self.get(*key)

    board = Recording()
    monkeypatch.setattr(client, "BOARD", board)
    read = "read_mcp_resource"
    provider = ScriptedProvider(
        {
            "agents": [
                {
                    "match": {"task": "first"},
                    "replies": [
                        reply(
                            "",
                            ("list_mcp_resources", {"server": "notes"}),
                            (read, {"server": "notes", "uri": "note://greeting"}),
                            (read, {"server": "notes", "uri": "note://logo"}),
                            (read, {"server": "notes", "uri": "note://big"}),
                            (read, {"server": "notes", "uri": "note://nothing"}),
                            (read, {"server": "plain", "uri": "note://greeting"}),
                            ("mcp__notes__busy", {}),
                            ("mcp__notes__grow", {}),
                        ),
                        reply("", ("mcp__notes__late", {})),
                        reply("one"),
                    ],
                },
                {
                    "match": {"task": "second"},
                    "replies": [reply("", ("mcp__notes__late", {})), reply("two")],
                },
            ]
        }
    )
    env = (("PROGRESS", "500"), ("LOGS", "200"))
    servers = [
        _server("notes", "extras", tmp_path, env=env),
        _server("plain", "badschema", tmp_path),
    ]
    lines = _Lines()
    database = tmp_path / "log.db"
    async with Runtime.open(
        database, provider, ToolSet.default(), logger=quiet_logger(), mcp_servers=servers
    ) as runtime:
        runtime.tools.hub.logger = lines  # type: ignore[attr-defined]
        first = await runtime.start("first", cwd=tmp_path)
        assert (await runtime.wait(first)).text == "one"
        second = await runtime.start("second", cwd=tmp_path)
        assert (await runtime.wait(second)).text == "two"
        one, two = runtime.state(first), runtime.state(second)

    specs = {t.name: t for t in one.tools}
    assert specs[read].read_only and specs["list_mcp_resources"].read_only
    assert specs[read].input_schema()["properties"]["server"]["enum"] == ["notes"]
    listing, greeting, logo, big, missing, plain, busy, grown, late = _results(one)
    assert not listing[1] and "note://greeting" in listing[0] and "image/png" in listing[0]
    assert greeting == ("hello from a resource", False)
    assert not logo[1]
    assert "image/png" in logo[0] and "300000 bytes" in logo[0] and len(logo[0]) < 200
    assert not big[1] and 20_000 < len(big[0]) <= 31_000  # cut to the result limit
    assert missing[1] and "'notes'" in missing[0]
    assert plain[1] and "server" in plain[0]  # not in the enum: breaks the schema

    assert grown == ("grown", False)
    # Offered to tree 1 from the round after the change (the reducer refuses a call of
    # a tool not offered), and to tree 2 from its start.
    assert "mcp__notes__late" in specs and "mcp__notes__late" in {t.name for t in two.tools}
    assert late == ("late answer", False)
    assert _results(two) == [("late answer", False)]

    assert busy == ("busy done", False)
    assert Recording.largest == 1 and len(Recording.keys) == 1
    ((conversation, _),) = Recording.keys
    assert conversation == first
    assert Recording.last.count == 500 and Recording.last.describe() == "500/500, step 500"
    assert len(board) == 0  # the call ended
    (progress,) = [f for _, event, f in lines.lines if event == "mcp_progress"]
    assert progress["reports"] == 500 and progress["conversation_id"] == first
    logged = [f for _, event, f in lines.lines if event == "mcp_server_log"]
    dropped = sum(f.get("dropped", 0) for _, _, f in lines.lines)
    assert 0 < len(logged) <= LOG_BURST * 30  # a window a second, 30 s at the most
    assert len(logged) + dropped == 200
    assert logged[0]["text"] == "log line 0" and logged[0]["server"] == "notes"

    with Store.open(database) as store:  # the servers are gone
        kinds = [e.type for e in store.raw_log(first).events]
        assert verify(store, first, tree=True).ok
        assert verify(store, second, tree=True).ok
    # Recorded between the first round's request and its last result: the request in
    # flight kept its set, the next one offered the new.
    changed = kinds.index("ToolsChanged")
    assert (
        kinds.index("ModelReplied") < changed < len(kinds) - kinds[::-1].index("ToolFinished") - 1
    )
    assert kinds[changed + 1] == "ToolFinished"  # grow's result, after the change


def test_no_resource_tool_is_offered_without_a_server_declaring_resources() -> None:
    """``resource_tools`` over the hub's servers (as discovered): none unless one
    started server shared by the run declares resources (an agent file's does not count)."""
    from types import SimpleNamespace

    from fanfold.mcp.resources import resource_tools

    def hub(*servers: tuple[str, bool, bool]) -> Any:
        made = {
            name: SimpleNamespace(
                name=name, has_resources=has, declaration=SimpleNamespace(private=private)
            )
            for name, has, private in servers
        }
        return SimpleNamespace(servers=made)

    assert resource_tools(hub()) == []
    assert resource_tools(hub(("plain", False, False))) == []
    assert resource_tools(hub(("scoped", True, True))) == []
    tools = resource_tools(hub(("plain", False, False), ("notes", True, False)))
    assert [t.spec.name for t in tools] == ["list_mcp_resources", "read_mcp_resource"]


def _rules(allow: list[str] | None = None, deny: list[str] = ()) -> Permissions:  # type: ignore[assignment]
    def parsed(texts: list[str]) -> tuple[Any, ...]:
        rules = tuple(parse_rule(t) for t in texts)
        assert not any(isinstance(r, str) for r in rules), rules
        return rules

    layer = RuleSet(None if allow is None else parsed(allow), parsed(list(deny)), "agent 'a'")
    return Permissions((layer,))


def _read(server: str) -> ToolCall:
    return ToolCall.of("c1", "read_mcp_resource", {"server": server, "uri": "note://x"})


@pytest.mark.parametrize(
    ("allow", "deny", "server", "permitted"),
    [
        (None, ["mcp__notes"], "notes", False),  # a denied server's resources are too
        (None, ["mcp__notes__*"], "notes", False),
        (None, ["mcp__notes"], "other", True),
        (None, ["ReadMcpResourceTool"], "notes", False),  # Claude Code's name
        (None, ["mcp__notes__echo"], "notes", True),  # one tool denied, not the server
        (["mcp__notes"], [], "notes", True),  # allowed the server: its resources too
        (["mcp__notes"], [], "other", False),
        (["mcp__notes__echo"], [], "notes", False),  # one tool allowed, not the server
        (["read-only"], [], "notes", True),  # reading a resource is reading
        (["read_mcp_resource"], [], "other", True),
        (["mcp__*"], [], "other", True),
        (None, ["mcp__*"], "other", False),
        (None, ["mcp__notes"], "notes__x", False),  # not a server's name: denied
        (["mcp__notes"], [], "notes__x", False),
    ],
)
def test_resource_calls_are_permissioned_as_the_servers_tools(
    allow: list[str] | None, deny: list[str], server: str, permitted: bool
) -> None:
    from fanfold.mcp.resources import resource_specs

    specs = resource_specs(["notes", "other"])
    reading = reading_tools(specs)
    why = refusal(_rules(allow, deny), _read(server), "/p", reading)
    assert (why is None) is permitted, why


def test_the_resource_tools_are_offered_where_some_call_could_pass() -> None:
    reading = frozenset({"list_mcp_resources", "read_mcp_resource"})
    assert allows_tool(_rules(["mcp__notes"]), "read_mcp_resource", reading)
    assert allows_tool(_rules(["read-only"]), "list_mcp_resources", reading)
    assert not allows_tool(_rules(["mcp__notes__echo"]), "read_mcp_resource", reading)
    assert not allows_tool(_rules(["bash"]), "read_mcp_resource", reading)
    assert allows_tool(_rules(None, ["mcp__notes"]), "read_mcp_resource", reading)
    assert not allows_tool(_rules(None, ["ListMcpResourcesTool"]), "list_mcp_resources", reading)


def test_the_live_view_shows_a_running_tools_latest_progress() -> None:
    import io

    from rich.console import Console
    from sm_support import replied, root, step, steps, tool, user

    from fanfold.cli import display
    from fanfold.statemachine import ToolExecuting
    from fanfold.tools.progress import BOARD

    view = display.TreeView()
    before = steps(root(), user("hi"))
    event = replied(before, tool("c1"))
    after, effects = step(before, event)
    assert isinstance(after.phase, ToolExecuting)
    view.observe(before, after, event, effects)
    key = (after.id, after.phase.call)

    def rendered() -> str:
        console = Console(width=200, file=io.StringIO(), force_terminal=False)
        console.print(view.render())
        assert isinstance(console.file, io.StringIO)
        return console.file.getvalue()

    assert "running bash" in rendered() and "step" not in rendered()
    try:
        BOARD.report(key, 3, 5, "step\x1b[2J 3")
        assert "running bash (3/5, step\\x1b[2J 3)" in rendered()  # never a raw escape
        BOARD.report(key, 40, 100, None)
        assert "(40%)" in rendered()
    finally:
        BOARD.done(key)
    assert "%" not in rendered()


@pytest.mark.slow
def test_fanfold_tools_names_the_resource_tools_and_a_servers_prompts(tmp_path: Path) -> None:
    """Prompts are the user's (Claude Code's slash commands), never offered to the
    model, but ``fanfold tools`` does not hide them: each server's are named."""
    import json

    from click.testing import CliRunner

    from fanfold.cli import cli

    agents = tmp_path / ".claude" / "agents"
    agents.mkdir(parents=True)
    (agents / "looker.md").write_text(
        "---\nname: looker\ndescription: looks\ntools: read-only\n---\nLook.\n"
    )
    (agents / "basher.md").write_text(
        "---\nname: basher\ndescription: runs\ntools: bash\n---\nRun.\n"
    )
    config = tmp_path / "mine.toml"
    config.write_text(
        "[profiles.offline]\nprovider = 'scripted'\n[mcp_servers.notes]\n"
        + f"command = {json.dumps(sys.executable)}\n"
        + f"args = [{json.dumps(str(SERVER))}, 'extras', {json.dumps(str(tmp_path))}]\n"
    )
    runner = CliRunner()
    result = runner.invoke(
        cli, ["tools", "--json", "--cwd", str(tmp_path), "--config", str(config)]
    )
    assert result.exit_code == 0, result.output
    listing = json.loads(result.stdout)
    tools = {t["name"]: t for t in listing["tools"]}
    assert tools["read_mcp_resource"]["source"] == "MCP resources of notes"
    allowed = tools["list_mcp_resources"]["agents"]
    assert "looker" in allowed and "basher" not in allowed  # read-only takes them
    (server,) = listing["mcp_servers"]
    assert server["resources"] is True
    assert server["prompts"] == ["review(topic)"]
    assert "review" not in tools and "mcp__notes__review" not in tools


async def test_a_servers_log_lines_are_made_printable_and_rate_limited() -> None:
    """A server's log text reaches the terminal when it is a warning or an error: no
    control character survives; past LOG_BURST lines a window, the rest are counted."""
    from types import SimpleNamespace

    from fanfold.mcp.client import LOG_BURST, ServerNotes

    lines = _Lines()
    notes = ServerNotes(SimpleNamespace(name="s", hub=SimpleNamespace(logger=lines)))  # type: ignore[arg-type]
    for i in range(LOG_BURST + 30):
        await notes.log(SimpleNamespace(data=f"x\x1b[2J\u202e{i}", level="error", logger=None))
    notes.flush()
    written = [(level, f) for level, event, f in lines.lines if event == "mcp_server_log"]
    assert len(written) == LOG_BURST
    assert written[0] == (
        "error",
        {"server": "s", "level_mcp": "error", "text": "x\\x1b[2J\\u202e0"},
    )
    assert lines.lines[-1][1:] == ("mcp_server_log_dropped", {"server": "s", "dropped": 30})


def _spec(name: str, read_only: bool = False) -> Any:
    from fanfold.statemachine import ToolSpec

    return ToolSpec.from_schema(name, name, {"type": "object"}, read_only=read_only)


def test_tools_changed_replaces_that_servers_tools_as_the_rules_leave_them() -> None:
    """The reducer's rule (pure): the server's tools are replaced, another server's and
    fanfold's own are kept, the control tools stay, the conversation's rules filter
    the new ones, a spec not named for that server is ignored, an ended conversation
    absorbs it, and nothing runs."""
    from sm_support import TOOLS, child, replied, root, step, submit

    from fanfold.statemachine import CONTROL_TOOLS, ToolsChanged

    old, other = _spec("mcp__notes__old"), _spec("mcp__other__x")
    state = root(tools=(*TOOLS, old, other))
    change = ToolsChanged(
        "notes", (_spec("mcp__notes__new"), _spec("mcp__notes__look", True), _spec("mcp__x__y"))
    )
    after, effects = step(state, change)
    names = [t.name for t in after.tools]
    assert effects == ()
    assert "mcp__notes__old" not in names and "mcp__x__y" not in names
    assert {"bash", "read_file", "mcp__other__x", "mcp__notes__new", "mcp__notes__look"} <= set(
        names
    )
    assert [n for n in names if n in CONTROL_TOOLS] == [
        t.name for t in state.tools if t.name in CONTROL_TOOLS
    ]
    # A sub-agent allowed read-only tools only gets the new read-only one.
    rules = _rules(["read-only"])
    # (A child's created tools are already those its rules leave: the runtime's.)
    sub = child(tools=tuple(t for t in TOOLS if t.name == "read_file"), permissions=rules)
    sub_after, _ = step(sub, change)
    sub_names = {t.name for t in sub_after.tools}
    assert "mcp__notes__look" in sub_names and "mcp__notes__new" not in sub_names
    # Denied the server: none of its tools.
    denied, _ = step(child(tools=TOOLS, permissions=_rules(None, ["mcp__notes"])), change)
    assert not any(t.name.startswith("mcp__notes__") for t in denied.tools)
    # Ended: absorbed.
    done, _ = step(sub, replied(sub, submit("s1", "ok")))
    assert done.is_terminal
    assert step(done, change) == (done, ())


@pytest.mark.slow
def test_fanfold_run_offers_a_tool_the_server_adds_from_the_next_round(tmp_path: Path) -> None:
    """``fanfold run`` (a fixed tool set built at start, taking a server's changed list
    through ``RefreshingTools``): ``grow`` adds ``late``, the next round calls it; replay
    verifies with the server's declaration gone."""
    import json

    from click.testing import CliRunner

    from fanfold.cli import cli
    from fanfold.statemachine import ToolFinished

    config = tmp_path / "mine.toml"
    config.write_text(
        "[mcp_servers.notes]\n"
        + f"command = {json.dumps(sys.executable)}\n"
        + f"args = [{json.dumps(str(SERVER))}, 'extras', {json.dumps(str(tmp_path))}]\n"
    )
    script = tmp_path / "script.json"
    calls = [
        {"tool_calls": [{"name": "mcp__notes__grow", "arguments": {}}]},
        {"tool_calls": [{"name": "mcp__notes__late", "arguments": {}}]},
        {"text": "done"},
    ]
    script.write_text(json.dumps({"agents": [{"match": {"path": "root"}, "replies": calls}]}))
    db = tmp_path / "run.db"
    runner = CliRunner()
    args = ["run", "go", "--script", str(script), "--db", str(db), "--cwd", str(tmp_path)]
    done = runner.invoke(cli, [*args, "--config", str(config), "--no-live"])
    assert done.exit_code == 0, done.output
    with Store.open(db, read_only=True) as store:
        (root,) = store.list_roots()
        results = [
            e.event.result for e in store.events(root.id) if isinstance(e.event, ToolFinished)
        ]
    assert [(r.name, r.content, r.is_error) for r in results] == [
        ("mcp__notes__grow", "grown", False),
        ("mcp__notes__late", "late answer", False),
    ]
    config.unlink()
    verify = runner.invoke(cli, ["replay", root.id, "--db", str(db), "--verify", "--tree"])
    assert verify.exit_code == 0, verify.output
    assert "identical" in verify.output
