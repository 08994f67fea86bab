"""Every view renders every text the log can hold; failures show their typed kind;
long texts are shown cut, with --full for all of it."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rich.console import Console
from sm_support import failed, root, step, steps, user

from fanfold.cli import cli, display
from fanfold.db import ConversationRow, Store, decode_event
from fanfold.statemachine import (
    CallModel,
    ErrorKind,
    Limits,
    ModelError,
    ModelFailed,
    ModelReplied,
    ModelReply,
    ScheduleRetry,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from fanfold.statemachine.delegation import SUMMARY_HEADER

# What must never reach a terminal raw: C0 controls but tab and newline, DEL, C1
# controls, bidirectional controls, lone surrogates.
RAW = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
    "\u2066-\u2069\ud800-\udfff]"
)
HALF_EMOJI = "\ud83d"


def _write(path: Path, data: dict[str, Any]) -> Path:
    # json.dumps writes a lone surrogate as the escape \ud83d, as a provider's JSON may.
    path.write_text(json.dumps(data))
    return path


def _script(text: str) -> dict[str, Any]:
    """A tree whose every text field holds ``text``: a child's task, its tool call's
    name and output, its result; another child's error; the root's answer."""
    return {
        "latency": 0,
        "agents": [
            {
                "match": {"path": "root"},
                "replies": [
                    {
                        "text": text,
                        "tool_calls": [
                            {
                                "name": "spawn_agents",
                                "arguments": {
                                    "tasks": [{"task": f"task {text}"}, {"task": "fail"}]
                                },
                            }
                        ],
                    },
                    {"text": f"answer {text}"},
                ],
            },
            {
                "match": {"path": "root/1"},
                "replies": [
                    {"tool_calls": [{"name": f"tool {text}", "arguments": {"x": text}}]},
                    {"tool_calls": [{"name": "submit_result", "arguments": {"result": text}}]},
                ],
            },
            {
                "match": {"path": "root/2"},
                "replies": [
                    {"tool_calls": [{"name": "submit_error", "arguments": {"error": text}}]}
                ],
            },
        ],
    }


def _invoke(runner: CliRunner, *args: str) -> Result:
    result = runner.invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        args,
        result.exception,
    )
    assert result.exit_code == 0, (args, result.output)
    return result


def _run_tree(runner: CliRunner, db: str, *args: str) -> tuple[Result, ConversationRow]:
    """`fanfold run --no-live --db DB ARGS...`, checked, and the one tree it made."""
    ran = _invoke(runner, "run", "--no-live", "--db", db, *args)
    with Store.open(Path(db)) as store:
        (root,) = store.list_roots()
    return ran, root


def _views(tmp: Path, text: str) -> dict[str, str]:
    """Run the tree of ``_script(text)`` and every view of it; their outputs."""
    db = str(tmp / "views.db")
    runner = CliRunner()
    outputs = {}
    script = _write(tmp / "s.json", _script(text))
    ran = _invoke(
        runner, "run", "--no-live", "--db", db, "--script", str(script), "--cwd", str(tmp), "go"
    )
    outputs["run"] = ran.output
    with Store.open(tmp / "views.db") as store:
        (root,) = store.list_roots()
        last = {c.id: c.last_seq for c in store.tree(root.id)}
    child = f"{root.id}.1"
    for name, args in {
        "ls": ["ls"],
        "show": ["show", root.id],
        "show --full": ["show", root.id, "--full"],
        "show --json": ["show", root.id, "--json"],
        "step": ["replay", root.id, "--step", "--tree"],
        "at root": ["replay", root.id, "--at", str(last[root.id])],
        "at child": ["replay", child, "--at", str(last[child])],
        "at child --full": ["replay", child, "--at", str(last[child]), "--full"],
        "verify": ["replay", root.id, "--verify", "--tree"],
        "export": ["export", root.id],
    }.items():
        outputs[name] = _invoke(runner, *args, "--db", db).output
    return outputs


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(st.characters(exclude_categories=()), min_size=1, max_size=12))
@example(text=HALF_EMOJI)
@example(text="{")  # braces in the text must not confuse finding the state document
@example(text="\x9b[31m\u202eevil\x1b]0;title\x07\r")
@example(text="\x1b[31m[red]not markup[/red] \udfff\ud800")
@example(text="one\u2028two\u2029three\u061c\x85")  # separators, a bidi mark, NEL
def test_every_view_renders_any_text_printable(tmp_path_factory: Any, text: str) -> None:
    tmp = tmp_path_factory.mktemp("views")
    outputs = _views(tmp, text)
    for name, output in outputs.items():
        assert not RAW.search(output), (name, output)
    # JSON views are valid JSON and keep the exact text (surrogates included).
    tree = json.loads(outputs["show --json"])
    first, second = tree["children"]
    assert (first["task"], first["outcome"], second["outcome"]) == (f"task {text}", text, text)
    assert tree["outcome"] == f"answer {text}"
    events = [
        decode_event(json.dumps(record["event"]))
        for line in outputs["export"].splitlines()
        if (record := json.loads(line))["record"] == "step"
    ]
    replies = [event.reply.text for event in events if isinstance(event, ModelReplied)]
    assert f"answer {text}" in replies
    at_child = outputs["at child --full"]
    # The state is the JSON document that starts on a line of its own (the lines above
    # it may show the text, braces included).
    state = json.loads(at_child[at_child.index("\n{\n") + 1 :])
    assert state["phase"]["result"] == text


def test_a_half_emoji_in_a_reply_runs_and_shows_in_a_real_process(tmp_path: Path) -> None:
    """Through a real pipe (UTF-8, strict): the run that crashed, then show."""
    script = _write(tmp_path / "half.json", _script(f"smile {HALF_EMOJI}!"))
    db = str(tmp_path / "half.db")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONIOENCODING"}
    command = [sys.executable, "-c", "from fanfold.cli import main; main()"]

    def fanfold(*args: str) -> str:
        done = subprocess.run(
            [*command, *args, "--db", db], capture_output=True, env=env, timeout=60, check=False
        )
        out, err = done.stdout.decode(), done.stderr.decode()
        assert done.returncode == 0 and "Traceback" not in err, (args, out, err)
        return out

    ran = fanfold("run", "--no-live", "--script", str(script), "--cwd", str(tmp_path), "go")
    assert "answer smile \\ud83d!" in ran
    with Store.open(Path(db)) as store:
        (root,) = store.list_roots()
        statuses = {c.id: c.status for c in store.tree(root.id)}
    assert statuses == {root.id: "idle", f"{root.id}.1": "completed", f"{root.id}.2": "failed"}
    shown = fanfold("show", root.id)
    assert f'Sub-agent {root.id}.1: "task smile \\ud83d!"' in shown
    assert "answer smile \\ud83d!" in shown


def test_printable_escapes_lone_surrogates_and_json_printable_keeps_json_valid() -> None:
    assert display.printable(f"a{HALF_EMOJI}b\udc00") == "a\\ud83db\\udc00"
    assert display.printable("😀 é") == "😀 é"
    text = json.dumps({"k": f"\x9b\u202e{HALF_EMOJI}é\x1b"}, ensure_ascii=False)
    shown = display.json_printable(text)
    assert not RAW.search(shown)
    assert json.loads(shown) == {"k": f"\x9b\u202e{HALF_EMOJI}é\x1b"}


# ------------------------------------------------------------------ typed failures


def test_show_gives_a_failed_childs_typed_kind_apart_from_its_text(tmp_path: Path) -> None:
    """A child that submits the error "timed out" did not time out: show says which."""
    script = _write(
        tmp_path / "fail.json",
        {
            "latency": 0,
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [
                        {
                            "tool_calls": [
                                {
                                    "name": "spawn_agents",
                                    "arguments": {
                                        "tasks": [
                                            {"task": "claims a timeout"},
                                            {"task": "really slow", "timeout": 0.3},
                                        ]
                                    },
                                }
                            ]
                        },
                        {"text": "done"},
                    ],
                },
                {
                    "match": {"path": "root/1"},
                    "replies": [
                        {
                            "tool_calls": [
                                {"name": "submit_error", "arguments": {"error": "timed out"}}
                            ]
                        }
                    ],
                },
                {"match": {"path": "root/2"}, "replies": [{"latency": 30, "text": "late"}]},
            ],
        },
    )
    db = str(tmp_path / "fail.db")
    runner = CliRunner()
    _, root = _run_tree(runner, db, "--script", str(script), "go")
    tree = json.loads(_invoke(runner, "show", root.id, "--json", "--db", db).output)
    claimed, slow = tree["children"]
    assert claimed["outcome"] == "timed out"
    assert claimed["failure"] == {"kind": "submitted_error", "reason": None}
    assert slow["failure"] == {"kind": "timed_out", "reason": "timeout"}
    assert tree["failure"] is None
    # Only a refusal has a refusal's fields (item 15 of issue 22).
    assert claimed["refusal"] is None and slow["refusal"] is None and tree["refusal"] is None
    shown = _invoke(runner, "show", root.id, "--db", db).output
    assert "submitted_error → timed out" in shown
    assert "timed_out (cancelled by timeout) → " in shown


def test_show_lists_the_tasks_a_failed_sequence_never_ran(tmp_path: Path) -> None:
    """Issue 12: a sequential call whose first step fails records the rest as
    not_run; they have no conversation, and show lists them under their parent (text
    and JSON) rather than leaving them out."""
    script = _write(
        tmp_path / "seq.json",
        {
            "latency": 0,
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [
                        {
                            "tool_calls": [
                                {
                                    "name": "spawn_agents",
                                    "arguments": {
                                        "mode": "sequential",
                                        "tasks": [
                                            {"task": "plan the work"},
                                            {"task": "build <b>it</b>"},
                                            {"task": "test it"},
                                        ],
                                    },
                                }
                            ]
                        },
                        {"text": "stopped"},
                    ],
                },
                {
                    "match": {"path": "root/1"},
                    "replies": [
                        {"tool_calls": [{"name": "submit_error", "arguments": {"error": "no"}}]}
                    ],
                },
            ],
        },
    )
    db = str(tmp_path / "seq.db")
    runner = CliRunner()
    _, root = _run_tree(runner, db, "--script", str(script), "go")
    tree = json.loads(_invoke(runner, "show", root.id, "--json", "--db", db).output)
    assert [c["id"] for c in tree["children"]] == [f"{root.id}.1"]
    assert [(n["id"], n["task"]) for n in tree["not_run"]] == [
        (f"{root.id}.2", "build <b>it</b>"),
        (f"{root.id}.3", "test it"),
    ]
    assert all(n["error"] for n in tree["not_run"])
    assert tree["children"][0]["not_run"] == []
    shown = _invoke(runner, "show", root.id, "--db", db).output
    assert f'never started {root.id}.2: "build <b>it</b>"' in shown
    assert f'never started {root.id}.3: "test it"' in shown


# ------------------------------------------------------------------ long texts


def _long_answer_tree(tmp_path: Path) -> tuple[str, str, str]:
    """A root whose answer is 2 MB of numbered lines: (db, root id, answer)."""
    answer = "".join(f"line {n:07d} of a long answer\n" for n in range(70_000))
    assert len(answer) > 2_000_000
    script = _write(
        tmp_path / "long.json",
        {"latency": 0, "agents": [{"match": {"path": "root"}, "replies": [{"text": answer}]}]},
    )
    db = str(tmp_path / "long.db")
    ran, root = _run_tree(CliRunner(), db, "--script", str(script), "go")
    assert len(ran.output) < 20_000 and "more characters" in ran.output
    return db, root.id, answer


def test_show_cuts_a_long_answer_and_full_prints_all_of_it_once(tmp_path: Path) -> None:
    db, root, answer = _long_answer_tree(tmp_path)
    runner = CliRunner()
    cut = _invoke(runner, "show", root, "--db", db).output
    assert len(cut) < 20_000
    assert f"more characters ({len(answer):,} in all); --full shows all of it" in cut
    assert "line 0000000 of a long answer" in cut and "line 0069999 of a long answer" in cut
    assert "line 0035000" not in cut
    full = _invoke(runner, "show", root, "--full", "--db", db).output
    assert full.count(answer) == 1 and full.count("line 0035000") == 1
    # --json is for programs: the whole text, always.
    as_json = json.loads(_invoke(runner, "show", root, "--json", "--db", db).output)
    assert as_json["outcome"] == answer
    # replay --at shows the state with its long strings cut, --full in full.
    at = _invoke(runner, "replay", root, "--at", "2", "--db", db).output
    assert len(at) < 40_000 and "more characters" in at
    at_full = _invoke(runner, "replay", root, "--at", "2", "--full", "--db", db).output
    assert at_full.count(json.dumps(answer)[1:-1]) == 1 and "more characters" not in at_full


def test_short_and_clip_cost_what_they_show() -> None:
    huge = "x" * 5_000_000
    assert display.short(huge, 10) == "x" * 9 + "…"
    assert display.short("a  b\n c", 10) == "a b c"
    assert display.short("a" * 10, 10) == "a" * 10
    shown = display.clip("h" * 10 + "m" * 100 + "t" * 10, limit=20)
    assert shown.startswith("h" * 10 + "\n… 100 more characters (120 in all)")
    assert shown.endswith("…\n" + "t" * 10)
    assert display.clip("x\x1b" * 100, full=True) == "x\\x1b" * 100


def test_show_says_which_child_never_called_submit_result(tmp_path: Path) -> None:
    """Issue 13, item 4: a chat model that ignores tools ends "completed" with its text;
    show (text and --json) and the parent's fan-in tell it never submitted."""
    spawn = {
        "name": "spawn_agents",
        "arguments": {"tasks": [{"task": "chatty"}, {"task": "proper"}]},
    }
    script = _write(
        tmp_path / "plain.json",
        {
            "latency": 0,
            "agents": [
                {"match": {"path": "root"}, "replies": [{"tool_calls": [spawn]}, {"text": "ok"}]},
                {"match": {"path": "root/1"}, "replies": [{"text": "I think it is 42"}]},
                {
                    "match": {"path": "root/2"},
                    "replies": [
                        {"tool_calls": [{"name": "submit_result", "arguments": {"result": "7"}}]}
                    ],
                },
            ],
        },
    )
    db = str(tmp_path / "plain.db")
    runner = CliRunner()
    _, root = _run_tree(runner, db, "--script", str(script), "go")
    with Store.open(Path(db)) as store:
        state = store.load_state(root.id)
    tree = json.loads(_invoke(runner, "show", root.id, "--json", "--db", db).output)
    chatty, proper = tree["children"]
    assert (chatty["phase"], chatty["outcome"], chatty["submitted"]) == (
        "Completed",
        "I think it is 42",
        False,
    )
    assert (proper["phase"], proper["submitted"]) == ("Completed", True)
    assert tree["submitted"] is None  # a root never submits
    shown = _invoke(runner, "show", root.id, "--db", db).output
    assert shown.count("completed without submit_result") == 1
    # The parent model was told as well, in the fan-in it read.
    fan_in = next(m for m in state.history if isinstance(m, ToolResultMessage))
    statuses = [e["status"] for e in json.loads(fan_in.result.content)["sub_agent_results"]]
    assert statuses == ["completed_without_submit", "completed"]


