"""The grep and glob tools, on real files and directories, in real worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from fanfold.statemachine import ToolCall
from fanfold.tools import GlobTool, GrepTool, SearchLimits, ToolSet
from fanfold.tools.search import WORKER


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "src" / "deep").mkdir(parents=True)
    (root / "build").mkdir()
    (root / "docs").mkdir()
    (root / ".git").mkdir()
    (root / ".gitignore").write_text("build/\n*.log\n!keep.log\n/top.txt\n")
    (root / "src" / ".gitignore").write_text("generated_*\n")
    (root / "src" / "a.py").write_text("def needle():\n    return 1\n")
    (root / "src" / "deep" / "b.py").write_text("x = 'needle'\n")
    (root / "src" / "generated_c.py").write_text("needle\n")
    (root / "build" / "d.py").write_text("needle\n")
    (root / "x.log").write_text("needle\n")
    (root / "keep.log").write_text("needle\n")
    (root / "top.txt").write_text("needle\n")
    (root / "docs" / "top.txt").write_text("needle\n")
    (root / ".git" / "config").write_text("needle\n")
    (root / "image.bin").write_bytes(b"\x89PNG\0needle")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("needle secret\n")
    (root / "src" / "link.txt").symlink_to(outside / "secret.txt")
    (root / "linkdir").symlink_to(outside)
    return root


async def run(tool: GrepTool | GlobTool, cwd: Path, **args: object) -> tuple[str, bool]:
    result = await ToolSet([tool]).run(ToolCall("c", tool.spec.name, json.dumps(args)), str(cwd))
    return result.content, result.is_error


async def test_grep_honours_gitignore_and_skips_git_binaries_and_links(project: Path) -> None:
    content, is_error = await run(GrepTool(), project, pattern="needle")
    assert not is_error
    assert content.splitlines() == ["docs/top.txt", "keep.log", "src/a.py", "src/deep/b.py"]


async def test_grep_content_count_glob_and_path(project: Path) -> None:
    assert await run(GrepTool(), project, pattern="NEEDLE", ignore_case=True, glob="*.py") == (
        "src/a.py\nsrc/deep/b.py",
        False,
    )
    assert await run(GrepTool(), project, pattern=r"ne+dle\(", output_mode="content") == (
        "src/a.py:1:def needle():",
        False,
    )
    assert await run(GrepTool(), project, pattern="e", output_mode="count", path="src/deep") == (
        "src/deep/b.py:3",
        False,
    )
    assert await run(GrepTool(), project, pattern="needle", glob="src/**/*.py") == (
        "src/a.py\nsrc/deep/b.py",
        False,
    )
    # A nested .gitignore applies when the search starts below it, and from the project.
    assert await run(GrepTool(), project, pattern="needle", path="src") == (
        "src/a.py\nsrc/deep/b.py",
        False,
    )


async def test_grep_never_leaves_the_working_directory(project: Path) -> None:
    for path in ("..", "../outside", "/etc", "linkdir", "src/link.txt"):
        content, is_error = await run(GrepTool(), project, pattern="needle", path=path)
        assert is_error, path
        assert "outside the working directory" in content, path
        assert "needle secret" not in content


async def test_a_bad_pattern_is_an_error_result(project: Path) -> None:
    for pattern in ("(unclosed", "a{99999999999}"):
        content, is_error = await run(GrepTool(), project, pattern=pattern)
        assert is_error, pattern
        assert content.startswith("grep: the pattern is not a valid regular expression: ")


async def test_output_is_bounded(project: Path) -> None:
    (project / "many.txt").write_text("hit\n" * 5000)
    limits = SearchLimits(max_items=100)
    content, is_error = await run(
        GrepTool(limits=limits), project, pattern="hit", output_mode="content"
    )
    assert not is_error
    lines = content.splitlines()
    assert len(lines) == 101
    assert lines[0] == "many.txt:1:hit"
    assert lines[-1].startswith("[output cut: ")
    (project / "long.txt").write_text("hit" * 10_000 + "\n")
    content, _ = await run(GrepTool(), project, pattern="hit", output_mode="content", glob="long*")
    assert content.endswith("... [29500 more]")


def _workers() -> list[int]:
    """Live search workers started by this process."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = (Path("/proc") / pid / "cmdline").read_bytes()
            stat = (Path("/proc") / pid / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if str(WORKER).encode() in cmdline and parent == os.getpid():
            found.append(int(pid))
    return found


async def test_a_catastrophic_pattern_ends_at_the_time_limit_and_its_process_with_it(
    project: Path,
) -> None:
    (project / "evil.txt").write_text("a" * 60 + "!\n")
    tool = GrepTool(limits=SearchLimits(timeout=1.0))
    # The loop keeps running meanwhile: a task beside the search gets its turns.
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.05)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        content, is_error = await run(tool, project, pattern="(a+)+$", glob="evil.txt")
        nursery.cancel_scope.cancel()
    assert is_error
    assert content.startswith("grep: timed out after 1 s")
    assert ticks > 3
    assert _workers() == []


