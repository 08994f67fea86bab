"""Issue 35 on a PostgreSQL log: the decisions table lives in the database, so a
decision written by another process (``fanfold approve --db postgresql://...``)
reaches the runtime holding the request, and racing deciders get one winner."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import trio
from runtime_helpers import reply, script

from fanfold.db import open_store
from fanfold.runtime import Runtime
from fanfold.runtime.approvals import AlreadyDecided, Decision, PgDecisions
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import Limits, ToolResultMessage
from fanfold.tools.registry import ToolSet

CLI = [sys.executable, "-c", "from fanfold.cli import main; main()"]


async def test_fanfold_approve_from_another_process_reaches_a_runtime_on_postgres(
    pg_url: str, tmp_path: Path
) -> None:
    provider = script(0.0, root=[reply("", ("bash", {"command": "echo asked"})), reply("done")])
    async with Runtime.open(
        pg_url,
        provider,
        ToolSet.default(),
        limits=Limits(),
        logger=quiet_logger(),
        threaded_writes=False,
    ) as runtime:
        runtime.decision_poll = 0.05
        root = await runtime.start("go", cwd=tmp_path, ask=["bash"])
        with trio.fail_after(20):
            while not runtime.pending():
                await trio.sleep(0.01)
        request = runtime.pending()[0]
        # Another process lists it from the database, then approves it with edited
        # arguments; the runtime here polls the database's table and applies it.
        listed = await trio.to_thread.run_sync(
            lambda: subprocess.run(
                [*CLI, "pending", "--json", "--db", pg_url],
                capture_output=True,
                text=True,
                timeout=60,
            )
        )
        assert listed.returncode == 0, listed.stderr
        assert f'"id": "{request.id}"' in listed.stdout
        done = await trio.to_thread.run_sync(
            lambda: subprocess.run(
                [*CLI, "approve", root, "--args", '{"command": "echo edited"}', "--db", pg_url],
                capture_output=True,
                text=True,
                timeout=60,
            )
        )
        assert done.returncode == 0, done.stderr
        assert f"approved {request.id}" in done.stdout
        with trio.fail_after(20):
            result = await runtime.wait(root)
        assert result.text == "done"
        state = runtime.state(root)
        results = [
            m.result.content.split("\n")[0]
            for m in state.history
            if isinstance(m, ToolResultMessage)
        ]
        assert results == ["edited"]
        table = PgDecisions(pg_url)
        try:
            with trio.fail_after(20):  # marked once its event is committed
                while table.state_of(request.id) != "applied":
                    await trio.sleep(0.02)
        finally:
            table.close()


def test_deciders_racing_on_postgres_get_one_winner(pg_url: str) -> None:
    """Eight writers, each with its own connection, decide one request at once (the
    first use of the table by all of them: its creation races too)."""
    open_store(pg_url).close()  # the log exists (a runtime made it)
    start = threading.Barrier(8)
    outcomes: list[str] = []

    def decide(n: int) -> None:
        table = PgDecisions(pg_url)
        try:
            start.wait()
            table.write(Decision("x:1", "deny", None, f"decider {n}", f"d{n}", 0.0))
            outcomes.append("won")
        except AlreadyDecided:
            outcomes.append("already decided")
        finally:
            table.close()

    threads = [threading.Thread(target=decide, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["already decided"] * 7 + ["won"]
    table = PgDecisions(pg_url)
    assert table.state_of("x:1") == "new"
    taken = table.write_many(
        [Decision("x:1", "grant", None, "", "", 0.0), Decision("x:2", "grant", None, "", "", 0.0)]
    )
    assert taken == ["x:1"]
    assert [d.request for d in table.new(["x:1", "x:2", "x:3"])] == ["x:1", "x:2"]
    table.mark_many([("x:1", "applied")])
    assert table.state_of("x:1") == "applied"
    table.close()
