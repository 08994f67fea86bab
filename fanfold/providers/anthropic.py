"""Anthropic Messages API (``POST {base_url}/v1/messages``).

The wire format, both ways:

- The system prompt is the top-level ``system`` field (omitted if empty).
- ``UserMessage`` -> a ``user`` turn; ``ToolResultMessage`` -> a ``tool_result`` block
  (``tool_use_id``, ``content``, ``is_error`` when set) in a ``user`` turn.
  Consecutive user-side messages merge into one turn, tool results first, so roles
  alternate as the API requires. A user turn holding a single text is sent as a plain
  string.
- ``AssistantMessage`` -> an ``assistant`` turn: a ``text`` block (if any text) then one
  ``tool_use`` block per call (``id``, ``name``, ``input`` parsed from the stored JSON).
  An empty assistant message (no text, no calls) is left out: the API rejects empty
  content.
- Tools are ``{"name", "description", "input_schema"}``.

Replies: text blocks are concatenated; ``tool_use`` blocks become tool calls (input
stored as canonical JSON); other blocks (thinking, server tools) are ignored. Input
tokens count cache writes and reads too. A stream must end with ``message_stop`` and
every ``tool_use`` block must be closed with valid JSON, else MALFORMED_RESPONSE. A
reply with tool calls whose ``stop_reason`` is ``max_tokens`` is OUTPUT_TRUNCATED (its
last call was cut, even if its input parses), streamed or not. An ``event: error`` in
a stream is classified from its data, whatever that data's ``type`` says.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from fanfold.providers.base import ProviderError
from fanfold.providers.http import (
    DEFAULT_SETTINGS,
    JSON_HEADERS,
    HttpProvider,
    RequestSettings,
    StreamAssembler,
)
from fanfold.providers.settings import ANTHROPIC_BASE_URL
from fanfold.providers.wire import (
    AssemblerProgress,
    IdentityMemo,
    SSEEvent,
    add_sampling,
    as_int,
    assemble,
    classify_stream_error,
    cut_off_tool_call,
    finite_json,
    load_event_json,
    malformed,
    parse_billed,
    provider_schema,
    refuse_cut_tool_calls,
    snippet,
    tool_call,
)
from fanfold.statemachine import (
    STOP_MAX_TOKENS,
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
    canonical_json,
)

API = "anthropic"
DEFAULT_BASE_URL = ANTHROPIC_BASE_URL
ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096

# ------------------------------------------------------------------ requests


def _tool_input(call: ToolCall) -> dict[str, Any]:
    try:
        value = call.arguments()
    except ValueError:
        raise ValueError(f"tool call {call.id!r} has arguments that are not JSON") from None
    if not isinstance(value, dict):
        raise ValueError(f"tool call {call.id!r} has arguments that are not a JSON object")
    # A call the reducer refused for a NaN or an infinity is still in the history; the
    # request body must be JSON, so those numbers are sent as their names, quoted.
    try:
        finite: dict[str, Any] = finite_json(value)
    except RecursionError:
        raise ValueError(f"tool call {call.id!r} has arguments nested too deeply") from None
    return finite


def to_anthropic_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """fanfold's history as Messages API ``messages`` (roles alternate).

    Raises ``ValueError`` if a stored tool call's arguments are not a JSON object.
    """
    turns: list[tuple[str, list[dict[str, Any]]]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))

    for message in messages:
        match message:
            case UserMessage(text=text):
                add("user", [{"type": "text", "text": text}])
            case ToolResultMessage(result=result):
                block: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": result.tool_call_id,
                    "content": result.content,
                }
                if result.is_error:
                    block["is_error"] = True
                add("user", [block])
            case AssistantMessage(text=text, tool_calls=calls):
                blocks: list[dict[str, Any]] = []
                if text:
                    blocks.append({"type": "text", "text": text})
                for call in calls:
                    blocks.append(
                        {
                            "type": "tool_use",
                            "id": call.id,
                            "name": call.name,
                            "input": _tool_input(call),
                        }
                    )
                if blocks:
                    add("assistant", blocks)
    wire: list[dict[str, Any]] = []
    for role, blocks in turns:
        if role == "user":
            # The API wants tool results before any text in a user turn.
            blocks = sorted(blocks, key=lambda b: b["type"] != "tool_result")
            if len(blocks) == 1 and blocks[0]["type"] == "text":
                wire.append({"role": role, "content": blocks[0]["text"]})
                continue
        wire.append({"role": role, "content": blocks})
    return wire


def to_anthropic_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Tool specs as Messages API tools; each schema as the tool gave it, or the copy
    ``provider_schema`` makes when it has what a server refuses.

    The dicts are built once per tool set and shared by every request offering it
    (issue 36): never change them, copy what you change."""
    return list(_SEEN_TOOLS.made(tools, None, lambda: _anthropic_tools(tuple(tools))))


