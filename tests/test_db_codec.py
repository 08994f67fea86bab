"""The JSON codec: round trips, the stable format, strict decoding with typed errors."""

from __future__ import annotations

import contextlib
import enum
import json
import math
import re
import types
import typing
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fanfold.statemachine as sm
from fanfold.db import (
    SCHEMA_VERSION,
    CodecError,
    DatabaseError,
    NonFiniteNumber,
    UnsupportedVersion,
    decode,
    decode_effect,
    decode_effects,
    decode_event,
    decode_state,
    encode,
    encode_effect,
    encode_effects,
    encode_event,
    encode_state,
    fingerprint,
)
from fanfold.db.codec import (
    REGISTERED_ENUMS,
    REGISTERED_TYPES,
    _Memo,
    as_recorded_by,
    clear_memo,
    retired_value,
)
from fanfold.db.fingerprint import clear_cache as clear_fingerprint_cache
from fanfold.db.fingerprint import fingerprint_v2, fingerprint_v3, summary, version
from fanfold.db.fingerprint import matches as fingerprint_matches
from fanfold.statemachine import (
    ALL_EFFECTS,
    ALL_EVENTS,
    ALL_PHASES,
    AwaitingSubAgents,
    ChildFailed,
    Children,
    ChildSpec,
    ChildSucceeded,
    Conversation,
    ConversationCreated,
    ErrorKind,
    Idle,
    Limits,
    ModelReplied,
    ModelReply,
    PendingChild,
    StartTimer,
    SubAgentFinished,
    ToolCall,
    TurnFinished,
    TurnOutcome,
    Usage,
    UserMessaged,
)
from fanfold.statemachine.children import Roster

# ------------------------------------------------------------------ strategies
#
# Built from the classes' annotations, with our own choices of primitive values:
# any text (including non-ASCII), any integer, any finite float (JSON has no NaN or
# infinity: the codec refuses them, see the tests below), and small tuples.

TEXT = st.text(max_size=12)
LIMITS = st.builds(
    Limits,
    max_rounds=st.integers(1, 50),
    max_attempts=st.integers(1, 9),
    retry_base=st.floats(0, 10),
    retry_cap=st.floats(0, 100),
    max_concurrent=st.integers(1, 20),
    max_tasks_per_call=st.integers(1, 20),
    max_depth=st.integers(0, 4),
    child_timeout=st.none() | st.floats(0, 1e6),
    cancel_grace=st.floats(0, 100),
    child_result_cap=st.integers(1, 10_000),
    max_tokens=st.none() | st.integers(0, 10**9),
)
_cache: dict[Any, st.SearchStrategy[Any]] = {}


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    """A strategy for values of the annotated type ``tp``."""
    if tp in _cache:
        return _cache[tp]
    result: st.SearchStrategy[Any]
    if tp is str:
        result = TEXT
    elif tp is int:
        result = st.integers()
    elif tp is float:
        result = st.floats(allow_nan=False, allow_infinity=False)
    elif tp is bool:
        result = st.booleans()
    elif tp is type(None):
        result = st.none()
    elif tp is Limits:
        result = LIMITS
    elif isinstance(tp, type) and issubclass(tp, enum.Enum):
        result = st.sampled_from(tp)
    elif attrs.has(tp):
        hints = typing.get_type_hints(tp)
        result = st.builds(tp, **{f.alias: strategy_for(hints[f.name]) for f in attrs.fields(tp)})
    elif isinstance(tp, types.UnionType):
        result = st.one_of([strategy_for(member) for member in typing.get_args(tp)])
    elif typing.get_origin(tp) in (tuple, Roster):  # Children's converter makes a Roster
        result = st.lists(strategy_for(typing.get_args(tp)[0]), max_size=3).map(tuple)
    else:  # pragma: no cover - the codec refuses the same types at import
        raise TypeError(tp)
    _cache[tp] = result
    return result


