"""The tools the reducer handles itself, and which tools a conversation is offered.

``spawn_agents``, ``submit_result`` and ``submit_error`` never reach the runtime's tool
runner: what they do (create children with deterministic ids, end a sub-agent) is a
decision, so it belongs to the reducer.
"""

from __future__ import annotations

import attrs

from fanfold.statemachine.agent_defs import AgentDefinition
from fanfold.statemachine.limits import CONTEXT_MODES, Limits
from fanfold.statemachine.messages import ToolSpec

SPAWN_AGENTS = "spawn_agents"
SUBMIT_RESULT = "submit_result"
SUBMIT_ERROR = "submit_error"
CONTROL_TOOLS = frozenset({SPAWN_AGENTS, SUBMIT_RESULT, SUBMIT_ERROR})

SPAWN_AGENTS_SPEC = ToolSpec.from_schema(
    SPAWN_AGENTS,
    "Spawn sub-agents to execute tasks in parallel. Each sub-agent runs independently "
    "with its own fresh context and returns a result; you receive all results together "
    "when every sub-agent has finished. Use for: multiple perspectives on code review, "
    "exploring unfamiliar parts of a codebase, parallel research or analysis tasks, or "
    "divide-and-conquer problem solving.",
    {
        "type": "object",
        "required": ["tasks"],
        "properties": {
            "tasks": {
                "type": "array",
                "minItems": 1,
                "description": "List of tasks to execute in parallel",
                "items": {
                    "type": "object",
                    "required": ["task"],
                    "properties": {
                        "task": {
                            "type": "string",
                            "description": "Task description for the sub-agent",
                        },
                        "cwd": {
                            "type": "string",
                            "description": "Working directory, relative to yours and "
                            "inside it (defaults to yours)",
                        },
                        "timeout": {
                            "type": "number",
                            "description": "Time limit in seconds",
                        },
                        "max_iterations": {
                            "type": "integer",
                            "minimum": 1,
                            "description": "Maximum model rounds for this sub-agent",
                        },
                        "model": {
                            "type": "string",
                            "description": "Model profile for this sub-agent",
                        },
                    },
                },
            }
        },
    },
)

SUBMIT_RESULT_SPEC = ToolSpec.from_schema(
    SUBMIT_RESULT,
    "Submit your final result to the parent conversation. Call this when you have "
    "completed your assigned task. After calling this, your conversation ends.",
    {
        "type": "object",
        "required": ["result"],
        "properties": {
            "result": {
                "type": "string",
                "description": "Your final result, summary, or output",
            }
        },
    },
)

SUBMIT_ERROR_SPEC = ToolSpec.from_schema(
    SUBMIT_ERROR,
    "Report that you cannot complete the assigned task. Call this if you encounter an "
    "unrecoverable error or determine the task is impossible. After calling this, your "
    "conversation ends.",
    {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "string",
                "description": "Description of why the task could not be completed",
            }
        },
    },
)

SUB_AGENT_PROMPT = (
    "You are a sub-agent: another agent delegated one task to you, the first user "
    "message. Work on it on your own with the tools you have; nobody answers your "
    "questions. When you are done, call submit_result with your complete result (the "
    "delegating agent sees nothing else of your work); if you cannot do the task, call "
    "submit_error saying why."
)
"""The default system prompt of sub-agents (``Runtime.open(sub_agent_prompt=...)``)."""

GRACE_PROMPT = (
    "You have used all your model rounds. Do not call any more tools except "
    "submit_result or submit_error: call submit_result now with your best result."
)
ROOT_GRACE_PROMPT = (
    "You have used all your model rounds for this turn. Tools are no longer available: "
    "answer now with your best final answer."
)


def can_spawn(depth: int, limits: Limits) -> bool:
    """Whether a conversation at ``depth`` may spawn children (they live at depth+1)."""
    return depth + 1 <= limits.max_depth


MODE_PROPERTIES = {
    "mode": {
        "type": "string",
        "enum": ["parallel", "sequential", "race"],
        "description": "parallel (default): all at once; sequential: one at a time in "
        "order, each later task given the earlier outcomes, a failure stops the rest; "
        "race: stop waiting once 'quorum' tasks have succeeded, cancelling the others",
    },
    "quorum": {
        "type": "integer",
        "minimum": 1,
        "description": "With race: how many successes to wait for (default 1)",
    },
    "keep_going": {
        "type": "boolean",
        "description": "With sequential: run the later tasks even after one failed",
    },
}
"""The per-call execution mode, in the schema of trees with an agent catalogue."""


_CONTEXT_WORDS = {
    "task_only": "task_only (default): the sub-agent sees just its task",
    "full": "full: also this conversation so far",
    "summary": "summary: a summary of this conversation so far",
}


