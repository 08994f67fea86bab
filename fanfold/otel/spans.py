"""OpenTelemetry spans of a conversation tree, after the GenAI semantic conventions.

``SpanObserver.step(...)`` takes one recorded step (the event, the effects it produced,
the state after it and its time) and opens or ends spans; it is fed by a runtime as it
writes each step (live) or by ``export_tree`` from a recorded log (afterwards), so both
give the same spans:

- ``invoke_agent``: a sub-agent's life (its creation to Completed/Failed), or one turn
  of a root conversation (the user's message to the answer or the error); a sub-agent's
  span is a child of its parent's, so a tree is one trace;
- ``chat``: one model call (one attempt), child of its agent's span: provider and
  model (``gen_ai.provider.name``, ``gen_ai.request.model``, and on a reply
  ``gen_ai.response.model``, the configured model: see ``ServedBy``), tokens, stop
  reason (``gen_ai.response.finish_reasons``), ``error.type`` if it failed;
- ``execute_tool``: one tool run: tool name and call id, ``error.type`` if it failed.

Privacy by default: no prompt, message, tool argument or result text is put in a span
unless ``capture_content`` is set (then ``gen_ai.system_instructions``,
``gen_ai.input.messages`` for the task, ``gen_ai.output.messages``,
``gen_ai.tool.call.arguments`` and ``gen_ai.tool.call.result``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from fanfold.statemachine import (
    AbortCall,
    CallModel,
    Completed,
    Conversation,
    ConversationCreated,
    ConversationForked,
    Effect,
    Error,
    Event,
    Failed,
    Idle,
    ModelFailed,
    ModelReplied,
    RunTool,
    ToolFinished,
    TurnFinished,
    TurnOutcome,
    UserMessaged,
)
from fanfold.statemachine.transition import is_summary_call

if TYPE_CHECKING:
    from fanfold.providers.config import Config

SYSTEM = "fanfold"
"""``gen_ai.provider.name`` is the model provider's; fanfold's agents are named by it."""

ServedBy = Callable[[str | None, int], tuple[str | None, str | None]]
"""Who serves a conversation's model calls: given its ``model`` field (None, a profile
or a model name) and its depth, the provider's name (a profile's ``provider``:
``"openai"``, ``"anthropic"`` or ``"scripted"``; None: unknown) and the model (None:
unknown), as the router resolves them. The model is the configured one, never the name
a server puts in its replies (local servers answer with any name), so a backend prices
what the profile says it pays for."""


def config_served_by(config: Config) -> ServedBy:
    """The ``ServedBy`` of a configuration's router (``Config.resolve``)."""

    def served_by(model: str | None, depth: int) -> tuple[str | None, str | None]:
        profile, resolved = config.resolve(model, depth)
        return profile.provider, resolved

    return served_by


def _ns(at: float) -> int:
    return round(at * 1e9)


