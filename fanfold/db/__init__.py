"""fanfold's durable event log: a JSON codec for statemachine values and a SQLite
store (or, with the ``postgres`` extra, a PostgreSQL one: ``open_store``).

- ``codec``: versioned JSON for events, effects, states and every value they hold.
- ``Store``: append steps (event, effects, state fingerprint) of many conversations in
  one transaction; read conversations, their trees and events back; rebuild a state
  from its snapshot and the events after it.
"""

import sys
import types
from typing import TYPE_CHECKING, Any

from fanfold.db.errors import (
    CannotOpen,
    CodecError,
    ConversationExists,
    DatabaseError,
    EmptyLog,
    InvalidStep,
    LogUnavailable,
    LostSteps,
    NonFiniteNumber,
    ReadOnlyStore,
    ReplayError,
    SchemaError,
    SequenceError,
    StoreClosed,
    SyncFailed,
    TreeTakenOver,
    UnknownConversation,
    UnloggableStep,
    UnsupportedVersion,
)
from fanfold.db.factory import DatabaseUrl, display_target, is_postgres, open_store
from fanfold.db.records import (
    ConversationRow,
    RawConversation,
    RawEffect,
    RawEvent,
    RawLog,
    Status,
    Step,
    StoredEvent,
    ToolProgressRow,
    claim_unit,
    status_of,
)
from fanfold.db.store import BUSY_TIMEOUT_MS, Store
from fanfold.db.versions import SCHEMA_VERSION

# The codec's functions and the fingerprints (with them the reducer's types: most of
# what importing the log costs) are imported when first named (``__getattr__``):
# opening a log and listing its rows (``fanfold ls``) needs none of them (issue 36).
if TYPE_CHECKING:
    from fanfold.db.codec import (
        decode,
        decode_effect,
        decode_effects,
        decode_event,
        decode_state,
        encode,
        encode_effect,
        encode_effects,
        encode_event,
        encode_state,
    )
    from fanfold.db.fingerprint import fingerprint, step_fingerprint

_LAZY = {
    "decode": "codec",
    "decode_effect": "codec",
    "decode_effects": "codec",
    "decode_event": "codec",
    "decode_state": "codec",
    "encode": "codec",
    "encode_effect": "codec",
    "encode_effects": "codec",
    "encode_event": "codec",
    "encode_state": "codec",
    "fingerprint": "fingerprint",
    "step_fingerprint": "fingerprint",
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """``fanfold.db`` itself. Its ``fingerprint`` is the function, as it always was,
    although a submodule has that name too: the import system binds a submodule on its
    package when it is first imported, which here would put the module in the
    function's place (whoever imported it first: the store, replay)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "fingerprint" and isinstance(value, types.ModuleType):
            value = value.fingerprint
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "BUSY_TIMEOUT_MS",
    "SCHEMA_VERSION",
    "CannotOpen",
    "CodecError",
    "ConversationExists",
    "ConversationRow",
    "DatabaseError",
    "DatabaseUrl",
    "EmptyLog",
    "InvalidStep",
    "LogUnavailable",
    "LostSteps",
    "NonFiniteNumber",
    "RawConversation",
    "RawEffect",
    "RawEvent",
    "RawLog",
    "ReadOnlyStore",
    "ReplayError",
    "SchemaError",
    "SequenceError",
    "Status",
    "Step",
    "Store",
    "StoreClosed",
    "StoredEvent",
    "SyncFailed",
    "ToolProgressRow",
    "TreeTakenOver",
    "UnknownConversation",
    "UnloggableStep",
    "UnsupportedVersion",
    "claim_unit",
    "decode",
    "decode_effect",
    "decode_effects",
    "decode_event",
    "decode_state",
    "display_target",
    "encode",
    "encode_effect",
    "encode_effects",
    "encode_event",
    "encode_state",
    "fingerprint",
    "is_postgres",
    "open_store",
    "status_of",
    "step_fingerprint",
]
