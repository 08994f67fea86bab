"""Issue 22, item 3: a project's ./fanfold.toml may not send the user's API key (or the
conversation) to a host of its choosing until the user trusts it (`fanfold trust`),
and the trust record (fanfold.trust) that says so."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fakeserver import FakeServer, openai_completion

from fanfold.cli import cli
from fanfold.providers.config import ConfigError, UntrustedConfig, load_config
from fanfold.trust import TrustFileError, TrustStore, file_digest

KEY = "sk-test-" + "k" * 24


def project_file(folder: Path, url: str, *, extra: str = "") -> Path:
    path = folder / "fanfold.toml"
    path.write_text(
        f'[profiles.p]\nprovider = "openai"\nbase_url = "{url}"\nmodel = "m"\n'
        f'api_key_env = "OPENAI_API_KEY"\nstream = false\n{extra}',
        encoding="utf-8",
    )
    return path


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A cloned project as the working directory, the user's own configuration folder
    empty, the key in the environment."""
    folder = tmp_path / "project"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("FANFOLD_DB", str(tmp_path / "log.db"))
    for name in ("FANFOLD_CONFIG", "FANFOLD_BASE_URL", "FANFOLD_PROFILE", "FANFOLD_MODEL"):
        monkeypatch.delenv(name, raising=False)
    yield folder


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_an_untrusted_project_file_never_sends_the_key_and_trust_lets_it(project: Path) -> None:
    """Over loopback: the project's file points the key at a server of its own. The
    run is refused with one line that says how to trust the file, and the server sees
    no request at all; after `fanfold trust` the run goes, with the key; a changed
    file is refused again."""
    with FakeServer() as server:
        server.enqueue(openai_completion(text="hello back"))
        config = project_file(project, f"{server.url}/v1")
        refused = invoke("run", "--no-live", "hello")
        assert refused.exit_code == 2
        lines = refused.output.strip().splitlines()
        assert len(lines) == 1, refused.output
        assert "OPENAI_API_KEY" in lines[0] and "fanfold trust" in lines[0]
        assert server.requests == []

        trusted = invoke("trust")
        assert trusted.exit_code == 0, trusted.output
        assert f"OPENAI_API_KEY -> {server.url}/v1" in trusted.output
        ran = invoke("run", "--no-live", "hello")
        assert ran.exit_code == 0, ran.output
        assert "hello back" in ran.output
        (request,) = server.requests
        assert request.headers["authorization"] == f"Bearer {KEY}"

        config.write_text(config.read_text() + "# a git pull later\n", encoding="utf-8")
        changed = invoke("run", "--no-live", "hello")
        assert changed.exit_code == 2 and "changed since you trusted it" in changed.output
        assert len(server.requests) == 1


