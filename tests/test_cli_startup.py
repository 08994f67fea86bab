"""What a command imports to start (issue 36: every command starts fast).

`ls` and `show` read the log (SQLite, the store, the codec, the reducer's types) and
print with rich; they import neither the runtime nor the providers, Trio, httpx, the
tools or the schema validators. `ls --help` and `show --help` import none of those and
not the log or rich either. Each check runs the commands in a fresh interpreter and looks
at ``sys.modules`` afterwards (no timing: the instruction counts are in
bench/bench_startup.py and bench/README.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fanfold.cli import cli

# Top-level packages, and fanfold's own modules (prefixes), never imported by ls/show.
NEVER = ("trio", "httpx", "jsonschema", "pydantic", "structlog", "mcp", "psycopg")
NEVER_FANFOLD = (
    "fanfold.runtime.",
    "fanfold.providers",
    "fanfold.tools",
    "fanfold.mcp",
    "fanfold.agents",
    "fanfold.trace",
    "fanfold.serve",
    "fanfold.cli.models",
    "fanfold.cli.turns",
)
# ... except the runtime's lock-file probe, which ls uses (no Trio in it).
ALLOWED = ("fanfold.runtime.presence",)
# What a command's --help does not import either: the log, the reducer, the views.
NOT_FOR_HELP = ("rich", "sqlite3", "sqlite_utils", "fanfold.db", "fanfold.statemachine")

RUN_THEN_LIST = """
import sys
from fanfold.cli import cli
for args in {commands!r}:
    try:
        cli.main(args, prog_name="fanfold", standalone_mode=False)
    except SystemExit as exc:
        assert not exc.code, (args, exc.code)
