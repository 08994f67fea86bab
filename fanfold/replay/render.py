"""Plain-text renderings of events, effects and states for reports and diffs.

Values are shown as the JSON the log stores them as (without the schema version
marks), so what a diff shows is exactly what differs in the log.
"""

from __future__ import annotations

import difflib
import enum
import json
from typing import Any

import attrs

from fanfold.db.codec import encode
from fanfold.db.fingerprint import differences as fingerprint_differences
from fanfold.db.fingerprint import version as fingerprint_version
from fanfold.statemachine import (
    AbortCall,
    AwaitingSubAgents,
    CallModel,
    CancellingSubAgents,
    ChildFailed,
    ChildSucceeded,
    Conversation,
    ErrorKind,
    ModelError,
    ModelReply,
    ModelRequest,
    RunTool,
    ScheduleRetry,
    StartTimer,
    TimerFired,
    ToolCall,
    ToolExecuting,
    ToolResult,
)

_FINGERPRINT_FIELDS = {
    "n": "next call number",
    "r": "model rounds",
    "h": "history length",
    "s": "children spawned",
    "p": "pending children",
    "f": "finished children",
    "w": "children written off",
    "#": "state digest (the whole state, message text included)",
    "####": "content digest (the step's event and effects)",
    "#####": "content digest (the step's event and its effects' types)",
}


@attrs.frozen
class Refusal:
    """A model's refusal, as a person reads it: its ``category`` (``cyber``...), if the
    provider gave one, and its ``explanation``."""

    category: str | None
    explanation: str

    @property
    def headline(self) -> str:
        """``refused (cyber)``, or ``refused`` without a category."""
        return f"refused ({self.category})" if self.category else "refused"

    def __str__(self) -> str:
        return f"{self.headline}: {self.explanation}"


# How the reducer words a refusal's error (transition.py, `_refusal` and the summary's
# refusal): the words, then the provider's stop_details as it recorded them.
_REFUSAL_PREFIXES = ("the model refused the request: ", "the model refused to summarise: ")
_NO_EXPLANATION = "(no explanation given)"


def model_refusal(kind: ErrorKind | str, error: str) -> Refusal | None:
    """The category and explanation of a failure of kind ``refused`` (None for any
    other kind), read from its error text.

    Anthropic's ``stop_details`` is an object (``{"category": "cyber", "explanation":
    "..."}``) that the log keeps as canonical JSON inside the error text; shown raw it
    is JSON soup. Other providers give plain words, which are the explanation. The
    error text itself is left as recorded (replay checks it byte for byte): this is a
    reading of it, for the views.
    """
    if kind != ErrorKind.REFUSED:
        return None
    rest = error
    for prefix in _REFUSAL_PREFIXES:
        if error.startswith(prefix):
            rest = error[len(prefix) :]
            break
    details = _json_object(rest)
    if details is None:
        return Refusal(None, rest.strip() or _NO_EXPLANATION)
    category = details.get("category")
    category = category.strip() or None if isinstance(category, str) else None
    explanation = details.get("explanation")
    if isinstance(explanation, str) and explanation.strip():
        return Refusal(category, explanation.strip())
    # An object with no explanation: its category alone, or (neither) the text as is.
    return Refusal(category, _NO_EXPLANATION if category else rest)


def _json_object(text: str) -> dict[str, Any] | None:
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to read
        return None
    return data if isinstance(data, dict) else None


def as_json(value: Any) -> Any:
    """``value`` (any statemachine value, or tuple of them) as plain JSON data."""
    return _strip_versions(json.loads(encode(value)))


def _strip_versions(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _strip_versions(v) for k, v in data.items() if k != "v"}
    if isinstance(data, list):
        return [_strip_versions(v) for v in data]
    return data


def pretty(value: Any, *, limit: int | None = None) -> str:
    """Indented JSON text of a statemachine value, for reading and diffing.

    With ``limit``, a string longer than that many characters is shown cut: its
    beginning and end around a note of how much was left out (the text stays JSON).
    """
    data = as_json(value)
    if limit is not None:
        data = _clipped(data, limit)
    return json.dumps(data, indent=2, ensure_ascii=False)


