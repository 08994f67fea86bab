"""The runtime's structlog output: lifecycle, model-call and tool-call lines at info,
one bound ``transition`` line per logged step at debug only."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_helpers import open_runtime, reply, script, spawn, submit, think

from fanfold.db import Store
from fanfold.providers.config import Profile
from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime.actor import _endpoint, _served_by
from fanfold.runtime.logging import configure, flush


async def test_at_debug_every_step_has_one_transition_line_bound_to_its_conversation(
    tmp_path: Path, autojump_clock: object
) -> None:
    log_file = tmp_path / "log.jsonl"
    configure(json_file=log_file, console=None, file_level=logging.DEBUG)
    try:
        provider = script(
            1.0,
            root=[reply("", spawn("a", "b")), reply("done")],
            c1=[reply("", think()), reply("", submit("A"))],
            c2=[reply("", submit("B"))],
        )
        async with open_runtime(tmp_path, provider, logger=structlog.get_logger("fanfold")) as rt:
            root = await rt.start("fan out")
            assert (await rt.wait(root)).text == "done"
    finally:
        logging.getLogger("fanfold").handlers.clear()
        structlog.reset_defaults()

    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    transitions = [line for line in lines if line["event"] == "transition"]
    with Store.open(tmp_path / "log.db") as store:
        rows = store.tree(root)
        expected = {
            (row.id, event.seq): (row, type(event.event).__name__)
            for row in rows
            for event in store.events(row.id)
            if event.seq > 0  # creation steps are committed before the actor logs
        }
    logged = {(line["conversation_id"], line["seq"]): line for line in transitions}
    assert len(logged) == len(transitions)  # one line per step
    assert set(logged) == set(expected)
    for key, line in logged.items():
        row, event_type = expected[key]
        assert line["event_type"] == event_type
        assert line["parent_id"] == row.parent_id
        assert line["depth"] == row.depth
        assert {"before", "after", "effects"} <= set(line)


SECRET_TASK = "fan out the plans of the moon base"
SECRET_REPLY = "the answer is forty-two"


async def _run_logged(
    tmp_path: Path, provider: ScriptedProvider, **levels: int
) -> tuple[str, list[dict[str, Any]], str]:
    """Run the script's root to its answer with the JSON log configured by ``levels``;
    the root id, the parsed lines and the raw text of the log."""
    log_file = tmp_path / "log.jsonl"
    configure(json_file=log_file, console=None, **levels)
    try:
        async with open_runtime(tmp_path, provider, logger=structlog.get_logger("fanfold")) as rt:
            root = await rt.start(SECRET_TASK)
            await rt.wait(root)
    finally:
        logging.getLogger("fanfold").handlers.clear()
        structlog.reset_defaults()
    text = log_file.read_text() if log_file.exists() else ""  # no line, no file
    return root, [json.loads(line) for line in text.splitlines()], text


def _fan_out() -> ScriptedProvider:
    usage = {"input_tokens": 120, "output_tokens": 7}
    return script(
        1.0,
        root=[reply("", spawn("a", "b"), usage=usage), reply(SECRET_REPLY, usage=usage)],
        c1=[reply("", think("ponder the secret")), reply("", submit("A"))],
        c2=[
            reply(
                "",
                submit("B"),
                fail_first=[{"kind": "rate_limit", "message": "slow down", "retry_after": 2.0}],
            )
        ],
    )


async def test_default_level_logs_lifecycle_and_calls_but_no_transitions(
    tmp_path: Path, autojump_clock: object
) -> None:
    root, lines, text = await _run_logged(tmp_path, _fan_out())
    events = [line["event"] for line in lines]
    assert "transition" not in events
    with Store.open(tmp_path / "log.db") as store:
        rows = {row.id: row for row in store.tree(root)}
    assert len(rows) == 3
    # Every conversation started, bound to its id, parent and depth.
    started = {
        line["conversation_id"]: line for line in lines if line["event"] == "conversation_started"
    }
    assert set(started) == set(rows)
    for conversation_id, line in started.items():
        assert line["parent_id"] == rows[conversation_id].parent_id
        assert line["depth"] == rows[conversation_id].depth
        assert line["root_id"] == root
        assert line["level"] == "info"
    ended = sorted(
        line["conversation_id"] for line in lines if line["event"] == "conversation_ended"
    )
    assert ended == sorted(cid for cid in rows if cid != root)
    assert [line["conversation_id"] for line in lines if line["event"] == "turn_ended"] == [root]
    # One line per model call (c2's first attempt failed and was retried).
    calls = [line for line in lines if line["event"] == "model_call"]
    assert len(calls) == 2 + 2 + 2
    failed = [line for line in calls if line["outcome"] == "failed"]
    assert len(failed) == 1
    assert failed[0]["error_kind"] == "rate_limit"
    assert failed[0]["error"] == "slow down"
    assert failed[0]["retry_after"] == 2.0
    assert failed[0]["attempt"] == 1
    retried = [
        line
        for line in calls
        if line["conversation_id"] == failed[0]["conversation_id"] and line["outcome"] == "replied"
    ]
    assert [line["attempt"] for line in retried] == [2]
    root_calls = [line for line in calls if line["conversation_id"] == root]
    assert [(c["input_tokens"], c["output_tokens"]) for c in root_calls] == [(120, 7)] * 2
    assert [c["stop_reason"] for c in root_calls] == ["tool_use", "end_turn"]
    for line in calls:
        assert {"profile", "model", "endpoint", "latency_s", "first_token_s", "call"} <= set(line)
        assert line["latency_s"] >= 0
    # The tool call (think) and the spawn and submit tools each get a line.
    tools = [line for line in lines if line["event"] == "tool_call"]
    assert [line["tool"] for line in tools] == ["think"]
    assert tools[0]["outcome"] == "ok"
    assert tools[0]["duration_s"] >= 0
    # No message text: not the task, not a reply, not a tool's arguments.
    for secret in (SECRET_TASK, SECRET_REPLY, "ponder the secret"):
        assert secret not in text


async def test_warning_level_writes_no_info_lines(tmp_path: Path, autojump_clock: object) -> None:
    _, lines, _ = await _run_logged(tmp_path, _fan_out(), file_level=logging.WARNING)
    assert [line for line in lines if line["level"] in ("debug", "info")] == []


class _RecordingLogger:
    """A structlog-like logger at ``level`` that records every call to a log method."""

    def __init__(self, level: int) -> None:
        self.level = level
        self.calls: list[tuple[str, str]] = []

    def bind(self, **_: Any) -> _RecordingLogger:
        return self

    def is_enabled_for(self, level: int) -> bool:
        return level >= self.level

    def __getattr__(self, method: str) -> Any:
        def log(event: str, **_: Any) -> None:
            self.calls.append((method, event))

        return log


async def test_below_debug_the_runtime_makes_no_per_step_logging_call(
    tmp_path: Path, autojump_clock: object
) -> None:
    """The gate is the logger's own level, asked once: at info the actors never call
    the logger per step (nothing to bind, format or filter), only per lifecycle event
    and per call; at warning not at all."""
    for level, expected in ((logging.INFO, True), (logging.WARNING, False)):
        logger = _RecordingLogger(level)
        (tmp_path / str(level)).mkdir()
        async with open_runtime(tmp_path / str(level), _fan_out(), logger=logger) as rt:
            await rt.wait(await rt.start("go"))
        assert all(event != "transition" for _, event in logger.calls)
        assert all(method != "debug" for method, _ in logger.calls)
        assert bool(logger.calls) == expected
        if expected:
            events = {event for _, event in logger.calls}
            assert {"conversation_started", "model_call", "tool_call", "turn_ended"} <= events


async def test_a_failed_attempt_s_line_has_the_tokens_it_was_billed(
    tmp_path: Path, autojump_clock: object
) -> None:
    """Issue 22, item 11: ``show`` counted a failed attempt's billed tokens, its
    ``model_call`` line had no token fields at all."""
    billed = {"input_tokens": 1435, "output_tokens": 200}
    provider = script(
        1.0,
        root=[
            reply(
                "done",
                usage={"input_tokens": 10, "output_tokens": 2},
                fail_first=[{"kind": "server_error", "message": "cut", "usage": billed}],
            )
        ],
    )
    _, lines, _ = await _run_logged(tmp_path, provider)
    calls = [line for line in lines if line["event"] == "model_call"]
    assert [(c["outcome"], c["input_tokens"], c["output_tokens"]) for c in calls] == [
        ("failed", 1435, 200),
        ("replied", 10, 2),
    ]


def test_a_model_call_line_names_the_routed_profile_and_an_endpoint_without_credentials() -> None:
    class Router:
        def resolve(self, model: str | None, depth: int) -> tuple[Profile, str | None]:
            assert (model, depth) == (None, 2)
            profile = Profile(
                name="fast",
                provider="openai",
                model="m-1",
                base_url="https://user:s3cret@api.example:8443/v1?api_key=s3cret#x",
            )
            return profile, profile.model

    assert _served_by(Router(), None, 2) == ("fast", "m-1", "https://api.example:8443/v1")


def test_a_model_call_line_takes_only_plain_strings_from_a_provider() -> None:
    class Odd:
        name = object()
        model = 42
        base_url = "http://[::1"  # unparsable: no endpoint rather than a crash

        def __repr__(self) -> str:
            return "key=s3cret"

    assert _served_by(Odd(), None, 0) == (None, None, None)
    assert _served_by(Odd(), "explicit", 0) == (None, "explicit", None)
    assert _endpoint("http://h:notaport/p") == "http://h/p"


def test_lines_go_to_the_file_and_the_console_by_their_levels(tmp_path: Path) -> None:
    """The JSON file takes lines at its level and above; the console, rendered for
    people, those at its own; a line below both goes nowhere."""
    import io

    log_file = tmp_path / "levels.jsonl"
    console = io.StringIO()
    configure(json_file=log_file, console=console, console_level=logging.WARNING)
    try:
        log = structlog.get_logger("fanfold").bind(conversation_id="c1")
        log.debug("too_quiet", n=1)
        log.info("model_call", n=2)
        log.warning("provider_slow", n=3)
    finally:
        configure(json_file=None, console=None)
        structlog.reset_defaults()
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert [(line["event"], line["level"], line["n"]) for line in lines] == [
        ("model_call", "info", 2),
        ("provider_slow", "warning", 3),
    ]
    assert all(line["conversation_id"] == "c1" and "timestamp" in line for line in lines)
    shown = console.getvalue()
    assert "provider_slow" in shown and "model_call" not in shown and "too_quiet" not in shown


def test_a_line_is_compact_json_with_an_iso_utc_timestamp_and_odd_values_as_text(
    tmp_path: Path,
) -> None:
    """The JSON file's lines: one object each, the timestamp UTC with microseconds
    (formatted once a second, so two lines in one second share its date and time), a
    value JSON cannot hold written as its repr, non-finite numbers as json.dumps
    writes them, and non-ASCII text escaped."""
    import re
    import time

    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    log_file = tmp_path / "log.jsonl"
    configure(json_file=log_file, console=None)
    try:
        before = time.time()
        log = structlog.get_logger("fanfold")
        log.info("first", thing=Opaque(), ratio=float("nan"), text="é\n")
        log.info("second", n=2)
        log.debug("dropped")
        after = time.time()
    finally:
        configure(json_file=None, console=None)
        structlog.reset_defaults()
    raw = log_file.read_text().splitlines()
    assert len(raw) == 2
    assert raw[0].isascii() and ": " not in raw[0]
    first, second = (json.loads(line) for line in raw)
    assert first["event"] == "first" and first["level"] == "info"
    assert first["thing"] == "<opaque>" and first["text"] == "é\n"
    assert first["ratio"] != first["ratio"]  # NaN
    assert second["n"] == 2
    for line in (first, second):
        stamp = line["timestamp"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", stamp)
        from datetime import datetime

        at = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        assert before - 1e-6 <= at <= after + 1e-6


_PLAIN_SCRIPT = """
import sys
import trio
from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.logging import configure
from fanfold.tools.registry import ToolSet

