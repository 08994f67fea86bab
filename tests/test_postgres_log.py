"""The event log in PostgreSQL (issue 25): ``fanfold.db.open_store(URL)``, every command
with ``--db postgresql://...`` or ``$FANFOLD_DB``, and ``Runtime.open(URL)``, on the
session's throwaway cluster (``pg_cluster``; a new database per test, ``pg_url``).

The store-level behaviour shared with SQLite is tested on both stores in
``test_db_store.py``; here: what only a PostgreSQL log has (a URL, a password, a
server, several connections) and the commands end to end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner, Result
from db_scenarios import Driver, fan_out
from pg_cluster import Cluster, free_port

from fanfold.cli import cli
from fanfold.db import (
    CannotOpen,
    DatabaseUrl,
    EmptyLog,
    LogUnavailable,
    SequenceError,
    Store,
    TreeTakenOver,
    open_store,
)
from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import DatabaseInUse, Runtime

if TYPE_CHECKING:
    import psycopg
else:
    psycopg = pytest.importorskip("psycopg", reason="the postgres extra is not installed")

from fanfold.db.postgres import PostgresStore  # imports psycopg: after the skip above

FAN_OUT = {
    "latency": 0.01,
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                {
                    "tool_calls": [
                        {
                            "name": "spawn_agents",
                            "arguments": {"tasks": [{"task": "count"}, {"task": "count again"}]},
                        }
                    ]
                },
                {"text": "the answer is {{last_tool_result}}"},
            ],
        },
        {
            "match": {"depth": 1},
            "replies": [{"tool_calls": [{"name": "submit_result", "arguments": {"result": "3"}}]}],
        },
    ],
}


def _password(url: str) -> str:
    secret = urllib.parse.urlsplit(url).password
    assert secret  # the fixture's role has one: what these tests keep out of sight
    return secret


def _script(tmp_path: Path, script: dict[str, Any] = FAN_OUT, name: str = "script.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(script))
    return path


def _cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def _only_root(url: str) -> str:
    listed = json.loads(_cli("ls", "--json", "--db", url).output)
    assert len(listed) == 1, listed
    return str(listed[0]["id"])


@pytest.fixture
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's data folder (where a PostgreSQL log's JSON log goes), per test."""
    home = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(home))
    monkeypatch.delenv("FANFOLD_DB", raising=False)
    return home


# ------------------------------------------------------------------ the store


def test_open_store_chooses_the_store_by_target(tmp_path: Path, pg_url: str) -> None:
    with open_store(tmp_path / "log.db") as sqlite, open_store(pg_url) as postgres:
        assert type(sqlite) is Store
        assert isinstance(postgres, PostgresStore)
        # Named without the password, wherever a message shows it.
        assert postgres.path == pg_url.replace(f":{_password(pg_url)}@", "@")
    with psycopg.connect(pg_url) as conn:
        schemas = [
            r[0] for r in conn.execute("SELECT schema_name FROM information_schema.schemata")
        ]
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'fanfold'"
            )
        }
        versions = conn.execute("SELECT version FROM fanfold.migrations").fetchall()
    assert "fanfold" in schemas
    assert tables == {
        *("meta", "migrations", "conversations", "events", "effects", "trees", "blobs"),
        *("claims", "placements", "cancels", "tool_progress"),
    }
    assert sorted(versions) == [(1,), (2,), (3,), (4,)]


def test_a_read_only_open_of_a_database_without_a_log_writes_nothing(pg_url: str) -> None:
    with pytest.raises(EmptyLog, match="no fanfold log yet"):
        open_store(pg_url, read_only=True)
    with psycopg.connect(pg_url) as conn:
        found = conn.execute(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = 'fanfold'"
        ).fetchone()
    assert found is None