EVENTS = st.one_of([strategy_for(cls) for cls in ALL_EVENTS])
EFFECTS = st.one_of([strategy_for(cls) for cls in ALL_EFFECTS])
STATES = strategy_for(Conversation)
ANY_OBJECT = st.sampled_from(sorted(REGISTERED_TYPES, key=lambda c: c.__name__)).flatmap(
    strategy_for
)
ANY_ENUM = st.sampled_from(sorted(REGISTERED_ENUMS, key=lambda e: e.__name__)).flatmap(
    st.sampled_from
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
VALUES = st.recursive(
    SCALARS | ANY_OBJECT | ANY_ENUM,
    lambda inner: st.lists(inner, max_size=3).map(tuple),
    max_leaves=6,
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


# ------------------------------------------------------------------ round trips


@given(EVENTS)
@settings(max_examples=300)
def test_event_round_trip(event: sm.Event) -> None:
    text = encode_event(event)
    assert text.isascii()
    assert decode_event(text) == event
    # The compiled emitters write exactly what json.dumps would.
    assert json.dumps(json.loads(text), separators=(",", ":")) == text


@given(st.lists(EFFECTS, max_size=4).map(tuple))
@settings(max_examples=200)
def test_effects_round_trip(effects: tuple[sm.Effect, ...]) -> None:
    assert decode_effects(encode_effects(effects)) == effects
    for effect in effects:
        assert decode_effect(encode_effect(effect)) == effect


@given(STATES)
@settings(max_examples=200)
def test_state_round_trip(state: Conversation) -> None:
    text = encode_state(state)
    decoded = decode_state(text)
    assert decoded == state
    assert json.dumps(json.loads(text), separators=(",", ":")) == text
    assert fingerprint(decoded) == fingerprint(state)


@given(VALUES)
@settings(max_examples=300)
def test_any_value_round_trip(value: Any) -> None:
    assert decode(encode(value)) == value


@given(st.sampled_from(sorted(ALL_PHASES, key=lambda c: c.__name__)).flatmap(strategy_for))
def test_phase_round_trip(phase: sm.Phase) -> None:
    decoded = decode(encode(phase))
    assert decoded == phase
    assert type(decoded) is type(phase)


def test_enums_keep_their_type() -> None:
    assert decode(encode(ErrorKind.AUTH)) is ErrorKind.AUTH
    assert decode(encode((sm.CancelReason.PARENT, None))) == (sm.CancelReason.PARENT, None)
    event = decode_effect(encode_effect(TurnFinished(TurnOutcome.FAILED, "x")))
    assert isinstance(event, TurnFinished)
    assert type(event.outcome) is TurnOutcome


def test_text_that_utf8_cannot_hold_is_escaped() -> None:
    event = UserMessaged("caf\u00e9 \U0001f600 lone \ud800 surrogate")
    text = encode_event(event)
    assert text.isascii()
    text.encode("utf-8")  # storable in SQLite
    assert decode_event(text) == event


NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])


@given(state=STATES, value=NON_FINITE, data=st.data())
def test_a_non_finite_number_anywhere_is_refused_with_its_path(
    state: Conversation, value: float, data: st.DataObject
) -> None:
    """Issue 10.2: NaN or an infinity in any float field of any state, event or effect
    is refused when encoding (typed, naming the path) and never reaches a text."""
    changed, path = data.draw(_with_non_finite(state, value))
    with pytest.raises(NonFiniteNumber) as info:
        encode_state(changed)
    assert f"Conversation{path}" in str(info.value)
    assert isinstance(info.value, CodecError)
    event = sm.ConversationForked("f", "s", 0, changed)
    with pytest.raises(NonFiniteNumber, match=re.escape(f"ConversationForked.state{path}")):
        encode_event(event)


@st.composite
def _with_non_finite(draw: st.DrawFn, state: Conversation, value: float) -> tuple[Any, str]:
    """``state`` with one float field (chosen among those it has) set to ``value``."""
    name = draw(st.sampled_from(["retry_base", "retry_cap", "child_timeout", "cancel_grace", ""]))
    if not name:
        return attrs.evolve(state, timeout=value), ".timeout"
    limits: dict[str, Any] = {name: value}
    # Limits refuses non-finite numbers itself; the codec is the last line for a value
    # that got past it (built with validators off, as here, or by a user's own class).
    with attrs.validators.disabled():
        changed = attrs.evolve(state.limits, **limits)
    return attrs.evolve(state, limits=changed), f".limits.{name}"


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999", "-1E400"])
@pytest.mark.parametrize(
    "template, path",
    [
        ('{{"v":2,"type":"StartTimer","timer":1,"delay":{x},"purpose":"d"}}', "StartTimer.delay"),
        ('{{"v":2,"type":"UserMessaged","text":{x}}}', "UserMessaged.text"),
        ('[1,{{"a":[0,{x}]}}]', "[1].a[1]"),
    ],
)
def test_decoding_refuses_non_finite_literals(literal: str, template: str, path: str) -> None:
    text = template.format(x=literal)
    json.loads(text)  # Python's json would take it (as nan, inf, or a float overflow)
    for decoder in (decode, decode_effect, decode_event):
        with pytest.raises(
            NonFiniteNumber, match=re.escape(f"{path}: the non-finite number {literal}")
        ):
            decoder(text)