if sys.argv[1:]:  # what the CLI does: configure() first
    configure(json_file=sys.argv[1], console=None, file_level=10)

async def main() -> None:
    script = {"latency": 0, "agents": [{"match": {"path": "root"}, "replies": [{"text": "hi"}]}]}
    async with Runtime.open(":memory:", ScriptedProvider(script), ToolSet.default()) as rt:
        root = await rt.start("hello")
        await rt.wait(root)
    if not sys.argv[1:]:
        from fanfold.runtime.logging import library_logger

        library_logger().info("not_shown_info")
        library_logger().warning("shown_warning", n=1)

trio.run(main)
"""


def _plain_python(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "plain.py"
    path.write_text(_PLAIN_SCRIPT)
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data")}
    env.pop("FANFOLD_KEY_FILE", None)
    done = subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done


def test_a_runtime_in_a_plain_python_script_prints_nothing_to_stdout(tmp_path: Path) -> None:
    """Issue 22, item 16: without configure(), structlog's default printed every debug
    `transition` line to the program's stdout. The library default is quiet: nothing
    on stdout, warnings and above on stderr (the stdlib's lastResort), nothing below."""
    done = _plain_python(tmp_path)
    assert done.stdout == ""
    assert "shown_warning" in done.stderr and "n=1" in done.stderr
    assert "not_shown_info" not in done.stderr and "transition" not in done.stderr


def test_configure_still_routes_the_runtime_lines(tmp_path: Path) -> None:
    """The CLI's configure() keeps working: at debug the JSON file gets the lifecycle
    and transition lines; stdout stays empty."""
    log_file = tmp_path / "log.jsonl"
    done = _plain_python(tmp_path, str(log_file))
    assert done.stdout == ""
    events = {json.loads(line)["event"] for line in log_file.read_text().splitlines()}
    assert {"conversation_started", "transition", "model_call"} <= events


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=10),
    st.lists(st.integers(), max_size=3),
)
_STAMP = re.compile(r'"timestamp":"[^"]*"')


