"""``fanfold mcp``'s ledger of the trees it started (``<db>.mcp-delegations``) is a
file on disk like the log: read and written without ever waiting on a FIFO."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fanfold.serve.mcp_server import DelegationError, DelegationLedger

# A hang guard, not a timing: the old code waited for ever on each of these.
HANG_GUARD = 60


def test_a_ledger_keeps_ids_in_order_once_and_skips_what_is_no_id(tmp_path: Path) -> None:
    (tmp_path / "log.db.mcp-delegations").write_text("aaa\nbbb\naaa\n../x\n\nccc\n")
    ledger = DelegationLedger(tmp_path / "log.db")
    ledger.add("ddd")
    assert ledger.roots() == ("aaa", "bbb", "ccc", "ddd")
    assert "bbb" in ledger and "../x" not in ledger
    assert DelegationLedger(tmp_path / "log.db").roots() == ("aaa", "bbb", "ccc", "ddd")


def test_a_fifo_as_the_ledger_is_refused_when_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "log.db.mcp-delegations")
    with pytest.raises(DelegationError, match="a FIFO"):
        DelegationLedger(tmp_path / "log.db")


def test_a_fifo_as_the_ledger_is_refused_when_written_not_waited_on(tmp_path: Path) -> None:
    """The FIFO appears after the server read its ledger: the first delegation's
    ``add`` waited for a reader for ever."""
    code = (
        "import os, sys\n"
        "from fanfold.serve.mcp_server import DelegationError, DelegationLedger\n"
        "ledger = DelegationLedger(sys.argv[1])\n"
        "os.mkfifo(sys.argv[1] + '.mcp-delegations')\n"
        "try:\n"
        "    ledger.add('abc')\n"
        "except DelegationError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "log.db")],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("cannot write the delegation ledger"), done.stdout
