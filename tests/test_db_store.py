"""The SQLite store: schema and migrations, group-commit append, reads, recovery."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path
from typing import Any

import attrs
import pytest
from db_scenarios import CHILD_PLANS, Driver, cancelled_fan_out, copied_mid_run, fan_out
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from replay_helpers import reseal

from fanfold.db import (
    SCHEMA_VERSION,
    CannotOpen,
    CodecError,
    ConversationRow,
    EmptyLog,
    InvalidStep,
    ReadOnlyStore,
    ReplayError,
    SchemaError,
    SequenceError,
    Status,
    Step,
    Store,
    StoreClosed,
    UnknownConversation,
    open_store,
)
from fanfold.db.codec import encode_state_stored
from fanfold.db.fingerprint import matches as fingerprint_matches
from fanfold.db.fingerprint import summary, version
from fanfold.db.schema import LATEST_VERSION
from fanfold.statemachine import (
    ConversationCreated,
    Idle,
    ModelReplied,
    ModelReply,
    TurnFinished,
    start,
    transition,
)

TABLES = ("conversations", "events", "effects", "meta", "migrations")


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Any:
    with Store.open(tmp_path / "fanfold.db") as s:
        yield s


@pytest.fixture
def store(log_target: str) -> Any:
    """The log in an SQLite file, then in PostgreSQL: the same behaviour."""
    with open_store(log_target) as s:
        yield s


def counts(store: Store) -> dict[str, int]:
    return {t: store._query(f"SELECT count(*) AS n FROM {t}")[0]["n"] for t in TABLES}


def pragma(store: Store, name: str) -> Any:
    (value,) = store._query(f"PRAGMA {name}")[0].values()
    return value


# ------------------------------------------------------------------ schema


def test_open_creates_the_schema_with_the_pragmas(sqlite_store: Store) -> None:
    store = sqlite_store
    assert pragma(store, "journal_mode") == "wal"
    assert pragma(store, "busy_timeout") == 5000
    assert pragma(store, "foreign_keys") == 1
    assert pragma(store, "synchronous") == 2  # FULL: each commit syncs the WAL (issue 32)
    schema = {r["name"]: r["sql"] for r in store._query("SELECT name, sql FROM sqlite_master")}
    for table in TABLES:
        assert schema[table].endswith("STRICT"), table
    assert "fingerprint" in schema["events"]
    assert "forked_from" in schema["conversations"]
    meta = store._query("SELECT value FROM meta WHERE key = 'event_schema_version'")
    assert meta == [{"value": str(SCHEMA_VERSION)}]


def test_migrations_are_applied_once(tmp_path: Path) -> None:
    path = tmp_path / "fanfold.db"
    driver = Driver()
    fan_out(driver)
    with Store.open(path) as first:
        first.append(driver.steps)
        applied = first._query("SELECT version, name FROM migrations")
    assert applied == [
        {"version": 1, "name": "initial schema"},
        {"version": 2, "name": "tree provenance"},
        {"version": 3, "name": "row checksums"},
        {"version": 4, "name": "content-addressed blobs"},
        {"version": 5, "name": "events-only log"},
        {"version": 6, "name": "tool progress side table"},
        {"version": 7, "name": "last turn's outcome"},
    ]
    for _ in range(2):
        with Store.open(path) as again:
            assert again._query("SELECT version, name FROM migrations") == applied
            assert again.load_state("r") == driver.states["r"]


def test_a_database_from_a_newer_fanfold_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fanfold.db"
    Store.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO migrations VALUES (?, 'from the future', 0)", [LATEST_VERSION + 1])
    conn.commit()
    conn.close()
    with pytest.raises(SchemaError, match="newer than this fanfold knows"):
        Store.open(path)


def test_a_file_that_is_not_sqlite_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"my notes, not a database\n" * 100)
    with pytest.raises(CannotOpen, match="is not an SQLite database"):
        Store.open(path)
    assert path.read_bytes() == b"my notes, not a database\n" * 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_another_programs_sqlite_database_is_never_written_to(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(CannotOpen, match=r"not a fanfold log \(it has tables users\)"):
        Store.open(path)
    assert path.read_bytes() == before  # not even switched to WAL
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("users",)]
    conn.close()


def test_a_path_sqlite_cannot_open_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(CannotOpen, match="cannot open"):
        Store.open(tmp_path)  # a directory
    with pytest.raises(CannotOpen, match="cannot open"):
        Store.open(tmp_path / "missing" / "fanfold.db")


def test_an_empty_file_becomes_a_fanfold_log(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with Store.open(path) as store:
        assert store.list_roots() == []


def test_a_read_only_store_reads_everything_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "fanfold.db"
    driver = Driver(snapshot_every=3)
    children = fan_out(driver)
    with Store.open(path) as store:
        store.append(driver.steps)
    before = path.read_bytes()
    with Store.open(path, read_only=True) as store:
        assert store.read_only
        assert [row.id for row in store.list_roots()] == ["r"]
        assert [row.id for row in store.tree("r")] == ["r", *children]
        assert store.load_state("r") == driver.states["r"]
        with pytest.raises(ReadOnlyStore, match="opened read-only"):
            store.append(driver.steps[:1])
        with pytest.raises(ReadOnlyStore):
            store.save_snapshot("r", 1, driver.states["r"])
    assert path.read_bytes() == before
    # No -wal left (the high-water mark is the writing store's: fanfold.db.highwater).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fanfold.db", "fanfold.db-committed"]


def test_read_only_opening_refuses_what_it_cannot_read_without_writing(tmp_path: Path) -> None:
    with pytest.raises(CannotOpen, match="no database file"):
        Store.open(tmp_path / "missing.db", read_only=True)
    empty = tmp_path / "empty.db"
    empty.touch()
    with pytest.raises(EmptyLog, match="is an empty log"):  # a CannotOpen
        Store.open(empty, read_only=True)
    assert empty.read_bytes() == b""
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:  # an SQLite file with only fanfold's meta
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    conn.close()
    with pytest.raises(CannotOpen, match="not a fanfold log") as caught:
        Store.open(other, read_only=True)
    assert not isinstance(caught.value, EmptyLog)
    notes = tmp_path / "notes.db"
    notes.write_bytes(b"not a database" * 100)
    with pytest.raises(CannotOpen, match="is not an SQLite database"):
        Store.open(notes, read_only=True)
    old = tmp_path / "old.db"
    Store.open(old).close()
    conn = sqlite3.connect(old)
    conn.execute("UPDATE meta SET value = '1' WHERE key = 'event_schema_version'")
    conn.commit()
    with Store.open(old, read_only=True) as store:  # older documents: read as they are
        assert store.list_roots() == []
    conn.execute("DELETE FROM migrations")  # as if a migration were still to come
    conn.commit()
    conn.close()
    with pytest.raises(SchemaError, match="needs a migration"):
        Store.open(old, read_only=True)


def test_events_from_a_newer_codec_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "fanfold.db"
    Store.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'event_schema_version'", ["99"])
    conn.commit()
    conn.close()
    with pytest.raises(SchemaError, match="events of schema version 99"):
        Store.open(path)


def test_tables_enforce_types_and_keys(sqlite_store: Store) -> None:
    store = sqlite_store
    driver = Driver()
    driver.create(ConversationCreated("r"))
    store.append(driver.steps)
    conn = store._connection()
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE conversations SET depth = 'deep'")
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
        conn.execute("INSERT INTO events VALUES ('ghost', 0, 'UserMessaged', '{}', 'Idle', 0.0, 0)")


# ------------------------------------------------------------------ append and read back


def test_append_and_read_back(store: Store) -> None:
    driver = Driver()
    fan_out(driver)
    for step in driver.steps:
        store.append([step])
    for cid in driver.states:
        mine = [s for s in driver.steps if s.conversation_id == cid]
        stored = store.events(cid)
        assert [e.seq for e in stored] == list(range(len(mine)))
        assert [e.event for e in stored] == [s.event for s in mine]
        assert [e.effects for e in stored] == [s.effects for s in mine]
        assert [e.at for e in stored] == [s.at for s in mine]
        for e, s in zip(stored, mine, strict=True):
            # Version 7: the counters, the content digest, the state fields the step
            # changed (every one: the driver's steps do not carry the state before),
            # and the effects' field digests.
            assert version(e.fingerprint) == 7
            assert fingerprint_matches(s.state, e.fingerprint)
            assert e.fingerprint.startswith(summary(s.state) + " ######")
            names = [type(effect).__name__ for effect in s.effects]
            effect_part = e.fingerprint.split()[-1]
            assert [t.split(":")[0] for t in effect_part.split(",")] == (names or ["-"])
        assert store.events(cid, after_seq=len(mine) - 2) == stored[-1:]
        row = store.conversation(cid)
        assert row.last_seq == len(mine) - 1
        assert row.phase == type(driver.states[cid].phase).__name__
        assert row.created_at == mine[0].at
        assert row.updated_at == mine[-1].at
    root = store.conversation("r")
    assert root == ConversationRow(
        id="r",
        parent_id=None,
        root_id="r",
        depth=0,
        task=None,
        user_initiated=True,
        created_at=root.created_at,
        updated_at=root.updated_at,
        phase="Idle",
        status=Status.IDLE,
        last_seq=6,
        snapshot_seq=None,
        forked_from=None,
        forked_at_seq=None,
    )
    child = store.conversation("r.3")
    assert (child.parent_id, child.root_id, child.depth, child.task) == (
        "r",
        "r",
        1,
        "review part 2",
    )
    assert (child.status, child.phase, child.user_initiated) == (Status.FAILED, "Failed", False)
    assert child.is_sub_agent and not root.is_sub_agent
    assert store.conversation("r.1").status is Status.COMPLETED


def test_one_batch_holds_many_conversations(store: Store) -> None:
    driver = Driver()
    fan_out(driver, "r")
    cancelled_fan_out(driver, "c")
    store.append(driver.steps)  # parents are created before their children in the batch
    assert counts(store)["events"] == len(driver.steps)
    assert counts(store)["effects"] == 0  # the events-only log: re-derived by replay
    assert sum(len(e.effects) for cid in driver.states for e in store.events(cid)) == sum(
        len(s.effects) for s in driver.steps
    )
    for cid, state in driver.states.items():
        assert store.load_state(cid) == state


def test_snapshots_follow_the_latest_flagged_step(store: Store) -> None:
    driver = Driver(snapshot_every=2)
    fan_out(driver)
    store.append(driver.steps)
    for cid in driver.states:
        flagged = [s for s in driver.steps if s.conversation_id == cid and s.snapshot]
        row = store.conversation(cid)
        assert row.snapshot_seq == flagged[-1].seq
        snapshot = store._query("SELECT snapshot_json FROM conversations WHERE id = ?", [cid])
        # Stored compact, its large values by reference (``fanfold.db.codec``).
        assert snapshot[0]["snapshot_json"] == encode_state_stored(flagged[-1].state, {})


def test_no_snapshot_is_stored_at_creation(store: Store) -> None:
    """The state after seq 0 is start(created): replay gets it without a snapshot."""
    created = ConversationCreated("r")
    state, effects = start(created)
    store.append([Step("r", 0, created, effects, state, 1.0, snapshot=True)])
    assert store.conversation("r").snapshot_seq is None
    assert store.load_state("r") == state


def test_empty_append_does_nothing(store: Store) -> None:
    before = counts(store)
    store.append([])
    assert counts(store) == before


# ------------------------------------------------------------------ refusals: all or nothing


def _refused(store: Store, steps: list[Step], error: type[Exception], match: str) -> None:
    before = counts(store)
    with pytest.raises(error, match=match):
        store.append(steps)
    assert counts(store) == before


def test_a_bad_step_anywhere_in_a_batch_writes_nothing(store: Store) -> None:
    driver = Driver(snapshot_every=1)
    fan_out(driver)
    store.append(driver.steps[:3])
    rest = driver.steps[3:]
    gap = attrs.evolve(rest[-1], seq=rest[-1].seq + 1)
    _refused(store, [*rest[:-1], gap], SequenceError, "expected seq 6, got 7")
    duplicate = driver.steps[2]
    _refused(store, [*rest[:5], duplicate], SequenceError, "expected seq 3, got 2")
    assert store.conversation("r").last_seq == 2
    with pytest.raises(UnknownConversation):
        store.conversation("r.1")  # created by the refused batches, not stored
    store.append(rest)
    assert store.load_state("r") == driver.states["r"]


def test_an_unencodable_step_writes_nothing(store: Store) -> None:
    driver = Driver()
    fan_out(driver)
    last = driver.steps[-1]
    assert isinstance(last.event, ModelReplied)
    # Effects are not stored (the events-only log): an event the codec cannot encode.
    bad = attrs.evolve(last, event=attrs.evolve(last.event, call=object()))  # type: ignore[arg-type]
    _refused(store, [*driver.steps[:-1], bad], CodecError, "cannot encode")


def test_sequence_errors_name_the_conversation_and_seqs(store: Store) -> None:
    driver = Driver()
    fan_out(driver)
    steps = driver.steps
    root0, root1, root2 = steps[0], steps[1], steps[2]
    _refused(
        store,
        [root1],
        SequenceError,
        r"'r': expected seq 0, got 1 \(the conversation is not stored",
    )
    _refused(store, [root0, root2], SequenceError, "'r': expected seq 1, got 2")
    store.append([root0, root1])
    _refused(store, [root0], SequenceError, r"expected seq 2, got 0 \(its last stored")
    _refused(store, [root1], SequenceError, "expected seq 2, got 1")
    with pytest.raises(SequenceError) as info:
        store.append([root2, root2])
    assert (info.value.conversation_id, info.value.expected, info.value.got) == ("r", 3, 2)


def test_malformed_steps_are_refused(store: Store) -> None:
    driver = Driver()
    fan_out(driver)
    root0, root1 = driver.steps[0], driver.steps[1]
    child0 = next(s for s in driver.steps if s.conversation_id == "r.1")
    _refused(store, [attrs.evolve(root1, seq=0)], InvalidStep, "seq 0 must be ConversationCreated")
    _refused(store, [attrs.evolve(root0, seq=1)], InvalidStep, "ConversationCreated at seq 1")
    _refused(store, [attrs.evolve(root0, seq=-1)], InvalidStep, "seq must be an int >= 0")
    _refused(store, [attrs.evolve(root0, conversation_id="x")], InvalidStep, "state is of")
    _refused(store, [child0], InvalidStep, "its parent 'r' is not stored")
    _refused(store, [root0, attrs.evolve(child0, user_initiated=True)], InvalidStep, "sub-agent")
    assert counts(store)["conversations"] == 0


# ------------------------------------------------------------------ listings


def test_listing_shows_user_conversations_newest_first(store: Store) -> None:
    driver = Driver()
    fan_out(driver, "first")
    cancelled_fan_out(driver, "second")
    driver.create(ConversationCreated("third"))
    store.append(driver.steps)
    assert [r.id for r in store.list_roots()] == ["third", "second", "first"]
    assert [r.id for r in store.list_roots(limit=1)] == ["third"]
    assert all(not r.is_sub_agent for r in store.list_roots())


def test_a_root_can_be_marked_not_user_initiated(store: Store) -> None:
    created = ConversationCreated("batch-job")
    state, effects = start(created)
    store.append([Step("batch-job", 0, created, effects, state, 1.0, user_initiated=False)])
    assert store.list_roots() == []
    assert store.conversation("batch-job").user_initiated is False


def test_children_and_tree(store: Store) -> None:
    driver = Driver()
    fan_out(driver, "r", CHILD_PLANS)
    cancelled_fan_out(driver, "c")
    store.append(driver.steps)
    assert [r.id for r in store.children("r")] == [f"r.{i}" for i in range(1, 6)]
    assert [r.id for r in store.children("c")] == ["c.1", "c.2"]
    assert store.children("r.1") == []
    assert [r.id for r in store.tree("c")] == ["c", "c.1", "c.2"]
    assert [(r.id, r.status) for r in store.children("c")] == [
        ("c.1", Status.COMPLETED),
        ("c.2", Status.FAILED),
    ]


def test_unfinished_lists_conversations_with_work_in_flight(store: Store) -> None:
    driver = Driver()
    children = fan_out(driver, finish=False)
    store.append(driver.steps)
    assert [r.id for r in store.unfinished()] == ["r", *children]
    mark = len(driver.steps)
    driver.run_child(children[0], "result")
    driver.deliver_outcome(children[0])
    store.append(driver.steps[mark:])
    assert [r.id for r in store.unfinished()] == ["r", *children[1:]]


def test_unknown_ids(store: Store) -> None:
    for read in (store.conversation, store.events, store.load_state):
        with pytest.raises(UnknownConversation, match="'nope'"):
            read("nope")
    assert store.children("nope") == []
    assert store.tree("nope") == []


# ------------------------------------------------------------------ recovery


def _fold_log(store: Store, cid: str) -> Any:
    """The reference: fold every stored event from seq 0, ignoring snapshots."""
    events = [e.event for e in store.events(cid)]
    created = events[0]
    assert isinstance(created, ConversationCreated)
    state, _ = start(created)
    for event in events[1:]:
        state, _ = transition(state, event)
    return state


@pytest.mark.parametrize("snapshot_every", [None, 1, 3])
def test_load_state_equals_folding_the_whole_log(
    tmp_path: Path, snapshot_every: int | None
) -> None:
    driver = Driver(snapshot_every=snapshot_every)
    fan_out(driver, "r", CHILD_PLANS)
    cancelled_fan_out(driver, "c")
    with Store.open(tmp_path / "fanfold.db") as store:
        for step in driver.steps:
            store.append([step])
            cid = step.conversation_id
            assert store.load_state(cid) == step.state == _fold_log(store, cid)


def test_load_state_starts_from_the_snapshot(store: Store) -> None:
    driver = Driver()
    fan_out(driver)
    steps = [s for s in driver.steps if s.conversation_id == "r"]
    snap = 3
    marked = [attrs.evolve(s, snapshot=s.seq == snap) for s in steps]
    store.append([*marked, *(s for s in driver.steps if s.conversation_id != "r")])
    conn = store._connection()
    # Events up to the snapshot are not read: breaking one goes unnoticed...
    conn.execute("UPDATE events SET payload = 'garbage' WHERE conversation_id = 'r' AND seq = 1")
    assert store.load_state("r") == driver.states["r"]
    # ...while a broken event after it is reported (resealed: the decoder finds it).
    conn.execute("UPDATE events SET payload = 'garbage' WHERE conversation_id = 'r' AND seq = 5")
    reseal(conn)
    with pytest.raises(ReplayError, match="'r', event 5: not valid JSON"):
        store.load_state("r")


def test_replay_checks_every_fingerprint(store: Store) -> None:
    driver = Driver()
    fan_out(driver)
    store.append(driver.steps)
    conn = store._connection()
    conn.execute("UPDATE events SET fingerprint = 'Idle' WHERE conversation_id = 'r' AND seq = 4")
    reseal(conn)  # an intact row with another fingerprint, as another reducer wrote it
    with pytest.raises(ReplayError, match="after event 4 does not match the log"):
        store.load_state("r")
    assert store.load_state("r", verify=False) == driver.states["r"]


def test_replay_reports_events_the_reducer_refuses(store: Store) -> None:
    created = ConversationCreated("r")
    state, effects = start(created)
    # An event the reducer refuses: a model reply while Idle, never issued.
    refused = ModelReplied(7, ModelReply("?"))
    store.append(
        [
            Step("r", 0, created, effects, state, 1.0),
            Step("r", 1, refused, (), state, 2.0),
        ]
    )
    with pytest.raises(ReplayError, match="the reducer refused event 1"):
        store.load_state("r")


def test_save_snapshot(store: Store) -> None:
    driver = Driver()
    fan_out(driver)
    store.append(driver.steps)
    steps = [s for s in driver.steps if s.conversation_id == "r"]
    store.save_snapshot("r", 4, steps[4].state)
    assert store.conversation("r").snapshot_seq == 4
    assert store.load_state("r") == driver.states["r"]
    store.save_snapshot("r", 2, steps[2].state)  # older: ignored
    assert store.conversation("r").snapshot_seq == 4
    with pytest.raises(InvalidStep, match="does not match event 5"):
        store.save_snapshot("r", 5, steps[4].state)
    with pytest.raises(InvalidStep, match="has no event 99"):
        store.save_snapshot("r", 99, steps[4].state)
    with pytest.raises(UnknownConversation):
        store.save_snapshot("r.9", 0, attrs.evolve(steps[0].state, id="r.9"))
    with pytest.raises(InvalidStep, match="state is of"):
        store.save_snapshot("r.1", 0, steps[0].state)


@given(
    plans=st.lists(st.sampled_from(CHILD_PLANS), min_size=1, max_size=5),
    snapshot_every=st.none() | st.integers(1, 4),
    cuts=st.lists(st.integers(0, 60), max_size=6),
)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_batching_rebuilds_every_state(
    plans: list[Any], snapshot_every: int | None, cuts: list[int]
) -> None:
    """However the steps are cut into batches, every conversation reloads exactly."""
    driver = Driver(snapshot_every=snapshot_every)
    fan_out(driver, "r", plans)
    bounds = sorted({0, len(driver.steps), *(c for c in cuts if c < len(driver.steps))})
    with Store.memory() as store:
        for lo, hi in itertools.pairwise(bounds):
            store.append(driver.steps[lo:hi])
        for cid, state in driver.states.items():
            assert store.load_state(cid) == state
            assert store.conversation(cid).status == Status(
                "idle"
                if cid == "r"
                else ("failed" if plans[int(cid[2:]) - 1] == "error" else "completed")
            )


# ------------------------------------------------------------------ lifecycle


def test_memory_store(tmp_path: Path) -> None:
    with Store.memory() as store:
        assert store.path is None
        driver = Driver()
        fan_out(driver)
        store.append(driver.steps)
        assert store.load_state("r") == driver.states["r"]
        assert isinstance(driver.states["r"].phase, Idle)


def test_closed_store_refuses_use(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "x.db")
    assert store.path == str(tmp_path / "x.db")
    store.close()
    store.close()
    with pytest.raises(StoreClosed):
        store.list_roots()
    with pytest.raises(StoreClosed):
        created = ConversationCreated("r")
        state, effects = start(created)
        store.append([Step("r", 0, created, effects, state, 0.0)])


def test_the_wal_checkpoint_finds_the_database_after_a_change_of_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fanfold.db import store as store_module

    monkeypatch.setattr(store_module, "CHECKPOINT_BYTES", 1)
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    store = Store.open("log.db")  # a relative path
    monkeypatch.chdir(second)  # the application moves on
    driver = Driver()
    fan_out(driver)
    try:
        store.append(driver.steps)
        checkpointer = store._checkpointer
        assert checkpointer is not None and checkpointer._thread is not None
        checkpointer._thread.join()
        assert list(second.iterdir()) == []  # no stray database in the new directory
        assert (first / "log.db").stat().st_size > 4096  # the real one was checkpointed
    finally:
        store.close()


def test_a_read_only_open_of_a_log_copied_mid_run_leaves_the_log_file_as_it_was(
    tmp_path: Path,
) -> None:
    """A copy taken while a runtime was writing: the newest steps are only in -wal. The
    read sees them, and the log file is not rewritten (no checkpoint on close)."""
    copy = tmp_path / "copy"
    driver = Driver(snapshot_every=2)
    fan_out(driver)
    copied_mid_run(driver.steps, tmp_path / "live", copy)
    before = (copy / "log.db").read_bytes(), (copy / "log.db-wal").read_bytes()
    with Store.open(copy / "log.db", read_only=True) as store:
        assert store.load_state("r") == driver.states["r"]
    assert ((copy / "log.db").read_bytes(), (copy / "log.db-wal").read_bytes()) == before


def _statements(store: Store, steps: list[Step]) -> list[str]:
    """The SQL statements one ``append`` of ``steps`` runs, their first words."""
    ran: list[str] = []
    conn = store._conn
    assert conn is not None
    conn.set_trace_callback(lambda sql: ran.append(" ".join(sql.split()[:3])))
    try:
        store.append(steps)
    finally:
        conn.set_trace_callback(None)
    return ran


def test_a_lone_step_of_a_known_conversation_is_four_statements(tmp_path: Path) -> None:
    """What a conversation that batches with nothing pays per step (issue 21's chain):
    no sequence-check SELECT (the store remembers where it left the row, and the
    UPDATE names the last_seq it expects), no statement with nothing to write."""
    driver = Driver()
    fan_out(driver)
    root = [s for s in driver.steps if s.conversation_id == "r"]
    with Store.open(tmp_path / "log.db") as store:
        store.append(root[:2])
        assert _statements(store, [root[2]]) == [
            "BEGIN IMMEDIATE",
            "INSERT INTO events",
            "UPDATE conversations SET",
            "COMMIT",
        ]
        assert store.load_state("r") == root[2].state


def test_a_conversation_another_connection_moved_on_is_checked_against_its_row(
    tmp_path: Path,
) -> None:
    """A store remembers where it left each conversation; another connection that
    appended since makes that memory stale: the batch is rolled back and checked
    against the rows, so a right step is written and a wrong one refused as before."""
    driver = Driver()
    fan_out(driver)
    root = [s for s in driver.steps if s.conversation_id == "r"]
    # (On PostgreSQL the per-tree claim refuses `mine` first: test_postgres_log.py.)
    path = tmp_path / "log.db"
    with Store.open(path) as mine, Store.open(path) as other:
        mine.append(root[:2])
        other.append([root[2]])  # `mine` still remembers seq 1
        with pytest.raises(SequenceError, match="expected seq 3, got 2"):
            mine.append([root[2]])
        mine.append([root[3]])
        other.append([root[4]])
        with pytest.raises(SequenceError, match="expected seq 5, got 4"):
            mine.append([root[4]])
        assert [e.seq for e in mine.events("r")] == [0, 1, 2, 3, 4]
        assert mine.conversation("r").last_seq == 4
        assert mine.load_state("r") == root[4].state


def test_timer_starts_and_last_turn_are_re_derived_from_events_alone(tmp_path: Path) -> None:
    """The events-only log stores no effect; what resume and ``wait`` read from the
    effects (when each timer first started, a turn's outcome) is re-derived by
    folding, and equals what the steps produced; a log with effect rows (format 5)
    gives the same from its rows."""
    from replay_helpers import as_format_5

    from fanfold.statemachine import ScheduleRetry, StartTimer

    driver = Driver()
    fan_out(driver)  # every child has a deadline timer; r.2 retries
    path = tmp_path / "log.db"
    with Store.open(path) as store:
        store.append(driver.steps)
    expected: dict[str, dict[int, float]] = {}
    turns: dict[str, TurnFinished | None] = {}
    for step in driver.steps:
        timers = expected.setdefault(step.conversation_id, {})
        turns.setdefault(step.conversation_id, None)
        for effect in step.effects:
            if isinstance(effect, StartTimer | ScheduleRetry):
                timers.setdefault(effect.timer, step.at)
            if isinstance(effect, TurnFinished):
                turns[step.conversation_id] = effect
    assert any(len(t) > 1 for t in expected.values())
    assert any(turns.values())
    for format_5 in (False, True):
        if format_5:
            as_format_5(path)
        with Store.open(path) as store:
            assert store._query("SELECT count(*) AS n FROM effects")[0]["n"] > 0 or not format_5
            for cid in driver.states:
                assert store.timer_starts(cid) == expected[cid], (cid, format_5)
                assert store.last_turn(cid) == turns[cid], (cid, format_5)


def test_a_task_with_a_nul_character_is_stored_and_listed(store: Store) -> None:
    """PostgreSQL's text cannot hold NUL (SQLite's can): the listing copy escapes it,
    the events keep the exact task."""
    driver = Driver()
    driver.create(ConversationCreated("r", task="a\x00b"))
    store.append(driver.steps)
    assert store.conversation("r").task in ("a\x00b", "a\\u0000b")
    assert store.load_state("r").task == "a\x00b"