_SEEN_TOOLS = IdentityMemo()


@functools.lru_cache(maxsize=64)
def _anthropic_tools(tools: tuple[ToolSpec, ...]) -> tuple[dict[str, Any], ...]:
    return tuple(
        {
            "name": tool.name,
            "description": tool.description,
            "input_schema": provider_schema(tool.input_schema()),
        }
        for tool in tools
    )


def anthropic_request_body(
    request: ModelRequest,
    *,
    model: str,
    stream: bool,
    max_tokens: int | None = None,
    temperature: float | None = None,
    settings: RequestSettings = DEFAULT_SETTINGS,
) -> dict[str, Any]:
    """The JSON body of a Messages API request (``max_tokens`` is required there),
    ``settings`` applied: ``stop`` as ``stop_sequences``; ``tool_choice`` and
    ``parallel_tool_calls`` as the API's ``tool_choice`` object, on rounds with tools.
    (``seed`` and ``reasoning_effort`` have no Messages API equivalent; the config
    refuses them for Anthropic profiles.)"""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS,
        "messages": to_anthropic_messages(request.messages),
    }
    if request.system:
        body["system"] = request.system
    if request.tools:
        body["tools"] = to_anthropic_tools(request.tools)
    if settings.prompt_caching:
        # The prefix up to a cache_control mark is cached (tools, then system, then
        # messages): the last tool and the system prompt, the same on every round and
        # for every child of one fan-out, are read from the cache after the first call.
        if request.tools:
            # A copy of the last tool: the others are the shared dicts.
            body["tools"][-1] = {**body["tools"][-1], "cache_control": _EPHEMERAL}
        if request.system:
            body["system"] = [{"type": "text", "text": request.system, "cache_control": _EPHEMERAL}]
    add_sampling(body, temperature, settings, "stop_sequences")
    choice = _tool_choice(settings) if request.tools else None
    if choice is not None:
        body["tool_choice"] = choice
    if stream:
        body["stream"] = True
    return settings.merge_extra_body(body)


_TOOL_CHOICE = {"auto": "auto", "required": "any", "none": "none"}
_EPHEMERAL = {"type": "ephemeral"}


def _tool_choice(settings: RequestSettings) -> dict[str, Any] | None:
    """The Messages API ``tool_choice`` for ``settings`` (None: leave the default)."""
    if settings.tool_choice is None and settings.parallel_tool_calls is None:
        return None
    choice: dict[str, Any] = {"type": _TOOL_CHOICE[settings.tool_choice or "auto"]}
    if settings.parallel_tool_calls is False and choice["type"] != "none":
        choice["disable_parallel_tool_use"] = True
    return choice


def _block_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            block.get("text", "")
            for block in content
            if isinstance(block, dict) and block.get("type") == "text"
        )
    if content is None:
        return ""
    raise ValueError(f"unsupported content: {snippet(json.dumps(content))}")


def from_anthropic_messages(wire: Sequence[Mapping[str, Any]]) -> tuple[Message, ...]:
    """Messages API ``messages`` back into fanfold's history.

    The inverse of ``to_anthropic_messages``: each text block of a user turn is a
    UserMessage, each ``tool_result`` a ToolResultMessage (named after the tool of its
    ``tool_use``); an assistant turn's text blocks join into one AssistantMessage with
    its ``tool_use`` blocks as calls. Blocks fanfold cannot hold (server tools,
    thinking) are dropped. Raises ``ValueError`` on an unknown role.
    """
    history: list[Message] = []
    names: dict[str, str] = {}
    for entry in wire:
        role = entry.get("role")
        content = entry.get("content")
        if role == "user":
            if isinstance(content, str):
                history.append(UserMessage(content))
                continue
            for block in content or ():
                kind = block.get("type")
                if kind == "text":
                    history.append(UserMessage(block["text"]))
                elif kind == "tool_result":
                    call_id = block["tool_use_id"]
                    result = ToolResult(
                        call_id,
                        names.get(call_id, ""),
                        _block_text(block.get("content")),
                        bool(block.get("is_error", False)),
                    )
                    history.append(ToolResultMessage(result))
        elif role == "assistant":
            if isinstance(content, str):
                history.append(AssistantMessage(content))
                continue
            texts: list[str] = []
            calls: list[ToolCall] = []
            for block in content or ():
                kind = block.get("type")
                if kind == "text":
                    texts.append(block["text"])
                elif kind == "tool_use":
                    call = ToolCall(block["id"], block["name"], canonical_json(block["input"]))
                    names[call.id] = call.name
                    calls.append(call)
            history.append(AssistantMessage("".join(texts), tuple(calls)))
        else:
            raise ValueError(f"unsupported message role: {role!r}")
    return tuple(history)


# ------------------------------------------------------------------ replies


