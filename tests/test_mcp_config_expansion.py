""".mcp.json read as Claude Code reads it (issue 33, item 4): ``${VAR}`` and
``${VAR:-default}`` in ``command``, ``args``, ``url``, ``env`` and ``headers``; the
trust of a project's server covering what its variables expand to; ``type: "sse"``
served by the SDK's HTTP+SSE client (a real SSE server from the SDK, a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from click.testing import CliRunner

from fanfold.cli import cli
from fanfold.mcp.client import McpHub
from fanfold.mcp.config import (
    ServerLaunch,
    declared_servers,
    expand,
    secret_variables,
    servers_of,
)
from fanfold.providers.config import ConfigError

SERVER = Path(__file__).with_name("mcp_test_server.py")


def _write(folder: Path, servers: dict[str, Any]) -> Path:
    path = folder / ".mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def test_variables_expand_in_command_args_and_url_with_defaults(tmp_path: Path) -> None:
    """``command``, ``args`` and ``url`` used to be taken literally (a server whose
    command was ``${HOME}/bin/x`` could not start); ``${VAR:-default}`` was not read
    anywhere."""
    path = _write(
        tmp_path,
        {
            "local": {
                "command": "${TOOLS}/server",
                "args": ["--root", "${ROOT:-/srv/data}", "$MODE", "--literal"],
                "env": {"TOKEN": "${GH_TOKEN:-anonymous}"},
            },
            "remote": {
                "type": "http",
                "url": "${API_BASE:-https://api.example.com}/mcp",
                "headers": {"Authorization": "Bearer ${API_KEY}"},
            },
        },
    )
    environ = {"TOOLS": "/opt/tools", "MODE": "fast", "ROOT": ""}
    local, remote = servers_of(path, environ)
    assert (local.command, local.args) == (
        "/opt/tools/server",
        ("--root", "/srv/data", "fast", "--literal"),
    )
    assert local.written == ServerLaunch(
        "${TOOLS}/server", ("--root", "${ROOT:-/srv/data}", "$MODE", "--literal"), None
    )
    assert remote.url == "https://api.example.com/mcp" and remote.transport == "http"
    # env and headers keep their references (secrets: read when the server starts).
    assert local.env == (("TOKEN", "${GH_TOKEN:-anonymous}"),)
    assert expand("${GH_TOKEN:-anonymous}", {}, "w") == "anonymous"
    assert expand("${GH_TOKEN:-anonymous}", {"GH_TOKEN": "t0k"}, "w") == "t0k"
    assert expand("Bearer ${API_KEY}", {"API_KEY": "k"}, "w") == "Bearer k"
    assert secret_variables([local, remote]) == {"GH_TOKEN", "API_KEY"}
    # A server with nothing to expand has no written form apart.
    plain = servers_of(_write(tmp_path, {"p": {"command": "srv", "args": ["a"]}}), environ)
    assert plain[0].written is None


def test_a_variable_without_default_that_is_not_set_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, {"local": {"command": "srv", "args": ["--db", "${DB_PATH}"]}})
    with pytest.raises(ConfigError, match=r"mcpServers\.local\.args\[1\]: needs \$DB_PATH"):
        servers_of(path, {})
    found = declared_servers(tmp_path, tmp_path / "none.toml", environ={"HOME": str(tmp_path)})
    assert found.servers == ()
    assert any("needs $DB_PATH, which is not set" in p for p in found.problems)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"type": "websocket", "url": "http://h/x"}, "type must be one of stdio, http, sse"),
        ({"type": "sse", "command": "srv"}, "type 'sse' needs url"),
        ({"type": "stdio", "url": "http://h/x"}, "type 'stdio' needs command"),
        ({"url": "${SCHEME:-ftp}://h/x"}, "url must be an http:// or https:// URL"),
    ],
)
def test_a_transport_type_fanfold_does_not_serve_is_refused_by_name(
    tmp_path: Path, body: dict[str, Any], problem: str
) -> None:
    """``type: "sse"`` was read as Streamable HTTP and failed with "HTTP 405"; any
    ``type`` was accepted without a look."""
    with pytest.raises(ConfigError, match=problem):
        servers_of(_write(tmp_path, {"s": body}), {})
    (sse,) = servers_of(_write(tmp_path, {"s": {"type": "sse", "url": "http://h/sse"}}), {})
    assert sse.transport == "sse" and sse.sse


def _launch_problem(found: Any) -> list[str]:
    return [p for p in found.problems if "waits for trust" in p]


async def test_trust_covers_what_the_variables_expand_to(tmp_path: Path) -> None:
    """A project's server whose command names a variable starts under the trust of its
    file only while the variable expands as it did when the user trusted it: an
    environment variable must not change, silently, what runs."""
    project = tmp_path / "project"
    project.mkdir()
    path = _write(
        project,
        {"ok": {"command": "${PY_BIN}", "args": [str(SERVER), "${MODE:-ok}", str(tmp_path)]}},
    )
    home = {"HOME": str(tmp_path / "home"), "FANFOLD_TRUST_FILE": os.environ["FANFOLD_TRUST_FILE"]}
    first = {**home, "PY_BIN": sys.executable}
    (waiting,) = declared_servers(project, environ=first).servers
    assert waiting.needs_trust and waiting.command == sys.executable
    trusted = CliRunner().invoke(cli, ["trust", str(path)], env={"PY_BIN": sys.executable})
    assert trusted.exit_code == 0, trusted.output
    assert f"MCP server ok runs: {sys.executable} {SERVER} ok" in trusted.output
    assert "(as written: '${PY_BIN}'" in trusted.output
    record = json.loads(Path(os.environ["FANFOLD_TRUST_FILE"]).read_text())
    assert set(record["trusted"][0]["launches"]) == {"ok"}

    found = declared_servers(project, environ=first)
    (declared,) = found.servers
    assert not declared.needs_trust and _launch_problem(found) == []
    async with McpHub.open([declared], cwd=project) as hub:
        tools, problems = await hub.discover()
        assert problems == []
        echo = next(t for t in tools if t.tool == "echo")
        assert (await echo.run({"text": "expanded"}, ".")).content == "echo: expanded"

    # Another program under the same variable: the file's bytes are the same, what
    # runs is not. It waits for trust, and says why (naming the variable, not its value).
    moved = declared_servers(project, environ={**home, "PY_BIN": "/tmp/evil/python"})
    (declared,) = moved.servers
    assert declared.needs_trust and declared.command == "/tmp/evil/python"
    (problem,) = _launch_problem(moved)
    assert "expands differently than when the file was trusted" in problem
    assert "${PY_BIN}" in problem and "/tmp/evil" not in problem
    # A default that now gives way to a set variable changes the launch too.
    mode = declared_servers(project, environ={**first, "MODE": "hang"})
    assert mode.servers[0].needs_trust
    # The listing still reads the record written with launches.
    listed = CliRunner().invoke(cli, ["trust", "--list"])
    assert listed.exit_code == 0 and str(path.resolve()) in listed.output


def test_a_file_trusted_before_launches_were_recorded_waits(tmp_path: Path) -> None:
    """A record written before the expansion was covered (no ``launches``) trusts
    the bytes only: a server whose launch names variables waits for a new trust."""
    from fanfold.trust import TrustStore

    project = tmp_path / "project"
    project.mkdir()
    path = _write(project, {"ok": {"command": "${PY_BIN}"}})
    environ = {"HOME": str(tmp_path), "FANFOLD_TRUST_FILE": os.environ["FANFOLD_TRUST_FILE"]}
    TrustStore.default(environ).trust(path)  # bytes only, as before
    found = declared_servers(project, environ={**environ, "PY_BIN": sys.executable})
    assert found.servers[0].needs_trust
    (problem,) = _launch_problem(found)
    assert "was trusted before fanfold recorded what its variables expand to" in problem
    # A server with nothing to expand is trusted by the bytes alone, as before.
    _write(project, {"plain": {"command": sys.executable}})
    TrustStore.default(environ).trust(path)
    assert not declared_servers(project, environ=environ).servers[0].needs_trust


@contextmanager
def sse_server(where: Path) -> Iterator[str]:
    """The test server over the SDK's HTTP+SSE transport: its ``/sse`` URL."""
    written = where / "port"
    with open(where / "server.err", "ab") as err:
        process = subprocess.Popen(
            [sys.executable, str(SERVER), "sse", str(where)],
            stdin=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "HTTP_PORT": "0"},
        )
    try:
        for _ in range(6000):  # bounded: 120 s at most
            if written.exists() or process.poll() is not None:
                break
            time.sleep(0.02)
        assert written.exists(), (where / "server.err").read_text()
        yield f"http://127.0.0.1:{written.read_text()}/sse"
    finally:
        process.kill()
        process.wait()


