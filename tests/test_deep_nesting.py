"""Untrusted input nested too deeply (issue 22.5): agent files, configuration files and
JSON (script files, exports, logs, a model's tool calls, a server's replies) fail with
their typed error, one line for a CLI user, never a RecursionError."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fanfold.agents.definitions import MAX_DEPTH, parse_definition
from fanfold.cli import cli
from fanfold.db import codec
from fanfold.db.errors import CodecError
from fanfold.providers.base import ProviderError
from fanfold.providers.config import ConfigError, read_config_file
from fanfold.providers.description import DescriptionError, ProviderDescription
from fanfold.providers.scripted import ScriptedProvider, ScriptError
from fanfold.providers.wire import parse_error_body, tool_arguments
from fanfold.statemachine import ToolCall

# Around the interpreter's recursion limit (1000) a JSON text may parse and then fail
# in the code that walks or writes it back (for a model's tool arguments, at one depth
# only); far beyond, the parser itself fails. Every depth near the limit is tried.
DEPTHS = [300, 500, 700, *range(800, 1011), 2000, 100_000]


def _deep(n: int) -> str:
    return "[" * n + "]" * n


# ------------------------------------------------------------------ agent files


def _front(value: str) -> str:
    return f"---\nname: deep\ndescription: d\ntools: {value}\n---\nbody\n"


@pytest.mark.parametrize(
    "value",
    [
        _deep(2000),
        _deep(20_000),
        "{a: " * 5000 + "}" * 5000,
        "\n" + "".join(" " * i + "- \n" for i in range(1, 400)),
        _deep(MAX_DEPTH + 1),
    ],
    ids=["flow-2000", "flow-20000", "mappings", "block", "one-too-deep"],
)
def test_an_agent_file_nested_too_deeply_is_a_problem_on_its_line(value: str) -> None:
    definition, problems = parse_definition(_front(value), "deep.md")
    assert definition is None
    ((line, message),) = [(p.line, p.message) for p in problems]
    assert message == f"nested more than {MAX_DEPTH} levels deep"
    # The line where the level too many begins.
    assert line == (4 if value.startswith(("[", "{")) else 4 + MAX_DEPTH)


def test_an_agent_file_nested_as_deep_as_allowed_is_read() -> None:
    # tools: [[...["read"]...]] is not a list of rules, but the depth is not the problem.
    text = _front("[" * (MAX_DEPTH - 1) + '"read"' + "]" * (MAX_DEPTH - 1))
    _, problems = parse_definition(text, "deep.md")
    assert problems and all("nested" not in p.message for p in problems)


def _agents_env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}


def test_fanfold_agents_and_run_report_a_deep_agent_file_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / ".fanfold" / "agents"
    folder.mkdir(parents=True)
    (folder / "deep.md").write_text(_front(_deep(20_000)), encoding="utf-8")
    runner = CliRunner()
    env = _agents_env(tmp_path)
    listed = runner.invoke(cli, ["agents", "--cwd", str(tmp_path)], env=env)
    assert listed.exception is None or isinstance(listed.exception, SystemExit)
    assert listed.exit_code == 1
    assert "deep.md:4: nested more than 16 levels deep" in " ".join(listed.output.split())
    assert "Traceback" not in listed.output
    # A run in that folder goes on without the file, saying so once.
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps({"agents": [{"match": {"path": "root"}, "replies": [{"text": "fine"}]}]}),
        encoding="utf-8",
    )
    ran = runner.invoke(
        cli,
        [
            *("run", "--no-live", "--db", str(tmp_path / "log.db"), "--cwd", str(tmp_path)),
            *("--script", str(script), "hello"),
        ],
        env=env,
    )
    assert ran.exception is None, ran.output
    assert ran.exit_code == 0, ran.output
    assert "fine" in ran.stdout
    warnings = [line for line in ran.stderr.splitlines() if "deep.md" in line]
    assert len(warnings) == 1 and "nested more than 16 levels deep" in warnings[0]


# ------------------------------------------------------------------ configuration files


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("x = " + _deep(100_000), "arrays or tables nested more than 32 deep"),
        ("x = " + "{a = " * 100_000 + "}" * 100_000, "arrays or tables nested more than 32 deep"),
        ("a" + ".a" * 100_000 + " = 1", "a dotted key of more than 32 parts"),
        ("[a" + ".a" * 100_000 + "]", "a dotted key of more than 32 parts"),
        ("x = {" + "a." * 40 + "b = 1}", "a dotted key of more than 32 parts"),
    ],
    ids=["arrays", "inline-tables", "dotted-key", "table-header", "inline-dotted"],
)
def test_a_configuration_nested_too_deeply_is_refused(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "fanfold.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        read_config_file(path)
    assert str(caught.value) == f"{path}: invalid TOML: {problem}"


def test_brackets_and_dots_in_strings_and_comments_do_not_count(tmp_path: Path) -> None:
    deep = "[" * 100 + "a." * 100
    system = f'system_prompt = """{deep}\n"{deep}""{deep}\\"""{deep}"""""'
    text = "\n".join(
        [
            f"# {deep}",
            'default = "local"',
            system,
            "[profiles.local]",
            'provider = "openai"',
            f'model = "{deep}\\"{deep}"',
            f"base_url = 'http://127.0.0.1:8080/v1' # {deep}",
            f"[profiles.other]\nprovider = 'openai'\nmodel = '''{deep}\n''{deep}'''''",
            "[retry]",
            "base = 1.5",
        ]
    )
    path = tmp_path / "fanfold.toml"
    path.write_text(text, encoding="utf-8")
    config = read_config_file(path)
    assert config.profile("local").model == f'{deep}"{deep}'
    assert config.system_prompt == f'{deep}\n"{deep}""{deep}"""{deep}""'
    assert config.profile("other").model == f"{deep}\n''{deep}''"