@settings(max_examples=60, deadline=None)
@given(
    context=st.dictionaries(
        st.sampled_from(["conversation_id", "depth", "x", "level", "timestamp"]), _VALUES
    ),
    fields=st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda key: key not in ("event", "exc_info")),
        _VALUES,
        max_size=6,
    ),
    event=st.text(max_size=12),
)
def test_a_line_rendered_without_the_chain_is_the_line_the_chain_renders(
    tmp_path_factory: pytest.TempPathFactory,
    context: dict[str, Any],
    fields: dict[str, Any],
    event: str,
) -> None:
    """An info or debug line for the file alone is rendered without structlog's
    processor chain (issue 21): the same text as the chain writes, whatever the
    bound context and the keywords (keys that override the context or the level
    included), but for the timestamp."""
    log_file = tmp_path_factory.mktemp("same") / "log.jsonl"
    configure(json_file=log_file, console=None, file_level=logging.DEBUG)
    try:
        log = structlog.get_logger("fanfold").bind(**context)
        chain = type(log).__mro__[1]  # structlog's own filtering bound logger
        for method in ("info", "debug"):
            getattr(log, method)(event, **fields)
            getattr(chain, method)(log, event, **fields)
    finally:
        configure(json_file=None, console=None)
        structlog.reset_defaults()
    lines = [_STAMP.sub("T", line) for line in log_file.read_text().splitlines()]
    assert len(lines) == 4
    assert lines[0] == lines[1] and lines[2] == lines[3]