def test_a_newer_schema_is_refused(pg_url: str) -> None:
    open_store(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO fanfold.migrations VALUES (99, 'future', 0)")
    with pytest.raises(Exception, match="schema version 99, newer than this fanfold knows"):
        open_store(pg_url)


def test_a_wrong_password_is_one_typed_error_without_the_password(pg_url: str) -> None:
    secret = _password(pg_url)
    wrong = pg_url.replace(f":{secret}@", ":not-the-password-0123@")
    with pytest.raises(LogUnavailable) as caught:
        open_store(wrong)
    message = str(caught.value)
    assert "password authentication failed" in message
    assert "not-the-password-0123" not in message and secret not in message
    assert "\n" not in message


def test_a_missing_psycopg_names_the_postgres_extra(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['psycopg'] = None  # as if the extra were not installed\n"
        "from fanfold.db import CannotOpen, open_store\n"
        "open_store(sys.argv[2]).close()\n"  # a file: no psycopg needed
        "try:\n"
        "    open_store(sys.argv[1])\n"
        "except CannotOpen as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "postgresql://u:pw@127.0.0.1:1/x", str(tmp_path / "a.db")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("CannotOpen ")
    assert "install fanfold's `postgres` extra" in done.stdout
    assert "pw" not in done.stdout.replace("psycopg", "")


# ------------------------------------------------------------------ the runtime


async def test_runtime_open_takes_a_url_and_one_runtime_resumes_at_a_time(
    pg_url: str, tmp_path: Path
) -> None:
    provider = ScriptedProvider(FAN_OUT)
    async with Runtime.open(pg_url, provider, []) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root)
        async with Runtime.open(pg_url, provider, []) as other:
            # Another runtime is connected: its trees may be live work.
            with pytest.raises(DatabaseInUse, match="another fanfold runtime"):
                await other.resume()
    async with Runtime.open(pg_url, provider, []) as alone:
        await alone.resume()  # nobody else: allowed
    with open_store(pg_url, read_only=True) as store:
        assert [row.id for row in store.tree(root)] == [root, f"{root}.1", f"{root}.2"]


# ------------------------------------------------------------------ the commands


def test_every_command_on_a_postgresql_log(tmp_path: Path, pg_url: str, data_home: Path) -> None:
    secret = _password(pg_url)
    script = _script(tmp_path)
    outputs = []
    ran = _cli(
        "run", "--no-live", "--db", pg_url, "--script", str(script), "--cwd", str(tmp_path), "go"
    )
    outputs.append(ran.output)
    assert ran.exit_code == 0, ran.output
    assert "the answer is" in ran.output
    root = _only_root(pg_url)
    for args in (
        ("show", root),
        ("replay", root, "--verify", "--tree"),
        ("transcript", root),
        ("trace", root, "-o", str(tmp_path / "trace.html")),
    ):
        done = _cli(*args, "--db", pg_url)
        outputs.append(done.output)
        assert done.exit_code == 0, (args, done.output)
    assert "identical" in outputs[-3]
    # $FANFOLD_DB names the log as --db does; the flag wins over it.
    env_ls = _cli("ls", "--json", env={"FANFOLD_DB": pg_url})
    assert [r["id"] for r in json.loads(env_ls.output)] == [root]
    open_store(tmp_path / "other.db").close()  # an empty SQLite log
    flag_ls = _cli("ls", "--json", "--db", str(tmp_path / "other.db"), env={"FANFOLD_DB": pg_url})
    assert flag_ls.exit_code == 0 and json.loads(flag_ls.output) == []
    # export, import into SQLite: the same tree verifies identically there...
    exported = tmp_path / "tree.jsonl"
    assert _cli("export", root, "-o", str(exported), "--db", pg_url).exit_code == 0
    sqlite = tmp_path / "copy.db"
    assert _cli("import", str(exported), "--db", str(sqlite)).exit_code == 0
    verified = _cli("replay", root, "--verify", "--tree", "--db", str(sqlite))
    assert verified.exit_code == 0 and "identical" in verified.output
    with open_store(pg_url, read_only=True) as pg, open_store(sqlite, read_only=True) as sq:
        # ...holding the same stored rows: events, fingerprints, checksums.
        def rows(store: Store) -> list[Any]:
            return [
                (e.conversation_id, e.seq, e.type, e.payload, e.fingerprint, e.at, e.checksum)
                for log in store.raw_tree(root)
                for e in log.events
            ]

        assert rows(pg) == rows(sq) and rows(pg)
    # ...and back: a tree exported from SQLite imports into a PostgreSQL log.
    again = tmp_path / "again.jsonl"
    assert _cli("export", root, "-o", str(again), "--db", str(sqlite)).exit_code == 0
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE second")
    second = pg_url.rsplit("/", 1)[0] + "/second"
    try:
        assert _cli("import", str(again), "--db", second).exit_code == 0
        assert "identical" in _cli("replay", root, "--verify", "--tree", "--db", second).output
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("DROP DATABASE second WITH (FORCE)")
    # fork a root at rest, then send to the fork: a new turn on the PostgreSQL log.
    forked = _cli("fork", root, "--at", "3", "--db", pg_url)
    outputs.append(forked.output)
    assert forked.exit_code == 0, forked.output
    fork_id = forked.output.split()[0]
    sent = _cli("send", root, "once more", "--no-live", "--script", str(script), "--db", pg_url)
    outputs.append(sent.output)
    assert sent.exit_code == 0, sent.output
    assert "identical" in _cli("replay", fork_id, "--verify", "--tree", "--db", pg_url).output
    compared = _cli("diff", root, fork_id, "--db", pg_url)
    outputs.append(compared.output)
    assert compared.exit_code == 0, compared.output
    # The password is in no output, nor in the JSON log (in the user's data folder).
    logs = list(data_home.rglob("*.jsonl"))
    assert logs
    for text in [*outputs, *(p.read_text() for p in logs)]:
        assert secret not in text


def test_a_damaged_row_is_reported_as_damage(tmp_path: Path, pg_url: str, data_home: Path) -> None:
    ran = _cli("run", "--no-live", "--db", pg_url, "--script", str(_script(tmp_path)), "go")
    assert ran.exit_code == 0, ran.output
    root = _only_root(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # One letter of a stored event changed, its checksum not: as a disk or a hand could.
        conn.execute(
            "UPDATE fanfold.events SET payload = replace(payload, 'count', 'cOunt')"
            " WHERE conversation_id = %s AND seq = 0",
            [f"{root}.1"],
        )
    verified = _cli("replay", root, "--verify", "--tree", "--db", pg_url)
    assert verified.exit_code == 2
    assert (
        f"conversation {root}.1, seq 0: event 0 is damaged: its row does not match its checksum"
        " [corrupt_payload]" in verified.output
    )


def test_a_wrong_password_is_one_line_for_every_command(pg_url: str, data_home: Path) -> None:
    secret = _password(pg_url)
    wrong = pg_url.replace(f":{secret}@", ":wrong-password-42@")
    for args in (("ls",), ("show", "x"), ("replay", "x", "--verify"), ("resume",)):
        done = CliRunner().invoke(cli, [*args, "--db", wrong])
        assert done.exit_code == 2, (args, done.output)
        lines = done.output.strip().splitlines()
        assert len(lines) == 1 and "password authentication failed" in lines[0], done.output
        assert "wrong-password-42" not in done.output and secret not in done.output
        assert done.exception is None or isinstance(done.exception, SystemExit)


def test_another_url_scheme_is_refused_without_echoing_it(data_home: Path) -> None:
    done = CliRunner().invoke(cli, ["ls", "--db", "postgresq://me:hunter2@db.example/x"])
    assert done.exit_code == 2
    assert "postgresq:// URLs are not supported" in done.output
    assert "hunter2" not in done.output


def test_resume_after_kill_9_of_a_run(tmp_path: Path, pg_url: str, data_home: Path) -> None:
    slow = json.loads(json.dumps(FAN_OUT))
    slow["agents"][1]["replies"][0]["latency"] = 60  # the children wait: killed meanwhile
    env = {**os.environ, "FANFOLD_DB": DatabaseUrl(pg_url).secret}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from fanfold.cli import main; main()",
            "run",
            "--no-live",
            "--script",
            str(_script(tmp_path, slow, "slow.json")),
            "--cwd",
            str(tmp_path),
            "go",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(pg_url) as conn:
                    started = conn.execute(
                        "SELECT count(*) FROM fanfold.conversations WHERE depth = 1"
                    ).fetchone()
                if started is not None and started[0] == 2:
                    break
            except psycopg.errors.UndefinedTable:
                pass  # the schema is not made yet
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        else:
            pytest.fail("the run never spawned its children")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    root = _only_root(pg_url)
    with open_store(pg_url, read_only=True) as store:
        assert [row.status.value for row in store.tree(root)] == ["running"] * 3
    # A fast script this time; the killed process's session (and lock) is gone.
    resumed = _cli("resume", "--script", str(_script(tmp_path)), env={"FANFOLD_DB": pg_url})
    assert resumed.exit_code == 0, resumed.output
    with open_store(pg_url, read_only=True) as store:
        assert [row.status.value for row in store.tree(root)] == ["idle", "completed", "completed"]
    verified = _cli("replay", root, "--verify", "--tree", "--db", pg_url)
    assert verified.exit_code == 0 and "identical" in verified.output, verified.output


async def test_a_lost_server_stops_resume_instead_of_skipping_trees_as_damaged(
    pg_url: str, tmp_path: Path
) -> None:
    slow = json.loads(json.dumps(FAN_OUT))
    slow["agents"][0]["replies"][0]["latency"] = 3600  # the root's first call never ends
    async with Runtime.open(pg_url, ScriptedProvider(slow), []) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
    # Closed mid-call: the tree is unfinished, as after a crash.
    async with Runtime.open(pg_url, ScriptedProvider(FAN_OUT), []) as runtime:

        def gone(conversation_id: str, **_: Any) -> Any:
            raise LogUnavailable(
                "the PostgreSQL log ... is unavailable: server closed the connection"
            )

        runtime.store.load_state = gone  # type: ignore[method-assign]
        with pytest.raises(LogUnavailable):
            await runtime.resume()
        assert runtime.resume_damaged == ()
    with open_store(pg_url, read_only=True) as store:
        assert store.conversation(root).status.value == "running"


def test_a_tree_taken_over_fences_its_old_owner_on_any_of_its_conversations(
    pg_url: str,
) -> None:
    """Two runtimes' stores on one database: the second writes to the tree (its first
    write claims it, epoch 2); the first's next batch of that tree is refused, on a
    conversation the second never wrote too, where ``last_seq`` alone sees nothing."""
    driver = Driver()
    fan_out(driver)
    steps = driver.steps
    children = sorted({s.conversation_id for s in steps} - {"r"})
    # Up to the children's creation, and the first step of each child.
    head = [s for s in steps if s.conversation_id == "r"][:4]
    first = [next(s for s in steps if s.conversation_id == c and s.seq == 1) for c in children]
    created = [s for s in steps if s.seq == 0 and s.conversation_id != "r"]
    with open_store(pg_url) as old, open_store(pg_url) as new:
        old.append([*head, *created])
        new.append([first[0]])  # a step of child 0: `new` claims the tree
        with pytest.raises(TreeTakenOver, match="epoch 2") as caught:
            old.append([first[1]])  # child 1: nothing of it in `new`'s memory or writes
        assert caught.value.root_id == "r"
        assert old.conversation(children[1]).last_seq == 0  # nothing written
        with pytest.raises(TreeTakenOver):  # nor later: it does not take the tree back
            old.append([first[1]])
        new.append([first[1]])  # the owner goes on
        with psycopg.connect(pg_url) as conn:
            assert conn.execute("SELECT owner, epoch FROM fanfold.claims").fetchall() == [
                (new.owner, 2)  # type: ignore[attr-defined]
            ]


def test_the_last_seq_guard_holds_beneath_the_claims(pg_url: str) -> None:
    """A store that claims a tree back (``claim``) with a stale memory of a conversation
    another one moved on meanwhile: the ``last_seq`` condition finds it, and the step
    is checked against the row, as on SQLite."""
    driver = Driver()
    fan_out(driver)
    root = [s for s in driver.steps if s.conversation_id == "r"]
    with open_store(pg_url) as mine, open_store(pg_url) as other:
        assert isinstance(mine, PostgresStore)
        mine.append(root[:2])
        other.append([root[2]])  # claims the tree; `mine` still remembers seq 1
        assert mine.claim("r") == 3
        with pytest.raises(SequenceError, match="expected seq 3, got 2"):
            mine.append([root[2]])
        mine.append([root[3]])
        assert [e.seq for e in mine.events("r")] == [0, 1, 2, 3]
        assert mine.load_state("r") == root[3].state


async def test_the_ui_serves_a_postgresql_log(tmp_path: Path, pg_url: str, data_home: Path) -> None:
    pytest.importorskip("hypercorn", reason="fanfold ui needs the ui extra")
    import httpx
    import trio
    from trace_helpers import UI_TOKEN, ui_cookie

    from fanfold.serve.ui_server import TraceServer, serve

    async with Runtime.open(pg_url, ScriptedProvider(FAN_OUT), []) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root)
    async with trio.open_nursery() as nursery:
        app = TraceServer(DatabaseUrl(pg_url), token=UI_TOKEN, poll=0.05)
        (base,) = await nursery.start(serve, app, "127.0.0.1", 0)
        async with httpx.AsyncClient(base_url=base, cookies=ui_cookie(base)) as client:
            trees = (await client.get("/api/trees")).json()
            assert [t["id"] for t in trees] == [root] and trees[0]["agents"] == 3
            data = (await client.get(f"/api/trace/{root}")).json()
            assert len(data["agents"]) == 3
            listing = (await client.get("/")).text
        nursery.cancel_scope.cancel()
    assert "postgresql://fanfold@127.0.0.1" in listing
    assert _password(pg_url) not in listing


@pytest.mark.parametrize("how", ["terminate", "restart"])
def test_a_run_goes_on_after_the_server_ended_its_sessions(
    tmp_path: Path, pg_url: str, data_home: Path, pg_cluster: Cluster, how: str
) -> None:
    """The server ends every session of the run (``pg_terminate_backend``, as a network
    cut would; or ``pg_ctl restart -m fast``) while its children wait for their model:
    the store connects again before its next transaction, and the tree finishes,
    identical on replay."""
    slow = json.loads(json.dumps(FAN_OUT))
    slow["agents"][1]["replies"][0]["latency"] = 2  # the next commit comes after this
    script = str(_script(tmp_path, slow, "slow.json"))
    proc = subprocess.Popen(
        [
            sys.executable,
            *("-c", "from fanfold.cli import main; main()", "run", "--no-live"),
            *("--script", script, "--cwd", str(tmp_path), "go"),
        ],
        env={**os.environ, "FANFOLD_DB": pg_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(pg_url) as conn:
                    row = conn.execute(
                        "SELECT count(*) FROM fanfold.conversations WHERE depth = 1"
                    ).fetchone()
                if row is not None and row[0] == 2:
                    break
            except psycopg.errors.UndefinedTable:
                pass
            time.sleep(0.05)
        if how == "restart":
            pg_cluster.restart()
        else:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                ended = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE pid <> pg_backend_pid() AND datname = current_database()"
                ).fetchall()
            assert ended  # the run's connections (the log's and its presence's)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "the answer is" in out
    root = _only_root(pg_url)
    verified = _cli("replay", root, "--verify", "--tree", "--db", pg_url)
    assert verified.exit_code == 0 and "identical" in verified.output, verified.output


def test_a_store_connects_again_for_its_next_transaction_or_read(pg_url: str) -> None:
    driver = Driver()
    fan_out(driver)
    steps = driver.steps
    with open_store(pg_url) as store, psycopg.connect(pg_url, autocommit=True) as admin:
        assert isinstance(store, PostgresStore)

        def end_its_session() -> None:
            pid = store._pg.raw.info.backend_pid
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])

        store.append(steps[:3])
        end_its_session()
        store.append(steps[3:6])  # the BEGIN finds the connection gone: a new one
        end_its_session()
        assert store.conversation("r").last_seq >= 0  # a lone read, again
        end_its_session()
        store.append(steps[6:])
        assert store.load_state("r") == driver.states["r"]


