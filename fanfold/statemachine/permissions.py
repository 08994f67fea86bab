"""Permission rules: which tool calls a conversation may make. Pure matching, no I/O.

A rule names a tool, optionally with a pattern on its arguments, as users know them
from coding agents:

- ``bash``, ``write_file``: every call of that tool;
- ``bash(git diff*)``: a ``bash`` call whose command matches the pattern (``*``
  matches any text, but in an allow rule a ``*`` right after a letter, digit or ``_``
  ends the word: ``git diff*`` matches ``git diff`` and ``git diff HEAD``, not ``git
  difftool``; Claude Code's ``bash(git diff:*)`` is read as ``git diff*``);
- ``write_file(src/**)``: a file tool (``read_file``, ``write_file``, ``edit_file``)
  whose ``path`` matches the glob (``**`` any number of directories, ``*`` and ``?``
  within one name), the path taken relative to the working directory of the agent
  the rule was given to;
- ``web_fetch(domain:docs.python.org)``: a ``web_fetch`` call whose ``url`` has that
  host (``domain:*.python.org``: any host below ``python.org``); Claude Code's
  ``WebFetch(domain:...)``. A URL that is not plain (not http or https, with a user
  name, a backslash, a space, a ``%`` or a non-ASCII character in it) matches no
  allow rule and every deny rule. The tool itself checks the same rules (its own
  list, which the configuration gives) and the address the host resolves to;
- ``read-only``: every reading tool, as an allow rule: fanfold's own
  (``READING_TOOLS``) and the conversation's tools whose recorded spec says
  ``read_only`` (a function tool's ``read_only=True``, an MCP server's
  ``readOnlyHint``); ``reading_tools`` makes the set, which the checks take.

A ``RuleSet`` is one layer: allow rules (None: every tool) and deny rules; a call
passes the layer if no deny rule matches it and, when there are allow rules, one of
them does. Deny wins over allow. ``Permissions`` is a stack of layers, one per agent
definition met from the root down: a call is permitted only if every layer permits
it. A child's permissions are its parent's with the child's layer added
(``restrict``), so a child can never hold a tool or a right its parent lacks, at any
depth: its layers include all of its parent's.

A bash *allow* pattern matches a simple command only: a command holding a shell
control character (``;``, ``&``, ``|``, a backtick, ``$(``, ``<``, ``>``, a newline)
matches no pattern, so ``bash(git diff*)`` does not allow ``git diff; rm -rf x``. A
command an allow pattern matches must also pass ``confined.command_problem``: no
expansion, no environment prefix, and for git no option, subcommand or alias that
starts another program. A deny pattern is checked against every part of the command
between such characters as well as the whole; this is best effort (a shell has many
ways to hide a command), which is why allow lists, not deny lists, confine an agent.
"""

from __future__ import annotations

import attrs

from fanfold.statemachine.confined import command_problem
from fanfold.statemachine.messages import ToolCall, ToolSpec

READ_ONLY = "read-only"
"""The allow rule that stands for every reading tool."""

READING_TOOLS = frozenset({"read_file", "think", "grep", "glob"})
"""fanfold's own tools that change nothing: what ``read-only`` allows, with the tools
whose specs say ``read_only`` (``reading_tools``)."""


def reading_tools(tools: tuple[ToolSpec, ...]) -> frozenset[str]:
    """What ``read-only`` allows in a conversation offered ``tools``: fanfold's reading
    tools and every tool whose recorded spec says it is read-only."""
    marked = [spec.name for spec in tools if spec.read_only]
    return READING_TOOLS.union(marked) if marked else READING_TOOLS


PATH_TOOLS = frozenset({"read_file", "write_file", "edit_file"})
"""Tools whose rules take a path glob on their ``path`` argument."""

COMMAND_TOOLS = frozenset({"bash"})
"""Tools whose rules take a pattern on their ``command`` argument."""

URL_TOOLS = frozenset({"web_fetch"})
"""Tools whose rules take ``domain:HOST`` on their ``url`` argument."""

DOMAIN = "domain:"

MCP_PREFIX = "mcp__"
"""MCP servers' tools are ``mcp__SERVER__TOOL``; rules may name a whole server
(``mcp__github``, ``mcp__github__*``)."""


