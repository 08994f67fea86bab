"""`fanfold run` of the offline demo (the built-in scripted profile) imports neither
httpx nor the HTTP providers nor web_fetch's module (issue 36): the router makes its
HTTP client when it first builds an HTTP profile, ``build_provider`` imports a provider
class only for its profile, and ``web_fetch`` is imported only when configured; nor the
MCP client without a declared server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

RUN_THEN_MODULES = """
import sys
from fanfold.cli import cli
cli.main({args!r}, prog_name="fanfold", standalone_mode=False)
print("MODULES", " ".join(sorted(sys.modules)))
"""

HTTP = ("httpx", "httpcore", "h11", "h2")
HTTP_FANFOLD = (
    "fanfold.providers.http",
    "fanfold.providers.openai",
    "fanfold.providers.anthropic",
    "fanfold.tools.web",
    "fanfold.mcp.client",  # no MCP server is declared
)


def test_the_offline_demo_runs_without_the_http_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FANFOLD_KEY_FILE", str(tmp_path / "provenance.key"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no user configuration
    for name in ("FANFOLD_CONFIG", "FANFOLD_BASE_URL", "FANFOLD_MODEL", "FANFOLD_PROVIDER"):
        monkeypatch.delenv(name, raising=False)
    project = tmp_path / "project"
    project.mkdir()
    (project / "app.py").write_text("def main() -> None:\n    print('go')  # TODO\n")
    args = [
        "run",
        "--db",
        str(tmp_path / "log.db"),
        "--cwd",
        str(project),
        "Review this repository",
    ]
    code = RUN_THEN_MODULES.format(args=args)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=project
    )
    assert done.returncode == 0, done.stderr
    out, _, listed = done.stdout.rpartition("MODULES ")
    assert "conversation: " in out  # the demo ran to its answer
    modules = listed.split()
    assert "fanfold.providers.config" in modules and "fanfold.tools.registry" in modules
    heavy = [m for m in modules if m.split(".")[0] in HTTP or m.startswith(HTTP_FANFOLD)]
    assert heavy == []
    # Nor fanfold.replay (every replay module): the live view reads a refusal's text
    # through it only for a refusal, and the demo has none.
    assert [m for m in modules if m.startswith("fanfold.replay")] == []