def spawn_agents_spec(
    agents: tuple[AgentDefinition, ...], context_modes: tuple[str, ...] = CONTEXT_MODES
) -> ToolSpec:
    """``spawn_agents``, and, when there are agent definitions, the ``agent`` a task
    may name: the description lists each with its description, so the model can
    choose; the ``context`` a task may ask for lists ``context_modes`` (the limits').
    Without definitions it is ``SPAWN_AGENTS_SPEC`` itself (older logs)."""
    if not agents:
        return SPAWN_AGENTS_SPEC
    last = _last_spawn_spec[0]
    if last is not None and last[0] is agents and last[1] == context_modes:
        return last[2]
    schema = SPAWN_AGENTS_SPEC.input_schema()
    schema["properties"].update(MODE_PROPERTIES)
    # Written from the modes, so that a log of schema 6 (task_only and full) gets
    # exactly the text it was recorded with.
    schema["properties"]["tasks"]["items"]["properties"]["context"] = {
        "type": "string",
        "enum": list(context_modes),
        "description": "; ".join(_CONTEXT_WORDS[mode] for mode in context_modes),
    }
    # The first definition of a name counts (as find_agent reads them); descriptions
    # are cut so that one long file cannot swell every request's tool list.
    listed = {a.name: a for a in reversed(agents)}
    names = [a.name for a in agents if listed.get(a.name) is a]
    schema["properties"]["tasks"]["items"]["properties"]["agent"] = {
        "type": "string",
        "enum": names,
        "description": "The kind of agent to delegate to (default: a general sub-agent "
        "with your tools); see the list in this tool's description",
    }
    listing = "\n".join(f"- {name}: {_cut(listed[name].description)}" for name in names)
    description = (
        SPAWN_AGENTS_SPEC.description
        + ' By default the tasks run in parallel; "mode": "sequential" runs them one '
        + 'after another, each given the outcomes of the earlier ones, and "race" (with '
        + '"quorum": k, default 1) stops the others once k have succeeded.'
        + ' A task may name an agent ("agent"), which sets its instructions, tools and '
        + "limits. Available agents:\n"
        + listing
    )
    spec = ToolSpec.from_schema(SPAWN_AGENTS, description, schema)
    _last_spawn_spec[0] = (agents, context_modes, spec)
    return spec


MAX_DESCRIPTION_CHARS = 500
"""An agent's description in the spawn_agents tool is cut to this many characters."""


def _cut(text: str) -> str:
    if len(text) <= MAX_DESCRIPTION_CHARS:
        return text
    return text[: MAX_DESCRIPTION_CHARS - 3] + "..."


_last_spawn_spec: list[tuple[tuple[AgentDefinition, ...], tuple[str, ...], ToolSpec] | None] = [
    None
]


def offered_tools(
    ordinary: tuple[ToolSpec, ...],
    *,
    depth: int,
    is_sub_agent: bool,
    limits: Limits,
    agents: tuple[AgentDefinition, ...] = (),
) -> tuple[ToolSpec, ...]:
    """The full tool set of a conversation: ordinary tools plus allowed control tools.

    Control-tool names among ``ordinary`` are dropped, so a runtime cannot smuggle in
    its own ``spawn_agents`` past the depth rule. Called twice in a row with the same
    ``ordinary`` tuple (the siblings of one spawn), it returns the same tuple: their
    states share it, and so does its encoding in the log.
    """
    spawn = can_spawn(depth, limits)
    modes = limits.context_modes
    last = _last_offered[0]
    if (
        last is not None
        and last[0] is ordinary
        and last[1] == spawn
        and last[2] == is_sub_agent
        and last[3] is agents
        and last[5] == modes
    ):
        return last[4]
    tools = [t for t in ordinary if t.name not in CONTROL_TOOLS]
    if spawn:
        tools.append(spawn_agents_spec(agents, modes))
    if is_sub_agent:
        tools += [SUBMIT_RESULT_SPEC, SUBMIT_ERROR_SPEC]
    offered = tuple(tools)
    _last_offered[0] = (ordinary, spawn, is_sub_agent, agents, offered, modes)
    return offered


def ordinary_tools(tools: tuple[ToolSpec, ...]) -> tuple[ToolSpec, ...]:
    """``tools`` without the control tools; the same tuple for the same ``tools`` twice
    in a row (every child of one parent gets the same)."""
    last = _last_ordinary[0]
    if last is not None and last[0] is tools:
        return last[1]
    ordinary = tuple(t for t in tools if t.name not in CONTROL_TOOLS)
    _last_ordinary[0] = (tools, ordinary)
    return ordinary


# One-entry caches of the two functions above (results are immutable, so sharing them
# is invisible but for memory and the codec's memo, which is keyed by identity).
# A speed (memory) trick kept because a benchmark shows it pays: with them a waiting
# sub-agent holds 7.7-8.0 KB of Python heap at N = 1000, without them 12.8-14.5 KB
# (bench/sections.py memory(), 2026-11-24, two runs each): every child's state would
# hold its own tool tuples, and the codec's memo their encodings.
_last_offered: list[
    tuple[
        tuple[ToolSpec, ...],
        bool,
        bool,
        tuple[AgentDefinition, ...],
        tuple[ToolSpec, ...],
        tuple[str, ...],
    ]
    | None
] = [None]
_last_ordinary: list[tuple[tuple[ToolSpec, ...], tuple[ToolSpec, ...]] | None] = [None]


