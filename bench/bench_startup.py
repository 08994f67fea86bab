"""Instructions of whole ``fanfold`` processes: each command's start-up (issue 36).

Counts, with callgrind, every instruction of one ``fanfold`` process from exec to exit
(interpreter start-up, imports, the command's work, shutdown), the same count at any
load of the machine. The processes measured:

- ``--version`` and ``--help``;
- ``CMD --help`` for every command of the group (``fanfold.cli.COMMANDS``);
- ``ls`` and ``show ID`` on the database of one offline demo run;
- ``run`` of the offline demo itself (the README's "Review this repository", the
  built-in scripted model; only fanfold's process is counted, not its tools' children).

Targets (issue 36): ``ls``, ``show`` and every ``--help`` <= 0.4 G; the demo's ``run``
<= 1.2 G. The demo runs in a scratch folder holding three small fixed Python files, with
``HOME`` and ``XDG_CONFIG_HOME`` there too, so that no configuration of the user's is read
and the counts do not depend on the checkout.

Run: ``.venv/bin/python bench/bench_startup.py [--tree DIR] [--only ls,show,run]
[--jobs 2] [--json out.json]``. ``--tree`` puts another source tree first on
``PYTHONPATH`` (the same venv), to measure a "before" checkout side by side. Needs
valgrind. Each process takes a few seconds to a couple of minutes under callgrind.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# The commands of the group, asked of the tree measured (its COMMANDS table).
_LIST = "import json, fanfold.cli as c; print(json.dumps(list(c.COMMANDS)))"
TARGETS = {"run": 1.2e9, "version": None}
DEFAULT_TARGET = 0.4e9
# What the ``fanfold`` console script does.
_MAIN = "import sys; sys.argv[0] = 'fanfold'; from fanfold.cli import main; sys.exit(main())"
SOURCES = {
    "app.py": "# TODO: split\nimport util\n\n\ndef main() -> None:\n    util.go()\n",
    "util.py": "def go() -> None:\n    print('go')  # FIXME\n",
    "test_app.py": "def test_go() -> None:\n    assert True\n",
}


def environment(tree: Path | None, home: Path, cached: bool) -> dict[str, str]:
    """The environment of a measured process: the tree first on the path, a scratch home;
    ``cached``: compiled bytecode kept (in a scratch cache), as an installed fanfold has."""
    env = dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))
    env.pop("FANFOLD_LOG_LEVEL", None)
    if cached:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(home / "pycache")
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def fanfold(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """One plain (uninstrumented) fanfold process."""
    script = [sys.executable, "-c", "from fanfold.cli import main; main()", *args]
    return subprocess.run(script, env=env, cwd=cwd, capture_output=True, text=True, check=True)


def instructions(args: list[str], env: dict[str, str], cwd: Path, scratch: Path) -> int:
    """Instructions of one whole ``fanfold ARGS`` process, under callgrind."""
    log = Path(tempfile.mkstemp(dir=scratch, suffix=".vg")[1])
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        f"--log-file={log}",
        sys.executable,
        "-c",
        _MAIN,
        *args,
    ]
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"fanfold {' '.join(args)} failed ({done.returncode}): {done.stderr}")
    found = re.search(r"I\s+refs:\s+([\d,]+)", log.read_text())
    if found is None:
        raise SystemExit(f"no instruction count for fanfold {' '.join(args)}")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", type=Path, help="source tree to measure (PYTHONPATH)")
    parser.add_argument("--only", help="comma-separated case names (e.g. ls,show,run,help)")
    parser.add_argument("--jobs", type=int, default=2, help="processes under valgrind at once")
    parser.add_argument("--json", type=Path, help="write the counts here")
    parser.add_argument(
        "--cached",
        action="store_true",
        help="keep compiled bytecode (each process is run once first to write it); by "
        "default the environment decides (PYTHONDONTWRITEBYTECODE: an editable checkout "
        "compiles fanfold's sources in every process)",
    )
    options = parser.parse_args()
    tree = options.tree.resolve() if options.tree else None

    with tempfile.TemporaryDirectory(prefix="fanfold-startup-") as folder:
        scratch = Path(folder)
        project = scratch / "project"
        project.mkdir()
        for name, text in SOURCES.items():
            (project / name).write_text(text)
        env = environment(tree, scratch, options.cached)
        db = scratch / "demo.db"
        task = "Review this repository"
        ran = fanfold("run", "--db", str(db), task, env=env, cwd=project)
        found = re.search(r"conversation: ([0-9a-f]{12})", ran.stdout)
        if found is None:
            raise SystemExit(f"the demo printed no conversation id: {ran.stdout[-500:]}")
        listed = subprocess.run(
            [sys.executable, "-c", _LIST], env=env, capture_output=True, text=True, check=True
        )
        commands: list[str] = json.loads(listed.stdout)
        cases: dict[str, list[str]] = {"version": ["--version"], "help": ["--help"]}
        cases |= {f"{name} --help": [name, "--help"] for name in commands}
        cases["ls"] = ["ls", "--db", str(db)]
        cases["show"] = ["show", found.group(1), "--db", str(db)]
        cases["run"] = ["run", "--db", str(scratch / "run.db"), task]
        if options.only:
            wanted = options.only.split(",")
            cases = {k: v for k, v in cases.items() if k in wanted}

        def measure(item: tuple[str, list[str]]) -> tuple[str, int]:
            name, args = item
            if options.cached:  # a first run writes the bytecode
                subprocess.run(
                    [sys.executable, "-c", _MAIN, *args], env=env, cwd=project, capture_output=True
                )
            if name == "run":
                (scratch / "run.db").unlink(missing_ok=True)
            count = instructions(args, env, project, scratch)
            print(f"{name}: {count:,}", file=sys.stderr, flush=True)
            return name, count

        with ThreadPoolExecutor(max_workers=options.jobs) as pool:
            counts = dict(pool.map(measure, cases.items()))

    print("| process (`fanfold ...`) | instructions | target |\n|---|---:|---:|")
    for name in cases:
        target = TARGETS.get(name, DEFAULT_TARGET)
        goal = "" if target is None else f"<= {target / 1e9:.1f} G"
        print(f"| {name} | {counts[name]:,} | {goal} |")
    if options.json:
        options.json.write_text(json.dumps({"tree": str(tree or ""), "counts": counts}, indent=1))


if __name__ == "__main__":
    main()
