"""The ``bash`` tool: run a shell command as a real subprocess under Trio."""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from fanfold.statemachine import ToolSpec
from fanfold.tools.git_guard import guard_script, guarded_env
from fanfold.tools.output import HeadTailBuffer
from fanfold.tools.secrets import EnvPolicy
from fanfold.tools.tool import ToolInputError, ToolOutput

DEFAULT_TIMEOUT = 120.0
MAX_TIMEOUT = 600.0
MAX_OUTPUT_CHARS = 30_000


def bash_spec(default_timeout: float, max_timeout: float, max_output_chars: int) -> ToolSpec:
    """The ``bash`` tool's spec for the given limits."""
    return ToolSpec.from_schema(
        "bash",
        "Run a shell command with `bash -c` in the working directory and return its "
        "combined stdout and stderr, followed by the exit code. Each call starts a fresh "
        "shell: `cd`, variables and other shell state do not carry over to the next call, "
        "so chain dependent steps with `&&`. Stdin is closed: interactive programs "
        "(editors, pagers, password or confirmation prompts) cannot be used, so pass "
        "non-interactive flags such as `-y`. The command is killed after `timeout` seconds "
        f"(default {default_timeout:g}, at most {max_timeout:g}). The call ends when the "
        "shell exits: every process the command started that is still running then "
        "(background jobs, daemons, `nohup` or `setsid` processes) is killed, so do not "
        "start servers or daemons here; the result says how many were killed. Output "
        f"longer than {max_output_chars} characters is cut to its "
        "beginning and end; narrow it with grep, head or tail. To read, create or change "
        "files prefer read_file, write_file and edit_file over cat, echo or sed.",
        {
            "type": "object",
            "required": ["command"],
            "additionalProperties": False,
            "properties": {
                "command": {
                    "type": "string",
                    "minLength": 1,
                    "description": "The bash command line to run, e.g. `pytest -q tests/`",
                },
                "timeout": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": _plain(max_timeout),
                    "description": (
                        f"Time limit in seconds (default {default_timeout:g}, max {max_timeout:g})"
                    ),
                },
            },
        },
    )


def _plain(number: float) -> float | int:
    """``600.0`` as ``600``, so schemas and messages read naturally."""
    return int(number) if float(number).is_integer() else number


@attrs.frozen
class BashTool:
    """Runs ``bash -c command`` in the conversation's working directory.

    The command runs under a per-call supervisor process (:mod:`fanfold.tools.supervisor`)
    in its own session, with stdin at end-of-file and the environment ``env_policy``
    builds; stdout and stderr are captured together and capped at ``max_output_chars``
    (head and tail kept). The call ends when the shell exits, the time limit passes, or
    the calling task is cancelled; then every process the command started is killed
    (on Linux daemons and ``setsid`` processes too, via the subreaper; elsewhere the
    shell's process group), also when fanfold itself dies. The result says what
    happened: exit code, time-out, how many processes were killed. On cancellation
    ``trio.Cancelled`` propagates after the kill.

    A non-zero exit status is reported as an error result with the output and the code.

    ``guard_git`` (``confined()``: for an agent whose bash runs only through allow
    patterns): the command runs with git's settings that switch off every program the
    repository's configuration could start, and a guarding ``git`` first on its
    ``PATH`` (:mod:`fanfold.tools.git_guard`).
    """

    default_timeout: float = DEFAULT_TIMEOUT
    max_timeout: float = MAX_TIMEOUT
    max_output_chars: int = MAX_OUTPUT_CHARS
    shell: str = "bash"
    env_policy: EnvPolicy = EnvPolicy()
    guard_git: bool = False

    def confined(self) -> BashTool:
        """This tool for a confined agent: git runs guarded."""
        return attrs.evolve(self, guard_git=True)

    @property
    def spec(self) -> ToolSpec:
        """The tool's name, description and schema."""
        return bash_spec(self.default_timeout, self.max_timeout, self.max_output_chars)

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        """Run ``args["command"]`` with the optional ``args["timeout"]`` (seconds)."""
        command: str = args["command"]
        timeout = float(args.get("timeout", self.default_timeout))
        timeout = min(timeout, self.max_timeout)
        if not os.path.isdir(cwd):
            raise ToolInputError(f"the working directory '{cwd}' does not exist")
        env = self.env_policy.command_env(os.environ)
        if self.guard_git:
            env = with_git_guard(env)
        return await run_command(
            [self.shell, "-c", command],
            cwd,
            timeout=timeout,
            max_chars=self.max_output_chars,
            env=env,
        )