@pytest.mark.slow
async def test_an_sse_server_of_an_mcp_json_is_served_over_sse(tmp_path: Path) -> None:
    """``type: "sse"`` (and its URL from a variable with a default) reaches a real
    HTTP+SSE server from the SDK: tools listed, a call answered, headers expanded and
    sent. Before, it was spoken to as Streamable HTTP and failed with "HTTP 405"."""
    with sse_server(tmp_path) as url:
        path = _write(
            tmp_path,
            {
                "old": {
                    "type": "sse",
                    "url": "${SSE_URL:-http://127.0.0.1:9/sse}",
                    "headers": {"X-Token": "${SSE_TOKEN}"},
                }
            },
        )
        (declared,) = servers_of(path, {"SSE_URL": url})
        environ = {**os.environ, "SSE_TOKEN": "tok-123"}
        async with McpHub.open([declared], cwd=tmp_path, environ=environ) as hub:
            tools, problems = await hub.discover()
            assert problems == []
            echo = next(t for t in tools if t.tool == "echo")
            out = await echo.run({"text": "over sse"}, ".")
    assert (out.content, out.is_error) == ("echo: over sse", False)
    sent = [json.loads(line) for line in (tmp_path / "headers").read_text().splitlines()]
    assert {h["(method)"] for h in sent} >= {"GET", "POST"}
    assert all(h.get("x-token") == "tok-123" for h in sent)


