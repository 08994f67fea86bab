"""The scripted provider's scripts: every field checked at load, naming where.

A script that loads cannot fail when its replies are due; a bad one is one clear CLI
line (exit 2) and no tree. A provider that hands back something ill-formed at call
time still ends the conversation with a recorded reason.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from runtime_helpers import open_runtime, reply, script, spawn

from fanfold.cli import cli
from fanfold.db import Store
from fanfold.db.codec import encode_event
from fanfold.providers.base import CallContext, ProviderError, complete_checked
from fanfold.providers.script_schema import MODEL_ERROR_KINDS, load_script
from fanfold.providers.scripted import ScriptedProvider, ScriptError, _build
from fanfold.statemachine import (
    AssistantMessage,
    Completed,
    Error,
    ErrorKind,
    Failed,
    ModelError,
    ModelFailed,
    ModelReplied,
    ModelReply,
    ModelRequest,
    ToolCall,
    ToolSpec,
    Usage,
    UserMessage,
)

# A script using every field once.
FULL: dict[str, Any] = {
    "latency": 0,
    "agents": [
        {
            "match": {"path": "root", "task": "*", "depth": 0},
            "replies": [
                {
                    "text": "looking",
                    "tool_calls": [{"name": "think", "arguments": {"thought": "{{task}}"}}],
                    "latency": 0,
                    "fail_first": [{"kind": "rate_limit", "message": "slow", "retry_after": 0.5}],
                    "usage": {"input_tokens": 10, "output_tokens": 5},
                },
                {"text": "done: {{last_tool_result}}"},
            ],
        }
    ],
}

_DELETE = object()
_R = ("agents", 0, "replies", 0)  # the first reply
R = "agents[0].replies[0]"
SECONDS = "expected a number of seconds >= 0, got"
TOKENS = "expected a whole number of tokens >= 0, got"

# (where, the value put there (_DELETE: removed), the problem reported)
BAD: list[tuple[tuple[str | int, ...], object, str]] = [
    # the script itself
    (("latency",), "0.5", f'latency: {SECONDS} "0.5"'),
    (("latency",), -1, f"latency: {SECONDS} -1"),
    (("latency",), True, f"latency: {SECONDS} true"),
    (("latency",), None, f"latency: {SECONDS} null"),
    (("latency",), math.inf, f"latency: {SECONDS} Infinity"),
    (("agents",), _DELETE, "agents: required, missing"),
    (("agents",), {"path": "root"}, "agents: expected a list, got an object"),
    (("agents",), "root", 'agents: expected a list, got "root"'),
    (("colour",), "blue", "unknown key(s) 'colour' (keys are agents, latency)"),
    # an agent entry
    (
        ("agents", 0),
        "root",
        'agents[0]: expected an object with keys match, replies, summary, got "root"',
    ),
    (("agents", 0, "replies"), _DELETE, "agents[0].replies: required, missing"),
    (("agents", 0, "replies"), {}, "agents[0].replies: expected a list, got an object"),
    (
        ("agents", 0, "name"),
        "x",
        "agents[0]: unknown key(s) 'name' (keys are match, replies, summary)",
    ),
    # its match
    (("agents", 0, "match"), [], "agents[0].match: expected an object with keys path, "),
    (("agents", 0, "match", "path"), 1, "agents[0].match.path: expected a string, got 1"),
    (("agents", 0, "match", "task"), ["*"], "agents[0].match.task: expected a string, got a list"),
    (("agents", 0, "match", "depth"), "0", "agents[0].match.depth: expected a depth (a whole"),
    (("agents", 0, "match", "depth"), -1, "agents[0].match.depth: expected a depth"),
    (("agents", 0, "match", "depth"), True, "agents[0].match.depth: expected a depth"),
    (("agents", 0, "match", "depth"), 0.5, "agents[0].match.depth: expected a depth"),
    (("agents", 0, "match", "id"), "x", "agents[0].match: unknown key(s) 'id' (keys are path, "),
    # a reply
    (_R, "hi", f"{R}: expected an object with keys text, tool_calls, latency, fail_first, usage"),
    ((*_R, "text"), 5, f"{R}.text: expected a string, got 5"),
    ((*_R, "text"), None, f"{R}.text: expected a string, got null"),
    ((*_R, "txt"), "hi", f"{R}: unknown key(s) 'txt' (keys are text, tool_calls, latency, "),
    ((*_R, "latency"), "soon", f'{R}.latency: {SECONDS} "soon"'),
    ((*_R, "latency"), -0.5, f"{R}.latency: {SECONDS} -0.5"),
    ((*_R, "latency"), math.nan, f"{R}.latency: {SECONDS} NaN"),
    # its tool calls
    ((*_R, "tool_calls"), {"name": "think"}, f"{R}.tool_calls: expected a list, got an object"),
    ((*_R, "tool_calls", 0), "think", f"{R}.tool_calls[0]: expected an object with keys name, "),
    ((*_R, "tool_calls", 0, "name"), _DELETE, f"{R}.tool_calls[0].name: required, missing"),
    ((*_R, "tool_calls", 0, "name"), ["x"], f"{R}.tool_calls[0].name: expected a string, got a"),
    ((*_R, "tool_calls", 0, "arguments"), "{}", f"{R}.tool_calls[0].arguments: expected a JSON "),
    ((*_R, "tool_calls", 0, "arguments"), [], f"{R}.tool_calls[0].arguments: expected a JSON "),
    ((*_R, "tool_calls", 0, "id"), "c1", f"{R}.tool_calls[0]: unknown key(s) 'id' (keys are name"),
    # its injected failures
    ((*_R, "fail_first"), {"kind": "auth"}, f"{R}.fail_first: expected a list, got an object"),
    (
        (*_R, "fail_first", 0, "retry_after"),
        "soon",
        f'{R}.fail_first[0].retry_after: {SECONDS} "soon"',
    ),
    ((*_R, "fail_first", 0, "retry_after"), -1, f"{R}.fail_first[0].retry_after: {SECONDS} -1"),
    ((*_R, "fail_first", 0, "kind"), _DELETE, f"{R}.fail_first[0].kind: required, missing"),
    ((*_R, "fail_first", 0, "kind"), "slow", f"{R}.fail_first[0].kind: expected an error kind ("),
    ((*_R, "fail_first", 0, "kind"), "cancelled", 'provider_failure), got "cancelled"'),
    ((*_R, "fail_first", 0, "kind"), 429, "provider_failure), got 429"),
    ((*_R, "fail_first", 0, "message"), 3, f"{R}.fail_first[0].message: expected a string, got 3"),
    ((*_R, "fail_first", 0, "code"), 429, f"{R}.fail_first[0]: unknown key(s) 'code' (keys are "),
    # its usage
    ((*_R, "usage"), 15, f"{R}.usage: expected an object with keys input_tokens, output_tokens"),
    ((*_R, "usage", "input_tokens"), -1, f"{R}.usage.input_tokens: {TOKENS} -1"),
    ((*_R, "usage", "input_tokens"), 1.5, f"{R}.usage.input_tokens: {TOKENS} 1.5"),
    ((*_R, "usage", "output_tokens"), "5", f'{R}.usage.output_tokens: {TOKENS} "5"'),
    ((*_R, "usage", "output_tokens"), 2**63, f"{R}.usage.output_tokens: {TOKENS} 9223372036"),
    ((*_R, "usage", "total"), 15, f"{R}.usage: unknown key(s) 'total' (keys are input_tokens, "),
]


def _with(where: tuple[str | int, ...], value: object) -> dict[str, Any]:
    """FULL with ``value`` at ``where`` (removed if _DELETE)."""
    script = copy.deepcopy(FULL)
    holder: Any = script
    for key in where[:-1]:
        holder = holder[key]
    if value is _DELETE and isinstance(holder, dict):
        holder.pop(where[-1], None)
    elif value is _DELETE:
        del holder[where[-1]]
    else:
        holder[where[-1]] = value
    return script


def test_the_full_script_loads_with_every_field() -> None:
    script = load_script(FULL)
    (agent,) = script.agents
    assert (agent.match.path, agent.match.task, agent.match.depth) == ("root", "*", 0)
    first = agent.replies[0]
    assert first.fail_first[0].kind is ErrorKind.RATE_LIMIT
    assert first.fail_first[0].retry_after == 0.5
    assert (first.usage.input_tokens, first.usage.output_tokens) == (10, 5)
    assert first.tool_calls[0].arguments == {"thought": "{{task}}"}


@pytest.mark.parametrize(("where", "value", "problem"), BAD)
def test_a_bad_field_is_one_cli_line_naming_where_and_no_tree(
    tmp_path: Path, where: tuple[str | int, ...], value: object, problem: str
) -> None:
    bad = _with(where, value)
    with pytest.raises(ScriptError) as refused:
        ScriptedProvider(bad)
    assert problem in str(refused.value)
    path = tmp_path / "script.json"
    path.write_text(json.dumps(bad))  # NaN and Infinity as Python's json writes them
    db = tmp_path / "cli.db"
    result = CliRunner().invoke(cli, ["run", "--db", str(db), "--script", str(path), "go"])
    assert result.exit_code == 2, result.output
    (line,) = result.output.splitlines()
    assert line.startswith(f"error: script {path}: ")
    assert problem in line
    # Exactly one problem is named: the rest of the script is valid.
    assert line.count(": expected") + line.count(": unknown key") + line.count(": required") == 1
    assert not db.exists()  # refused before any conversation was created


def test_every_problem_is_named_on_one_line() -> None:
    bad = _with((*_R, "text"), 5)
    bad["agents"][0]["replies"][1]["usage"] = {"input_tokens": "x"}
    bad["latency"] = -1
    with pytest.raises(ScriptError) as refused:
        ScriptedProvider(bad, source="s.json")
    assert str(refused.value) == (
        "s.json: agents[0].replies[0].text: expected a string, got 5; "
        "agents[0].replies[1].usage.input_tokens: expected a whole number of tokens >= 0, "
        'got "x"; latency: expected a number of seconds >= 0, got -1'
    )


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"[1, 2]", "expected an object with keys agents, latency, got a list"),
        (b"{", "is not valid JSON"),
        (b"\xff\xfe", "is not UTF-8 text"),
        (b"[" * 100_000, "nested too deeply"),
    ],
)
def test_a_file_that_is_not_a_script_object_is_one_line(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "script.json"
    path.write_bytes(content)
    with pytest.raises(ScriptError, match=problem):
        ScriptedProvider.from_file(path)


# Any JSON value, anywhere in a valid script: the script loads, or ScriptError says why.
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)


def _places(value: Any, where: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every place in ``value`` (dict keys, list indices), and a new key in each dict."""
    found: list[tuple[str | int, ...]] = []
    if isinstance(value, dict):
        found.append((*where, "extra"))
        for key, inner in value.items():
            found += [(*where, key), *_places(inner, (*where, key))]
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += [(*where, index), *_places(inner, (*where, index))]
    return found