@attrs.frozen
class TaskRequest:
    """One validated entry of a ``spawn_agents`` call."""

    task: str
    cwd: str | None
    timeout: float | None
    max_iterations: int | None
    model: str | None
    agent: str | None = None
    context: str | None = None


def parse_task(entry: object, context_modes: tuple[str, ...] = CONTEXT_MODES) -> TaskRequest | str:
    """Validate one task entry; returns the request or a human error message.
    ``context_modes``: the modes its ``context`` may name (the limits')."""
    if not isinstance(entry, dict):
        return 'each task must be an object like {"task": "..."}'
    task = entry.get("task")
    if not isinstance(task, str) or not task.strip():
        return "'task' must be a non-empty string"
    if len(task) > MAX_TASK_CHARS:
        return f"'task' is too long ({len(task)} characters, at most {MAX_TASK_CHARS})"
    unknown = set(entry) - {
        "task",
        "cwd",
        "timeout",
        "max_iterations",
        "model",
        "agent",
        "context",
    }
    if unknown:
        return f"unknown field(s): {', '.join(sorted(unknown))}"
    cwd = entry.get("cwd")
    if cwd is not None:
        cwd = relative_cwd(cwd)
        if isinstance(cwd, CwdRefused):
            return cwd.reason
    timeout = entry.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        return "'timeout' must be a positive number of seconds"
    max_iterations = entry.get("max_iterations")
    if max_iterations is not None and (
        isinstance(max_iterations, bool)
        or not isinstance(max_iterations, int)
        or max_iterations < 1
    ):
        return "'max_iterations' must be an integer >= 1"
    model = entry.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        return "'model' must be a non-empty string"
    agent = entry.get("agent")
    if agent is not None and (not isinstance(agent, str) or not agent):
        return "'agent' must be a non-empty string (an agent's name)"
    context = entry.get("context")
    if context is not None and context not in context_modes:
        return f"'context' must be {one_of(context_modes)}"
    return TaskRequest(
        task=task,
        cwd=cwd,
        timeout=float(timeout) if timeout is not None else None,
        max_iterations=max_iterations,
        model=model,
        agent=agent,
        context=context,
    )


def one_of(modes: tuple[str, ...]) -> str:
    """``task_only, full or summary``."""
    return modes[0] if len(modes) == 1 else ", ".join(modes[:-1]) + " or " + modes[-1]


MAX_TASK_CHARS = 1_000_000
"""The longest task a sub-agent may be given (``spawn_agents``' ``task``, ``fanfold
mcp``'s ``delegate_task`` with its ``context``): about 250,000 tokens, more than most
models' whole context. A task is stored with its conversation and sent with each of
its model calls (a 50 MB ``delegate_task`` grew the database by 420 MB); a longer one
is an error result naming this limit."""

MAX_CWD_CHARS = 1024
"""The longest ``cwd`` a task may give (Linux allows 4096 bytes for a whole path)."""


@attrs.frozen
class CwdRefused:
    """Why a task's ``cwd`` was refused."""

    reason: str


def relative_cwd(cwd: object) -> str | CwdRefused:
    """A task's ``cwd`` checked and normalised: a relative path below the parent's
    working directory, like ``a/b`` (``./a//b/`` becomes ``a/b``, ``.`` stays ``.``).

    Pure string work, no filesystem: the path may not leave the parent's directory by
    its spelling (absolute, ``~``, a drive, ``..``, backslashes, control characters).
    Symbolic links cannot be judged here; the runtime reports where the directory
    really is when it creates the child (``ConversationCreated.workdir``).
    """
    if not isinstance(cwd, str) or not cwd:
        return CwdRefused("'cwd' must be a non-empty string")
    if len(cwd) > MAX_CWD_CHARS:
        return CwdRefused(f"'cwd' is too long ({len(cwd)} characters, at most {MAX_CWD_CHARS})")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in cwd):
        return CwdRefused("'cwd' must not contain control characters (NUL, newline...)")
    if "\\" in cwd:
        return CwdRefused("'cwd' must separate directories with '/', not backslashes")
    if cwd.startswith("/"):
        return CwdRefused(
            "'cwd' must be relative to your working directory (a sub-agent works inside "
            "it), not absolute"
        )
    if cwd.startswith("~"):
        return CwdRefused("'cwd' must not start with '~': give a path relative to yours")
    if len(cwd) >= 2 and cwd[1] == ":" and cwd[0].isascii() and cwd[0].isalpha():
        return CwdRefused("'cwd' must not start with a drive letter")
    parts = [part for part in cwd.split("/") if part not in ("", ".")]
    if ".." in parts:
        return CwdRefused(
            "'cwd' must not contain '..': a sub-agent works inside your working directory"
        )
    return "/".join(parts) or "."


def join_cwd(parent_cwd: str, cwd: str | None) -> str:
    """A child's working directory: the parent's, or ``cwd`` (from ``relative_cwd``)
    below it; lexically, without touching the filesystem."""
    if cwd is None or cwd == ".":
        return parent_cwd
    if parent_cwd == ".":
        return cwd
    return parent_cwd.rstrip("/") + "/" + cwd