# ------------------------------------------------------------------ tool filters (item 5)


def test_include_and_exclude_tools_are_read_from_both_files(tmp_path: Path) -> None:
    """Issue 33, item 5: per-server ``include_tools``/``exclude_tools`` (names or
    globs), in fanfold.toml and as extension keys of ``.mcp.json`` (camel case too)."""
    toml = tmp_path / "fanfold.toml"
    toml.write_text(
        '[mcp_servers.gh]\ncommand = "gh-mcp"\ninclude_tools = ["get_*", "list_issues"]\n'
        'exclude_tools = ["get_secret*"]\n'
    )
    (gh,) = servers_of(toml, {})
    assert (gh.include_tools, gh.exclude_tools) == (("get_*", "list_issues"), ("get_secret*",))
    offered = [
        t for t in ("get_issue", "get_secret_key", "list_issues", "delete_repo") if gh.offers(t)
    ]
    assert offered == ["get_issue", "list_issues"]
    (js,) = servers_of(_write(tmp_path, {"gh": {"command": "x", "excludeTools": ["delete_*"]}}), {})
    assert js.offers("get_issue") and not js.offers("delete_repo") and js.include_tools == ()
    (snake,) = servers_of(_write(tmp_path, {"gh": {"command": "x", "include_tools": ["a?"]}}), {})
    assert snake.offers("ab") and not snake.offers("abc") and not snake.offers("A b")
    bad = _write(tmp_path, {"gh": {"command": "x", "includeTools": "get_*"}})
    with pytest.raises(ConfigError, match="include_tools must be a list of tool names or globs"):
        servers_of(bad, {})


def _many(where: Path, name: str, count: int, **filters: list[str]) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": [str(SERVER), "many", str(where)],
        "env": {"MANY_TOOLS": str(count)},
        **filters,
    }


@pytest.mark.slow
async def test_a_server_of_300_tools_is_offered_what_its_filter_keeps(tmp_path: Path) -> None:
    """A server with more than 128 tools was refused whole; its filter now chooses
    what is offered, and the limit counts only that (a real SDK server, 300 tools;
    a server of 129 tools unfiltered, started beside it, is still refused)."""
    servers = {
        "chosen": _many(
            tmp_path, "chosen", 300, includeTools=["tool_1*"], excludeTools=["tool_19?"]
        ),
        "whole": _many(tmp_path, "whole", 129),
    }
    chosen, whole = servers_of(_write(tmp_path, servers), {})
    async with McpHub.open([chosen, whole], cwd=tmp_path) as hub:
        tools, problems = await hub.discover()
        names = sorted(t.tool for t in tools)
        # tool_1, tool_10..19, tool_100..199 (111), less tool_190..199.
        assert len(names) == 101 and "tool_1" in names and "tool_189" in names
        assert "tool_190" not in names and "tool_2" not in names
        assert {t.server.name for t in tools} == {"chosen"}
        out = await next(t for t in tools if t.tool == "tool_150").run({"x": 7}, ".")
        assert (out.content, out.is_error) == ("7", False)
    (problem,) = problems
    assert "'whole' offers more than 128 tools" in problem and "include_tools" in problem
