"""``fanfold worker`` offers its own MCP servers to the trees it runs (issue 25;
DESIGN.md, "What a detached tree carries").

One real worker process on a database of the ``pg_cluster`` (log and queue in one),
started in a folder whose configuration (``$FANFOLD_CONFIG``, the worker operator's
own file) declares a stdio server, the tests' ``mcp_test_server.py``. A tree queued
for a folder whose own ``.mcp.json`` declares another server (trusted, so only the
worker's rule keeps it from starting) calls the worker's server's tool.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pg_cluster import NOT_INSTALLED, find_binaries
from runtime_helpers import reply

pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")
pytest.importorskip("mcp", reason="needs the mcp extra: pip install '.[mcp]'")
if find_binaries() is None:
    pytest.skip(NOT_INSTALLED, allow_module_level=True)

pytestmark = pytest.mark.slow

SERVER = Path(__file__).parent / "mcp_test_server.py"
FANFOLD = [sys.executable, "-c", "from fanfold.cli import main; main()"]

SCRIPT: dict[str, Any] = {
    "latency": 0.01,
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                reply("", ("mcp__srv__echo", {"text": "from the worker"})),
                reply("answer: {{last_tool_result}}"),
            ],
        }
    ],
}


def _until(what: str, check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _processes_naming(text: str) -> list[int]:
    """The processes whose command line holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline:
                found.append(int(entry.name))
    return found


