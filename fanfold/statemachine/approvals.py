"""A human in the loop (issue 35): which tool calls wait for a person, and the
``ask_user`` tool. Pure: the reducer (``transition.py``) asks these functions.

A tool call waits for a person's decision when (checked after the deny and allow
rules, which refuse first: deny beats ask beats allow):

- it is an ``ask_user`` call (a question; the answer is its result);
- its tool's recorded spec says ``needs_approval`` (a function tool's
  ``needs_approval=True``, an MCP server or tool marked ``ask`` in fanfold.toml);
- one of the conversation's ask rules matches it (``permissions.asking_rule``; every
  layer counts, so a child asks for whatever its parent must ask for).
"""

from __future__ import annotations

import json
from typing import Any

from fanfold.statemachine.messages import ToolCall, ToolSpec
from fanfold.statemachine.permissions import Permissions, asking_rule, reading_tools
from fanfold.statemachine.phases import Asking

ASK_USER = "ask_user"
"""The built-in tool an agent asks a person a question with."""

ASK_USER_SPEC = ToolSpec.from_schema(
    ASK_USER,
    "Ask the user a question and wait for the answer, which is this tool's result. Use "
    "it when you cannot go on without a decision or a fact only the user has. Give "
    "'choices' when the answer is one of a few options.",
    {
        "type": "object",
        "properties": {
            "question": {"type": "string", "description": "The question, in full."},
            "choices": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Answers to offer (optional; the user may answer otherwise).",
            },
        },
        "required": ["question"],
        "additionalProperties": False,
    },
)

DENIED_PREFIX = "denied by the user: "
"""The start of a denied call's error result; the person's reason follows."""

MAX_REASON_CHARS = 4000
"""The longest reason or answer text kept (a decision is shown to the model)."""


def denied_result_text(reason: str) -> str:
    """The result a denied call gets, so the model can adapt."""
    reason = reason.strip()[:MAX_REASON_CHARS] or "no reason given"
    return DENIED_PREFIX + reason


def question_of(call: ToolCall) -> tuple[str, tuple[str, ...]] | str:
    """An ``ask_user`` call's question and choices, or why its arguments are wrong."""
    try:
        arguments = call.arguments()
    except ValueError:
        return "ask_user: its arguments are not JSON"
    if not isinstance(arguments, dict):
        return "ask_user: its arguments must be a JSON object"
    question = arguments.get("question")
    if not isinstance(question, str) or not question.strip():
        return "ask_user needs a non-empty string argument 'question'"
    choices = arguments.get("choices", [])
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        return "ask_user: 'choices' must be a list of strings"
    return question, tuple(choices)


def needs_decision(
    permissions: Permissions | None,
    tools: tuple[ToolSpec, ...],
    call: ToolCall,
    cwd: str,
) -> Asking | None:
    """Whether ``call`` (one the rules permit, of an offered ordinary tool) must wait
    for a person, and why; None: it runs."""
    if call.name == ASK_USER:
        return Asking(ASK_USER, question=True)
    for spec in tools:
        if spec.name == call.name:
            if spec.needs_approval:
                return Asking(f"needs_approval of tool '{call.name}'")
            break
    if permissions is None:
        return None
    rule = asking_rule(permissions, call, cwd, reading_tools(tools))
    return None if rule is None else Asking(f"the ask rule {rule}")


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def edited_arguments_problem(spec: ToolSpec | None, arguments_json: str) -> str | None:
    """Why edited arguments cannot replace a call's (None: they can): they must be a
    JSON object holding the schema's required keys, each declared property of its
    declared type (a plain check the reducer can make; the runtime and the CLI check
    the whole schema before a decision is written, and the tool checks it again)."""
    try:
        value = json.loads(arguments_json)
    except ValueError as exc:
        return f"the edited arguments are not JSON ({exc})"
    if not isinstance(value, dict):
        return "the edited arguments must be a JSON object"
    if spec is None:
        return None
    try:
        schema: Any = json.loads(spec.input_schema_json)
    except ValueError:
        return None
    if not isinstance(schema, dict):
        return None
    required = schema.get("required", [])
    if isinstance(required, list):
        missing = [k for k in required if isinstance(k, str) and k not in value]
        if missing:
            return f"the edited arguments lack {', '.join(repr(k) for k in missing)}"
    properties = schema.get("properties", {})
    if isinstance(properties, dict):
        for key in sorted(value):
            declared = properties.get(key)
            if isinstance(declared, dict) and isinstance(declared.get("type"), str):
                kinds = _JSON_TYPES.get(declared["type"])
                item = value[key]
                wrong_bool = isinstance(item, bool) and declared["type"] in ("integer", "number")
                if kinds is not None and (not isinstance(item, kinds) or wrong_bool):
                    return f"the edited argument {key!r} must be of type {declared['type']}"
            elif declared is None and schema.get("additionalProperties") is False:
                return f"the edited arguments hold {key!r}, which the tool does not take"
    return None
