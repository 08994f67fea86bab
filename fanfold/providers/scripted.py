"""The offline scripted provider: deterministic replies from a script, no network.

A script is JSON (a file or a dict)::

    {
      "latency": 0.05,                      # default seconds per reply (optional)
      "agents": [
        {"match": {"path": "root"}, "replies": [...]},
        {"match": {"task": "*security*"}, "replies": [...]},
        {"match": {"depth": 1}, "replies": [...]}
      ]
    }

A conversation uses the first entry whose ``match`` fits all given keys: ``path`` (its
place in the tree: "root", "root/1", "root/1/2"; shell-style wildcards allowed),
``task`` (a wildcard over its task text) and ``depth``. Its n-th model round gets the
n-th reply, where n counts the assistant messages already in the request, so replies
stay the same after a restart. A reply is::

    {"text": "...",
     "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}],
     "latency": 0.05,
     "fail_first": [{"kind": "rate_limit", "message": "...", "retry_after": 1.0}],
     "usage": {"input_tokens": 10, "output_tokens": 5}}

``fail_first`` injects errors on attempts 1..k of that round before the reply succeeds.
In text and string arguments, ``{{last_tool_result}}`` is replaced by the content of the
latest tool result the conversation has seen (so a scripted agent can report what its
tools really found), and ``{{task}}`` by the conversation's task.
When a conversation's replies run out it answers with text only (a sub-agent then
completes with that text).
"""

from __future__ import annotations

import fnmatch
import heapq
import itertools
import json
import math
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from fanfold.providers.base import CallContext, ProviderError
from fanfold.statemachine import (
    AssistantMessage,
    ErrorKind,
    ModelError,
    ModelReply,
    ModelRequest,
    ToolCall,
    ToolResultMessage,
    Usage,
    canonical_json,
)

RESULT_CAP = 4000


class ScriptError(ValueError):
    """The script is not valid; the message says where."""


@attrs.frozen
class _Entry:
    match: Mapping[str, Any]
    replies: tuple[Mapping[str, Any], ...]
    # Per reply: the ModelReply itself when it has no placeholders to fill (it is the
    # same every time, and immutable), else None.
    built: tuple[ModelReply | None, ...] = ()


def _check_reply(where: str, reply: object) -> Mapping[str, Any]:
    if not isinstance(reply, dict):
        raise ScriptError(f"{where}: a reply must be an object")
    unknown = set(reply) - {"text", "tool_calls", "latency", "fail_first", "usage"}
    if unknown:
        raise ScriptError(f"{where}: unknown key(s) {sorted(unknown)}")
    for i, call in enumerate(reply.get("tool_calls", [])):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ScriptError(f"{where}.tool_calls[{i}]: needs a 'name'")
        if not isinstance(call.get("arguments", {}), dict):
            raise ScriptError(f"{where}.tool_calls[{i}]: 'arguments' must be an object")
    if "latency" in reply:
        _check_latency(f"{where}.latency", reply["latency"])
    for i, failure in enumerate(reply.get("fail_first", [])):
        kind = failure.get("kind") if isinstance(failure, dict) else None
        if kind not in {k.value for k in ErrorKind}:
            raise ScriptError(f"{where}.fail_first[{i}]: unknown error kind {kind!r}")
    return reply