def test_finite_floats_still_decode_after_a_refusal() -> None:
    with pytest.raises(NonFiniteNumber):
        decode_effect('{"v":2,"type":"StartTimer","timer":1,"delay":NaN,"purpose":"d"}')
    value = sm.StartTimer(3, 1e308, "far")
    assert decode_effect(encode_effect(value)) == value


def test_memoised_text_is_the_same_text() -> None:
    spec = sm.ToolSpec.from_schema("t", "d", {"type": "object"})
    request = sm.ModelRequest("s", (sm.UserMessage("a"),), (spec, spec))
    first = encode(request)
    assert encode(request) == first
    clear_memo()
    assert encode(request) == first


def test_the_memo_is_bounded() -> None:
    memo = _Memo(limit=100)
    calls: list[object] = []

    def emit(value: object) -> str:
        calls.append(value)
        return "x" * 60

    memoised = memo.wrap(emit)
    a, b = object(), object()
    assert memoised(a) == memoised(a) == "x" * 60
    assert calls == [a]
    memoised(b)  # 120 characters > 100: the memo starts over
    assert memo.entries == {} and memo.size == 0
    memoised(a)
    assert calls == [a, b, a]


# ------------------------------------------------------------------ the registry


def test_every_exported_statemachine_value_is_registered() -> None:
    exported = [getattr(sm, name) for name in sm.__all__]
    classes = {v for v in exported if isinstance(v, type) and attrs.has(v)}
    enums = {v for v in exported if isinstance(v, type) and issubclass(v, enum.Enum)}
    assert classes <= REGISTERED_TYPES
    assert enums <= REGISTERED_ENUMS
    assert set(ALL_EVENTS) | set(ALL_EFFECTS) | set(ALL_PHASES) <= REGISTERED_TYPES


# ------------------------------------------------------------------ the stable format

GOLDEN_CREATED = (
    '{"v":1,"type":"ConversationCreated","conversation_id":"r","parent_id":null,'
    '"root_id":null,"depth":0,"cwd":".","task":null,"system_prompt":"","model":null,'
    '"limits":{"type":"Limits","max_rounds":20,"max_attempts":4,"retry_base":1.0,'
    '"retry_cap":60.0,"max_concurrent":10,"max_tasks_per_call":10,"max_depth":1,'
    '"child_timeout":600.0,"cancel_grace":30.0,"child_result_cap":8000,"max_tokens":null},'
    '"tools":[],"timeout":null}'
)
GOLDEN_REPLY = (
    '{"v":1,"type":"ModelReplied","call":3,"reply":{"type":"ModelReply","text":"ok",'
    '"tool_calls":[{"type":"ToolCall","id":"t1","name":"bash",'
    '"arguments_json":"{\\"command\\":\\"ls\\"}"}],'
    '"usage":{"type":"Usage","input_tokens":5,"output_tokens":2},"stop_reason":"end_turn"}}'
)


def _v2(golden: str) -> str:
    return golden.replace('{"v":1,', '{"v":2,', 1)


def _v3(golden: str) -> str:
    text = golden.replace('{"v":1,', '{"v":3,', 1)
    if '"type":"ConversationCreated"' in text:
        text = text[:-1] + ',"workdir":null}'  # added in version 3
    return text


def _v4(golden: str) -> str:
    return _v3(golden).replace('{"v":3,', '{"v":4,', 1)


def _v5(golden: str) -> str:
    return _v4(golden).replace('{"v":4,', '{"v":5,', 1)


def _v6(golden: str) -> str:
    return _v5(golden).replace('{"v":5,', '{"v":6,', 1)


def _v7(golden: str) -> str:
    return _v6(golden).replace('{"v":6,', '{"v":7,', 1)


