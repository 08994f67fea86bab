"""Per-row checksums of the log: damage that still decodes is told from a divergence.

Every ``events`` row, ``effects`` row and stored snapshot carries a CRC-32 of the
columns that replay and verification read (schema migration 3). A reader recomputes
it from the row as read and calls a mismatch damage, naming the conversation and seq:
a flipped bit in a payload that leaves valid ASCII (``a`` -> ``c``) would otherwise
decode, replay, and read as the reducer disagreeing with the log.

CRC-32 detects every change of one to 32 consecutive bits and all but about 1 in 4e9
other changes. It is not a signature: whoever can write the file can recompute it.
Rows written before migration 3 hold NULL and are not checked.
"""

from __future__ import annotations

import struct
import zlib

# Fields are joined with a separator that the codec never writes (its JSON is ASCII
# with control characters escaped); a change of any one field changes the text.
_SEP = "\x1e"


def _crc(*fields: str) -> int:
    return zlib.crc32(_SEP.join(fields).encode("utf-8", "surrogatepass"))


_pack_time = struct.Struct("<d").pack


def event_checksum(
    conversation_id: str, seq: int, kind: str, payload: str, fingerprint: str, at: float
) -> int:
    """The checksum of one ``events`` row (every column but the checksum).

    A row of the events-only log (a version-6 fingerprint) takes its time as the
    float's 8 bytes, older rows as its ``repr``: formatting a float's shortest decimal
    was half the cost of a row's checksum (7 k of 13 k instructions, callgrind). The
    fingerprint column tells the two apart, and is itself covered: a fingerprint edited
    into another version no longer matches either way."""
    if " #####" not in fingerprint:
        return _crc(conversation_id, str(seq), kind, payload, fingerprint, repr(float(at)))
    head = f"{conversation_id}{_SEP}{seq}{_SEP}{kind}{_SEP}{payload}{_SEP}{fingerprint}{_SEP}"
    return zlib.crc32(_pack_time(at), zlib.crc32(head.encode("utf-8", "surrogatepass")))


def effect_checksum(conversation_id: str, seq: int, idx: int, kind: str, payload: str) -> int:
    """The checksum of one ``effects`` row (every column but the checksum)."""
    return _crc(conversation_id, str(seq), str(idx), kind, payload)


def snapshot_checksum(conversation_id: str, seq: int, text: str) -> int:
    """The checksum of a conversation's snapshot: its id, ``snapshot_seq`` and text."""
    return _crc(conversation_id, str(seq), text)
