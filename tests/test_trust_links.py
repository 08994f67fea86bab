"""Trust does not follow a link into another checkout (issue 32, item 4).

A user trusted ``good/.mcp.json`` (``python srv.py``). A cloned repository ``evil``
whose ``.mcp.json`` is a symbolic link to it, or whose agents folder is a link to
good's, or whose ``fanfold.toml`` is a link to a trusted one, is another project: its
files are not trusted, and its own ``srv.py`` never runs. A trusted file's server whose
``srv.py`` changed is not trusted either; ``fanfold trust`` shows the servers' env.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fanfold.cli import cli
from fanfold.mcp.config import declared_servers
from fanfold.providers.config import UntrustedConfig, load_config
from fanfold.trust import TrustStore

SERVER = {"command": sys.executable, "args": ["srv.py"], "env": {"TOKEN": "${SECRET}"}}


def _checkouts(tmp_path: Path) -> tuple[Path, Path, Path]:
    """good (trusted by the user) and evil (its .mcp.json a link to good's); evil's
    srv.py writes the proof file when it runs."""
    good, evil = tmp_path / "good", tmp_path / "evil"
    good.mkdir()
    evil.mkdir()
    (good / ".mcp.json").write_text(json.dumps({"mcpServers": {"s": SERVER}}))
    (good / "srv.py").write_text("raise SystemExit(0)  # the server the user read\n")
    proof = tmp_path / "proof"
    (evil / "srv.py").write_text(f"open({str(proof)!r}, 'w').write('ran')\n")
    (evil / ".mcp.json").symlink_to(Path("..") / "good" / ".mcp.json")
    return good, evil, proof


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(tmp_path / "home"), "SECRET": "s3cret"}


def test_a_linked_mcp_json_is_not_trusted_and_its_checkouts_program_never_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, evil, proof = _checkouts(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SECRET", "s3cret")
    trusted = CliRunner().invoke(cli, ["trust", str(good / ".mcp.json")])
    assert trusted.exit_code == 0, trusted.output
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"agents": [{"replies": [{"text": "no tools needed"}]}]}))
    options = ["--script", str(script), "--db", str(tmp_path / "w.db"), "--cwd", str(evil)]
    done = CliRunner().invoke(cli, ["run", "go", *options, "--no-live"])
    assert done.exit_code == 0, done.output
    assert not proof.exists(), "the linked checkout's own srv.py ran"
    # Without the MCP SDK (the `mcp` extra) no server can start, trusted or not: run says
    # the SDK is missing instead. The trust decision itself is checked below either way.
    if importlib.util.find_spec("mcp") is None:
        assert "MCP servers are declared but the MCP SDK is missing" in done.output
    else:
        assert "MCP server 's' waits for trust" in done.output
    assert not declared_servers(good).servers[0].needs_trust
    assert declared_servers(evil).servers[0].needs_trust
    # The env the server is handed, as written: shown when it is trusted.
    assert "env TOKEN=${SECRET}" in trusted.output
    assert f"runs {os.path.realpath(good / 'srv.py')}" in trusted.output


def test_a_changed_program_or_a_retargeted_link_is_not_trusted(tmp_path: Path) -> None:
    good, evil, _ = _checkouts(tmp_path)
    env = _env(tmp_path)
    store = TrustStore.default()
    assert CliRunner().invoke(cli, ["trust", str(good / ".mcp.json")]).exit_code == 0
    (good / "srv.py").write_text("print('another program')\n")
    assert declared_servers(good, environ=env).servers[0].needs_trust
    # Trusting the link itself names the link and where it leads.
    (good / "srv.py").write_text("raise SystemExit(0)  # the server the user read\n")
    (evil / "srv.py").write_text("raise SystemExit(0)  # the server the user read\n")
    assert CliRunner().invoke(cli, ["trust", str(evil / ".mcp.json")]).exit_code == 0
    assert not declared_servers(evil, environ=env).servers[0].needs_trust
    other = tmp_path / "other"
    other.mkdir()
    (other / ".mcp.json").write_bytes((good / ".mcp.json").read_bytes())
    (evil / ".mcp.json").unlink()
    (evil / ".mcp.json").symlink_to(other / ".mcp.json")  # same bytes, elsewhere
    assert declared_servers(evil, environ=env).servers[0].needs_trust
    listed = CliRunner().invoke(cli, ["trust", "--list"])
    assert "leads elsewhere now" in listed.output, listed.output
    assert store.entries()  # the record holds both entries, nothing lost


def test_a_linked_agents_folder_declares_untrusted_servers(tmp_path: Path) -> None:
    good, evil, _ = _checkouts(tmp_path)
    env = _env(tmp_path)
    agents = good / ".claude" / "agents"
    agents.mkdir(parents=True)
    (agents / "helper.md").write_text(
        "---\nname: helper\ndescription: helps\nmcpServers:\n  own:\n"
        f"    command: {sys.executable}\n    args: [srv.py]\n---\nHelp.\n"
    )
    (evil / ".claude").mkdir()
    (evil / ".claude" / "agents").symlink_to(agents, target_is_directory=True)
    assert CliRunner().invoke(cli, ["trust", str(agents / "helper.md")]).exit_code == 0
    own = {d.name: d for d in declared_servers(good, environ=env).servers}["own"]
    assert not own.needs_trust
    own = {d.name: d for d in declared_servers(evil, environ=env).servers}["own"]
    assert own.needs_trust
    assert own.cwd == os.path.realpath(evil)  # it would start in evil, with evil's srv.py


def test_a_linked_project_configuration_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, evil, _ = _checkouts(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("FANFOLD_CONFIG", "FANFOLD_BASE_URL", "FANFOLD_PROFILE", "FANFOLD_MODEL"):
        monkeypatch.delenv(name, raising=False)
    (good / "fanfold.toml").write_text(
        '[profiles.p]\nprovider = "openai"\nbase_url = "https://example.invalid/v1"\n'
        'model = "m"\napi_key_env = "OPENAI_API_KEY"\n'
    )
    (evil / "fanfold.toml").symlink_to(good / "fanfold.toml")
    assert CliRunner().invoke(cli, ["trust", str(good / "fanfold.toml")]).exit_code == 0
    load_config(cwd=good)
    with pytest.raises(UntrustedConfig, match="not trusted"):
        load_config(cwd=evil)


def test_a_version_1_record_is_read_and_trusts_no_program(tmp_path: Path) -> None:
    good, _, _ = _checkouts(tmp_path)
    env = _env(tmp_path)
    store = TrustStore.default()
    import hashlib

    digest = hashlib.sha256((good / ".mcp.json").read_bytes()).hexdigest()
    store.path.write_text(
        json.dumps(
            {
                "version": 1,
                "trusted": [
                    {
                        "path": os.path.realpath(good / ".mcp.json"),
                        "sha256": digest,
                        "trusted_at": "2026-11-27T23:40:00+00:00",
                    }
                ],
            }
        )
    )
    store.path.chmod(0o600)
    assert store.is_trusted(good / ".mcp.json", digest)
    # Trusted before fanfold recorded what its servers run: srv.py is not covered.
    assert declared_servers(good, environ=env).servers[0].needs_trust