def _usage_of(usage: Mapping[str, Any]) -> Usage:
    """fanfold's usage from the API's: input counts cache reads and writes too (the
    API's ``input_tokens`` leaves both out); the reads are the cached input."""
    return Usage(
        _input_tokens(usage),
        as_int(usage.get("output_tokens")),
        as_int(usage.get("cache_read_input_tokens")),
    )


def _input_tokens(usage: Mapping[str, Any]) -> int:
    return (
        as_int(usage.get("input_tokens"))
        + as_int(usage.get("cache_creation_input_tokens"))
        + as_int(usage.get("cache_read_input_tokens"))
    )


def _tool_use(block: Mapping[str, Any], what: str) -> ToolCall:
    call_id, name, tool_input = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise malformed(f"{what}: tool_use block without id or name")
    if not isinstance(tool_input, dict):
        raise malformed(f"{what}: input of tool {name!r} is not a JSON object")
    return ToolCall.of(call_id, name, tool_input)


def parse_anthropic_response(data: Any) -> ModelReply:
    """A non-streaming Messages API response as a ModelReply (raises ProviderError).

    A reply that cannot be used (cut off inside a tool call, malformed) still says
    what it cost: the error carries the ``usage`` the server reported."""
    return parse_billed(data, f"{API} reply", _parse_anthropic_response, _usage_of)


def _parse_anthropic_response(data: dict[str, Any], what: str) -> ModelReply:
    if data.get("type") == "error":
        raise ProviderError(classify_stream_error(API, data))
    content = data.get("content")
    if data.get("type") != "message" or not isinstance(content, list):
        raise malformed(f"{what}: not a message: {snippet(json.dumps(data))}")
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in content:
        if not isinstance(block, dict):
            raise malformed(f"{what}: content block is not an object")
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            calls.append(_tool_use(block, what))
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    assert isinstance(usage, dict)
    stop = data.get("stop_reason")
    reply = ModelReply(
        text="".join(texts),
        tool_calls=tuple(calls),
        usage=_usage_of(usage),
        stop_reason=stop if isinstance(stop, str) else ("tool_use" if calls else "end_turn"),
        stop_details=_details(data.get("stop_details")),
    )
    return refuse_cut_tool_calls(reply, what)