LIST_MCP_RESOURCES = "list_mcp_resources"
READ_MCP_RESOURCE = "read_mcp_resource"
MCP_RESOURCE_TOOLS = frozenset({LIST_MCP_RESOURCES, READ_MCP_RESOURCE})
"""The tools over MCP servers' resources (``fanfold.mcp.resources``); a call names its
server in its ``server`` argument. Such a call is matched by a rule naming the tool,
by ``read-only`` (their specs say read-only) and by every rule naming all of that
server's tools (``mcp__S``, ``mcp__S__*``, ``mcp__*``): permissioned as the server's
tools are (a rule naming one tool, ``mcp__S__echo``, does not take them)."""


def _server_wide(rule: Rule) -> bool:
    """Whether ``rule`` names every tool of some MCP server (``mcp__S``, ``mcp__S__*``,
    or any ``mcp__`` prefix ending in ``*``)."""
    if not rule.tool.startswith(MCP_PREFIX):
        return False
    return rule.tool.endswith("*") or "__" not in rule.tool[len(MCP_PREFIX) :]


def mcp_server_of(tool: str) -> str | None:
    """The server of an MCP tool's name (``mcp__SERVER__TOOL``); None for any other."""
    if not tool.startswith(MCP_PREFIX):
        return None
    server, sep, rest = tool[len(MCP_PREFIX) :].partition("__")
    return server if sep and server and rest else None


CLAUDE_TOOL_NAMES = {
    "Bash": "bash",
    "Read": "read_file",
    "Write": "write_file",
    "Edit": "edit_file",
    "MultiEdit": "edit_file",
    "Grep": "grep",
    "Glob": "glob",
    "WebFetch": "web_fetch",
    "ListMcpResourcesTool": "list_mcp_resources",
    "ReadMcpResourceTool": "read_mcp_resource",
}
"""Claude Code's names of the tools fanfold has, so that its agent files work as is."""

_SHELL_CONTROL = (";", "&", "|", "`", "$(", "<", ">", "\n", "\r")


@attrs.frozen
class Rule:
    """One rule: a tool name (or ``read-only``) and an optional argument pattern."""

    tool: str
    pattern: str | None = None

    def __str__(self) -> str:
        return self.tool if self.pattern is None else f"{self.tool}({self.pattern})"


def parse_rule(text: object) -> Rule | str:
    """A rule from its text (``bash(git diff*)``), or why it is not one.

    Claude Code's tool names (``Bash``, ``Read``, ``Write``, ``Edit``, ``MultiEdit``)
    are read as fanfold's. Tool names fanfold does not know are accepted here (a
    runtime may offer more tools); ``unknown_tools`` names them for warnings.
    """
    if not isinstance(text, str):
        return f"a rule must be a string, not {type(text).__name__}"
    text = text.strip()
    if text.lower().replace("_", "-") == READ_ONLY:
        return Rule(READ_ONLY)
    pattern: str | None = None
    name = text
    if "(" in text:
        if not text.endswith(")"):
            return f"rule {text!r}: a pattern goes in parentheses at the end, like bash(git *)"
        name, pattern = text[:-1].split("(", 1)
        name = name.strip()
        pattern = pattern.strip()
        if not pattern:
            return f"rule {text!r}: empty pattern (leave out the parentheses to mean every call)"
        if pattern.endswith(":*"):
            pattern = pattern[:-2] + "*"
    wildcard = name.endswith("*") and name.startswith(MCP_PREFIX)
    bare = name[:-1] if wildcard else name
    if not bare or not all(c.isalnum() or c in "_-." for c in bare) or not name.isascii():
        return f"rule {text!r}: {name!r} is not a tool name"
    if wildcard and pattern is not None:
        return f"rule {text!r}: a wildcard rule takes no pattern"
    name = CLAUDE_TOOL_NAMES.get(name, name)
    if pattern is not None and name in URL_TOOLS:
        problem = domain_problem(pattern)
        if problem is not None:
            return f"rule {text!r}: {problem}"
        return Rule(name, DOMAIN + pattern[len(DOMAIN) :].strip().lower().rstrip("."))
    if pattern is not None and name not in PATH_TOOLS | COMMAND_TOOLS:
        return (
            f"rule {text!r}: only bash (a command), read_file, write_file, edit_file "
            "(a path) and web_fetch (domain:HOST) take a pattern"
        )
    return Rule(name, pattern)