def test_lines_are_written_together_once_per_flush_and_a_warning_at_once(
    tmp_path: Path,
) -> None:
    """Lines at info wait in a buffer for ``flush()`` (the engine calls it once per
    round) instead of a write and a flush each; a warning is written at once, with
    the lines before it; ``configure()`` writes what is left."""
    from fanfold.runtime.logging import flush

    log_file = tmp_path / "log.jsonl"
    configure(json_file=log_file, console=None)
    try:
        log = structlog.get_logger("fanfold").bind(conversation_id="c1")
        log.info("one")
        log.info("two")
        assert not log_file.exists()  # created at its first written line (issue 32.14)
        flush()
        assert [json.loads(line)["event"] for line in log_file.read_text().splitlines()] == [
            "one",
            "two",
        ]
        log.info("three")
        log.warning("four")
        assert len(log_file.read_text().splitlines()) == 4
        log.info("five")
    finally:
        configure(json_file=None, console=None)
        structlog.reset_defaults()
    assert json.loads(log_file.read_text().splitlines()[-1])["event"] == "five"


async def test_the_lines_of_a_run_are_in_the_file_while_the_runtime_is_open(
    tmp_path: Path, autojump_clock: object
) -> None:
    """The engine writes the buffered lines after each committed round and before it
    waits: a caller reading the log once its turn ended finds every line of it."""
    log_file = tmp_path / "log.jsonl"
    configure(json_file=log_file, console=None)
    try:
        async with open_runtime(tmp_path, _fan_out(), logger=structlog.get_logger("fanfold")) as rt:
            root = await rt.start(SECRET_TASK)
            await rt.wait(root)
            await trio.testing.wait_all_tasks_blocked()
            events = [json.loads(line)["event"] for line in log_file.read_text().splitlines()]
    finally:
        configure(json_file=None, console=None)
        structlog.reset_defaults()
    assert events.count("conversation_started") == 3
    assert events[-1] == "turn_ended"