def test_store_open_refuses_a_url_rather_than_make_a_file_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CannotOpen, match="open_store") as caught:
        Store.open("postgresql://me:hunter2@127.0.0.1:1/x")
    assert "hunter2" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []  # no ./postgresql:/... made


def test_a_log_from_before_the_claims_is_read_as_it_is_and_migrated_by_a_writer(
    pg_url: str,
) -> None:
    driver = Driver()
    fan_out(driver)
    with open_store(pg_url) as store:
        store.append(driver.steps)
    with psycopg.connect(pg_url, autocommit=True) as conn:  # as PG migration 1 left it
        for table in ("claims", "placements", "cancels", "tool_progress"):
            conn.execute(f"DROP TABLE fanfold.{table}")
        conn.execute("DELETE FROM fanfold.migrations WHERE version >= 2")
    with open_store(pg_url, read_only=True) as reader:  # readers never read claims
        assert reader.load_state("r") == driver.states["r"]
        assert reader.progress_of(["r"]) == {}  # no progress table: no progress shown
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT max(version) FROM fanfold.migrations").fetchone() == (1,)
    open_store(pg_url).close()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT max(version) FROM fanfold.migrations").fetchone() == (4,)
        for table in ("claims", "placements", "cancels", "tool_progress"):
            assert conn.execute(f"SELECT count(*) FROM fanfold.{table}").fetchone() == (0,)