def test_show_types_a_refusal_and_a_cut_off_answer(tmp_path: Path) -> None:
    """Issue 13, item 1, offline: a scripted refusal ends its sub-agent ``refused``
    with the explanation; a root answer cut off at the token limit is kept and marked,
    in `run`'s output, in show and in show --json."""
    spawn = {"name": "spawn_agents", "arguments": {"tasks": [{"task": "declines"}]}}
    script = _write(
        tmp_path / "stops.json",
        {
            "latency": 0,
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [
                        {"tool_calls": [spawn]},
                        {"text": "The summary begins and then", "stop_reason": "max_tokens"},
                    ],
                },
                {
                    "match": {"path": "root/1"},
                    "replies": [
                        {"text": "", "stop_reason": "refusal", "stop_details": "not allowed"}
                    ],
                },
            ],
        },
    )
    db = str(tmp_path / "stops.db")
    runner = CliRunner()
    ran, root = _run_tree(runner, db, "--script", str(script), "go")
    assert "cut off at the output token limit" in ran.output
    tree = json.loads(_invoke(runner, "show", root.id, "--json", "--db", db).output)
    (child,) = tree["children"]
    assert tree["truncated"] is True and child["truncated"] is False
    assert child["failure"] == {"kind": "refused", "reason": None}
    assert child["outcome"] == "the model refused the request: not allowed"
    shown = _invoke(runner, "show", root.id, "--db", db).output
    assert "refused" in shown and "cut off at the output token limit" in shown