def _clipped(data: Any, limit: int) -> Any:
    if isinstance(data, str):
        if len(data) <= limit:
            return data
        half = limit // 2
        return f"{data[:half]} … {len(data) - 2 * half:,} more characters … {data[-half:]}"
    if isinstance(data, dict):
        return {k: _clipped(v, limit) for k, v in data.items()}
    if isinstance(data, list):
        return [_clipped(v, limit) for v in data]
    return data


def unified(recorded: str, recomputed: str, *, context: int = 3) -> str:
    """A unified diff of two texts, ``recorded`` (---) against ``recomputed`` (+++)."""
    lines = difflib.unified_diff(
        recorded.splitlines(),
        recomputed.splitlines(),
        fromfile="recorded",
        tofile="recomputed",
        n=context,
        lineterm="",
    )
    return "\n".join(lines)


def _short(text: str, width: int) -> str:
    # A bounded prefix: one line of a 20 MB text costs what the line shows.
    prefix = text[: width * 8 + 64]
    line = " ".join(prefix.split())
    if len(line) <= width and len(prefix) == len(text):
        return line
    return line[: width - 1] + "…"


def _scalar(value: Any, width: int) -> str | None:
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, str):
        return repr(_short(value, width))
    return None


def _nested(value: Any, width: int) -> str:
    """A short form of a value held by an event or effect."""
    match value:
        case ToolCall(name=name):
            return _short(name, width)
        case ToolResult(name=name, content=content, is_error=is_error):
            return f"{name}{' error' if is_error else ''}: {_short(content, width)!r}"
        case ModelReply(text=text, tool_calls=calls):
            shown = f"{_short(text, width)!r}" if text else "no text"
            return f"{shown}, {len(calls)} tool call(s)" if calls else shown
        case ModelRequest(messages=messages, tools=tools):
            return f"{len(messages)} message(s), {len(tools)} tool(s)"
        case ModelError(kind=kind, message=message):
            return f"{kind.value}: {_short(message, width)!r}"
        case ChildSucceeded(result=result, submitted=False):
            return f"succeeded without submit_result: {_short(result, width)!r}"
        case ChildSucceeded(result=result):
            return f"succeeded: {_short(result, width)!r}"
        case ChildFailed(error=error, kind=kind):
            return f"failed ({kind.value}): {_short(error, width)!r}"
        case Conversation():
            return f"Conversation({summary(value)})"
        case tuple():
            return f"{len(value)} item(s)"
    return type(value).__name__


_BRIEF = {
    "SpawnSubAgent": frozenset({"child_id", "task", "timeout", "model"}),
    "ConversationCreated": frozenset(
        {"conversation_id", "parent_id", "depth", "task", "model", "timeout"}
    ),
}
"""The fields worth a line for values that hold many."""


def describe(value: Any, *, width: int = 40) -> str:
    """One line naming an event or effect and its fields that are not at their defaults.

    ``ModelReplied(call=3, reply='Done.', 1 tool call(s))``: numbers, strings
    (shortened) and enums as they are, nested values in a short form.
    """
    if not attrs.has(type(value)):
        return _short(repr(value), width * 2)
    parts = []
    brief = _BRIEF.get(type(value).__name__)
    for field in attrs.fields(type(value)):
        if brief is not None and field.name not in brief:
            continue
        item = getattr(value, field.name)
        if field.default is not attrs.NOTHING and item == field.default:
            continue
        if brief is not None and item is None:
            continue
        shown = _scalar(item, width)
        parts.append(f"{field.name}={shown if shown is not None else _nested(item, width)}")
    return f"{type(value).__name__}({', '.join(parts)})"


