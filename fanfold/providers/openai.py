"""OpenAI-compatible Chat Completions (``POST {base_url}/chat/completions``).

Works with OpenAI and with local servers that speak the same API (llama.cpp's
``llama-server``, vLLM, Ollama, LM Studio). The wire format, both ways:

- The system prompt is the first message, ``{"role": "system"}`` (omitted if empty).
- ``UserMessage`` -> ``{"role": "user", "content": text}``.
- ``AssistantMessage`` -> ``{"role": "assistant", "content": text or null,
  "tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}]}``;
  ids and argument text are sent exactly as stored.
- ``ToolResultMessage`` -> ``{"role": "tool", "tool_call_id", "content"}``. The API has
  no error flag, so ``is_error`` is not sent (the content says what went wrong).
- Tools are ``{"type": "function", "function": {"name", "description", "parameters"}}``.

Replies: ``finish_reason`` is normalised to fanfold's stop reasons (``stop`` ->
``end_turn``, ``tool_calls`` -> ``tool_use``, ``length`` -> ``max_tokens``; others pass
through). A refusal (the ``refusal`` field) makes the stop reason ``refusal``, the
refusal its ``stop_details`` (and the text, if there is none). A reply with tool
calls cut off by ``length`` is OUTPUT_TRUNCATED, not malformed, even when the last
call's arguments parse (they may be cut). Tool
arguments are checked and stored as canonical JSON; invalid JSON is MALFORMED_RESPONSE.
A stream must end with ``data: [DONE]``; usage comes from its last chunk
(``stream_options.include_usage``).
"""

from __future__ import annotations

import functools
import json
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import httpx

from fanfold.providers.base import ProviderError
from fanfold.providers.http import (
    DEFAULT_SETTINGS,
    DEFAULT_TIMEOUTS,
    JSON_HEADERS,
    HttpProvider,
    RequestSettings,
    StreamAssembler,
    Timeouts,
)
from fanfold.providers.http1 import ConnectionPool
from fanfold.providers.settings import OPENAI_BASE_URL
from fanfold.providers.wire import (
    AssemblerProgress,
    IdentityMemo,
    Secret,
    SSEEvent,
    add_sampling,
    as_int,
    assemble,
    classify_stream_error,
    load_event_json,
    malformed,
    parse_billed,
    provider_schema,
    refuse_cut_tool_calls,
    snippet,
    tool_call,
)
from fanfold.statemachine import (
    STOP_REFUSAL,
    AssistantMessage,
    Message,
    ModelReply,
    ModelRequest,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
)

API = "openai"
DEFAULT_BASE_URL = OPENAI_BASE_URL

_FINISH_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
}


def stop_reason(finish_reason: str | None, has_tool_calls: bool) -> str:
    """fanfold's stop reason for an OpenAI ``finish_reason``.

    Some local servers say ``stop`` (or nothing) after tool calls; those count as
    ``tool_use``.
    """
    if finish_reason is None or (finish_reason == "stop" and has_tool_calls):
        return "tool_use" if has_tool_calls else "end_turn"
    return _FINISH_REASONS.get(finish_reason, finish_reason)


# ------------------------------------------------------------------ requests


def to_openai_messages(system: str, messages: Sequence[Message]) -> list[dict[str, Any]]:
    """fanfold's history as Chat Completions ``messages`` (system prompt first)."""
    wire: list[dict[str, Any]] = []
    if system:
        wire.append({"role": "system", "content": system})
    for message in messages:
        match message:
            case UserMessage(text=text):
                wire.append({"role": "user", "content": text})
            case AssistantMessage(text=text, tool_calls=calls):
                entry: dict[str, Any] = {
                    "role": "assistant",
                    "content": text if text or not calls else None,
                }
                if calls:
                    entry["tool_calls"] = [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments_json},
                        }
                        for call in calls
                    ]
                wire.append(entry)
            case ToolResultMessage(result=result):
                wire.append(
                    {"role": "tool", "tool_call_id": result.tool_call_id, "content": result.content}
                )
    return wire


