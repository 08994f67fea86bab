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
n-th reply, where n counts the assistant messages already in the request (a sub-agent's
own, from its task on: not those of the parent's conversation ``context: full`` gives
it), so replies stay the same after a restart. A reply is (every key optional)::

    {"text": "...",
     "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}],
     "latency": 0.05,
     "fail_first": [{"kind": "rate_limit", "message": "...", "retry_after": 1.0,
                     "usage": {"input_tokens": 1200, "output_tokens": 83}}],
     "usage": {"input_tokens": 10, "output_tokens": 5},
     "stop_reason": "max_tokens", "stop_details": "..."}

``stop_reason`` plays a reply cut off at the token limit (``max_tokens``) or a refusal
(``refusal``, its explanation in ``stop_details``); by default ``tool_use`` or ``end_turn``.
``fail_first`` injects errors on attempts 1..k of that round before the reply succeeds;
``kind`` is one a provider reports (``rate_limit`` ... ``provider_failure``).
In text and string arguments, ``{{last_tool_result}}`` is replaced by the content of the
latest tool result the conversation has seen (so a scripted agent can report what its
tools really found), and ``{{task}}`` by the conversation's task.
When a conversation's replies run out it answers with text only (a sub-agent then
completes with that text).

A summary call (made when a ``spawn_agents`` task asks for ``"context": "summary"``)
is no round: it is answered by the entry's ``"summary"`` reply (a reply as above,
``fail_first`` and ``stop_reason`` included, ``{{task}}`` filled; the request writes
tool results as text, so ``{{last_tool_result}}`` is empty), or, without one, by a
made-up summary naming the conversation and its latest user message.

