"""Shared helpers for the replay tests: writing logs through Store, editing rows."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from fanfold.cli import cli
from fanfold.db import Status, Step, Store, status_of
from fanfold.db.checksum import effect_checksum, event_checksum, snapshot_checksum
from fanfold.statemachine import (
    Conversation,
    ConversationCreated,
    ConversationForked,
    Effect,
    Event,
    start,
    transition,
)
from fanfold.testing import Trace


def ancestors(created: ConversationCreated) -> list[Step]:
    """Placeholder parents (root, root.1, ...) a generated sub-agent needs in the store."""
    steps: list[Step] = []
    if created.parent_id is None:
        return steps
    chain = [created.parent_id]
    while "." in chain[-1]:
        chain.append(chain[-1].rpartition(".")[0])
    for depth, cid in enumerate(reversed(chain)):
        parent = None if depth == 0 else cid.rpartition(".")[0]
        event = ConversationCreated(
            conversation_id=cid,
            parent_id=parent,
            root_id=None if depth == 0 else created.root_id,
            depth=depth,
            task=None if depth == 0 else "delegated",
            limits=created.limits,
        )
        state, effects = start(event)
        steps.append(Step(cid, 0, event, effects, state, 1.0))
    return steps


def trace_steps(
    trace: Trace, *, snapshot_every: int | None = None, t0: float = 1000.0
) -> list[Step]:
    """The steps a runtime would record for ``trace``: a snapshot every K steps (and at
    rest), times 0.5 s apart."""
    state, effects = trace.start()
    cid = trace.created.conversation_id
    steps = [Step(cid, 0, trace.created, effects, state, t0)]
    for seq, (_, event, after, effects) in enumerate(trace.steps(), 1):
        resting = status_of(after.phase) is not Status.RUNNING
        snapshot = snapshot_every is not None and (seq % snapshot_every == 0 or resting)
        steps.append(Step(cid, seq, event, effects, after, t0 + seq / 2, snapshot=snapshot))
    return steps


def fold_steps(
    created: ConversationCreated, events: Sequence[Event]
) -> list[tuple[Event, tuple[Effect, ...], Conversation]]:
    """``(event, effects, state after)`` of every step, seq 0 included."""
    state, effects = start(created)
    out: list[tuple[Event, tuple[Effect, ...], Conversation]] = [(created, effects, state)]
    for event in events:
        state, effects = transition(state, event)
        out.append((event, effects, state))
    return out


def reseal(conn: sqlite3.Connection) -> None:
    """Recompute every row checksum (``fanfold.db.checksum``) of the database.

    After an edit, this makes the log one whose rows are intact but hold the edited
    content, as if a fanfold had written it so (another reducer, a bug): what the
    checks after the checksum (decoding, order, replay) must classify. Without it,
    every edited row is simply damage.

    ``conn`` may also be a ``PostgresStore``'s connection (``store._connection()``):
    the checksums are then computed here and written row by row.
    """
    if not isinstance(conn, sqlite3.Connection):
        _reseal_rows(conn)
        return
    conn.create_function("event_crc", 6, event_checksum, deterministic=True)
    conn.create_function("effect_crc", 5, effect_checksum, deterministic=True)
    conn.create_function("snapshot_crc", 3, snapshot_checksum, deterministic=True)
    conn.execute(
        "UPDATE events SET checksum = event_crc(conversation_id, seq, type, payload,"
        " fingerprint, at)"
    )
    conn.execute(
        "UPDATE effects SET checksum = effect_crc(conversation_id, seq, idx, type, payload)"
    )
    conn.execute(
        "UPDATE conversations SET snapshot_checksum = snapshot_crc(id, snapshot_seq, snapshot_json)"
        " WHERE snapshot_json IS NOT NULL AND snapshot_seq IS NOT NULL"
    )


def _reseal_rows(conn: Any) -> None:
    """``reseal`` without SQL functions (a PostgreSQL log's connection)."""
    for cid, seq, kind, payload, mark, at in conn.execute(
        "SELECT conversation_id, seq, type, payload, fingerprint, at FROM events"
    ).fetchall():
        conn.execute(
            "UPDATE events SET checksum = ? WHERE conversation_id = ? AND seq = ?",
            [event_checksum(cid, seq, kind, payload, mark, at), cid, seq],
        )
    for cid, seq, idx, kind, payload in conn.execute(
        "SELECT conversation_id, seq, idx, type, payload FROM effects"
    ).fetchall():
        conn.execute(
            "UPDATE effects SET checksum = ? WHERE conversation_id = ? AND seq = ? AND idx = ?",
            [effect_checksum(cid, seq, idx, kind, payload), cid, seq, idx],
        )
    for cid, seq, text in conn.execute(
        "SELECT id, snapshot_seq, snapshot_json FROM conversations"
        " WHERE snapshot_json IS NOT NULL AND snapshot_seq IS NOT NULL"
    ).fetchall():
        conn.execute(
            "UPDATE conversations SET snapshot_checksum = ? WHERE id = ?",
            [snapshot_checksum(cid, seq, text), cid],
        )


def edit(path: Path, *statements: str | tuple[str, Sequence[Any]], sealed: bool = True) -> None:
    """Run SQL on the database file directly, as a user (or a disk) could; then, unless
    ``sealed`` is False, recompute the row checksums (see ``reseal``).

    The edit is taken as the log's content: the file's high-water mark
    (``<path>-committed``) is removed, since a step deleted by hand would otherwise be
    reported as lost (``fanfold.db.highwater``; tests/test_wal_loss.py tests that)
    before the damage these tests look for."""
    Path(f"{os.path.realpath(path)}-committed").unlink(missing_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            sql, params = (statement, ()) if isinstance(statement, str) else statement
            conn.execute(sql, params)
        if sealed:
            reseal(conn)
    finally:
        conn.close()


def write(
    path: Path,
    steps: Sequence[Step],
    *,
    format_5: bool = False,
    encode_effect: Callable[[Any, dict[str, str]], str] | None = None,
) -> None:
    """Append ``steps`` to a fresh database file; with ``format_5``, then rewrite it as
    fanfold wrote logs before the events-only log (``as_format_5``, ``encode_effect``)."""
    with Store.open(path) as store:
        store.append(steps)
    if format_5:
        as_format_5(path, encode_effect)


def as_format_5(
    path: Path, encode_effect: Callable[[Any, dict[str, str]], str] | None = None
) -> None:
    """Rewrite the events-only log at ``path`` as fanfold wrote it before migration 5:
    every step's effects in ``effects`` rows (compact, blob fields by reference) with
    their checksums, and a version-5 fingerprint (its content digest covers the event's
    and the effects' stored texts), the events' checksums resealed. For the tests of
    what readers do with such logs (effect rows damaged, edited, missing).
    ``encode_effect(effect, blobs)``: the stored text of each effect (default
    ``encode_effect_stored``), e.g. as an older fanfold wrote it."""
    from fanfold.db.codec import encode_effect_stored
    from fanfold.db.fingerprint import content_digest, digest_v4, summary

    encode = encode_effect or encode_effect_stored

    with Store.open(path) as store:
        ids = [r["id"] for r in store._query("SELECT id FROM conversations ORDER BY rowid")]
        logs = {cid: store.events(cid) for cid in ids}
    conn = sqlite3.connect(path)
    try:
        for cid, stored in logs.items():
            state: Conversation | None = None
            for event in stored:
                # The state after the step, for the counters and the whole-state
                # digest a version-5 fingerprint holds at rest.
                if state is None:
                    assert isinstance(event.event, ConversationCreated | ConversationForked)
                    state = start(event.event)[0]
                else:
                    state = transition(state, event.event)[0]
                (payload,) = conn.execute(
                    "SELECT payload FROM events WHERE conversation_id = ? AND seq = ?",
                    (cid, event.seq),
                ).fetchone()
                blobs: dict[str, str] = {}
                texts = [(type(e).__name__, encode(e, blobs)) for e in event.effects]
                conn.executemany(
                    "INSERT INTO blobs (sha256, body) VALUES (?, ?) ON CONFLICT DO NOTHING",
                    list(blobs.items()),
                )
                digest = content_digest(payload, texts)
                assert digest is not None
                # As the writer did: not at an ended conversation's last step, whose
                # snapshot holds the whole state.
                whole = f" {digest_v4(state)}" if state.at_rest and not state.is_terminal else ""
                mark = f"{summary(state)} ####{digest}{whole}"
                conn.execute(
                    "UPDATE events SET fingerprint = ?, checksum = ?"
                    " WHERE conversation_id = ? AND seq = ?",
                    (
                        mark,
                        event_checksum(
                            cid, event.seq, type(event.event).__name__, payload, mark, event.at
                        ),
                        cid,
                        event.seq,
                    ),
                )
                conn.executemany(
                    "INSERT INTO effects (conversation_id, seq, idx, type, payload, checksum)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    [
                        (
                            cid,
                            event.seq,
                            idx,
                            kind,
                            text,
                            effect_checksum(cid, event.seq, idx, kind, text),
                        )
                        for idx, (kind, text) in enumerate(texts)
                    ],
                )
        conn.commit()
    finally:
        conn.close()


# A root that delegates one bash command to a sub-agent: the small real log (written by
# `fanfold run`) that the damage and checksum tests corrupt in many ways.
ONE_CHILD_SCRIPT = {
    "latency": 0.0,
    "agents": [
        {
            "match": {"path": "root"},
            "replies": [
                {"tool_calls": [{"name": "spawn_agents", "arguments": {"tasks": [{"task": "a"}]}}]},
                {"text": "the answer is {{last_tool_result}}"},
            ],
        },
        {
            "match": {"path": "root/1"},
            "replies": [
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo 42"}}]},
                {"tool_calls": [{"name": "submit_result", "arguments": {"result": "42"}}]},
            ],
        },
    ],
}


def one_child_log(folder: Path) -> tuple[Path, str, Path]:
    """``fanfold run`` of ONE_CHILD_SCRIPT in ``folder``: (database, root id, script),
    the log checkpointed (no steps left in a -wal)."""
    script = folder / "script.json"
    script.write_text(json.dumps(ONE_CHILD_SCRIPT))
    db = folder / "log.db"
    result = CliRunner().invoke(
        cli, ["run", "--db", str(db), "--script", str(script), "--cwd", str(folder), "go"]
    )
    assert result.exit_code == 0, result.output
    with Store.open(db) as store:
        (root,) = store.list_roots()
    assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_size == 0
    return db, root.id, script


class FifoReader:
    """A reader attached to the FIFO ``path`` before anything writes to it (so a
    writer's non-blocking open finds it), collecting what is written until the writer
    closes it, in a thread. ``join()`` returns the text."""

    def __init__(self, path: Path) -> None:
        import threading

        # O_NONBLOCK: attached at once, without waiting for a writer.
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._chunks: list[bytes] = []
        self._thread = threading.Thread(target=self._read)
        self._thread.start()

    def _read(self) -> None:
        import select

        try:
            poller = select.poll()
            poller.register(self._fd, select.POLLIN)
            # Until the writer's first bytes, or its close (a hang guard: 60 s, then
            # the test fails on what was received).
            if not poller.poll(60_000):
                return
            os.set_blocking(self._fd, True)
            while chunk := os.read(self._fd, 1 << 16):
                self._chunks.append(chunk)
        finally:
            os.close(self._fd)

    def join(self) -> str:
        self._thread.join()
        return b"".join(self._chunks).decode("utf-8")
