"""``fanfold transcript``: one agent's conversation read from a real log file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from db_scenarios import BASH, Driver, fan_out
from replay_helpers import write

from fanfold.cli import cli
from fanfold.statemachine import ConversationCreated, ToolCall, UserMessaged

# Model and tool text that would act on a terminal written raw: an OSC retitle, a CSI
# colour, a bidi override, a lone carriage return; and backticks to close a fence.
HOSTILE = "a\x1b]0;pwned\x07b \x1b[31mred\u202e\rover ```` fence"


def run(*args: str | Path) -> Result:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


@pytest.fixture
def db(tmp_path: Path) -> Path:
    driver = Driver(snapshot_every=2)
    fan_out(driver)  # r delegates to r.1 (bash), r.2 (a rate limit, retried), r.3 (error)
    driver.create(ConversationCreated("h", cwd="/work", tools=(BASH,), system_prompt="be brief"))
    driver.feed("h", UserMessaged(f"user says {HOSTILE}"))
    driver.reply("h", f"model says {HOSTILE}", ToolCall.of("h-b", "bash", {"command": HOSTILE}))
    driver.finish_tool("h", f"tool says {HOSTILE}")
    driver.reply("h", "done")
    path = tmp_path / "log.db"
    write(path, driver.steps)
    return path


def test_a_root_reads_in_order_with_calls_results_and_outcomes(db: Path) -> None:
    result = run("transcript", "r", "--db", db)
    assert result.exit_code == 0, result.output
    out = result.stdout
    order = [
        "transcript of r (root)",
        "seq 0 · system prompt: (empty)",
        "seq 1 · user",
        "review this repository",
        "seq 2 · usage: model call 0",
        "12 input tokens, 7 output tokens",
        "seq 2 · assistant",
        "delegating",
        "seq 2 · tool call: spawn_agents r-spawn",
        '"task": "review part 0"',
        "sub-agent: r.1 completed",
        "sub-agent: r.3 failed (submitted_error)",
        "tool result: spawn_agents r-spawn",
        "all reviewed: 2 fine, 1 failed",
    ]
    positions = [out.find(text) for text in order]
    assert -1 not in positions, (order, positions, out)
    assert positions == sorted(positions), out


def test_a_sub_agent_by_its_place_shows_its_model_errors_and_outcome(db: Path) -> None:
    retried = run("transcript", "r", "--agent", "root/2", "--db", db).stdout
    assert "transcript of r.2 (root/2, sub-agent of r)" in retried
    assert "model error: model call 1: rate_limit" in retried and "slow down" in retried
    assert "timer" in retried and "answer 2 after a retry" in retried
    assert "outcome: completed" in retried
    failed = run("transcript", "r", "--agent", "3", "--db", db).stdout
    assert "transcript of r.3" in failed and "outcome: failed (submitted_error)" in failed
    by_id = run("transcript", "r.1", "--db", db).stdout
    assert "tool result: bash r.1-b" in by_id and "README.md" in by_id


@pytest.mark.parametrize("form", [[], ["--markdown"], ["--json"], ["--full"]])
def test_every_format_escapes_recorded_text(db: Path, form: list[str]) -> None:
    result = run("transcript", "h", *form, "--db", db)
    assert result.exit_code == 0, result.output
    out = result.stdout
    for raw in ("\x1b", "\x07", "\u202e", "\r"):
        assert raw not in out, (raw, out)
    if form != ["--json"]:
        assert "\\x1b]0;pwned\\x07b" in out and "\\u202e\\x0dover" in out
    else:
        read = json.loads(out)
        texts = [e["text"] for e in read["entries"]]
        assert f"tool says {HOSTILE}" in texts  # full and exact once parsed
        assert read["path"] == "root" and read["phase"] == "Idle"


def test_markdown_fences_outlast_the_backticks_of_the_text(db: Path) -> None:
    out = run("transcript", "h", "--markdown", "--db", db).stdout
    assert out.startswith("# transcript of h (root)\n\n- phase: Idle")
    lines = out.split("\n")
    start = lines.index("### seq 3 · tool result: bash h-b")
    fence = lines[start + 2]
    assert fence == "`````"  # the text holds a run of four
    assert lines[start + 3].startswith("tool says a\\x1b") and lines[start + 4] == fence


def test_an_imported_tree_reads_like_any_other(db: Path, tmp_path: Path) -> None:
    exported = tmp_path / "tree.jsonl"
    assert run("export", "r", "-o", exported, "--db", db).exit_code == 0
    other = tmp_path / "other.db"
    imported = run("import", exported, "--db", other)
    assert imported.exit_code == 0, imported.output
    root = imported.stdout.strip()
    out = run("transcript", root, "--agent", "1", "--db", other).stdout
    assert "tool result: bash" in out and "README.md" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "no conversation 'nope' in the database"),
        (["r", "--agent", "root/9"], "no agent 'root/9' in the tree of 'r'"),
        (["r", "--agent", "h"], "no agent 'h' in the tree of 'r'"),
        (["r", "--markdown", "--json"], "give one of --markdown and --json"),
    ],
)
def test_bad_requests_are_one_line(db: Path, args: list[str], message: str) -> None:
    result = run("transcript", *args, "--db", db)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
