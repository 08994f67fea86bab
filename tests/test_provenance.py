"""Provenance: a log fanfold did not write itself never runs anything, and ``resume``
goes on with the provider configuration a tree ran on, never with the demo script.

The crashed logs here are real: ``fanfold run`` in its own process, SIGKILLed while
the root's first bash command runs, with a second bash command of the same model reply
still to come (what resume would run next).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from click.testing import CliRunner
from runtime_helpers import open_runtime, reply, script

from fanfold import replay
from fanfold.cli import cli
from fanfold.db import Store
from fanfold.db.provenance import KeyFileError, Origin, UntrustedTree, UserKey
from fanfold.runtime import Runtime
from fanfold.statemachine import Idle
from fanfold.trust import TrustStore

SECOND = "echo the-second-command-of-the-round"
ANSWER = "the answer of the recorded script"


def _script(tmp_path: Path, pids: Path, name: str = "mine.json") -> Path:
    """The root runs two bash commands in one round (the first writes its shell's pid
    and sleeps), then answers ``ANSWER``."""
    first = {"name": "bash", "arguments": {"command": f"echo $$ >> {pids}; sleep 60"}}
    second = {"name": "bash", "arguments": {"command": SECOND}}
    path = tmp_path / name
    path.write_text(
        json.dumps(
            {
                "latency": 0.01,
                "agents": [
                    {
                        "match": {"path": "root"},
                        "replies": [{"tool_calls": [first, second]}, {"text": ANSWER}],
                    }
                ],
            }
        )
    )
    return path


def _cli_process(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", "from fanfold.cli import main; main()", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _wait_for_pid(pids: Path) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if pids.exists() and pids.read_text().split():
            return int(pids.read_text().split()[0])
        time.sleep(0.05)
    raise AssertionError("the bash command never started")


@contextlib.contextmanager
def _crashed_mid_bash(tmp_path: Path, db: Path, script_path: Path, pids: Path) -> Iterator[str]:
    """``fanfold run`` SIGKILLed while the root's first bash command runs; yields the
    root id. Its shell is killed too (what a crash leaves running is not ours)."""
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    run = ["run", "--no-live", "--db", str(db), "--script", str(script_path)]
    proc = _cli_process(*run, "--cwd", str(workdir), "go")
    shell = None
    try:
        shell = _wait_for_pid(pids)
        proc.kill()
        proc.communicate(timeout=30)
    finally:
        proc.kill()
        if shell is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell, signal.SIGKILL)
    with Store.open(db, read_only=True) as store:
        (root,) = store.list_roots()
        assert root.phase == "ToolExecuting"
    yield root.id


def _as_format_1(text: str) -> str:
    """An export without its steps' exact stored texts: a format-1 file."""
    records = [json.loads(line) for line in text.splitlines()]
    for record in records:
        record.pop("stored", None)
        if record.get("record") == "header":
            record["format_version"] = 1
    return "".join(json.dumps(r) + "\n" for r in records)


