"""A human in the loop (issue 35), the runtime's side: open requests as people see
them, and the decisions table through which a decision reaches the runtime.

The reducer decides which call waits (``ToolExecuting.asking``) and what a decision
does; the request is durable as that state in the log. What this module adds is the
way in for a person, from this process or any other:

- ``PendingRequest``: an open request, read from a state (``open_request``).
- ``Decisions``: the ``decisions`` table of an SQLite log (``FileDecisions``; a
  ``:memory:`` runtime keeps them in a dict, ``MemoryDecisions``). A decision is a
  row keyed by its request's id: the first writer wins, the second gets
  ``AlreadyDecided``. A running runtime polls the new rows of the requests it holds
  open, turns each into its event (``ApprovalGranted``, ``ApprovalDenied``,
  ``UserAnswered``), and marks the row once the event is committed: ``applied``, or
  ``stale`` when the reducer refused it (the request had ended: a cancel, a
  timeout). A crash between the commit and the mark leaves the row new, but its
  request is closed in the log and only open requests' rows are read, so it is never
  submitted again (the reducer would refuse a second one): a decision becomes its
  event exactly once, and is never lost while its request is open.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from fanfold.statemachine import (
    ApprovalDenied,
    ApprovalGranted,
    Conversation,
    Event,
    ToolExecuting,
    ToolResult,
    ToolResultMessage,
    UserAnswered,
)
from fanfold.statemachine.approvals import edited_arguments_problem, question_of
from fanfold.statemachine.state import tree_path

GRANT = "grant"
DENY = "deny"
ANSWER = "answer"
KINDS = (GRANT, DENY, ANSWER)


class DecisionError(Exception):
    """A decision that cannot be taken (the message says why)."""


class UnknownRequest(DecisionError):
    """No open request has this id (never asked, already decided, or ended)."""


class AlreadyDecided(DecisionError):
    """Someone decided this request first: the first decision written wins."""


class RequestClosed(UnknownRequest):
    """The request was closed before this decision could be taken: cancelled, its
    approval timeout, its tree ended. The decision's row is marked ``stale: ...``
    with the reason; the message (``CLOSED_BEFORE`` + why) says it."""


CLOSED_BEFORE = "the request was closed before your decision: "
"""How a decision that came too late is told (its row: ``stale: `` + this + why)."""


class BadDecision(DecisionError):
    """The decision does not fit the request: an answer to an approval request, a
    grant of a question, edited arguments the tool's schema refuses."""


@attrs.frozen
class PendingRequest:
    """An open request for a person's decision.

    ``id`` is ``CONVERSATION:CALL`` (the call number is unique in its conversation,
    so an id never names two requests); ``tree`` the root's id; ``path`` the agent's
    place (``root/1/2``); ``question``: the question of an ``ask_user`` call (None for
    an approval request), with ``choices``; ``asked_at``: when it was asked (seconds
    since the epoch), if known."""

    id: str
    tree: str
    conversation_id: str
    path: str
    call: int
    tool: str
    arguments_json: str
    rule: str
    question: str | None = None
    choices: tuple[str, ...] = ()
    asked_at: float | None = None
    tool_call_id: str = ""

    @property
    def is_question(self) -> bool:
        return self.question is not None

    def arguments(self) -> Any:
        """The call's arguments, decoded."""
        return json.loads(self.arguments_json)


def request_id(conversation_id: str, call: int) -> str:
    return f"{conversation_id}:{call}"


def split_request_id(text: str) -> tuple[str, int] | None:
    """``(conversation, call)`` of a request id, or None if ``text`` is not one."""
    conversation, sep, call = text.rpartition(":")
    if not sep or not conversation or not call.isdigit():
        return None
    return conversation, int(call)


def open_request(state: Conversation, asked_at: float | None = None) -> PendingRequest | None:
    """The request ``state`` holds open, if any."""
    phase = state.phase
    if not isinstance(phase, ToolExecuting) or phase.asking is None:
        return None
    call = phase.current
    question: str | None = None
    choices: tuple[str, ...] = ()
    if phase.asking.question:
        asked = question_of(call)
        if not isinstance(asked, str):
            question, choices = asked
    return PendingRequest(
        id=request_id(state.id, phase.call),
        tree=state.root_id,
        conversation_id=state.id,
        path=tree_path(state.id, state.root_id),
        call=phase.call,
        tool=call.name,
        arguments_json=call.arguments_json,
        rule=phase.asking.rule,
        question=question,
        choices=choices,
        asked_at=asked_at,
        tool_call_id=call.id,
    )


