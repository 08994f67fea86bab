"""Agent definition files: Markdown with YAML front matter, read into AgentDefinition.

The format is Claude Code's (``.claude/agents/*.md``), so a user's existing files work
as they are::

    ---
    name: reviewer
    description: Reviews a change for bugs. Use after writing code.
    tools: Read, Bash(git diff*)        # or a YAML list; omitted: the parent's tools
    model: sonnet                       # a profile of fanfold.toml, a model, or inherit
    ---
    You are a careful code reviewer...  (the body: the agent's system prompt)

plus fanfold's own keys: ``disallowed_tools`` (deny rules), ``max_rounds``,
``max_tokens``, ``timeout`` (seconds), ``context`` (``task_only``, ``full`` or
``summary``), ``may_delegate`` (default true) and ``prompt_mode`` (``extend``, the
default: the sub-agent prompt then the body; ``replace``: the body alone). Claude Code's spellings
(``disallowedTools``, ``maxTurns``) are read too; other keys (``color``) are ignored
with a warning.

The front matter is parsed with PyYAML's ``safe_load`` (no tags, no code), the keys'
lines found with ``yaml.compose``; the values are structured by cattrs with strict
hooks (a string is never taken for a number). Every problem is an ``AgentProblem``
with the file's path and the line it is at; a file with one is left out, never fatal.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NewType

import attrs
import cattrs
import yaml
from cattrs.errors import ClassValidationError

from fanfold.statemachine.agent_defs import AgentDefinition, ContextMode, PromptMode
from fanfold.statemachine.control_tools import one_of
from fanfold.statemachine.limits import CONTEXT_MODES
from fanfold.statemachine.permissions import (
    MCP_PREFIX,
    PATH_TOOLS,
    READ_ONLY,
    Rule,
    parse_rule,
)

KNOWN_TOOLS = frozenset(
    {"bash", "read_file", "write_file", "edit_file", "think", "grep", "glob", "web_fetch"}
)
"""The ordinary tools fanfold has (a rule naming another tool matches nothing)."""

DELEGATION_TOOLS = frozenset({"Task", "Agent", "spawn_agents"})
"""Names of delegation in a ``tools`` list (Claude Code's ``Task``, later ``Agent``):
read as ``may_delegate`` (true in ``tools``, false in ``disallowed_tools``)."""

CLAUDE_MODEL_ALIASES = frozenset({"sonnet", "opus", "haiku"})
"""Claude Code's model aliases: an agent file naming one is refused unless the
configuration's ``[model_aliases]`` table maps it (no server knows them as they are)."""

MCP_SERVER_KEYS = frozenset({"mcpServers", "mcp_servers"})
"""Front-matter keys declaring MCP servers: not part of the definition (the runtime's
servers are ``fanfold.mcp.config``'s, which reads them from the same files)."""

MAX_FILE_BYTES = 256 * 1024
"""A definition file larger than this is refused unread (it is a prompt, not a book)."""

MAX_NAME_CHARS = 64
"""The longest agent name: ASCII letters, digits, '-', '_', '.', a letter or digit first."""

_ALIASES = {
    "disallowedTools": "disallowed_tools",
    "disallowed-tools": "disallowed_tools",
    "maxTurns": "max_rounds",
    "max_turns": "max_rounds",
    "maxRounds": "max_rounds",
    "maxTokens": "max_tokens",
    "mayDelegate": "may_delegate",
    "promptMode": "prompt_mode",
    "askTools": "ask",
    "ask_tools": "ask",
}

PositiveInt = NewType("PositiveInt", int)
Seconds = NewType("Seconds", float)
Names = NewType("Names", tuple[str, ...])


@attrs.frozen
class AgentProblem:
    """Something wrong (or, with ``warning``, doubtful) in a definition file."""

    path: str
    line: int  # 0: the whole file (it cannot be read, it is too large...)
    message: str
    warning: bool = False

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line > 0 else self.path
        return f"{where}: {self.message}"


@attrs.frozen
class FrontMatter:
    """The front matter's keys, typed (tools already split into lists)."""

    name: str
    description: str
    tools: Names | None = None
    disallowed_tools: Names = Names(())
    model: str | None = None
    max_rounds: PositiveInt | None = None
    max_tokens: PositiveInt | None = None
    timeout: Seconds | None = None
    context: str = "task_only"
    may_delegate: bool = True
    prompt_mode: PromptMode = PromptMode.EXTEND
    ask: Names = Names(())


_KEYS = frozenset(f.name for f in attrs.fields(FrontMatter))


class _Invalid(ValueError):
    pass


_REPR = reprlib.Repr()
_REPR.maxstring = 100
_REPR.maxother = 100


def _shown(value: Any) -> str:
    """``value``'s repr, bounded however large or deep it is."""
    return _REPR.repr(value)


def _strict(expected: str, accepts: Callable[[Any], bool]) -> Callable[[Any, Any], Any]:
    def hook(value: Any, _: Any) -> Any:
        if not accepts(value):
            raise _Invalid(f"expected {expected}, got {_shown(value)}"[:200])
        return value

    return hook


def _converter() -> cattrs.Converter:
    converter = cattrs.Converter(detailed_validation=True)
    hook = converter.register_structure_hook
    hook(str, _strict("a string", lambda v: isinstance(v, str)))
    hook(bool, _strict("true or false", lambda v: isinstance(v, bool)))
    hook(
        PositiveInt,
        _strict(
            "a whole number >= 1",
            lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v < 2**63,
        ),
    )

    def seconds(value: Any, _: Any) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not (0 < value < math.inf)
        ):
            raise _Invalid(f"expected a number of seconds > 0, got {_shown(value)}"[:200])
        return float(value)

    hook(Seconds, seconds)

    def names(value: Any, _: Any) -> Names:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _Invalid("expected a comma-separated string or a list of strings")
        return Names(tuple(v for v in value if v.strip()))

    hook(Names, names)

    def prompt_mode(value: Any, _: Any) -> PromptMode:
        if not isinstance(value, str) or value not in {m.value for m in PromptMode}:
            raise _Invalid(f"expected 'extend' or 'replace', got {_shown(value)}"[:200])
        return PromptMode(value)

    hook(PromptMode, prompt_mode)
    return converter