def _edited(text: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        assert old in text
        text = text.replace(old, new)
    return text


def test_an_edited_import_is_inert_and_its_commands_never_run(tmp_path: Path) -> None:
    """Issue 10.1: an export whose pending bash command was edited (and pointed at
    another directory) imports (verify shows the edit), and resume runs nothing of it."""
    db, other = tmp_path / "source.db", tmp_path / "imported.db"
    pids = tmp_path / "pids"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    pwned = elsewhere / "PWNED"
    with _crashed_mid_bash(tmp_path, db, _script(tmp_path, pids), pids) as root:
        exported = CliRunner().invoke(cli, ["export", root, "--db", str(db)])
    assert exported.exit_code == 0, exported.output
    edits = {
        SECOND: f"touch {pwned}",
        json.dumps(str(tmp_path / "work")): json.dumps(str(elsewhere)),
    }
    runner = CliRunner()
    # Edited with the exact stored texts left as they were (format 2): the import
    # sees that an event and its stored text differ, and refuses the file.
    stale = tmp_path / "stale.jsonl"
    stale.write_text(_edited(exported.output, edits))
    refused = runner.invoke(cli, ["import", str(stale), "--db", str(other)])
    assert refused.exit_code == 2 and "its stored text and its event differ" in refused.output
    # Edited as a format-1 file (no stored texts, which an editor can drop): it
    # imports, and only its provenance keeps it from running.
    evil = _edited(_as_format_1(exported.output), edits)
    bug_report = tmp_path / "bug.jsonl"
    bug_report.write_text(evil)
    imported = runner.invoke(cli, ["import", str(bug_report), "--db", str(other)])
    assert imported.exit_code == 0, imported.output
    verified = runner.invoke(cli, ["replay", root, "--verify", "--tree", "--db", str(other)])
    # The whole-state fingerprint (issue 10.14) shows the edit as a divergence at the
    # step it changed; what keeps the edited log from running is its provenance.
    assert verified.exit_code == 1, verified.output
    assert f"conversation {root}, seq 0" in verified.output
    resumed = _cli_process("resume", "--db", str(other))
    out, err = resumed.communicate(timeout=60)
    assert "Traceback" not in err
    assert resumed.returncode == 0, (out, err)
    assert f"skipped tree {root}: imported from {bug_report}" in err
    assert "imported trees are inert records" in err
    assert "nothing resumed" in out
    assert not pwned.exists()
    with Store.open(other) as store:
        record = store.tree_record(root)
        assert record is not None and record.origin is Origin.IMPORTED and record.mark is None
        assert record.source == str(bug_report)
        import hashlib

        assert record.source_sha256 == hashlib.sha256(evil.encode()).hexdigest()
        assert store.conversation(root).phase == "ToolExecuting"  # left as it was


def test_a_copied_and_edited_database_is_inert_under_another_users_key(
    tmp_path: Path, provenance_key: Path
) -> None:
    """The same attack on a database file: copied to another user (another key) and
    edited with sqlite3; also with a mark moved over from a tree that verifies."""
    db = tmp_path / "theirs.db"
    pids = tmp_path / "pids"
    pwned = tmp_path / "PWNED"
    with _crashed_mid_bash(tmp_path, db, _script(tmp_path, pids), pids) as root:
        pass
    copy = tmp_path / "copy.db"
    for suffix in ("", "-wal"):
        if Path(f"{db}{suffix}").exists():
            shutil.copyfile(f"{db}{suffix}", f"{copy}{suffix}")
    conn = sqlite3.connect(copy)
    for table, column in (("events", "payload"), ("conversations", "snapshot_json")):
        conn.execute(
            f"UPDATE {table} SET {column} = replace({column}, ?, ?)", [SECOND, f"touch {pwned}"]
        )
    conn.commit()
    conn.close()
    env = {**os.environ, "FANFOLD_KEY_FILE": str(tmp_path / "another-users.key")}
    resumed = _cli_process("resume", "--db", str(copy), env=env)
    out, err = resumed.communicate(timeout=60)
    assert resumed.returncode == 0, (out, err)
    assert f"skipped tree {root}: not written by this runtime on this machine" in err
    assert "does not verify with this user's key" in err
    assert not pwned.exists()
    # A mark is bound to its tree: one that verifies, copied onto another tree, does not.
    with Store.open(copy) as store:
        forked = replay.fork(store, root, 0, key=UserKey.load(env["FANFOLD_KEY_FILE"]))
    conn = sqlite3.connect(copy)
    conn.execute(
        "UPDATE trees SET mark = (SELECT mark FROM trees WHERE root_id = ?) WHERE root_id = ?",
        [forked, root],
    )
    conn.commit()
    conn.close()
    resumed = _cli_process("resume", "--db", str(copy), env=env)
    out, err = resumed.communicate(timeout=60)
    assert resumed.returncode == 0, (out, err)
    assert f"skipped tree {root}: not written by this runtime" in err
    assert not pwned.exists()


def test_a_tree_resumes_with_its_recorded_script_and_refuses_a_changed_one(
    tmp_path: Path,
) -> None:
    """Issue 10.11: no --script resumes on the recorded script (not the demo); a script
    changed since is refused, naming the tree, the path and both digests, until
    --script chooses one explicitly (and is recorded)."""
    db = tmp_path / "log.db"
    pids = tmp_path / "pids"
    script_path = _script(tmp_path, pids)
    with _crashed_mid_bash(tmp_path, db, script_path, pids) as root:
        pass
    original = script_path.read_text()
    script_path.write_text(original.replace(ANSWER, "an answer from an edited script"))
    refused = CliRunner().invoke(cli, ["resume", "--db", str(db)])
    assert refused.exit_code == 1, refused.output
    assert f"skipped tree {root}: cannot rebuild the provider configuration" in refused.output
    assert f"the script it runs on, {script_path}, changed since it was recorded" in refused.output
    assert "resume it with --script PATH" in refused.output
    with Store.open(db) as store:
        assert store.conversation(root).phase == "ToolExecuting"
    script_path.write_text(original)
    resumed = CliRunner().invoke(cli, ["resume", "--db", str(db)])
    assert resumed.exit_code == 0, resumed.output
    with Store.open(db) as store:
        state = store.load_state(root)
        assert isinstance(state.phase, Idle)
        assert state.history[-1].text == ANSWER  # type: ignore[union-attr]


def test_resume_prints_the_answer_of_each_tree_it_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22, item 18: `resume` drew the tree and stopped; the answer it waited for
    was only in `fanfold show`. It prints each finished tree's answer as `run` does."""
    db = tmp_path / "log.db"
    pids = tmp_path / "pids"
    with _crashed_mid_bash(tmp_path, db, _script(tmp_path, pids), pids) as root:
        pass
    from fanfold.cli import output

    monkeypatch.setattr(output.console, "width", 200)  # fixed when the console was made
    resumed = CliRunner().invoke(cli, ["resume", "--db", str(db)])
    assert resumed.exit_code == 0, resumed.output
    assert f"answer of {root}" in resumed.stdout
    assert resumed.stdout.index(f"answer of {root}") < resumed.stdout.index(ANSWER)
    assert f"inspect it with: fanfold show {root} --db {db}" in resumed.stdout


def test_an_explicit_script_overrides_the_recorded_one_and_is_recorded(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    pids = tmp_path / "pids"
    with _crashed_mid_bash(tmp_path, db, _script(tmp_path, pids), pids) as root:
        pass
    (tmp_path / "mine.json").unlink()
    refused = CliRunner().invoke(cli, ["resume", "--db", str(db)])
    assert refused.exit_code == 1
    assert "cannot be read now" in refused.output
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps(
            {"agents": [{"match": {"path": "root"}, "replies": [{"text": "-"}, {"text": "other"}]}]}
        )
    )
    resumed = CliRunner().invoke(cli, ["resume", "--db", str(db), "--script", str(other)])
    assert resumed.exit_code == 0, resumed.output
    with Store.open(db) as store:
        record = store.tree_record(root)
        assert record is not None and record.provider is not None
        assert json.loads(record.provider)["script"]["path"] == str(other)
        assert store.load_state(root).history[-1].text == "other"  # type: ignore[union-attr]


# ------------------------------------------------------------------ the Runtime API


def _quick() -> Any:
    return script(1.0, root=[reply("", ("think", {"thought": "x"}), latency=50.0), reply("ok")])


async def test_a_tree_marked_with_one_key_is_refused_under_another(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    mine, theirs = UserKey.generate(), UserKey.generate()
    async with open_runtime(tmp_path, _quick(), key=mine) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await trio.sleep(1.0)  # the model call is in flight: stop here, as a crash
    async with open_runtime(tmp_path, _quick(), key=theirs) as runtime:
        plan = runtime.resume_plan()
        assert plan.roots == ()
        ((skipped_root, reason),) = [(s.root_id, s.reason) for s in plan.skipped]
        assert skipped_root == root and "does not verify with this user's key" in reason
        assert await runtime.resume() == []
        with pytest.raises(UntrustedTree, match=f"tree {root}: not written by this runtime"):
            await runtime.resume([root])
        with pytest.raises(UntrustedTree):
            runtime.attach(root)
        with pytest.raises(UntrustedTree):
            await runtime.cancel(root)
        with pytest.raises(UntrustedTree):
            await runtime.send(root, "hi")
    async with open_runtime(tmp_path, _quick(), key=mine) as runtime:
        assert runtime.resume_plan().roots == (root,)
        assert root in await runtime.resume()
        assert (await runtime.wait(root)).text == "ok"


async def test_an_imported_tree_is_refused_and_its_fork_goes_on(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    import io

    async with open_runtime(tmp_path, _quick()) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root)
        out = io.StringIO()
        replay.export_jsonl(runtime.store, root, out)
    with Store.open(tmp_path / "other.db") as store:
        replay.import_jsonl(store, io.StringIO(out.getvalue()), source="bug.jsonl")
        fork = replay.fork(store, root, store.conversation(root).last_seq)
        record = store.tree_record(fork)
        assert record is not None and record.origin is Origin.RUNTIME and record.mark
    async with Runtime.open(
        tmp_path / "other.db",
        script(1.0, root=[reply("-"), reply("-"), reply("again")]),
        _tools(),
        threaded_writes=False,
    ) as runtime:
        with pytest.raises(UntrustedTree, match=r"imported from bug\.jsonl"):
            await runtime.send(root, "continue")
        with pytest.raises(UntrustedTree, match="imported trees are inert"):
            runtime.attach(root)
        with pytest.raises(UntrustedTree):
            await runtime.cancel(root)
        before = runtime.store.raw_log(root)
        await runtime.send(fork, "continue")
        assert (await runtime.wait(fork)).text == "again"
        assert runtime.store.raw_log(root) == before  # the imported tree did not move


async def test_a_tree_without_a_record_is_inert(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Trees written before provenance records (a migrated log) are never continued."""
    async with open_runtime(tmp_path, _quick()) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await trio.sleep(1.0)
    conn = sqlite3.connect(tmp_path / "log.db")
    conn.execute("DELETE FROM trees")
    conn.commit()
    conn.close()
    async with open_runtime(tmp_path, _quick()) as runtime:
        (skipped,) = runtime.resume_plan().skipped
        assert skipped.root_id == root and "has no provenance record" in skipped.reason
        assert await runtime.resume() == []
        with pytest.raises(UntrustedTree, match="has no provenance record"):
            runtime.attach(root)
        with pytest.raises(UntrustedTree):  # not NotRunning: it may never run here
            await runtime.wait(root)


def _tools() -> Any:
    from fanfold.tools.registry import ToolSet

    return ToolSet.default()


# ------------------------------------------------------------------ the key file


def test_the_key_file_is_created_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "data" / "fanfold" / "provenance.key"
    first = UserKey.load(path)
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    assert UserKey.load(path).mark("db", "r") == first.mark("db", "r")
    assert UserKey.generate().mark("db", "r") != first.mark("db", "r")
    assert first.mark("db", "r") != first.mark("db2", "r") != first.mark("db", "r2")
    assert "provenance.key" in repr(first) and first.mark("db", "r") not in repr(first)


def test_a_key_file_others_can_read_or_that_is_not_a_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "provenance.key"
    UserKey.load(path)
    path.chmod(0o644)
    with pytest.raises(KeyFileError, match="readable or writable by other users"):
        UserKey.load(path)
    path.chmod(0o600)
    path.write_text("not a key\n")
    with pytest.raises(KeyFileError, match="is not a fanfold key file"):
        UserKey.load(path)


def test_the_default_key_lives_beside_the_default_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fanfold.db.provenance import default_key_path

    monkeypatch.delenv("FANFOLD_KEY_FILE")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_key_path() == tmp_path / "fanfold" / "provenance.key"


# ------------------------------------------------------------------ older logs, CLI refusals


def _as_before_provenance(path: Path) -> None:
    """Turn a log into what a fanfold without provenance records wrote (schema 1)."""
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE trees")
    conn.execute("DELETE FROM migrations WHERE version = 2")
    conn.execute("DELETE FROM meta WHERE key = 'instance_id'")
    conn.commit()
    conn.close()


def test_an_older_log_reads_without_migrating_and_its_trees_are_inert_once_migrated(
    tmp_path: Path,
) -> None:
    db = tmp_path / "old.db"
    pids = tmp_path / "pids"
    with _crashed_mid_bash(tmp_path, db, _script(tmp_path, pids), pids) as root:
        pass
    with Store.open(db) as store:  # checkpoint the WAL: a log closed cleanly
        pass
    _as_before_provenance(db)
    before = db.read_bytes()
    listed = CliRunner().invoke(cli, ["ls", "--db", str(db)])
    assert listed.exit_code == 0 and root in listed.output, listed.output
    assert db.read_bytes() == before  # read without migrating
    resumed = CliRunner().invoke(cli, ["resume", "--db", str(db)])
    assert resumed.exit_code == 0, resumed.output
    assert f"skipped tree {root}: not written by this runtime" in resumed.output
    assert "has no provenance record" in resumed.output
    with Store.open(db) as store:
        assert store.tree_record(root) is None
        assert len(store.instance_id) == 32
        assert store.conversation(root).phase == "ToolExecuting"


def test_send_to_an_imported_root_is_one_line_and_its_fork_takes_messages(
    tmp_path: Path,
) -> None:
    runner = CliRunner()
    db, other = tmp_path / "a.db", tmp_path / "b.db"
    answers = tmp_path / "answers.json"
    answers.write_text(
        json.dumps({"agents": [{"match": {"path": "root"}, "replies": [{"text": "one"}] * 3}]})
    )
    ran = runner.invoke(cli, ["run", "--db", str(db), "--script", str(answers), "--no-live", "hi"])
    assert ran.exit_code == 0, ran.output
    with Store.open(db) as store:
        (root,) = store.list_roots()
    export = tmp_path / "tree.jsonl"
    assert (
        runner.invoke(cli, ["export", root.id, "--db", str(db), "-o", str(export)]).exit_code == 0
    )
    assert runner.invoke(cli, ["import", str(export), "--db", str(other)]).exit_code == 0
    sent = runner.invoke(
        cli, ["send", root.id, "more", "--db", str(other), "--script", str(answers)]
    )
    assert sent.exit_code == 2, sent.output
    assert "imported trees are inert records" in sent.output
    assert "Traceback" not in sent.output
    forked = runner.invoke(cli, ["fork", root.id, "--at", "2", "--db", str(other)])
    assert forked.exit_code == 0, forked.output
    fork_id = forked.output.split()[0]
    assert "was not written by this runtime; the fork keeps its working directory" in (
        forked.output
    )
    sent = runner.invoke(
        cli, ["send", fork_id, "more", "--db", str(other), "--script", str(answers)]
    )
    assert sent.exit_code == 0, sent.output
    with Store.open(other) as store:
        assert store.conversation(fork_id).last_seq == 2  # forked, message, reply
        record = store.tree_record(fork_id)
        assert record is not None and record.provider is not None  # send recorded it
        assert json.loads(record.provider)["script"]["path"] == str(answers)


async def test_a_recorded_configuration_rebuilds_as_it_was_and_a_changed_one_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fanfold.cli.models import choose_model as _choose_model
    from fanfold.cli.models import rebuilt_choice as _rebuilt_choice
    from fanfold.providers.description import DescriptionError, ProviderDescription

    monkeypatch.chdir(tmp_path)
    for variable in ("FANFOLD_CONFIG", "FANFOLD_PROFILE", "FANFOLD_MODEL", "FANFOLD_BASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    demo = _choose_model(None, None, None, None)  # nothing configured: the demo script
    assert demo.recorded.script is not None and demo.recorded.script.path == "builtin:code_review"
    again = _rebuilt_choice(ProviderDescription.from_json(demo.recorded.to_json()))
    assert again.recorded == demo.recorded
    config = tmp_path / "models.toml"
    config.write_text(
        'default = "big"\nsub_agents = "small"\n'
        '[profiles.big]\nprovider = "openai"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m1"\n'
        '[profiles.small]\nprovider = "openai"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m2"\n'
    )
    chosen = _choose_model(None, config, None, "m3")
    recorded = chosen.recorded
    assert (recorded.profile, recorded.sub_agents, recorded.model) == ("big", "small", "m3")
    assert recorded.config is not None and recorded.config.path == str(config.resolve())
    assert "key" not in recorded.to_json().lower()
    rebuilt = _rebuilt_choice(ProviderDescription.from_json(recorded.to_json()))
    assert rebuilt.recorded == recorded
    for choice in (demo, again, chosen, rebuilt):
        await choice.aclose()
    config.write_text(config.read_text().replace("m2", "m4"))
    with pytest.raises(DescriptionError, match=r"config file it runs on, .*models\.toml, changed"):
        _rebuilt_choice(recorded)
    (tmp_path / "fanfold.toml").write_text(config.read_text())
    TrustStore.default().trust(tmp_path / "fanfold.toml")  # a project file, trusted
    with pytest.raises(DescriptionError, match="ran without a config file"):
        _rebuilt_choice(demo.recorded)


async def test_a_mark_is_bound_to_its_database(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The same tree under the same key, in a database of another identity (a crafted
    file reusing marks): refused."""
    key = UserKey.generate()
    async with open_runtime(tmp_path, _quick(), key=key) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await trio.sleep(1.0)
    conn = sqlite3.connect(tmp_path / "log.db")
    conn.execute("UPDATE meta SET value = 'another-database' WHERE key = 'instance_id'")
    conn.commit()
    conn.close()
    async with open_runtime(tmp_path, _quick(), key=key) as runtime:
        ((skipped_root, reason),) = [(s.root_id, s.reason) for s in runtime.resume_plan().skipped]
        assert skipped_root == root and "does not verify" in reason


def test_an_untrustworthy_key_file_is_one_line(tmp_path: Path, provenance_key: Path) -> None:
    UserKey.load(provenance_key)
    provenance_key.chmod(0o640)
    try:
        result = CliRunner().invoke(cli, ["run", "--db", str(tmp_path / "x.db"), "hi"])
    finally:
        provenance_key.chmod(0o600)
    assert result.exit_code == 2, result.output
    assert "readable or writable by other users" in result.output
    assert "Traceback" not in result.output
