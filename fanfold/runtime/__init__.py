"""The Trio runtime: interprets the reducer's effects and persists every step."""

from typing import TYPE_CHECKING, Any

# The names below are imported from their modules when first asked for: importing one
# light module of the package (``fanfold.runtime.presence``, which `fanfold ls` uses)
# must not import the runtime itself, Trio, the tools and the providers with it.
if TYPE_CHECKING:
    from fanfold.db import UnknownConversation
    from fanfold.db.provenance import UntrustedTree, UserKey
    from fanfold.runtime.actor import NotRunning, tree_path
    from fanfold.runtime.host import StepObserver
    from fanfold.runtime.presence import DatabaseInUse
    from fanfold.runtime.results import (
        MessageTooLong,
        MissingTools,
        NotAtRest,
        ResumePlan,
        SkippedTree,
        TreeNode,
        TreeStep,
        TurnResult,
    )
    from fanfold.runtime.resuming import resume_plan
    from fanfold.runtime.runtime import Runtime
    from fanfold.runtime.writer import TreeDropped

_MODULES = {
    "DatabaseInUse": "fanfold.runtime.presence",
    "MissingTools": "fanfold.runtime.results",
    "MessageTooLong": "fanfold.runtime.results",
    "NotAtRest": "fanfold.runtime.results",
    "NotRunning": "fanfold.runtime.actor",
    "ResumePlan": "fanfold.runtime.results",
    "Runtime": "fanfold.runtime.runtime",
    "SkippedTree": "fanfold.runtime.results",
    "StepObserver": "fanfold.runtime.host",
    "TreeDropped": "fanfold.runtime.writer",
    "TreeNode": "fanfold.runtime.results",
    "TreeStep": "fanfold.runtime.results",
    "TurnResult": "fanfold.runtime.results",
    "UnknownConversation": "fanfold.db",
    "UntrustedTree": "fanfold.db.provenance",
    "UserKey": "fanfold.db.provenance",
    "resume_plan": "fanfold.runtime.resuming",
    "tree_path": "fanfold.runtime.actor",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "DatabaseInUse",
    "MessageTooLong",
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