def test_fanfold_run_with_a_deep_configuration_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fanfold.toml").write_text("x = " + _deep(100_000), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    env = {**_agents_env(tmp_path), "FANFOLD_CONFIG": ""}
    result = CliRunner().invoke(cli, ["run", "--no-live", "--db", "log.db", "hello"], env=env)
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'fanfold.toml'}: invalid TOML: arrays or tables nested "
        "more than 32 deep"
    ]


# ------------------------------------------------------------------ JSON


def _script_file(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "script.json"
    path.write_text(text, encoding="utf-8")
    return ScriptedProvider.from_file(path)


PARSERS: dict[str, tuple[Callable[[Path, str], Any], type[Exception]]] = {
    "a model's tool arguments (provider)": (
        lambda _, deep: tool_arguments('{"a":' + deep + "}", "test"),
        ProviderError,
    ),
    "a model's tool arguments (reducer)": (
        lambda _, deep: ToolCall("c1", "bash", '{"a":' + deep + "}").arguments(),
        ValueError,
    ),
    "a log's value": (lambda _, deep: codec.decode(deep), CodecError),
    "a log's event": (
        lambda _, deep: codec.decode_event(
            f'{{"v":{codec.SCHEMA_VERSION},"type":"UserMessaged","text":{deep}}}'
        ),
        CodecError,
    ),
    "a tree's recorded provider": (
        lambda _, deep: ProviderDescription.from_json('{"kind":"script","script":' + deep + "}"),
        DescriptionError,
    ),
    "a script file": (_script_file, ScriptError),
}


def _on_a_fresh_stack(call: Callable[[], Any]) -> BaseException | None:
    """What ``call`` raises, run in a new thread: its recursion depth starts at 0, so
    where a depth fails does not depend on how deep the test runner's stack is."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the test
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return raised[0] if raised else None


@pytest.mark.parametrize("name", list(PARSERS))
def test_json_nested_too_deeply_is_a_typed_error(tmp_path: Path, name: str) -> None:
    parse, error = PARSERS[name]
    wrong = {}
    for depth in DEPTHS:
        raised = _on_a_fresh_stack(lambda: parse(tmp_path, _deep(depth)))  # noqa: B023
        if raised is not None and not isinstance(raised, error):
            wrong[depth] = repr(raised)[:100]
    assert wrong == {}


def test_a_deep_error_body_from_a_server_is_read_as_text() -> None:
    bodies: dict[int, Any] = {}
    for depth in DEPTHS:
        raised = _on_a_fresh_stack(
            lambda: bodies.setdefault(depth, parse_error_body(_deep(depth).encode()))  # noqa: B023
        )
        assert raised is None, (depth, repr(raised)[:200])
    assert all(b.message is not None and b.message.startswith("[[[") for b in bodies.values())


def test_importing_a_deep_export_is_one_line(tmp_path: Path) -> None:
    export = tmp_path / "deep.json"
    export.write_text(_deep(100_000), encoding="utf-8")
    result = CliRunner().invoke(
        cli, ["import", str(export), "--db", str(tmp_path / "log.db")], env=_agents_env(tmp_path)
    )
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