# Schema 7 offers the context mode summary by default; a Limits of schema 6 or older
# decodes to the modes it offered, task_only and full (the codec's BEFORE value), and
# encodes without the field, as it was written.
MODES = ',"context_modes":["task_only","full","summary"]'
OLD_LIMITS = Limits(context_modes=("task_only", "full"))


def test_format_is_stable() -> None:
    """Version 7 documents: changing these strings needs a new SCHEMA_VERSION."""
    assert SCHEMA_VERSION == 7
    reply = ModelReplied(
        3, ModelReply("ok", (ToolCall.of("t1", "bash", {"command": "ls"}),), Usage(5, 2))
    )
    assert encode_event(UserMessaged("hi")) == '{"v":7,"type":"UserMessaged","text":"hi"}'
    created = _v7(GOLDEN_CREATED).replace('"max_tokens":null}', '"max_tokens":null' + MODES + "}")
    assert encode_event(ConversationCreated("r")) == created
    assert encode_event(reply) == _v7(GOLDEN_REPLY)
    assert decode_event(created) == ConversationCreated("r")
    old = ConversationCreated("r", limits=OLD_LIMITS)
    assert encode_event(old) == _v7(GOLDEN_CREATED)
    for golden in (_v7, _v6, _v5, _v4, _v3, _v2):
        assert decode_event(golden(GOLDEN_CREATED)) == old
    assert decode_event(_v4(GOLDEN_REPLY)) == reply
    _fails(_v6(GOLDEN_CREATED)[:-16] + "}", "", "missing field(s) 'workdir'")
    with pytest.raises(CodecError, match="context_modes must list task_only"):
        decode_event(created.replace('"task_only",', ""))
    assert encode(ErrorKind.AUTH) == '{"v":7,"type":"ErrorKind","value":"auth"}'
    assert encode(()) == "[]"
    assert encode(None) == "null"
    finished = SubAgentFinished("r.1", ChildSucceeded("done", 42))
    assert encode_event(finished) == (
        '{"v":7,"type":"SubAgentFinished","child_id":"r.1",'
        '"outcome":{"type":"ChildSucceeded","result":"done","tokens":42}}'
    )


def test_schema_6_retired_the_model_request_of_call_model() -> None:
    """A model call's request is derived from the state (``model_request``), not
    logged. A CallModel of schema 5 or older holds the request: it decodes without it,
    and ``retired_value`` reads it (replay checks it against the derived request); a
    schema 6 document holding one is refused, as any unknown field is."""
    request = sm.ModelRequest("s", (sm.UserMessage("a"),), (), "m")
    nested = encode(request).replace('{"v":7,', "{", 1)  # a field's value has no "v"
    old = '{"v":5,"type":"CallModel","call":3,"request":' + nested + ',"attempt":2}'
    assert decode_effect(old) == sm.CallModel(3, 2)
    assert retired_value(old, "request") == (True, request)
    assert encode_effect(sm.CallModel(3, 2)) == '{"v":7,"type":"CallModel","call":3,"attempt":2}'
    assert retired_value(encode_effect(sm.CallModel(3, 2)), "request") == (False, None)
    _fails(old.replace('"v":5', '"v":6'), "CallModel", "unknown field(s) 'request'")
    with pytest.raises(CodecError, match="expected a ModelRequest object"):
        retired_value(old.replace(nested, "7"), "request")


def test_the_submitted_flag_of_schema_5_is_written_only_when_false() -> None:
    """Schema 5 added ChildSucceeded.submitted. A submitted outcome (all there were
    before) encodes byte for byte as it did, so older logs' fingerprints still match;
    one that never submitted says so, and reads back."""
    old = (
        '{"v":4,"type":"SubAgentFinished","child_id":"r.1",'
        '"outcome":{"type":"ChildSucceeded","result":"done","tokens":42}}'
    )
    assert decode_event(old) == SubAgentFinished("r.1", ChildSucceeded("done", 42, True))
    assert encode_event(decode_event(old)) == old.replace('"v":4', '"v":7')
    plain = SubAgentFinished("r.1", ChildSucceeded("done", 42, submitted=False))
    assert encode_event(plain) == old.replace('"v":4', '"v":7')[:-2] + ',"submitted":false}}'
    assert decode_event(encode_event(plain)) == plain
    assert as_recorded_by(plain, 4) == decode_event(old)
    assert as_recorded_by(plain, 5) == plain
    _fails(encode_event(plain).replace("false", "0"), "submitted")


