"""Replay recorded conversation logs: verify, step, fork, export and import.

Replay re-runs the pure reducer (``start``/``transition``) over the events stored in a
``fanfold.db.Store`` and compares what it computes with what was recorded: effects,
state fingerprints and full snapshots. It never re-executes anything: this package
imports neither the runtime nor any provider or tool (a test checks), so an effect can
only ever be compared, never run. No network, no model, no tools.

- ``verify(store, id, tree=False) -> VerifyReport``: does today's reducer reproduce
  the log exactly? The report names the first divergence (with a readable diff) and
  every problem of the log itself (gaps, truncation, corrupt payloads...) as typed
  findings, each with its seq.
- ``steps(store, id, at=, until=, tree=)``: the history one transition at a time;
  ``state_at(store, id, seq)``: the state after one event.
- ``fork(store, id, at_seq)``: a new tree from any step of any conversation (a root at
  rest alone; otherwise ``fork_tree``: the whole tree as it was at that moment);
  ``fork_at``: the same at any agent's step, with an edit (``fanfold fork``,
  ``Runtime.fork``).
- ``export_jsonl`` / ``import_jsonl``: a tree's log as portable JSON Lines.
- ``lineage(store, row)``: where a fork came from, its source stored here or not;
  ``fork_origin(store, root)``: the agent picked, its seq and the edit.
"""

from fanfold.replay.errors import (
    EditRefused,
    ForkRefused,
    ImportRefused,
    LogCorrupt,
    LogDiverged,
    NoSuchStep,
    ReplayFailure,
    VersionRefused,
)
from fanfold.replay.fork import Forked, fork, fork_at, fork_tree
from fanfold.replay.lineage import ForkOrigin, Lineage, describe_edit, fork_origin, lineage
from fanfold.replay.portable import (
    FORMAT,
    FORMAT_VERSION,
    ExportSummary,
    export_jsonl,
    import_jsonl,
)
from fanfold.replay.report import (
    ConversationResult,
    Divergence,
    Finding,
    FindingKind,
    ReplayStep,
    VerifyReport,
)
from fanfold.replay.stepping import state_at, steps
from fanfold.replay.verify import verify

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ConversationResult",
    "Divergence",
    "EditRefused",
    "ExportSummary",
    "Finding",
    "FindingKind",
    "ForkOrigin",
    "ForkRefused",
    "Forked",
    "ImportRefused",
    "Lineage",
    "LogCorrupt",
    "LogDiverged",
    "NoSuchStep",
    "ReplayFailure",
    "ReplayStep",
    "VerifyReport",
    "VersionRefused",
    "describe_edit",
    "export_jsonl",
    "fork",
    "fork_at",
    "fork_origin",
    "fork_tree",
    "import_jsonl",
    "lineage",
    "state_at",
    "steps",
    "verify",
]