print("MODULES", " ".join(sorted(sys.modules)))
"""


def _modules(*commands: list[str]) -> tuple[str, list[str]]:
    """The output of ``commands`` run in one fresh interpreter, and its modules."""
    code = RUN_THEN_LIST.format(commands=list(commands))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    head, _, modules = done.stdout.rpartition("MODULES ")
    return head, modules.split()


def _heavy(modules: list[str], extra: tuple[str, ...] = ()) -> list[str]:
    return [
        m
        for m in modules
        if m not in ALLOWED
        and (
            m.split(".")[0] in NEVER + extra
            or m.startswith(NEVER_FANFOLD + extra)
            or any(m == e for e in extra)
        )
    ]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A log holding one answered tree (a scripted reply), and its root's id."""
    folder = tmp_path_factory.mktemp("startup")
    script = folder / "script.json"
    reply = {"text": "hello", "usage": {"input_tokens": 3, "output_tokens": 1}}
    agents = [{"match": {"path": "root"}, "replies": [reply]}]
    script.write_text(json.dumps({"latency": 0, "agents": agents}))
    db = folder / "log.db"
    args = ["run", "--db", str(db), "--script", str(script), "--cwd", str(folder), "hi"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    listed = CliRunner().invoke(cli, ["ls", "--db", str(db), "--json"])
    return db, json.loads(listed.output)[0]["id"]


def test_ls_and_show_import_neither_the_runtime_nor_providers_trio_or_httpx(
    recorded: tuple[Path, str],
) -> None:
    db, root = recorded
    out, modules = _modules(["ls", "--db", str(db)], ["show", root, "--db", str(db)])
    assert root in out and "hello" in out  # listed, and shown with its answer
    # sqlite_utils only creates tables (a migration): reading a current log needs sqlite3.
    assert _heavy(modules, ("fanfold.cli.run_commands", "sqlite_utils")) == []
    assert "sqlite3" in modules and "fanfold.db.store" in modules  # they did read the log
    # A log without forks is listed, and a tree without a refusal shown, without
    # fanfold.replay (its package imports every replay module): ls reads a fork's
    # lineage only for a fork's row, the views read a refusal only for a refusal.
    assert [m for m in modules if m.startswith("fanfold.replay")] == []
    # show reads each state from its snapshot (a tree at rest): no reducer function.
    assert "fanfold.statemachine.transition" not in modules


LAZY_NAMES = """
import types
import fanfold.db.fingerprint, fanfold.statemachine.transition  # the submodules first
from fanfold.db import fingerprint, step_fingerprint, decode_event, SCHEMA_VERSION
from fanfold.statemachine import transition, start, fold
import fanfold.db as db, fanfold.statemachine as sm
names = (fingerprint, step_fingerprint, decode_event, transition, start, fold,
         db.fingerprint, sm.transition)
assert all(isinstance(f, types.FunctionType) for f in names), names
assert fingerprint.__module__ == "fanfold.db.fingerprint"
assert transition.__module__ == "fanfold.statemachine.transition"
assert SCHEMA_VERSION == __import__("fanfold.db.codec").db.codec.SCHEMA_VERSION
print("ok")
"""


def test_the_lazy_names_are_what_they_were() -> None:
    """`fanfold.db` and `fanfold.statemachine` import the codec, the fingerprints and
    the reducer's functions when first named; `fingerprint` and `transition` are still
    the functions although submodules have those names, whichever is imported first."""
    done = subprocess.run(
        [sys.executable, "-c", LAZY_NAMES], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_ls_imports_neither_the_codec_nor_the_reducer(recorded: tuple[Path, str]) -> None:
    """`ls` decodes no event: each root's row, and for a root at rest its last turn's
    outcome from the column the store wrote with that turn (migration 7). So neither
    the codec, the fingerprints nor the reducer is imported (1.05 G of its 1.12 G,
    bench/README.md)."""
    db, root = recorded
    out, modules = _modules(["ls", "--db", str(db)], ["ls", "--db", str(db), "--json"])
    assert root in out and '"last_turn": "answered"' in out
    heavy = ("fanfold.db.codec", "fanfold.db.fingerprint", "fanfold.statemachine")
    assert [m for m in modules if m.startswith(heavy)] == []
    assert "fanfold.db.store" in modules  # it did read the log


def test_the_views_read_a_refusal_as_the_replay_renderer_does() -> None:
    """``cli.display.model_refusal`` imports ``fanfold.replay.render`` only for a
    failure of kind ``refused``, and reads every kind as the renderer does."""
    from fanfold.cli.display import model_refusal
    from fanfold.replay import render
    from fanfold.statemachine import ErrorKind

    texts = (
        "the model refused the request: no",
        'the model refused to summarise: {"category": "cyber", "explanation": "x"}',
        "{}",
        "",
    )
    for kind in (*ErrorKind, "refused", "timeout"):
        for text in texts:
            assert model_refusal(kind, text) == render.model_refusal(kind, text), (kind, text)
    assert model_refusal(ErrorKind.REFUSED, "no") is not None


def test_the_version_and_the_command_list_import_no_command() -> None:
    out, modules = _modules(["--version"], ["--help"])
    assert "Commands:" in out and "Serve delegation over MCP" in out
    # `fanfold --help` lists every command without importing one.
    assert [m for m in modules if m.startswith("fanfold.cli.") and "command" in m] == []
    assert _heavy(modules, (*NOT_FOR_HELP, "attrs", "attr")) == []


def test_the_help_of_every_command_imports_nothing_heavy() -> None:
    """`fanfold CMD --help` of every command (issue 36: <= 0.4 G instructions each, the
    counts in bench/README.md) imports its command's module and what the options
    need, never the log, the reducer, the views, the runtime or the providers: each
    of those is imported by the functions that use it."""
    from fanfold.cli import COMMANDS

    out, modules = _modules(*([name, "--help"] for name in COMMANDS))
    assert out.count("Usage: fanfold ") == len(COMMANDS)
    assert "List root conversations" in out and "Print a conversation" in out
    # Nor attrs (0.09 G of ls --help with show's classes, bench/README.md): show's attrs
    # classes are in cli.show_view, imported when a tree is shown.
    assert _heavy(modules, (*NOT_FOR_HELP, "attrs", "attr")) == []


def test_user_errors_are_found_among_the_modules_imported() -> None:
    """The one-line errors are named by module and class (nothing is imported to
    classify an exception): each name is a class of that module, an exception."""
    import importlib

    from fanfold.cli.errors import _USER_ERROR_CLASSES, user_error_types

    for module, name in _USER_ERROR_CLASSES:
        found = getattr(importlib.import_module(module), name)
        assert isinstance(found, type) and issubclass(found, Exception), (module, name)
        assert found in user_error_types()


def test_the_summaries_of_the_command_list_are_the_commands_own_help() -> None:
    """`fanfold --help` shortens SUMMARIES as click shortens each command's help: the
    same text at every width (a command's docstring changed without its summary fails)."""
    import click

    from fanfold.cli import COMMANDS, SUMMARIES

    assert list(SUMMARIES) == list(COMMANDS)
    context = click.Context(cli)
    for name, summary in SUMMARIES.items():
        command = cli.get_command(context, name)
        assert command is not None and not command.hidden and not command.deprecated
        stand_in = click.Command(name, help=summary)
        for limit in range(10, 400, 3):
            assert stand_in.get_short_help_str(limit) == command.get_short_help_str(limit)
