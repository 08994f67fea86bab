"""MCP servers as tools: a real MCP server (tests/mcp_test_server.py, the SDK's server
side or hand-written JSON-RPC) run as a subprocess over stdio under the supervisor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

pytest.importorskip("mcp")

from processes import alive

from fanfold.db import Store
from fanfold.mcp.client import McpHub, McpTool
from fanfold.mcp.config import ServerDeclaration, declared_servers
from fanfold.tools.registry import ToolSet
from fanfold.tools.secrets import EnvPolicy
from fanfold.trust import TrustStore

pytestmark = pytest.mark.slow

SERVER = Path(__file__).with_name("mcp_test_server.py")


def _declaration(mode: str, where: Path, **kw: Any) -> ServerDeclaration:
    return ServerDeclaration(
        mode, "test", command=sys.executable, args=(str(SERVER), mode, str(where)), **kw
    )


async def _tools(hub: McpHub) -> dict[str, McpTool]:
    tools, problems = await hub.discover()
    assert problems == []
    return {t.tool: t for t in tools}


async def _until(condition: Any) -> None:
    """Wait (bounded, not timed) until ``condition()`` holds."""
    with trio.fail_after(30):
        while not condition():
            await trio.sleep(0.05)


async def test_tools_are_named_checked_and_their_results_converted(tmp_path: Path) -> None:
    async with McpHub.open([_declaration("ok", tmp_path)], cwd=tmp_path) as hub:
        tools = await _tools(hub)
        assert tools["echo"].spec.name == "mcp__ok__echo"
        # A server's tool named like a built-in is namespaced: no clash, both offered.
        assert tools["bash"].spec.name == "mcp__ok__bash"
        names = ToolSet.default(extra=list(tools.values())).names
        assert "bash" in names and "mcp__ok__bash" in names
        assert tools["echo"].read_only and not tools["add"].read_only
        echo = await tools["echo"].run({"text": "hi"}, ".")
        assert (echo.content, echo.is_error) == ("echo: hi", False)
        added = await tools["add"].run({"a": 1, "b": 2}, ".")
        assert json.loads(added.content) == {"sum": 3}
        failed = await tools["fail"].run({}, ".")
        assert failed.is_error and "it failed on purpose" in failed.content
        picture = await tools["image"].run({}, ".")
        assert picture.content.startswith("[image: image/png, about ")
        assert not picture.is_error


async def test_a_call_past_its_timeout_is_cancelled_on_the_server(tmp_path: Path) -> None:
    async with McpHub.open([_declaration("ok", tmp_path, timeout=1)], cwd=tmp_path) as hub:
        tools = await _tools(hub)
        out = await tools["slow"].run({"seconds": 600}, ".")
        assert out.is_error and "timed out after 1 s" in out.content
        await _until(lambda: (tmp_path / "cancelled").exists())
        # The server lives on: the next call is answered.
        assert (await tools["echo"].run({"text": "still"}, ".")).content == "echo: still"


async def test_cancelling_a_call_reaches_the_server(tmp_path: Path) -> None:
    async with McpHub.open([_declaration("ok", tmp_path)], cwd=tmp_path) as hub:
        tools = await _tools(hub)
        with trio.move_on_after(1):
            await tools["slow"].run({"seconds": 600}, ".")
        await _until(lambda: (tmp_path / "cancelled").exists())


async def test_a_server_dying_mid_call_is_restarted_once_then_named(tmp_path: Path) -> None:
    # (Its stderr goes to the log and the user, not into the model's result:
    # test_mcp_low.py::test_the_servers_stderr_goes_to_the_log_and_the_user_not_the_model.)
    async with McpHub.open([_declaration("ok", tmp_path)], cwd=tmp_path) as hub:
        tools = await _tools(hub)
        died = await tools["die"].run({}, ".")
        assert died.is_error
        assert "MCP server 'ok' died" in died.content and "dying now" not in died.content
        again = await tools["echo"].run({"text": "back"}, ".")
        assert again.content == "echo: back"  # restarted
        assert (await tools["die"].run({}, ".")).is_error
        final = await tools["echo"].run({"text": "x"}, ".")
        assert final.is_error
        assert "restarted once already" in final.content


async def test_big_answers_arrive_cut_and_the_server_lives_on(tmp_path: Path) -> None:
    # A 5 MB text is a line of over 10 MB (the SDK's server repeats it as structured
    # content); it used to end the connection ("larger than 8 MiB") and use up the
    # server's one restart, so the second was lost. Each now arrives cut to the
    # model's limit, counted once, and the server is never restarted; 50 MB as well.
    async with McpHub.open([_declaration("ok", tmp_path)], cwd=tmp_path) as hub:
        tools = await _tools(hub)
        for mb in (5, 5, 50):
            out = await tools["big"].run({"mb": mb}, ".")
            assert not out.is_error, out.content[:300]
            assert out.content.startswith("<start>xxx") and out.content.endswith("xxx<end>")
            assert 20_000 < len(out.content) <= 31_000  # cut once, not text and copy
        assert (await tools["echo"].run({"text": "ok"}, ".")).content == "echo: ok"
        assert hub.servers["ok"].starts == 1


async def test_a_banner_on_stdout_is_skipped_and_kept_in_the_stderr_tail(
    tmp_path: Path,
) -> None:
    async with McpHub.open([_declaration("banner", tmp_path)], cwd=tmp_path) as hub:
        tools = await _tools(hub)  # no problem: the server is offered
        assert (await tools["echo"].run({"text": "hi"}, ".")).content == "echo: hi"
        server = hub.servers["banner"]
        assert server.noise_lines == 2 and server.starts == 1
        assert "(on stdout, not JSON-RPC) Welcome to the banner server v1.0" in server.stderr_tail()


async def test_a_server_printing_more_than_50_lines_that_are_not_json_rpc_is_refused(
    tmp_path: Path,
) -> None:
    # Bounded: the 51st such line ends the connection, with what it printed.
    declaration = _declaration("banner", tmp_path, env=(("BANNER_LINES", "60"),))
    async with McpHub.open([declaration], cwd=tmp_path) as hub:
        tools, problems = await hub.discover()
    assert tools == [] and len(problems) == 1
    assert "wrote 51 lines that are not JSON-RPC (the first: 'Welcome to the banner" in problems[0]


@pytest.mark.parametrize(
    ("mode", "problem"),
    [
        ("noinit", "did not answer initialize within 2 s"),
        # Never speaks JSON-RPC: refused, with what it printed.
        (
            "garbage",
            "did not answer initialize within 2 s; it wrote 1 line(s) on stdout that are not "
            "JSON-RPC, the first: 'this is not json-rpc'",
        ),
        ("many", "offers more than 128 tools: refused"),
        # The SDK refuses the whole list (pydantic: inputSchema.type must be 'object').
        ("stringschema", "tools/list failed: 1 validation error for ListToolsResult"),
    ],
)
async def test_broken_servers_are_one_clear_problem(
    tmp_path: Path, mode: str, problem: str
) -> None:
    timeout = 2 if mode in ("noinit", "garbage") else 60
    declaration = _declaration(mode, tmp_path, startup_timeout=timeout)
    async with McpHub.open([declaration, _declaration("ok", tmp_path)], cwd=tmp_path) as hub:
        tools, problems = await hub.discover()
    assert len(problems) == 1
    assert problems[0].startswith(f"MCP server {mode!r}") and problem in problems[0]
    assert {t.server.name for t in tools} == {"ok"}  # the others are unharmed


async def test_servers_start_side_by_side(tmp_path: Path) -> None:
    # Each waits for the other to have started: one after the other, the first would
    # wait for ever (it gives up after 20 s and exits, a problem for discover).
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    declarations = [
        ServerDeclaration(
            name,
            "test",
            command=sys.executable,
            args=(str(SERVER), "ok", str(where)),
            env=(("WAIT_FOR", str(other / "started-ok")),),
        )
        for name, where, other in (("a", first, second), ("b", second, first))
    ]
    async with McpHub.open(declarations, cwd=tmp_path) as hub:
        tools, problems = await hub.discover()
    assert problems == []
    # Put together in declaration order, whichever answered first.
    names = [t.server.name for t in tools]
    assert set(names) == {"a", "b"} and names == sorted(names)


async def test_a_tool_whose_schema_fanfold_cannot_check_is_left_out(tmp_path: Path) -> None:
    async with McpHub.open([_declaration("badschema", tmp_path)], cwd=tmp_path) as hub:
        tools, problems = await hub.discover()
        assert [t.tool for t in tools] == ["fine", "weird"]
        assert len(problems) == 1 and "tool 'refy' left out" in problems[0]
        assert (await tools[0].run({}, ".")).content == "fine indeed"
        # A result the SDK cannot read is an error result, and the server lives on.
        weird = await tools[1].run({}, ".")
        assert weird.is_error and weird.content.startswith("MCP server 'badschema'")
        assert (await tools[0].run({}, ".")).content == "fine indeed"


async def test_a_server_that_hangs_on_shutdown_is_killed(tmp_path: Path) -> None:
    async with McpHub.open([_declaration("hang", tmp_path)], cwd=tmp_path) as hub:
        await _tools(hub)
    # The hub has closed: the server ignored end-of-file and SIGTERM, and is gone.
    pid = int((tmp_path / "hanging").read_text())
    assert not alive(pid)


DRIVER = """
import sys, trio
from fanfold.mcp.client import McpHub
from fanfold.mcp.config import ServerDeclaration
async def main():
    d = ServerDeclaration("ok", "t", command=sys.executable, args=(sys.argv[1], "ok", sys.argv[2]))
    async with McpHub.open([d], cwd=sys.argv[2]) as hub:
        tools, _ = await hub.discover()
        spawn = next(t for t in tools if t.tool == "spawn")
        await spawn.run({}, ".")
        print("ready", flush=True)
        await trio.sleep_forever()