def test_version_3_effects_decode_with_the_fields_4_added_defaulted() -> None:
    """A log of schema 3 records no CallModel.attempt and no StartTimer.counts_downtime:
    they decode to their defaults, and a version 4 document must have them."""
    timer = '{"v":3,"type":"StartTimer","timer":1,"delay":5.0,"purpose":"time limit"}'
    assert decode_effect(timer) == StartTimer(1, 5.0, "time limit", counts_downtime=False)
    current = StartTimer(1, 5.0, "time limit", counts_downtime=True)
    assert encode_effect(current) == timer.replace('"v":3', '"v":7')[:-1] + (
        ',"counts_downtime":true}'
    )
    _fails(timer.replace('"v":3', '"v":4'), "", "missing field(s) 'counts_downtime'")
    assert as_recorded_by(current, 3) == decode_effect(timer)
    assert as_recorded_by(current, 4) == current


def test_version_1_documents_still_decode() -> None:
    """Logs written before version 2 read as they are: the fields version 2 added take
    their defaults; a version 2 document must have them."""
    reply = ModelReplied(
        3, ModelReply("ok", (ToolCall.of("t1", "bash", {"command": "ls"}),), Usage(5, 2))
    )
    assert decode_event(GOLDEN_CREATED) == ConversationCreated("r", limits=OLD_LIMITS)
    assert decode_event(GOLDEN_REPLY) == reply
    old = (
        '{"v":1,"type":"SubAgentFinished","child_id":"r.1","outcome":{"type":"ChildFailed",'
        '"error":"boom","kind":"auth","reason":null}}'
    )
    assert decode_event(old) == SubAgentFinished("r.1", ChildFailed("boom", ErrorKind.AUTH))
    _fails(_v2(old), "SubAgentFinished.outcome", "missing field(s) 'tokens'")
    state = _waiting_root()
    written = json.loads(encode_state(state))
    written["v"] = 1
    del written["usage_children"]
    del written["phase"]["children"]["pending"][0]["budget"]
    assert decode_state(json.dumps(written)) == state


def _waiting_root(**changes: Any) -> Conversation:
    """A root waiting for its one running child, root.1."""
    spec = ChildSpec("r.1", "t", ".", None, 3, "s1")
    state = Conversation(
        id="r",
        parent_id=None,
        root_id="r",
        depth=0,
        cwd=".",
        task=None,
        system_prompt="",
        model=None,
        limits=Limits(),
        tools=(),
        history=(),
        phase=AwaitingSubAgents(Children(pending=(PendingChild(spec, True),))),
    )
    return attrs.evolve(state, **changes)


def test_fingerprint_names_phase_and_counters() -> None:
    state = _waiting_root(
        history=(sm.UserMessage("a"), sm.AssistantMessage("b")),
        rounds=1,
        next_call=4,
        spawned=1,
    )
    assert summary(state) == "AwaitingSubAgents n4 r1 h2 s1 p1 f0 w0"
    assert summary(attrs.evolve(state, phase=Idle())) == "Idle n4 r1 h2 s1 p0 f0 w0"
    expected = r"AwaitingSubAgents n4 r1 h2 s1 p1 f0 w0 ###[0-9a-f]{16}"
    assert re.fullmatch(expected, fingerprint(state))


def test_version_4_hashes_the_large_values_and_version_3_logs_still_match() -> None:
    """Version 4 hashes the tool set, prompts and agent catalogue by kept digests: a
    change to any of them changes the digest, an equal but distinct value does not;
    a version-3 fingerprint (logs of 2026-11-24/25) matches in its own format."""
    state = _waiting_root(history=(sm.UserMessage("a"),), rounds=1, next_call=2, spawned=1)
    tool = sm.ToolSpec.from_schema("t", "a tool", {"type": "object"})
    with_tools = attrs.evolve(state, tools=(tool,), system_prompt="Be brief. " * 50)
    v3, v4 = fingerprint_v3(with_tools), fingerprint(with_tools)
    assert version(v3) == 3 and version(v4) == 4 and v3.split(" ##")[0] == v4.split(" ###")[0]
    assert fingerprint_matches(with_tools, v3) and fingerprint_matches(with_tools, v4)
    copy = attrs.evolve(with_tools, tools=(attrs.evolve(tool),), system_prompt="Be brief. " * 50)
    assert fingerprint(copy) == v4
    for changed in (
        attrs.evolve(with_tools, tools=(attrs.evolve(tool, description="another"),)),
        attrs.evolve(with_tools, tools=()),
        attrs.evolve(with_tools, system_prompt="Be long."),
        attrs.evolve(with_tools, sub_agent_prompt="You are a sub-agent."),
        attrs.evolve(with_tools, task="other"),
    ):
        assert fingerprint(changed) != v4
        assert not fingerprint_matches(changed, v4)


