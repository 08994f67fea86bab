"""One real request to a live OpenAI-compatible server, when one is named.

Skipped unless ``FANFOLD_LIVE_OPENAI_BASE_URL`` is set, e.g.::

    FANFOLD_LIVE_OPENAI_BASE_URL=http://127.0.0.1:8080/v1 \\
    FANFOLD_LIVE_OPENAI_MODEL=qwen2.5-7b-instruct \\
    .venv/bin/pytest tests/test_providers_live.py

``FANFOLD_LIVE_OPENAI_MODEL`` defaults to ``gpt-4o-mini``; ``FANFOLD_LIVE_OPENAI_API_KEY``
is sent as the key if set (local servers need none). The second test runs a whole
delegation tree (a root that spawns two sub-agents) and asserts on its structure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio
from runtime_helpers import open_runtime

from fanfold import replay
from fanfold.providers.base import CallContext, StreamProgress
from fanfold.providers.http import Timeouts
from fanfold.providers.openai import OpenAIProvider
from fanfold.statemachine import Limits, ModelRequest, ToolResultMessage, UserMessage

BASE_URL = os.environ.get("FANFOLD_LIVE_OPENAI_BASE_URL")


@pytest.mark.skipif(not BASE_URL, reason="set FANFOLD_LIVE_OPENAI_BASE_URL to run")
async def test_one_live_streaming_request() -> None:
    assert BASE_URL
    progress: list[StreamProgress] = []
    provider = OpenAIProvider(
        base_url=BASE_URL,
        model=os.environ.get("FANFOLD_LIVE_OPENAI_MODEL", "gpt-4o-mini"),
        api_key=os.environ.get("FANFOLD_LIVE_OPENAI_API_KEY") or None,
        timeouts=Timeouts(connect=10, read=120, total=300),
        stream=True,
        max_tokens=32,
    )
    request = ModelRequest(
        "You are a terse test fixture.", (UserMessage("Reply with the single word: pong"),), ()
    )
    context = CallContext("live", "live", "root", 0, None, 1, on_progress=progress.append)
    async with provider:
        reply = await provider.complete(request, context)
    assert reply.text.strip()
    assert reply.stop_reason in ("end_turn", "max_tokens")
    assert progress


TREE_SYSTEM = (
    "You coordinate sub-agents. Call the spawn_agents tool exactly once with two tasks: "
    "'say alpha' and 'say beta'. When their results come back, reply with one short "
    "sentence and no tool call."
)


@pytest.mark.skipif(not BASE_URL, reason="set FANFOLD_LIVE_OPENAI_BASE_URL to run")
async def test_a_live_delegation_tree_ends_and_replays(tmp_path: Path) -> None:
    """A whole tree against the live server (issue 13): a root asked to spawn two
    sub-agents. Asserted on structure, not on the model's words: every conversation
    ends, every child's outcome reaches the root's fan-in (when the model delegated at
    all), and the log replays identically."""
    assert BASE_URL
    provider = OpenAIProvider(
        base_url=BASE_URL,
        model=os.environ.get("FANFOLD_LIVE_OPENAI_MODEL", "gpt-4o-mini"),
        api_key=os.environ.get("FANFOLD_LIVE_OPENAI_API_KEY") or None,
        timeouts=Timeouts(connect=10, read=300, total=600),
        stream=True,
        max_tokens=512,
    )
    limits = Limits(max_rounds=4, child_timeout=300.0, max_depth=1)
    async with provider, open_runtime(tmp_path, provider, limits=limits) as runtime:
        root = await runtime.start(TREE_SYSTEM + "\n\nBegin.", cwd=tmp_path)
        with trio.fail_after(900):
            await runtime.wait(root)
        ids = [row.id for row in runtime.store.tree(root)]
        states = {cid: runtime.state(cid) for cid in ids}
        report = replay.verify(runtime.store, root, tree=True)
    assert all(state.at_rest for state in states.values()), states
    children = [cid for cid in ids if cid != root]
    fan_ins = [
        json.loads(m.result.content)["sub_agent_results"]
        for m in states[root].history
        if isinstance(m, ToolResultMessage) and m.result.name == "spawn_agents"
    ]
    reported = {entry["agent_id"] for results in fan_ins for entry in results}
    assert reported == set(children)  # every child's outcome reached the root, once each
    assert report.ok, report.summary()
