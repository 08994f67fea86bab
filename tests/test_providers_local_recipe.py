"""The local-model recipe (docs/how-to/configuration.md), over loopback (issue 22,
item 13): the example configuration runs a user who has only a local server; what
`show` and the log call the model; the sampling settings an Anthropic profile sends."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from fakeserver import FakeServer, first_user_contains, openai_stream

from fanfold.cli import cli
from fanfold.db import Store
from fanfold.providers.base import CallContext
from fanfold.providers.config import build_provider, read_config_file
from fanfold.statemachine import ModelRequest, ToolCall, UserMessage

EXAMPLE = Path(__file__).parent.parent / "examples" / "fanfold.toml"
LOCAL_URL = "http://127.0.0.1:8080/v1"
SERVER_MODEL = "server-reports-this-name"  # what llama-server puts in its replies


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


def invoke(*args: str | Path) -> Result:
    # A user with a local server only: no hosted API's key in the environment.
    unset: dict[str, str | None] = {
        name: None
        for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "FANFOLD_PROFILE", "FANFOLD_MODEL")
    }
    result = CliRunner().invoke(cli, [str(a) for a in args], env=unset)
    assert "Traceback" not in result.output
    return result


def test_the_example_configuration_runs_a_local_only_user(
    tmp_path: Path, server: FakeServer
) -> None:
    """The example's ``default = "openai"`` (and ``sub_agents = "fast"``, OpenAI too)
    stopped a user with only a local server at the first call, for want of
    OPENAI_API_KEY. Its local profile, pointed at a loopback server, now runs a whole
    tree; and `show` and the log name the profile's model, not the server's."""
    text = EXAMPLE.read_text(encoding="utf-8")
    assert LOCAL_URL in text
    config = tmp_path / "fanfold.toml"
    config.write_text(text.replace(LOCAL_URL, server.url + "/v1"), encoding="utf-8")
    spawn = ToolCall.of("call_s", "spawn_agents", {"tasks": [{"task": "count the files"}]})
    submit = ToolCall.of("call_r", "submit_result", {"result": "7 files"})
    server.when(
        first_user_contains("delegate"),
        openai_stream("", (spawn,), model=SERVER_MODEL),
        openai_stream("There are 7 files.", model=SERVER_MODEL),
    )
    server.when(first_user_contains("count the files"), openai_stream("", (submit,)))
    db = tmp_path / "log.db"
    ran = invoke("run", "--no-live", "--db", db, "--config", config, "--cwd", tmp_path, "delegate")
    assert ran.exit_code == 0, ran.output
    assert "There are 7 files." in ran.output
    assert len(server.requests) == 3 and not server.unmatched
    assert {r.json["model"] for r in server.requests} == {"qwen2.5-7b-instruct"}
    with Store.open(db) as store:
        (root,) = store.list_roots()
    shown = invoke("show", root.id, "--db", db)
    assert shown.exit_code == 0, shown.output
    words = " ".join(shown.output.split())  # the terminal's line breaks aside
    assert words.count("model qwen2.5-7b-instruct,") == 2  # the root and its child
    as_json = json.loads(invoke("show", root.id, "--db", db, "--json").output)
    assert (as_json["model"], as_json["profile"]) == ("qwen2.5-7b-instruct", "local")
    assert as_json["children"][0]["model"] == "qwen2.5-7b-instruct"
    log = [json.loads(line) for line in db.with_suffix(".log.jsonl").read_text().splitlines()]
    calls = [line for line in log if line["event"] == "model_call"]
    assert len(calls) == 3
    assert {(c["profile"], c["model"]) for c in calls} == {("local", "qwen2.5-7b-instruct")}
    everything = shown.output + json.dumps(as_json) + json.dumps(log)
    assert SERVER_MODEL not in everything


def test_the_example_still_names_the_hosted_profiles() -> None:
    config = read_config_file(EXAMPLE)
    assert config.default_profile().name == "local"
    assert config.sub_agent_profile().name == "local"  # none named: the root's
    assert config.with_overrides(profile="openai").sub_agent_profile().name == "openai"
    assert {"openai", "fast", "claude", "offline"} <= set(config.names())


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ("", {}),
        ("temperature = 0.2\n", {"temperature": 0.2}),
        ("top_p = 0.9\n", {"top_p": 0.9}),
    ],
)
async def test_an_anthropic_profile_sends_only_the_sampling_settings_it_sets(
    tmp_path: Path, server: FakeServer, settings: str, expected: dict[str, Any]
) -> None:
    """Newer Claude models refuse a request that sets both ``temperature`` and
    ``top_p``: a profile's request carries the ones it sets, and nothing else."""
    from fakeserver import anthropic_message

    config = tmp_path / "fanfold.toml"
    config.write_text(
        "default = 'claude'\n[profiles.claude]\nprovider = 'anthropic'\n"
        f"base_url = '{server.url}'\nmodel = 'claude-sonnet-4-5'\nstream = false\n{settings}",
        encoding="utf-8",
    )
    profile = read_config_file(config).profile("claude")
    server.enqueue(anthropic_message("hi"))
    provider = build_provider(profile, environ={})
    request = ModelRequest("Be brief.", (UserMessage("hello"),), ())
    async with provider:  # type: ignore[attr-defined]
        reply = await provider.complete(request, CallContext("c", "c", "root", 0, None, 1))
    assert reply.text == "hi"
    (sent,) = server.requests
    assert sent.path == "/v1/messages"
    sampling = {k: v for k, v in sent.json.items() if k in ("temperature", "top_p", "top_k")}
    assert sampling == expected


def test_a_reply_cut_inside_a_tool_call_is_counted_in_show(
    tmp_path: Path, server: FakeServer
) -> None:
    """Issue 22, item 11, as the user saw it: llama-server's whole (non-streaming)
    reply cut at max_tokens inside a tool call showed ``0 tokens, $0.0000`` where the
    server reported 1,435 + 200."""
    from fakeserver import Json

    cut = {
        "index": 0,
        "finish_reason": "length",
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "spawn_agents", "arguments": '{"tasks": [{"ta'},
                }
            ],
        },
    }
    usage = {"prompt_tokens": 1435, "completion_tokens": 200, "total_tokens": 1635}
    server.enqueue(Json({"model": SERVER_MODEL, "choices": [cut], "usage": usage}))
    config = tmp_path / "fanfold.toml"
    config.write_text(
        f"default = 'local'\n[profiles.local]\nprovider = 'openai'\nbase_url = '{server.url}/v1'\n"
        "model = 'm'\nstream = false\nprices = { input = 1.0, output = 2.0 }\n",
        encoding="utf-8",
    )
    db = tmp_path / "log.db"
    ran = invoke("run", "--no-live", "--db", db, "--config", config, "--cwd", tmp_path, "go")
    assert "output_truncated" in ran.output
    with Store.open(db) as store:
        (root,) = store.list_roots()
    as_json = json.loads(invoke("show", root.id, "--db", db, "--json").output)
    assert (as_json["input_tokens"], as_json["output_tokens"]) == (1435, 200)
    assert as_json["cost"] == pytest.approx((1435 * 1.0 + 200 * 2.0) / 1_000_000)
    assert "1635 tokens" in " ".join(invoke("show", root.id, "--db", db).output.split())