@given(place=st.sampled_from(_places(FULL)), value=_JSON | st.just(_DELETE))
def test_a_script_loads_or_is_refused_and_what_loads_makes_well_formed_replies(
    place: tuple[str | int, ...], value: object
) -> None:
    try:
        provider = ScriptedProvider(_with(place, value))
    except ScriptError as exc:
        assert str(exc).startswith("script: ")
        assert "\n" not in str(exc)
        return
    # What loaded is well formed in every reply and failure: the contract the runtime
    # holds providers to, and what the log can store.
    for entry in provider._entries:
        for step, scripted_reply in enumerate(entry.agent.replies):
            built = _build(scripted_reply, step, {"task": "t", "last_tool_result": "r"})
            encode_event(ModelReplied(1, built))
            for failure in scripted_reply.fail_first:
                error = ModelError(failure.kind, failure.message, failure.retry_after)
                assert failure.kind in MODEL_ERROR_KINDS
                encode_event(ModelFailed(1, error))
            # Latencies may be long: virtual time jumps over them.
            clock = trio.testing.MockClock(autojump_threshold=0)
            trio.run(_complete_through_the_contract, provider, step, clock=clock)


async def _complete_through_the_contract(provider: ScriptedProvider, step: int) -> None:
    """Every attempt of round ``step`` replies or raises ProviderError, well formed
    (complete_checked raises ProviderContractError otherwise)."""
    request = ModelRequest(
        "", (UserMessage("t"), *(AssistantMessage("", ()), UserMessage("t")) * step), ()
    )
    for attempt in range(1, 5):
        context = CallContext("c", "c", "root", 0, "t", 1, attempt)
        with contextlib.suppress(ProviderError):
            await complete_checked(provider, request, context)