def _details(raw: Any) -> str:
    """A ``stop_details`` value (the explanation of a refusal) as text: a string as it
    is, an object as canonical JSON, anything else nothing."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, dict) and raw:
        return canonical_json(raw)
    return ""


@attrs.define
class _Block:
    kind: str
    parts: list[str] = attrs.Factory(list)
    id: str = ""
    name: str = ""
    initial_input: Any = None
    closed: bool = False


class AnthropicStreamAssembler(AssemblerProgress):
    """Builds a reply from Messages API stream events (``StreamAssembler``).

    ``message_start`` carries input usage; ``content_block_start`` opens a text or
    ``tool_use`` block; ``content_block_delta`` appends ``text_delta`` text or
    ``input_json_delta`` JSON text; ``content_block_stop`` closes a block;
    ``message_delta`` carries ``stop_reason`` and cumulative usage; ``message_stop``
    ends the stream. ``ping`` and unknown events are ignored; ``error`` is classified.
    """

    def __init__(self) -> None:
        super().__init__()
        self._blocks: dict[int, _Block] = {}
        self._usage: dict[str, int] = {}
        self._stop: str | None = None
        self._details = ""
        self._started = False

    @property
    def usage(self) -> Usage:
        """The usage the server reported so far (``message_start``, ``message_delta``)."""
        return _usage_of(self._usage)

    def _update_usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            for key, value in usage.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    self._usage[key] = value
            if "output_tokens" in self._usage:
                self.output_tokens = self._usage["output_tokens"]

    def feed(self, event: SSEEvent) -> None:
        """Take one event (its type comes from the JSON ``type``, else ``event:``).

        An ``event: error`` is an error whatever its data's ``type`` says:
        llama-server sends its error object there (``{"code": 500, "message": ...,
        "type": "server_error"}``), which is classified as the same body would be on
        an HTTP error or in an OpenAI stream (issue 33, item 12)."""
        if self.done or not event.data.strip():
            return
        if event.event == "error":
            # Its data as it is: an object, or text that is the message.
            raise ProviderError(classify_stream_error(API, event.data))
        data = load_event_json(event, f"{API} stream")
        kind = data.get("type", event.event)
        what = f"{API} stream"
        if kind == "error":
            raise ProviderError(classify_stream_error(API, data))
        if kind == "message_start":
            self._started = True
            message = data.get("message")
            if isinstance(message, dict):
                self._update_usage(message.get("usage"))
        elif kind == "content_block_start":
            index, block = data.get("index"), data.get("content_block")
            if not isinstance(index, int) or not isinstance(block, dict):
                raise malformed(f"{what}: bad content_block_start")
            opened = _Block(str(block.get("type")))
            if opened.kind == "text" and isinstance(block.get("text"), str):
                opened.parts.append(block["text"])
                self.output_chars += len(block["text"])
            elif opened.kind == "tool_use":
                opened.id = str(block.get("id") or "")
                opened.name = str(block.get("name") or "")
                opened.initial_input = block.get("input")
            self._blocks[index] = opened
        elif kind == "content_block_delta":
            self._delta(data, what)
        elif kind == "content_block_stop":
            index = data.get("index")
            if isinstance(index, int) and index in self._blocks:
                self._blocks[index].closed = True
        elif kind == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                self._stop = delta["stop_reason"]
            if isinstance(delta, dict) and delta.get("stop_details") is not None:
                self._details = _details(delta["stop_details"])
            self._update_usage(data.get("usage"))
        elif kind == "message_stop":
            self.done = True

    def _delta(self, data: dict[str, Any], what: str) -> None:
        index, delta = data.get("index"), data.get("delta")
        if not isinstance(index, int) or not isinstance(delta, dict):
            raise malformed(f"{what}: bad content_block_delta")
        block = self._blocks.get(index)
        if block is None:
            raise malformed(f"{what}: delta for block {index}, which never started")
        if delta.get("type") == "text_delta" and block.kind == "text":
            text = delta.get("text")
            if isinstance(text, str):
                block.parts.append(text)
                self.output_chars += len(text)
        elif delta.get("type") == "input_json_delta" and block.kind == "tool_use":
            partial = delta.get("partial_json")
            if isinstance(partial, str):
                block.parts.append(partial)
                self.output_chars += len(partial)

    def finish(self) -> ModelReply:
        """The assembled reply; MALFORMED_RESPONSE if the stream or a tool block is cut."""
        what = f"{API} stream"
        if not self.done:
            raise malformed(f"{what} ended before message_stop")
        if not self._started:
            raise malformed(f"{what} had no message_start")
        texts: list[str] = []
        calls: list[ToolCall] = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if block.kind == "text":
                texts.append("".join(block.parts))
            elif block.kind == "tool_use":
                calls.append(self._call(index, block, what))
        reply = ModelReply(
            text="".join(texts),
            tool_calls=tuple(calls),
            usage=_usage_of(self._usage),
            stop_reason=self._stop or ("tool_use" if calls else "end_turn"),
            stop_details=self._details,
        )
        return refuse_cut_tool_calls(reply, what)

    def _call(self, index: int, block: _Block, what: str) -> ToolCall:
        if not block.id or not block.name:
            raise malformed(f"{what}: tool_use block {index} without id or name")
        label = f"{what}: tool {block.name!r}"
        raw = "".join(block.parts)
        cut_off = self._stop == STOP_MAX_TOKENS
        if not block.closed:
            if cut_off:
                raise cut_off_tool_call(label, block.name)
            raise malformed(f"{label} (block {index}) was cut off: {snippet(raw, 120)}")
        if not raw.strip() and isinstance(block.initial_input, dict):
            return ToolCall.of(block.id, block.name, block.initial_input)
        return tool_call(block.id, block.name, raw, label, cut_off=cut_off)


def parse_anthropic_stream(body: bytes | str) -> ModelReply:
    """A complete recorded Messages API stream as a ModelReply."""
    return assemble(AnthropicStreamAssembler(), body)


# ------------------------------------------------------------------ provider


class AnthropicProvider(HttpProvider):
    """Messages API over HTTP; see the module docstring for the wire format.

    ``base_url`` is the API root (``https://api.anthropic.com``); a trailing ``/v1``
    is accepted too. ``max_tokens`` defaults to 4096 (the API requires one).
    """

    api = API
    default_base_url = DEFAULT_BASE_URL

    @property
    def url(self) -> str:
        """``{base_url}/v1/messages``."""
        root = self.base_url.removesuffix("/v1")
        return f"{root}/v1/messages"

    def headers(self, api_key: str | None) -> dict[str, str]:
        """JSON headers, ``anthropic-version`` and, with a key, ``x-api-key``."""
        headers = {**JSON_HEADERS, "anthropic-version": ANTHROPIC_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    def body(self, request: ModelRequest, model: str, stream: bool) -> dict[str, Any]:
        """The request body (see ``anthropic_request_body``)."""
        return anthropic_request_body(
            request,
            model=model,
            stream=stream,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            settings=self.settings,
        )

    def parse_reply(self, data: Any) -> ModelReply:
        """See ``parse_anthropic_response``."""
        return parse_anthropic_response(data)

    def assembler(self) -> StreamAssembler:
        """A fresh ``AnthropicStreamAssembler``."""
        return AnthropicStreamAssembler()
