"""Where agent definitions are found, and which are in effect.

Lookup, lowest precedence first (a later definition of a name overrides an earlier):

1. the built-ins (``general-purpose``, ``explorer``, ``reviewer``);
2. the user's: ``~/.claude/agents/``, then ``$XDG_CONFIG_HOME/fanfold/agents/``
   (``~/.config/fanfold/agents/``);
3. the project's (the run's working directory): ``.claude/agents/``, then
   ``.fanfold/agents/``.

Each folder's ``*.md`` files are read in name order; within one folder the first
file of a name wins and the others are reported. A file that cannot be read or is
invalid is reported (path, line, what is wrong) and left out: it never stops a run.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

from fanfold.agents.builtin import BUILTIN_SOURCES
from fanfold.agents.definitions import MAX_FILE_BYTES, AgentProblem, parse_definition
from fanfold.statemachine.agent_defs import AgentDefinition

MAX_FILES_PER_FOLDER = 200
"""Files read per folder at most (the rest are reported, not read)."""


@attrs.frozen
class AgentCatalog:
    """The agents in effect (by name), those overridden, and every problem found."""

    agents: tuple[AgentDefinition, ...]
    overridden: tuple[AgentDefinition, ...] = ()
    problems: tuple[AgentProblem, ...] = ()

    @property
    def errors(self) -> tuple[AgentProblem, ...]:
        return tuple(p for p in self.problems if not p.warning)


def agent_folders(project: Path, environ: Mapping[str, str] | None = None) -> list[Path]:
    """The folders searched, lowest precedence first."""
    env = os.environ if environ is None else environ
    home = Path(env.get("HOME") or "~").expanduser()
    xdg = env.get("XDG_CONFIG_HOME") or str(home / ".config")
    return [
        home / ".claude" / "agents",
        Path(xdg) / "fanfold" / "agents",
        project / ".claude" / "agents",
        project / ".fanfold" / "agents",
    ]


def load_agents(
    project: Path | str = ".",
    environ: Mapping[str, str] | None = None,
    *,
    folders: list[Path] | None = None,
    model_aliases: Mapping[str, str] | None = None,
    tools: Iterable[str] = (),
) -> AgentCatalog:
    """The built-ins and every definition in ``folders`` (default: ``agent_folders``
    of ``project``), later ones overriding earlier ones of the same name.
    ``model_aliases``: the configuration's ``[model_aliases]`` (see
    ``parse_definition``); ``tools``: the names of the runtime's tools beside
    fanfold's (``ToolSet.names``), which rules may name."""
    tools = tuple(tools)
    problems: list[AgentProblem] = []
    effective: dict[str, AgentDefinition] = {}
    overridden: list[AgentDefinition] = []
    for text, source in BUILTIN_SOURCES:
        definition, found = parse_definition(text, source)
        problems += found
        assert definition is not None, found  # the built-ins are tested
        effective[definition.name] = definition
    searched = folders if folders is not None else agent_folders(Path(project), environ)
    # The same folder reached twice (the project is the home directory) is read once.
    seen: set[str] = set()
    for folder in searched:
        key = _identity(folder)
        if key in seen:
            continue
        seen.add(key)
        in_folder: dict[str, str] = {}
        for definition, path in _read_folder(folder, problems, model_aliases, tools):
            first = in_folder.get(definition.name)
            if first is not None:
                problems.append(
                    AgentProblem(
                        path,
                        1,
                        f"agent {definition.name!r} is also defined in {first}, which wins "
                        "(first file by name); this one is ignored",
                        warning=True,
                    )
                )
                continue
            in_folder[definition.name] = path
            earlier = effective.get(definition.name)
            if earlier is not None:
                overridden.append(earlier)
            effective[definition.name] = definition
    return AgentCatalog(
        tuple(effective[name] for name in sorted(effective)),
        tuple(overridden),
        tuple(problems),
    )


def _identity(folder: Path) -> str:
    try:
        return str(folder.resolve())
    except (OSError, RuntimeError):
        return str(folder)


def _read_folder(
    folder: Path,
    problems: list[AgentProblem],
    model_aliases: Mapping[str, str] | None = None,
    tools: Iterable[str] = (),
) -> list[tuple[AgentDefinition, str]]:
    try:
        if not folder.is_dir():
            return []
        names = sorted(entry.name for entry in os.scandir(folder) if entry.name.endswith(".md"))
    except OSError as exc:
        problems.append(AgentProblem(str(folder), 0, f"cannot list: {exc.strerror or exc}"))
        return []
    found: list[tuple[AgentDefinition, str]] = []
    for index, name in enumerate(names):
        path = folder / name
        if index >= MAX_FILES_PER_FOLDER:
            problems.append(
                AgentProblem(
                    str(path), 0, f"not read: at most {MAX_FILES_PER_FOLDER} files per folder"
                )
            )
            continue
        target = _linked_outside(folder, path)
        if target is not None:
            problems.append(
                AgentProblem(
                    str(path),
                    0,
                    f"a symbolic link to {target}, outside this folder; ignored",
                    warning=True,
                )
            )
            continue
        text = _read(path, problems)
        if text is None:
            continue
        definition, file_problems = parse_definition(
            text, str(path), model_aliases=model_aliases, tools=tools
        )
        problems += file_problems
        if definition is not None:
            found.append((definition, str(path)))
    return found


def _linked_outside(folder: Path, path: Path) -> str | None:
    """Where ``path`` leads, if it is a symbolic link to something outside ``folder``
    (both resolved: the folder may itself be a link, as dotfiles often make
    ``~/.claude/agents``); None for a plain file or a link that stays inside.

    A cloned repository's ``.claude/agents/x.md -> ~/.ssh/id_ed25519`` would otherwise
    be read as an agent's prompt and sent to the model: a definition is the folder's
    own text, never a file elsewhere on the machine.
    """
    try:
        if not path.is_symlink():
            return None
        base = os.path.realpath(folder)
        target = os.path.realpath(path)
    except (OSError, ValueError):
        return str(path)
    if os.path.commonpath([base, target]) == base:
        return None
    return target


def _read(path: Path, problems: list[AgentProblem]) -> str | None:
    """The file's text; None (reported) if it is no regular file, too large, not UTF-8
    or unreadable. Opened without following to a FIFO or device: those would block."""
    try:
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
        descriptor = os.open(path, flags)
        with os.fdopen(descriptor, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                problems.append(AgentProblem(str(path), 0, "not a regular file; ignored"))
                return None
            if info.st_size > MAX_FILE_BYTES:
                problems.append(
                    AgentProblem(str(path), 0, f"larger than {MAX_FILE_BYTES} bytes; not read")
                )
                return None
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        problems.append(AgentProblem(str(path), 0, f"cannot read: {exc.strerror or exc}"))
        return None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        problems.append(AgentProblem(str(path), line, "not UTF-8 text"))
        return None
