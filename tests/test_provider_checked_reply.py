"""``checked_reply`` (issue 36): every model reply passes it, so replies of the exact
types pass a fast check with no call per field; everything else, subclasses included,
takes the full checks. Both agree: what the full checks refuse is refused, with the
same message, and what they accept is accepted."""

from __future__ import annotations

import re
from typing import Any

import pytest

from fanfold.providers.base import ProviderContractError, checked_reply
from fanfold.statemachine.messages import ModelReply, ToolCall, Usage


class Text(str):
    pass


class Count(int):
    pass


GOOD_CALL = ToolCall("c1", "think", '{"thought": "x"}')


@pytest.mark.parametrize(
    "reply",
    [
        ModelReply("hi"),
        ModelReply("", (GOOD_CALL, GOOD_CALL), Usage(3, 4), "tool_use"),
        ModelReply(Text("a str subclass")),
        ModelReply("x", (ToolCall(Text("c"), "n", "{}"),)),
    ],
)
def test_well_formed_replies_pass(reply: ModelReply) -> None:
    assert checked_reply(reply) is reply


BAD: list[tuple[Any, str]] = [
    ("not a reply", "str instead of a ModelReply"),
    (ModelReply(1), "text is int"),  # type: ignore[arg-type]
    (ModelReply("x", stop_reason=None), "stop_reason is NoneType"),  # type: ignore[arg-type]
    (ModelReply("x", [GOOD_CALL]), "tool_calls are a list"),  # type: ignore[arg-type]
    (ModelReply("x", (GOOD_CALL, "call")), "tool_calls[1] is str"),  # type: ignore[arg-type]
    (ModelReply("x", (ToolCall(1, "n", "{}"),)), "tool_calls[0].id is not str"),  # type: ignore[arg-type]
    (ModelReply("x", (ToolCall("c", "n", None),)), "arguments_json is not str"),  # type: ignore[arg-type]
    (ModelReply("x", usage=Usage(-1, 0)), "usage is not a Usage of token counts"),
    (ModelReply("x", usage=Usage(0, True)), "usage is not a Usage of token counts"),
    (ModelReply("x", usage=Usage(0, 1.0)), "usage is not a Usage of token counts"),  # type: ignore[arg-type]
    (ModelReply("x", usage=Usage(Count(1), 2)), "usage is not a Usage of token counts"),
    (ModelReply("x", usage=None), "usage is not a Usage"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("reply", "problem"), BAD)
def test_ill_formed_replies_are_refused_saying_why(reply: Any, problem: str) -> None:
    with pytest.raises(ProviderContractError, match="provider returned .*" + re.escape(problem)):
        checked_reply(reply)
