"""The one-method seam between the runtime and the tools a model may call."""

from __future__ import annotations

from typing import Protocol

from fanfold.statemachine import ToolCall, ToolResult, ToolSpec


class ToolRunner(Protocol):
    """Runs ordinary tools (the reducer handles spawn_agents/submit_* itself).

    ``specs()`` lists the tools offered to conversations. ``run`` must return a
    ToolResult for every call, bad input included (``is_error=True``); it may raise only
    trio.Cancelled (when aborted). Anything else escaping is a bug in the tool.
    """

    def specs(self) -> tuple[ToolSpec, ...]: ...

    async def run(self, call: ToolCall, cwd: str, *, confined: bool = False) -> ToolResult:
        """Run ``call`` in ``cwd``. ``confined``: the calling agent runs bash only
        through allow patterns (the runtime passes it only when True, so a runner
        without the keyword still serves every other agent, and fails a confined
        agent's call rather than run it unguarded)."""
        ...


class AnswersInProcess(Protocol):
    """A runner that can answer some calls in-process (optional: ``ToolSet`` can).

    ``in_process(name)`` says whether a call to ``name`` needs no I/O and no waiting
    (its tool is ``fanfold.tools.tool.InProcess``, or no tool has that name);
    ``answer`` then returns its result at once, as ``run`` would. The runtime answers
    such calls in the engine's round, without a task (DESIGN.md, "The runtime").
    """

    def in_process(self, name: str) -> bool: ...

    def answer(self, call: ToolCall, cwd: str, *, confined: bool = False) -> ToolResult: ...