trio.run(main)
"""


async def test_nothing_the_server_started_outlives_a_killed_fanfold(tmp_path: Path) -> None:
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(SERVER), str(tmp_path)], stdout=subprocess.PIPE
    )
    assert driver.stdout is not None
    line = await trio.to_thread.run_sync(driver.stdout.readline)
    assert line.strip() == b"ready"
    server_pid, grandchild_pid = map(int, (tmp_path / "pids").read_text().split())
    assert alive(server_pid) and alive(grandchild_pid)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    await _until(lambda: not alive(server_pid) and not alive(grandchild_pid))


async def test_project_servers_wait_for_trust(tmp_path: Path, trust_record: Path) -> None:
    (tmp_path / ".mcp.json").write_text(
        json.dumps(
            {
                "mcpServers": {
                    "ok": {"command": sys.executable, "args": [str(SERVER), "ok", str(tmp_path)]}
                }
            }
        )
    )
    declared = declared_servers(tmp_path, environ={**os.environ, "HOME": str(tmp_path)})
    assert [(d.name, d.project, d.needs_trust) for d in declared.servers] == [("ok", True, True)]
    async with McpHub.open(declared.servers, cwd=tmp_path) as hub:
        tools, problems = await hub.discover()
    assert tools == [] and len(problems) == 1
    assert "waits for trust" in problems[0] and "fanfold trust" in problems[0]
    assert not (tmp_path / "started-ok").exists()  # never started
    TrustStore.default().trust(tmp_path / ".mcp.json")
    declared = declared_servers(tmp_path, environ={**os.environ, "HOME": str(tmp_path)})
    assert not declared.servers[0].needs_trust
    async with McpHub.open(declared.servers, cwd=tmp_path) as hub:
        tools, problems = await hub.discover()
    assert problems == [] and tools
    # A changed file waits for trust again.
    (tmp_path / ".mcp.json").write_text((tmp_path / ".mcp.json").read_text() + "\n")
    declared = declared_servers(tmp_path, environ={**os.environ, "HOME": str(tmp_path)})
    assert declared.servers[0].needs_trust


async def test_user_config_servers_start_as_they_are(tmp_path: Path) -> None:
    config = tmp_path / "mine.toml"
    config.write_text(
        "[mcp_servers.ok]\n"
        f"command = {json.dumps(sys.executable)}\n"
        f"args = [{json.dumps(str(SERVER))}, 'ok', {json.dumps(str(tmp_path))}]\n"
        "env = { PASSED = '${MY_SECRET}' }\n"
        "idempotent_tools = ['count']\n"
    )
    declared = declared_servers(tmp_path, config)
    assert declared.problems == ()
    (server,) = declared.servers
    assert not server.needs_trust and server.idempotent_tools == ("count",)
    environ = {**os.environ, "MY_SECRET": "s3cret-value", "OTHER_TOKEN": "leak"}
    async with McpHub.open(
        declared.servers, cwd=tmp_path, env_policy=EnvPolicy(), environ=environ
    ) as hub:
        tools = await _tools(hub)
        assert tools["count"].idempotent and not tools["echo"].idempotent
        # The declared variable comes from the environment by name; a secret-looking
        # variable it did not name is not passed (as for bash).
        out = await tools["secret"].run({}, ".")
    assert out.content == "s3cret-value absent"


def test_declarations_are_checked(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(
        "[mcp_servers.a__b]\ncommand = 'x'\n"
        "[mcp_servers.both]\ncommand = 'x'\nurl = 'http://127.0.0.1:1/mcp'\n"
        "[mcp_servers.typo]\ncommand = 'x'\nargz = []\n"
        "[mcp_servers.good]\nurl = 'http://127.0.0.1:1/mcp'\nheaders = { A = '$TOKEN' }\n"
    )
    declared = declared_servers(tmp_path, config)
    assert [d.name for d in declared.servers] == ["good"]
    assert len(declared.problems) == 3
    joined = "\n".join(declared.problems)
    assert "mcp_servers.a__b: a server name is" in joined
    assert "mcp_servers.both: give command" in joined
    assert "mcp_servers.typo: unknown key(s) argz" in joined


def _mcp_json(folder: Path, where: Path, **extra: Any) -> Path:
    path = folder / ".mcp.json"
    server = {"command": sys.executable, "args": [str(SERVER), "ok", str(where)], **extra}
    path.write_text(json.dumps({"mcpServers": {"ok": server}}))
    return path


ECHO_SCRIPT = {
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                {
                    "text": "asking the server",
                    "tool_calls": [{"name": "mcp__ok__echo", "arguments": {"text": "hi"}}],
                },
                {"text": "it said hi"},
            ],
        }
    ]
}


def test_a_run_uses_a_trusted_servers_tool_and_replays_without_it(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fanfold.cli import cli
    from fanfold.db import Store
    from fanfold.statemachine import ToolFinished
    from fanfold.trace.build import build_trace

    project = tmp_path / "project"
    project.mkdir()
    TrustStore.default().trust(_mcp_json(project, tmp_path))
    script = tmp_path / "script.json"
    script.write_text(json.dumps(ECHO_SCRIPT))
    db = tmp_path / "run.db"
    command = [sys.executable, "-c", "from fanfold.cli import main; main()", "run", "go"]
    command += ["--script", str(script), "--db", str(db), "--cwd", str(project), "--no-live"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with Store.open(db, read_only=True) as store:
        (root,) = store.list_roots()
        results = [
            e.event.result for e in store.events(root.id) if isinstance(e.event, ToolFinished)
        ]
    assert [(r.name, r.content, r.is_error) for r in results] == [
        ("mcp__ok__echo", "echo: hi", False)
    ]
    # show and the trace page name the call's server.
    shown = CliRunner().invoke(cli, ["show", root.id, "--db", str(db)])
    # The summary line wraps at the console's width when its elapsed time is long
    # (seen under load): compare words, not lines.
    assert "MCP: ok (1)" in " ".join(shown.output.split())
    as_json = json.loads(
        CliRunner().invoke(cli, ["show", root.id, "--db", str(db), "--json"]).stdout
    )
    assert as_json["mcp_calls"] == [{"server": "ok", "tool": "echo", "error": False}]
    with Store.open(db, read_only=True) as store:
        trace = json.dumps(build_trace(store, root.id))
    assert "tool mcp__ok__echo (MCP server ok)" in trace
    # The server is gone: replay verifies from the log alone.
    (project / ".mcp.json").unlink()
    verify = CliRunner().invoke(cli, ["replay", root.id, "--db", str(db), "--verify", "--tree"])
    assert verify.exit_code == 0, verify.output
    assert "identical" in verify.output


def test_a_run_says_a_project_server_waits_for_trust(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    _mcp_json(project, tmp_path)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"agents": [{"replies": [{"text": "no tools needed"}]}]}))
    command = [sys.executable, "-c", "from fanfold.cli import main; main()", "run", "go"]
    command += ["--script", str(script), "--db", str(tmp_path / "w.db"), "--cwd", str(project)]
    done = subprocess.run([*command, "--no-live"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "MCP server 'ok' waits for trust" in done.stderr
    assert not (tmp_path / "started-ok").exists()


COUNT_SCRIPT = {
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                {
                    "text": "counting",
                    "tool_calls": [{"name": "mcp__ok__count", "arguments": {"tag": "x"}}],
                },
                {"text": "counted, done"},
            ],
        }
    ]
}


@pytest.mark.parametrize("idempotent", [False, True])
async def test_kill_9_with_an_mcp_call_in_flight_then_resume(
    tmp_path: Path, idempotent: bool
) -> None:
    from fanfold.db import Store
    from fanfold.statemachine import ToolResultMessage

    project = tmp_path / "project"
    project.mkdir()
    extra = {"idempotent_tools": ["count"]} if idempotent else {}
    TrustStore.default().trust(_mcp_json(project, tmp_path, **extra))
    script = tmp_path / "script.json"
    script.write_text(json.dumps(COUNT_SCRIPT))
    db = tmp_path / "k.db"
    fanfold = [sys.executable, "-c", "from fanfold.cli import main; main()"]
    options = ["--script", str(script), "--db", str(db), "--no-live", "--cwd", str(project)]
    run = subprocess.Popen(
        [*fanfold, "run", "go", *options],
        env={**os.environ, "COUNT_SLEEP": "600"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    await _until(lambda: (tmp_path / "count").exists())
    run.send_signal(signal.SIGKILL)
    run.wait()
    resumed = subprocess.run(
        [*fanfold, "resume", "--db", str(db)],
        env={**os.environ, "COUNT_SLEEP": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    with Store.open(db, read_only=True) as store:
        (root,) = store.list_roots()
        state = store.load_state(root.id)
    (result,) = [m.result for m in state.history if isinstance(m, ToolResultMessage)]
    lines = (tmp_path / "count").read_text().split()
    if idempotent:
        assert lines == ["x", "x"]
        assert (result.content, result.is_error) == ("counted", False)
    else:
        assert lines == ["x"]
        assert result.is_error and result.content.startswith("interrupted:")


def test_fanfold_tools_lists_each_servers_tools_and_state(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fanfold.cli import cli

    project = tmp_path / "project"
    project.mkdir()
    _mcp_json(project, tmp_path)  # the project's: not trusted
    agents = project / ".claude" / "agents"
    agents.mkdir(parents=True)
    (agents / "looker.md").write_text(
        "---\nname: looker\ndescription: looks\ntools: read-only\n---\nLook.\n"
    )
    server = f"command = {json.dumps(sys.executable)}\n"
    config = tmp_path / "mine.toml"
    config.write_text(
        "[profiles.offline]\nprovider = 'scripted'\n"
        + "[mcp_servers.mine]\n"
        + server
        + f"args = [{json.dumps(str(SERVER))}, 'ok', {json.dumps(str(tmp_path))}]\n"
        + "env = { PASSED = '${MY_SECRET}' }\n"
        + "[mcp_servers.mute]\n"
        + server
        + f"args = [{json.dumps(str(SERVER))}, 'noinit', {json.dumps(str(tmp_path))}]\n"
        + "startup_timeout = 2\n"
    )
    result = CliRunner().invoke(
        cli,
        ["tools", "--json", "--cwd", str(project), "--config", str(config)],
        env={"MY_SECRET": "s3cret-value"},
    )
    assert result.exit_code == 0, result.output
    assert "s3cret-value" not in result.output
    listing = json.loads(result.stdout)
    tools = {t["name"]: t for t in listing["tools"]}
    assert tools["mcp__mine__echo"]["source"] == f"MCP server mine ({config})"
    assert "looker" in tools["mcp__mine__echo"]["agents"]  # readOnlyHint: read-only takes it
    assert "looker" not in tools["mcp__mine__add"]["agents"]
    assert "read_file" in tools and "bash" in tools
    servers = {s["name"]: s for s in listing["mcp_servers"]}
    assert servers["mine"]["status"] == "started" and servers["mine"]["env"] == ["PASSED"]
    assert servers["mute"]["status"] == "failed"
    assert "did not answer initialize within 2 s" in servers["mute"]["problem"]
    assert servers["ok"]["status"] == "waits for trust"
    assert servers["ok"]["declared_by"] == "project"


def test_a_config_that_only_declares_servers_serves_tools_and_run(tmp_path: Path) -> None:
    # No [profiles]: the models are those of no file (the offline demo here); the
    # servers it declares are listed by `tools` and offered by `run`, alike.
    from click.testing import CliRunner

    from fanfold.cli import cli

    config = tmp_path / "servers.toml"
    config.write_text(
        "[mcp_servers.mine]\n"
        + f"command = {json.dumps(sys.executable)}\n"
        + f"args = [{json.dumps(str(SERVER))}, 'ok', {json.dumps(str(tmp_path))}]\n"
    )
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    listed = CliRunner().invoke(
        cli, ["tools", "--json", "--cwd", str(tmp_path), "--config", str(config)], env=env
    )
    assert listed.exit_code == 0, listed.output
    assert "mcp__mine__echo" in {t["name"] for t in json.loads(listed.stdout)["tools"]}
    db = tmp_path / "t.db"
    ran = CliRunner().invoke(
        cli,
        [
            *("run", "hi", "--no-live", "--cwd", str(tmp_path)),
            *("--config", str(config), "--db", str(db)),
        ],
        env=env,
    )
    assert ran.exit_code == 0, ran.output
    with Store.open(db, read_only=True) as store:
        (root,) = store.list_roots()
        tools = store.load_state(root.id).tools
    assert "mcp__mine__echo" in {spec.name for spec in tools}


def test_a_servers_secret_reaches_neither_the_log_nor_bash(tmp_path: Path) -> None:
    """The variable a declaration names (``${GH}``, a name that does not look secret)
    goes to the server only: redacted from the log when the server echoes it, and kept
    from bash commands."""
    from fanfold.db import Store

    project = tmp_path / "project"
    project.mkdir()
    TrustStore.default().trust(_mcp_json(project, tmp_path, env={"PASSED": "${GH}"}))
    script = tmp_path / "script.json"
    calls = [
        {"name": "mcp__ok__secret", "arguments": {}},
        {"name": "bash", "arguments": {"command": "echo gh=${GH:-unset}"}},
    ]
    script.write_text(
        json.dumps({"agents": [{"replies": [{"tool_calls": calls}, {"text": "done"}]}]})
    )
    db = tmp_path / "s.db"
    command = [sys.executable, "-c", "from fanfold.cli import main; main()", "run", "go"]
    command += ["--script", str(script), "--db", str(db), "--cwd", str(project), "--no-live"]
    secret = "gh-value-0123456789abcdef"
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "GH": secret}
    )
    assert done.returncode == 0, done.stderr
    with Store.open(db, read_only=True) as store:
        (root,) = store.list_roots()
        state = store.load_state(root.id)
    contents = [m.result.content for m in state.history if hasattr(m, "result")]
    assert len(contents) == 2
    assert secret not in contents[0] and "absent" in contents[0]  # the server had it
    assert contents[1].strip().startswith("gh=unset")
    assert secret.encode() not in db.read_bytes()


async def test_a_streamable_http_server_with_a_token_from_the_environment(
    tmp_path: Path,
) -> None:
    """The client over Streamable HTTP, against `fanfold mcp --http` on a loopback port:
    the bearer token comes from the environment by name (``Bearer ${MCP_TOK}``)."""
    token = "k" * 32
    script = tmp_path / "fast.json"
    script.write_text(
        json.dumps({"agents": [{"match": {"path": "root"}, "replies": [{"text": "42"}]}]})
    )
    command = [sys.executable, "-c", "from fanfold.cli import main; main()", "mcp", "--http"]
    command += ["--script", str(script), "--db", str(tmp_path / "h.db"), "--cwd", str(tmp_path)]
    async with trio.open_nursery() as nursery:
        process = await nursery.start(
            lambda task_status: trio.run_process(
                command,
                env={**os.environ, "FANFOLD_MCP_TOKEN": token},
                stderr=subprocess.PIPE,
                task_status=task_status,
            )
        )
        url, buffer = "", b""
        with trio.fail_after(60):
            while not url:
                buffer += await process.stderr.receive_some()
                for line in buffer.decode(errors="replace").splitlines():
                    if line.startswith("fanfold mcp: ") and line.endswith("/mcp"):
                        url = line.removeprefix("fanfold mcp: ")
        declaration = ServerDeclaration(
            "fanfold", "test", url=url, headers=(("Authorization", "Bearer ${MCP_TOK}"),)
        )
        environ = {**os.environ, "MCP_TOK": token}
        async with McpHub.open([declaration], cwd=tmp_path, environ=environ) as hub:
            tools = await _tools(hub)
            assert set(tools) == {
                "delegate_task",
                "list_sub_agents",
                "get_delegation_result",
                "approve_request",  # a person's decisions (issue 35)
                "deny_request",
                "answer_request",
            }
            out = await tools["delegate_task"].run({"task": "compute"}, ".")
        assert json.loads(out.content)["result"] == "42"
        wrong = ServerDeclaration("fanfold", "test", url=url, startup_timeout=20)
        async with McpHub.open([wrong], cwd=tmp_path) as hub:
            _, problems = await hub.discover()
        assert len(problems) == 1 and "MCP server 'fanfold'" in problems[0]
        process.terminate()


def test_fanfold_trust_takes_a_projects_mcp_json_and_shows_its_commands(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fanfold.cli import cli

    path = _mcp_json(tmp_path, tmp_path)
    assert declared_servers(tmp_path).servers[0].needs_trust
    trusted = CliRunner().invoke(cli, ["trust", str(path)])
    assert trusted.exit_code == 0, trusted.output
    assert f"MCP server ok runs: {sys.executable}" in trusted.output
    assert not declared_servers(tmp_path).servers[0].needs_trust
    (tmp_path / "bad").mkdir()
    broken = tmp_path / "bad" / ".mcp.json"
    broken.write_text('{"mcpServers": {"x": {"command": 3}}}')
    refused = CliRunner().invoke(cli, ["trust", str(broken)])
    assert refused.exit_code == 2
    assert (
        "not trusted" in refused.output and "command must be a non-empty string" in refused.output
    )


async def test_an_agent_file_in_the_project_declares_a_server_that_waits_for_trust(
    tmp_path: Path,
) -> None:
    from fanfold.agents.definitions import parse_definition

    project = tmp_path / "project"
    agents = project / ".claude" / "agents"
    agents.mkdir(parents=True)
    agent = agents / "weather.md"
    agent.write_text(
        "---\nname: weather\ndescription: asks\ntools: mcp__ok__echo\nmcpServers:\n"
        f"  ok:\n    command: {json.dumps(sys.executable)}\n"
        f"    args: [{json.dumps(str(SERVER))}, ok, {json.dumps(str(tmp_path))}]\n"
        "---\nAsk.\n"
    )
    _, problems = parse_definition(agent.read_text(), str(agent))
    assert problems == ()  # mcpServers is not an unknown key
    environ = {**os.environ, "HOME": str(tmp_path / "home")}
    (declared,) = declared_servers(project, environ=environ).servers
    assert (declared.name, declared.source, declared.needs_trust) == ("ok", str(agent), True)
    from click.testing import CliRunner

    from fanfold.cli import cli

    trusted = CliRunner().invoke(cli, ["trust", str(agent)])
    assert trusted.exit_code == 0, trusted.output
    assert "MCP server ok runs:" in trusted.output
    (declared,) = declared_servers(project, environ=environ).servers
    assert not declared.needs_trust
    async with McpHub.open([declared], cwd=project) as hub:
        tools = await _tools(hub)
    assert "echo" in tools


async def test_fanfold_mcp_as_a_server_of_fanfold_starts_no_servers_of_its_own(
    tmp_path: Path,
) -> None:
    """A project whose .mcp.json names `fanfold mcp` itself: the fanfold started as a
    server does not start it again (no chain of copies)."""
    project = tmp_path / "project"
    project.mkdir()
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"agents": [{"replies": [{"text": "42"}]}]}))
    options = ["--script", str(script), "--db", str(tmp_path / "inner.db"), "--cwd", str(project)]
    server = {
        "command": sys.executable,
        "args": ["-c", "from fanfold.cli import main; main()", "mcp", *options],
    }
    (project / ".mcp.json").write_text(json.dumps({"mcpServers": {"fanfold": server}}))
    TrustStore.default().trust(project / ".mcp.json")
    declared = declared_servers(project).servers
    async with McpHub.open(declared, cwd=project) as hub:
        tools = await _tools(hub)
        assert "delegate_task" in tools
        tail = hub.servers["fanfold"].stderr_tail()
    assert "not starting MCP servers of its own" in tail


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        # A cloned project's .mcp.json ended `fanfold run`, `tools`, `mcp` and `trust`
        # in a RecursionError traceback.
        (".mcp.json", '{"mcpServers": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        ("fanfold.toml", "x = " + "[" * 100_000 + "]" * 100_000, "nested more than 32 deep"),
        (
            ".fanfold/agents/deep.md",
            "---\nname: deep\ndescription: d\nmcpServers: " + "[" * 5_000 + "]" * 5_000 + "\n---\n",
            None,  # `fanfold agents` reports the file; it declares no server
        ),
    ],
)
def test_a_project_file_nested_too_deeply_is_a_problem_not_a_crash(
    tmp_path: Path, name: str, text: str, problem: str | None
) -> None:
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text)
    declared = declared_servers(tmp_path, environ={**os.environ, "HOME": str(tmp_path)})
    assert declared.servers == ()
    if problem is None:
        assert declared.problems == ()
    else:
        (line,) = declared.problems
        assert problem in line and name in line