def test_show_counts_the_tokens_of_failed_attempts(tmp_path: Path) -> None:
    """Issue 13, item 2: three failed attempts billed 1,283 tokens each are 3,849
    tokens in show, not 0 (the fourth attempt succeeds and reports none)."""
    billed = {"input_tokens": 1200, "output_tokens": 83}
    failure = {"kind": "server_error", "retry_after": 0, "usage": billed}
    script = _write(
        tmp_path / "billed.json",
        {
            "latency": 0,
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [{"text": "finally", "fail_first": [failure] * 3}],
                }
            ],
        },
    )
    db = str(tmp_path / "billed.db")
    runner = CliRunner()
    _, root = _run_tree(runner, db, "--script", str(script), "go")
    tree = json.loads(_invoke(runner, "show", root.id, "--json", "--db", db).output)
    assert (tree["outcome"], tree["tokens"], tree["tree_tokens"]) == ("finally", 3849, 3849)
    assert "3849 tokens" in _invoke(runner, "show", root.id, "--db", db).output


def test_the_live_view_counts_down_to_a_retry_and_names_the_error() -> None:
    """Issue 13, item 9: not the phase name AwaitingRetry, but the error kind and the
    seconds left until the next attempt, so a long Retry-After does not look hung."""
    now = [100.0]
    view = display.TreeView(clock=lambda: now[0])
    before = steps(root(Limits(max_attempts=3)), user("hi"))
    error = ModelError(ErrorKind.RATE_LIMIT, "slow down", retry_after=45.0)
    after, effects = step(before, failed(before, error))
    assert any(isinstance(e, ScheduleRetry) and e.delay == 45.0 for e in effects)
    view.observe(before, after, failed(before, error), effects)

    def rendered() -> str:
        console = Console(width=200, file=io.StringIO(), force_terminal=False)
        console.print(view.render())
        assert isinstance(console.file, io.StringIO)
        return console.file.getvalue()

    shown = rendered()
    assert "AwaitingRetry" not in shown
    assert "rate limited, retrying in 45s (attempt 2)" in shown
    now[0] += 30.5
    assert "retrying in 15s" in rendered()
    now[0] += 60
    assert "retrying in 0s" in rendered()  # overdue: never a negative count
    assert display.describe(after) == "rate limited, waiting to retry (attempt 2)"