async def test_resume_and_attach_claim_a_tree_before_reading_it(
    pg_url: str, tmp_path: Path
) -> None:
    async with Runtime.open(pg_url, ScriptedProvider(FAN_OUT), []) as runtime:
        done = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(done)
    slow = json.loads(json.dumps(FAN_OUT))
    slow["agents"][0]["replies"][0]["latency"] = 3600
    async with Runtime.open(pg_url, ScriptedProvider(slow), []) as runtime:
        unfinished = await runtime.start("go", cwd=tmp_path)
    # Another runtime took both trees meanwhile (epoch 2 each).
    with open_store(pg_url) as other:
        assert isinstance(other, PostgresStore)
        assert (other.claim(done), other.claim(unfinished)) == (2, 2)

    def claims() -> dict[str, tuple[str, int]]:
        with psycopg.connect(pg_url) as conn:
            rows = conn.execute("SELECT root_id, owner, epoch FROM fanfold.claims").fetchall()
        return {root: (owner, epoch) for root, owner, epoch in rows}

    async with Runtime.open(pg_url, ScriptedProvider(FAN_OUT), []) as runtime:
        owner = runtime.store.owner  # type: ignore[attr-defined]
        runtime.attach(done)  # at rest: nothing written, but the tree is taken
        assert claims()[done] == (owner, 3)
        await runtime.resume([unfinished])
        assert claims()[unfinished][0] == owner
        await runtime.wait(unfinished)