class Numbers:
    """What each number a conversation issued stands for, learnt from the effects of
    its steps as they are stepped through (``replay --step``).

    The reducer numbers model calls, tool runs and timers from one counter per
    conversation, and one effect, ``AbortCall(call=N)``, stops whichever of them N is:
    most often a timer that is no longer needed (a child's deadline backstop once the
    child reported, a conversation's time limit once it ended). On its own the line
    said ``AbortCall(call=1)``, which reads like a model call being aborted; with the
    numbers known it names the timer, and ``TimerFired(timer=N)`` which timer fired.
    """

    def __init__(self) -> None:
        self._names: dict[tuple[str, int], str] = {}

    def learn(self, conversation_id: str, effects: tuple[Any, ...]) -> None:
        """Note what the numbers issued by these effects of ``conversation_id`` are."""
        for effect in effects:
            match effect:
                case CallModel(call=call):
                    self._names[conversation_id, call] = "model call"
                case RunTool(call=call, tool_call=ToolCall(name=name)):
                    self._names[conversation_id, call] = f"tool call {_short(name, 30)!r}"
                case ScheduleRetry(timer=timer, delay=delay, attempt=attempt):
                    self._names[conversation_id, timer] = (
                        f"retry back-off timer ({delay:g} s, before attempt {attempt})"
                    )
                case StartTimer(timer=timer, delay=delay, purpose=purpose):
                    self._names[conversation_id, timer] = (
                        f"timer {_short(purpose, 40)!r} ({delay:g} s)"
                    )

    def describe(self, conversation_id: str, value: Any, *, width: int = 40) -> str:
        """``describe(value)``, with what an ``AbortCall`` stops or a ``TimerFired``
        was (``AbortCall(call=1) stops timer 'deadline of r.1' (90 s)``)."""
        line = describe(value, width=width)
        match value:
            case AbortCall(call=number):
                name = self._names.get((conversation_id, number))
                return f"{line} stops {name or 'a number issued before these steps'}"
            case TimerFired(timer=number):
                name = self._names.get((conversation_id, number))
                return f"{line}: {name or 'a timer issued before these steps'} ran out"
        return line


def describe_effects(effects: tuple[Any, ...]) -> str:
    """The effects of one step on one line, or ``(none)``."""
    return "; ".join(describe(e, width=30) for e in effects) or "(none)"


def summary(state: Conversation) -> str:
    """One line with a state's phase and counters."""
    phase = state.phase
    parts = [
        type(phase).__name__,
        f"rounds {state.rounds}/{state.limits.max_rounds}",
        f"history {len(state.history)}",
        f"next call {state.next_call}",
        f"tokens {state.usage_input}+{state.usage_output}",
    ]
    match phase:
        case (
            ToolExecuting(children=c)
            | AwaitingSubAgents(children=c)
            | CancellingSubAgents(children=c)
        ):
            parts.append(f"children {len(c.pending)} pending, {len(c.finished)} finished")
    if state.spawned:
        parts.append(f"spawned {state.spawned}")
    if state.written_off:
        parts.append(f"written off {len(state.written_off)}")
    return " · ".join(parts)


def fingerprint_diff(recorded: str, recomputed: str) -> list[str]:
    """Lines naming what differs between two state fingerprints: for version 7, each
    counter, state field and effect field (``fingerprint.differences``)."""
    if fingerprint_version(recorded) == 7:
        return fingerprint_differences(recorded, recomputed) or [
            f"recorded   {recorded}",
            f"recomputed {recomputed}",
        ]
    old, new = recorded.split(), recomputed.split()
    if len(old) != len(new) or not old:
        return [f"recorded   {recorded}", f"recomputed {recomputed}"]
    lines = []
    if old[0] != new[0]:
        lines.append(f"phase: {old[0]} recorded, {new[0]} recomputed")
    for a, b in zip(_labelled(old[1:]), _labelled(new[1:]), strict=True):
        if a == b:
            continue
        if a[0] != b[0]:
            lines.append(f"{a[0]}{a[1]}/{b[0]}{b[1]}")
            continue
        label = _FINGERPRINT_FIELDS.get(a[0], a[0])
        lines.append(f"{label}: {a[1]} recorded, {b[1]} recomputed")
    return lines or [f"recorded   {recorded}", f"recomputed {recomputed}"]


def _labelled(tokens: list[str]) -> list[tuple[str, str]]:
    """A fingerprint's tokens after the phase as (key, value): a counter's letter, "#"
    for a state digest (any format; in format 5 the one after the content digest) and
    "####" for format 5's content digest, "#####" for format 6's."""
    out = []
    for token in tokens:
        if token.startswith("#####"):
            out.append(("#####", token[5:]))
        elif token.startswith("####"):
            out.append(("####", token[4:]))
        elif token.startswith("#"):
            out.append(("#", token.lstrip("#")))
        elif out and out[-1][0] in ("####", "#####"):
            out.append(("#", token))
        else:
            out.append((token[:1], token[1:]))
    return out
