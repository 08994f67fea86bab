"""``steps``, ``state_at`` and ``fork`` over logs written through Store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from db_scenarios import Driver, cancelled_fan_out, fan_out
from replay_helpers import edit, write

from fanfold import replay
from fanfold.db import Store, UnknownConversation
from fanfold.replay import ForkRefused, LogCorrupt, LogDiverged, NoSuchStep
from fanfold.statemachine import (
    AwaitingSubAgents,
    ConversationCreated,
    ConversationForked,
    Error,
    ErrorKind,
    ModelError,
    ModelFailed,
    UserMessaged,
)


@pytest.fixture
def driver() -> Driver:
    driver = Driver(snapshot_every=3)
    fan_out(driver, "r")
    cancelled_fan_out(driver, "c")
    return driver


@pytest.fixture
def store(tmp_path: Path, driver: Driver) -> Iterator[Store]:
    write(tmp_path / "log.db", driver.steps)
    with Store.open(tmp_path / "log.db") as opened:
        yield opened


def _states(driver: Driver, cid: str) -> list[object]:
    return [s.state for s in driver.steps if s.conversation_id == cid]


def test_steps_show_each_transition_with_the_states_around_it(store: Store, driver: Driver) -> None:
    walked = list(replay.steps(store, "r"))
    recorded = [s for s in driver.steps if s.conversation_id == "r"]
    assert [s.seq for s in walked] == list(range(len(recorded)))
    assert walked[0].before_state is None
    for step, before, after in zip(walked[1:], walked, walked[1:], strict=False):
        assert step.before_state == before.after_state
        assert after.after_state == recorded[after.seq].state
    assert [s.at for s in walked] == [s.at for s in recorded]
    assert [s.recomputed_fingerprint for s in walked] == [s.fingerprint for s in walked]


def test_at_and_until_select_steps(store: Store, driver: Driver) -> None:
    (only,) = replay.steps(store, "r", at=2)
    assert only.seq == 2 and only.after_state == _states(driver, "r")[2]
    assert [s.seq for s in replay.steps(store, "r", until=3)] == [0, 1, 2, 3]
    last = store.conversation("r").last_seq
    with pytest.raises(NoSuchStep, match=f"has no event {last + 1}: its events are 0 to {last}"):
        replay.steps(store, "r", at=last + 1)
    with pytest.raises(NoSuchStep):
        replay.steps(store, "r", until=last + 5)
    with pytest.raises(ValueError, match="at most one"):
        replay.steps(store, "r", at=1, until=2)
    with pytest.raises(UnknownConversation):
        replay.steps(store, "nope")


def test_a_tree_interleaves_parent_and_children_by_recorded_time(
    store: Store, driver: Driver
) -> None:
    walked = list(replay.steps(store, "r", tree=True))
    expected = [(s.conversation_id, s.seq) for s in driver.steps if s.conversation_id[0] == "r"]
    # The driver's clock ticks once per step: recorded time is exactly the driver's order.
    assert [(s.conversation_id, s.seq) for s in walked] == expected
    until = list(replay.steps(store, "r", tree=True, until=3))
    cutoff = next(s.at for s in walked if (s.conversation_id, s.seq) == ("r", 3))
    assert until == [s for s in walked if s.at <= cutoff]
    assert until[-1].conversation_id == "r" and until[-1].seq == 3


def test_equal_times_are_ordered_by_the_write_order(tmp_path: Path, driver: Driver) -> None:
    path = tmp_path / "same-time.db"
    write(path, [s for s in driver.steps if s.conversation_id[0] == "r"])
    edit(path, "UPDATE events SET at = 5.0")
    with Store.open(path) as store:
        walked = [(s.conversation_id, s.seq) for s in replay.steps(store, "r", tree=True)]
    assert walked == [
        (s.conversation_id, s.seq) for s in driver.steps if s.conversation_id[0] == "r"
    ]


def test_state_at_each_seq(store: Store, driver: Driver) -> None:
    for cid in ("r", "r.2", "c"):
        for seq, state in enumerate(_states(driver, cid)):
            assert replay.state_at(store, cid, seq) == state
    with pytest.raises(NoSuchStep):
        replay.state_at(store, "r", 99)


def test_state_at_refuses_a_damaged_or_diverging_log(tmp_path: Path, store: Store) -> None:
    store.close()
    path = tmp_path / "log.db"
    edit(path, "UPDATE events SET fingerprint = 'x' WHERE conversation_id = 'r' AND seq = 2")
    edit(path, "UPDATE events SET payload = '?' WHERE conversation_id = 'r' AND seq = 4")
    with Store.open(path) as damaged:
        assert replay.state_at(damaged, "r", 1).phase.__class__.__name__ == "LlmRequesting"
        with pytest.raises(LogDiverged, match="seq 2"):
            replay.state_at(damaged, "r", 3)
        walked: list[int] = []
        with pytest.raises(LogCorrupt, match="seq 4"):
            walked.extend(s.seq for s in replay.steps(damaged, "r"))
        assert walked == [0, 1, 2, 3]  # the divergence at 2 is shown, the damage stops it


# ------------------------------------------------------------------ fork


def test_fork_starts_a_new_root_from_a_state_at_rest(store: Store, driver: Driver) -> None:
    last = store.conversation("r").last_seq
    before = store.raw_tree("r")
    fork = replay.fork(store, "r", last, new_id="r-fork", now=42.0)
    assert fork == "r-fork"
    row = store.conversation(fork)
    assert (row.parent_id, row.root_id, row.depth) == (None, fork, 0)
    assert (row.forked_from, row.forked_at_seq, row.created_at) == ("r", last, 42.0)
    assert row.user_initiated and row.status == "idle" and row.last_seq == 0
    (created,) = store.events(fork)
    assert isinstance(created.event, ConversationForked)
    assert (created.event.source_id, created.event.source_seq) == ("r", last)
    state = store.load_state(fork)
    source = driver.states["r"]
    assert state.id == fork and state.root_id == fork
    assert state.history == source.history and state.spawned == source.spawned
    assert replay.verify(store, fork, tree=True).ok
    assert store.raw_tree("r") == before  # the source is untouched
    assert fork in {r.id for r in store.list_roots()}
    # A fresh id when none is given; forks of forks work too.
    again = replay.fork(store, fork, 0)
    assert len(again) == 12 and store.conversation(again).forked_from == fork


def test_a_tree_from_elsewhere_forks_with_work_in_flight(store: Store) -> None:
    # The driver's log has no provenance mark: a tree from elsewhere. Work in flight
    # forks the whole tree (issue 34: it was refused, naming the nearest rests).
    last = store.conversation("r").last_seq
    fork = replay.fork(store, "r", 3)
    assert isinstance(replay.state_at(store, fork, 0).phase, AwaitingSubAgents)
    record = store.tree_record(fork)
    assert record is not None and record.provider is None  # goes on with the user's
    sub = replay.fork(store, "r.1", 0)
    with pytest.raises(ForkRefused, match="as 'c': that id is taken"):
        replay.fork(store, "r", 0, new_id="c")
    with pytest.raises(NoSuchStep):
        replay.fork(store, "r", last + 1)
    with pytest.raises(UnknownConversation):
        replay.fork(store, "nope", 0)
    assert sorted(r.id for r in store.list_roots()) == sorted(["c", "r", fork, sub])


def test_a_root_can_be_forked_after_an_error(tmp_path: Path) -> None:
    driver = Driver()
    driver.create(ConversationCreated("e"))
    driver.feed("e", UserMessaged("hi"))
    failure = ModelFailed(driver.model_call("e"), ModelError(ErrorKind.AUTH, "bad key"))
    driver.feed("e", failure)
    write(tmp_path / "e.db", driver.steps)
    with Store.open(tmp_path / "e.db") as store:
        fork = replay.fork(store, "e", 2)
        assert isinstance(store.load_state(fork).phase, Error)
        # Its model call awaited: a fork that asks it again of this user's provider.
        waiting = replay.fork(store, "e", 1)
        assert replay.state_at(store, waiting, 0).phase == replay.state_at(store, "e", 1).phase


def test_fork_refuses_a_state_the_reducer_does_not_reproduce(tmp_path: Path, store: Store) -> None:
    store.close()
    edit(tmp_path / "log.db", "UPDATE events SET fingerprint = 'x' WHERE conversation_id = 'r'")
    with Store.open(tmp_path / "log.db") as damaged, pytest.raises(LogDiverged):
        replay.fork(damaged, "r", 0)
