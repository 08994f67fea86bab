"""Calls queued behind an HTTP provider's pool (issue 36).

- A call waiting for a connection is queued, never failed: the pool wait used to
  count against ``Timeouts.connect``, so calls queued behind a slow model failed with
  TIMEOUT.
- A runtime whose provider ``LimitsCallsAtOnce`` runs at most that many model calls
  at once; the others wait as data (no worker task each), start in the order they
  were made, and a cancel reaches them where they wait.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio
from fakeserver import FakeServer, openai_stream

from fanfold.providers.base import CallContext
from fanfold.providers.http import Timeouts
from fanfold.providers.openai import OpenAIProvider
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import Limits, ModelReply, ModelRequest, ToolCall, Usage
from fanfold.statemachine.messages import UserMessage
from fanfold.tools.registry import ToolSet


async def test_calls_waiting_for_the_pool_longer_than_the_connect_timeout_do_not_fail() -> None:
    # A client of 2 connections, 6 calls of ~0.6 s each, connect timeout 0.25 s: four
    # calls wait longer than that for a connection.
    with FakeServer() as server:
        for _ in range(6):
            slow = openai_stream(text="ok", piece=1)
            server.enqueue(type(slow)(slow.body, chunk_size=len(slow.body) // 2 + 1, delay=0.6))
        # A client made by the user, with a pool of 2.
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=2)) as client:
            provider = OpenAIProvider(
                base_url=server.url + "/v1",
                model="m",
                timeouts=Timeouts(connect=0.25, read=10.0),
                client=client,
            )
            replies: list[ModelReply] = []

            async def one(i: int) -> None:
                request = ModelRequest("", (UserMessage(f"call {i}"),), ())
                context = CallContext(f"c{i}", f"c{i}", "root", 0, None, 1)
                replies.append(await provider.complete(request, context))

            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(one, i)
    assert [reply.text for reply in replies] == ["ok"] * 6


class Held:
    """A provider that can make 3 calls at once; each waits until released."""

    calls_at_once = 3

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.started: list[str] = []
        self.release = trio.Event()

    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply:
        self.running += 1
        self.most = max(self.most, self.running)
        self.started.append(context.path)
        try:
            if context.depth == 0:
                if any(getattr(m, "result", None) for m in request.messages):
                    return ModelReply(text="all done", usage=Usage(1, 1))
                tasks = [{"task": f"task {i}"} for i in range(10)]
                return ModelReply(
                    tool_calls=(ToolCall("s", "spawn_agents", _json({"tasks": tasks})),),
                    usage=Usage(1, 1),
                    stop_reason="tool_use",
                )
            await self.release.wait()
            call = ToolCall("r", "submit_result", _json({"result": context.path}))
            return ModelReply(tool_calls=(call,), usage=Usage(1, 1), stop_reason="tool_use")
        finally:
            self.running -= 1


def _json(value: Any) -> str:
    return json.dumps(value)


def _limits() -> Limits:
    return Limits(max_tasks_per_call=10, max_concurrent=10)


async def test_a_runtime_runs_at_most_calls_at_once_and_queues_the_rest_as_data(
    tmp_path: Any,
) -> None:
    provider = Held()
    async with Runtime.open(
        tmp_path / "t.db", provider, ToolSet.default(), limits=_limits(), logger=quiet_logger()
    ) as runtime:
        root = await runtime.start("fan out", limits=_limits())
        with trio.fail_after(30):
            while provider.running < 3:
                await trio.sleep(0.01)
            await trio.sleep(0.2)  # the other children's calls are made by now
        assert provider.running == 3
        # The seven others wait in the gate's queue, with no worker task.
        gate = runtime.model_call_gate
        assert gate is not None
        assert gate.running == 3 and len(gate.queue) == 7
        assert runtime.calls.workers <= 4
        provider.release.set()
        with trio.fail_after(30):
            await runtime.wait(root)
    assert provider.most == 3
    children = [path for path in provider.started if path != "root"]
    # The first calls made took the slots (Trio may start a batch of tasks in either
    # order); every child's call ran once.
    assert set(children[:3]) == {"root/1", "root/2", "root/3"}
    assert sorted(children) == sorted(f"root/{i}" for i in range(1, 11))


async def test_a_cancel_reaches_calls_waiting_in_the_queue(tmp_path: Any) -> None:
    provider = Held()
    async with Runtime.open(
        tmp_path / "t.db", provider, ToolSet.default(), limits=_limits(), logger=quiet_logger()
    ) as runtime:
        root = await runtime.start("fan out", limits=_limits())
        with trio.fail_after(30):
            while provider.running < 3:
                await trio.sleep(0.01)
            await trio.sleep(0.2)
        await runtime.cancel(root)
        with trio.fail_after(30):
            await runtime.wait(root)
        gate = runtime.model_call_gate
        assert gate is not None
        assert gate.running == 0
        # Every queued call was cancelled where it waited: none of them ever ran.
        assert len(provider.started) == 4  # the root's call and three children's


async def test_streamed_calls_one_after_another_reuse_one_connection() -> None:
    # A stream closed before its end closed its connection: every streamed call
    # opened a new one (a TLS handshake each on https).
    with FakeServer() as server:
        server.enqueue(*(openai_stream(text=f"reply {i}") for i in range(4)))
        async with httpx.AsyncClient() as client:
            provider = OpenAIProvider(base_url=server.url + "/v1", model="m", client=client)
            for i in range(4):
                request = ModelRequest("", (UserMessage(f"call {i}"),), ())
                context = CallContext("c", "c", "root", 0, None, i + 1)
                reply = await provider.complete(request, context)
                assert reply.text == f"reply {i}"
    assert len({request.peer for request in server.requests}) == 1