class SpanObserver:
    """Spans for the steps of conversation trees, opened and ended as steps arrive.

    ``tracer``: where spans go (``TracerProvider.get_tracer("fanfold")``).
    ``capture_content``: put prompts, messages and tool arguments and results in spans
    (off by default: they may hold anything a user or a model wrote).
    ``served_by``: the provider and model of each conversation's calls (see
    ``ServedBy``; ``config_served_by(config)`` for a configuration). Without it, spans
    name only a model the conversation itself names, and no provider.
    """

    def __init__(
        self,
        tracer: Tracer,
        *,
        capture_content: bool = False,
        served_by: ServedBy | None = None,
    ) -> None:
        self.tracer = tracer
        self.capture_content = capture_content
        self.served_by = served_by
        self._agents: dict[str, Span] = {}
        self._calls: dict[tuple[str, int], Span] = {}
        self._models: dict[tuple[str, int], str] = {}
        self._last_at = 0.0

    # ------------------------------------------------------------------ the hook

    def step(
        self,
        conversation_id: str,
        event: Event,
        effects: Iterable[Effect],
        state: Conversation,
        at: float,
    ) -> None:
        """One recorded step of ``conversation_id``: ``event`` at time ``at`` (seconds
        since the epoch, as logged), the ``effects`` it produced, the ``state`` after."""
        self._last_at = max(self._last_at, at)
        effects = tuple(effects)
        match event:
            case ConversationCreated() | ConversationForked():
                if state.is_sub_agent:
                    self._start_agent(state, at)
            case UserMessaged(text=text):
                self._start_agent(state, at, text)
            case ModelReplied(call=call, reply=reply):
                span = self._calls.pop((conversation_id, call), None)
                model = self._models.pop((conversation_id, call), None)
                if span is not None:
                    if model is not None:
                        span.set_attribute("gen_ai.response.model", model)
                    usage = reply.usage
                    span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
                    span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
                    if usage.cached_input_tokens:
                        span.set_attribute(
                            "gen_ai.usage.cache_read.input_tokens", usage.cached_input_tokens
                        )
                    span.set_attribute("gen_ai.response.finish_reasons", [reply.stop_reason])
                    if self.capture_content:
                        span.set_attribute("gen_ai.output.messages", _output(reply))
                    span.end(_ns(at))
            case ModelFailed(call=call, error=error):
                span = self._calls.pop((conversation_id, call), None)
                self._models.pop((conversation_id, call), None)
                if span is not None:
                    span.set_attribute("error.type", error.kind.value)
                    span.set_status(Status(StatusCode.ERROR, error.kind.value))
                    span.end(_ns(at))
            case ToolFinished(call=call, result=result):
                span = self._calls.pop((conversation_id, call), None)
                if span is not None:
                    if result.is_error:
                        span.set_attribute("error.type", "tool_error")
                        span.set_status(Status(StatusCode.ERROR, "tool_error"))
                    if self.capture_content:
                        span.set_attribute("gen_ai.tool.call.result", result.content)
                    span.end(_ns(at))
        for effect in effects:
            match effect:
                case CallModel(call=call, attempt=attempt):
                    self._start_call(state, call, at, attempt)
                case RunTool(call=call, tool_call=tool_call):
                    self._start_tool(state, call, at, tool_call.id, tool_call.name)
                    if self.capture_content:
                        self._calls[(conversation_id, call)].set_attribute(
                            "gen_ai.tool.call.arguments", tool_call.arguments_json
                        )
                case AbortCall(call=call):
                    span = self._calls.pop((conversation_id, call), None)
                    self._models.pop((conversation_id, call), None)
                    if span is not None:
                        span.set_attribute("error.type", "aborted")
                        span.set_status(Status(StatusCode.ERROR, "aborted"))
                        span.end(_ns(at))
        if state.at_rest:
            cancelled = any(
                isinstance(e, TurnFinished) and e.outcome is TurnOutcome.CANCELLED for e in effects
            )
            self._end_agent(state, at, cancelled=cancelled)

    def close(self, at: float | None = None) -> None:
        """End every span still open (a log that ends mid-run) at ``at`` (default: the
        last step's time), marked ``fanfold.unfinished``."""
        when = _ns(self._last_at if at is None else at)
        for span in [*self._calls.values(), *self._agents.values()]:
            span.set_attribute("fanfold.unfinished", True)
            span.end(when)
        self._calls.clear()
        self._models.clear()
        self._agents.clear()

    # ------------------------------------------------------------------ spans

    def _served(self, state: Conversation) -> tuple[str | None, str | None]:
        """The provider and model of ``state``'s calls (see ``ServedBy``)."""
        if self.served_by is None:
            return None, state.model
        try:
            provider, model = self.served_by(state.model, state.depth)
        except Exception:
            # A span loses a name rather than the runtime a step: the observer runs
            # inside the engine, after the step was committed.
            return None, state.model
        return (
            provider if isinstance(provider, str) and provider else None,
            model if isinstance(model, str) and model else None,
        )

    def _model_attributes(self, state: Conversation) -> dict[str, Any]:
        provider, model = self._served(state)
        attributes: dict[str, Any] = {}
        if provider is not None:
            attributes["gen_ai.provider.name"] = provider
        if model is not None:
            attributes["gen_ai.request.model"] = model
        return attributes

    def _start_agent(self, state: Conversation, at: float, message: str | None = None) -> None:
        parent = self._agents.get(state.parent_id) if state.parent_id is not None else None
        context = trace.set_span_in_context(parent) if parent is not None else None
        # A sub-agent spawned as a defined agent is named by its definition.
        name = state.agent or ("sub-agent" if state.is_sub_agent else "agent")
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.id": state.id,
            "gen_ai.agent.name": name,
            "gen_ai.conversation.id": state.id,
            "fanfold.root_id": state.root_id,
            "fanfold.depth": state.depth,
        }
        if state.parent_id is not None:
            attributes["fanfold.parent_id"] = state.parent_id
        attributes.update(self._model_attributes(state))
        if self.capture_content:
            attributes["gen_ai.system_instructions"] = json.dumps(
                [{"type": "text", "content": state.system_prompt}]
            )
            task = message if message is not None else state.task
            if task is not None:
                attributes["gen_ai.input.messages"] = json.dumps(
                    [{"role": "user", "parts": [{"type": "text", "content": task}]}]
                )
        old = self._agents.pop(state.id, None)
        if old is not None:  # a turn that never came to rest in the log
            old.set_attribute("fanfold.unfinished", True)
            old.end(_ns(at))
        self._agents[state.id] = self.tracer.start_span(
            f"invoke_agent {name}",
            context=context,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=_ns(at),
        )

    def _end_agent(self, state: Conversation, at: float, *, cancelled: bool = False) -> None:
        span = self._agents.pop(state.id, None)
        if span is None:
            return
        if cancelled and isinstance(state.phase, Idle):
            # A root's turn that was cancelled comes to rest in Idle, like an answer.
            span.set_attribute("error.type", "cancelled")
            span.set_status(Status(StatusCode.ERROR, "cancelled"))
        match state.phase:
            case Failed(kind=kind) | Error(kind=kind):
                span.set_attribute("error.type", kind.value)
                span.set_status(Status(StatusCode.ERROR, kind.value))
            case Completed(result=result) if self.capture_content:
                span.set_attribute("gen_ai.output.messages", _text_output(result))
            case Idle() if self.capture_content and state.history:
                last = state.history[-1]
                text = getattr(last, "text", None)
                if isinstance(text, str):
                    span.set_attribute("gen_ai.output.messages", _text_output(text))
        span.set_attribute("gen_ai.usage.input_tokens", state.usage_input)
        span.set_attribute("gen_ai.usage.output_tokens", state.usage_output)
        span.set_attribute("fanfold.tokens_spent", state.tokens_spent)
        span.end(_ns(at))

    def _child_context(self, state: Conversation) -> Any:
        parent = self._agents.get(state.id)
        return trace.set_span_in_context(parent) if parent is not None else None

    def _start_call(self, state: Conversation, call: int, at: float, attempt: int) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "fanfold.call": call,
            "fanfold.attempt": attempt,
            "gen_ai.conversation.id": state.id,
            **self._model_attributes(state),
        }
        model = attributes.get("gen_ai.request.model")
        if model is not None:
            self._models[(state.id, call)] = model
        if is_summary_call(state, call):
            # The summary its sub-agents of context mode summary start with.
            attributes["fanfold.call.purpose"] = "summary"
        self._calls[(state.id, call)] = self.tracer.start_span(
            f"chat {model}" if model else "chat",
            context=self._child_context(state),
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=_ns(at),
        )

    def _start_tool(
        self, state: Conversation, call: int, at: float, call_id: str, tool: str
    ) -> None:
        self._calls[(state.id, call)] = self.tracer.start_span(
            f"execute_tool {tool}",
            context=self._child_context(state),
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "function",
                "gen_ai.conversation.id": state.id,
                "fanfold.call": call,
            },
            start_time=_ns(at),
        )


def _text_output(text: str) -> str:
    return json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": text}]}])


def _output(reply: Any) -> str:
    parts: list[dict[str, Any]] = []
    if reply.text:
        parts.append({"type": "text", "content": reply.text})
    for call in reply.tool_calls:
        parts.append(
            {
                "type": "tool_call",
                "id": call.id,
                "name": call.name,
                "arguments": call.arguments_json,
            }
        )
    return json.dumps([{"role": "assistant", "parts": parts, "finish_reason": reply.stop_reason}])
