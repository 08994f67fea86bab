"""The ``bash`` tool: run a shell command as a real subprocess under Trio."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from fanfold.statemachine import ToolSpec
from fanfold.tools.output import HeadTailBuffer
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
        f"(default {default_timeout:g}, at most {max_timeout:g}), and background "
        "processes it started are killed when the call returns, so do not start servers "
        f"or daemons here. Output longer than {max_output_chars} characters is cut to its "
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

    The command runs in its own session and process group with stdin at end-of-file;
    stdout and stderr are captured together and capped at ``max_output_chars`` (head and
    tail kept). When the call ends -- normally, by timeout, or because the calling task
    is cancelled -- the whole process group is killed with SIGKILL and the shell is
    reaped, so no process the command started outlives the call. On cancellation
    ``trio.Cancelled`` propagates after the kill.

    A non-zero exit status is reported as an error result with the output and the code.
    """

    default_timeout: float = DEFAULT_TIMEOUT
    max_timeout: float = MAX_TIMEOUT
    max_output_chars: int = MAX_OUTPUT_CHARS
    shell: str = "bash"

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
        return await run_command(
            [self.shell, "-c", command], cwd, timeout=timeout, max_chars=self.max_output_chars
        )


async def run_command(argv: list[str], cwd: str, *, timeout: float, max_chars: int) -> ToolOutput:
    """Run ``argv`` in a new session; capture and cap output; kill its group at the end."""
    output = HeadTailBuffer(max_chars)
    # stdin is a pipe whose write end is already closed: a reader gets end-of-file at
    # once. (Not /dev/null: in some containers that is a plain file other programs
    # write into, and a command reading stdin would read their output.)
    stdin, closed = os.pipe()
    os.close(closed)
    try:
        process = await trio.lowlevel.open_process(
            argv,
            cwd=cwd,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        os.close(stdin)
    stdout = process.stdout
    assert stdout is not None
    try:
        with trio.move_on_after(timeout) as deadline:
            while chunk := await stdout.receive_some(65536):
                output.feed(chunk)
            await process.wait()
    finally:
        # Kill whatever is left of the group (background jobs, or everything on a
        # timeout or cancellation), then reap the shell even if we are being cancelled.
        # On a normal exit the shell is already reaped here; its pid cannot have been
        # reused as a group id while any member of its group is still alive.
        _kill_group(process.pid)
        with trio.CancelScope(shield=True):
            await process.wait()
            await stdout.aclose()
    text = output.text()
    if deadline.cancelled_caught:
        return ToolOutput.error(
            _with_status(
                text,
                f"timed out after {timeout:g} s: the command and every process it started "
                "were killed. Output up to that point is shown above. Retry with a larger "
                "timeout, or run something quicker.",
            )
        )
    code = process.returncode
    assert code is not None
    if code == 0:
        return ToolOutput.ok(_with_status(text, "exit code 0"))
    if code < 0:
        return ToolOutput.error(_with_status(text, f"killed by signal {_signal_name(-code)}"))
    return ToolOutput.error(_with_status(text, f"exit code {code}"))


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