def closed_why(state: Conversation, tool_call_id: str) -> str:
    """Why a request closed without a decision, from ``state`` (its conversation
    after the close): the result its call was given (a cancel's "cancelled: ... it
    never ran", an approval timeout's "no decision within N s"), or, when none is
    found, that the request is no longer open."""
    phase = state.phase
    results: list[ToolResult] = list(getattr(phase, "results", ()))
    results += [m.result for m in state.history if isinstance(m, ToolResultMessage)]
    for result in results:
        if result.tool_call_id == tool_call_id:
            return result.content
    return f"it is no longer open (the conversation is {type(phase).__name__})"


def stale_mark(why: str) -> str:
    """The state a decision's row gets when its request closed before it was taken."""
    return f"stale: {CLOSED_BEFORE}{why}"


def closed_message(mark: str) -> str | None:
    """What to tell the person whose decision's row is marked ``mark``: None when it
    was applied (or is still to be taken)."""
    if not mark.startswith("stale: "):
        return None
    text = mark.removeprefix("stale: ")
    return text if text.startswith(CLOSED_BEFORE) else CLOSED_BEFORE + text


_DECISION_TYPES = ("ApprovalGranted", "ApprovalDenied", "UserAnswered")


def decided_in_log(store: Any, conversation_id: str, call: int) -> bool:
    """Whether conversation ``conversation_id``'s log holds a decision event for call
    ``call`` (a call number is never issued twice in a conversation, and the reducer
    takes one decision per request: that event is the decision of request
    ``CONVERSATION:CALL``)."""
    from fanfold.db.codec import decode_event
    from fanfold.db.errors import CodecError

    rows = store._query(
        "SELECT payload FROM events WHERE conversation_id = ? AND type IN (?, ?, ?)",
        [conversation_id, *_DECISION_TYPES],
    )
    for row in rows:
        try:
            event = decode_event(row["payload"])
        except CodecError:
            continue
        if getattr(event, "call", None) == call:
            return True
    return False


def settle(store: Any, decisions: Decisions, request: PendingRequest) -> str:
    """What became of the decision just written for ``request`` (the writer asks, once
    its row is in): ``new`` while the request is still open (the runtime holding it,
    or the next ``fanfold resume``, takes it), ``applied``, or ``stale: ...``. A
    request the log shows closed without this decision (a cancel or a timeout
    committed before the row was written: the runtime that closed it found no row to
    mark) gets its row marked stale here, with the reason, so no decision stays
    ``new`` for ever and its writer can be told."""
    state = store.load_state(request.conversation_id)
    now = open_request(state)
    if now is not None and now.id == request.id:
        return decisions.state_of(request.id) or "new"
    mark = decisions.state_of(request.id) or "new"
    if mark != "new":
        return mark
    if decided_in_log(store, request.conversation_id, request.call):
        # Its event is committed, the runtime's mark not yet written: it is applied.
        return "applied"
    decisions.mark_new(request.id, stale_mark(closed_why(state, request.tool_call_id)))
    return decisions.state_of(request.id) or "new"


def check_decision(
    state: Conversation, request: PendingRequest, kind: str, arguments_json: str | None
) -> None:
    """Raise ``BadDecision`` if ``kind`` (with edited ``arguments_json``) does not fit
    ``request``: checked before a decision is written, so a person hears at once
    (the reducer checks again when the decision becomes its event)."""
    if kind not in KINDS:
        raise BadDecision(f"a decision is one of {', '.join(KINDS)}, not {kind!r}")
    if kind == ANSWER and not request.is_question:
        raise BadDecision(f"request {request.id} asks for approval, not an answer")
    if kind == GRANT and request.is_question:
        raise BadDecision(f"request {request.id} is a question: answer it (or deny it)")
    if kind == GRANT and arguments_json is not None:
        spec = next((t for t in state.tools if t.name == request.tool), None)
        problem = edited_arguments_problem(spec, arguments_json)
        if problem is None and spec is not None:
            from fanfold.tools.schema import validate

            found = validate(spec.input_schema(), json.loads(arguments_json))
            problem = "; ".join(found[:3]) if found else None
        if problem is not None:
            raise BadDecision(f"request {request.id}: {problem}")