def test_a_missing_database_and_a_server_that_is_down_are_one_line(
    tmp_path: Path, pg_url: str, data_home: Path
) -> None:
    secret = _password(pg_url)
    script = str(_script(tmp_path))
    missing = pg_url.rsplit("/", 1)[0] + "/no_such_database"
    down = f"postgresql://fanfold:{secret}@127.0.0.1:{free_port()}/x?connect_timeout=5"
    for url, reason in ((missing, 'database "no_such_database" does not exist'), (down, "")):
        for args in (("ls",), ("run", "--no-live", "--script", script, "go")):
            done = CliRunner().invoke(cli, [*args, "--db", url])
            assert done.exit_code == 2, (args, done.output)
            last = done.output.strip().splitlines()[-1]
            assert last.startswith("error: the PostgreSQL log postgresql://fanfold@127.0.0.1:")
            assert reason in last and secret not in done.output


async def test_a_runtimes_presence_outlives_the_end_of_its_session(
    pg_url: str, tmp_path: Path
) -> None:
    async with Runtime.open(pg_url, ScriptedProvider(FAN_OUT), []) as runtime:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND datname = current_database()"
            )
        await runtime.resume()  # the presence and the log connect again
        root = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root)
        async with Runtime.open(pg_url, ScriptedProvider(FAN_OUT), []) as other:
            with pytest.raises(DatabaseInUse):  # the first one's lock is held again
                await other.resume()