def test_the_live_view_says_when_a_parent_summarises_and_why_it_waits() -> None:
    """Context mode summary: the parent makes a summary call while its children wait;
    a failed attempt counts down to its retry, with the error kind."""
    now = [100.0]
    view = display.TreeView(clock=lambda: now[0])
    state = steps(root(Limits(max_attempts=3)), user("hi"))
    call = ToolCall.of("s", "spawn_agents", {"tasks": [{"task": "t", "context": "summary"}]})
    before = state
    state, effects = step(state, ModelReplied(0, ModelReply("", (call,))))
    view.observe(before, state, ModelReplied(0, ModelReply("")), effects)
    assert display.describe(state) == "summarising for sub-agents"
    summary_call = next(e.call for e in effects if isinstance(e, CallModel))
    error = ModelError(ErrorKind.SERVER_ERROR, "busy", retry_after=20.0)
    event = ModelFailed(summary_call, error)
    after, effects = step(state, event)
    view.observe(state, after, event, effects)
    console = Console(width=200, file=io.StringIO(), force_terminal=False)
    console.print(view.render())
    assert isinstance(console.file, io.StringIO)
    shown = console.file.getvalue()
    assert "summary for sub-agents: server error, retrying in 20s (attempt 2)" in shown


def test_show_gives_cached_tokens_and_costs_at_the_profiles_prices(tmp_path: Path) -> None:
    """Issue 13, items 6 and 7, over loopback: the server reports cached prompt tokens
    (``prompt_tokens_details.cached_tokens``); the profiles have prices; show gives each
    agent's cached tokens and cost, and the tree's cost, from the log and the recorded
    configuration alone. A child on a profile without prices leaves the tree's cost out."""
    from fakeserver import FakeServer, Json, first_user_contains

    def completion(text: str, calls: list[dict[str, Any]], usage: dict[str, Any]) -> Json:
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = calls
        finish = "tool_calls" if calls else "stop"
        choice = {"index": 0, "message": message, "finish_reason": finish}
        return Json({"id": "x", "object": "chat.completion", "choices": [choice], "usage": usage})

    spawn = {
        "id": "call_s",
        "type": "function",
        "function": {
            "name": "spawn_agents",
            "arguments": json.dumps({"tasks": [{"task": "cheap one"}]}),
        },
    }
    submit = {
        "id": "call_r",
        "type": "function",
        "function": {"name": "submit_result", "arguments": json.dumps({"result": "done"})},
    }
    cached = {"prompt_tokens": 2000, "completion_tokens": 100}
    cached["prompt_tokens_details"] = {"cached_tokens": 1500}  # type: ignore[assignment]
    with FakeServer() as server:
        for sub_prices, expect_tree in (("input = 0.5\noutput = 1.0\n", True), ("", False)):
            server.when(
                first_user_contains("cost me"),
                completion("", [spawn], cached),
                completion("all done", [], {"prompt_tokens": 3000, "completion_tokens": 50}),
            )
            server.when(
                first_user_contains("cheap one"),
                completion("", [submit], {"prompt_tokens": 1000, "completion_tokens": 10}),
            )
            config = tmp_path / f"fanfold-{expect_tree}.toml"
            priced_sub = f"[profiles.small.prices]\n{sub_prices}" if sub_prices else ""
            config.write_text(
                "default = 'big'\nsub_agents = 'small'\n"
                f"[profiles.big]\nprovider = 'openai'\nbase_url = '{server.url}/v1'\n"
                "model = 'big-1'\nstream = false\n"
                "[profiles.big.prices]\ninput = 3.0\ncached_input = 0.3\noutput = 15.0\n"
                f"[profiles.small]\nprovider = 'openai'\nbase_url = '{server.url}/v1'\n"
                f"model = 'small-1'\nstream = false\n{priced_sub}",
                encoding="utf-8",
            )
            db = str(tmp_path / f"cost-{expect_tree}.db")
            runner = CliRunner()
            _, root = _run_tree(runner, db, "--config", str(config), "cost me")
            tree = json.loads(_invoke(runner, "show", root.id, "--json", "--db", db).output)
            (child,) = tree["children"]
            assert (tree["input_tokens"], tree["cached_input_tokens"]) == (5000, 1500)
            # Root: 3500 fresh input at $3, 1500 cached at $0.3, 150 output at $15 / M.
            root_cost = (3500 * 3.0 + 1500 * 0.3 + 150 * 15.0) / 1e6
            assert tree["cost"] == pytest.approx(root_cost)
            if expect_tree:
                assert child["cost"] == pytest.approx((1000 * 0.5 + 10 * 1.0) / 1e6)
                assert tree["tree_cost"] == pytest.approx(root_cost + child["cost"])
            else:
                assert child["cost"] is None and tree["tree_cost"] is None
            shown = _invoke(runner, "show", root.id, "--db", db).output
            assert "1500 input from the prompt cache" in shown
            assert ("cost: $" in shown) is expect_tree
        # A tree whose provenance mark does not verify (copied, edited, imported) names
        # files of someone else's choosing: show reads none of them, and gives no cost.
        import sqlite3

        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE trees SET mark = 'forged'")
        conn.close()
        tree = json.loads(_invoke(runner, "show", root.id, "--json", "--db", db).output)
        assert tree["cost"] is None and tree["tree_cost"] is None
        assert tree["cached_input_tokens"] == 1500  # the log itself is still shown


