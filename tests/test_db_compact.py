"""The log stores events in the compact form (``fanfold.db.codec``, "Compact form"):
the same values as the object documents, without field names."""

from __future__ import annotations

import json

import attrs
import pytest
from hypothesis import given, settings
from replay_helpers import trace_steps

from fanfold import testing
from fanfold.db import (
    CodecError,
    UnsupportedVersion,
    decode_effect,
    decode_event,
    decode_state,
    encode_effect,
    encode_event,
    encode_state,
)
from fanfold.db.codec import (
    OBJECT_EFFECTS,
    SCHEMA_VERSION,
    encode_effect_stored,
    encode_event_compact,
    encode_state_stored,
    inline_effect,
    inline_event,
    inline_state,
)
from fanfold.statemachine import (
    ConversationCreated,
    ModelReplied,
    ModelReply,
    RuntimeResumed,
    ToolCall,
    ToolSpec,
    Usage,
)


@given(trace=testing.event_sequences(max_steps=25))
@settings(max_examples=60, deadline=None)
def test_every_event_reads_back_from_its_compact_form(trace: testing.Trace) -> None:
    for step in trace_steps(trace):
        blobs: dict[str, str] = {}
        text = encode_event_compact(step.event, blobs)
        assert decode_event(text, blobs) == step.event
        # Exported, it is the object document, exactly.
        inline = json.dumps(inline_event(text, blobs), separators=(",", ":"))
        assert inline == encode_event(step.event)


@given(trace=testing.event_sequences(max_steps=25))
@settings(max_examples=40, deadline=None)
def test_every_state_and_effect_reads_back_as_stored(trace: testing.Trace) -> None:
    for step in trace_steps(trace):
        blobs: dict[str, str] = {}
        text = encode_state_stored(step.state, blobs)
        assert text.startswith("[")
        assert decode_state(text, blobs) == step.state
        inline = json.dumps(inline_state(text, blobs), separators=(",", ":"))
        assert inline == encode_state(step.state)
        for effect in step.effects:
            stored = encode_effect_stored(effect)
            assert stored.startswith("{") == (type(effect).__name__ in OBJECT_EFFECTS)
            assert decode_effect(stored) == effect
            assert json.dumps(inline_effect(stored), separators=(",", ":")) == encode_effect(effect)


def test_the_compact_form_leaves_out_the_field_names() -> None:
    event = ModelReplied(
        3, ModelReply("Done.", (ToolCall("c1", "think", '{"a":1}'),), Usage(12, 7), "tool_use")
    )
    text = encode_event_compact(event, {})
    assert text == (
        f'[{SCHEMA_VERSION},"ModelReplied",3,["Done.",'
        '[["c1","think","{\\"a\\":1}"]],[12,7,0],"tool_use",""]]'
    )
    # (No type name where the annotation names one class: ModelReply, ToolCall, Usage.)
    # (Fields written only when not at their default in the object form, such as the
    # cached tokens of a Usage, are always written here: every field has its place.)
    assert len(text) < len(encode_event(event)) * 0.5


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[5,"UserMessaged","hi"]', "the compact form exists since schema 6"),
        (f'[{SCHEMA_VERSION},"UserMessaged"]', "needs 1 field(s) in its compact form, got 0"),
        (f'[{SCHEMA_VERSION},"UserMessaged","a","b"]', "needs 1 field(s)"),
        (f'[{SCHEMA_VERSION},"UserMessaged",3]', "UserMessaged.text: expected a string"),
        (f'[{SCHEMA_VERSION},"CallModel",1,1]', "expected an event, got type 'CallModel'"),
        (f'[{SCHEMA_VERSION},"Nope"]', "expected an event, got type 'Nope'"),
        ('["UserMessaged","hi"]', "does not start with a version"),
        ("[]", "does not start with a version"),
        (f'[{SCHEMA_VERSION},"ModelReplied",1,[1,2]]', "ModelReply needs 4 to 5 field"),
        (f'[{SCHEMA_VERSION},"ModelReplied",1,{{"blob":"00"}}]', "expected a ModelReply object"),
    ],
)
def test_a_bad_compact_document_is_a_codec_error(text: str, problem: str) -> None:
    with pytest.raises(CodecError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        decode_event(text)


def test_a_newer_compact_document_is_refused_with_both_versions() -> None:
    with pytest.raises(UnsupportedVersion):
        decode_event(f'[{SCHEMA_VERSION + 1},"UserMessaged","hi"]')


def test_trailing_fields_omitted_at_default_may_be_missing_from_a_compact_document() -> None:
    """Schema 7 logs hold ``RuntimeResumed`` both as ``[7,"RuntimeResumed"]`` (written
    before ``idempotent_tools`` existed) and with the field: both read, as the same
    value (the first was refused: "needs 1 field(s)")."""
    assert decode_event('[7,"RuntimeResumed"]') == RuntimeResumed()
    assert decode_event('[7,"RuntimeResumed",[]]') == RuntimeResumed()
    assert decode_event('[7,"RuntimeResumed",["grep"]]') == RuntimeResumed(("grep",))
    # A fork's first going-on adds ``forked`` (h34b), written only when true.
    assert decode_event('[7,"RuntimeResumed",[],true]') == RuntimeResumed((), forked=True)
    with pytest.raises(CodecError, match=r"needs 0 to 2 field\(s\)"):
        decode_event('[7,"RuntimeResumed",[],true,[]]')


def test_a_tool_spec_is_written_as_before_unless_it_is_read_only() -> None:
    """``ToolSpec.read_only`` (schema 7, omitted at default): a spec that is not
    read-only is stored byte for byte as before the field, so older logs' tool sets
    (and their blobs' digests) are unchanged; a read-only one says so and reads back."""
    plain = ToolSpec("peek", "read", '{"type":"object"}')
    marked = attrs.evolve(plain, read_only=True)
    before = '{"type":"ToolSpec","name":"peek","description":"read","input_schema_json":'
    for spec, tail in ((plain, "}"), (marked, ',"read_only":true}')):
        created = ConversationCreated("r", tools=(spec,))
        blobs: dict[str, str] = {}
        text = encode_event_compact(created, blobs)
        assert before + '"{\\"type\\":\\"object\\"}"' + tail in text
        assert decode_event(text, blobs) == created
