"""Logs for the trace tests: the offline example, a tree with every kind of mark and
an untrusted reply, a 1,000-agent fan-out, and a log edited to fail verify."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner
from replay_helpers import as_format_5, edit

from fanfold.cli import cli
from fanfold.db import Store
from fanfold.db.codec import SCHEMA_VERSION

# A reply that would run script if any text of the log reached the page as markup.
HOSTILE = (
    '</script><script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
    "<b>not bold</b> & &amp; \u2028 end"
)

MARKS_SCRIPT: dict[str, Any] = {
    "latency": 0.02,
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                {
                    "text": HOSTILE,
                    "tool_calls": [
                        {
                            "name": "spawn_agents",
                            "arguments": {
                                "tasks": [
                                    {"task": "run echo"},
                                    {"task": "retry then " + HOSTILE},
                                    {"task": "too slow", "timeout": 0.3},
                                ]
                            },
                        }
                    ],
                    "usage": {"input_tokens": 100, "output_tokens": 10},
                },
                {"text": "final " + HOSTILE, "usage": {"input_tokens": 200, "output_tokens": 20}},
            ],
        },
        {
            "match": {"path": "root/1"},
            "replies": [
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo hi"}}]},
                {"tool_calls": [{"name": "submit_result", "arguments": {"result": "hi"}}]},
            ],
        },
        {
            "match": {"path": "root/2"},
            "replies": [
                {
                    "fail_first": [{"kind": "rate_limit", "retry_after": 0.05}],
                    "tool_calls": [{"name": "think", "arguments": {"thought": HOSTILE}}],
                    "usage": {"input_tokens": 40, "output_tokens": 4},
                },
                {"tool_calls": [{"name": "submit_result", "arguments": {"result": HOSTILE}}]},
            ],
        },
        {"match": {"path": "root/3"}, "replies": [{"latency": 5.0, "text": "never"}]},
    ],
}


def _run(folder: Path, args: list[str]) -> None:
    """Invoke the CLI with a provenance key of ``folder`` (module-scoped fixtures run
    before the suite's per-test key is set: never the user's own key)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FANFOLD_KEY_FILE", str(folder / "provenance.key"))
        result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output


def run_script(folder: Path, script: dict[str, Any], task: str = "go") -> tuple[Path, str]:
    """``fanfold run`` of ``script`` in ``folder``: (database, root id)."""
    path = folder / "script.json"
    path.write_text(json.dumps(script))
    db = folder / "log.db"
    args = ["run", "--no-live", "--db", str(db), "--script", str(path), "--cwd", str(folder)]
    _run(folder, [*args, task])
    with Store.open(db) as store:
        (root,) = store.list_roots()
    return db, root.id


def offline_example(folder: Path) -> tuple[Path, str]:
    """The README's offline example (`fanfold run` with the built-in script)."""
    db = folder / "demo.db"
    _run(folder, ["run", "--no-live", "--db", str(db), "Review this repository"])
    with Store.open(db) as store:
        (root,) = store.list_roots()
    return db, root.id


def fan_out_log(folder: Path, n: int) -> tuple[Path, str]:
    """The benchmark's fan-out (bench/workload.py) with ``n`` sub-agents."""
    from bench.workload import fanfold_fanout

    db = folder / f"fanout{n}.db"

    async def main() -> None:
        await fanfold_fanout(n, db, logging_on=False)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FANFOLD_KEY_FILE", str(folder / "provenance.key"))
        trio.run(main)
    with Store.open(db) as store:
        (root,) = store.list_roots()
    return db, root.id


def diverge(db: Path, conversation_id: str, seq: int) -> None:
    """Edit the recorded effects of one step (and reseal the row checksums), as a
    reducer that decided differently would have written them: verify then diverges.
    The log is first rewritten as logs were before the events-only log (effect rows),
    so that there are recorded effects to differ from."""
    as_format_5(db)
    edit(
        db,
        (
            "INSERT INTO effects (conversation_id, seq, idx, type, payload) "
            "SELECT ?, ?, COALESCE(MAX(idx) + 1, 0), 'AbortCall', ? FROM effects "
            "WHERE conversation_id = ? AND seq = ?",
            (
                conversation_id,
                seq,
                json.dumps({"v": SCHEMA_VERSION, "type": "AbortCall", "call": 999}),
                conversation_id,
                seq,
            ),
        ),
    )


# The token of the `fanfold ui` servers the tests start (a real launch draws a new one).
UI_TOKEN = "test-token-0123456789abcdef"


def ui_cookie(base: str) -> dict[str, str]:
    """The cookie that carries UI_TOKEN to the server at ``base`` (http://HOST:PORT),
    as a browser holds it after opening the printed URL."""
    return {f"fanfold-ui-{base.rsplit(':', 1)[1]}": UI_TOKEN}


# A root delegates two tasks; root/2 answers in three lines (the fork edits the second).
FORKED_SCRIPT: dict[str, Any] = {
    "latency": 0.0,
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                {
                    "tool_calls": [
                        {
                            "name": "spawn_agents",
                            "arguments": {"tasks": [{"task": "a"}, {"task": "b"}]},
                        }
                    ]
                },
                {"text": "the answer is {{last_tool_result}}"},
            ],
        },
        {"match": {"path": "root/1"}, "replies": [{"text": "a done"}]},
        {"match": {"path": "root/2"}, "replies": [{"text": "line one\nline two\nline three"}]},
    ],
}

EDITED_REPLY = "line one\nline 2 edited " + HOSTILE + "\nline three"


def forked_with_edit(folder: Path) -> tuple[Path, str, str]:
    """A run of FORKED_SCRIPT, and a fork of it at root/2's first step whose reply is
    EDITED_REPLY, continued: (database, original's root, fork's root)."""
    db, root = run_script(folder, FORKED_SCRIPT)
    reply = folder / "reply.txt"
    reply.write_text(EDITED_REPLY, encoding="utf-8")
    script = folder / "script.json"
    args = ["fork", root, "--agent", "2", "--at", "0", "--id", "fk", "--reply", str(reply)]
    _run(folder, [*args, "--continue", "--script", str(script), "--db", str(db)])
    return db, root, "fk"
