"""A profile's ``max_concurrent_calls`` (issue 25: a provider's rate limit is shared).

The slots are held by the provider router around each call attempt; the reducer's
decisions (how many children run, which call, when a retry) are untouched. Counted
with a provider that records how many of its calls are in flight, under Trio's
virtual clock, through the router alone and through a real fan-out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from runtime_helpers import open_runtime, reply, script, spawn, submit

from fanfold.providers.base import CallContext
from fanfold.providers.config import (
    Config,
    ConfigError,
    Profile,
    ProviderRouter,
    parse_config,
)
from fanfold.providers.slots import LocalSlots
from fanfold.statemachine import Limits, ModelReply, ModelRequest, UserMessage


class Counting:
    """Wraps a provider, counting its calls in flight (the most seen at once)."""

    def __init__(self, inner: Any = None, latency: float = 1.0) -> None:
        self.inner, self.latency = inner, latency
        self.now = self.most = self.calls = 0

    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply:
        self.now += 1
        self.calls += 1
        self.most = max(self.most, self.now)
        try:
            if self.inner is not None:
                return await self.inner.complete(request, context)  # type: ignore[no-any-return]
            await trio.sleep(self.latency)
            return ModelReply(text="ok")
        finally:
            self.now -= 1


def _config(cap: int | None) -> Config:
    return Config((Profile("offline", "scripted", max_concurrent_calls=cap),), default="offline")


def _ctx(n: int) -> CallContext:
    return CallContext(f"c{n}", "r", "root", 0, None, n)


def test_the_key_is_read_and_checked() -> None:
    base = {"default": "p", "profiles": {"p": {"provider": "scripted"}}}
    capped = parse_config(
        {**base, "profiles": {"p": {"provider": "scripted", "max_concurrent_calls": 3}}}
    )
    assert capped.profile("p").max_concurrent_calls == 3
    assert parse_config(base).profile("p").max_concurrent_calls is None
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(ConfigError, match="max_concurrent_calls"):
            parse_config(
                {**base, "profiles": {"p": {"provider": "scripted", "max_concurrent_calls": bad}}}
            )


@pytest.mark.parametrize(("cap", "most"), [(2, 2), (None, 6)])
async def test_the_router_holds_a_profile_to_its_slots(
    cap: int | None, most: int, autojump_clock: trio.testing.MockClock
) -> None:
    counting = Counting()
    router = ProviderRouter(_config(cap), scripted=counting)
    request = ModelRequest("", (UserMessage("hi"),), ())
    replies: list[str] = []

    async def one(n: int) -> None:
        replies.append((await router.complete(request, _ctx(n))).text)

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        for n in range(6):
            nursery.start_soon(one, n)
    assert replies == ["ok"] * 6
    assert counting.most == most
    # Six one-second calls two at a time take three seconds; at once, one.
    assert trio.current_time() - started == pytest.approx(6 / most)
    await router.aclose()


async def test_a_cancelled_call_gives_its_slot_back(autojump_clock: trio.testing.MockClock) -> None:
    slots = LocalSlots()
    counting = Counting(latency=100.0)
    router = ProviderRouter(_config(1), scripted=counting, slots=slots)
    request = ModelRequest("", (UserMessage("hi"),), ())
    with trio.move_on_after(1.0):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(router.complete, request, _ctx(1))
            nursery.start_soon(router.complete, request, _ctx(2))  # waits for the slot
            await trio.sleep(0.5)
            assert slots.in_use("offline") == 1 and counting.now == 1
    assert slots.in_use("offline") == 0
    # The slot is free for the next call.
    counting.latency = 1.0
    assert (await router.complete(request, _ctx(3))).text == "ok"
    await router.aclose()


async def test_a_fan_out_runs_no_more_calls_at_once_than_the_profile_allows(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    tasks = [f"part {n}" for n in range(6)]
    inner = script(
        1.0,
        root=[reply("", spawn(*tasks)), reply("all done")],
        **{f"c{n + 1}": [reply("", submit(f"result {n}"))] for n in range(6)},
    )
    counting = Counting(inner)
    router = ProviderRouter(_config(2), scripted=counting)
    async with open_runtime(tmp_path, router, limits=Limits(max_concurrent=6)) as runtime:
        root = await runtime.start("review", cwd=tmp_path)
        result = await runtime.wait(root)
    await router.aclose()
    assert result.text == "all done"
    assert counting.calls == 8 and counting.most == 2
