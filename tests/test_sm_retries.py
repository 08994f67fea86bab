"""Issue 2, behaviour 2: model errors carry a kind; retryable kinds are retried with
exponential backoff up to ``max_attempts``; the retry timer must match; exhausted or
fatal errors end the turn (root: Error, recoverable; sub-agent: Failed + NotifyParent)."""

from __future__ import annotations

import pytest
from sm_support import child, failed, only, replied, root, step, steps, user

from fanfold.statemachine import (
    AbortCall,
    AwaitingRetry,
    CallModel,
    ChildFailed,
    Error,
    ErrorKind,
    Failed,
    Idle,
    Limits,
    LlmRequesting,
    ModelError,
    ModelReplied,
    ModelReply,
    NotifyParent,
    ScheduleRetry,
    TimerFired,
    TurnFinished,
    TurnOutcome,
    UnknownCall,
    Usage,
    UserMessage,
    model_request,
)

RETRYABLE = {
    ErrorKind.RATE_LIMIT,
    ErrorKind.SERVER_ERROR,
    ErrorKind.NETWORK,
    ErrorKind.TIMEOUT,
    ErrorKind.MALFORMED_RESPONSE,
}
FATAL_MODEL_KINDS = [
    ErrorKind.AUTH,
    ErrorKind.INVALID_REQUEST,
    ErrorKind.CONTEXT_EXHAUSTED,
    ErrorKind.PROVIDER_FAILURE,
]


def test_exactly_the_transient_kinds_are_retryable_and_there_is_no_catch_all() -> None:
    assert {k for k in ErrorKind if k.retryable} == RETRYABLE
    names = {k.value for k in ErrorKind}
    assert not names & {"unknown", "other", "generic", "error"}


def test_a_retryable_failure_schedules_a_retry_and_its_timer_starts_attempt_two() -> None:
    state = steps(root(), user("hi"))
    error = ModelError(ErrorKind.RATE_LIMIT, "slow down")
    state, effects = step(state, failed(state, error))
    assert state.phase == AwaitingRetry(timer=1, next_attempt=2, last_error=error)
    (retry,) = effects
    assert isinstance(retry, ScheduleRetry)
    assert (retry.timer, retry.attempt) == (1, 2)
    assert 0.5 <= retry.delay <= 1.0  # retry_base 1s, jittered into [50%, 100%]
    state, effects = step(state, TimerFired(1))
    assert state.phase == LlmRequesting(call=2, attempt=2)
    assert state.rounds == 1  # a retry is not a new round
    call = only(effects, CallModel)
    assert call.call == 2 and call.attempt == 2
    assert model_request(state).messages == (UserMessage("hi"),)


@pytest.mark.parametrize("kind", sorted(RETRYABLE))
def test_every_retryable_kind_is_retried(kind: ErrorKind) -> None:
    state = steps(root(), user("hi"))
    state, _ = step(state, failed(state, ModelError(kind, "x")))
    assert isinstance(state.phase, AwaitingRetry)


def test_backoff_is_exponential_capped_and_deterministic() -> None:
    limits = Limits(max_attempts=6, retry_base=2.0, retry_cap=5.0)
    state = steps(root(limits), user("hi"))
    delays = []
    for attempt in range(2, 7):
        state, effects = step(state, failed(state, ModelError(ErrorKind.SERVER_ERROR, "503")))
        retry = only(effects, ScheduleRetry)
        assert retry.attempt == attempt
        ceiling = min(5.0, 2.0 * 2 ** (attempt - 2))
        assert ceiling / 2 <= retry.delay <= ceiling
        delays.append(retry.delay)
        state, _ = step(state, TimerFired(retry.timer))
    # Same conversation, same events: same delays (the jitter is a hash, not random).
    again = steps(root(limits), user("hi"))
    for delay in delays:
        again, effects = step(again, failed(again, ModelError(ErrorKind.SERVER_ERROR, "503")))
        retry = only(effects, ScheduleRetry)
        assert retry.delay == delay
        again, _ = step(again, TimerFired(retry.timer))


def test_the_providers_retry_after_hint_is_the_delay() -> None:
    state = steps(root(), user("hi"))
    state, effects = step(state, failed(state, ModelError(ErrorKind.RATE_LIMIT, "429", 12.5)))
    assert only(effects, ScheduleRetry).delay == 12.5