MIN_GUARDED_GIT = (2, 31)
_guard_dirs: dict[str, str] = {}


def with_git_guard(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a confined agent's command (:mod:`fanfold.tools.git_guard`): git's
    settings that switch its programs off, and a directory first on ``PATH`` whose
    ``git`` adds those the configuration's drivers name and runs the git ``PATH``
    would have found (``env`` with the settings alone when there is none)."""
    env = guarded_env(env)
    path = env.get("PATH", os.defpath)
    real = shutil.which("git", path=path)
    if real is None:
        return env
    real = os.path.realpath(real)
    return {**env, "PATH": _guard_directory(real) + os.pathsep + path}


def _git_version(git: str) -> tuple[int, int] | None:
    """``git version``'s major and minor number (None: it did not say). Once per
    process and git, when its guard is made; a few milliseconds."""
    try:
        done = subprocess.run(
            [git, "version"], capture_output=True, stdin=subprocess.DEVNULL, timeout=10
        )
        words = done.stdout.decode("ascii", "replace").split()
        major, minor = words[2].split(".")[:2]
        return int(major), int(minor)
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def _guard_directory(real_git: str) -> str:
    """A private directory holding the ``git`` that guards ``real_git``; made once per
    process and real git, again if something removed it (a missing guard would let
    the real git be found instead), removed at exit."""
    directory = _guard_dirs.get(real_git)
    if directory is not None and os.path.isfile(os.path.join(directory, "git")):
        return directory
    directory = tempfile.mkdtemp(prefix="fanfold-git-")  # 0700
    atexit.register(shutil.rmtree, directory, True)
    version = _git_version(real_git)
    if version is None or version < MIN_GUARDED_GIT:
        # GIT_CONFIG_COUNT, which the guard's settings travel in, came with git 2.31:
        # an older git would ignore them and run what the repository names. Refuse.
        shown = ".".join(map(str, version)) if version else "of an unknown version"
        message = (
            f"fanfold: git {shown} at {real_git} cannot run with the repository's "
            "programs switched off (needs git 2.31 or later); refused for this agent"
        )
        script = f"#!/bin/sh\necho {shlex.quote(message)} >&2\nexit 126\n"
    else:
        script = guard_script(real_git)
    path = os.path.join(directory, "git")
    with open(path, "w", encoding="utf-8") as out:
        out.write(script)
    os.chmod(path, 0o700)
    _guard_dirs[real_git] = directory
    return directory


SUPERVISOR = Path(__file__).with_name("supervisor.py")
# How long fanfold waits, past the time limit, for the supervisor to report (it kills
# and reports within milliseconds; this only bounds a supervisor that is itself stuck).
SUPERVISOR_GRACE = 10.0
# How long output is still read once the supervisor has reported: on Linux every
# writer is dead by then and end-of-file is immediate; elsewhere a process that left
# the process group may hold the pipe open.
OUTPUT_GRACE = 1.0


async def run_command(
    argv: list[str],
    cwd: str,
    *,
    timeout: float,
    max_chars: int,
    env: Mapping[str, str] | None = None,
) -> ToolOutput:
    """Run ``argv`` under a per-call supervisor (see :mod:`fanfold.tools.supervisor`);
    capture and cap its output; every process it started is dead when this returns."""
    output = HeadTailBuffer(max_chars)
    # The supervisor's stdin is the lifeline: fanfold is its only writer, and closing
    # it (or dying) tells the supervisor to kill everything and report.
    lifeline_r, lifeline_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-I", "-S", str(SUPERVISOR), str(status_w), repr(timeout), *argv],
            cwd=cwd,
            env=env,
            stdin=lifeline_r,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(status_w,),
            start_new_session=True,
        )
    except BaseException:
        for fd in (lifeline_w, status_r):
            os.close(fd)
        raise
    finally:
        os.close(lifeline_r)
        os.close(status_w)
    stdout = process.stdout
    assert stdout is not None
    status = trio.lowlevel.FdStream(status_r)
    report: dict[str, str] | None = None
    try:
        with trio.move_on_after(timeout + SUPERVISOR_GRACE):
            async with trio.open_nursery() as nursery:
                output_done = trio.Event()

                async def pump() -> None:
                    while chunk := await stdout.receive_some(65536):
                        output.feed(chunk)
                    output_done.set()

                nursery.start_soon(pump)
                report = _parse_report(await _read_all(status))
                with trio.move_on_after(OUTPUT_GRACE):
                    await output_done.wait()
                nursery.cancel_scope.cancel()
            await process.wait()
    finally:
        # Cancelled, or the supervisor did not report: tell it to stop (end-of-file on
        # its lifeline), and wait -- shielded, bounded -- until it has killed everything.
        os.close(lifeline_w)
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                await _wait_real_time(process, SUPERVISOR_GRACE)
            if process.returncode is None:
                process.kill()
                _kill_group(process.pid)
                await process.wait()
            await stdout.aclose()
            await status.aclose()
    return _result(output.text(), report, timeout)


async def _wait_real_time(process: trio.Process, seconds: float) -> None:
    """Wait until ``process`` exits, at most ``seconds`` of real time.

    Real time, not Trio's clock: the supervisor needs a few real milliseconds to kill
    what the command started, whatever clock the application runs Trio on. On a clock
    that skips idle time (a test's autojump clock, a simulation) a Trio deadline passes
    at once, and the supervisor was killed before it could kill the command's own
    session, which then ran on (found by a test whose cancel came while the shell ran).
    """
    if not hasattr(os, "waitid"):  # macOS: Trio's clock is the only timer at hand
        with trio.move_on_after(seconds):
            await process.wait()
        return
    exited = await trio.to_thread.run_sync(_exits_within, process.pid, seconds)
    if exited:
        await process.wait()  # reaps it (the thread only looked)


def _exits_within(pid: int, seconds: float) -> bool:
    """Whether child ``pid`` has exited within ``seconds`` (it is not reaped)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True  # already reaped
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)


async def _read_all(stream: trio.lowlevel.FdStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


def _parse_report(data: bytes) -> dict[str, str] | None:
    """The supervisor's ``key=value`` line; None if it wrote none (it was killed)."""
    text = data.decode("utf-8", "replace").strip()
    if not text.startswith("end="):
        return None
    return dict(field.partition("=")[::2] for field in text.split("\t"))


def _plural(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 'es' if what.endswith('s') else 's'}"


def _result(text: str, report: dict[str, str] | None, timeout: float) -> ToolOutput:
    """The model-facing result: the output, then what happened, as it happened."""
    if report is None:
        return ToolOutput.error(
            _with_status(
                text,
                "the command's supervisor did not report; the command and every process "
                "it started were killed",
            )
        )
    if report.get("end") == "error":
        return ToolOutput.error(_with_status(text, str(report.get("error"))))
    killed = int(report.get("killed", 0))
    left = int(report.get("left", 0))
    notes = []
    if killed and report.get("background"):
        notes.append(
            f"killed {_plural(killed, 'background process')} still running when the shell exited"
        )
    if left:
        notes.append(f"{_plural(left, 'process')} could not be killed")
    extra = "".join(f"; {note}" for note in notes)
    end = report.get("end")
    if end == "timeout":
        return ToolOutput.error(
            _with_status(
                text,
                f"timed out after {timeout:g} s: killed {_plural(killed, 'process')} (the "
                f"command and everything it started){extra}. Output up to that point is "
                "shown above. Retry with a larger timeout, or run something quicker.",
            )
        )
    if end == "stopped":
        return ToolOutput.error(
            _with_status(text, f"stopped: killed {_plural(killed, 'process')}{extra}")
        )
    if "signal" in report:
        return ToolOutput.error(
            _with_status(text, f"killed by signal {_signal_name(int(report['signal']))}{extra}")
        )
    code = int(report.get("code", -1))
    status = f"exit code {code}{extra}"
    return (
        ToolOutput.ok(_with_status(text, status))
        if code == 0
        else ToolOutput.error(_with_status(text, status))
    )


def _with_status(text: str, status: str) -> str:
    body = text.rstrip("\n") if text.strip() else "(no output)"
    return f"{body}\n[{status}]"


def _signal_name(number: int) -> str:
    try:
        return f"{signal.Signals(number).name} ({number})"
    except ValueError:
        return str(number)


def _kill_group(pgid: int) -> None:
    """SIGKILL every process in the group ``pgid``; nothing left to kill is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
