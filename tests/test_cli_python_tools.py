"""``--tools MODULE:ATTR`` for ``fanfold run``, ``resume`` and ``send``: a real
``fanfold run`` with the user's Python tools, killed with SIGKILL while one of them
runs, then resumed: without the tools the tree is left unfinished with one line
naming them and how to supply them (never an "unknown tool" result), with them it
goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner

from fanfold.cli import cli
from fanfold.db import Store
from fanfold.statemachine import ToolResultMessage

FANFOLD = [sys.executable, "-c", "from fanfold.cli import main; main()"]

TOOLS = textwrap.dedent(
    '''
    import os
    from pathlib import Path

    import trio

    import fanfold


    @fanfold.tool
    def note(text: str) -> str:
        """Write a note.

        Args:
            text: What to note.
        """
        return "noted " + text


    @fanfold.tool
    async def wait_here(name: str) -> str:
        """Wait a long time.

        Args:
            name: Anything.
        """
        Path(os.environ["STARTED"]).write_text(name)
        await trio.sleep(600)
        return "waited"


    TOOLS = [note, wait_here]
    '''
)

SCRIPT = {
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                {"tool_calls": [{"name": "wait_here", "arguments": {"name": "x"}}]},
                {"tool_calls": [{"name": "note", "arguments": {"text": "hi"}}]},
                {"text": "done"},
                {"tool_calls": [{"name": "note", "arguments": {"text": "again"}}]},
                {"text": "done again"},
            ],
        }
    ]
}


async def _until(condition: Any) -> None:
    """Wait (bounded, not timed) until ``condition()`` holds."""
    with trio.fail_after(60):
        while not condition():
            await trio.sleep(0.05)


def _fanfold(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FANFOLD, *args], capture_output=True, text=True, timeout=300, env=env)


def _results(db: Path, root: str) -> list[tuple[str, str, bool]]:
    with Store.open(db, read_only=True) as store:
        state = store.load_state(root)
    return [
        (m.result.name, m.result.content, m.result.is_error)
        for m in state.history
        if isinstance(m, ToolResultMessage)
    ]


async def test_a_run_with_python_tools_killed_resumes_only_with_its_tools(
    tmp_path: Path,
) -> None:
    (tmp_path / "mytools.py").write_text(TOOLS)
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    db = tmp_path / "t.db"
    started = tmp_path / "started"
    env = {**os.environ, "STARTED": str(started)}
    tools = ["--tools", str(tmp_path / "mytools.py") + ":TOOLS"]
    run = subprocess.Popen(
        [*FANFOLD, "run", "go", "--script", str(script), "--db", str(db), "--no-live", *tools],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    await _until(lambda: started.exists() or run.poll() is not None)
    assert run.poll() is None, run.stderr.read() if run.stderr else ""
    run.send_signal(signal.SIGKILL)
    run.wait()
    with Store.open(db, read_only=True) as store:
        (row,) = store.list_roots()
    root = row.id

    # Without its tools: one line naming them and how to supply them; nothing resumed.
    bare = _fanfold("resume", "--db", str(db), env=env)
    assert bare.returncode == 1, bare.stderr
    (line,) = [x for x in bare.stderr.splitlines() if "skipped" in x]
    assert line == (
        f"skipped tree {root}: it recorded Python tool(s) 'note', 'wait_here' that are not "
        "supplied here: pass the tools it was started with, --tools MODULE:ATTR "
        "(or --tools FILE.py:ATTR)"
    )
    assert "Traceback" not in bare.stderr
    with Store.open(db, read_only=True) as store:
        assert store.conversation(root).status == "running"  # left for a later resume
    assert _results(db, root) == []

    # With them: the call in flight at the kill is interrupted (never run again), and
    # the next call of a Python tool runs.
    resumed = _fanfold("resume", "--db", str(db), *tools, env=env)
    assert resumed.returncode == 0, resumed.stderr
    results = _results(db, root)
    assert results[0][0] == "wait_here" and results[0][2]
    assert results[0][1].startswith("interrupted")
    assert results[1] == ("note", "noted hi", False)

    # send: the same check, as one line and exit status 2.
    send = ["send", root, "again", "--script", str(script), "--db", str(db), "--no-live"]
    refused = _fanfold(*send, env=env)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: conversation {root} recorded Python tool(s) 'note', 'wait_here' that are "
        "not supplied here: pass the tools it was started with, --tools MODULE:ATTR "
        "(or --tools FILE.py:ATTR)"
    ]
    sent = _fanfold(*send, *tools, env=env)
    assert sent.returncode == 0, sent.stderr
    assert _results(db, root)[-1] == ("note", "noted again", False)


@pytest.mark.parametrize(
    ("source", "ref", "message"),
    [
        ("", "nosuchmodule_xyz:f", "cannot import nosuchmodule_xyz: No module named"),
        ("", "mytools.py:f", "no such file mytools.py"),
        ("x = 1\n", "{dir}/mytools.py:f", "has no attribute 'f'"),
        ("raise RuntimeError('boom')\n", "{dir}/mytools.py:f", "RuntimeError: boom"),
        ("def f(x):\n    return x\n", "{dir}/mytools.py:f", "tool 'f': no description"),
        ("import fanfold\n@fanfold.tool\ndef bash(x: str) -> str:\n    '''B.\n\n    Args:\n"
         "        x: X.\n    '''\n    return x\n", "{dir}/mytools.py:bash", "built-in"),
        ("", "nocolon", "expected MODULE:ATTR or FILE.py:ATTR"),
    ],
)  # fmt: skip
def test_a_bad_tools_reference_is_one_line(
    tmp_path: Path, source: str, ref: str, message: str
) -> None:
    if source:
        (tmp_path / "mytools.py").write_text(source)
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    result = CliRunner().invoke(
        cli,
        [
            *("run", "go", "--script", str(script), "--db", str(tmp_path / "t.db")),
            *("--no-live", "--tools", ref.format(dir=tmp_path)),
        ],
    )
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: --tools ") and message in line, line
    assert not (tmp_path / "t.db").exists() or "Traceback" not in result.output


def test_fanfold_tools_lists_the_python_tools_given_and_read_only_agents_get_readers(
    tmp_path: Path,
) -> None:
    (tmp_path / "mytools.py").write_text(
        textwrap.dedent(
            '''
            import fanfold


            @fanfold.tool(read_only=True)
            def lookup(key: str) -> str:
                """Look a key up.

                Args:
                    key: The key.
                """
                return key


            @fanfold.tool
            def store(key: str) -> str:
                """Store a key.

                Args:
                    key: The key.
                """
                return key
            '''
        )
    )
    ref = f"{tmp_path / 'mytools.py'}:lookup"
    ref2 = f"{tmp_path / 'mytools.py'}:store"
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    args = ["tools", "--cwd", str(tmp_path), "--tools", ref, "--tools", ref2, "--json"]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    tools = {t["name"]: t for t in json.loads(result.stdout)["tools"]}
    assert tools["lookup"]["source"] == f"Python: --tools {ref}, {ref2}"
    assert tools["lookup"]["read_only"] and not tools["store"]["read_only"]
    # The built-in explorer is read-only: it may call the tool that only reads.
    assert "explorer" in tools["lookup"]["agents"]
    assert "explorer" not in tools["store"]["agents"]
    assert tools["bash"]["source"] == "built-in"
    bad = CliRunner().invoke(cli, ["tools", "--tools", "no_such_module_x:f"], env=env)
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --tools "), bad.output


ASYNCIO_TOOLS = textwrap.dedent(
    '''
    import asyncio
    import os
    import threading
    from pathlib import Path

    import fanfold


    @fanfold.tool
    async def fetch_all(count: int) -> str:
        """Fetch pages concurrently (asyncio code, as an aiohttp user writes it).

        Args:
            count: How many.
        """
        queue = asyncio.Queue()

        async def fetch(i):
            await asyncio.sleep(0.01 * (count - i))
            await queue.put(i)

        await asyncio.gather(*(fetch(i) for i in range(count)))
        got = [queue.get_nowait() for _ in range(count)]
        return f"{got} on {threading.current_thread().name}"


    @fanfold.tool
    async def wait_long(name: str) -> str:
        """Wait a long time.

        Args:
            name: Anything.
        """
        Path(os.environ["STARTED"]).write_text(name)
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            Path(os.environ["STARTED"] + ".cancelled").write_text("CancelledError")
            raise
        return "waited"


    TOOLS = [fetch_all, wait_long]
    '''
)


async def test_an_asyncio_tool_runs_in_a_scripted_tree_and_a_stop_cancels_its_task(
    tmp_path: Path,
) -> None:
    """A tools file written with asyncio (asyncio.gather, asyncio.Queue, asyncio.sleep)
    runs through ``fanfold run`` without any marking (its module imports asyncio); a
    SIGTERM while one of its calls waits cancels the run cleanly and the asyncio task
    sees CancelledError. Before issue 33 both calls failed with "no running event loop"."""
    (tmp_path / "aiotools.py").write_text(ASYNCIO_TOOLS)
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "agents": [
                    {
                        "match": {"path": "root"},
                        "replies": [
                            {"tool_calls": [{"name": "fetch_all", "arguments": {"count": 3}}]},
                            {"tool_calls": [{"name": "wait_long", "arguments": {"name": "x"}}]},
                            {"text": "done"},
                        ],
                    }
                ]
            }
        )
    )
    db = tmp_path / "t.db"
    started = tmp_path / "started"
    env = {**os.environ, "STARTED": str(started)}
    run = subprocess.Popen(
        [
            *FANFOLD,
            *("run", "go", "--script", str(script), "--db", str(db), "--no-live"),
            *("--tools", str(tmp_path / "aiotools.py") + ":TOOLS"),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    await _until(lambda: started.exists() or run.poll() is not None)
    assert run.poll() is None, run.stderr.read() if run.stderr else ""
    run.send_signal(signal.SIGTERM)
    with trio.fail_after(60):
        code = await trio.to_thread.run_sync(run.wait)
    assert code == 143, run.stderr.read() if run.stderr else ""
    assert (tmp_path / "started.cancelled").read_text() == "CancelledError"
    with Store.open(db, read_only=True) as store:
        (row,) = store.list_roots()
    results = _results(db, row.id)
    assert results == [
        ("fetch_all", "[2, 1, 0] on fanfold-asyncio", False),
        ("wait_long", "cancelled: the conversation was cancelled while this tool ran", True),
    ]