@attrs.frozen
class Decision:
    """A row of the decisions table."""

    request: str
    kind: str
    arguments_json: str | None = None
    text: str = ""
    by: str = ""
    at: float = 0.0

    def event(self) -> Event:
        """The event this decision becomes."""
        split = split_request_id(self.request)
        assert split is not None
        call = split[1]
        if self.kind == GRANT:
            return ApprovalGranted(call, self.arguments_json, self.by)
        if self.kind == ANSWER:
            return UserAnswered(call, self.text, self.by)
        return ApprovalDenied(call, self.text, self.by)


class Decisions:
    """Where decisions are written and read (the base is the in-memory one)."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[Decision, str]] = {}
        self._lock = threading.Lock()

    def write(self, decision: Decision) -> None:
        """Record ``decision``; AlreadyDecided if its request has one."""
        with self._lock:
            if decision.request in self._rows:
                raise AlreadyDecided(f"request {decision.request} was decided already")
            self._rows[decision.request] = (decision, "new")

    def write_many(self, decisions: Sequence[Decision]) -> list[str]:
        """Record each of ``decisions``; the requests already decided are left as
        they are and returned."""
        taken = []
        for decision in decisions:
            try:
                self.write(decision)
            except AlreadyDecided:
                taken.append(decision.request)
        return taken

    def new(self, requests: Sequence[str]) -> list[Decision]:
        """The decisions not yet applied of ``requests``."""
        with self._lock:
            return [
                d for r in requests if (e := self._rows.get(r)) and e[1] == "new" for d in [e[0]]
            ]

    def mark(self, request: str, state: str) -> None:
        """Record what became of a decision (``applied`` or ``stale: why``)."""
        self.mark_many([(request, state)])

    def mark_many(self, marks: Sequence[tuple[str, str]]) -> None:
        """``mark`` each ``(request, state)``, at once."""
        with self._lock:
            for request, state in marks:
                entry = self._rows.get(request)
                if entry is not None:
                    self._rows[request] = (entry[0], state)

    def mark_new(self, request: str, state: str) -> None:
        """Mark ``request``'s row ``state`` only if it is still ``new`` (a row marked
        already keeps its mark: the first one to see what became of it wins)."""
        with self._lock:
            entry = self._rows.get(request)
            if entry is not None and entry[1] == "new":
                self._rows[request] = (entry[0], state)

    def state_of(self, request: str) -> str | None:
        with self._lock:
            entry = self._rows.get(request)
            return None if entry is None else entry[1]

    def close(self) -> None:
        """Let go of what the table holds open (a connection); nothing here."""


MemoryDecisions = Decisions


_SCHEMA = """
CREATE TABLE IF NOT EXISTS decisions (
    request TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    arguments TEXT,
    text TEXT NOT NULL,
    decided_by TEXT NOT NULL,
    at REAL NOT NULL,
    state TEXT NOT NULL DEFAULT 'new'
) STRICT
"""


class FileDecisions(Decisions):
    """The ``decisions`` table of the SQLite log at ``path``, shared by every process
    that opens it (the CLI writes, the running runtime polls). Its own connection,
    short transactions: a writer waits for SQLite's lock, never for the runtime.

    The table is made on first use (``CREATE TABLE IF NOT EXISTS``) rather than by a
    schema migration: it holds no event and nothing replay reads (a decision reaches
    the log as its event), and readers of logs without it see no decisions.
    """

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = str(path)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.execute(_SCHEMA)
        return conn

    def write(self, decision: Decision) -> None:
        conn = self._connect()
        try:
            conn.execute(
                "INSERT INTO decisions (request, kind, arguments, text, decided_by, at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    decision.request,
                    decision.kind,
                    decision.arguments_json,
                    decision.text,
                    decision.by,
                    decision.at,
                ),
            )
        except sqlite3.IntegrityError:
            raise AlreadyDecided(f"request {decision.request} was decided already") from None
        finally:
            conn.close()

    def write_many(self, decisions: Sequence[Decision]) -> list[str]:
        """Record each of ``decisions`` in one transaction; the requests already
        decided are left as they are and returned."""
        conn = self._connect()
        taken: list[str] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for decision in decisions:
                cursor = conn.execute(
                    "INSERT OR IGNORE INTO decisions (request, kind, arguments, text, "
                    "decided_by, at) VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        decision.request,
                        decision.kind,
                        decision.arguments_json,
                        decision.text,
                        decision.by,
                        decision.at,
                    ),
                )
                if cursor.rowcount == 0:
                    taken.append(decision.request)
            conn.execute("COMMIT")
        finally:
            conn.close()
        return taken

    def new(self, requests: Sequence[str]) -> list[Decision]:
        if not requests:
            return []
        conn = self._connect()
        try:
            rows = conn.execute(
                "SELECT request, kind, arguments, text, decided_by, at FROM decisions "
                "WHERE state = 'new'"
            ).fetchall()
        finally:
            conn.close()
        wanted = set(requests)
        return [Decision(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows if r[0] in wanted]

    def mark_many(self, marks: Sequence[tuple[str, str]]) -> None:
        conn = self._connect()
        try:
            # One transaction for a poll's decisions: a hundred approvals at once are
            # one write, not a hundred (each waits for the log's writer).
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "UPDATE decisions SET state = ? WHERE request = ?",
                [(state, request) for request, state in marks],
            )
            conn.execute("COMMIT")
        finally:
            conn.close()

    def mark_new(self, request: str, state: str) -> None:
        conn = self._connect()
        try:
            conn.execute(
                "UPDATE decisions SET state = ? WHERE request = ? AND state = 'new'",
                (state, request),
            )
        finally:
            conn.close()

    def state_of(self, request: str) -> str | None:
        conn = self._connect()
        try:
            row = conn.execute(
                "SELECT state FROM decisions WHERE request = ?", (request,)
            ).fetchone()
        finally:
            conn.close()
        return None if row is None else str(row[0])


# The same table in PostgreSQL's words: its float is DOUBLE PRECISION, and it has no
# STRICT tables (its columns are typed anyway).
_PG_SCHEMA = _SCHEMA.replace("at REAL", "at DOUBLE PRECISION").replace(") STRICT", ")")


class PgDecisions(Decisions):
    """The ``decisions`` table of the PostgreSQL log at ``url`` (in its ``fanfold``
    schema, beside the log's tables): the same rows and rules as ``FileDecisions``,
    so ``fanfold approve --db postgresql://...`` from any machine reaches the runtime
    (a ``fanfold run``, a worker) that holds the request. One winner: the request id
    is the primary key, a second ``INSERT`` conflicts (``AlreadyDecided``).

    Made on first use like the SQLite table (``CREATE TABLE IF NOT EXISTS``, not one
    of ``PG_MIGRATIONS``: it holds nothing replay reads). One connection of its own,
    opened on first use and replaced once if the server dropped it; psycopg is
    imported only here, for a PostgreSQL log."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self._conn: Any = None

    def _run(self, work: Any) -> Any:
        """``work(connection)`` under the lock; a lost connection is made again and
        ``work`` tried once more (every use here is one statement or transaction,
        the same twice)."""
        import psycopg

        from fanfold.db.postgres import _Scrubbed, connect

        with self._lock:
            for attempt in (1, 2):
                if self._conn is None or self._conn.closed:
                    self._conn = connect(self.url)
                    self._create(self._conn)
                try:
                    return work(self._conn)
                except psycopg.OperationalError as exc:
                    with _suppress():
                        self._conn.close()
                    self._conn = None
                    if attempt == 2:
                        raise _Scrubbed(self.url).unavailable(exc) from None
            raise AssertionError("unreachable")

    @staticmethod
    def _create(conn: Any) -> None:
        from contextlib import suppress

        import psycopg

        # Two first users at once: PostgreSQL's IF NOT EXISTS is not atomic against a
        # concurrent CREATE (the other one made it: fine). The loser sees the table's
        # row type's name taken (a UniqueViolation in pg_type, or DuplicateObject: 'type
        # "decisions" already exists', seen in CI's run of the racing test) or the table.
        with suppress(
            psycopg.errors.UniqueViolation,
            psycopg.errors.DuplicateTable,
            psycopg.errors.DuplicateObject,
        ):
            conn.execute(_PG_SCHEMA)

    def write(self, decision: Decision) -> None:
        import psycopg

        def insert(conn: Any) -> None:
            conn.execute(
                "INSERT INTO decisions (request, kind, arguments, text, decided_by, at) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                _row(decision),
            )

        try:
            self._run(insert)
        except psycopg.errors.UniqueViolation:
            # Our own row, if a lost connection cut the first try short after its
            # commit (``_run`` tries again): then it is written, not decided by another.
            row = self._run(
                lambda conn: conn.execute(
                    "SELECT request, kind, arguments, text, decided_by, at FROM decisions "
                    "WHERE request = %s",
                    [decision.request],
                ).fetchone()
            )
            if row is not None and Decision(*row) == decision:
                return
            raise AlreadyDecided(f"request {decision.request} was decided already") from None

    def write_many(self, decisions: Sequence[Decision]) -> list[str]:
        """As ``FileDecisions.write_many``: one transaction, the requests already
        decided left as they are and returned."""

        def insert(conn: Any) -> list[str]:
            taken = []
            with conn.transaction():
                for decision in decisions:
                    cursor = conn.execute(
                        "INSERT INTO decisions (request, kind, arguments, text, decided_by, "
                        "at) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (request) DO NOTHING",
                        _row(decision),
                    )
                    if cursor.rowcount == 0:
                        taken.append(decision.request)
            return taken

        return list(self._run(insert))

    def new(self, requests: Sequence[str]) -> list[Decision]:
        if not requests:
            return []
        rows = self._run(
            lambda conn: conn.execute(
                "SELECT request, kind, arguments, text, decided_by, at FROM decisions "
                "WHERE state = 'new' AND request = ANY(%s)",
                [list(requests)],
            ).fetchall()
        )
        return [Decision(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows]

    def mark_many(self, marks: Sequence[tuple[str, str]]) -> None:
        def update(conn: Any) -> None:
            with conn.transaction():
                for request, state in marks:
                    conn.execute(
                        "UPDATE decisions SET state = %s WHERE request = %s", [state, request]
                    )

        self._run(update)

    def mark_new(self, request: str, state: str) -> None:
        def update(conn: Any) -> None:
            with conn.transaction():
                conn.execute(
                    "UPDATE decisions SET state = %s WHERE request = %s AND state = 'new'",
                    [state, request],
                )

        self._run(update)

    def state_of(self, request: str) -> str | None:
        row = self._run(
            lambda conn: conn.execute(
                "SELECT state FROM decisions WHERE request = %s", [request]
            ).fetchone()
        )
        return None if row is None else str(row[0])

    def close(self) -> None:
        """Close the connection (a later use opens another)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _suppress() -> Any:
    from contextlib import suppress

    return suppress(Exception)


def _row(decision: Decision) -> tuple[Any, ...]:
    return (
        decision.request,
        decision.kind,
        decision.arguments_json,
        decision.text,
        decision.by,
        decision.at,
    )


def decisions_of(target: str | Path) -> Decisions:
    """The decisions table of the log at ``target``: ``FileDecisions`` for an SQLite
    file, ``PgDecisions`` for a PostgreSQL URL."""
    from fanfold.db.factory import DatabaseUrl
    from fanfold.db.targets import is_postgres

    if is_postgres(target):
        return PgDecisions(target.secret if isinstance(target, DatabaseUrl) else str(target))
    return FileDecisions(target)


def asked_at_in(store: Any, conversation_id: str) -> float | None:
    """``asked_at`` read through an open store (either kind of log)."""
    rows = store._query(
        "SELECT at FROM events WHERE conversation_id = ? AND type NOT IN "
        "('SubAgentFinished', 'ToolsChanged', 'RuntimeResumed', 'CancelRequested') "
        "ORDER BY seq DESC LIMIT 1",
        [conversation_id],
    )
    return None if not rows else float(rows[0]["at"])


def asked_at(path: str | Path, conversation_id: str) -> float | None:
    """When conversation ``conversation_id``'s open request was asked, as its log
    says: the time of its latest event that can open one (a child's outcome, a tools
    change or a restart never does)."""
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=30)
    except sqlite3.Error:
        return None
    try:
        row = conn.execute(
            "SELECT at FROM events WHERE conversation_id = ? AND type NOT IN "
            "('SubAgentFinished', 'ToolsChanged', 'RuntimeResumed', 'CancelRequested') "
            "ORDER BY seq DESC LIMIT 1",
            (conversation_id,),
        ).fetchone()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return None if row is None else float(row[0])
