"""Live terminal view of a conversation tree (rich), fed by the runtime's observer."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable

import attrs
from rich.console import Console, Group, RenderableType
from rich.spinner import Spinner
from rich.text import Text
from rich.tree import Tree

from fanfold.providers.base import StreamProgress
from fanfold.replay.render import model_refusal
from fanfold.statemachine import (
    AssistantMessage,
    AwaitingRetry,
    AwaitingSubAgents,
    Children,
    Completed,
    Conversation,
    Effect,
    Error,
    Event,
    Failed,
    Idle,
    LlmRequesting,
    RunTool,
    ScheduleRetry,
    Summary,
    ToolExecuting,
)
from fanfold.statemachine.delegation import own_messages
from fanfold.tools.progress import BOARD


@attrs.define
class Row:
    """What the display knows of one conversation."""

    id: str
    parent_id: str | None
    task: str
    started: float
    state: Conversation
    ended: float | None = None
    tool_calls: int = 0
    retry_at: float | None = None  # when the awaited retry starts (the view's clock)


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


def write_text(console: Console, text: str) -> None:
    """Write ``text`` (already printable) and a newline straight to the console's file.

    rich lays a text out line by line, which costs seconds a megabyte; a long answer
    printed with ``--full`` needs none of it, and written as it is it costs what it
    holds.
    """
    file = console.file
    file.write(text + "\n")
    file.flush()


def status_of(state: Conversation) -> tuple[str, str]:
    """(symbol, style) for a conversation's phase."""
    match state.phase:
        case Completed() if not state.submitted:
            return "✓", "yellow"  # ended with plain text: it never called submit_result
        case Completed():
            return "✓", "green"
        case Failed():
            return "✗", "red"
        case Error():
            return "✗", "red"
        case Idle():
            return "●", "cyan"
    return "", "yellow"


def outcome_text(state: Conversation) -> str:
    """A sub-agent's result or error (a refusal's explanation), once it has one."""
    match state.phase:
        case Completed(result=result):
            return result
        case Failed(error=error, kind=kind):
            said = model_refusal(kind, error)
            return error if said is None else said.explanation
    return ""


# What went wrong, in words, for the kinds a model call is retried after.
_RETRIED = {
    "rate_limit": "rate limited",
    "server_error": "server error",
    "network": "network error",
    "timeout": "timed out",
    "malformed_response": "malformed response",
}


def retried(kind: str) -> str:
    """A model error kind as words (``server_error`` -> ``server error``, ``rate_limit``
    -> ``rate limited``): what a retry countdown says went wrong."""
    if kind in _RETRIED:
        return _RETRIED[kind]
    words = str(kind).replace("_", " ")
    return words if words.endswith("error") else f"{words} error"


def describe(state: Conversation, retry_in: float | None = None) -> str:
    """What a conversation is doing, in a few words. ``retry_in``: seconds until the
    awaited retry starts, when the caller knows (a countdown, so that a long
    Retry-After does not look like a hang)."""
    match state.phase:
        case AwaitingRetry(next_attempt=attempt, last_error=error):
            if retry_in is None:
                wait = "waiting to retry"
            else:
                wait = f"retrying in {math.ceil(max(0.0, retry_in))}s"
            return f"{retried(error.kind)}, {wait} (attempt {attempt})"
        case AwaitingSubAgents(children=Children(summary=Summary(call=int(), attempt=n))):
            return "summarising for sub-agents" + (f", attempt {n}" if n > 1 else "")
        case AwaitingSubAgents(
            children=Children(summary=Summary(timer=int(), attempt=n, kind=kind))
        ):
            wait = "" if retry_in is None else f" in {math.ceil(max(0.0, retry_in))}s"
            what = "failed" if kind is None else retried(kind)
            return f"summary for sub-agents: {what}, retrying{wait} (attempt {n})"
        case LlmRequesting(attempt=attempt) if attempt > 1:
            return f"model call, attempt {attempt}"
        case LlmRequesting():
            return "thinking"
        case ToolExecuting(current=current):
            return f"running {short(current.name, 40)}"
        case Completed() if not state.submitted:
            return "completed without submit_result"
        case Completed():
            return "completed"
        case Failed(kind=kind, error=error):
            said = model_refusal(kind, error)
            return f"failed: {kind if said is None else said.headline}"
        case Error(kind=kind, error=error):
            said = model_refusal(kind, error)
            return f"error: {kind if said is None else said.headline}"
    return type(state.phase).__name__