def _summary_script(path: Path, summary: dict[str, Any]) -> str:
    spawn = {
        "name": "spawn_agents",
        "arguments": {"tasks": [{"task": "fix it", "context": "summary"}, {"task": "plain"}]},
    }
    return str(
        _write(
            path,
            {
                "latency": 0,
                "agents": [
                    {
                        "match": {"path": "root"},
                        "replies": [
                            {"text": "delegating", "tool_calls": [spawn]},
                            {"text": "done"},
                        ],
                        "summary": summary,
                    },
                    {"match": {"path": "root/*"}, "replies": [{"text": "did {{task}}"}]},
                ],
            },
        )
    )


def test_show_gives_summary_children_their_mode_and_lists_those_left_without_one(
    tmp_path: Path,
) -> None:
    """A run whose summary is made: its child starts with it and `show` names the
    mode; a run whose summary call fails for good: its child never starts, is listed
    under the root with the call's error kind, and its sibling's work is kept."""
    runner = CliRunner()
    db = str(tmp_path / "summary.db")
    made = _summary_script(tmp_path / "made.json", {"text": "The goal: {{task}}"})
    _invoke(runner, "run", "--no-live", "--db", db, "--script", made, "go")
    failing = _summary_script(
        tmp_path / "failing.json",
        {"fail_first": [{"kind": "auth", "message": "bad key"}], "text": "never"},
    )
    _invoke(runner, "run", "--no-live", "--db", db, "--script", failing, "go again")
    with Store.open(Path(db)) as store:
        first, second = sorted(store.list_roots(), key=lambda r: r.created_at)
        child = store.load_state(f"{first.id}.1")
    assert child.history[:2] == (
        UserMessage(SUMMARY_HEADER + "The goal: go"),
        UserMessage("fix it"),
    )
    tree = json.loads(_invoke(runner, "show", first.id, "--json", "--db", db).output)
    assert [(c["id"], c["context"]) for c in tree["children"]] == [
        (f"{first.id}.1", "summary"),
        (f"{first.id}.2", "task_only"),
    ]
    assert tree["not_run"] == []
    tree = json.loads(_invoke(runner, "show", second.id, "--json", "--db", db).output)
    assert [c["id"] for c in tree["children"]] == [f"{second.id}.2"]
    assert tree["children"][0]["outcome"] == "did plain"
    ((never),) = tree["not_run"]
    assert never["id"] == f"{second.id}.1"
    assert never["error"].startswith("not started: no summary of its parent's conversation")
    shown = _invoke(runner, "show", second.id, "--db", db).output
    assert f'never started {second.id}.1: "fix it"' in shown
    for tree_root in (first, second):
        verify = _invoke(runner, "replay", tree_root.id, "--db", db, "--verify", "--tree")
        assert verify.exit_code == 0


