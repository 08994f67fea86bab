"""Limits (and agent definitions) built from Python with ints where seconds are meant:
converted at the boundary, so the log decodes to the state that was recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from replay_helpers import ancestors, trace_steps
from runtime_helpers import open_runtime, reply, script, spawn, submit

from fanfold import replay, testing
from fanfold.agents import AgentDefinition
from fanfold.db import Store, codec
from fanfold.statemachine import ConversationCreated, Limits

SECONDS = ("retry_base", "retry_cap", "child_timeout", "cancel_grace", "approval_timeout")
COUNTS = (
    "max_rounds",
    "max_attempts",
    "max_concurrent",
    "max_tasks_per_call",
    "max_depth",
    "child_result_cap",
    "max_tokens",
)


def test_every_numeric_field_is_covered() -> None:
    # A numeric field added to Limits joins one of the lists, or this fails.
    numeric = {
        f.name for f in attrs.fields(Limits) if any(t in str(f.type) for t in ("int", "float"))
    }
    assert numeric == set(SECONDS) | set(COUNTS)


def _seconds(whole: int) -> st.SearchStrategy[int | float]:
    # The same number of seconds as an int or a float, or a fraction.
    return st.sampled_from([whole, float(whole), whole + 0.5])


@st.composite
def limits_given_either_way(draw: st.DrawFn) -> Limits:
    """Small limits (as ``testing.limits``) with every seconds field given as an int or
    a float, as a user writing ``Limits(cancel_grace=8)`` might."""
    base = draw(testing.limits())
    changes: dict[str, Any] = {
        "retry_base": draw(_seconds(draw(st.integers(0, 2)))),
        "retry_cap": draw(_seconds(draw(st.integers(1, 60)))),
        "cancel_grace": draw(_seconds(draw(st.integers(1, 30)))),
        "child_timeout": draw(st.none() | _seconds(draw(st.integers(1, 60)))),
        "approval_timeout": draw(st.none() | _seconds(draw(st.integers(1, 60)))),
    }
    return attrs.evolve(base, **changes)


@given(limits_given_either_way())
def test_seconds_are_stored_as_floats_and_round_trip_exactly(limits: Limits) -> None:
    for name in SECONDS:
        value = getattr(limits, name)
        assert value is None or type(value) is float, (name, value)
    text = codec.encode(limits)
    again = codec.decode(text)
    assert again == limits
    assert codec.encode(again) == text
    assert [type(getattr(again, n)) for n in SECONDS] == [type(getattr(limits, n)) for n in SECONDS]


@given(data=st.data(), snapshot_every=st.none() | st.integers(1, 4))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_log_with_limits_given_either_way_replays_exactly(
    data: st.DataObject, snapshot_every: int | None
) -> None:
    created = data.draw(testing.conversation_created(limits_strategy=limits_given_either_way()))
    trace = data.draw(testing.event_sequences(created, max_steps=30))
    steps = trace_steps(trace, snapshot_every=snapshot_every)
    cid = created.conversation_id
    with Store.memory() as store:
        store.append([*ancestors(created), *steps])
        report = replay.verify(store, cid)
        assert report.ok, report.summary()
        assert report.result(cid).final_state == trace.final()
        assert store.load_state(cid) == trace.final()


async def test_a_tree_run_with_int_seconds_verifies_and_its_state_loads(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # The four fields of issue 22.4, as a user writes them.
    limits = Limits(cancel_grace=8, child_timeout=60, retry_cap=10, retry_base=2)
    provider = script(1.0, root=[reply("", spawn("a")), reply("done")], c1=[reply("", submit("r"))])
    async with open_runtime(tmp_path, provider, limits=limits) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await runtime.wait(root)
        assert runtime.state(root).limits == limits
    with Store.open(tmp_path / "log.db") as store:
        report = replay.verify(store, root, tree=True)
        assert report.ok, report.summary()
        assert report.events > 4


@pytest.mark.parametrize("name", SECONDS)
@pytest.mark.parametrize("value", [True, "8", [8]])
def test_seconds_refuse_what_is_not_a_number(name: str, value: object) -> None:
    with pytest.raises(TypeError, match="number of seconds"):
        Limits(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", COUNTS)
@pytest.mark.parametrize("value", [True, 3.0, "3"])
def test_counts_refuse_bools_and_floats(name: str, value: object) -> None:
    with pytest.raises(TypeError, match=f"{name} must be an integer"):
        Limits(**{name: value})  # type: ignore[arg-type]


async def test_an_agent_definition_with_an_int_timeout_verifies(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # AgentDefinition is built from Python too; its timeout becomes the child's.
    checker = AgentDefinition(name="checker", description="checks", timeout=30)
    assert type(checker.timeout) is float
    provider = script(
        1.0,
        root=[reply("", spawn({"task": "check", "agent": "checker"})), reply("done")],
        c1=[reply("", submit("r"))],
    )
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("go", cwd=tmp_path, agents=(checker,))
        await runtime.wait(root)
        runtime.state(root)
    with Store.open(tmp_path / "log.db") as store:
        report = replay.verify(store, root, tree=True)
        assert report.ok, report.summary()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout", True),
        ("timeout", "30"),
        ("max_rounds", True),
        ("max_rounds", 2.0),
        ("max_tokens", False),
        ("max_tokens", 10.0),
    ],
)
def test_an_agent_definition_refuses_what_is_not_its_number(field: str, value: object) -> None:
    with pytest.raises(TypeError, match=field if field != "timeout" else "number of seconds"):
        AgentDefinition(name="a", description="d", **{field: value})  # type: ignore[arg-type]


def test_a_created_conversations_int_timeout_is_a_float() -> None:
    created = ConversationCreated(conversation_id="c", parent_id="r", depth=1, timeout=30)
    assert type(created.timeout) is float
    assert codec.decode_event(codec.encode_event(created)) == created