def test_placeholders_are_filled_in_text_and_string_arguments() -> None:
    (agent,) = load_script(FULL).agents
    built = _build(agent.replies[0], 0, {"task": "review", "last_tool_result": "x"})
    assert built.tool_calls == (ToolCall("call_0_0", "think", '{"thought":"review"}'),)
    assert built.usage == Usage(10, 5)
    assert _build(agent.replies[1], 1, {"task": "", "last_tool_result": "42"}) == ModelReply(
        text="done: 42"
    )


# ------------------------------------------------------------ at call time

# What a broken provider may hand back: each must end the conversation with a recorded
# provider_failure, never leave it `running` (before, the reducer or the log's codec
# refused these as a crash of the whole runtime).
ILL_FORMED: list[tuple[str, Callable[[], object], str]] = [
    ("text", lambda: ModelReply(text=5), "text is int, not str"),  # type: ignore[arg-type]
    ("not a reply", lambda: {"text": "hi"}, "dict instead of a ModelReply"),
    ("usage", lambda: ModelReply(usage=Usage(-1, 0)), "usage is not a Usage of token"),
    (
        "tool call",
        lambda: ModelReply(tool_calls=(ToolCall("c", "think", {"a": 1}),)),  # type: ignore[arg-type]
        "tool_calls[0].arguments_json is not str",
    ),
    (
        "retry_after",
        lambda: ProviderError(ModelError(ErrorKind.RATE_LIMIT, "x", "soon")),  # type: ignore[arg-type]
        "retry_after 'soon': not None or a number of seconds >= 0",
    ),
    (
        "kind",
        lambda: ProviderError(ModelError("rate_limit", "x")),  # type: ignore[arg-type]
        "error kind 'rate_limit' that is not an ErrorKind",
    ),
    ("crash", lambda: ValueError("boom"), "ValueError: boom"),
]