def test_run_may_leave_context_modes_out(tmp_path: Path) -> None:
    """`--context-modes task_only`: a task asking for a summary is refused (an error
    result naming the modes offered), nothing is summarised; an unknown mode is a
    one-line error, no traceback and no tree."""
    runner = CliRunner()
    db = str(tmp_path / "modes.db")
    made = _summary_script(tmp_path / "made.json", {"text": "never asked"})
    _, root = _run_tree(runner, db, "--script", made, "--context-modes", "task_only", "go")
    with Store.open(Path(db)) as store:
        state = store.load_state(root.id)
    assert state.limits.context_modes == ("task_only",)
    (fan_in,) = [m.result for m in state.history if isinstance(m, ToolResultMessage)]
    assert "'context' must be task_only" in fan_in.content
    bad = runner.invoke(
        cli,
        [
            "run",
            "--no-live",
            "--db",
            str(tmp_path / "bad.db"),
            "--script",
            made,
            "--context-modes",
            "full,everything",
            "go",
        ],
    )
    assert bad.exit_code != 0
    assert bad.exception is None or isinstance(bad.exception, SystemExit)
    assert "--context-modes: unknown mode(s) everything" in bad.output
    assert "Traceback" not in bad.output
    assert not (tmp_path / "bad.db").exists()


