"""Export a conversation tree's log as JSON Lines, and import one into another database.

Format (``FORMAT`` version ``FORMAT_VERSION``), one JSON object per line:

1. a header: ``{"record": "header", "format": "fanfold-log", "format_version": 1,
   "event_schema_version": 1, "root_id": ..., "conversations": N, "steps": M}``;
2. N conversation rows: ``{"record": "conversation", "id": ..., "parent_id": ...,
   "root_id": ..., "depth": ..., "task": ..., "user_initiated": ..., "created_at": ...,
   "updated_at": ..., "phase": ..., "status": ..., "last_seq": ..., "snapshot_seq": ...,
   "forked_from": ..., "forked_at_seq": ..., "snapshot": {...} | null}``, parents first;
3. M steps, in the order they were written: ``{"record": "step", "conversation_id": ...,
   "seq": ..., "at": ..., "event": {...}, "effects": [{...}, ...], "fingerprint": ...}``,
   and (format 2) ``"stored": "..."`` when the event is stored in the compact form:
   that exact text, blob references and all; (format 3) ``"stored_effects": [...]``
   when an effect is: one entry per effect, its exact stored text, or null for an
   effect stored as an object document. An export says format 3 only when it holds
   ``stored_effects`` (a log that stored effects), 2 otherwise.

Events, effects and snapshots are the stored codec documents (each with its ``"v"``),
copied verbatim but for blob references (``fanfold.db.codec``, "Blobs"), which are
written inline, the value in place of its reference, as the same document encodes
without a blobs table: an imported log keeps its recorded effects and fingerprints, so
``verify`` in the new database judges the log as it was recorded. A compact event
(schema 6 and later) is exported as its object document, which is readable on its own,
and (format 2) as the exact text stored: its fingerprint is a digest of that text, and
encoding the same value again need not give the same text (a log written before a
later field of the same schema version lacks it; today's encoder writes it). The
importer stores that text after checking it decodes to the object document's value.
Format 1 files (no ``stored``) are imported as before: re-encoded.

Format 3 does the same for effects (``stored_effects``), for the same reason: a
version-5 fingerprint (a log that stored effects) digests each effect's stored text
too, and a value nested in an effect gains fields (``Limits.approval_timeout``, a
permission layer's ``ask``, both schema 7) that today's encoder writes at their
defaults while the older text lacks them. The importer keeps each such text after
checking it is a compact effect document that decodes, its blob references resolved
from the object document's values, to the object document's value. Files of format 1
and 2 carry no effect texts: their effects are re-encoded, and a tree whose stored
effects predate a later field of their schema diverges after such an import.

A fork's rows name their source (``forked_from``, ``forked_at_seq``) whether or not
the source is in the database exported from: a fork imported without its source keeps
that lineage (``replay.lineage``), so export -> import -> export gives the same bytes.
Files written before (where such rows had both null) import as they are.

An imported tree is an inert record: its provenance record says ``imported`` (with
the file's name, sha256 and the time) and carries no mark, so no runtime ever
continues it (see ``fanfold.db.provenance``); view, replay, verify or fork it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any

import attrs

from fanfold.db import (
    CodecError,
    ConversationExists,
    ConversationRow,
    NonFiniteNumber,
    RawConversation,
    RawEffect,
    RawEvent,
    RawLog,
    Status,
    Store,
    UnsupportedVersion,
    codec,
    decode_effect,
    decode_event,
    decode_state,
)
from fanfold.db.checksum import snapshot_checksum
from fanfold.db.provenance import Origin, TreeRecord
from fanfold.replay.core import damaged_row
from fanfold.replay.errors import ImportRefused, LogCorrupt, VersionRefused
from fanfold.replay.lineage import lineage
from fanfold.replay.report import Finding, FindingKind
from fanfold.statemachine import ConversationCreated, ConversationForked

FORMAT = "fanfold-log"
"""The ``format`` name in an export's header."""
FORMAT_VERSION = 3
"""The layout version of the lines of an export (not the event schema version)."""