Every field is checked when the script loads (types, ranges, unknown keys), and a
``ScriptError`` names each place that is wrong: ``script.json: agents[0].replies[2]
.fail_first[0].retry_after: expected a number of seconds >= 0, got "soon"``. A script
that loads cannot fail when its replies are due.
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
from fanfold.providers.script_schema import Agent, Reply, Script, ScriptError, load_script
from fanfold.regular_files import read_regular
from fanfold.statemachine import (
    AssistantMessage,
    Message,
    ModelError,
    ModelReply,
    ModelRequest,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from fanfold.statemachine.delegation import SUMMARY_PROMPT, own_messages

__all__ = ["ScriptError", "ScriptedProvider"]

RESULT_CAP = 4000


@attrs.frozen
class _Entry:
    agent: Agent
    # Per reply: the ModelReply itself when it has no placeholders to fill (it is the
    # same every time, and immutable), else None.
    built: tuple[ModelReply | None, ...] = ()


class ScriptedProvider:
    """A Provider whose replies come from a script; see the module docstring."""

    def __init__(self, script: Mapping[str, Any] | Script, *, source: str = "script") -> None:
        """Check ``script`` (see the module docstring) and build the provider.

        Raises ScriptError naming ``source`` and every place in the script that is wrong.
        """
        if not isinstance(script, Script):
            script = load_script(script, source)
        self._entries = tuple(
            _Entry(agent, tuple(_prebuild(r, j) for j, r in enumerate(agent.replies)))
            for agent in script.agents
        )
        self._latency = script.latency
        self._matched: dict[tuple[str, str | None, int], _Entry | None] = {}

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedProvider:
        """Load a script file; raises ScriptError naming the file on any problem."""
        try:
            # read_regular: a FIFO given as --script is refused, never waited on.
            data = json.loads(read_regular(path).decode("utf-8"))
        except OSError as exc:
            raise ScriptError(f"cannot read script {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ScriptError(f"script {path} is not UTF-8 text") from None
        except json.JSONDecodeError as exc:
            raise ScriptError(f"script {path} is not valid JSON: {exc}") from None
        except RecursionError:
            raise ScriptError(f"script {path} is nested too deeply") from None
        return cls(data, source=f"script {path}")

    def _entry_for(self, context: CallContext) -> _Entry | None:
        key = (context.path, context.task, context.depth)
        try:
            return self._matched[key]
        except KeyError:
            pass
        found = None
        for entry in self._entries:
            m = entry.agent.match
            if m.path is not None and not fnmatch.fnmatchcase(context.path, m.path):
                continue
            if m.task is not None and not fnmatch.fnmatchcase(context.task or "", m.task):
                continue
            if m.depth is not None and m.depth != context.depth:
                continue
            found = entry
            break
        if len(self._matched) >= _MATCH_CACHE:
            self._matched.clear()
        self._matched[key] = found
        return found

    def reply_after(
        self, request: ModelRequest, context: CallContext
    ) -> tuple[float, ModelReply | ProviderError]:
        """The scripted reply to ``request`` (or the failure it scripts first) and its
        latency in seconds (``RepliesAtOnce``): the runtime waits it out on its own
        timers, with no task per call in flight. ``complete`` is this, then a sleep."""
        if is_summary_request(request):
            return self._summary_after(request, context)
        own = own_messages(request.messages, context.task, context.depth > 0)
        step = 0
        for message in own:
            if isinstance(message, AssistantMessage):
                step += 1
        entry = self._entry_for(context)
        if entry is None or step >= len(entry.agent.replies):
            return self._latency, ModelReply(
                text=f"(no scripted reply for {context.path} round {step + 1})"
            )
        reply = entry.agent.replies[step]
        latency = self._latency if reply.latency is None else reply.latency
        failure = _failure(reply, context.attempt)
        if failure is not None:
            return latency, failure
        built = entry.built[step]
        if built is not None:
            return latency, built
        values = {"last_tool_result": _last_tool_result(own), "task": context.task or ""}
        return latency, _build(reply, step, values)

    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply:
        seconds, outcome = self.reply_after(request, context)
        await _sleep(seconds)
        if isinstance(outcome, ProviderError):
            raise outcome
        return outcome

    def _summary_after(
        self, request: ModelRequest, context: CallContext
    ) -> tuple[float, ModelReply | ProviderError]:
        entry = self._entry_for(context)
        reply = None if entry is None else entry.agent.summary
        if reply is None:
            return self._latency, ModelReply(text=_made_up_summary(request.messages, context.path))
        latency = self._latency if reply.latency is None else reply.latency
        failure = _failure(reply, context.attempt)
        if failure is not None:
            return latency, failure
        # The request writes tool results as text: there is no last tool result.
        return latency, _build(reply, 0, {"last_tool_result": "", "task": context.task or ""})


def is_summary_request(request: ModelRequest) -> bool:
    """Whether ``request`` is a summary call's (context mode ``summary``)."""
    last = request.messages[-1] if request.messages else None
    return not request.tools and isinstance(last, UserMessage) and last.text == SUMMARY_PROMPT


def _made_up_summary(messages: tuple[Message, ...], path: str) -> str:
    # (A summary request writes tool results as user turns "[result of ...]".)
    asked = [
        m.text
        for m in messages[:-1]
        if isinstance(m, UserMessage) and not m.text.startswith("[result of ")
    ]
    latest = asked[-1] if asked else "(none)"
    if len(latest) > RESULT_CAP:
        latest = latest[:RESULT_CAP] + "..."
    return f"(scripted summary of {path}: {len(messages) - 1} messages; latest request: {latest})"


def _failure(reply: Reply, attempt: int) -> ProviderError | None:
    """The failure ``reply`` scripts for ``attempt``, if it scripts one."""
    failures = reply.fail_first
    if attempt <= len(failures):
        failure = failures[attempt - 1]
        usage = Usage(failure.usage.input_tokens, failure.usage.output_tokens)
        return ProviderError(ModelError(failure.kind, failure.message, failure.retry_after, usage))
    return None


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


class _Alarm:
    """One sleeping call: when it is due, its place among calls due at once, and its
    task (None once the call was cancelled: it stays in the heap until due)."""

    __slots__ = ("deadline", "order", "task")

    def __init__(self, deadline: float, order: int, task: trio.lowlevel.Task) -> None:
        self.deadline = deadline
        self.order = order
        self.task: trio.lowlevel.Task | None = task

    def __lt__(self, other: _Alarm) -> bool:
        if self.deadline != other.deadline:
            return self.deadline < other.deadline
        return self.order < other.order

    def abort(self, _: Any) -> trio.lowlevel.Abort:
        self.task = None
        return trio.lowlevel.Abort.SUCCEEDED


class _AlarmClock:
    """Wakes the simulated calls of one Trio run, all on one Trio deadline.

    ``trio.sleep`` costs a cancel scope, a deadline and a Cancelled exception per call;
    a thousand scripted sub-agents sleep three times each. Here a sleeping call parks
    in a heap, and one system task, with the earliest deadline as its own, wakes the
    calls that are due. Waking is as punctual as ``trio.sleep`` (the same deadlines,
    also under a mock clock) and a sleeping call is cancellable as usual. A sleeping
    call holds an ``_Alarm`` and Trio's wait, no coroutine frame of its own (``sleep``
    is a plain function): a thousand calls in flight hold a thousand of them.
    """

    def __init__(self) -> None:
        self._heap: list[_Alarm] = []
        self._order = itertools.count()
        self._scope: trio.CancelScope | None = None
        trio.lowlevel.spawn_system_task(self._run, name="fanfold.providers.scripted latency")

    def sleep(self, seconds: float) -> Awaitable[None]:
        """Park the calling task until ``seconds`` have passed (await the result at
        once: the alarm is set when this is called)."""
        deadline = trio.current_time() + seconds
        alarm = _Alarm(deadline, next(self._order), trio.lowlevel.current_task())
        heapq.heappush(self._heap, alarm)
        scope = self._scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline
        return trio.lowlevel.wait_task_rescheduled(alarm.abort)

    async def _run(self) -> None:
        heap = self._heap
        while True:
            now = trio.current_time()
            while heap and heap[0].deadline <= now:
                task = heapq.heappop(heap).task
                if task is not None:
                    trio.lowlevel.reschedule(task)
            with trio.CancelScope(deadline=heap[0].deadline if heap else math.inf) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None


_ALARMS: trio.lowlevel.RunVar[_AlarmClock | None] = trio.lowlevel.RunVar(
    "fanfold_scripted_alarms", default=None
)


def _build(reply: Reply, step: int, values: Mapping[str, str]) -> ModelReply:
    """The ModelReply for ``reply`` as the ``step``-th round, placeholders filled."""
    calls = tuple(
        ToolCall.of(f"call_{step}_{i}", call.name, _fill(call.arguments, values))
        for i, call in enumerate(reply.tool_calls)
    )
    return ModelReply(
        text=_fill(reply.text, values),
        tool_calls=calls,
        usage=Usage(reply.usage.input_tokens, reply.usage.output_tokens),
        stop_reason=reply.stop_reason or ("tool_use" if calls else "end_turn"),
        stop_details=reply.stop_details,
    )


def _prebuild(reply: Reply, step: int) -> ModelReply | None:
    """The reply built once, if it has no placeholders to fill."""
    if _has_placeholders(reply.text) or any(
        _has_placeholders(call.arguments) for call in reply.tool_calls
    ):
        return None
    return _build(reply, step, {})


def _has_placeholders(value: Any) -> bool:
    """Whether ``value`` holds a string with ``{{`` anywhere (a placeholder to fill)."""
    if isinstance(value, str):
        return "{{" in value
    if isinstance(value, dict):
        return any(_has_placeholders(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_placeholders(v) for v in value)
    return False


def _last_tool_result(messages: tuple[Message, ...]) -> str:
    for message in reversed(messages):
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
