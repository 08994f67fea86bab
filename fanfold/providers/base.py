"""The one-method seam between the runtime and a language model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import attrs

from fanfold.statemachine import ErrorKind, ModelError, ModelReply, ModelRequest, ToolCall, Usage


@attrs.frozen
class StreamProgress:
    """Progress of a streaming reply, for live displays only (the reducer never sees it)."""

    conversation_id: str
    output_chars: int
    output_tokens: int | None = None


@attrs.frozen
class CallContext:
    """Who is calling: lets a provider key scripted replies or route per conversation.

    ``path`` is the conversation's place in its tree ("root", "root/1", "root/1/2").
    """

    conversation_id: str
    root_id: str
    path: str
    depth: int
    task: str | None
    call: int
    attempt: int = 1
    on_progress: Callable[[StreamProgress], None] | None = None


class ProviderError(Exception):
    """A classified model-call failure; ``error`` becomes a ModelFailed event."""

    def __init__(self, error: ModelError) -> None:
        super().__init__(f"{error.kind}: {error.message}")
        self.error = error


class Provider(Protocol):
    """Call a model. Return the complete reply or raise ProviderError; nothing else.

    Any other exception escaping ``complete`` is treated as a bug in the provider.
    """

    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply: ...


class RepliesAtOnce(Protocol):
    """An optional second method of a Provider that knows a call's outcome as soon as
    the call starts and only makes it wait (the scripted provider's latency).

    ``reply_after(request, context)`` returns ``(seconds, outcome)``: what
    ``complete(request, context)`` would do is wait ``seconds`` (finite, >= 0), then
    return ``outcome`` if it is a ModelReply or raise it if it is a ProviderError. The
    runtime then waits on its own timers (``fanfold.runtime.timers``) instead of a task
    per call in flight, and cancels the call by cancelling its timer: a thousand
    waiting sub-agents hold a thousand timer entries, not a thousand Trio tasks with
    their cancel scopes and coroutines. It runs when the call starts, in the engine's
    task, so it must not block; whatever else it raises counts as the call's failure,
    as if ``complete`` had raised it.
    """

    def reply_after(
        self, request: ModelRequest, context: CallContext
    ) -> tuple[float, ModelReply | ProviderError]: ...


class LimitsCallsAtOnce(Protocol):
    """An optional attribute of a Provider that can only make so many calls at once
    (an HTTP provider: its client's pool of connections).

    ``calls_at_once``: the runtime runs at most this many of its model calls at once;
    the others wait, in the order they were made, as data rather than a task each
    (``fanfold.runtime.calls``). Which calls are made, and when, stay the reducer's
    decisions: this only orders their start, as a connection pool would.
    """

    calls_at_once: int


class ProviderContractError(TypeError):
    """A provider returned, or raised, something its contract does not allow (a bug
    in the provider). The runtime records it as a ``provider_failure``."""


async def complete_checked(
    provider: Provider, request: ModelRequest, context: CallContext
) -> ModelReply:
    """``provider.complete(request, context)``, held to the Provider contract.

    Returns the reply, or raises the provider's ProviderError, only when they are
    well formed: fields of the types declared, token counts >= 0, a retry hint that is
    None or a number >= 0. Anything else raises ProviderContractError. What a provider
    hands back goes into the reducer and the log; an ill-typed value would be refused
    there, by the reducer or the codec, as a crash of the runtime that leaves the
    conversation unfinished with no recorded reason.
    """
    try:
        reply = await provider.complete(request, context)
    except ProviderError as exc:
        check_error(exc)
        raise
    return checked_reply(reply)


def checked_reply(reply: object) -> ModelReply:
    """``reply`` if it is a well-formed ModelReply, else ProviderContractError (what
    ``complete_checked`` does with a reply; the runtime calls it after awaiting the
    provider itself, one coroutine frame less per call in flight)."""
    problem = _reply_problem(reply)
    if problem is not None:
        raise ProviderContractError(f"provider returned {problem}")
    assert isinstance(reply, ModelReply)
    return reply


def check_error(exc: ProviderError) -> None:
    """Raise ProviderContractError (from ``exc``) if the ProviderError a provider
    raised carries an ill-formed error (what ``complete_checked`` does with it)."""
    problem = _error_problem(exc.error)
    if problem is not None:
        raise ProviderContractError(f"provider raised ProviderError with {problem}") from exc


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0


def _reply_problem(reply: object) -> str | None:
    """What is wrong with ``reply`` as a ModelReply, or None."""
    # Every reply passes here: the exact types, checked with ``type(...) is`` (no call
    # in CPython 3.11+, where ``isinstance`` is one per check), pass at once; anything
    # else (subclasses included) takes the full checks below, which name the problem.
    if type(reply) is ModelReply:
        usage = reply.usage
        if (
            type(reply.text) is str
            and type(reply.stop_reason) is str
            and type(reply.tool_calls) is tuple
            and type(usage) is Usage
            and type(usage.input_tokens) is int
            and usage.input_tokens >= 0
            and type(usage.output_tokens) is int
            and usage.output_tokens >= 0
        ):
            for call in reply.tool_calls:
                if (
                    type(call) is not ToolCall
                    or type(call.id) is not str
                    or type(call.name) is not str
                    or type(call.arguments_json) is not str
                ):
                    break
            else:
                return None
    if not isinstance(reply, ModelReply):
        return f"{type(reply).__name__} instead of a ModelReply"
    if not isinstance(reply.text, str):
        return f"a reply whose text is {type(reply.text).__name__}, not str"
    if not isinstance(reply.stop_reason, str):
        return f"a reply whose stop_reason is {type(reply.stop_reason).__name__}, not str"
    if not isinstance(reply.tool_calls, tuple):
        return f"a reply whose tool_calls are a {type(reply.tool_calls).__name__}, not a tuple"
    for index, call in enumerate(reply.tool_calls):
        if not isinstance(call, ToolCall):
            return f"a reply whose tool_calls[{index}] is {type(call).__name__}, not a ToolCall"
        for name in ("id", "name", "arguments_json"):
            if not isinstance(getattr(call, name), str):
                return f"a reply whose tool_calls[{index}].{name} is not str"
    usage = reply.usage
    counts = (usage.input_tokens, usage.output_tokens) if isinstance(usage, Usage) else None
    if counts is None or not all(map(_is_count, counts)):
        return f"a reply whose usage is not a Usage of token counts >= 0: {usage!r}"
    return None


def _error_problem(error: object) -> str | None:
    """What is wrong with ``error`` as a ModelError, or None."""
    if not isinstance(error, ModelError):
        return f"{type(error).__name__} instead of a ModelError"
    if not isinstance(error.kind, ErrorKind):
        return f"an error kind {error.kind!r} that is not an ErrorKind"
    if not isinstance(error.message, str):
        return f"a message that is {type(error.message).__name__}, not str"
    hint = error.retry_after
    if hint is not None and (
        isinstance(hint, bool) or not isinstance(hint, int | float) or not hint >= 0
    ):
        return f"retry_after {hint!r}: not None or a number of seconds >= 0"
    return None