@attrs.frozen
class ExportSummary:
    """What ``export_jsonl`` wrote."""

    root_id: str
    conversations: int
    steps: int


def _dumps(value: Any) -> str:
    # allow_nan=False: an export never holds NaN or Infinity (JSON has neither).
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def export_jsonl(store: Store, conversation_id: str, out: IO[str]) -> ExportSummary:
    """Write the whole tree holding ``conversation_id`` (from its root) to ``out``.

    Raises UnknownConversation for an unknown id, LogCorrupt if a stored document is
    not even JSON (nothing is decoded otherwise: a log is exported as recorded).
    """
    root = store.conversation(conversation_id).root_id
    try:
        return _export(store, root, out)
    except ValueError as exc:  # _dumps: a non-finite time in a row (a damaged log)
        raise LogCorrupt(
            Finding(FindingKind.CORRUPT_PAYLOAD, root, None, f"cannot export it: {exc}")
        ) from None


def _export(store: Store, root: str, out: IO[str]) -> ExportSummary:
    logs = store.raw_tree(root)
    events: list[RawEvent] = []
    blobs: dict[str, str] = {}
    lines: list[str] = []
    for log in logs:
        row = log.row
        snapshot_doc = None
        if log.snapshot_json is not None:
            snapshot_doc = _parse(
                log.snapshot_json,
                row.id,
                row.snapshot_seq or 0,
                "its snapshot",
                log.blobs,
                state=True,
            )
        line: dict[str, Any] = {"record": "conversation"}
        line.update({name: getattr(row, name) for name in ConversationRow.COLUMNS})
        line["status"] = row.status.value
        source = lineage(store, row)
        if source is not None:
            # An imported fork whose source is not in this database still names it
            # (its seq 0 does): the export is the file it was imported from.
            line["forked_from"], line["forked_at_seq"] = source.source_id, source.seq
        line["snapshot"] = snapshot_doc
        lines.append(_dumps(line))
        _check_contiguous(log)
        events.extend(log.events)
        blobs.update(log.blobs)
    events.sort(key=lambda e: e.rowid if e.rowid is not None else -1)
    compact = f"[{codec.SCHEMA_VERSION},"
    # Format 3 only where it is needed (a log that stored effects): the export of an
    # events-only log stays readable by a fanfold that reads format 2.
    stores_effects = any(e.payload.startswith(compact) for ev in events for e in ev.effects)
    header = {
        "record": "header",
        "format": FORMAT,
        "format_version": FORMAT_VERSION if stores_effects else 2,
        "event_schema_version": codec.SCHEMA_VERSION,
        "root_id": root,
        "conversations": len(logs),
        "steps": len(events),
    }
    out.write(_dumps(header) + "\n")
    for line_text in lines:
        out.write(line_text + "\n")
    for event in events:
        where = event.conversation_id, event.seq
        step = {
            "record": "step",
            "conversation_id": event.conversation_id,
            "seq": event.seq,
            "at": event.at,
            "event": _parse(event.payload, *where, "its event", blobs, event=True),
            "effects": [
                _parse(e.payload, *where, f"its effect {e.idx}", blobs, effect=True)
                for e in event.effects
            ],
            "fingerprint": event.fingerprint,
        }
        if event.payload.startswith(compact):
            # Compact, of today's schema: the exact text the fingerprint's digest is
            # of (an older schema's document is stored in its own form on import).
            step["stored"] = event.payload
        if any(e.payload.startswith(compact) for e in event.effects):
            # The same for the effects (format 3): a version-5 fingerprint digests their
            # stored texts too, and a value re-encoded today may not give them back.
            step["stored_effects"] = [
                e.payload if e.payload.startswith(compact) else None for e in event.effects
            ]
        out.write(_dumps(step) + "\n")
    return ExportSummary(root, len(logs), len(events))


