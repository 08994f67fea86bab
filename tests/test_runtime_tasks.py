"""The runtime's tasks: one engine, one timer task, and the call workers' pool.

A conversation has no task of its own: not to fold (the engine does) and not to wait
for its next call (no worker of its own parked between calls: idle workers serve any
conversation's next call). And the runtime's modules
import one way only: the actor sees the runtime through a protocol (``host.py``)."""

from __future__ import annotations

import ast
import contextvars
from pathlib import Path

import trio
from runtime_helpers import open_runtime, reply, script, spawn, submit

import fanfold.runtime
from fanfold.providers.base import CallContext
from fanfold.providers.scripted import ScriptedProvider
from fanfold.statemachine import (
    AwaitingSubAgents,
    Limits,
    ModelReply,
    ModelRequest,
    ToolCall,
)

RUNTIME = Path(fanfold.runtime.__file__).parent


async def _wait_until(predicate: object) -> None:
    with trio.fail_after(60):
        while not predicate():  # type: ignore[operator]
            await trio.sleep(0.01)


class _Awaited:
    """The scripted provider with its ``complete`` only: calls that must be awaited."""

    def __init__(self, scripted: ScriptedProvider) -> None:
        self._scripted = scripted

    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply:
        return await self._scripted.complete(request, context)


def _three_children() -> ScriptedProvider:
    return script(
        0.0,
        root=[reply("", spawn("a", "b", "c")), reply("done")],
        c1=[reply("", submit("A"), latency=100)],
        c2=[reply("", submit("B"), latency=100)],
        c3=[reply("", submit("C"), latency=100)],
    )


async def test_only_calls_in_flight_hold_a_task(tmp_path: Path, autojump_clock: object) -> None:
    # The root spawns three children and then waits on them: it has no call in
    # flight, so no task of its own; each child waits on its model call, one task each.
    provider = _Awaited(_three_children())
    async with open_runtime(tmp_path, provider, limits=Limits()) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await _wait_until(
            lambda: (
                isinstance(runtime.state(root).phase, AwaitingSubAgents)
                and len(runtime.running()) == 4
            )
        )
        await trio.sleep(1)  # every child's call has started by now (100 s each)
        names = sorted(task.name for task in runtime._nursery.child_tasks)
        # The root's call ended before its children's started: its worker, back in
        # the pool, runs one of theirs.
        assert names == [
            "fanfold call",
            "fanfold call",
            "fanfold call",
            "fanfold.runtime.engine.Engine.run",
            "fanfold.runtime.timers.Timers.run",
        ]
        result = await runtime.wait(root)
        assert result.text == "done"
        # At rest: the runtime's own two tasks, nothing of any conversation.
        await trio.sleep(1)
        assert len(runtime._nursery.child_tasks) == 2


async def test_calls_of_a_provider_that_replies_at_once_hold_no_task(
    tmp_path: Path, autojump_clock: object
) -> None:
    # The scripted provider knows each reply when the call starts (``reply_after``):
    # its calls wait on the runtime's timers, not on a task each.
    async with open_runtime(tmp_path, _three_children(), limits=Limits()) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        await _wait_until(
            lambda: (
                isinstance(runtime.state(root).phase, AwaitingSubAgents)
                and len(runtime.running()) == 4
            )
        )
        await trio.sleep(1)  # every child's call has started by now (100 s each)
        names = sorted(task.name for task in runtime._nursery.child_tasks)
        assert names == ["fanfold.runtime.engine.Engine.run", "fanfold.runtime.timers.Timers.run"]
        assert runtime.calls.workers == 0
        result = await runtime.wait(root)
        assert result.text == "done"
        assert trio.current_time() >= 100  # the children's latency was waited out


def _runtime_imports(path: Path) -> set[str]:
    """The ``fanfold.runtime`` modules that ``path`` imports, anywhere in it (under
    ``if TYPE_CHECKING:`` too: a cycle of names is a cycle of design)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = node.module
        elif isinstance(node, ast.Import):
            module = node.names[0].name
        else:
            continue
        if module.startswith("fanfold.runtime."):
            names.add(module.removeprefix("fanfold.runtime."))
    return names


def test_the_runtime_modules_import_each_other_one_way_only() -> None:
    graph = {p.stem: _runtime_imports(p) for p in RUNTIME.glob("*.py") if p.stem != "__init__"}
    assert {"actor", "engine", "runtime", "host"} <= set(graph)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for name in graph.get(start, ()):
            if name == goal or (name not in seen and reaches(name, goal, seen | {name})):
                return True
        return False

    circles = sorted(name for name in graph if reaches(name, name, {name}))
    assert circles == []


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


class ContextReporting:
    """A provider that answers each call with the request id its context holds."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply:
        await trio.sleep(1)
        self.seen.append((context.path, REQUEST_ID.get()))
        if context.depth == 0 and len(request.messages) <= 2:
            return ModelReply(
                text="",
                tool_calls=(ToolCall("s", "spawn_agents", '{"tasks": [{"task": "x"}]}'),),
            )
        if context.depth > 0:
            return ModelReply(
                text="", tool_calls=(ToolCall("r", "submit_result", '{"result": "x"}'),)
            )
        return ModelReply(text="done")


async def test_calls_run_in_the_context_of_their_tree(
    tmp_path: Path, autojump_clock: object
) -> None:
    # Two trees started from two API callers' contexts: every call, the children's
    # too, sees its own tree's value, though call workers are pooled.
    provider = ContextReporting()
    async with open_runtime(tmp_path, provider, limits=Limits()) as runtime:

        async def start(request_id: str) -> str:
            REQUEST_ID.set(request_id)
            return await runtime.start(request_id, cwd=tmp_path)

        roots = {}
        async with trio.open_nursery() as nursery:

            async def one(request_id: str) -> None:
                roots[request_id] = await start(request_id)
                await runtime.wait(roots[request_id])

            nursery.start_soon(one, "first")
            nursery.start_soon(one, "second")
    by_tree: dict[str, set[str]] = {}
    for path, seen in provider.seen:
        by_tree.setdefault(seen, set()).add(path)
    assert set(by_tree) == {"first", "second"}
    assert all(paths == {"root", "root/1"} for paths in by_tree.values())
    assert len(provider.seen) == 6  # root, child, root again: per tree


def test_the_actor_executes_every_effect_of_the_reducer() -> None:
    # Effects are dispatched by their class (one lookup per effect, not a chain of
    # patterns): a new Effect without an executor would fail its step loudly.
    from typing import get_args

    from fanfold.runtime.actor import _EXECUTORS
    from fanfold.statemachine import Effect

    assert set(get_args(Effect)) == set(_EXECUTORS)