OPENAI_DESCRIPTION_LIMIT = 1024
"""The longest function ``description`` OpenAI's own API takes, in characters: a
longer one fails the whole request with HTTP 400 ``string_above_max_length``
("Invalid 'tools[N].function.description': string too long. Expected a string with
maximum length 1024"). Applied only to OpenAI's and Azure OpenAI's hosts
(``openai_hosted``): local servers take longer descriptions, and their models should
read all of it."""


OPENAI_TOOLS_LIMIT = 128
"""The most tools OpenAI's own API takes in one request (its API reference, ``tools``:
"A max of 128 functions are supported"); a request offering more is refused before it
is sent, with what to do, instead of the API's HTTP 400."""


def openai_hosted(base_url: str) -> bool:
    """Whether ``base_url`` is OpenAI's own API or Azure OpenAI's (``*.openai.azure.com``),
    whose limits (``OPENAI_DESCRIPTION_LIMIT``) the request must keep."""
    host = (urllib.parse.urlsplit(base_url).hostname or "").lower()
    return host == "api.openai.com" or host.endswith(".openai.azure.com")


def described_within(text: str, limit: int | None) -> str:
    """``text``, or its first ``limit - 1`` characters and "…" when it is longer."""
    if limit is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "\u2026"


def to_openai_tools(
    tools: Sequence[ToolSpec], description_limit: int | None = None
) -> list[dict[str, Any]]:
    """Tool specs as Chat Completions function tools; each schema as the tool gave it,
    or the copy ``provider_schema`` makes when it has what a server refuses; each
    description as given, or cut to ``description_limit`` characters (OpenAI's own
    API: ``OPENAI_DESCRIPTION_LIMIT``).

    The dicts are built once per tool set and shared by every request offering it
    (issue 36: each request decoded every schema again, 17 KiB per waiting call):
    never change them, copy what you change."""
    return list(
        _SEEN_TOOLS.made(
            tools, description_limit, lambda: _openai_tools(tuple(tools), description_limit)
        )
    )


_SEEN_TOOLS = IdentityMemo()


@functools.lru_cache(maxsize=64)
def _openai_tools(
    tools: tuple[ToolSpec, ...], description_limit: int | None
) -> tuple[dict[str, Any], ...]:
    return tuple(
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": described_within(tool.description, description_limit),
                "parameters": provider_schema(tool.input_schema()),
            },
        }
        for tool in tools
    )


def openai_request_body(
    request: ModelRequest,
    *,
    model: str,
    stream: bool,
    max_tokens: int | None = None,
    temperature: float | None = None,
    max_tokens_param: str = "max_tokens",
    settings: RequestSettings = DEFAULT_SETTINGS,
    description_limit: int | None = None,
) -> dict[str, Any]:
    """The JSON body of a Chat Completions request, ``settings`` applied (tool
    settings only on a round that offers tools: servers refuse them without); tool
    descriptions cut to ``description_limit`` characters when one is given."""
    body: dict[str, Any] = {
        "model": model,
        "messages": to_openai_messages(request.system, request.messages),
    }
    if request.tools:
        body["tools"] = to_openai_tools(request.tools, description_limit)
    if max_tokens is not None:
        body[max_tokens_param] = max_tokens
    add_sampling(body, temperature, settings, "stop")
    if settings.seed is not None:
        body["seed"] = settings.seed
    if settings.reasoning_effort is not None:
        body["reasoning_effort"] = settings.reasoning_effort
    if request.tools and settings.tool_choice is not None:
        body["tool_choice"] = settings.tool_choice
    if request.tools and settings.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = settings.parallel_tool_calls
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return settings.merge_extra_body(body)