OLD_LOGS = Path(__file__).parent / "fixtures" / "logs"


@pytest.mark.parametrize("name", ["s1", "s5", "s6-killed", "s7-tools", "s7-confined"])
def test_an_old_log_imports_into_postgresql_and_verifies_as_in_sqlite(
    name: str, tmp_path: Path, pg_url: str, data_home: Path
) -> None:
    """Logs of older schemas (effect rows, older fingerprint formats, a run killed
    mid-way) exported from their file and imported into a new SQLite file and into
    PostgreSQL verify with the same findings in both."""
    copy = tmp_path / f"{name}.db"
    copy.write_bytes((OLD_LOGS / f"{name}.db").read_bytes())
    sqlite = str(tmp_path / "imported.db")
    listed = json.loads(_cli("ls", "--json", "--db", str(copy)).output)
    assert listed
    for tree in listed:
        root = tree["id"]
        exported = tmp_path / f"{root}.jsonl"
        assert _cli("export", root, "-o", str(exported), "--db", str(copy)).exit_code == 0
        reports = []
        for target in (sqlite, pg_url):
            assert _cli("import", str(exported), "--db", target).exit_code == 0
            verified = _cli("replay", root, "--verify", "--tree", "--db", target)
            # The report, less its timing.
            lines = [line.split(" replayed in ")[0] for line in verified.output.splitlines()]
            reports.append((verified.exit_code, lines))
        assert reports[0] == reports[1]
        assert reports[0][0] in (0, 1)  # identical, or a divergence: never damage


def test_a_postgresql_logs_own_files_go_to_the_data_folder(data_home: Path) -> None:
    """The JSON log and ``fanfold mcp``'s ledger of a PostgreSQL log: in the user's data
    folder, named by the URL without its password (the same database, whatever
    password reaches it, has one ledger), never under ``./postgresql:/...``."""
    from fanfold.cli.database import beside_log

    one = beside_log(DatabaseUrl("postgresql://me:first@db.example:5432/logs"), ".mcp-delegations")
    two = beside_log(DatabaseUrl("postgresql://me:second@db.example:5432/logs"), ".mcp-delegations")
    other = beside_log(DatabaseUrl("postgresql://me:first@db.example:5432/other"), "")
    assert one == two and one.parent == data_home / "fanfold"
    assert one.name.startswith("fanfold-pg-") and one.name.endswith(".mcp-delegations")
    assert "first" not in str(one) and other.name != one.name.removesuffix(".mcp-delegations")