def _check_latency(where: str, value: object) -> float:
    """A latency in seconds: a finite number >= 0 (a bool is not a number here).

    Checked when the script loads: a bad one would otherwise surface only when its reply
    is due, as a crash of the run (NaN, a string) or a reply that never comes.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScriptError(f"{where}: must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ScriptError(f"{where}: must be a finite number of seconds >= 0, not {value!r}")
    return float(value)


class ScriptedProvider:
    """A Provider whose replies come from a script; see the module docstring."""

    def __init__(self, script: Mapping[str, Any]) -> None:
        agents = script.get("agents")
        if not isinstance(agents, list):
            raise ScriptError("script needs an 'agents' list")
        entries = []
        for i, agent in enumerate(agents):
            if not isinstance(agent, dict) or not isinstance(agent.get("replies"), list):
                raise ScriptError(f"agents[{i}]: needs 'match' and a 'replies' list")
            match = agent.get("match", {})
            if not isinstance(match, dict) or set(match) - {"path", "task", "depth"}:
                raise ScriptError(f"agents[{i}].match: keys are path, task, depth")
            replies = tuple(
                _check_reply(f"agents[{i}].replies[{j}]", r) for j, r in enumerate(agent["replies"])
            )
            built = tuple(_prebuild(r, j) for j, r in enumerate(replies))
            entries.append(_Entry(match, replies, built))
        self._entries = tuple(entries)
        self._latency = _check_latency("latency", script.get("latency", 0.0))
        self._matched: dict[tuple[str, str | None, int], _Entry | None] = {}

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedProvider:
        """Load a script file; raises ScriptError with the path on any problem."""
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise ScriptError(f"cannot read script {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise ScriptError(f"script {path} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ScriptError(f"script {path} must be a JSON object")
        try:
            return cls(data)
        except ScriptError as exc:
            raise ScriptError(f"script {path}: {exc}") from None

    def _entry_for(self, context: CallContext) -> _Entry | None:
        key = (context.path, context.task, context.depth)
        try:
            return self._matched[key]
        except KeyError:
            pass
        found = None
        for entry in self._entries:
            m = entry.match
            if "path" in m and not fnmatch.fnmatchcase(context.path, str(m["path"])):
                continue
            if "task" in m and not fnmatch.fnmatchcase(context.task or "", str(m["task"])):
                continue
            if "depth" in m and m["depth"] != context.depth:
                continue
            found = entry
            break
        if len(self._matched) >= _MATCH_CACHE:
            self._matched.clear()
        self._matched[key] = found
        return found

    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply:
        step = 0
        for message in request.messages:
            if isinstance(message, AssistantMessage):
                step += 1
        entry = self._entry_for(context)
        if entry is None or step >= len(entry.replies):
            await _sleep(self._latency)
            return ModelReply(text=f"(no scripted reply for {context.path} round {step + 1})")
        reply = entry.replies[step]
        await _sleep(float(reply.get("latency", self._latency)))
        failures = reply.get("fail_first", ())
        if context.attempt <= len(failures):
            failure = failures[context.attempt - 1]
            raise ProviderError(
                ModelError(
                    ErrorKind(failure["kind"]),
                    str(failure.get("message", "scripted failure")),
                    failure.get("retry_after"),
                )
            )
        built = entry.built[step]
        if built is not None:
            return built
        values = {"last_tool_result": _last_tool_result(request), "task": context.task or ""}
        return _build(reply, step, values)


_MATCH_CACHE = 10_000  # conversations whose script entry is remembered


def _sleep(seconds: float) -> Awaitable[None]:
    """``trio.sleep(seconds)``: the simulated latency of a reply."""
    if seconds > 0 and seconds != math.inf:
        clock = _ALARMS.get()
        if clock is None:
            clock = _AlarmClock()
            _ALARMS.set(clock)
        return clock.sleep(seconds)
    return trio.sleep(seconds)  # 0 (a checkpoint), inf, and the errors


class _AlarmClock:
    """Wakes the simulated calls of one Trio run, all on one Trio deadline.

    ``trio.sleep`` costs a cancel scope, a deadline and a Cancelled exception per call;
    a thousand scripted sub-agents sleep three times each. Here a sleeping call parks
    in a heap, and one system task, with the earliest deadline as its own, wakes the
    calls that are due. Waking is as punctual as ``trio.sleep`` (the same deadlines,
    also under a mock clock) and a sleeping call is cancellable as usual.
    """

    def __init__(self) -> None:
        self._heap: list[list[Any]] = []  # [deadline, order, task or None if cancelled]
        self._order = itertools.count()
        self._scope: trio.CancelScope | None = None
        trio.lowlevel.spawn_system_task(self._run, name="fanfold.providers.scripted latency")

    async def sleep(self, seconds: float) -> None:
        deadline = trio.current_time() + seconds
        entry: list[Any] = [deadline, next(self._order), trio.lowlevel.current_task()]
        heapq.heappush(self._heap, entry)
        scope = self._scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline

        def abort(_: Any) -> trio.lowlevel.Abort:
            entry[2] = None  # cancelled: left in the heap until its deadline
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    async def _run(self) -> None:
        heap = self._heap
        while True:
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                task = heapq.heappop(heap)[2]
                if task is not None:
                    trio.lowlevel.reschedule(task)
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None


_ALARMS: trio.lowlevel.RunVar[_AlarmClock | None] = trio.lowlevel.RunVar(
    "fanfold_scripted_alarms", default=None
)


def _build(reply: Mapping[str, Any], step: int, values: Mapping[str, str]) -> ModelReply:
    """The ModelReply for ``reply`` as the ``step``-th round, placeholders filled."""
    calls = tuple(
        ToolCall(
            id=f"call_{step}_{i}",
            name=call["name"],
            arguments_json=canonical_json(_fill(call.get("arguments", {}), values)),
        )
        for i, call in enumerate(reply.get("tool_calls", []))
    )
    usage = reply.get("usage", {})
    return ModelReply(
        text=_fill(reply.get("text", ""), values),
        tool_calls=calls,
        usage=Usage(int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))),
        stop_reason="tool_use" if calls else "end_turn",
    )


def _prebuild(reply: Mapping[str, Any], step: int) -> ModelReply | None:
    """The reply built once, if it has no placeholders and builds (a reply that cannot
    be built fails when it is called for, as any reply does)."""
    if _has_placeholders(reply):
        return None
    try:
        return _build(reply, step, {})
    except Exception:
        return None


def _has_placeholders(value: Any) -> bool:
    """Whether ``value`` holds a string with ``{{`` anywhere (a placeholder to fill)."""
    if isinstance(value, str):
        return "{{" in value
    if isinstance(value, dict):
        return any(_has_placeholders(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_placeholders(v) for v in value)
    return False


def _last_tool_result(request: ModelRequest) -> str:
    for message in reversed(request.messages):
        if isinstance(message, ToolResultMessage):
            return message.result.content[:RESULT_CAP]
    return ""


def _fill(value: Any, values: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        for key, text in values.items():
            value = value.replace("{{" + key + "}}", text)
        return value
    if isinstance(value, dict):
        return {k: _fill(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, values) for v in value]
    return value