_CONVERTER = _converter()


def _split_front_matter(text: str) -> tuple[str, str, int] | str:
    """(front matter, body, line of the front matter's first line) or a problem."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        return "no front matter: the file must start with a line '---'"
    for index in range(1, len(lines)):
        if lines[index].strip() == "---":
            return "".join(lines[1:index]), "".join(lines[index + 1 :]), 2
    return "the front matter is not closed by a line '---'"


MAX_DEPTH = 16
"""Collections nested deeper than this in a front matter refuse the file."""


def _event_problem(front: str, first_line: int) -> tuple[int, str] | None:
    """The line and problem of the front matter's first YAML alias (``*name``), or of
    its first collection nested deeper than ``MAX_DEPTH``; None if there is neither.

    Read from YAML's events, which its parser makes without recursion, before
    anything is composed: composing and constructing recurse, and a front matter of
    2,000 nested ``[`` ended in a RecursionError traceback (20,000: after 44 s of
    CPU), issue 22.5. The scan stops at the first problem, so its cost is bounded
    by the depth allowed, whatever the file holds after it."""
    depth = 0
    for event in yaml.parse(front, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth <= MAX_DEPTH:
                continue
            problem = f"nested more than {MAX_DEPTH} levels deep"
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
            continue
        elif isinstance(event, yaml.AliasEvent):
            problem = "YAML aliases (*name) are not allowed"
        else:
            continue
        mark = event.start_mark
        line: int = first_line + (mark.line if mark is not None else 0)
        return line, problem
    return None


def _key_lines(front: str, first_line: int) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """The line of each top-level key (composed, nothing constructed), and each key
    given again with the line where it is (YAML would keep the last silently)."""
    node = yaml.compose(front, Loader=yaml.SafeLoader)
    lines: dict[str, int] = {}
    again: list[tuple[str, int]] = []
    if isinstance(node, yaml.MappingNode):
        for key, _value in node.value:
            if isinstance(key, yaml.ScalarNode):
                line = key.start_mark.line + first_line
                if str(key.value) in lines:
                    again.append((str(key.value), line))
                lines.setdefault(str(key.value), line)
    return lines, again


def front_matter(text: str) -> dict[str, Any] | None:
    """The mapping of an agent file's front matter, read with ``parse_definition``'s
    guards (no YAML aliases, no collection nested deeper than ``MAX_DEPTH``); None if
    the file has no front matter or a bad one (``parse_definition`` says why). For
    readers of one key (``mcpServers``) that must not crash on a file it refuses."""
    split = _split_front_matter(text)
    if isinstance(split, str):
        return None
    front, _, first = split
    try:
        if _event_problem(front, first) is not None:
            return None
        data = yaml.safe_load(front)
    except (RecursionError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def parse_definition(
    text: str,
    path: str,
    *,
    model_aliases: Mapping[str, str] | None = None,
    tools: Iterable[str] = (),
) -> tuple[AgentDefinition | None, tuple[AgentProblem, ...]]:
    """Read one definition file's ``text``: the definition (None if it is invalid)
    and its problems and warnings. ``model_aliases`` (the configuration's
    ``[model_aliases]``, keys in lower case) says what a ``model`` name stands for;
    ``tools`` names the tools the runtime has beside fanfold's (Python function
    tools), which rules may name too."""
    split = _split_front_matter(text)
    if isinstance(split, str):
        return None, (AgentProblem(path, 1, split),)
    front, body, first = split
    try:
        found = _event_problem(front, first)
        if found is not None:
            # An alias is a reference: nine of nine of nine... make gigabytes (the
            # "billion laughs"). An agent file has no use for them, nor for depth.
            return None, (AgentProblem(path, *found),)
        data = yaml.safe_load(front)
        lines, again = _key_lines(front, first)
    except RecursionError:  # a backstop: _event_problem refuses deep nesting first
        return None, (AgentProblem(path, first, "nested too deeply"),)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = first + mark.line if mark is not None else first
        message = f"YAML: {exc.problem or exc.context}"
        if (
            exc.context
            and exc.problem
            and exc.context_mark is not None
            and first + exc.context_mark.line != line
        ):
            # Where the construct that is not closed began ("while parsing a flow
            # sequence" on line 3, found the end of the front matter on line 4).
            message += f" ({exc.context}, from line {first + exc.context_mark.line})"
        return None, (AgentProblem(path, line, message),)
    except yaml.YAMLError as exc:
        return None, (AgentProblem(path, first, f"YAML: {exc}"),)
    if not isinstance(data, dict):
        return None, (AgentProblem(path, first, "the front matter must be a mapping of keys"),)
    if again:
        # `tools: read-only` then `tools: bash` would give the agent bash: refused.
        return None, tuple(
            AgentProblem(path, line, f"{key!r} is given twice (first on line {lines[key]})")
            for key, line in again
        )
    problems: list[AgentProblem] = []
    values: dict[str, Any] = {}
    servers: tuple[str, ...] = ()
    for raw_key, value in data.items():
        key = _ALIASES.get(str(raw_key), str(raw_key))
        line = lines.get(str(raw_key), first)
        if raw_key in MCP_SERVER_KEYS:
            # The servers the file declares (read by fanfold.mcp.config) or names: the
            # definition records their names, so its agents get those servers' tools.
            servers = _server_names(value)
            continue
        if key not in _KEYS:
            problems.append(
                AgentProblem(path, line, f"unknown key {raw_key!r} ignored", warning=True)
            )
            continue
        if key in ("tools", "disallowed_tools", "ask") and isinstance(value, str):
            value = _split_tools(value)
        if key == "model" and isinstance(value, str) and value.strip().lower() == "inherit":
            value = None
        if key in values:  # both spellings: disallowed_tools and disallowedTools
            problems.append(AgentProblem(path, line, f"{raw_key!r} gives {key!r} again"))
        values[key] = value
    for required in ("name", "description"):
        if required not in values:
            problems.append(AgentProblem(path, first, f"required key {required!r} is missing"))
    if any(not p.warning for p in problems):
        return None, tuple(problems)
    try:
        matter = _CONVERTER.structure(values, FrontMatter)
    except ClassValidationError as exc:
        for name, message in _leaves(exc):
            raw = next((k for k in data if _ALIASES.get(str(k), str(k)) == name), name)
            problems.append(AgentProblem(path, lines.get(str(raw), first), f"{raw}: {message}"))
        return None, tuple(sorted(problems, key=lambda p: p.line))
    known = KNOWN_TOOLS | frozenset(tools)
    definition, more = _definition(matter, body, path, lines, first, model_aliases or {}, known)
    problems += more
    if definition is not None and servers:
        definition = attrs.evolve(definition, mcp_servers=servers)
    return definition, tuple(problems)


def _server_names(value: Any) -> tuple[str, ...]:
    """The server names of ``mcpServers``: a table's keys, or a list's strings (names of
    servers declared elsewhere). Anything else names none (``fanfold.mcp.config``
    reports a malformed table)."""
    if isinstance(value, dict):
        names = [k for k in value if isinstance(k, str)]
    elif isinstance(value, list):
        names = [v for v in value if isinstance(v, str)]
    else:
        names = []
    return tuple(dict.fromkeys(n for n in names if n and len(n) <= 64))


def _split_tools(value: str) -> list[str]:
    """``Read, Bash(git diff, log*)``: split on commas outside parentheses."""
    parts: list[str] = []
    depth = 0
    current = ""
    for char in value:
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(0, depth - 1)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _leaves(exc: BaseException) -> list[tuple[str, str]]:
    if isinstance(exc, ClassValidationError):
        found: list[tuple[str, str]] = []
        with_notes, without = exc.group_exceptions()
        for inner, note in with_notes:
            found += [(note.name, message) for _, message in _leaves(inner)]
        for inner in without:
            found += _leaves(inner)
        return found
    if isinstance(exc, KeyError):
        return [("", "required, missing")]
    return [("", str(exc))]


def _definition(
    matter: FrontMatter,
    body: str,
    path: str,
    lines: dict[str, int],
    first: int,
    model_aliases: Mapping[str, str],
    known: frozenset[str] = KNOWN_TOOLS,
) -> tuple[AgentDefinition | None, list[AgentProblem]]:
    problems: list[AgentProblem] = []

    def at(key: str) -> int:
        for raw, line in lines.items():
            if _ALIASES.get(raw, raw) == key:
                return line
        return first

    matter = _delegation(matter, path, at, {_ALIASES.get(k, k) for k in lines}, problems)
    model = matter.model.strip() if matter.model else None
    if model is not None and model.lower() in model_aliases:
        model = model_aliases[model.lower()]
    elif model is not None and model.lower() in CLAUDE_MODEL_ALIASES:
        problems.append(
            AgentProblem(
                path,
                at("model"),
                f"model {model!r} is a Claude Code alias: map it to a profile or model in "
                f'the configuration\'s [model_aliases] table ({model.lower()} = "...")',
            )
        )

    name = matter.name.strip()
    if not name or not all(c.isalnum() or c in "-_." for c in name) or not name.isascii():
        problems.append(
            AgentProblem(path, at("name"), f"name {name!r}: use letters, digits, '-', '_', '.'")
        )
    elif not name[0].isalnum() or len(name) > MAX_NAME_CHARS:
        # `..`, `.x`, `-rf`: a name is shown, logged and offered in a schema like an
        # identifier, and must never read as a path or an option.
        problems.append(
            AgentProblem(
                path,
                at("name"),
                f"name {name!r}: start with a letter or digit; at most {MAX_NAME_CHARS} characters",
            )
        )
    if not matter.description.strip():
        problems.append(AgentProblem(path, at("description"), "description is empty"))
    if matter.context not in CONTEXT_MODES:
        problems.append(
            AgentProblem(
                path,
                at("context"),
                f"context {matter.context!r}: use {one_of(CONTEXT_MODES)}",
            )
        )
    allow = None
    if matter.tools is not None:
        allow = _rules(matter.tools, "tools", at("tools"), path, problems, known)
    deny = _rules(
        matter.disallowed_tools, "disallowed_tools", at("disallowed_tools"), path, problems, known
    )
    if any(rule.tool == READ_ONLY for rule in deny):
        problems.append(
            AgentProblem(path, at("disallowed_tools"), "read-only is an allow rule (in tools)")
        )
    ask = _rules(matter.ask, "ask", at("ask"), path, problems, known)
    if any(rule.tool == READ_ONLY for rule in ask):
        problems.append(AgentProblem(path, at("ask"), "read-only is an allow rule (in tools)"))
    if any(not p.warning for p in problems):
        return None, problems
    if matter.prompt_mode is PromptMode.REPLACE and not body.strip():
        problems.append(
            AgentProblem(
                path,
                at("prompt_mode"),
                "prompt_mode replace with no body below the front matter: the agent gets "
                "no system prompt (not even the role that tells it to call submit_result)",
                warning=True,
            )
        )
    prompt = body.strip("\n")
    return (
        AgentDefinition(
            name=name,
            description=" ".join(matter.description.split()),
            prompt=prompt,
            prompt_mode=matter.prompt_mode,
            allow=allow,
            deny=deny,
            model=model,
            max_rounds=matter.max_rounds,
            max_tokens=matter.max_tokens,
            timeout=matter.timeout,
            may_delegate=matter.may_delegate,
            source=path,
            context=ContextMode(matter.context),
            ask=ask,
        ),
        problems,
    )


def _delegation(
    matter: FrontMatter,
    path: str,
    at: Callable[[str], int],
    given: set[str],
    problems: list[AgentProblem],
) -> FrontMatter:
    """``Task`` (``Agent``, ``spawn_agents``) taken out of the tool lists and read as
    ``may_delegate``: true in ``tools``, false in ``disallowed_tools``."""
    allowed = matter.tools is not None and any(t.strip() in DELEGATION_TOOLS for t in matter.tools)
    denied = any(t.strip() in DELEGATION_TOOLS for t in matter.disallowed_tools)
    if not allowed and not denied:
        return matter
    tools = (
        None
        if matter.tools is None
        else Names(tuple(t for t in matter.tools if t.strip() not in DELEGATION_TOOLS))
    )
    disallowed = Names(
        tuple(t for t in matter.disallowed_tools if t.strip() not in DELEGATION_TOOLS)
    )
    may_delegate = matter.may_delegate
    if allowed and denied:
        problems.append(
            AgentProblem(path, at("disallowed_tools"), "Task is in both tools and disallowed_tools")
        )
    elif "may_delegate" in given and matter.may_delegate != allowed:
        where = "tools" if allowed else "disallowed_tools"
        problems.append(
            AgentProblem(
                path,
                at("may_delegate"),
                f"may_delegate: {str(matter.may_delegate).lower()} contradicts Task in {where}",
            )
        )
    else:
        may_delegate = allowed
    return attrs.evolve(matter, tools=tools, disallowed_tools=disallowed, may_delegate=may_delegate)


def _rules(
    texts: tuple[str, ...],
    key: str,
    line: int,
    path: str,
    problems: list[AgentProblem],
    known: frozenset[str] = KNOWN_TOOLS,
) -> tuple[Rule, ...]:
    rules: list[Rule] = []
    for text in texts:
        rule = parse_rule(text)
        if isinstance(rule, str):
            problems.append(AgentProblem(path, line, f"{key}: {rule}"))
            continue
        # MCP tools are known only once their servers run: a rule naming one (or a
        # whole server) is kept. Dropping it would narrow an allow list, but widen
        # a deny list: a disallowed MCP tool would become callable.
        if (
            rule.tool != READ_ONLY
            and not rule.tool.startswith(MCP_PREFIX)
            and rule.tool not in known
        ):
            problems.append(
                AgentProblem(
                    path,
                    line,
                    f"{key}: fanfold has no tool {text!r}; it is ignored "
                    f"(tools: {', '.join(sorted(known))}, read-only, Task)",
                    warning=True,
                )
            )
            continue
        if rule.pattern is not None and rule.tool in PATH_TOOLS and ".." in rule.pattern.split("/"):
            problems.append(
                AgentProblem(path, line, f"{key}: {text!r}: a path pattern has no '..'")
            )
            continue
        rules.append(rule)
    return tuple(rules)