def domain_problem(pattern: str) -> str | None:
    """Why ``pattern`` is not ``domain:HOST`` (``domain:*.HOST``); None if it is."""
    if not pattern.startswith(DOMAIN):
        return "web_fetch takes domain:HOST, like web_fetch(domain:docs.python.org)"
    host = pattern[len(DOMAIN) :].strip().lower().rstrip(".")
    name = host[2:] if host.startswith("*.") else host
    if not name or not _plain_host(name) or "*" in name:
        return f"{host!r} is not a host name (a wildcard only as '*.' at the start)"
    return None


def _plain_host(host: str) -> bool:
    return host.isascii() and all(c.isalnum() or c in "-.:" for c in host)


def url_host(url: str) -> str | None:
    """The host of a plain http(s) URL, lowercased, without a trailing dot; None for
    anything else (another scheme, a user name, a backslash, a space, a control
    character or a non-ASCII character anywhere in it, a ``%`` escape in its host): so this
    reading and an HTTP client's cannot disagree about which host a URL names."""
    # DEL (0x7f) is a control character too, as are those below 32.
    if not url.isascii() or any(c.isspace() or ord(c) < 32 or c in "\x7f\\" for c in url):
        return None
    lower = url.lower()
    for scheme in ("https://", "http://"):
        if lower.startswith(scheme):
            rest = lower[len(scheme) :]
            break
    else:
        return None
    authority = rest
    for separator in "/?#":
        authority = authority.split(separator, 1)[0]
    if "@" in authority or "%" in authority:
        return None
    if authority.startswith("["):
        end = authority.find("]")
        host, port = (authority[1:end], authority[end + 1 :]) if end > 0 else ("", "")
        if port and not (port.startswith(":") and port[1:].isdigit()):
            return None
    else:
        host, _, port = authority.partition(":")
        if (port and not port.isdigit()) or ":" in port:
            return None
    host = host.rstrip(".")
    return host if host and _plain_host(host) else None


def domain_matches(pattern: str, host: str) -> bool:
    """Whether ``domain:HOST`` (``pattern``) names ``host``: exactly, or for
    ``domain:*.example.com`` any host below ``example.com`` (not itself)."""
    name = pattern[len(DOMAIN) :] if pattern.startswith(DOMAIN) else pattern
    if name.startswith("*."):
        return host.endswith(name[1:]) and len(host) > len(name) - 1
    return host == name


@attrs.frozen
class RuleSet:
    """One layer of rules. ``allow`` None: every tool (deny rules still apply).

    ``source`` says whose rules they are (``agent 'explorer'``), for refusal messages;
    ``base`` is the working directory path patterns are relative to.
    """

    allow: tuple[Rule, ...] | None = None
    deny: tuple[Rule, ...] = ()
    source: str = ""
    base: str = "."

    @property
    def unrestricted(self) -> bool:
        return self.allow is None and not self.deny


@attrs.frozen
class Permissions:
    """The layers a conversation's tool calls must all pass (root first)."""

    layers: tuple[RuleSet, ...] = ()


UNRESTRICTED = Permissions()


def restrict(parent: Permissions | None, layer: RuleSet) -> Permissions | None:
    """A child's permissions: its parent's intersected with ``layer`` (the agent
    definition's rules). None stands for no rules at all."""
    layers = () if parent is None else parent.layers
    if layer.unrestricted:
        return parent
    return Permissions((*layers, layer))


def allows_tool(
    permissions: Permissions | None, tool: str, reading: frozenset[str] = READING_TOOLS
) -> bool:
    """Whether some call of ``tool`` could pass: no layer denies the whole tool and
    every layer with allow rules has one for it. Tools that fail are not offered.
    ``reading``: what ``read-only`` stands for (``reading_tools`` of the tool set)."""
    if permissions is None:
        return True
    for layer in permissions.layers:
        if any(rule.pattern is None and _names(rule, tool, reading) for rule in layer.deny):
            return False
        if layer.allow is not None and not any(
            _names(rule, tool, reading) or (tool in MCP_RESOURCE_TOOLS and _server_wide(rule))
            for rule in layer.allow
        ):
            return False
    return True