def _lose_commits(
    store: PostgresStore, admin: psycopg.Connection[Any], at: dict[int, str]
) -> list[str]:
    """Make the store's connection die at its COMMITs numbered in ``at`` (1 first):
    ``"before"`` ends its session before the COMMIT is sent (the server rolls the
    batch back), ``"after"`` lets the COMMIT land and then ends the session and raises
    what a connection lost before the reply raises (the client never heard). Returns
    what happened, in order."""
    conn = store._pg
    send = conn.execute
    seen: list[str] = []

    def end_session() -> None:
        admin.execute("SELECT pg_terminate_backend(%s)", [conn.raw.info.backend_pid])

    def execute(query: str, params: Any = ()) -> Any:
        if query != "COMMIT":
            return send(query, params)
        how = at.get(len(seen) + 1)
        seen.append(how or "commit")
        if how == "before":
            end_session()
            return send(query, params)  # on the dead session: LogUnavailable
        result = send(query, params)
        if how == "after":
            end_session()
            raise store._pg._scrub.unavailable(
                psycopg.OperationalError("server closed the connection unexpectedly")
            )
        return result

    conn.execute = execute  # type: ignore[method-assign]
    return seen


def test_a_batch_whose_connection_dies_between_its_statements_is_written_once(
    pg_url: str,
) -> None:
    """The session ends while the batch's events are being inserted (its COMMIT is
    never sent): the batch is not in the log, and is written once on a new
    connection."""
    driver = Driver()
    fan_out(driver)
    steps = driver.steps
    with open_store(pg_url) as store, psycopg.connect(pg_url, autocommit=True) as admin:
        assert isinstance(store, PostgresStore)
        store.append(steps[:3])
        conn = store._pg
        send_many = conn.executemany
        ended: list[int] = []

        def executemany(query: str, rows: Any) -> Any:
            if query.startswith("INSERT INTO events") and not ended:
                ended.append(conn.raw.info.backend_pid)
                admin.execute("SELECT pg_terminate_backend(%s)", [ended[0]])
            return send_many(query, rows)

        conn.executemany = executemany  # type: ignore[method-assign]
        store.append(steps[3:6])
        store.append(steps[6:])
        assert ended and conn.raw.info.backend_pid != ended[0]
        for cid, state in driver.states.items():
            assert store.load_state(cid) == state
            assert [e.seq for e in store.events(cid)] == [
                s.seq for s in steps if s.conversation_id == cid
            ]


@pytest.mark.parametrize("how", ["before", "after"])
def test_a_batch_whose_connection_dies_at_commit_is_written_once(pg_url: str, how: str) -> None:
    """The connection dies inside ``append``'s transaction, before its COMMIT reached
    the server or after the server committed but before the client heard: the store
    connects again, asks the log whether the batch landed, and writes it (again) only
    if not; every step is in the log once and the store goes on."""
    driver = Driver()
    fan_out(driver)
    steps = driver.steps
    with open_store(pg_url) as store, psycopg.connect(pg_url, autocommit=True) as admin:
        assert isinstance(store, PostgresStore)
        store.append(steps[:3])
        seen = _lose_commits(store, admin, {1: how})
        store.append(steps[3:6])  # the lost commit: no error
        store.append(steps[6:])
        assert seen[0] == how
        for cid, state in driver.states.items():
            assert store.load_state(cid) == state
            mine = [s.seq for s in steps if s.conversation_id == cid]
            assert [e.seq for e in store.events(cid)] == mine
        with psycopg.connect(pg_url) as conn:
            (count,) = conn.execute("SELECT count(*) FROM fanfold.events").fetchone() or (0,)
            claims = conn.execute("SELECT owner FROM fanfold.claims").fetchall()
        assert count == len(steps)
        assert claims == [(store.owner,)]


def test_a_batch_lost_at_commit_is_not_written_over_a_tree_taken_meanwhile(
    pg_url: str,
) -> None:
    """The connection dies before COMMIT and, before this store is back, another one
    takes the tree over: the batch is not in the log, and written again it meets the
    claim: ``TreeTakenOver``, nothing of it written."""
    driver = Driver()
    fan_out(driver)
    steps = driver.steps
    root = [s for s in steps if s.conversation_id == "r"]
    with (
        open_store(pg_url) as store,
        open_store(pg_url) as other,
        psycopg.connect(pg_url, autocommit=True) as admin,
    ):
        assert isinstance(store, PostgresStore)
        store.append(root[:2])
        conn = store._pg
        send = conn.execute

        def execute(query: str, params: Any = ()) -> Any:
            if query == "COMMIT":
                conn.execute = send  # type: ignore[method-assign]
                admin.execute("SELECT pg_terminate_backend(%s)", [conn.raw.info.backend_pid])
                other.claim("r")
            return send(query, params)

        conn.execute = execute  # type: ignore[method-assign]
        with pytest.raises(TreeTakenOver):
            store.append([root[2]])
        assert [e.seq for e in other.events("r")] == [0, 1]


