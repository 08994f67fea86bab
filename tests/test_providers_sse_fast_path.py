"""The SSE decoder's fast path for LF-only streams (issue 36: ``data:`` lines and the
blank lines that end events taken without a call each) gives the events the general
path gives for the same stream with CRLF line ends, however the bytes are cut."""

from __future__ import annotations

import pytest

from fanfold.providers.wire import SSEDecoder, SSEEvent

STREAM = (
    "\ufeffdata: first\n\n"
    ": a comment\n"
    "event: delta\n"
    "id: 7\n"
    'data: {"a": "caf\u00e9 \u2028"}\n'
    "data:no space\n"
    "data:  two spaces\n"
    "\n"
    "\n"
    "data\n"
    "\n"
    "event: only an event\n"
    "\n"
    "data: [DONE]\n"
    "\n"
    "data: unterminated"
).encode()


def _events(data: bytes, cut: int) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for start in range(0, len(data), cut):
        events += decoder.feed(data[start : start + cut])
    return events + decoder.finish()


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 8, 13, 1000])
def test_lf_stream_decodes_as_its_crlf_twin(cut: int) -> None:
    general = _events(STREAM.replace(b"\n", b"\r\n"), len(STREAM) * 2)
    assert _events(STREAM, cut) == general
    assert [event.data for event in general] == [
        "first",
        '{"a": "caf\u00e9 \u2028"}\nno space\n two spaces',
        "",
        "[DONE]",
        "unterminated",
    ]
    assert general[1].event == "delta" and general[1].id == "7"
    assert general[3].event == "message"
