"""``run --script`` takes the configuration's settings but its model profiles
(issue 33, item 10): ``--config`` is accepted beside it, and ``$FANFOLD_CONFIG``'s
``[model_aliases]``, ``[tools.web_fetch]`` and system prompt are used as ``fanfold
agents`` and ``fanfold tools`` show them in effect. And ``fanfold tools`` into a pipe
keeps each tool's name on one line."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from fanfold.cli import cli
from fanfold.db import Store

CONFIG = """\
system_prompt = "You answer in haiku."

[model_aliases]
sonnet = "some-model"

[tools.web_fetch]
domains = ["docs.python.org"]
"""

AGENT = """\
---
name: poet
description: Writes poems.
model: sonnet
---
Write a poem.
"""


def _setup(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    (tmp_path / "settings.toml").write_text(CONFIG)
    (tmp_path / ".claude" / "agents").mkdir(parents=True)
    (tmp_path / ".claude" / "agents" / "poet.md").write_text(AGENT)
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps({"agents": [{"match": {"path": "root"}, "replies": [{"text": "done"}]}]})
    )
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    return tmp_path / "settings.toml", script, env


def _run(tmp_path: Path, script: Path, env: dict[str, str], *more: str) -> tuple[str, str]:
    db = tmp_path / f"t{len(list(tmp_path.glob('t*.db')))}.db"
    args = ["run", "go", "--script", str(script), "--db", str(db), "--no-live"]
    args += ["--cwd", str(tmp_path), *more]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    with Store.open(db, read_only=True) as store:
        (row,) = store.list_roots()
        state = store.load_state(row.id)
    tools = [spec.name for spec in state.tools]
    assert "web_fetch" in tools and state.system_prompt == "You answer in haiku.", (
        tools,
        state.system_prompt,
    )
    return result.stdout, result.stderr


def test_a_script_run_takes_the_configuration_s_settings_but_its_profiles(
    tmp_path: Path,
) -> None:
    config, script, env = _setup(tmp_path)
    # --config beside --script (refused before: "cannot be combined with --config").
    _, stderr = _run(tmp_path, script, env, "--config", str(config))
    assert "left out" not in stderr, stderr  # the agent's `model: sonnet` is mapped
    assert f"scripted ({script}); settings of {config}" in stderr
    # $FANFOLD_CONFIG, as `fanfold agents` and `fanfold tools` read it (ignored before).
    _, stderr = _run(tmp_path, script, {**env, "FANFOLD_CONFIG": str(config)})
    assert "left out" not in stderr, stderr
    # --profile and --model still choose a model, which a script replaces: refused.
    refused = CliRunner().invoke(
        cli, ["run", "go", "--script", str(script), "--model", "m", "--no-live"], env=env
    )
    assert refused.exit_code == 2
    assert "cannot be combined with --profile or --model" in refused.stderr


def test_fanfold_tools_into_a_pipe_keeps_each_name_on_one_line(tmp_path: Path) -> None:
    name = "look_up_the_customer_record_by_its_number_in_the_crm_system"
    (tmp_path / "long.py").write_text(
        "import fanfold\n\n"
        f"@fanfold.tool(name={name!r})\n"
        "def f(n: int) -> str:\n"
        "    '''Look a customer up.\n\n    Args:\n        n: The number.\n    '''\n"
        "    return str(n)\n"
    )
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    ref = f"{tmp_path / 'long.py'}:f"
    result = CliRunner().invoke(cli, ["tools", "--cwd", str(tmp_path), "--tools", ref], env=env)
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if "│" in line}
    assert name in rows, result.stdout
    assert "Python: --tools" in rows[name] and "Look a customer up." in rows[name]
    assert "│ read_file " in result.stdout and "built-in" in rows["read_file"]