def _check_contiguous(log: RawLog) -> None:
    """Refuse a log with a missing seq (``import`` could never load it back, so the
    export would be a bug report nobody can open) or a row that fails its checksum.
    ``fanfold replay --verify`` reports such a log in full."""
    row = log.row
    # A row that fails its checksum is refused too: import would write it with a fresh
    # checksum, and the damage would come back as a divergence, or as nothing at all.
    if (
        log.snapshot_json is not None
        and log.snapshot_checksum is not None
        and row.snapshot_seq is not None
        and log.snapshot_checksum != snapshot_checksum(row.id, row.snapshot_seq, log.snapshot_json)
    ):
        raise LogCorrupt(
            Finding(
                FindingKind.CORRUPT_PAYLOAD,
                row.id,
                row.snapshot_seq,
                f"the snapshot taken after event {row.snapshot_seq} is damaged (checksum "
                "mismatch): cannot export it",
            )
        )
    for expected, event in enumerate(log.events):
        damaged = damaged_row(row.id, event)
        if damaged is not None:
            raise LogCorrupt(attrs.evolve(damaged, message=f"{damaged.message}: cannot export it"))
        if event.seq != expected:
            raise LogCorrupt(
                Finding(
                    FindingKind.MISSING_EVENT,
                    row.id,
                    expected,
                    f"event {expected} is missing (the next stored one is {event.seq}): "
                    "cannot export it",
                )
            )
    last = log.events[-1].seq if log.events else -1
    if last < row.last_seq:
        raise LogCorrupt(
            Finding(
                FindingKind.TRUNCATED,
                row.id,
                last + 1,
                f"the log ends at seq {last} but its conversation row names {row.last_seq}: "
                "cannot export it",
            )
        )


def _parse(
    text: str,
    conversation_id: str,
    seq: int,
    what: str,
    blobs: Mapping[str, str] | None = None,
    *,
    event: bool = False,
    effect: bool = False,
    state: bool = False,
) -> Any:
    """The document ``text`` parsed; with ``blobs``, its blob references written inline
    (an export carries no blobs table: each document holds its values); an ``event``
    stored in the compact form as its object document."""
    try:
        document = codec.loads_strict(text)  # refuses NaN/Infinity: an export never holds one
        if event and type(document) is list:
            return codec.inline_event(text, blobs or {})
        if effect and type(document) is list:
            return codec.inline_effect(text, blobs or {})
        if state and type(document) is list:
            return codec.inline_state(text, blobs or {})
        return codec.expand_blobs(document, blobs) if blobs else document
    except CodecError as exc:
        raise LogCorrupt(
            Finding(
                FindingKind.CORRUPT_PAYLOAD,
                conversation_id,
                seq,
                f"{what} is not valid JSON ({exc}): cannot export it",
            )
        ) from None


# ------------------------------------------------------------------ import

_CONVERSATION_KEYS = frozenset({"record", "snapshot", *ConversationRow.COLUMNS})
_STEP_KEYS = frozenset(
    {"record", "conversation_id", "seq", "at", "event", "effects", "fingerprint"}
)
# Format 2: "stored" where the event was compact; format 3: "stored_effects" where an
# effect was.
_STEP_OPTIONAL = frozenset({"stored", "stored_effects"})
_HEADER_KEYS = frozenset(
    {
        "record",
        "format",
        "format_version",
        "event_schema_version",
        "root_id",
        "conversations",
        "steps",
    }
)


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def _check_keys(line: int, record: dict[str, Any], keys: frozenset[str]) -> None:
    missing = sorted(keys - record.keys())
    if missing:
        raise ImportRefused(f"{record['record']} is missing {', '.join(missing)}", line=line)
    extra = sorted(record.keys() - keys)
    if extra:
        raise ImportRefused(
            f"{record['record']} has unknown field(s) {', '.join(extra)}", line=line
        )


