"""A user message is limited like a model's task (issue 33.9: ``delegate_task`` had no
size limit, "limit it like a user message", and user messages had none either): a
``start`` or ``send`` longer than ``MAX_TASK_CHARS`` is refused before anything is
recorded, and ``fanfold run`` says so in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from runtime_helpers import open_runtime, reply, script

from fanfold.db import Store
from fanfold.runtime import MessageTooLong
from fanfold.statemachine.control_tools import MAX_TASK_CHARS


async def test_start_and_send_refuse_a_message_longer_than_the_limit(tmp_path: Path) -> None:
    provider = script(0.0, root=[reply("first"), reply("second")])
    async with open_runtime(tmp_path, provider) as runtime:
        with pytest.raises(MessageTooLong, match="at most 1,000,000"):
            await runtime.start("x" * (MAX_TASK_CHARS + 1), cwd=tmp_path)
        root = await runtime.start("x" * MAX_TASK_CHARS, cwd=tmp_path)  # the limit itself
        await runtime.wait(root)
        events = len(runtime.store.events(root))
        with pytest.raises(MessageTooLong):
            await runtime.send(root, "y" * (MAX_TASK_CHARS + 1))
        assert len(runtime.store.events(root)) == events  # nothing recorded
    with Store.open(tmp_path / "log.db", read_only=True) as store:
        assert [r.id for r in store.list_roots()] == [root]


def test_fanfold_run_says_the_message_is_too_long_in_one_line(tmp_path: Path) -> None:
    task = tmp_path / "task.txt"
    task.write_text("x" * (MAX_TASK_CHARS + 1))
    done = subprocess.run(
        [sys.executable, "-c", "from fanfold.cli import main; main()",
         "run", "--no-live", "--db", str(tmp_path / "d.db"), "--file", str(task)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "the message is too long (1,000,001 characters, at most 1,000,000)" in done.stderr
    with Store.open(tmp_path / "d.db", read_only=True) as store:
        assert list(store.list_roots()) == []  # nothing recorded
