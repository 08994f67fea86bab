"""What a conversation's live side (``Actor``) needs from the runtime that hosts it.

``Runtime`` is the one host; the actor sees it through this protocol, so the modules
import one way only (runtime -> actor -> host -> engine, writer, timers) instead of
the actor naming the runtime that names it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any, Protocol

from fanfold.db import Step
from fanfold.providers.base import Provider, StreamProgress
from fanfold.runtime.calls import Calls, Gate
from fanfold.runtime.engine import Engine
from fanfold.runtime.placement import Placement
from fanfold.runtime.timers import Timers
from fanfold.runtime.writer import LogWriter
from fanfold.statemachine import (
    Conversation,
    Effect,
    Event,
    SpawnSubAgent,
    ToolCall,
    ToolResult,
)
from fanfold.tools.base import ToolRunner


class StepObserver(Protocol):
    """Told of every step once it is committed, in commit order (for example
    ``fanfold.otel.SpanObserver``, which makes OpenTelemetry spans of them live).

    ``at`` is the step's logged time. Called in the engine's task: it must not block
    (an exporter hands spans to its own thread)."""

    def step(
        self,
        conversation_id: str,
        event: Event,
        effects: tuple[Effect, ...],
        state: Conversation,
        at: float,
    ) -> None: ...


class Host(Protocol):
    """The runtime as its actors use it (see ``fanfold.runtime.runtime.Runtime``)."""

    provider: Provider
    tools: ToolRunner
    writer: LogWriter
    engine: Engine
    timers: Timers
    logger: Any
    logs_transitions: bool
    logs_lifecycle: bool
    on_progress: Callable[[StreamProgress], None] | None
    redact: Callable[[str], str]
    step_observers: tuple[StepObserver, ...]
    calls: Calls
    model_call_gate: Gate | None
    placement: Placement | None

    @property
    def closing(self) -> bool: ...

    def now(self) -> float: ...

    def make_step(
        self,
        state: Conversation,
        seq: int,
        event: Event,
        effects: tuple[Effect, ...],
        *,
        user_initiated: bool = False,
        snapshot: bool = False,
        at_rest: bool | None = None,
    ) -> Step: ...

    def deliver_between(self, conversation_id: str, event: Event) -> None: ...

    def spawn_child(
        self,
        effect: SpawnSubAgent,
        *,
        reissued: bool = False,
        context: contextvars.Context | None = None,
    ) -> None: ...

    def tool_cwd_problem(self, state: Conversation, cwd: str) -> str | None: ...

    def answers_in_process(self, name: str) -> bool: ...

    async def refresh_tools(self) -> None: ...

    def answer_tool(self, call: ToolCall, cwd: str, *, confined: bool) -> ToolResult: ...

    def observe(
        self, before: Conversation, after: Conversation, event: Event, effects: tuple[Effect, ...]
    ) -> None: ...

    def unloaded(self, conversation_id: str, actor: object) -> None: ...

    def request_opened(self, state: Conversation) -> None: ...