_OUTCOME_HEAD = 2000  # characters of an outcome the live tree looks at


class TreeView:
    """Collects steps through ``observe`` and renders the tree on demand."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.rows: dict[str, Row] = {}
        self.streamed: dict[str, int] = {}
        self._clock = clock

    def progress(self, progress: StreamProgress) -> None:
        """Streaming progress of a model call (characters received so far)."""
        self.streamed[progress.conversation_id] = progress.output_chars

    def observe(
        self, before: Conversation, after: Conversation, event: Event, effects: tuple[Effect, ...]
    ) -> None:
        row = self.rows.get(after.id)
        if row is None:
            row = Row(after.id, after.parent_id, after.task or "", self._clock(), after)
            self.rows[after.id] = row
        row.state = after
        for effect in effects:
            if isinstance(effect, ScheduleRetry):
                row.retry_at = self._clock() + effect.delay
        children = after.children
        summary_retry = (
            children is not None
            and children.summary is not None
            and (children.summary.timer is not None)
        )
        if not (isinstance(after.phase, AwaitingRetry) or summary_retry):
            row.retry_at = None
        if not isinstance(after.phase, LlmRequesting):
            self.streamed.pop(after.id, None)
        row.tool_calls += sum(1 for e in effects if isinstance(e, RunTool))
        if after.is_terminal and row.ended is None:
            row.ended = self._clock()

    def _label(self, row: Row) -> RenderableType:
        state = row.state
        now = self._clock()
        elapsed = (row.ended or now) - row.started
        symbol, style = status_of(state)
        kind = "Sub-agent" if state.is_sub_agent else "Agent"
        text = Text()
        text.append(f'{kind}: "{short(row.task)}" ', style="bold")
        text.append(
            f"(turn {state.rounds}/{state.limits.max_rounds}, {elapsed:.1f}s) ", style="dim"
        )
        retry_in = None if row.retry_at is None else row.retry_at - now
        text.append(describe(state, retry_in), style=style)
        if isinstance(state.phase, LlmRequesting) and self.streamed.get(state.id):
            text.append(f" ({self.streamed[state.id]} chars received)", style="dim")
        if isinstance(state.phase, ToolExecuting):
            # The tool's latest progress report (an MCP server's notifications/progress).
            reported = BOARD.get(state.id, state.phase.call)
            if reported is not None:
                text.append(f" ({short(reported.describe(), 60)})", style="dim")
        outcome = outcome_text(state)
        if outcome:
            # Redrawn several times a second: look at a bounded beginning only.
            head = outcome[:_OUTCOME_HEAD].strip()
            lines = head.splitlines()
            shown = "\n".join("  " + short(line, 100) for line in lines[:8])
            if len(lines) > 8 or len(outcome) > _OUTCOME_HEAD:
                shown += "\n  … more (see `fanfold show`)"
            text.append("\n" + shown, style="dim")
        if symbol:
            return Text.assemble((symbol + " ", style), text)
        return Group(Spinner("dots", text=text))

    def render(self) -> RenderableType:
        roots = [r for r in self.rows.values() if r.parent_id is None]
        if not roots:
            return Text("starting…", style="dim")
        trees = []
        for root in roots:
            tree = Tree(self._label(root))
            self._add_children(tree, root.id)
            trees.append(tree)
        return Group(*trees)

    def _add_children(self, tree: Tree, parent_id: str) -> None:
        for row in self.rows.values():
            if row.parent_id == parent_id:
                branch = tree.add(self._label(row))
                self._add_children(branch, row.id)


def tool_call_count(state: Conversation) -> int:
    """The tool calls ``state`` made (not those of the parent's conversation a
    sub-agent of context mode ``full`` was given)."""
    own = own_messages(state.history, state.task, state.is_sub_agent)
    return sum(len(m.tool_calls) for m in own if isinstance(m, AssistantMessage))


CUT_OFF_NOTE = (
    "cut off at the output token limit (stop reason max_tokens): raise max_tokens in "
    "the model profile for the whole text"
)
"""Shown beside an answer or result that is a reply cut off at the token limit."""
