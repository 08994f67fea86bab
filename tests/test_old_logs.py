"""Logs written by earlier fanfold versions stay readable, verifiable and resumable.

The fixtures in tests/fixtures/logs are real databases written by fanfold itself at
older commits (see tests/fixtures/README.md): the offline demo at log schema 1
(``s1.db``), 2 (``s2.db``), 5 (``s5.db``, the last schema that stored each model
call's whole request) and 6 (``s6.db``, the last that stored every value in full in
every document); a run of schema 5 killed with SIGKILL while its root awaited a model
call (``s5-killed.db``, with the provenance key and the script it ran), and one of
schema 6 killed while its sub-agents ran (``s6-killed.db``). Each test works on a
copy: opening for writing migrates the copy.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fanfold.db import Store
from fanfold.db.checksum import effect_checksum
from fanfold.db.codec import SCHEMA_VERSION
from fanfold.replay import verify
from fanfold.replay.report import Divergence
from fanfold.statemachine import ToolResultMessage

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
FINISHED = ["s1", "s2", "s5"]
# Today's reducer reproduces these exactly. s1 (schema 1) offered a spawn_agents tool
# whose description of ``cwd`` has changed since: see the test of s1 below.
IDENTICAL = ["s2", "s5"]
# Written after requests were retired: no recorded request to check. s6-agents is
# examples/agents run by fanfold at 62a7ab3 (2026-11-26): compact documents and an
# agent catalogue, whose spawn_agents tool offered the context modes task_only and
# full (schema 7 added summary; its limits decode to the two it offered).
IDENTICAL_LATER = ["s6", "s6-agents"]


def _copy(name: str, tmp_path: Path) -> Path:
    target = tmp_path / f"{name}.db"
    shutil.copyfile(FIXTURES / f"{name}.db", target)
    return target


def _root(path: Path) -> str:
    with Store.open(path) as store:
        (row,) = store.list_roots()
        return row.id


def _fanfold(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from fanfold.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.parametrize("name", [*IDENTICAL, *IDENTICAL_LATER])
def test_an_old_log_verifies_identical_with_todays_reducer(name: str, tmp_path: Path) -> None:
    path = _copy(name, tmp_path)
    root = _root(path)
    with Store.open(path) as store:
        report = verify(store, root, tree=True)
        assert report.ok, report
        assert len(report.results) == len(store.tree(root)) > 1  # a root and sub-agents
        state = store.load_state(root)
    assert state.history  # the answer is there, read through the migrated database
    shown = _fanfold("show", root, "--db", str(path))
    assert shown.returncode == 0, shown.stderr
    assert root in shown.stdout


def _call_model_rows(path: Path) -> list[tuple[str, int, int, str]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(
            "SELECT conversation_id, seq, idx, payload FROM effects WHERE type = 'CallModel'"
            " ORDER BY rowid"
        ).fetchall()


def test_schema_1_diverges_where_the_reducer_changed_since(tmp_path: Path) -> None:
    """The first model call of s1 offered the spawn_agents tool as the reducer described
    it then; today's describes ``cwd`` differently. Verify says so at that step (the
    request is derived from today's reducer and compared with the recorded one), and
    the log is still read: states load, show works, the divergence is not damage."""
    path = _copy("s1", tmp_path)
    root = _root(path)
    with Store.open(path) as store:
        report = verify(store, root, tree=True)
        state = store.load_state(root)
    (first,) = [r for r in report.results if not r.ok]
    assert first.conversation_id == root and first.findings == ()
    assert isinstance(first.divergence, Divergence) and first.divergence.seq == 1
    # The effects read alike (a request is no longer part of them): the note says what.
    assert "its tools differ" in first.divergence.diff()
    assert state.history
    shown = _fanfold("show", root, "--db", str(path))
    assert shown.returncode == 0, shown.stderr


@pytest.mark.parametrize("name", IDENTICAL)
def test_an_old_logs_recorded_request_is_checked_against_the_state(
    name: str, tmp_path: Path
) -> None:
    """Before schema 6 every model call stored its request; verify derives the request
    from the rebuilt state and compares. A recorded request edited in place (with its
    row checksum made to match, so it is not mere damage) is a divergence at its step."""
    path = _copy(name, tmp_path)
    root = _root(path)
    cid, seq, idx, payload = _call_model_rows(path)[-1]
    document = json.loads(payload)
    assert "request" in document and document["v"] < 6
    document["request"]["system"] += " (edited)"
    edited = json.dumps(document, separators=(",", ":"))
    with sqlite3.connect(path) as conn:
        columns = [r[1] for r in conn.execute("PRAGMA table_info(effects)")]
        conn.execute(
            "UPDATE effects SET payload = ? WHERE conversation_id = ? AND seq = ? AND idx = ?",
            (edited, cid, seq, idx),
        )
        if "checksum" in columns:
            conn.execute(
                "UPDATE effects SET checksum = ? WHERE conversation_id = ? AND seq = ? AND idx = ?",
                (effect_checksum(cid, seq, idx, "CallModel", edited), cid, seq, idx),
            )
    with Store.open(path) as store:
        report = verify(store, root, tree=True)
    assert not report.ok
    (failed,) = [r for r in report.results if not r.ok]
    assert failed.conversation_id == cid
    assert failed.findings == ()
    assert isinstance(failed.divergence, Divergence)
    assert failed.divergence.seq == seq
    assert "is not the one today's reducer derives from the state: its system differ" in (
        failed.divergence.diff()
    )


def test_new_steps_store_their_events_only(tmp_path: Path) -> None:
    """The events-only log (migration 5): no effect row at all (schema 6 stored a model
    call as its number and attempt; now nothing), a version-6 fingerprint per event."""
    path = tmp_path / "new.db"
    done = _fanfold("run", "--no-live", "--db", str(path), "Review this repository")
    assert done.returncode == 0, done.stderr
    assert _call_model_rows(path) == []
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM effects").fetchone() == (0,)
        marks = [m for (m,) in conn.execute("SELECT fingerprint FROM events")]
    conn.close()
    assert marks and all(" #####" in m for m in marks)
    with Store.open(path) as store:
        assert verify(store, _root(path), tree=True).ok


def test_a_killed_run_of_schema_5_resumes_and_verifies(tmp_path: Path) -> None:
    """Its log holds schema 5 documents (requests stored); resume appends schema 6 ones
    to the same conversation; the whole tree then verifies identical."""
    import os

    path = _copy("s5-killed", tmp_path)
    key = tmp_path / "key"
    shutil.copyfile(FIXTURES / "s5-killed.key", key)
    key.chmod(0o600)
    script = tmp_path / "script.json"
    shutil.copyfile(FIXTURES / "s5-killed-script.json", script)
    env = {**os.environ, "FANFOLD_KEY_FILE": str(key)}
    root = _root(path)
    with Store.open(path) as store:
        assert store.conversation(root).status == "running"
    resumed = _fanfold("resume", "--script", str(script), "--db", str(path), env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    with Store.open(path) as store:
        assert store.conversation(root).status == "idle"
        assert len(store.tree(root)) > 1
        report = verify(store, root, tree=True)
        assert report.ok, report
        # The resumed steps are events-only: the old ones keep their effect rows.
        assert store.last_turn(root) is not None
        marks = [e.fingerprint for e in store.events(root)]
    versions = {json.loads(p)["v"] for _, _, _, p in _call_model_rows(path)}
    assert versions == {5}
    assert " #####" not in marks[0] and " #####" in marks[-1]


def test_a_killed_run_of_schema_6_resumes_and_verifies(tmp_path: Path) -> None:
    """Killed while three sub-agents ran (one awaiting a retry): resume finishes the
    tree on the migrated copy, appending today's documents after schema 6 ones, and
    the whole tree then verifies identical."""
    import os

    path = _copy("s6-killed", tmp_path)
    key = tmp_path / "key"
    shutil.copyfile(FIXTURES / "s6-killed.key", key)
    key.chmod(0o600)
    script = tmp_path / "script.json"
    shutil.copyfile(FIXTURES / "s6-killed-script.json", script)
    env = {**os.environ, "FANFOLD_KEY_FILE": str(key)}
    root = _root(path)
    with Store.open(path) as store:
        running = [r for r in store.tree(root) if r.status == "running"]
        assert len(running) == 4  # the root and three sub-agents
    resumed = _fanfold("resume", "--script", str(script), "--db", str(path), env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    with Store.open(path) as store:
        assert store.conversation(root).status == "idle"
        assert not [r for r in store.tree(root) if r.status == "running"]
        report = verify(store, root, tree=True)
        assert report.ok, report


def test_a_schema_6_log_of_compact_documents_exports_imports_and_verifies(tmp_path: Path) -> None:
    """An export writes a compact document of schema 6 as the object document schema
    6 wrote (it once refused: only today's compact documents could be exported)."""
    from fanfold.replay import export_jsonl, import_jsonl

    path = _copy("s6-agents", tmp_path)
    root = _root(path)
    exported = tmp_path / "tree.jsonl"
    with Store.open(path) as store, exported.open("w", encoding="utf-8") as out:
        export_jsonl(store, root, out)
    versions = {
        json.loads(line).get("event", {}).get("v") for line in exported.read_text().splitlines()
    }
    assert 6 in versions and SCHEMA_VERSION not in versions
    with Store.open(tmp_path / "imported.db") as store:
        with exported.open(encoding="utf-8") as source:
            import_jsonl(store, source)
        report = verify(store, root, tree=True)
        assert report.ok, report


def test_a_schema_7_log_from_before_read_only_tool_specs_verifies_identical(
    tmp_path: Path,
) -> None:
    """``s7-tools.db`` was written before ``ToolSpec.read_only``: function tools (one
    declared ``read_only=True``), a ``read-only`` agent whose calls of both were
    refused (read-only meant the built-ins then), and a tree closed with a call in
    flight and resumed (its ``RuntimeResumed`` written with ``idempotent_tools``). It
    reads and verifies identical today: its specs decode as not read-only, so the
    reducer refuses those calls again as recorded."""
    path = _copy("s7-tools", tmp_path)
    root = _root(path)
    with Store.open(path) as store:
        report = verify(store, root, tree=True)
        assert report.ok, report
        child = store.load_state(root + ".1")
        assert not any(t.read_only for t in store.load_state(root).tools)
    results = [m.result for m in child.history if isinstance(m, ToolResultMessage)]
    assert [(r.name, r.is_error) for r in results[:2]] == [("peek", True), ("poke", True)]
    assert results[0].content.startswith("peek refused: no allow rule of agent 'reader'")


def test_a_schema_7_log_whose_runtime_decided_confinement_verifies_identical(
    tmp_path: Path,
) -> None:
    """``s7-confined.db`` was written by the last fanfold that stored effects, whose
    runtime decided from the state whether a call was confined and which rules a path's
    links must pass: the built-in reviewer ran git and read a file, a writer's write
    through ``docs/link -> ../src`` was refused by the link check. Its stored
    ``RunTool``s hold neither decision; where the reducer makes them (``RunTool``'s
    ``confined`` and ``path_rules``, ``NEVER_STORED``), the log still verifies
    identical."""
    path = _copy("s7-confined", tmp_path)
    root = _root(path)
    with Store.open(path) as store:
        report = verify(store, root, tree=True)
        assert report.ok, report
        reviewer, writer = (store.load_state(f"{root}.{n}") for n in (1, 2))
    # What the log holds is what today's reducer decides differently from the default.
    tools = [m.result for m in reviewer.history if isinstance(m, ToolResultMessage)]
    assert [(r.name, r.is_error) for r in tools[:2]] == [("bash", False), ("read_file", False)]
    written = [m.result for m in writer.history if isinstance(m, ToolResultMessage)]
    assert written[0].is_error and written[0].content.endswith(
        "'docs/link/evil.py' leads to 'src/evil.py' through a symbolic link"
    )