def test_the_fingerprint_covers_message_text() -> None:
    """Issue 10.14: an edited message changes the fingerprint (version 2), which
    version 1 (phase and counters) did not see; either format still matches its own."""
    state = _waiting_root(history=(sm.UserMessage("a"), sm.AssistantMessage("b")))
    edited = attrs.evolve(state, history=(sm.UserMessage("a"), sm.AssistantMessage("B")))
    assert summary(edited) == summary(state)
    assert fingerprint(edited) != fingerprint(state)
    assert fingerprint_matches(state, fingerprint(state))
    assert fingerprint_matches(state, summary(state))  # a version-1 log still verifies
    assert not fingerprint_matches(edited, fingerprint(state))


@given(states=st.lists(STATES, min_size=1, max_size=4), extra=st.lists(TEXT, max_size=4))
def test_the_incremental_digest_is_the_digest_from_scratch(
    states: list[Conversation], extra: list[str]
) -> None:
    """Whatever histories came before (cached chains, shared ids, extensions), a
    state's digest is the one computed with nothing cached."""
    seen = []
    for state in states:
        state = attrs.evolve(state, id="same")
        longer = attrs.evolve(state, history=(*state.history, *map(sm.UserMessage, extra)))
        for s in (state, longer):
            seen.append((s, fingerprint(s)))
    for s, mark in seen:
        clear_fingerprint_cache()
        assert fingerprint(s) == mark


def test_a_version_2_log_still_verifies_and_a_change_of_child_shows_in_both() -> None:
    """Logs written before version 3 hold version-2 fingerprints: they match in their
    own format. Both versions cover every child of the round."""
    state = _waiting_root(history=(sm.UserMessage("a"),))
    old = fingerprint_v2(state)
    assert version(old) == 2 and version(fingerprint(state)) == 4
    assert version(summary(state)) == 1
    assert fingerprint_matches(state, old)
    assert phase_of(state).children.pending  # the helper's root waits on one child
    other_task = attrs.evolve(
        state,
        phase=AwaitingSubAgents(
            Children(pending=(PendingChild(ChildSpec("r.1", "T", ".", None, 3, "s1"), True),))
        ),
    )
    assert not fingerprint_matches(other_task, old)
    assert fingerprint(other_task) != fingerprint(state)


def phase_of(state: Conversation) -> AwaitingSubAgents:
    assert isinstance(state.phase, AwaitingSubAgents)
    return state.phase


_CHILD_MOVES = st.lists(
    st.tuples(st.sampled_from(["finish", "start", "append", "reorder"]), st.integers(0, 50)),
    max_size=12,
)