def test_a_worker_offers_its_own_mcp_servers_and_never_the_trees_folders(
    pg_url: str, tmp_path: Path
) -> None:
    from fanfold.db import open_store
    from fanfold.statemachine import ToolResultMessage
    from fanfold.trust import TrustStore
    from fanfold.worker.client import enqueue_tree
    from fanfold.worker.spec import TreeSpec

    home = tmp_path / "worker"  # the worker's folder and its traces
    tree = tmp_path / "project"  # the folder the enqueuer chose for the tree
    marks = tmp_path / "project-marks"
    for folder in (home, tree, marks):
        folder.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("FANFOLD_DB", "FANFOLD_CONFIG")},
        "FANFOLD_KEY_FILE": str(tmp_path / "key"),
        "FANFOLD_TRUST_FILE": str(tmp_path / "trust.json"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    config = home / "worker.toml"
    config.write_text(
        f"[mcp_servers.srv]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = {json.dumps([str(SERVER), 'ok', str(home)])}\n"
    )
    env["FANFOLD_CONFIG"] = str(config)
    # The tree's folder declares a server of its own, trusted by this user: a worker
    # that read the tree's folder would start it, and it would leave its mark.
    project_servers = tree / ".mcp.json"
    proj = {"command": sys.executable, "args": [str(SERVER), "ok", str(marks)]}
    project_servers.write_text(json.dumps({"mcpServers": {"proj": proj}}))
    TrustStore.default(env).trust(project_servers)
    # An agent of the tree's folder names a server the worker does not run.
    agents = tree / ".fanfold" / "agents"
    agents.mkdir(parents=True)
    (agents / "helper.md").write_text(
        "---\nname: helper\ndescription: helps\nmcpServers: [github]\n---\nHelp.\n"
    )
    script = home / "script.json"
    script.write_text(json.dumps(SCRIPT))
    err = home / "worker.err"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [*FANFOLD, "worker", "--db", pg_url, "--script", str(script),
             "--lease", "2.5", "--poll", "0.05", "--allow-cwd", str(tree)],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=home,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert " ready " in line, (line, err.read_text())
        # Started once, with the worker, before any tree.
        assert (home / "started-ok").exists(), err.read_text()
        assert _processes_naming(f"{SERVER} ok {home}")  # the server, its supervisor
        root = f"mcp{os.getpid()}"
        enqueue_tree(pg_url, TreeSpec(root, "use the server", str(tree)))
        waited = subprocess.run(
            [*FANFOLD, "wait", root, "--db", pg_url, "--timeout", "30"],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
        )  # fmt: skip
        assert waited.returncode == 0, (waited.stdout, waited.stderr, err.read_text())
        assert "answer: echo: from the worker" in waited.stdout, waited.stdout
        with open_store(pg_url, read_only=True) as store:
            state = store.load_state(root)
        names = {t.name for t in state.tools}
        assert "mcp__srv__echo" in names
        assert not any(n.startswith("mcp__proj__") for n in names), names
        results = [m for m in state.history if isinstance(m, ToolResultMessage)]
        assert [(r.result.name, r.result.is_error) for r in results] == [("mcp__srv__echo", False)]
        said = err.read_text()
        assert "github" in said and "helper" in said, said
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, err.read_text()
        # Stopped with the worker.
        assert _processes_naming(f"{SERVER} ok {home}") == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The tree's folder's own server was never started.
    assert not (marks / "started-ok").exists()
    assert not any(marks.iterdir())


def _worker(pg_url: str, folder: Path, env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    with open(folder / "worker.err", "w") as stderr:
        return subprocess.Popen(
            # The trees run in the test's folder, above the worker's own.
            [*FANFOLD, "worker", "--db", pg_url, "--lease", "1", "--poll", "0.05",
             "--allow-cwd", str(folder.parent), *extra],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=folder,
        )  # fmt: skip


def test_a_worker_whose_servers_start_slower_than_its_lease_keeps_it(
    pg_url: str, tmp_path: Path
) -> None:
    """The servers start before the worker's lease is renewed for the first time: a
    start longer than the lease had the running worker claim the starting one's lease,
    which then stopped (exit 3) at its first renewal, before taking a tree."""
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("FANFOLD_DB", "FANFOLD_CONFIG")},
        "FANFOLD_KEY_FILE": str(tmp_path / "key"),
        "FANFOLD_TRUST_FILE": str(tmp_path / "trust.json"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    running, starting = tmp_path / "running", tmp_path / "starting"
    for folder in (running, starting):
        folder.mkdir()
    go = tmp_path / "go"  # the slow server answers once this file exists
    config = starting / "worker.toml"
    config.write_text(
        f"[mcp_servers.slow]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = {json.dumps([str(SERVER), 'ok', str(starting)])}\n"
        f"env = {{ WAIT_FOR = {json.dumps(str(go))} }}\n"
    )
    procs = [_worker(pg_url, running, env)]
    try:
        first = procs[0]
        assert first.stdout is not None
        assert " ready " in first.stdout.readline(), (running / "worker.err").read_text()
        procs.append(_worker(pg_url, starting, {**env, "FANFOLD_CONFIG": str(config)}))
        second = procs[1]
        _until("the slow server's start", (starting / "started-ok").exists)
        # Three leases and more: the running worker claims a lease not renewed by then.
        time.sleep(3.5)
        go.touch()
        assert second.stdout is not None
        line = second.stdout.readline()
        assert " ready " in line, (line, (starting / "worker.err").read_text())
        time.sleep(1.5)  # past a lease: its renewals go on
        assert second.poll() is None, (starting / "worker.err").read_text()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0, (starting / "worker.err").read_text()
        assert first.wait(timeout=30) == 0, (running / "worker.err").read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_tree_taken_over_by_a_worker_lacking_its_server_gets_error_results(
    pg_url: str, tmp_path: Path
) -> None:
    """The recorded MCP tools are bound by name on the worker that takes a tree over:
    one without that server answers the tree's calls with an error result naming the
    tool (as a ``resume`` whose server is gone), and the tree goes on."""
    from fanfold.db import open_store
    from fanfold.statemachine import ToolResultMessage
    from fanfold.worker.client import enqueue_tree
    from fanfold.worker.spec import TreeSpec

    env = {
        **{k: v for k, v in os.environ.items() if k not in ("FANFOLD_DB", "FANFOLD_CONFIG")},
        "FANFOLD_KEY_FILE": str(tmp_path / "key"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    served, lacking = tmp_path / "served", tmp_path / "lacking"
    for folder in (served, lacking):
        folder.mkdir()
    config = served / "worker.toml"
    config.write_text(
        f"[mcp_servers.srv]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = {json.dumps([str(SERVER), 'ok', str(served)])}\n"
    )
    # The first worker's model never answers in time: it holds the tree until killed.
    holding = {"agents": [{"match": {"path": "root"}, "replies": [reply("", latency=60)]}]}
    (served / "script.json").write_text(json.dumps(holding))
    (lacking / "script.json").write_text(json.dumps(SCRIPT))
    first = _worker(
        pg_url, served, {**env, "FANFOLD_CONFIG": str(config)},
        "--script", str(served / "script.json"),
    )  # fmt: skip
    procs = [first]
    try:
        assert first.stdout is not None
        assert " ready " in first.stdout.readline(), (served / "worker.err").read_text()
        root = f"taken{os.getpid()}"
        enqueue_tree(pg_url, TreeSpec(root, "use the server", str(tmp_path)))
        with open_store(pg_url, read_only=True) as store:

            def started() -> bool:
                try:
                    return store.conversation(root) is not None
                except Exception:
                    return False

            _until("the tree's start", started)
        second = _worker(pg_url, lacking, env, "--script", str(lacking / "script.json"))
        procs.append(second)
        assert second.stdout is not None
        assert " ready " in second.stdout.readline(), (lacking / "worker.err").read_text()
        first.kill()
        first.wait()
        waited = subprocess.run(
            [*FANFOLD, "wait", root, "--db", pg_url, "--timeout", "30"],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
        )  # fmt: skip
        assert waited.returncode == 0, (waited.stdout, waited.stderr)
        with open_store(pg_url, read_only=True) as store:
            state = store.load_state(root)
        # Recorded by the first worker, which served it.
        assert "mcp__srv__echo" in {t.name for t in state.tools}
        results = [m.result for m in state.history if isinstance(m, ToolResultMessage)]
        assert [(r.name, r.is_error) for r in results] == [("mcp__srv__echo", True)]
        lacks = "MCP server 'srv' is not declared in this run's configuration"
        assert lacks in results[0].content, results[0].content
        assert f"answer: {lacks}" in " ".join(waited.stdout.split()), waited.stdout
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0, (lacking / "worker.err").read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
