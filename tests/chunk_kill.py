"""A placed fan-out whose chunks' worker is killed (issue 32 item 3): shared by
``test_worker_chunk_kill.py`` (a few kills) and ``bench/bench_chunk_kill.py`` (a
campaign, counts for bench/README.md).

Workers (``fanfold worker`` processes, ``test_worker_dbos.Bench``) share fanfold's log
and DBOS's queue in one database of a ``pg_cluster``. A tree fans out to ``children``
children at once (``max_concurrent`` = ``max_tasks_per_call`` = ``children``), placed in
chunks of ``chunk`` (``--spread-at`` below the fan-out): the chunks spread over the
workers. Each child thinks, appends its task to ``marks.txt`` in the tree's folder with
``bash`` (a command that must run once), thinks again and submits. Once a worker that
does not run the root holds chunks, it is killed with SIGKILL at a random moment; nobody
is restarted.
``kill_one`` then waits for the root and counts what the issue counts.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from runtime_helpers import reply, spawn, submit, think

LATENCY = 0.2  # per model call; a child makes four


def script(children: int) -> dict[str, Any]:
    return {
        "latency": LATENCY,
        "agents": [
            {
                "match": {"path": "root"},
                "replies": [
                    reply("", spawn(*(f"part {i}" for i in range(children)))),
                    reply("all parts: {{last_tool_result}}"),
                ],
            },
            {
                "match": {"depth": 1},
                "replies": [
                    reply("", think()),
                    reply("", ("bash", {"command": "echo '{{task}}' >> marks.txt"})),
                    reply("", think()),
                    reply("", submit("done {{task}}.")),
                ],
            },
        ],
    }


def worker_args(chunk: int, chunk_concurrency: int) -> tuple[str, ...]:
    return (
        "--spread-at", str(chunk), "--chunk-size", str(chunk),
        "--chunk-concurrency", str(chunk_concurrency),
    )  # fmt: skip


def _pending(url: str, executor: str, name: str) -> list[str]:
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT workflow_uuid FROM dbos.workflow_status "
            "WHERE status = 'PENDING' AND executor_id = %s AND name = %s",
            (executor, name),
        ).fetchall()
    return sorted(r[0] for r in rows)


def _wait_for(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(what)
        time.sleep(0.05)


def kill_one(
    bench: Any,
    tree_id: str,
    children: int,
    rng: random.Random,
    *,
    cwd: Path,
    delay: float = 1.5,
    timeout: float = 60,
) -> dict[str, Any]:
    """Queue one fan-out, kill a worker holding its chunks (not its root's) a random
    0-``delay`` s after the first child came to rest, wait up to ``timeout`` s for the
    root; the counts."""
    from fanfold.worker.client import enqueue_tree
    from fanfold.worker.spec import TreeSpec

    limits = (("max_concurrent", children), ("max_tasks_per_call", children))
    cwd.mkdir(parents=True, exist_ok=True)
    enqueue_tree(bench.url, TreeSpec(tree_id, "fan out", str(cwd), limits=limits))
    live: dict[str, str] = {n: e for n, (p, e) in bench.workers.items() if p.poll() is None}
    root_worker = _wait_for(
        "no worker took the tree",
        lambda: next((n for n, e in live.items() if _pending(bench.url, e, "fanfold.tree")), None),
    )

    def holder() -> tuple[str, list[str]] | None:
        for name, executor in live.items():
            chunks = _pending(bench.url, executor, "fanfold.chunk") if name != root_worker else []
            if chunks:
                return str(name), chunks
        return None

    victim, held = _wait_for("no other worker took a chunk", holder)
    # A random moment once children are coming to rest: some of the victim's chunks'
    # outcomes committed just before it dies (where the issue lost them).
    _wait_for("no child came to rest", lambda: _at_rest_children(bench.log, tree_id))
    wait = rng.uniform(0, delay)
    time.sleep(wait)
    held = _pending(bench.url, bench.workers[victim][1], "fanfold.chunk")
    if not held:
        # Its chunks ended meanwhile (a light load runs them fast): the next worker seen
        # holding one, at once, if the fan-out still has chunks to run. The chunks it
        # held are the ones read when it was chosen (a second read could come after
        # the last of them ended, and the kill would meet none).
        victim, held = _wait_for("no worker held chunks any more", holder, timeout=30)
    proc = bench.workers[victim][0]
    at_rest_before = _at_rest_children(bench.log, tree_id)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    start = time.monotonic()
    finished = _wait_root(bench.log, tree_id, timeout)
    counts = count(bench.log, tree_id, children, cwd / "marks.txt")
    counts.update(
        victim=victim,
        root_worker=root_worker,
        delay=round(wait, 2),
        chunks_held=len(held),
        children_at_rest_at_kill=at_rest_before,
        finished=finished,
        seconds_after_kill=round(time.monotonic() - start, 1),
        # A survivor that stopped (its lease claimed: a worker starved of CPU past its
        # lease is taken for dead) leaves nobody to finish the tree: not this fault.
        survivors_stopped={
            n: p.returncode
            for n, (p, _) in bench.workers.items()
            if n in live and n != victim and p.poll() is not None
        },
    )
    return counts


def _at_rest_children(log: str, tree_id: str) -> int:
    from fanfold.db import open_store

    with open_store(log, read_only=True) as store:
        return sum(1 for k in store.children(tree_id) if k.status != "running")


def _wait_root(log: str, tree_id: str, timeout: float) -> bool:
    from fanfold.db import UnknownConversation, open_store

    deadline = time.monotonic() + timeout
    with open_store(log, read_only=True) as store:
        while time.monotonic() < deadline:
            try:
                if store.conversation(tree_id).status != "running":
                    return True
            except UnknownConversation:
                pass
            time.sleep(0.2)
    return False


def count(log: str, tree_id: str, children: int, marks: Path) -> dict[str, Any]:
    """Of a tree: children at rest whose outcome the root never took (lost), outcomes
    taken more than once (duplicated), marker lines written more than once per task
    (commands twice), and whether ``replay.verify`` finds the tree identical."""
    from fanfold.db import open_store
    from fanfold.replay import verify
    from fanfold.statemachine.events import SubAgentFinished

    with open_store(log, read_only=True) as store:
        kids = store.children(tree_id)
        accepted = Counter(
            e.event.child_id for e in store.events(tree_id) if isinstance(e.event, SubAgentFinished)
        )
        ended = [k.id for k in kids if k.status != "running"]
        ok = verify(store, tree_id, tree=True).ok
        root_status = store.conversation(tree_id).status
    lines = Counter(marks.read_text().splitlines()) if marks.exists() else Counter()
    tasks = [f"part {i}" for i in range(children)]
    return {
        "children": len(kids),
        "children_at_rest": len(ended),
        "root_status": str(root_status),
        "lost": sum(1 for k in ended if k not in accepted),
        "duplicated": sum(n - 1 for n in accepted.values() if n > 1),
        "commands_twice": sum(lines[t] - 1 for t in tasks if lines[t] > 1),
        "commands_missing": sum(1 for t in tasks if lines[t] == 0),
        "verify_ok": ok,
    }
