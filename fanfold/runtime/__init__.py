"""The Trio runtime: interprets the reducer's effects and persists every step."""

from fanfold.db import UnknownConversation
from fanfold.runtime.actor import tree_path
from fanfold.runtime.presence import DatabaseInUse
from fanfold.runtime.runtime import NotAtRest, NotRunning, Runtime, TreeNode, TurnResult

__all__ = [
    "DatabaseInUse",
    "NotAtRest",
    "NotRunning",
    "Runtime",
    "TreeNode",
    "TurnResult",
    "UnknownConversation",
    "tree_path",
]
