"""`fanfold show` of a tree run on a configuration reads its profiles' prices without
importing the HTTP providers, httpx or Trio (issue 36): the configuration's parser and
``Timeouts``/``RequestSettings`` (``fanfold.providers.settings``) need neither."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fanfold.cli import cli

HEAVY = ("httpx", "httpcore", "trio", "anyio", "h11")
HEAVY_FANFOLD = (
    "fanfold.providers.http",
    "fanfold.providers.openai",
    "fanfold.providers.anthropic",
    "fanfold.providers.scripted",
    "fanfold.providers.slots",
    "fanfold.providers.wire",  # Secret and the key shapes are in providers.settings
    "fanfold.cli.models",
    "fanfold.runtime.",
    "fanfold.tools",
)

SHOW_THEN_MODULES = """
import sys
from fanfold.cli import cli
cli.main({args!r}, prog_name="fanfold", standalone_mode=False)
print("MODULES", " ".join(sorted(sys.modules)))
"""


def test_show_reads_the_recorded_prices_without_the_http_providers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The demo's built-in script answers a profile that has prices.
    config = tmp_path / "priced.toml"
    config.write_text(
        'default = "cheap"\n[profiles.cheap]\nprovider = "scripted"\n'
        "prices = { input = 3.0, output = 15.0 }\n"
    )
    monkeypatch.setenv("FANFOLD_KEY_FILE", str(tmp_path / "provenance.key"))
    monkeypatch.setenv("FANFOLD_CONFIG", str(config))
    project = tmp_path / "project"
    project.mkdir()
    (project / "app.py").write_text("def main() -> None:\n    print('go')  # TODO\n")
    db = tmp_path / "log.db"
    ran = CliRunner().invoke(
        cli, ["run", "--db", str(db), "--cwd", str(project), "Review this repository"]
    )
    assert ran.exit_code == 0, ran.output
    root = json.loads(CliRunner().invoke(cli, ["ls", "--db", str(db), "--json"]).output)[0]["id"]
    monkeypatch.delenv("FANFOLD_CONFIG")  # show reads the file the tree recorded

    code = SHOW_THEN_MODULES.format(args=["show", root, "--db", str(db)])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out, _, listed = done.stdout.rpartition("MODULES ")
    modules = listed.split()
    assert "cost: $" in out  # the prices were read...
    assert "fanfold.providers.config" in modules  # ...from the recorded configuration
    heavy = [m for m in modules if m.split(".")[0] in HEAVY or m.startswith(HEAVY_FANFOLD)]
    assert heavy == []
