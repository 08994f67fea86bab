"""git run for a confined agent starts nothing the repository's configuration names
(issue 22, item 2): real git, a real repository whose ``.git/config`` and
``.gitattributes`` name programs that leave a marker, real subprocesses through the
real bash tool and the real runtime."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from runtime_helpers import open_runtime, reply, script, spawn, submit

from fanfold.agents.builtin import REVIEWER
from fanfold.agents.definitions import parse_definition
from fanfold.db import Store
from fanfold.statemachine import Limits, ToolResultMessage
from fanfold.tools import bash as bash_module
from fanfold.tools.bash import BashTool
from fanfold.tools.git_guard import guarded_env

# Each names a program that leaves a marker, as a hostile repository would.
HOOKS = ["fsmonitor", "pager", "external", "textconv", "clean", "smudge", "gpg", "hook"]

# What the built-in reviewer's allow rules permit, as a reviewer would use them.
REVIEWER_COMMANDS = [
    "git diff",
    "git diff HEAD~1 HEAD",
    "git diff --stat",
    "git log -p -2",
    "git log --stat -1",
    "git show HEAD~1",
    "git show HEAD~1:notes.txt",
    "git status",
    "git status -v",
]


def _git(repo: Path, *args: str, stdin: bytes | None = None) -> str:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    done = subprocess.run(
        ["git", *args], cwd=repo, env=env, input=stdin, capture_output=True, check=True
    )
    return done.stdout.decode()


def _hostile_repository(tmp_path: Path) -> tuple[Path, Path]:
    """A repository with two commits (the first signed, so gpg is asked), a change in
    the work tree, and every hook above configured; and the markers' folder."""
    markers = tmp_path / "markers"
    markers.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in HOOKS:
        program = bin_dir / name
        # Leaves its marker, then behaves like the identity (textconv gets a file).
        program.write_text(
            f'#!/bin/sh\ntouch "{markers}/{name}"\nif [ -f "$1" ]; then cat "$1"; else cat; fi\n'
        )
        program.chmod(0o755)
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    for key, value in [
        ("user.email", "a@example.com"),
        ("user.name", "a"),
        ("core.fsmonitor", str(bin_dir / "fsmonitor")),
        ("core.pager", str(bin_dir / "pager")),
        ("diff.external", str(bin_dir / "external")),
        ("diff.evil.textconv", str(bin_dir / "textconv")),
        ("filter.evil.clean", str(bin_dir / "clean")),
        ("filter.evil.smudge", str(bin_dir / "smudge")),
        ("gpg.program", str(bin_dir / "gpg")),
        ("log.showSignature", "true"),
    ]:
        _git(repo, "config", key, value)
    hook = repo / ".git" / "hooks" / "post-index-change"
    hook.write_text(f'#!/bin/sh\ntouch "{markers}/hook"\n')
    hook.chmod(0o755)
    (repo / ".gitattributes").write_text("*.txt diff=evil filter=evil\n")
    (repo / "notes.txt").write_text("first line\n")
    _git(repo, "-c", "core.hooksPath=/dev/null", "add", ".")
    _git(repo, "-c", "core.hooksPath=/dev/null", "commit", "-qm", "one")
    # Sign the first commit (any signature makes `log.showSignature` ask gpg).
    body = _git(repo, "cat-file", "commit", "HEAD")
    head, _, message = body.partition("\n\n")
    signature = "gpgsig -----BEGIN PGP SIGNATURE-----\n \n abc\n -----END PGP SIGNATURE-----"
    signed = f"{head}\n{signature}\n\n{message}".encode()
    commit = _git(repo, "hash-object", "-t", "commit", "-w", "--stdin", stdin=signed).strip()
    _git(repo, "update-ref", "HEAD", commit)
    (repo / "notes.txt").write_text("first line\nsecond line\n")
    _git(repo, "-c", "core.hooksPath=/dev/null", "commit", "-qam", "two")
    (repo / "notes.txt").write_text("first line\nsecond line\nthird line\n")
    for marker in markers.iterdir():
        marker.unlink()
    return repo, markers


def _fired(markers: Path) -> set[str]:
    return {marker.name for marker in markers.iterdir()}


async def test_the_hostile_repository_really_runs_its_programs_unguarded(tmp_path: Path) -> None:
    """The control: the same commands through the bash tool as an unconfined agent
    runs them start the repository's programs (what a reviewer did before)."""
    repo, markers = _hostile_repository(tmp_path)
    for command in REVIEWER_COMMANDS:
        await BashTool().run({"command": command}, str(repo))
    assert {"external", "textconv", "clean", "gpg", "fsmonitor"} <= _fired(markers)