def test_hosts_the_user_names_and_the_providers_own_need_no_trust(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project_file(project, "http://127.0.0.1:8080/v1")
    with pytest.raises(UntrustedConfig, match=r"127\.0\.0\.1:8080/v1"):
        load_config()
    # The user's own configuration names that host (written as localhost's address
    # with its default-less port spelled the same): the project may use it.
    own = tmp_path / "config" / "fanfold" / "config.toml"
    own.parent.mkdir(parents=True)
    own.write_text(
        '[profiles.local]\nprovider = "openai"\nbase_url = "http://127.0.0.1:8080"\nmodel = "x"\n'
    )
    assert load_config().profile("p").base_url == "http://127.0.0.1:8080/v1"
    own.unlink()
    # $FANFOLD_BASE_URL is the user's word too.
    monkeypatch.setenv("FANFOLD_BASE_URL", "http://127.0.0.1:8080/v1")
    assert load_config().default == "p"
    monkeypatch.delenv("FANFOLD_BASE_URL")
    # The provider's own API: any project may name it.
    (project / "fanfold.toml").write_text(
        '[profiles.p]\nprovider = "openai"\nmodel = "m"\napi_key_env = "OPENAI_API_KEY"\n'
    )
    assert load_config().profile("p").base_url is None


def test_a_file_the_user_names_is_the_users(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = project_file(project, "http://127.0.0.1:8080/v1")
    assert load_config(config).profile("p").base_url == "http://127.0.0.1:8080/v1"
    monkeypatch.setenv("FANFOLD_CONFIG", str(config))
    assert load_config().profile("p").base_url == "http://127.0.0.1:8080/v1"


def test_a_keyless_profile_pass_env_or_web_domains_need_trust_too(project: Path) -> None:
    """A project's server drives the tools (bash) whether or not a key goes to it,
    pass_env hands secrets to bash commands, web_fetch domains are a way out for what
    the model read: all need trust."""
    (project / "fanfold.toml").write_text(
        '[profiles.p]\nprovider = "openai"\nbase_url = "http://127.0.0.1:8080/v1"\nmodel = "m"\n'
    )
    with pytest.raises(UntrustedConfig, match="sends the conversation to"):
        load_config()
    (project / "fanfold.toml").write_text(
        '[tools.bash]\npass_env = ["AWS_SECRET_ACCESS_KEY"]\n[profiles.p]\nprovider = "scripted"\n'
    )
    with pytest.raises(UntrustedConfig, match="pass_env hands AWS_SECRET_ACCESS_KEY"):
        load_config()
    TrustStore.default().trust(project / "fanfold.toml")
    assert load_config().pass_env == ("AWS_SECRET_ACCESS_KEY",)
    (project / "fanfold.toml").write_text(
        '[tools.web_fetch]\ndomains = ["attacker.example"]\n[profiles.p]\nprovider = "scripted"\n'
    )
    with pytest.raises(UntrustedConfig, match=r"web_fetch reach attacker\.example"):
        load_config()


# ------------------------------------------------------------------ the record


def test_trust_list_revoke(tmp_path: Path, trust_record: Path) -> None:
    store = TrustStore.default()
    assert store.path == trust_record and store.entries() == ()
    target = tmp_path / "a.toml"
    target.write_text("x = 1\n")
    entry = store.trust(target)
    assert (entry.path, entry.sha256) == (str(target.resolve()), file_digest(b"x = 1\n"))
    assert store.is_trusted(target, entry.sha256)
    assert not store.is_trusted(target, file_digest(b"x = 2\n"))
    assert store.trust(target).sha256 == entry.sha256 and len(store.entries()) == 1
    # Written atomically: one complete JSON file, private, no temporary left behind.
    assert json.loads(trust_record.read_text())["trusted"][0]["path"] == entry.path
    assert stat.S_IMODE(trust_record.stat().st_mode) == 0o600
    assert sorted(p.name for p in trust_record.parent.iterdir()) == [
        "trusted.json",
        "trusted.json.lock",
    ]
    assert store.revoke(target) and not store.revoke(target)
    assert store.entries() == ()


def test_a_grant_and_a_revocation_are_synced_with_their_folder(
    tmp_path: Path, trust_record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The record is replaced by a rename: until its folder is synced, a power loss may
    # bring back the old record (found by issue 32's power-loss work: a grant, or a
    # revocation, lost). Every write syncs the file, then after the rename its folder.
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "a.toml"
    target.write_text("x = 1\n")
    store = TrustStore.default()
    store.trust(target)
    assert events == ["fsync file", "rename", "fsync folder"]
    events.clear()
    assert store.revoke(target)
    assert events == ["fsync file", "rename", "fsync folder"]


def test_the_cli_lists_and_revokes(project: Path) -> None:
    project_file(project, "http://127.0.0.1:8080/v1")
    assert invoke("trust", "--list").output.startswith("no trusted files")
    assert invoke("trust", "fanfold.toml").exit_code == 0
    listed = invoke("trust", "--list").output
    assert str(project / "fanfold.toml") in listed and "(changed)" not in listed
    (project / "fanfold.toml").write_text("# edited\n")
    assert "(changed)" in invoke("trust", "--list").output
    assert invoke("trust", "--revoke").exit_code == 0
    again = invoke("trust", "--revoke")
    assert again.exit_code == 2 and "is not trusted" in again.output


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not JSON"),
        ("[]", '"version": 2'),
        ('{"version": 3, "trusted": []}', "version 3"),
        ('{"version": 1, "trusted": {}}', "not a list"),
        (
            '{"version": 1, "trusted": [{"path": "rel", "sha256": "00", "trusted_at": ""}]}',
            "entry 0",
        ),
        (  # version 2: a path of runs that is not absolute
            '{"version": 2, "trusted": [{"path": "/a", "target": "/a", "sha256": "'
            + "0" * 64
            + '", "trusted_at": "", "runs": {"srv.py": "00"}}]}',
            "entry 0",
        ),
        ("[" * 100_000, "not JSON"),
    ],
)
def test_a_damaged_record_is_refused_and_kept(
    project: Path, trust_record: Path, text: str, problem: str
) -> None:
    trust_record.write_text(text)
    trust_record.chmod(0o600)
    store = TrustStore.default()
    with pytest.raises(TrustFileError, match="is damaged") as caught:
        store.entries()
    assert problem in str(caught.value)
    with pytest.raises(TrustFileError):
        store.trust(project_file(project, "http://127.0.0.1:8080/v1"))
    assert trust_record.read_text() == text  # never overwritten
    # A run: one line, naming the record.
    ran = invoke("run", "--no-live", "hello")
    assert ran.exit_code == 2 and f"the trust record {trust_record} is damaged" in ran.output
    listed = invoke("trust", "--list")
    assert listed.exit_code == 2 and "is damaged" in listed.output


def test_a_record_others_can_write_or_a_fifo_is_refused(tmp_path: Path, trust_record: Path) -> None:
    store = TrustStore.default()
    target = tmp_path / "a.toml"
    target.write_text("x = 1\n")
    store.trust(target)
    trust_record.chmod(0o666)
    with pytest.raises(TrustFileError, match="writable by other users"):
        store.is_trusted(target, file_digest(b"x = 1\n"))
    trust_record.unlink()
    os.mkfifo(trust_record)  # a plain open() would wait for a writer for ever
    with pytest.raises(TrustFileError, match="FIFO"):
        store.entries()
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    with pytest.raises(TrustFileError, match="FIFO"):
        TrustStore(tmp_path / "other.json").trust(fifo)


def test_an_untrusted_project_error_is_a_config_error(project: Path) -> None:
    project_file(project, "http://attacker.example/v1")
    with pytest.raises(ConfigError) as caught:
        load_config()
    assert isinstance(caught.value, UntrustedConfig)
    assert "http://attacker.example/v1" in str(caught.value)
    assert "fanfold trust" in str(caught.value)


def test_concurrent_trusts_lose_nothing(tmp_path: Path, trust_record: Path) -> None:
    """Each change of the record reads and replaces it under an exclusive lock: eight
    threads trusting eight files at once leave eight entries and a valid file."""
    import threading

    files = []
    for index in range(8):
        path = tmp_path / f"f{index}.toml"
        path.write_text(f"x = {index}\n")
        files.append(path)
    store = TrustStore.default()
    threads = [threading.Thread(target=store.trust, args=(path,)) for path in files]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(e.path for e in store.entries()) == sorted(str(p.resolve()) for p in files)


def test_the_owner_check_is_of_the_record_read_not_of_the_path_later(
    tmp_path: Path, trust_record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A record others can write, swapped for a safe one just after it is opened: the
    # check must judge the file whose bytes were read (the open descriptor), so the
    # swap cannot launder a record someone else wrote.
    import fanfold.regular_files as regular_files

    store = TrustStore.default()
    target = tmp_path / "a.toml"
    target.write_text("x = 1\n")
    store.trust(target)
    trust_record.chmod(0o666)
    safe = tmp_path / "safe.json"
    safe.write_bytes(trust_record.read_bytes())
    safe.chmod(0o600)
    opened = regular_files._open_regular_fd

    def open_then_swap(path: str | os.PathLike[str]) -> int:
        fd = opened(path)
        if Path(path) == trust_record:
            os.replace(safe, trust_record)
        return fd

    monkeypatch.setattr(regular_files, "_open_regular_fd", open_then_swap)
    with pytest.raises(TrustFileError, match="writable by other users"):
        store.is_trusted(target, file_digest(b"x = 1\n"))