def refusal(
    permissions: Permissions | None,
    call: ToolCall,
    cwd: str,
    reading: frozenset[str] = READING_TOOLS,
) -> str | None:
    """Why ``call``, made in working directory ``cwd``, is refused; None if permitted.

    The message names the rule (or the missing allow rule) and whose it is.
    ``reading``: what ``read-only`` stands for (``reading_tools`` of the conversation's
    tools).
    """
    if permissions is None:
        return None
    for layer in permissions.layers:
        whose = f" of {layer.source}" if layer.source else ""
        for rule in layer.deny:
            if _matches(rule, call, cwd, layer.base, reading, deny=True):
                return f"refused by the deny rule '{rule}'{whose}"
        if layer.allow is not None and not any(
            _matches(rule, call, cwd, layer.base, reading, deny=False) for rule in layer.allow
        ):
            problem = _confined_problem(layer.allow, call)
            if problem is not None:
                return f"refused: {problem} (a command allowed by a pattern{whose})"
            allowed = ", ".join(str(r) for r in layer.allow) or "nothing"
            why = f"refused: no allow rule{whose} matches this call (allowed: {allowed})"
            server = mcp_server_of(call.name)
            if server is not None and any(rule.tool == READ_ONLY for rule in layer.allow):
                # Say why read-only does not take it: the server's own word is missing.
                # (Only for MCP tools: other tools' refusals keep the wording older
                # logs recorded, so that they still verify.)
                why += (
                    f"; read-only takes an MCP tool only if its server marks it "
                    f"readOnlyHint, and server {server!r} does not mark {call.name!r}"
                )
            return why
    return None


def confines_commands(permissions: Permissions | None) -> bool:
    """Whether this conversation's bash commands run only through allow patterns: some
    layer allows ``bash`` by patterns alone. The bash tool then switches off what git's
    own configuration could run (``fanfold/tools/git_guard.py``), since a pattern cannot
    see it."""
    if permissions is None:
        return False
    return any(
        layer.allow is not None
        and not any(
            rule.pattern is None and _names(rule, "bash", READING_TOOLS) for rule in layer.allow
        )
        for layer in permissions.layers
    )


@attrs.frozen
class PathRules:
    """What a file tool's call must also pass where its path really leads: the rules
    the reducer matched the path against as spelled, and what ``read-only`` stood for
    then (``reading_tools`` of the conversation's tools, sorted).

    The reducer puts it on the call's ``RunTool`` (``path_rules``); the runtime, which
    alone can resolve symbolic links, resolves the path and asks ``link_refusal``.
    """

    permissions: Permissions
    reading: tuple[str, ...] = ()


def path_rules(
    permissions: Permissions | None, call: ToolCall, tools: tuple[ToolSpec, ...]
) -> PathRules | None:
    """The rules a ``RunTool`` of ``call`` carries for the runtime's check of symbolic
    links: None unless ``call`` is a file tool's and the conversation has rules."""
    if permissions is None or call.name not in PATH_TOOLS:
        return None
    marked = [spec.name for spec in tools if spec.read_only]
    # Without read-only specs (the usual case) the sorted built-ins, sorted once.
    reading = tuple(sorted(READING_TOOLS.union(marked))) if marked else _SORTED_READING_TOOLS
    return PathRules(permissions, reading)


_SORTED_READING_TOOLS = tuple(sorted(READING_TOOLS))


def link_refusal(rules: PathRules, call: ToolCall, cwd: str, through: str) -> str | None:
    """Why ``call``, which the rules permitted by its path as spelled, is refused now
    that its path is known to lead to ``through`` (the real path, spelled relative to
    ``cwd`` as the reducer spells paths); None if the rules permit that path too.

    Pure: the runtime resolves the links (I/O) and passes what it found.
    """
    try:
        arguments = call.arguments()
    except ValueError:
        return None
    if not isinstance(arguments, dict):
        return None
    spelled = arguments.get("path")
    resolved = ToolCall.of(call.id, call.name, {**arguments, "path": through})
    why = refusal(rules.permissions, resolved, cwd, frozenset(rules.reading))
    if why is None:
        return None
    return f"{call.name} {why}: {spelled!r} leads to {through!r} through a symbolic link"


