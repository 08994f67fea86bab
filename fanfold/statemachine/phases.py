"""The phases a conversation moves through. Exactly one is current at any time."""

from __future__ import annotations

import typing

import attrs

from fanfold.statemachine.children import Children
from fanfold.statemachine.errors import CancelReason, ErrorKind
from fanfold.statemachine.messages import ModelError, ToolCall, ToolResult


@attrs.frozen
class Idle:
    """A root conversation waiting for the user. Never a sub-agent's phase."""


@attrs.frozen
class LlmRequesting:
    """A model call ``call`` is in flight. ``grace`` marks the final round past the limit."""

    call: int
    attempt: int = 1
    grace: bool = False


@attrs.frozen
class AwaitingRetry:
    """A model call failed retryably; timer ``timer`` starts ``next_attempt``.

    Separate from LlmRequesting so that a reply can never be mistaken for one while no
    call is in flight, and so the retry timer's firing has exactly one meaning.
    """

    timer: int
    next_attempt: int
    last_error: ModelError
    grace: bool = False


@attrs.frozen
class Asking:
    """The current tool call waits for a person's decision instead of running (issue 35).

    - ``rule``: why: the ask rule it matched and whose it is (``'bash(git push*)' of
      --ask``), ``needs_approval of tool 'deploy'``, or ``ask_user`` for a question;
    - ``question``: an ``ask_user`` question: the person's answer is its result;
    - ``timer``: the approval timeout's timer (``Limits.approval_timeout``), if any.
    """

    rule: str
    question: bool = False
    timer: int | None = None


@attrs.frozen
class ToolExecuting:
    """Tool ``current`` runs as call ``call``; ``remaining`` run after it, in order.

    ``results`` holds results of earlier tools of this round; ``children`` the
    sub-agents this round spawned (they run while the remaining tools execute).
    ``asking``: set while ``current`` waits for a person's decision (it is not
    running; ``ApprovalGranted`` runs it, ``ApprovalDenied`` or ``UserAnswered`` gives
    its result). A status of this phase rather than a phase of its own: children,
    timers, cancels, restarts and forks of a round treat a waiting call as the round's
    current call, as they do a running one (DESIGN.md, "A human in the loop").
    """

    current: ToolCall
    call: int
    remaining: tuple[ToolCall, ...] = ()
    results: tuple[ToolResult, ...] = ()
    children: Children = Children()
    asking: Asking | None = attrs.field(
        default=None, metadata={"since": 7, "omitted_at_default": True}
    )


@attrs.frozen
class AwaitingSubAgents:
    """Every tool of the round is done; waiting for the pending children to finish."""

    children: Children
    results: tuple[ToolResult, ...] = ()


@attrs.frozen
class EndIdle:
    """After cancelling, a root conversation goes back to Idle."""


@attrs.frozen
class EndCompleted:
    result: str


@attrs.frozen
class EndFailed:
    error: str
    kind: ErrorKind
    reason: CancelReason | None = None


Ending = EndIdle | EndCompleted | EndFailed


@attrs.frozen
class CancellingSubAgents:
    """Children were told to stop; waiting for each to acknowledge with an outcome.

    ``grace_timer`` fires if some never do; ``ending`` is where the conversation goes
    once every child is accounted for.
    """

    children: Children
    results: tuple[ToolResult, ...]
    ending: Ending
    grace_timer: int


@attrs.frozen
class Error:
    """A root conversation's turn failed; a new user message starts a fresh turn."""

    error: str
    kind: ErrorKind


@attrs.frozen
class Completed:
    """Terminal phase of a sub-agent that produced a result (see
    ``Conversation.submitted`` for whether it called ``submit_result``)."""

    result: str


@attrs.frozen
class Failed:
    """Terminal phase of a sub-agent that ended without a result."""

    error: str
    kind: ErrorKind
    reason: CancelReason | None = None


Phase = (
    Idle
    | LlmRequesting
    | AwaitingRetry
    | ToolExecuting
    | AwaitingSubAgents
    | CancellingSubAgents
    | Error
    | Completed
    | Failed
)

# The one list of phase classes is the union above; the tuple is derived from it, so a
# new phase is added in one place (codec registry, generators and table follow).
ALL_PHASES: tuple[type[Phase], ...] = typing.get_args(Phase)

TERMINAL_PHASES = (Completed, Failed)
