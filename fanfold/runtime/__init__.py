"""The Trio runtime: interprets the reducer's effects and persists every step."""

from fanfold.db import UnknownConversation
from fanfold.db.provenance import UntrustedTree, UserKey
from fanfold.runtime.actor import tree_path
from fanfold.runtime.host import StepObserver
from fanfold.runtime.presence import DatabaseInUse
from fanfold.runtime.runtime import (
    MissingTools,
    NotAtRest,
    NotRunning,
    ResumePlan,
    Runtime,
    SkippedTree,
    TreeNode,
    TreeStep,
    TurnResult,
    resume_plan,
)
from fanfold.runtime.writer import TreeDropped

__all__ = [
    "DatabaseInUse",
    "MissingTools",
    "NotAtRest",
    "NotRunning",
    "ResumePlan",
    "Runtime",
    "SkippedTree",
    "StepObserver",
    "TreeDropped",
    "TreeNode",
    "TreeStep",
    "TurnResult",
    "UnknownConversation",
    "UntrustedTree",
    "UserKey",
    "resume_plan",
    "tree_path",
]