def _confined_problem(allow: tuple[Rule, ...], call: ToolCall) -> str | None:
    """Why a bash call that an allow pattern matches as text is still refused."""
    if call.name not in COMMAND_TOOLS:
        return None
    command = _argument(call, "command")
    if command is None:
        return None
    for rule in allow:
        if (
            _names(rule, call.name, READING_TOOLS)
            and rule.pattern is not None
            and command_matches(rule.pattern, command, any_part=False)
        ):
            return command_problem(command)
    return None


# ------------------------------------------------------------------ matching


def _names(rule: Rule, tool: str, reading: frozenset[str]) -> bool:
    if rule.tool == READ_ONLY:
        return tool in reading
    if rule.tool.startswith(MCP_PREFIX):
        # Claude Code's forms: mcp__SERVER (every tool of the server), mcp__SERVER__*
        # (the same), mcp__SERVER__TOOL; and any mcp__ prefix ending in '*'.
        if rule.tool.endswith("*"):
            return tool.startswith(rule.tool[:-1])
        if "__" not in rule.tool[len(MCP_PREFIX) :]:
            return tool.startswith(rule.tool + "__")
    return rule.tool == tool


def _argument(call: ToolCall, key: str) -> str | None:
    try:
        arguments = call.arguments()
    except ValueError:
        return None
    value = arguments.get(key) if isinstance(arguments, dict) else None
    return value if isinstance(value, str) else None


def _matches(
    rule: Rule, call: ToolCall, cwd: str, base: str, reading: frozenset[str], *, deny: bool
) -> bool:
    if call.name in MCP_RESOURCE_TOOLS and _server_wide(rule):
        # A server's resources go with its tools: the rule is matched against the
        # server the call names, as if the call were one of that server's tools. A
        # server argument that cannot be a server's name matches every deny rule and
        # no allow rule.
        server = _argument(call, "server")
        if server is None or not server or "__" in server or not server.isascii():
            return deny
        return _names(rule, f"{MCP_PREFIX}{server}__{call.name}", reading)
    if not _names(rule, call.name, reading):
        return False
    if rule.pattern is None:
        return True
    if call.name in COMMAND_TOOLS:
        command = _argument(call, "command")
        if command is None:
            return False
        if deny:
            return command_matches(rule.pattern, command, any_part=True)
        # An allow pattern sees the text; what the words would start is checked too.
        return (
            command_matches(rule.pattern, command, any_part=False)
            and command_problem(command) is None
        )
    if call.name in URL_TOOLS:
        url = _argument(call, "url")
        host = None if url is None else url_host(url)
        if host is None:
            # Not a plain URL: no allow rule vouches for it, every deny rule takes it.
            return deny
        return domain_matches(rule.pattern, host)
    path = _argument(call, "path")
    if path is None:
        return False
    return path_matches(rule.pattern, path, cwd, base)


def command_matches(pattern: str, command: str, *, any_part: bool) -> bool:
    """Whether ``command`` matches ``pattern`` (``*`` matches anything).

    ``any_part`` False (allow rules): only a simple command can match. True (deny
    rules): the whole command or any part of it between shell control characters.
    """
    command = command.strip()
    simple = not any(c in command for c in _SHELL_CONTROL)
    if not any_part:
        return simple and glob_match(pattern, command, slash_special=False, word_boundary=True)
    if glob_match(pattern, command, slash_special=False):
        return True
    parts = [command]
    for separator in _SHELL_CONTROL:
        parts = [piece for part in parts for piece in part.split(separator)]
    return any(glob_match(pattern, part.strip().lstrip("("), slash_special=False) for part in parts)


def normalise(path: str) -> str:
    """``path`` with ``.``, empty and ``..`` components resolved by its spelling alone
    (``..`` above an absolute root stays at the root; above a relative start it is
    kept)."""
    absolute = path.startswith("/")
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not absolute:
                parts.append("..")
            continue
        parts.append(part)
    joined = "/".join(parts)
    return "/" + joined if absolute else (joined or ".")


