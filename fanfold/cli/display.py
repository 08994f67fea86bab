"""Live terminal view of a conversation tree (rich), fed by the runtime's observer."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
from rich.console import Console, Group, RenderableType
from rich.spinner import Spinner
from rich.text import Text
from rich.tree import Tree

# Re-exported: the views' names (defined in fanfold.cli.text).
from fanfold.cli.text import FULL_HINT as FULL_HINT
from fanfold.cli.text import SHOWN_CHARS as SHOWN_CHARS
from fanfold.cli.text import clip as clip
from fanfold.cli.text import json_printable as json_printable
from fanfold.cli.text import printable as printable
from fanfold.cli.text import short as short
from fanfold.statemachine import (
    Asking,
    AssistantMessage,
    AwaitingRetry,
    AwaitingSubAgents,
    Children,
    Completed,
    Conversation,
    Effect,
    Error,
    ErrorKind,
    Event,
    Failed,
    Idle,
    LlmRequesting,
    RunTool,
    ScheduleRetry,
    Summary,
    ToolExecuting,
    UserMessage,
)
from fanfold.statemachine.delegation import own_messages

if TYPE_CHECKING:
    from fanfold.providers.base import StreamProgress
    from fanfold.replay.render import Refusal


def model_refusal(kind: ErrorKind | str, error: str) -> Refusal | None:
    """``fanfold.replay.render.model_refusal``: None for any kind but ``refused``.

    ``fanfold.replay`` is imported only for a refusal: its package imports every replay
    module, which neither ``run`` nor ``show`` needs otherwise (issue 36)."""
    if kind != ErrorKind.REFUSED:
        return None
    from fanfold.replay.render import model_refusal as read

    return read(kind, error)


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
        case ToolExecuting(current=current, asking=Asking(question=True)):
            return "asks you a question (fanfold pending)"
        case ToolExecuting(current=current, asking=Asking()):
            return f"waits for your decision on {short(current.name, 40)} (fanfold pending)"
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
            # The tool's latest progress report (an MCP server's notifications/progress);
            # imported here: `show` and `ls` import no tools (tests/test_cli_startup.py).
            from fanfold.tools.progress import BOARD

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


def last_answer(state: Conversation) -> str:
    """The answer of the latest turn: its final text reply, if the turn ended with one
    ("" if it was cancelled or failed: an earlier turn's answer is not this one's)."""
    for message in reversed(state.history):
        if isinstance(message, UserMessage):
            return ""  # the latest turn has no text reply after its user message
        if isinstance(message, AssistantMessage):
            return "" if message.tool_calls else message.text
    return ""
