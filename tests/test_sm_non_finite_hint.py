"""The reducer tells most tool calls' arguments free of non-finite numbers without
parsing them (``may_hold_non_finite``, issue 21): sound only if every text whose
parse holds a NaN or an infinity is sent on to the parse. Property over JSON texts
with every spelling of a number Python's reader takes."""

from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st

from fanfold.statemachine.messages import may_hold_non_finite, non_finite_path

_NUMBERS = st.one_of(
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1E400", "0", "-0.0"]),
    st.from_regex(r"-?(0|[1-9][0-9]{0,400})(\.[0-9]{1,4})?([eE][-+]?[0-9]{1,4})?", fullmatch=True),
)
_STRINGS = st.text(max_size=6).map(json.dumps)


def _document(leaves: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3).map(lambda items: "[" + ",".join(items) + "]"),
            st.lists(st.tuples(_STRINGS, inner), max_size=3).map(
                lambda pairs: "{" + ",".join(f"{k}:{v}" for k, v in pairs) + "}"
            ),
        ),
        max_leaves=6,
    )


@given(_document(st.one_of(_NUMBERS, _STRINGS, st.sampled_from(["true", "null"]))))
@example('{"timeout":' + "9" * 309 + ".5}")
@example('{"a":[1,{"b":1e309}]}')
@example('{"n":NaN}')
def test_a_text_whose_parse_holds_a_non_finite_number_is_always_parsed(text: str) -> None:
    if non_finite_path(json.loads(text)) is not None:
        assert may_hold_non_finite(text)


def test_plain_arguments_are_told_without_a_parse() -> None:
    assert not may_hold_non_finite('{"thought":"working","n":12,"x":0.5,"s":"e1 Nano"}')
    assert not may_hold_non_finite('{"tasks":[{"task":"task 1"},{"task":"task 2"}]}')