@given(n=st.integers(0, 6), moves=_CHILD_MOVES)
def test_the_childrens_incremental_digest_is_the_digest_from_scratch(
    n: int, moves: list[tuple[str, int]]
) -> None:
    """Version 3 keeps each child's digest and the last lists seen: whatever the steps
    did to the children (one finished, started, appended, or any other change), a
    state's fingerprint is the one computed with nothing cached, and differs from its
    predecessor's whenever the children differ."""
    specs = [ChildSpec(f"r.{i + 1}", f"t{i}", ".", None, 3, "s1") for i in range(n)]
    children = Children(pending=tuple(PendingChild(spec) for spec in specs))
    seen = []
    state = _waiting_root(phase=AwaitingSubAgents(children))
    seen.append((state, fingerprint(state)))
    for move, at in moves:
        pending, finished = children.pending, children.finished
        if move == "finish" and pending:
            child = pending[at % len(pending)].spec.id
            children = children.finish(child, ChildSucceeded(f"done {at}"))
        elif move == "start" and pending:
            i = at % len(pending)
            started = PendingChild(pending[i].spec, started=True, budget=at)
            children = attrs.evolve(children, pending=(*pending[:i], started, *pending[i + 1 :]))
        elif move == "append":
            spec = ChildSpec(f"r.{len(specs) + 1}", f"new {at}", ".", None, 3, "s2")
            specs.append(spec)
            children = attrs.evolve(children, pending=(*pending, PendingChild(spec)))
        elif move == "reorder" and len(finished) > 1:
            children = attrs.evolve(children, finished=finished[::-1])
        before = seen[-1]
        state = attrs.evolve(state, phase=AwaitingSubAgents(children))
        mark = fingerprint(state)
        if phase_of(before[0]).children != children:
            assert mark != before[1]
        seen.append((state, mark))
    for s, mark in seen:
        clear_fingerprint_cache()
        assert fingerprint(s) == mark


# ------------------------------------------------------------------ strict decoding


def _fails(text: str, *needles: str) -> CodecError:
    with pytest.raises(CodecError) as info:
        decode(text)
    for needle in needles:
        assert needle in str(info.value)
    assert isinstance(info.value, DatabaseError)
    return info.value


def test_unknown_type_is_refused() -> None:
    _fails('{"v":1,"type":"Teleported","to":"mars"}', "unknown type 'Teleported'")


def test_missing_field_is_named_with_its_path() -> None:
    doc = json.loads(GOLDEN_REPLY)
    del doc["reply"]["tool_calls"][0]["name"]
    _fails(json.dumps(doc), "ModelReplied.reply.tool_calls[0]", "missing field(s) 'name'")


def test_extra_field_is_refused() -> None:
    _fails('{"v":1,"type":"UserMessaged","text":"hi","mood":"sunny"}', "unknown field(s) 'mood'")


def test_wrong_value_types_are_named() -> None:
    _fails('{"v":1,"type":"TimerFired","timer":"3"}', "TimerFired.timer", "expected an integer")
    _fails('{"v":1,"type":"TimerFired","timer":true}', "expected an integer, got a boolean")
    _fails(
        '{"v":1,"type":"CancelRequested","reason":"boredom"}',
        "CancelRequested.reason",
        "expected a CancelReason",
    )
    doc = json.loads(GOLDEN_REPLY)
    doc["reply"]["usage"] = {"type": "ToolCall", "id": "x", "name": "y", "arguments_json": "{}"}
    _fails(json.dumps(doc), "ModelReplied.reply.usage", "expected a Usage object")


def test_versions() -> None:
    with pytest.raises(UnsupportedVersion) as info:
        decode('{"v":8,"type":"UserMessaged","text":"hi"}')
    assert info.value.version == 8
    assert "versions 1 to 7" in str(info.value)
    for bad in ("0", '"1"', "1.0", "null"):
        with pytest.raises(CodecError):
            decode('{"v":' + bad + ',"type":"UserMessaged","text":"hi"}')
    _fails('{"type":"UserMessaged","text":"hi"}', "no schema version")


def test_constructor_validation_becomes_codec_error() -> None:
    doc = json.loads(GOLDEN_CREATED)
    doc["limits"]["max_rounds"] = 0
    _fails(json.dumps(doc), "ConversationCreated.limits", "max_rounds must be >= 1")


def test_typed_decoders_refuse_the_wrong_kind() -> None:
    effect = encode_effect(TurnFinished(TurnOutcome.ANSWERED, "x"))
    with pytest.raises(CodecError, match="expected an event, got type 'TurnFinished'"):
        decode_event(effect)
    with pytest.raises(CodecError, match="expected an effect"):
        decode_effect(encode_event(UserMessaged("x")))
    with pytest.raises(CodecError, match="expected a state"):
        decode_state(encode_event(UserMessaged("x")))
    with pytest.raises(CodecError, match=r"effect \[1\]"):
        decode_effects(f"[{effect},{encode_event(UserMessaged('x'))}]")
    with pytest.raises(CodecError, match="not valid JSON"):
        decode_event("{")
    with pytest.raises(CodecError, match="expected an array"):
        decode_effects("{}")