def test_show_json_never_writes_nan_or_infinity_from_a_log(tmp_path: Path) -> None:
    """Issue 22, item 6: a log on disk (old, or edited) may hold a time SQLite reads
    back as infinity; `show --json` wrote `Infinity`, which is not JSON. Now null, and
    the text view still renders."""
    import sqlite3

    db = str(tmp_path / "inf.db")
    runner = CliRunner()
    script = _write(
        tmp_path / "s.json",
        {"latency": 0, "agents": [{"match": {"path": "root"}, "replies": [{"text": "done"}]}]},
    )
    _, root = _run_tree(runner, db, "--script", str(script), "hello")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE conversations SET updated_at = 9e999")
    conn.close()
    output = _invoke(runner, "show", root.id, "--json", "--db", db).output

    def no_constant(name: str) -> None:
        raise AssertionError(f"not JSON: {name}")

    data = json.loads(output, parse_constant=no_constant)
    assert data["duration"] is None
    assert "done" in _invoke(runner, "show", root.id, "--db", db).output


# Anthropic's stop_details of a refusal: an object the log keeps as canonical JSON.
CYBER = json.dumps({"category": "cyber", "explanation": "I can't help with that exploit."})


def test_a_refusal_shows_its_category_and_explanation_not_json(tmp_path: Path) -> None:
    """Issue 22, item 15: a refusal whose stop_details is Anthropic's object is shown
    as `refused (cyber): <explanation>` by run (root and live view) and show; show
    --json gives the category and explanation as fields, the outcome as recorded."""
    spawn = {"name": "spawn_agents", "arguments": {"tasks": [{"task": "declines"}]}}
    refused = {"text": "", "stop_reason": "refusal", "stop_details": CYBER}
    script = _write(
        tmp_path / "refuse.json",
        {
            "latency": 0,
            "agents": [
                {"match": {"path": "root"}, "replies": [{"tool_calls": [spawn]}, refused]},
                {"match": {"path": "root/1"}, "replies": [refused]},
            ],
        },
    )
    db = str(tmp_path / "refuse.db")
    runner = CliRunner()
    ran = runner.invoke(cli, ["run", "--no-live", "--db", db, "--script", str(script), "go"])
    assert ran.exit_code == 1, ran.output
    # The root's error and, in the tree drawn once at the end, the sub-agent's.
    assert "refused (cyber): I can't help with that exploit." in ran.output
    assert "failed: refused (cyber)" in ran.output
    assert '"category"' not in ran.output and "{" not in ran.output
    with Store.open(Path(db)) as store:
        (root,) = store.list_roots()
    shown = _invoke(runner, "show", root.id, "--db", db).output
    assert "refused (cyber) → I can't help with that exploit." in shown
    assert '"category"' not in shown
    tree = json.loads(_invoke(runner, "show", root.id, "--json", "--db", db).output)
    (child,) = tree["children"]
    for node in (tree, child):
        assert node["failure"] == {"kind": "refused", "reason": None}
        assert node["refusal"] == {
            "category": "cyber",
            "explanation": "I can't help with that exploit.",
        }
        assert node["outcome"] == f"the model refused the request: {CYBER}"


