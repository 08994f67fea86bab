"""The runtime's step observers: told of every committed step, in commit order, with
its logged time; OpenTelemetry spans made live from them equal the export of the log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from runtime_helpers import open_runtime
from trace_helpers import MARKS_SCRIPT

from fanfold.db import Store
from fanfold.providers.scripted import ScriptedProvider
from fanfold.statemachine import Conversation, Effect, Event, Limits

LIMITS = Limits(max_concurrent=4)


class Recorder:
    """A StepObserver that keeps what it was told."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, str, int, float]] = []

    def step(
        self,
        conversation_id: str,
        event: Event,
        effects: tuple[Effect, ...],
        state: Conversation,
        at: float,
    ) -> None:
        self.steps.append((conversation_id, type(event).__name__, len(effects), at))


async def test_every_committed_step_is_observed_once_in_order_with_its_logged_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    recorder = Recorder()
    async with open_runtime(
        tmp_path, ScriptedProvider(MARKS_SCRIPT), limits=LIMITS, step_observers=[recorder]
    ) as runtime:
        root = await runtime.start("go", cwd=tmp_path, limits=LIMITS)
        with trio.fail_after(3600):
            await runtime.wait(root)
    with Store.open(tmp_path / "log.db", read_only=True) as store:
        ids, todo = [], [root]
        while todo:  # the tree, breadth first
            cid = todo.pop(0)
            ids.append(cid)
            todo += [row.id for row in store.children(cid)]
        logged = {
            cid: [(cid, type(e.event).__name__, len(e.effects), e.at) for e in store.events(cid)]
            for cid in ids
        }
    # Every logged step, each once, with the time the log holds ...
    assert sorted(recorder.steps) == sorted(s for steps in logged.values() for s in steps)
    # ... and each conversation's in the order of its log.
    for cid, steps in logged.items():
        assert [s for s in recorder.steps if s[0] == cid] == steps
    assert len(logged) > 1


async def test_live_spans_are_the_spans_of_the_recorded_log(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="needs the otel extra: pip install '.[otel]'")
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from fanfold.otel import SpanObserver, tree_spans

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    observer = SpanObserver(provider.get_tracer("test"))
    async with open_runtime(
        tmp_path, ScriptedProvider(MARKS_SCRIPT), limits=LIMITS, step_observers=[observer]
    ) as runtime:
        root = await runtime.start("go", cwd=tmp_path, limits=LIMITS)
        with trio.fail_after(3600):
            await runtime.wait(root)
    live = memory.get_finished_spans()
    with Store.open(tmp_path / "log.db", read_only=True) as store:
        recorded = tree_spans(store, root)

    def shape(spans: tuple[ReadableSpan, ...]) -> list[tuple[Any, ...]]:
        return sorted(
            (
                s.name,
                s.start_time,
                s.end_time,
                s.status.status_code.name,
                sorted((s.attributes or {}).items()),
            )
            for s in spans
        )

    assert shape(live) == shape(recorded)
    names = {s.name.split(" ")[0] for s in live}
    assert {"invoke_agent", "chat", "execute_tool"} <= names