@pytest.mark.parametrize("command", REVIEWER_COMMANDS)
async def test_a_confined_agents_git_starts_none_of_them(tmp_path: Path, command: str) -> None:
    repo, markers = _hostile_repository(tmp_path)
    os.utime(repo / "notes.txt")  # the index's stat data is stale: git looks again
    result = await BashTool().confined().run({"command": command}, str(repo))
    assert _fired(markers) == set(), (command, result.content)
    assert not result.is_error, result.content
    assert result.content.endswith("[exit code 0]")


async def test_the_guarded_git_still_shows_the_change(tmp_path: Path) -> None:
    repo, _ = _hostile_repository(tmp_path)
    tool = BashTool().confined()
    diff = (await tool.run({"command": "git diff"}, str(repo))).content
    assert "+third line" in diff and "diff --git a/notes.txt b/notes.txt" in diff
    show = (await tool.run({"command": "git show HEAD"}, str(repo))).content
    assert "+second line" in show
    status = (await tool.run({"command": "git status --short"}, str(repo))).content
    assert " M notes.txt" in status


async def test_the_reviewer_through_the_runtime_runs_nothing_the_repository_names(
    tmp_path: Path,
) -> None:
    """The built-in reviewer, end to end: its allowed git commands run (guarded), the
    issue's `git difftool -x` is refused and never runs."""
    repo, markers = _hostile_repository(tmp_path)
    reviewer, problems = parse_definition(REVIEWER, "built-in")
    assert reviewer is not None, problems
    pwned = tmp_path / "PWNED"
    provider = script(
        0.0,
        root=[reply("", spawn({"task": "review", "agent": "reviewer"})), reply("done")],
        c1=[
            reply(
                "",
                ("bash", {"command": f'git difftool -y -x "touch {pwned}" HEAD~1 HEAD'}),
                ("bash", {"command": "git diff"}),
                ("bash", {"command": "git log -p -2"}),
                ("bash", {"command": "git status"}),
            ),
            reply("", submit("{{last_tool_result}}")),
        ],
    )
    async with open_runtime(tmp_path, provider, limits=Limits()) as runtime:
        root_id = await runtime.start("go", cwd=repo, agents=(reviewer,))
        await runtime.wait(root_id)
    assert not pwned.exists()
    assert _fired(markers) == set()
    with Store.open(tmp_path / "log.db") as store:
        child = store.load_state(f"{root_id}.1")
    results = [m.result for m in child.history if isinstance(m, ToolResultMessage)]
    assert results[0].is_error and "refused" in results[0].content
    assert "+third line" in results[1].content and not results[1].is_error
    assert "+second line" in results[2].content and not results[2].is_error
    assert child.refused_calls == 1


def test_the_guard_keeps_the_callers_configuration_and_adds_its_own_after_it() -> None:
    environ = {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "user.name",
        "GIT_CONFIG_VALUE_0": "a",
        "GIT_EXTERNAL_DIFF": "evil",
        "GIT_SSH_COMMAND": "evil",
        "GIT_CONFIG_PARAMETERS": "'core.fsmonitor'='evil'",
    }
    env = guarded_env(environ)
    count = int(env["GIT_CONFIG_COUNT"])
    pairs = {env[f"GIT_CONFIG_KEY_{i}"]: env[f"GIT_CONFIG_VALUE_{i}"] for i in range(count)}
    assert pairs["user.name"] == "a"
    assert pairs["core.fsmonitor"] == "false" and pairs["core.hooksPath"] == "/dev/null"
    assert "GIT_EXTERNAL_DIFF" not in env and "GIT_SSH_COMMAND" not in env
    assert "GIT_CONFIG_PARAMETERS" not in env  # it would win over GIT_CONFIG_COUNT
    assert env["GIT_ALLOW_PROTOCOL"] == "" and env["GIT_PAGER"] == "cat"
    assert guarded_env({"GIT_CONFIG_COUNT": "junk"})["GIT_CONFIG_KEY_0"] == "core.fsmonitor"


async def test_the_guard_passes_arguments_through_unchanged_but_for_diff(tmp_path: Path) -> None:
    """The guard rebuilds git's arguments in shell: spaces, quotes, globs and empty
    words reach git as they were, and only `diff` gets `--no-ext-diff`."""
    repo, _ = _hostile_repository(tmp_path)
    tool = BashTool().confined()
    log = await tool.run({"command": "git log -1 --format='[%s] * ? \"x\"' HEAD~1"}, str(repo))
    assert log.content.startswith('[one] * ? "x"\n'), log.content
    grep = await tool.run({"command": "git grep -n -e 'second line' -- '*.txt'"}, str(repo))
    assert "notes.txt:2:second line" in grep.content, grep.content
    diff = await tool.run({"command": "git --no-pager diff --stat"}, str(repo))
    assert "notes.txt | 1 +" in diff.content, diff.content


