"""Text made safe and short for a terminal: what every view and error line uses.

Its own module, importing nothing but the standard library, so that an error line or a
command's ``--help`` does not import the views (rich, the reducer's types) to escape a
string. ``fanfold.cli.display`` re-exports these names.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL and the C1 controls: ESC starts the escape
# sequences that clear the screen, move the cursor or retitle the window, and C1's CSI
# (0x9b) and OSC (0x9d) do the same on some terminals.
# Also the bidirectional-text controls (U+061C, U+200E/F, U+202A-E, U+2066-9), which
# make a terminal show text in another order than it is written, and the line and
# paragraph separators (U+2028/9, Unicode's only Zl and Zp characters; NEL, U+0085,
# is a C1 control): some terminals and most editors break the line there, so a model
# could make one line of a view look like two, or a field look like the next.
# And lone surrogates (half of a UTF-16 pair, e.g. "\ud83d" in a model's JSON): a str
# can hold them, but no output encoding can write them (writing one raises).
_CONTROLS = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
    "\u2066-\u2069\ud800-\udfff]"
)


SHOWN_CHARS = 4000
"""How much of a long text (an answer, a result, a string in a state) a view shows
unless asked for ``--full``: the first and last halves of this many characters."""


def printable(text: str) -> str:
    """``text`` safe to show on a terminal: control characters as visible ``\\xNN``
    (bidirectional controls and lone surrogates as ``\\uNNNN``).

    Model and tool output is untrusted: written raw, an escape sequence in it would act
    on the user's terminal instead of being shown. Newlines and tabs are kept (a CRLF
    becomes a newline); a lone carriage return, which would let text overwrite the
    line before it, is escaped like the rest. rich's Text does not do this by itself.
    """
    text = text.replace("\r\n", "\n")
    return _CONTROLS.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def json_printable(text: str) -> str:
    """JSON ``text`` (as ``json.dumps(..., ensure_ascii=False)`` writes it) with what
    ``printable`` escapes written as JSON escapes (``\\u009b``): still valid JSON,
    safe to show, and non-ASCII letters stay readable."""
    return _CONTROLS.sub(_json_escape, text)


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def short(text: str, width: int = 60) -> str:
    """One printable line of at most ``width`` characters.

    Only a bounded prefix of ``text`` is looked at: a line of a 20 MB answer costs
    what the line shows, not what the answer holds.
    """
    prefix = text[: width * 8 + 64]
    line = printable(" ".join(prefix.split()))
    if len(line) <= width and len(prefix) == len(text):
        return line
    return line[: width - 1] + "…"


FULL_HINT = "--full shows all of it"


def clip(text: str, *, full: bool = False, limit: int = SHOWN_CHARS, hint: str = FULL_HINT) -> str:
    """Printable ``text``, or for one longer than ``limit`` characters (unless ``full``)
    its beginning and end around a line saying how much was left out and how to see it.

    The cut comes before escaping: the cost is in what is shown, not in the text.
    """
    if full or len(text) <= limit:
        return printable(text)
    half = limit // 2
    left_out = len(text) - 2 * half
    return (
        printable(text[:half])
        + f"\n… {left_out:,} more characters ({len(text):,} in all); {hint} …\n"
        + printable(text[-half:])
    )