def test_root_exhausting_its_attempts_ends_in_error_and_a_message_recovers() -> None:
    state = steps(root(Limits(max_attempts=2)), user("hi"))
    state, _ = step(state, failed(state, ModelError(ErrorKind.NETWORK, "reset")))
    state, _ = step(state, TimerFired(1))
    state, effects = step(state, failed(state, ModelError(ErrorKind.NETWORK, "reset again")))
    assert isinstance(state.phase, Error)
    assert state.phase.kind is ErrorKind.NETWORK
    assert "retries exhausted after 2 attempt(s)" in state.phase.error
    assert effects == (TurnFinished(TurnOutcome.ERROR, state.phase.error),)
    state, effects = step(state, user("try again"))
    assert state.phase == LlmRequesting(call=3, attempt=1)
    assert only(effects, CallModel).call == 3
    assert model_request(state).messages[-1] == UserMessage("try again")
    state, _ = step(state, ModelReplied(3, ModelReply("fine now")))
    assert state.phase == Idle()


@pytest.mark.parametrize("kind", FATAL_MODEL_KINDS)
def test_a_fatal_kind_is_never_retried(kind: ErrorKind) -> None:
    state = steps(root(), user("hi"))
    state, effects = step(state, failed(state, ModelError(kind, "no")))
    assert isinstance(state.phase, Error) and state.phase.kind is kind
    assert "not retryable after 1 attempt(s)" in state.phase.error
    assert [type(e) for e in effects] == [TurnFinished]


def test_sub_agent_exhausting_its_attempts_fails_and_notifies_the_parent() -> None:
    state = child(Limits(max_attempts=1))
    state, effects = step(state, failed(state, ModelError(ErrorKind.TIMEOUT, "read timeout")))
    assert isinstance(state.phase, Failed)
    assert state.phase.kind is ErrorKind.TIMEOUT and state.phase.reason is None
    assert effects == (
        NotifyParent("root", "root.1", ChildFailed(state.phase.error, ErrorKind.TIMEOUT)),
        TurnFinished(TurnOutcome.FAILED, state.phase.error),
    )


def test_sub_agent_with_a_time_limit_aborts_its_timer_when_it_fails() -> None:
    state = child(timeout=30.0)
    state, effects = step(state, failed(state, ModelError(ErrorKind.AUTH, "bad key")))
    assert isinstance(state.phase, Failed)
    assert effects[0] == AbortCall(0)


def test_the_retry_timer_must_match_the_attempt() -> None:
    state = steps(root(), user("hi"))
    state = steps(state, failed(state, ModelError(ErrorKind.RATE_LIMIT, "x")))
    # An earlier number (the failed call's) is stale: absorbed, nothing happens.
    assert step(state, TimerFired(0)) == (state, ())
    # A reply to the failed call arriving late is absorbed too.
    assert step(state, ModelReplied(0, ModelReply("late"))) == (state, ())
    # A number never issued is a bug in whoever sent it.
    with pytest.raises(UnknownCall, match="call 7 was never issued"):
        step(state, TimerFired(7))


def test_a_reply_during_a_retry_attempt_is_accepted_normally() -> None:
    state = steps(root(), user("hi"))
    state = steps(state, failed(state, ModelError(ErrorKind.RATE_LIMIT, "x")), TimerFired(1))
    state, effects = step(state, replied(state, text="made it"))
    assert state.phase == Idle()
    assert effects == (TurnFinished(TurnOutcome.ANSWERED, "made it"),)


def test_the_tokens_of_failed_attempts_count_in_usage() -> None:
    """Issue 13, item 2: three attempts billed 1,283 tokens each show 3,849, not 0."""
    billed = Usage(1200, 83)
    state = steps(root(Limits(max_attempts=3)), user("hi"))
    for _ in range(2):
        state, _effects = step(
            state, failed(state, ModelError(ErrorKind.SERVER_ERROR, "x", None, billed))
        )
        assert isinstance(state.phase, AwaitingRetry)
        assert isinstance(state.phase, AwaitingRetry)
        state, _effects = step(state, TimerFired(state.phase.timer))
    state, _effects = step(
        state, failed(state, ModelError(ErrorKind.SERVER_ERROR, "x", None, billed))
    )
    assert isinstance(state.phase, Error) and state.phase.kind is ErrorKind.SERVER_ERROR
    assert state.usage == Usage(3600, 249) and state.usage.total == 3 * 1283


def test_a_failed_attempt_that_uses_up_the_budget_ends_instead_of_retrying() -> None:
    state = steps(child(Limits(max_attempts=5, max_tokens=2000)))
    billed = Usage(1200, 83)
    state, _effects = step(state, failed(state, ModelError(ErrorKind.RATE_LIMIT, "x", 1.0, billed)))
    assert isinstance(state.phase, AwaitingRetry)  # 1,283 of 2,000
    state, _effects = step(state, TimerFired(state.phase.timer))
    state, effects = step(state, failed(state, ModelError(ErrorKind.RATE_LIMIT, "x", 1.0, billed)))
    assert isinstance(state.phase, Failed) and state.phase.kind is ErrorKind.BUDGET_EXHAUSTED
    assert "token budget of 2000 exhausted (2566 used)" in state.phase.error
    notice = only(effects, NotifyParent)
    assert notice.outcome.tokens == 2566