def _join(directory: str, path: str) -> str:
    if path.startswith("/"):
        return normalise(path)
    return normalise(directory.rstrip("/") + "/" + path)


def path_matches(pattern: str, path: str, cwd: str, base: str) -> bool:
    """Whether ``path`` (as given to a tool working in ``cwd``) matches ``pattern``.

    A pattern starting with ``/`` is matched against the absolute path; any other is
    relative to ``base`` and matches nothing outside it. Lexical only: symbolic links
    are the runtime's to judge (it refuses any path outside the project, and a call
    whose path, its links resolved, these rules refuse).
    """
    full = _join(cwd, path)
    if pattern.startswith("/"):
        return glob_match(normalise(pattern), full, slash_special=True)
    root = normalise(base)
    if root == ".":
        relative = full
    elif full == root:
        relative = "."
    elif full.startswith(root.rstrip("/") + "/"):
        relative = full[len(root.rstrip("/")) + 1 :]
    else:
        return False
    if relative.startswith("../") or relative == ".." or relative.startswith("/"):
        return False
    return glob_match(normalise(pattern), relative, slash_special=True)


def glob_match(
    pattern: str, text: str, *, slash_special: bool, word_boundary: bool = False
) -> bool:
    """Glob matching without ``re`` (the pure core's import rule).

    ``slash_special`` (paths): ``*`` and ``?`` stay within one name, ``**`` spans
    directories and ``**/`` may match nothing. Otherwise ``*`` matches any text.

    ``word_boundary`` (bash allow patterns): a ``*`` right after a letter, digit or
    ``_`` matches nothing or text that starts with a space or a tab, so ``git diff*``
    matches ``git diff`` and ``git diff HEAD`` but not ``git difftool``, ``git diffx``
    or ``git diff-tree``; a pattern ending in such a word, a space and ``*`` (``git
    diff *``) is read the same way, so it matches the bare ``git diff`` too.
    """
    if word_boundary and pattern.endswith(" *") and _is_word(pattern.rstrip(" *")[-1:]):
        pattern = pattern.rstrip(" *") + "*"
    tokens = _tokens(pattern, slash_special=slash_special, word_boundary=word_boundary)
    # positions[i] is True when tokens[:k] can match text[:i] (k the tokens so far).
    states = {0}
    for token in tokens:
        following: set[int] = set()
        for start in sorted(states):
            following |= _advance(token, text, start)
        states = following
        if not states:
            return False
    return len(text) in states


def _is_word(char: str) -> bool:
    return len(char) == 1 and (char.isalnum() or char == "_")


def _tokens(pattern: str, *, slash_special: bool, word_boundary: bool = False) -> list[str]:
    tokens: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i) and slash_special:
            tokens.append("**/")
            i += 3
        elif word_boundary and pattern[i] == "*" and i > 0 and _is_word(pattern[i - 1]):
            # "*b": the end of a word; "git diff*" may not reach into "git difftool".
            tokens.append("*b")
            i += 2 if pattern.startswith("**", i) else 1
        elif pattern.startswith("**", i):
            tokens.append("**" if slash_special else "*")
            i += 2
        elif pattern[i] in "*?":
            tokens.append(pattern[i])
            i += 1
        else:
            tokens.append("=" + pattern[i])
            i += 1
    if not slash_special:
        tokens = ["**" if t == "*" else "?any" if t == "?" else t for t in tokens]
    return tokens


def _advance(token: str, text: str, start: int) -> set[int]:
    n = len(text)
    if token.startswith("="):
        char = token[1]
        return {start + 1} if start < n and text[start] == char else set()
    if token == "?any":
        return {start + 1} if start < n else set()
    if token == "?":
        return {start + 1} if start < n and text[start] != "/" else set()
    if token == "**":
        return set(range(start, n + 1))
    if token == "*b":
        if start < n and text[start] in " \t":
            return set(range(start, n + 1))
        return {start}
    if token == "*":
        end = start
        out = {start}
        while end < n and text[end] != "/":
            end += 1
            out.add(end)
        return out
    # "**/": nothing, or any run of whole directories ending in "/".
    out = {start}
    for i in range(start, n):
        if text[i] == "/":
            out.add(i + 1)
    return out