def _content_text(content: Any) -> str:
    """Text of a ``content`` that may be a string, null, or a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text", ""), str)
        )
    raise ValueError(f"unsupported message content: {snippet(json.dumps(content))}")


def from_openai_messages(wire: Sequence[Mapping[str, Any]]) -> tuple[str, tuple[Message, ...]]:
    """Chat Completions ``messages`` back into (system prompt, fanfold history).

    The inverse of ``to_openai_messages``; tool results get their tool's name from the
    assistant message that made the call. Raises ``ValueError`` on shapes fanfold
    cannot hold.
    """
    system: list[str] = []
    history: list[Message] = []
    names: dict[str, str] = {}
    for entry in wire:
        role = entry.get("role")
        if role in ("system", "developer"):
            system.append(_content_text(entry.get("content")))
        elif role == "user":
            history.append(UserMessage(_content_text(entry.get("content"))))
        elif role == "assistant":
            calls = []
            for raw in entry.get("tool_calls") or ():
                function = raw["function"]
                call = ToolCall(raw["id"], function["name"], function.get("arguments") or "{}")
                names[call.id] = call.name
                calls.append(call)
            history.append(AssistantMessage(_content_text(entry.get("content")), tuple(calls)))
        elif role == "tool":
            call_id = entry["tool_call_id"]
            name = names.get(call_id) or entry.get("name") or ""
            content = _content_text(entry.get("content"))
            history.append(ToolResultMessage(ToolResult(call_id, name, content)))
        else:
            raise ValueError(f"unsupported message role: {role!r}")
    return "\n\n".join(system), tuple(history)


# ------------------------------------------------------------------ replies


def _tool_call(raw: Any, what: str, *, cut_off: bool = False) -> ToolCall:
    if not isinstance(raw, dict) or not isinstance(raw.get("function"), dict):
        raise malformed(f"{what}: tool call without a function: {snippet(json.dumps(raw))}")
    function = raw["function"]
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise malformed(f"{what}: tool call without a name")
    arguments = function.get("arguments")
    if isinstance(arguments, dict):  # some servers send an object, not its text
        arguments = json.dumps(arguments)
    if arguments is not None and not isinstance(arguments, str):
        raise malformed(f"{what}: tool arguments of tool {name!r} are not text")
    call_id = raw.get("id")
    if not isinstance(call_id, str) or not call_id:
        call_id = _new_call_id()
    label = f"{what}: tool {name!r}"
    return tool_call(call_id, name, arguments, label, cut_off=cut_off)


def _new_call_id() -> str:
    """An id for a tool call whose server sent none (some local servers don't)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def _usage(raw: Any) -> Usage:
    """``prompt_tokens`` counts cached tokens too; ``prompt_tokens_details.
    cached_tokens`` says how many were read from the prompt cache."""
    if not isinstance(raw, dict):
        return Usage()
    details = raw.get("prompt_tokens_details")
    cached = as_int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return Usage(as_int(raw.get("prompt_tokens")), as_int(raw.get("completion_tokens")), cached)


def parse_openai_response(data: Any) -> ModelReply:
    """A non-streaming Chat Completions response as a ModelReply (raises ProviderError).

    A reply that cannot be used (cut off inside a tool call, malformed, an error) still
    says what it cost: the error carries the ``usage`` the server reported."""
    return parse_billed(data, f"{API} reply", _parse_openai_response, _usage)


def _parse_openai_response(data: dict[str, Any], what: str) -> ModelReply:
    if data.get("error") is not None:
        raise ProviderError(classify_stream_error(API, data))
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise malformed(f"{what}: no choices: {snippet(json.dumps(data))}")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise malformed(f"{what}: choice without a message")
    try:
        text = _content_text(message.get("content"))
    except ValueError as exc:
        raise malformed(f"{what}: {exc}") from None
    refusal = message.get("refusal")
    refusal = refusal if isinstance(refusal, str) and refusal.strip() else ""
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise malformed(f"{what}: tool_calls is not a list")
    finish = choice.get("finish_reason")
    finish = finish if isinstance(finish, str) else None
    calls = tuple(_tool_call(raw, what, cut_off=finish == "length") for raw in raw_calls)
    return refuse_cut_tool_calls(
        _reply(text, refusal, calls, _usage(data.get("usage")), finish), what
    )


def _reply(
    text: str, refusal: str, calls: tuple[ToolCall, ...], usage: Usage, finish: str | None
) -> ModelReply:
    """The reply; a ``refusal`` (the model declined) makes the stop reason ``refusal``
    with the refusal as its explanation (and as the text, if there is none)."""
    if refusal:
        return ModelReply(text or refusal, calls, usage, STOP_REFUSAL, stop_details=refusal)
    return ModelReply(text, calls, usage, stop_reason(finish, bool(calls)))


@attrs.define
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = attrs.Factory(list)


class OpenAIStreamAssembler(AssemblerProgress):
    """Builds a reply from Chat Completions chunks (``StreamAssembler``).

    Text arrives in ``delta.content`` (or ``delta.refusal``); tool calls in
    ``delta.tool_calls`` fragments keyed by ``index``: the first fragment carries the id
    and name, later ones append to ``arguments``. ``data: [DONE]`` ends the stream.
    """

    def __init__(self) -> None:
        super().__init__()
        self._text: list[str] = []
        self._refusal: list[str] = []
        self._calls: dict[int, _PartialCall] = {}
        self._finish: str | None = None
        self._usage = Usage()

    @property
    def usage(self) -> Usage:
        """The usage the server reported so far (zero before the usage chunk)."""
        return self._usage

    def feed(self, event: SSEEvent) -> None:
        """Take one ``data:`` event."""
        if self.done:
            return
        data = event.data.strip()
        if not data:
            return
        if data == "[DONE]":
            self.done = True
            return
        chunk = load_event_json(event, f"{API} stream")
        # (Per event: the JSON's own types, ``type(...) is``, no call per check.)
        if chunk.get("error") is not None:
            raise ProviderError(classify_stream_error(API, chunk))
        usage = chunk.get("usage")
        if type(usage) is dict:
            self._usage = _usage(usage)
            self.output_tokens = self._usage.output_tokens
        choices = chunk.get("choices") or []
        if type(choices) is not list:
            raise malformed(f"{API} stream: choices is not a list")
        for choice in choices:
            if type(choice) is dict and choice.get("index", 0) == 0:
                self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        if type(delta) is dict and delta:
            content = delta.get("content")
            if type(content) is str:
                self._text.append(content)
                self.output_chars += len(content)
            refusal = delta.get("refusal")
            if type(refusal) is str:
                self._refusal.append(refusal)
                self.output_chars += len(refusal)
            fragments = delta.get("tool_calls")
            if type(fragments) is list:
                for fragment in fragments:
                    self._fragment(fragment)
        finish = choice.get("finish_reason")
        if type(finish) is str:
            self._finish = finish

    def _fragment(self, fragment: Any) -> None:
        if not isinstance(fragment, dict):
            raise malformed(f"{API} stream: tool call fragment is not an object")
        index = fragment.get("index")
        fragment_id = fragment.get("id")
        if not isinstance(index, int):
            # No index (some servers): a new id starts a call, else continue the last.
            known = {call.id for call in self._calls.values()}
            if (isinstance(fragment_id, str) and fragment_id and fragment_id not in known) or (
                not self._calls
            ):
                index = len(self._calls)
            else:
                index = max(self._calls)
        call = self._calls.setdefault(index, _PartialCall())
        if isinstance(fragment_id, str) and fragment_id and not call.id:
            call.id = fragment_id
        function = fragment.get("function")
        if isinstance(function, dict):
            name = function.get("name")
            if isinstance(name, str) and name and not call.name:
                call.name = name
            arguments = function.get("arguments")
            if isinstance(arguments, dict):
                arguments = json.dumps(arguments)
            if isinstance(arguments, str):
                call.arguments.append(arguments)
                self.output_chars += len(arguments)

    def finish(self) -> ModelReply:
        """The assembled reply; MALFORMED_RESPONSE if ``[DONE]`` never came."""
        if not self.done:
            raise malformed(f"{API} stream ended before [DONE]")
        what = f"{API} stream"
        calls = []
        for index in sorted(self._calls):
            partial = self._calls[index]
            if not partial.name:
                raise malformed(f"{what}: tool call {index} has no name")
            call = tool_call(
                partial.id or _new_call_id(),
                partial.name,
                "".join(partial.arguments),
                f"{what}: tool {partial.name!r}",
                cut_off=self._finish == "length",
            )
            calls.append(call)
        refusal = "".join(self._refusal)
        reply = _reply(
            "".join(self._text),
            refusal.strip() and refusal,
            tuple(calls),
            self._usage,
            self._finish,
        )
        return refuse_cut_tool_calls(reply, what)


def parse_openai_stream(body: bytes | str) -> ModelReply:
    """A complete recorded Chat Completions stream as a ModelReply."""
    return assemble(OpenAIStreamAssembler(), body)


# ------------------------------------------------------------------ provider


class OpenAIProvider(HttpProvider):
    """Chat Completions over HTTP; see the module docstring for the wire format.

    ``max_tokens_param`` names the body field for ``max_tokens``: ``"max_tokens"``
    (widest support) or ``"max_completion_tokens"`` (required by OpenAI's reasoning
    models). Without an API key no ``Authorization`` header is sent (local servers).
    """

    api = API
    default_base_url = DEFAULT_BASE_URL

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_BASE_URL,
        model: str | None,
        api_key: str | Secret | None = None,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        stream: bool = True,
        max_tokens: int | None = None,
        temperature: float | None = None,
        max_tokens_param: str = "max_tokens",
        settings: RequestSettings = DEFAULT_SETTINGS,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
        profile: str | None = None,
        pool: ConnectionPool | None = None,
    ) -> None:
        super().__init__(
            base_url=base_url,
            model=model,
            api_key=api_key,
            timeouts=timeouts,
            stream=stream,
            max_tokens=max_tokens,
            temperature=temperature,
            settings=settings,
            client=client,
            clock=clock,
            profile=profile,
            pool=pool,
        )
        self.max_tokens_param = max_tokens_param
        # OpenAI's own hosts refuse a tool description over 1,024 characters; other
        # servers get it whole.
        self.hosted = openai_hosted(base_url)
        if self.hosted:
            self.description_limit = OPENAI_DESCRIPTION_LIMIT

    @property
    def url(self) -> str:
        """``{base_url}/chat/completions``."""
        return f"{self.base_url}/chat/completions"

    def headers(self, api_key: str | None) -> dict[str, str]:
        """JSON headers and, with a key, ``Authorization: Bearer``."""
        headers = dict(JSON_HEADERS)
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        return headers

    def body(self, request: ModelRequest, model: str, stream: bool) -> dict[str, Any]:
        """The request body (see ``openai_request_body``); ``ValueError`` (an invalid
        request, never sent) when OpenAI's own API is offered more tools than it takes."""
        if self.hosted and len(request.tools) > OPENAI_TOOLS_LIMIT:
            raise ValueError(
                f"OpenAI takes at most {OPENAI_TOOLS_LIMIT} tools in a request and this "
                f"one offers {len(request.tools)}: offer fewer (an MCP server's "
                "include_tools/exclude_tools, an agent definition's tools)"
            )
        return openai_request_body(
            request,
            model=model,
            stream=stream,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            max_tokens_param=self.max_tokens_param,
            settings=self.settings,
            description_limit=self.description_limit,
        )

    def parse_reply(self, data: Any) -> ModelReply:
        """See ``parse_openai_response``."""
        return parse_openai_response(data)

    def assembler(self) -> StreamAssembler:
        """A fresh ``OpenAIStreamAssembler``."""
        return OpenAIStreamAssembler()