async def test_a_run_goes_on_when_its_commits_are_lost(tmp_path: Path, pg_url: str) -> None:
    """A whole tree whose log connection dies at commits, before and after the server
    committed: the run finishes, each step is in the log once (the same events as a
    run that lost nothing), and ``replay --verify --tree`` finds it identical."""
    import trio

    async with Runtime.open(pg_url, ScriptedProvider(FAN_OUT), []) as runtime:
        assert isinstance(runtime.store, PostgresStore)
        with psycopg.connect(pg_url, autocommit=True) as admin:
            seen = _lose_commits(runtime.store, admin, {2: "before", 4: "after", 7: "after"})
            root = await runtime.start("go", cwd=tmp_path)
            with trio.fail_after(60):
                await runtime.wait(root)
    assert seen[1] == "before" and seen[3] == "after" and seen[6] == "after"
    verified = _cli("replay", root, "--verify", "--tree", "--db", pg_url)
    assert verified.exit_code == 0 and "identical" in verified.output, verified.output
    with open_store(pg_url, read_only=True) as store:
        lost = {
            c.id: [type(e.event).__name__ for e in store.events(c.id)] for c in store.tree(root)
        }
        assert [row.status.value for row in store.tree(root)] == ["idle", "completed", "completed"]
    # The same tree, nothing lost, in a database of its own: the same steps.
    async with Runtime.open(tmp_path / "clean.db", ScriptedProvider(FAN_OUT), []) as runtime:
        again = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(again)
        clean = [
            [type(e.event).__name__ for e in runtime.store.events(c.id)]
            for c in runtime.store.tree(again)
        ]
    assert sorted(lost.values()) == sorted(clean)


@pytest.mark.parametrize("how", ["before", "after"])
def test_a_claim_a_provider_record_and_a_snapshot_cut_short_are_done_again(
    pg_url: str, how: str
) -> None:
    """The writes that are the same when done twice are run again on a new connection
    when their connection dies at COMMIT, before or after the server committed."""
    driver = Driver()
    fan_out(driver)
    steps = driver.steps
    root = [s for s in steps if s.conversation_id == "r"]
    with open_store(pg_url) as store, psycopg.connect(pg_url, autocommit=True) as admin:
        assert isinstance(store, PostgresStore)
        store.append(root)
        admin.execute("INSERT INTO fanfold.trees (root_id, origin) VALUES ('r', 'run')")
        seen = _lose_commits(store, admin, {1: how, 3: how, 5: how})
        epoch = store.claim("r")
        store.record_provider("r", '{"kind": "scripted"}')
        store.save_snapshot("r", root[-1].seq, root[-1].state)
        assert [seen[0], seen[2], seen[4]] == [how] * 3
        # The claim is this store's and it still writes the tree.
        claims = admin.execute("SELECT owner, epoch FROM fanfold.claims").fetchall()
        assert claims == [(store.owner, epoch)]
        assert admin.execute("SELECT provider FROM fanfold.trees").fetchall() == [
            ('{"kind": "scripted"}',)
        ]
        assert store.conversation("r").snapshot_seq == root[-1].seq
        assert store.load_state("r") == root[-1].state


def test_the_log_commits_durably_where_the_server_would_not(pg_url: str) -> None:
    # Issue 32, item 1: a batch's effects start once its COMMIT returns, so the commit
    # must be flushed by then. The test cluster runs with synchronous_commit = off.
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
    with open_store(pg_url) as store:
        assert isinstance(store, PostgresStore)
        raw = store._pg.raw
        assert raw.execute("SHOW synchronous_commit").fetchone() == ("on",)
        store._reconnect()  # a lost connection's replacement too
        assert store._pg.raw.execute("SHOW synchronous_commit").fetchone() == ("on",)
    with open_store(pg_url, read_only=True) as reader:  # a reader commits nothing
        assert isinstance(reader, PostgresStore)
        assert reader._pg.raw.execute("SHOW synchronous_commit").fetchone() == ("off",)