def test_a_refusal_in_plain_words_is_its_own_explanation(tmp_path: Path) -> None:
    """A provider that explains in words (OpenAI's `refusal`, a scripted one): no
    category, the words as the explanation."""
    script = _write(
        tmp_path / "words.json",
        {
            "latency": 0,
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [{"stop_reason": "refusal", "stop_details": "not allowed"}],
                }
            ],
        },
    )
    db = str(tmp_path / "words.db")
    runner = CliRunner()
    ran = runner.invoke(cli, ["run", "--no-live", "--db", db, "--script", str(script), "go"])
    assert "refused: not allowed" in ran.output
    with Store.open(Path(db)) as store:
        (root,) = store.list_roots()
    tree = json.loads(_invoke(runner, "show", root.id, "--json", "--db", db).output)
    assert tree["refusal"] == {"category": None, "explanation": "not allowed"}


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_a_retry_countdown_names_its_error_in_words(kind: ErrorKind) -> None:
    """Issue 22, item 15: `server error, retrying in 1s`, never `server_error error`."""
    words = display.retried(kind)
    assert "_" not in words and "error error" not in words


def test_ls_marks_forks_and_imported_trees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22, item 18: `ls` listed a fork and an imported tree like any other. An
    origin column says `fork of ID@SEQ` or `imported`; `ls --json` gives origin,
    forked_from, forked_at_seq and imported_from."""
    script = _write(
        tmp_path / "s.json",
        {"latency": 0, "agents": [{"match": {"path": "root"}, "replies": [{"text": "hi"}]}]},
    )
    db = str(tmp_path / "ls.db")
    runner = CliRunner()
    _, root = _run_tree(runner, db, "--script", str(script), "go")
    fork = _invoke(runner, "fork", root.id, "--at", "2", "--id", "f1", "--db", db)
    assert fork.stdout.strip() == "f1"
    exported = tmp_path / "tree.jsonl"
    other = str(tmp_path / "other.db")
    _invoke(runner, "export", root.id, "-o", str(exported), "--db", db)
    _invoke(runner, "import", str(exported), "--db", other)
    _invoke(runner, "fork", root.id, "--at", "2", "--id", "f2", "--db", other)
    # The console's width is fixed when it is made (rich reads COLUMNS then), so set it.
    from fanfold.cli import output

    monkeypatch.setattr(output.console, "width", 200)
    listed = runner.invoke(cli, ["ls", "--db", other]).output
    lines = {line.split("│")[1].strip(): line for line in listed.splitlines() if "│" in line}
    assert "imported" in lines[root.id] and "fork of" not in lines[root.id]
    assert f"fork of {root.id}@2" in lines["f2"]
    here = runner.invoke(cli, ["ls", "--db", db]).output
    mine = next(line for line in here.splitlines() if line.startswith(f"│ {root.id}"))
    assert "imported" not in mine and "fork of" not in mine
    as_json = json.loads(_invoke(runner, "ls", "--json", "--db", other).output)
    by_id = {item["id"]: item for item in as_json}
    assert by_id[root.id]["origin"] == "imported"
    assert by_id[root.id]["imported_from"] == str(exported.resolve())
    assert (by_id["f2"]["origin"], by_id["f2"]["forked_from"], by_id["f2"]["forked_at_seq"]) == (
        "fork",
        root.id,
        2,
    )
    assert by_id["f2"]["imported_from"] is None
    assert {item["sub_agents"] for item in as_json} == {0}
    plain = json.loads(_invoke(runner, "ls", "--json", "--db", db).output)
    assert {(i["id"], i["origin"]) for i in plain} == {(root.id, "run"), ("f1", "fork")}
    (tmp_path / "empty.db").touch()  # a run stopped before its first write
    empty = _invoke(runner, "ls", "--json", "--db", str(tmp_path / "empty.db")).output
    assert json.loads(empty) == []