async def test_a_git_too_old_for_the_guard_is_refused_not_run_unguarded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """git before 2.31 ignores GIT_CONFIG_COUNT, so the guard's settings would not
    reach it: a confined agent's `git` says so and runs nothing."""
    fake = tmp_path / "old-git"
    fake.mkdir()
    marker = tmp_path / "ran"
    (fake / "git").write_text(
        f'#!/bin/sh\nif [ "$1" = version ]; then echo "git version 2.30.9"; exit 0; fi\n'
        f'touch "{marker}"\n'
    )
    (fake / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    result = await BashTool().confined().run({"command": "git status"}, str(tmp_path))
    assert not marker.exists()
    assert result.is_error and "git 2.30 at" in result.content and "2.31" in result.content
    assert result.content.endswith("[exit code 126]")


async def test_a_removed_guard_is_made_again(tmp_path: Path) -> None:
    """A guard directory removed behind fanfold's back (a temp cleaner) would let
    PATH find the real git: it is made again before the next command."""
    repo, markers = _hostile_repository(tmp_path)
    tool = BashTool().confined()
    await tool.run({"command": "git diff"}, str(repo))
    for directory in list(bash_module._guard_dirs.values()):
        shutil.rmtree(directory)
    result = await tool.run({"command": "git diff"}, str(repo))
    assert _fired(markers) == set() and "+third line" in result.content


async def test_a_submodules_own_filters_stay_off(tmp_path: Path) -> None:
    """`git status` and `git diff` compare a submodule's work tree with a git reading
    the submodule's configuration, whose drivers the guard does not read: it keeps
    them out of submodule work trees (`submodule.<name>.ignore=none` set to invite
    them in)."""
    markers = tmp_path / "markers"
    markers.mkdir()
    sub = tmp_path / "sub"
    sub.mkdir()
    _git(sub, "init", "-q")
    (sub / "f.txt").write_text("x\n")
    _git(sub, "add", ".")
    _git(sub, "-c", "user.email=a@example.com", "-c", "user.name=a", "commit", "-qm", "s")
    top = tmp_path / "top"
    top.mkdir()
    _git(top, "init", "-q")
    _git(top, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "sm")
    _git(top, "-c", "user.email=a@example.com", "-c", "user.name=a", "commit", "-qm", "t")
    _git(top, "config", "submodule.sm.ignore", "none")
    (top / "sm" / ".gitattributes").write_text("*.txt filter=evil\n")
    _git(top / "sm", "config", "filter.evil.clean", f'touch "{markers}/subclean"; cat')
    for command in ["git status", "git diff", "git status --short"]:
        os.utime(top / "sm" / "f.txt")
        result = await BashTool().confined().run({"command": command}, str(top))
        assert _fired(markers) == set(), (command, result.content)
    os.utime(top / "sm" / "f.txt")
    await BashTool().run({"command": "git status"}, str(top))
    assert _fired(markers) == {"subclean"}  # the control: unguarded, it runs


async def test_git_diff_outside_a_repository_is_refused(tmp_path: Path) -> None:
    """Outside a repository `git diff a b` compares any two files (an implicit
    --no-index); the guard refuses it there."""
    (tmp_path / "a").write_text("one\n")
    (tmp_path / "b").write_text("two\n")
    env_check = await BashTool().run({"command": "git rev-parse --git-dir"}, str(tmp_path))
    assert env_check.is_error  # the test's folder is in no repository
    unguarded = await BashTool().run({"command": "git diff a b"}, str(tmp_path))
    assert "+two" in unguarded.content  # the control
    guarded = await BashTool().confined().run({"command": "git diff a b"}, str(tmp_path))
    assert "+two" not in guarded.content and "outside a repository" in guarded.content
    assert guarded.content.endswith("[exit code 128]")


async def test_blame_reads_no_revisions_file_outside_the_repository(tmp_path: Path) -> None:
    """`blame.ignoreRevsFile` names a file git reads; an unreadable revision in it is
    printed in the error: a repository could have a secret's first line printed."""
    repo, _ = _hostile_repository(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("the-secret-value\n")
    _git(repo, "config", "blame.ignoreRevsFile", str(secret))
    unguarded = await BashTool().run({"command": "git blame notes.txt"}, str(repo))
    assert "the-secret-value" in unguarded.content  # the control
    guarded = await BashTool().confined().run({"command": "git blame notes.txt"}, str(repo))
    assert "the-secret-value" not in guarded.content
    assert "outside the repository; refused" in guarded.content
    # One inside the repository, as projects keep `.git-blame-ignore-revs`, is read.
    (repo / ".git-blame-ignore-revs").write_text("")
    _git(repo, "config", "blame.ignoreRevsFile", ".git-blame-ignore-revs")
    inside = await BashTool().confined().run({"command": "git blame notes.txt"}, str(repo))
    assert not inside.is_error and "first line" in inside.content