def test_encoding_non_statemachine_values_is_refused() -> None:
    with pytest.raises(CodecError, match="cannot encode object"):
        encode(object())
    with pytest.raises(CodecError, match="as an event"):
        encode_event(TurnFinished(TurnOutcome.ANSWERED, "x"))  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="as an effect"):
        encode_effects((UserMessaged("x"),))  # type: ignore[arg-type]
    with pytest.raises(
        CodecError, match="cannot encode ToolResult: first argument must be a string"
    ):
        encode(sm.ToolResult("t", "n", object()))  # type: ignore[arg-type]


@given(JSON)
@settings(max_examples=300)
def test_decoding_arbitrary_json_raises_only_codec_errors(value: Any) -> None:
    text = json.dumps(value)
    for decoder in (decode, decode_event, decode_effects, decode_state):
        with contextlib.suppress(CodecError):
            decoder(text)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


@given(EVENTS, st.data())
@settings(max_examples=300)
def test_mutated_documents_decode_or_raise_codec_error(
    event: sm.Event, data: st.DataObject
) -> None:
    """Replace or delete one nested value of a valid document: never a raw exception."""
    doc = json.loads(encode_event(event))
    path = data.draw(st.sampled_from(_paths(doc)))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if data.draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(JSON)
    with contextlib.suppress(CodecError):
        decode_event(json.dumps(doc))


def test_a_content_digest_hashes_stored_documents_without_their_schema_version() -> None:
    """Format 5 (issue 11): a compact document is hashed as stored minus its version; an
    object document of a type the log keeps as one is its value's unversioned text; an
    event in object form (an import of another schema's export) cannot be checked."""
    from fanfold.db.codec import (
        SCHEMA_VERSION,
        decode_effect,
        encode_effect_stored,
        encode_event,
        encode_event_compact,
        encode_unversioned,
    )
    from fanfold.db.fingerprint import canonical_text, content_digest
    from fanfold.statemachine import CallModel, ToolFinished, ToolResult

    event = ToolFinished(3, ToolResult("c", "think", "ok", False))
    compact = encode_event_compact(event, {})
    assert compact.startswith(f"[{SCHEMA_VERSION},")
    assert canonical_text(compact, object_form=False) == "[" + compact.split(",", 1)[1]
    call = CallModel(4, 2)
    stored = encode_effect_stored(call)
    assert decode_effect(stored) == call
    assert canonical_text(stored, object_form=True) == encode_unversioned(call)
    # An event in object form: of an older schema that wrote format 5 (an import of
    # its export), not checkable; of the current one (written by no fanfold), hashed
    # as it is, so it matches nothing.
    as_object = encode_event(event)
    imported = as_object.replace(f'"v":{SCHEMA_VERSION},', '"v":6,', 1)
    assert SCHEMA_VERSION > 6
    assert canonical_text(imported, object_form=False) is None
    assert content_digest(imported, [("CallModel", stored)]) is None
    # Schema 6 wrote the first format-5 fingerprints: a document older than that in a
    # format-5 step was never written by a fanfold (a downgrade to dodge the check).
    older = as_object.replace(f'"v":{SCHEMA_VERSION},', '"v":5,', 1)
    assert canonical_text(older, object_form=False) == older
    assert canonical_text(as_object, object_form=False) == as_object
    digest = content_digest(compact, [("CallModel", stored)])
    assert digest is not None and len(digest) == 16
    # A later schema version changes no digest; any other change does.
    newer = compact.replace(f"[{SCHEMA_VERSION},", f"[{SCHEMA_VERSION + 1},", 1)
    assert content_digest(newer, [("CallModel", stored)]) == digest
    assert content_digest(compact, []) != digest
    assert content_digest(compact, [("CallModel", encode_effect_stored(CallModel(4, 3)))]) != digest
    assert content_digest(older, [("CallModel", stored)]) not in (None, digest)
    assert content_digest(as_object, [("CallModel", stored)]) not in (None, digest)
    # A newer fanfold (schema 7, say) reading a format-5 step of schema 6 imported in
    # object form: not checkable, rather than a false divergence.
    from unittest import mock

    from fanfold.db import codec as codec_module

    with mock.patch.object(codec_module, "SCHEMA_VERSION", SCHEMA_VERSION + 1):
        assert canonical_text(as_object, object_form=False) is None