# Fields kept as JSON documents (stored ASCII-escaped, so any text round-trips) or as
# an escaped copy (the task column); every other string is stored as SQLite text.
_DOCUMENT_FIELDS = frozenset({"event", "effects", "snapshot", "task"})


def _refuse_unstorable_text(line: int, record: dict[str, Any]) -> None:
    """Refuse a record whose ids or other column text cannot be stored: a lone
    surrogate (half a UTF-16 pair, written ``\\ud83d`` in JSON) is not Unicode text,
    and SQLite's refusal of it would be a codec message about an unnamed field."""
    for key, value in record.items():
        if key in _DOCUMENT_FIELDS:
            continue
        for text in _strings(value):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise ImportRefused(
                    f"{key!r} holds text that is not valid Unicode (a lone surrogate); "
                    "nothing was imported",
                    line=line,
                ) from None


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _require(line: int, ok: bool, message: str) -> None:
    if not ok:
        raise ImportRefused(message, line=line)


class _Importer:
    """Reads and checks every line; nothing is written until all of them are good."""

    def __init__(self) -> None:
        self.header: dict[str, Any] | None = None
        self.rows: dict[str, RawConversation] = {}
        self.row_lines: dict[str, int] = {}
        self.events: list[RawEvent] = []
        self.seqs: dict[str, int] = {}
        self.blobs: dict[str, str] = {}  # values the stored texts refer to (format 2)
        self.format_version = 1

    def read(self, lines: Iterable[str]) -> None:
        for number, text in enumerate(lines, 1):
            if number == 1:
                # A byte-order mark: not part of the JSON, written by some editors.
                text = text.removeprefix("\ufeff")
            if not text.strip():
                continue
            try:
                record = codec.loads_strict(text)
            except NonFiniteNumber as exc:
                raise ImportRefused(f"{exc}; nothing was imported", line=number) from None
            except CodecError as exc:
                raise ImportRefused(str(exc), line=number) from None
            if not isinstance(record, dict) or not isinstance(record.get("record"), str):
                raise ImportRefused("not a record of a fanfold log", line=number)
            _refuse_unstorable_text(number, record)
            kind = record["record"]
            if self.header is None:
                _require(number, kind == "header", "the file does not start with a header")
                self._header(number, record)
            elif kind == "conversation":
                self._conversation(number, record)
            elif kind == "step":
                self._step(number, record)
            else:
                raise ImportRefused(f"unknown record {kind!r}", line=number)
        if self.header is None:
            raise ImportRefused("the file is empty: no header")

    def _header(self, line: int, record: dict[str, Any]) -> None:
        if record.get("format") != FORMAT:
            raise ImportRefused(
                f"not a fanfold log (format {record.get('format')!r}, expected {FORMAT!r})",
                line=line,
            )
        layout: Any = record.get("format_version")
        if not _is_int(layout) or not 1 <= layout <= FORMAT_VERSION:
            raise ImportRefused(
                f"format version {layout!r} is not supported: this fanfold reads format "
                f"version 1 to {FORMAT_VERSION}",
                line=line,
            )
        self.format_version = layout
        version: Any = record.get("event_schema_version")
        supported = codec.SCHEMA_VERSION
        if not _is_int(version) or version < 1:
            raise VersionRefused(
                f"event schema version {version!r} is unknown: this fanfold reads event "
                f"schema versions 1 to {supported}",
                found=version,
                supported=supported,
                line=line,
            )
        if version > supported:
            raise VersionRefused(
                f"the log was written with event schema version {version}, newer than this "
                f"fanfold reads (versions 1 to {supported}): upgrade fanfold to import it",
                found=version,
                supported=supported,
                line=line,
            )
        _check_keys(line, record, _HEADER_KEYS)
        _require(line, isinstance(record["root_id"], str), "root_id must be a string")
        for key in ("conversations", "steps"):
            _require(line, _is_int(record[key]) and record[key] >= 0, f"{key} must be a count")
        self.header = record

    def _decode(self, line: int, where: str, document: Any, decode: Any) -> str:
        """Check that ``document`` decodes; returns its stored text."""
        text = _dumps(document)
        try:
            decode(text)
        except UnsupportedVersion as exc:
            raise VersionRefused(
                f"{where} was written with event schema version {exc.version!r}; this fanfold "
                f"reads versions 1 to {exc.supported}",
                found=exc.version,
                supported=exc.supported,
                line=line,
            ) from None
        except CodecError as exc:
            raise ImportRefused(f"{where} cannot be read: {exc}", line=line) from None
        return text

    def _conversation(self, line: int, record: dict[str, Any]) -> None:
        _check_keys(line, record, _CONVERSATION_KEYS)
        cid = record["id"]
        _require(line, isinstance(cid, str) and bool(cid), "id must be a non-empty string")
        _require(line, cid not in self.rows, f"conversation {cid!r} is listed twice")
        for key in ("parent_id", "task", "forked_from"):
            _require(line, record[key] is None or isinstance(record[key], str), f"bad {key}")
        for key in ("root_id", "phase"):
            _require(line, isinstance(record[key], str), f"{key} must be a string")
        for key in ("depth", "last_seq"):
            _require(line, _is_int(record[key]) and record[key] >= 0, f"bad {key}")
        for key in ("snapshot_seq", "forked_at_seq"):
            _require(line, record[key] is None or _is_int(record[key]), f"bad {key}")
        for key in ("created_at", "updated_at"):
            _require(line, _is_number(record[key]), f"{key} must be a number")
        _require(line, isinstance(record["user_initiated"], bool), "bad user_initiated")
        _require(
            line,
            record["status"] in {s.value for s in Status},
            f"unknown status {record['status']!r}",
        )
        snapshot = None
        if record["snapshot"] is not None:
            snapshot = self._decode(
                line, f"the snapshot of conversation {cid!r}", record["snapshot"], decode_state
            )
            _require(line, _is_int(record["snapshot_seq"]), "a snapshot needs its snapshot_seq")
        fields = {name: record[name] for name in ConversationRow.COLUMNS}
        fields["created_at"] = float(fields["created_at"])
        fields["updated_at"] = float(fields["updated_at"])
        fields["status"] = Status(fields["status"])
        self.rows[cid] = RawConversation(ConversationRow(**fields), snapshot)
        self.row_lines[cid] = line

    def _step(self, line: int, record: dict[str, Any]) -> None:
        _check_keys(line, record, _STEP_KEYS | (_STEP_OPTIONAL & record.keys()))
        cid, seq = record["conversation_id"], record["seq"]
        _require(line, isinstance(cid, str), "conversation_id must be a string")
        _require(line, _is_int(seq) and seq >= 0, "seq must be an integer >= 0")
        _require(line, _is_number(record["at"]), "at must be a number")
        _require(line, isinstance(record["fingerprint"], str), "fingerprint must be a string")
        _require(line, isinstance(record["effects"], list), "effects must be an array")
        expected = self.seqs.get(cid, 0)
        _require(
            line,
            seq == expected,
            f"conversation {cid!r}: expected seq {expected}, got {seq} "
            "(steps of a conversation must come in order, without gaps)",
        )
        self.seqs[cid] = expected + 1
        where = f"conversation {cid!r}, seq {seq}"
        payload = self._decode(line, f"the event of {where}", record["event"], decode_event)
        event = decode_event(payload)
        if "stored" in record:
            payload = self._stored(line, where, record["stored"], event, record["event"])
        if seq == 0:
            _require(
                line,
                isinstance(event, ConversationCreated | ConversationForked)
                and event.conversation_id == cid,
                f"{where}: the first event must create this conversation",
            )
        stored_effects: list[Any] = [None] * len(record["effects"])
        if "stored_effects" in record:
            stored_effects = self._stored_effects(line, where, record)
        effects = []
        for index, document in enumerate(record["effects"]):
            text = self._decode(line, f"effect {index} of {where}", document, decode_effect)
            if stored_effects[index] is not None:
                text = self._stored_effect(
                    line, f"effect {index} of {where}", stored_effects[index], text
                )
            effects.append(RawEffect(index, document["type"], text))
        self.events.append(
            RawEvent(
                cid,
                seq,
                type(event).__name__,
                payload,
                record["fingerprint"],
                float(record["at"]),
                tuple(effects),
            )
        )

    def _stored(self, line: int, where: str, stored: Any, event: Any, event_document: Any) -> str:
        """The exact stored text of a compact event (format 2), checked: a compact
        document of a schema version this fanfold reads whose value, its blob references resolved
        from the object document's values, is the event's. Its blobs are kept for
        the store (``blobs``)."""
        _require(
            line,
            self.format_version >= 2,
            f"{where}: 'stored' is a field of format 2, the file says format {self.format_version}",
        )
        _require(line, isinstance(stored, str), f"{where}: 'stored' must be a string")
        values: dict[str, str] = {}
        codec.encode_event_compact(event, values)  # the blob values the event holds
        return self._same_stored(
            line, where, stored, "event", event, values, decode_event, _dumps(event_document)
        )

    def _same_stored(
        self,
        line: int,
        where: str,
        stored: str,
        kind: str,
        value: Any,
        values: dict[str, str],
        decode: Any,
        older: str,
    ) -> str:
        """``stored`` if it is a compact ``kind`` document of a schema version this
        fanfold reads whose value, its blob references resolved from ``values``, is
        ``value`` (else ImportRefused); ``older`` for a document of an older schema
        (an export from an older fanfold: stored in its own, object, form)."""
        try:
            _require(
                line,
                stored.startswith("[")
                and codec.COMPACT_SINCE <= codec.document_version(stored) <= codec.SCHEMA_VERSION,
                f"{where}: its stored text must be a compact {kind} document (schema version "
                f"{codec.COMPACT_SINCE} to {codec.SCHEMA_VERSION})",
            )
            same = decode(stored, values) == value
        except CodecError as exc:
            raise ImportRefused(
                f"{where}: its stored text cannot be read: {exc}", line=line
            ) from None
        _require(line, same, f"{where}: its stored text and its {kind} differ")
        if codec.document_version(stored) != codec.SCHEMA_VERSION:
            return older
        self.blobs.update(values)
        return stored

    def _stored_effects(self, line: int, where: str, record: dict[str, Any]) -> list[Any]:
        """The step's ``stored_effects`` (format 3), checked for shape: one string or
        null per effect."""
        _require(
            line,
            self.format_version >= 3,
            f"{where}: 'stored_effects' is a field of format 3, the file says format "
            f"{self.format_version}",
        )
        stored = record["stored_effects"]
        _require(
            line,
            isinstance(stored, list)
            and len(stored) == len(record["effects"])
            and all(s is None or isinstance(s, str) for s in stored),
            f"{where}: 'stored_effects' must be an array of one text or null per effect",
        )
        return list(stored)

    def _stored_effect(self, line: int, where: str, stored: str, text: str) -> str:
        """The exact stored text of a compact effect (format 3), checked as an event's
        (``_stored``): a compact effect document of a schema version this fanfold reads
        whose value, its blob references resolved from the object document's values,
        is the one ``text`` (the object document, checked already) holds."""
        effect = decode_effect(text)
        values: dict[str, str] = {}
        codec.encode_effect_stored(effect, values)  # the blob values the effect holds
        return self._same_stored(line, where, stored, "effect", effect, values, decode_effect, text)

    def check(self) -> str:
        """Whole-file checks; returns the root id."""
        assert self.header is not None
        root = self.header["root_id"]
        declared = (self.header["conversations"], self.header["steps"])
        found = (len(self.rows), len(self.events))
        if declared != found:
            raise ImportRefused(
                f"the file is incomplete or padded: its header announces {declared[0]} "
                f"conversation(s) and {declared[1]} step(s), it holds {found[0]} and {found[1]}"
            )
        _require(1, root in self.rows, f"the root conversation {root!r} is not in the file")
        for cid, conversation in self.rows.items():
            row, line = conversation.row, self.row_lines[cid]
            _require(line, row.root_id == root, f"conversation {cid!r} is of another tree")
            if cid == root:
                _require(line, row.parent_id is None, f"the root {cid!r} has a parent")
            else:
                _require(
                    line,
                    row.parent_id in self.rows,
                    f"conversation {cid!r}: its parent {row.parent_id!r} is not in the file",
                )
            count = self.seqs.get(cid, 0)
            _require(
                line,
                count == row.last_seq + 1,
                f"conversation {cid!r}: its row names event {row.last_seq} as its last, "
                f"the file holds {count} step(s) of it",
            )
            if row.snapshot_seq is not None and conversation.snapshot_json is not None:
                _require(line, row.snapshot_seq <= row.last_seq, f"{cid!r}: bad snapshot_seq")
        for cid in self.seqs:
            _require(1, cid in self.rows, f"steps of conversation {cid!r}, which has no row")
        return str(root)


