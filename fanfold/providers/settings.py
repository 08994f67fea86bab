"""What a profile sets for its HTTP calls (timeouts, request parameters) and the
providers' defaults, without httpx or Trio: reading a configuration (its profiles'
prices, for `fanfold show`) imports this, not the HTTP providers (issue 36).
``fanfold.providers.http`` re-exports every name."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import httpx

OPENAI_BASE_URL = "https://api.openai.com/v1"
"""OpenAI's API (``fanfold.providers.openai.DEFAULT_BASE_URL``)."""
ANTHROPIC_BASE_URL = "https://api.anthropic.com"
"""Anthropic's API (``fanfold.providers.anthropic.DEFAULT_BASE_URL``)."""


@attrs.frozen
class Timeouts:
    """Seconds allowed for a model call.

    - ``connect``: to open the connection. The wait for a free connection is not
      counted (it is the wait for one of the client's slots, see ``pool_slots``).
    - ``read``: between two reads; a stream that stalls longer fails with TIMEOUT.
      For a non-streaming call this is the wait for the whole reply.
    - ``total``: the whole call, stream included (None: no limit).
    """

    connect: float = 10.0
    read: float = 300.0
    total: float | None = None

    def for_httpx(self) -> httpx.Timeout:
        """The equivalent ``httpx.Timeout`` (writes get the read timeout)."""
        import httpx  # only where a call is made: reading a profile needs no httpx

        # pool=None: a call that waits for a connection is queued, not failing. Calls
        # wait for a slot in front of the pool instead (``pool_slots``), so httpcore's
        # own queue stays empty: its wait scanned every queued request on each release
        # (CPU quadratic in a fan-out wider than the pool), and counting it against
        # ``connect`` failed calls queued behind a slow model with TIMEOUT.
        return httpx.Timeout(connect=self.connect, read=self.read, write=self.read, pool=None)


DEFAULT_TIMEOUTS = Timeouts()


@attrs.frozen
class RequestSettings:
    """Request parameters a profile passes to the model, beyond model and max_tokens.

    - ``stop``: stop sequences (OpenAI ``stop``, Anthropic ``stop_sequences``).
    - ``top_p``, ``seed`` (OpenAI-compatible only).
    - ``tool_choice``: ``"auto"``, ``"required"`` or ``"none"``; sent only on rounds
      that offer tools (Anthropic: ``{"type": "auto" | "any" | "none"}``).
    - ``parallel_tool_calls``: False asks for one tool call per reply (Anthropic:
      ``disable_parallel_tool_use``); sent only on rounds that offer tools.
    - ``reasoning_effort`` (OpenAI-compatible only).
    - ``extra_body``: (key, JSON text) pairs merged into the request body; never a key
      fanfold sets itself (checked when the profile is read).
    - ``extra_headers``: (name, value) pairs added to the request headers; never an
      authentication header (keys come only from environment variables).
    - ``prompt_caching`` (Anthropic): mark the stable prefix of every request (tool
      schemas and system prompt, the same for the children of one fan-out) for the
      prompt cache. On by default; OpenAI and compatible servers cache by themselves.
    """

    stop: tuple[str, ...] = ()
    top_p: float | None = None
    seed: int | None = None
    tool_choice: str | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    extra_body: tuple[tuple[str, str], ...] = ()
    extra_headers: tuple[tuple[str, str], ...] = ()
    prompt_caching: bool = True

    def merge_extra_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with ``extra_body`` added (a key already in ``body`` is kept)."""
        for key, text in self.extra_body:
            body.setdefault(key, json.loads(text))
        return body


DEFAULT_SETTINGS = RequestSettings()


POOL_SIZE = 100
"""Connections a provider client keeps (httpx's default), and the calls it lets run at
once: the others wait their turn in ``pool_slots``, in the order they came."""


def valid_api_key(value: str) -> bool:
    """True if ``value`` can be sent in an HTTP header: printable ASCII, no spaces."""
    return bool(value) and all(0x21 <= ord(ch) <= 0x7E for ch in value)


# ------------------------------------------------------------------ secrets


class Secret:
    """A string that never shows itself: ``repr``/``str`` print a mask; ``reveal()`` gives it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret value, for the one place that must send it (an HTTP header)."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __reduce__(self) -> Any:
        raise TypeError("a Secret cannot be pickled")


REDACTED = "[REDACTED]"

# Things that look like API keys even when we were not told about them.
_KEY_LIKE = re.compile(
    r"(?:sk-ant-[A-Za-z0-9_\-]{8,}|sk-[A-Za-z0-9_\-]{16,}|(?i:bearer)\s+[A-Za-z0-9._~+/\-]{8,}=*)"
)


def looks_like_key(text: str) -> bool:
    """True if ``text`` holds something shaped like an API key (``sk-...``, a bearer token)."""
    return _KEY_LIKE.search(text) is not None
