"""fanfold's durable event log: a JSON codec for statemachine values and a SQLite
store (or, with the ``postgres`` extra, a PostgreSQL one: ``open_store``).

- ``codec``: versioned JSON for events, effects, states and every value they hold.
- ``Store``: append steps (event, effects, state fingerprint) of many conversations in
  one transaction; read conversations, their trees and events back; rebuild a state
  from its snapshot and the events after it.
"""

from fanfold.db.codec import (
    SCHEMA_VERSION,
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
from fanfold.db.fingerprint import fingerprint, step_fingerprint
from fanfold.db.records import (
    ConversationRow,
    RawConversation,
    RawEffect,
    RawEvent,
    RawLog,
    Status,
    Step,
    StoredEvent,
    claim_unit,
    status_of,
)
from fanfold.db.store import BUSY_TIMEOUT_MS, Store

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