class _IllFormed:
    """Answers conversations at ``path`` with what ``make()`` gives (returned, or raised
    if it is an exception: a new one each time, so that no traceback outlives the test);
    the others through ``script``."""

    def __init__(self, script: ScriptedProvider, path: str, make: Callable[[], object]) -> None:
        self.script, self.path, self.make = script, path, make

    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply:
        if context.path != self.path:
            return await self.script.complete(request, context)
        outcome = self.make()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome  # type: ignore[return-value]


class _IllFormedAtOnce(_IllFormed):
    """The same, a provider that replies at once (``reply_after``): the runtime holds
    its outcome to the same contract; what ``make()`` raises is raised when the call
    starts, in the engine's task."""

    def reply_after(
        self, request: ModelRequest, context: CallContext
    ) -> tuple[float, ModelReply | ProviderError]:
        if context.path != self.path:
            return self.script.reply_after(request, context)
        outcome = self.make()
        if isinstance(outcome, BaseException) and not isinstance(outcome, ProviderError):
            raise outcome
        return 0.1, outcome  # type: ignore[return-value]


@pytest.mark.parametrize("wrapper", [_IllFormed, _IllFormedAtOnce])
@pytest.mark.parametrize(("case", "make", "problem"), ILL_FORMED)
async def test_a_provider_failing_at_call_time_ends_the_tree_with_a_recorded_reason(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    case: str,
    make: Callable[[], object],
    problem: str,
    wrapper: type[_IllFormed],
) -> None:
    scripted = script(0.1, root=[reply("", spawn("a", "b")), reply("summed up")])
    provider = wrapper(scripted, "root/2", make)
    async with open_runtime(tmp_path, provider) as runtime:
        root = await runtime.start("go", cwd=tmp_path)
        with trio.fail_after(60):
            result = await runtime.wait(root)
        assert result.text == "summed up"
        broken = runtime.state(f"{root}.2").phase
        assert isinstance(broken, Failed)
        assert broken.kind is ErrorKind.PROVIDER_FAILURE
        assert problem in broken.error
        assert isinstance(runtime.state(f"{root}.1").phase, Completed)  # its sibling
        # The root itself meeting the broken provider: its turn ends in Error.
        alone = wrapper(scripted, "root", make)
        runtime.provider = alone
        await runtime.send(root, "again")
        with trio.fail_after(60):
            await runtime.wait(root)
        error = runtime.state(root).phase
        assert isinstance(error, Error)
        assert error.kind is ErrorKind.PROVIDER_FAILURE
        assert problem in error.error
    with Store.open(tmp_path / "log.db") as store:
        assert store.unfinished() == []
        assert {row.status for row in store.tree(root)} == {"error", "completed", "failed"}


async def test_a_summary_call_is_answered_by_the_summary_reply_or_a_made_up_one() -> None:
    """A summary call (context mode summary) is no round: it takes the entry's
    ``summary`` reply, its failures first; without one, a summary naming the
    conversation and its latest request. Ordinary rounds are unaffected."""
    from fanfold.statemachine.delegation import SUMMARY_PROMPT

    summary_request = ModelRequest(
        "", (UserMessage("fix the bug"), AssistantMessage("on it"), UserMessage(SUMMARY_PROMPT)), ()
    )
    round_request = ModelRequest("", (UserMessage("fix the bug"),), ())
    scripted = ScriptedProvider(
        {
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [{"text": "round one"}],
                    "summary": {
                        "text": "summary of {{task}}",
                        "fail_first": [{"kind": "server_error", "message": "busy"}],
                    },
                },
                {"match": {"path": "*"}, "replies": [{"text": "other"}]},
            ]
        }
    )
    first = CallContext("c", "c", "root", 0, "the task", 1, 1)
    with pytest.raises(ProviderError, match="server_error: busy"):
        await scripted.complete(summary_request, first)
    second = attrs.evolve(first, attempt=2)
    assert await scripted.complete(summary_request, second) == ModelReply("summary of the task")
    assert (await scripted.complete(round_request, first)).text == "round one"
    other = CallContext("d", "d", "root/1", 1, "t", 1, 1)
    made_up = await scripted.complete(summary_request, other)
    assert made_up.text == "(scripted summary of root/1: 2 messages; latest request: fix the bug)"
    # A request that offers tools is an ordinary round, whatever its last message says.
    with_tools = attrs.evolve(summary_request, tools=(ToolSpec("think", "", "{}"),))
    assert (await scripted.complete(with_tools, other)).text.startswith("(no scripted reply")