async def test_a_cancelled_search_kills_its_process(project: Path) -> None:
    (project / "evil.txt").write_text("a" * 60 + "!\n")
    with trio.move_on_after(0.5):
        await run(GrepTool(), project, pattern="(a+)+$", glob="evil.txt")
    assert _workers() == []


def test_the_worker_ends_itself_at_its_deadline_when_nobody_kills_it(project: Path) -> None:
    # What happens when fanfold is killed with -9 mid-search: nobody is left to kill
    # the worker, and its own timer (SIGALRM, default action) ends it.
    (project / "evil.txt").write_text("a" * 60 + "!\n")
    request = {
        "mode": "grep",
        "pattern": "(a+)+$",
        "glob": "evil.txt",
        "root": str(project),
        "target": str(project),
        "display_base": str(project),
        "deadline": 0.5,
        "max_chars": 1000,
        "max_items": 10,
        "max_line_chars": 100,
        "max_file_bytes": 1000,
        "max_entries": 1000,
    }
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(WORKER)],
        input=json.dumps(request).encode(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -signal.SIGALRM


async def test_glob_lists_matching_files_inside_the_working_directory(project: Path) -> None:
    assert await run(GlobTool(), project, pattern="*.py") == ("src/a.py\nsrc/deep/b.py", False)
    assert await run(GlobTool(), project, pattern="src/*.py") == ("src/a.py", False)
    assert await run(GlobTool(), project, pattern="**/*.txt") == ("docs/top.txt", False)
    assert await run(GlobTool(), project, pattern="*.py", path="src/deep") == (
        "src/deep/b.py",
        False,
    )
    assert await run(GlobTool(), project, pattern="*.nothing") == ("no files match", False)
    content, is_error = await run(GlobTool(), project, pattern="*", path="linkdir")
    assert is_error and "outside the working directory" in content


async def test_the_default_tool_set_offers_grep_and_glob_as_reading_tools() -> None:
    tools = ToolSet.default()
    assert ("grep" in tools, "glob" in tools) == (True, True)
    assert tools.read_only("grep") and tools.read_only("glob") and not tools.read_only("bash")


GITIGNORE = """\
# comment
*.log
!important.log
/root_only.txt
build/
docs/**/draft*
**/cache
a/**/z.txt
*.tmp
!keep/*.tmp
[Tt]humbs.db
name\\ with\\ space
\\#hash.txt
nested/deeper/
"""

PATHS = [
    "x.log", "important.log", "sub/y.log", "sub/important.log", "root_only.txt",
    "sub/root_only.txt", "build/out.o", "sub/build/out.o", "build.txt", "docs/a/draft1.md",
    "docs/draft2.md", "docs/a/final.md", "cache/c", "sub/cache/c", "a/z.txt", "a/b/c/z.txt",
    "a/b/y.txt", "f.tmp", "keep/g.tmp", "keep/sub/h.tmp", "Thumbs.db", "thumbs.db",
    "name with space", "#hash.txt", "nested/deeper/k", "nested/l", "other/nested/deeper/m",
    "plain.txt", "sub/.gitignore-test",
]  # fmt: skip


async def test_gitignore_is_read_as_git_reads_it(tmp_path: Path) -> None:
    """The worker's .gitignore reading agrees with git's own (`git check-ignore`) on
    negation, anchoring, directory-only patterns, `**`, classes and escapes."""
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True, timeout=60)
    (root / ".gitignore").write_text(GITIGNORE)
    (root / "sub").mkdir()
    (root / "sub" / ".gitignore").write_text("*.secret\n/local.txt\n")
    paths = [*PATHS, "sub/k.secret", "sub/local.txt", "local.txt", "sub/deep/local.txt"]
    for relative in paths:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text("needle\n")
    done = subprocess.run(
        ["git", "-C", str(root), "check-ignore", "--no-index", "--stdin"],
        input="\n".join(paths) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"},
    )
    ignored_by_git = set(done.stdout.splitlines())
    assert "x.log" in ignored_by_git and "plain.txt" not in ignored_by_git  # git ran
    content, is_error = await run(GlobTool(), root, pattern="*")
    assert not is_error
    listed = set(content.splitlines()) - {".gitignore", "sub/.gitignore"}
    assert listed == set(paths) - ignored_by_git
