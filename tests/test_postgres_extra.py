"""The ``postgres`` extra (DBOS, psycopg, and SQLAlchemy under DBOS) is imported only
when asked for: not by ``import fanfold``, the runtime, the log or replay, nor by a
``fanfold run`` on SQLite from start to answer (issue 25: the embedded default stays
the default, and pays nothing for the distributed mode)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Where the extra is not installed nothing could import it, and these checks could not
# fail: they are skipped there (CI installs the extra).
pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")

HEAVY = ("dbos", "psycopg", "psycopg_binary", "psycopg_pool", "sqlalchemy")

# Prints, at exit, which of the extra's top-level packages the process imported.
REPORT = (
    "import atexit, sys\n"
    f"heavy = {HEAVY!r}\n"
    "atexit.register(lambda: print('heavy:', sorted({m.split('.')[0] for m in sys.modules}\n"
    "                                               & set(heavy))))\n"
)


def _python(code: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", REPORT + code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_importing_fanfold_and_its_parts_loads_nothing_of_the_extra() -> None:
    done = _python(
        "import fanfold, fanfold.cli, fanfold.runtime, fanfold.db, fanfold.replay\n"
        "import fanfold.providers.scripted, fanfold.tools.registry\n"
        "fanfold.tool\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "heavy: []"


def test_a_cli_run_on_sqlite_loads_nothing_of_the_extra(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "latency": 0.01,
                "agents": [
                    {
                        "match": {"path": "root"},
                        "replies": [
                            {
                                "tool_calls": [
                                    {
                                        "name": "spawn_agents",
                                        "arguments": {"tasks": [{"task": "count"}]},
                                    }
                                ]
                            },
                            {"text": "the answer is {{last_tool_result}}"},
                        ],
                    },
                    {
                        "match": {"depth": 1},
                        "replies": [
                            {
                                "tool_calls": [
                                    {"name": "submit_result", "arguments": {"result": "3"}}
                                ]
                            }
                        ],
                    },
                ],
            }
        )
    )
    done = _python(
        "from fanfold.cli import main\nmain()\n",
        "run",
        "--no-live",
        "--db",
        str(tmp_path / "log.db"),
        "--script",
        str(script),
        "--cwd",
        str(tmp_path),
        "go",
        cwd=tmp_path,
    )
    assert "the answer is " in done.stdout and '"result":"3"' in done.stdout, done.stderr
    assert [line for line in done.stdout.splitlines() if line.startswith("heavy:")] == ["heavy: []"]
