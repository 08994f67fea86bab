"""The one exception family of the reducer, and the typed kinds of failure."""

from __future__ import annotations

import enum
from typing import Any


class ErrorKind(enum.StrEnum):
    """Why something failed. Every failure in fanfold carries exactly one of these.

    There is deliberately no catch-all "unknown" kind: a provider must classify what it
    sees, so a transient error can never silently become fatal (or the reverse).
    """

    # Model-call failures, reported by providers.
    RATE_LIMIT = "rate_limit"
    SERVER_ERROR = "server_error"
    NETWORK = "network"
    TIMEOUT = "timeout"
    MALFORMED_RESPONSE = "malformed_response"
    AUTH = "auth"
    INVALID_REQUEST = "invalid_request"
    CONTEXT_EXHAUSTED = "context_exhausted"
    # The account is out of credit or quota (OpenAI sends it as a 429 with code
    # "insufficient_quota", others as 402): waiting does not help, so it is fatal.
    QUOTA_EXHAUSTED = "quota_exhausted"
    # The reply was cut off at the output token limit inside a tool call's arguments:
    # the same request would be cut off again, so it is fatal (raise max_tokens).
    OUTPUT_TRUNCATED = "output_truncated"
    # A provider raised something it did not classify: a bug in the provider, fatal
    # because its cause is unknown, and logged loudly by the runtime.
    PROVIDER_FAILURE = "provider_failure"
    # Sub-agent endings decided by the reducer.
    SUBMITTED_ERROR = "submitted_error"
    # The model declined the request (Anthropic ``stop_reason: refusal``, OpenAI's
    # ``refusal`` field): the explanation it gave is the error.
    REFUSED = "refused"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    ITERATION_LIMIT = "iteration_limit"
    BUDGET_EXHAUSTED = "budget_exhausted"
    UNRESPONSIVE = "unresponsive"
    INTERRUPTED = "interrupted"
    # A sub-agent's working directory resolves (symbolic links followed) outside its
    # parent's or the project, or is not a directory: it never started.
    INVALID_CWD = "invalid_cwd"
    # A step of a sequential spawn_agents call that never ran: an earlier one failed.
    NOT_RUN = "not_run"

    @property
    def retryable(self) -> bool:
        """True for model errors worth another attempt after a backoff."""
        return self in _RETRYABLE


_RETRYABLE = frozenset(
    {
        ErrorKind.RATE_LIMIT,
        ErrorKind.SERVER_ERROR,
        ErrorKind.NETWORK,
        ErrorKind.TIMEOUT,
        ErrorKind.MALFORMED_RESPONSE,
    }
)


class CancelReason(enum.StrEnum):
    """Who or what asked a conversation to stop."""

    USER = "user"
    PARENT = "parent"
    TIMEOUT = "timeout"
    LIMIT = "limit"

    @property
    def error_kind(self) -> ErrorKind:
        """The failure kind a sub-agent ends with when cancelled for this reason."""
        if self is CancelReason.TIMEOUT:
            return ErrorKind.TIMED_OUT
        if self is CancelReason.LIMIT:
            return ErrorKind.BUDGET_EXHAUSTED
        return ErrorKind.CANCELLED


class IllegalTransition(Exception):
    """An event the reducer refuses in the current state. Nothing changed.

    Carries the ``state`` and ``event`` it was raised for, and a human ``reason``.
    """

    def __init__(self, state: Any, event: Any, reason: str) -> None:
        self.state = state
        self.event = event
        self.reason = reason
        phase = getattr(state, "phase", state)
        super().__init__(f"can't handle {type(event).__name__} in {type(phase).__name__}: {reason}")


class UnknownChild(IllegalTransition):
    """A sub-agent outcome for a child this conversation never spawned."""


class DuplicateChildOutcome(IllegalTransition):
    """A second outcome for a child whose outcome was already accepted."""


class UnknownCall(IllegalTransition):
    """A result for a call, tool or timer this conversation never issued."""