def test_capture_logs_sees_the_lines_the_shortcut_would_write(tmp_path: Path) -> None:
    """structlog.testing.capture_logs changes the configured processor list in place;
    a logger bound before it must then go through the capturing chain, not the JSON
    file's shortcut (a runtime test saw no line once configure() had run earlier in
    the same process)."""
    configure(json_file=tmp_path / "log.jsonl", console=None)
    try:
        logger = structlog.get_logger("fanfold").bind(conversation="c1")
        logger.info("before")
        with structlog.testing.capture_logs() as captured:
            logger.info("during", to="c2")
        assert [(e["event"], e["to"], e["conversation"]) for e in captured] == [
            ("during", "c2", "c1")
        ]
        logger.info("after")
        flush()
        lines = (tmp_path / "log.jsonl").read_text(encoding="utf-8").splitlines()
        assert [json.loads(line)["event"] for line in lines] == ["before", "after"]
    finally:
        configure(json_file=None, console=None)
        structlog.reset_defaults()  # as the other tests leave it: the next ones log


_CONTEXTVARS_SCRIPT = """
import sys
import structlog
import structlog.contextvars
from fanfold.runtime.logging import configure, flush
configure(json_file=sys.argv[1], console=None)
log = structlog.get_logger("fanfold").bind(conversation_id="c1", depth=0)
log.info("before", n=1)
structlog.contextvars.bind_contextvars(request_id="r7")
log.info("after", n=2)
flush()
"""


def test_a_variable_bound_with_structlog_contextvars_reaches_the_file(tmp_path: Path) -> None:
    """The shortcut renders a line without ``merge_contextvars``; once anything is bound
    with ``structlog.contextvars`` every line goes through the chain, which adds it.
    In a process of its own: a binding is module state for the rest of a process."""
    out = tmp_path / "log.jsonl"
    subprocess.run([sys.executable, "-c", _CONTEXTVARS_SCRIPT, str(out)], check=True, timeout=120)
    before, after = (json.loads(line) for line in out.read_text().splitlines())
    assert {k: v for k, v in before.items() if k != "timestamp"} == {
        "conversation_id": "c1",
        "depth": 0,
        "n": 1,
        "event": "before",
        "level": "info",
    }
    assert {k: v for k, v in after.items() if k != "timestamp"} == {
        "request_id": "r7",
        "conversation_id": "c1",
        "depth": 0,
        "n": 2,
        "event": "after",
        "level": "info",
    }