def _hashing(lines: Iterable[str | bytes], digest: Any) -> Iterator[str]:
    """The lines as text, each hashed as read: the bytes of a file opened in binary
    (the file's own sha256, a byte-order mark included), else the text's UTF-8.

    A line of bytes that is not UTF-8 is refused naming its line and byte: a binary
    file given by mistake used to fail with only the codec's "position 40" in some
    buffer of the file."""
    for number, line in enumerate(lines, 1):
        if isinstance(line, bytes):
            digest.update(line)
            try:
                yield line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ImportRefused(
                    f"byte {exc.start + 1} (0x{line[exc.start]:02x}) is not UTF-8 text: not "
                    "an export of a fanfold log; nothing was imported",
                    line=number,
                ) from None
        else:
            digest.update(line.encode("utf-8", "surrogatepass"))
            yield line


def import_jsonl(
    store: Store,
    lines: Iterable[str] | Iterable[bytes],
    *,
    source: str | None = None,
    source_sha256: str | None = None,
    now: float | None = None,
) -> str:
    """Load an export (any iterable of its lines, e.g. an open file, text or binary)
    into ``store``. A leading UTF-8 byte-order mark (some Windows editors write one)
    is ignored; bytes that are not UTF-8 are refused with their line and position.

    All or nothing: every line is checked (layout, event schema versions, that every
    document decodes, seqs without gaps, a consistent tree) before anything is
    written, in one transaction. Returns the root id. Raises VersionRefused for a log
    of an event schema version this fanfold cannot read (naming both versions), and
    ImportRefused for any other problem, including an id the database already holds.
    The reducer is not run: a log that diverges from today's reducer imports as it
    is, for ``verify`` to report.

    The tree is recorded as imported from ``source`` (a file name) with
    ``source_sha256`` (default: the sha256 of the text read) at ``now``: an inert
    record that no runtime continues, whatever the file says is in flight.
    """
    digest = hashlib.sha256()
    importer = _Importer()
    importer.read(_hashing(lines, digest))
    root = importer.check()
    tree = TreeRecord(
        root,
        Origin.IMPORTED,
        source=source,
        source_sha256=source_sha256 or digest.hexdigest(),
        imported_at=time.time() if now is None else now,
    )
    try:
        store.import_raw(
            list(importer.rows.values()), importer.events, tree=tree, blobs=importer.blobs
        )
    except ConversationExists as exc:
        raise ImportRefused(
            f"conversation {exc.conversation_id!r} already exists in this database; "
            "nothing was imported"
        ) from None
    return root
