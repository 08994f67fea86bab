"""Where file tools may read and write: the path policy."""

from __future__ import annotations

import os
from typing import Literal

import attrs

from fanfold.statemachine import WorkingDirectory
from fanfold.tools.tool import ToolInputError

PathMode = Literal["cwd", "any"]


@attrs.frozen
class PathPolicy:
    """Which paths the file tools (read_file, write_file, edit_file) may touch.

    ``mode="cwd"`` (the default) confines them to the conversation's working directory:
    a path is resolved against ``cwd``, with ``..`` and symbolic links followed, and
    refused unless the result lies inside the resolved ``cwd``. ``mode="any"`` allows
    every path the process may access.

    The policy does not confine ``bash``: a shell command can reach anything the process
    can. Confine the process itself (a container, a user) when that matters.
    """

    mode: PathMode = attrs.field(default="cwd", validator=attrs.validators.in_(("cwd", "any")))

    def resolve(self, path: str, cwd: str) -> str:
        """The absolute, symlink-resolved path for ``path`` as given by the model.

        Relative paths are taken relative to ``cwd`` and ``~`` is expanded. Raises
        :class:`ToolInputError` when the policy forbids the path, or when ``cwd`` itself
        does not exist under ``mode="cwd"``.
        """
        if "\0" in path:
            raise ToolInputError("the path contains a NUL character")
        full = os.path.join(cwd, os.path.expanduser(path))
        resolved = os.path.realpath(full)
        if self.mode == "any":
            return resolved
        if not os.path.isdir(cwd):
            raise ToolInputError(f"the working directory '{cwd}' does not exist")
        root = os.path.realpath(cwd)
        if resolved != root and not resolved.startswith(root.rstrip("/") + "/"):
            via = " (through a symbolic link)" if _has_symlink(full) else ""
            raise ToolInputError(
                f"'{path}' resolves to '{resolved}'{via}, which is outside the working "
                f"directory '{root}'. Only paths inside the working directory are allowed."
            )
        return resolved


def _has_symlink(path: str) -> bool:
    """Whether a symbolic link occurs among ``path``'s existing components."""
    normal = os.path.normpath(path)
    while normal not in ("/", ""):
        if os.path.islink(normal):
            return True
        normal = os.path.dirname(normal)
    return False


def _realpath(path: str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):  # ValueError: a NUL character
        return path


def inspect_workdir(cwd: str, parent_cwd: str, project_cwd: str) -> WorkingDirectory:
    """What is really at a new sub-agent's working directory ``cwd``: it, its parent's
    and the project's (the tree root's) directory with symbolic links resolved, and
    whether ``cwd`` is a directory. The reducer decides from these whether the
    sub-agent may start there."""
    try:
        is_directory = os.path.isdir(cwd)
    except (OSError, ValueError):
        is_directory = False
    # Usually two or three of the paths are one directory (a sub-agent works where its
    # parent does, in the project): each distinct path is resolved once (a resolution
    # is a system call per path component).
    resolved: dict[str, str] = {}
    for path in (cwd, parent_cwd, project_cwd):
        if path not in resolved:
            resolved[path] = _realpath(path)
    return WorkingDirectory(
        resolved=resolved[cwd],
        parent=resolved[parent_cwd],
        project=resolved[project_cwd],
        is_directory=is_directory,
    )


def outside_project(cwd: str, project_cwd: str) -> str | None:
    """Why no tool may run in ``cwd``: it resolves (links followed) outside the project
    directory ``project_cwd``; None when it is inside.

    A sub-agent's directory was checked when it was created, but a symbolic link on its
    way can be changed afterwards (by a sibling's ``bash``): this is checked again
    before every tool runs.
    """
    resolved, project = _realpath(cwd), _realpath(project_cwd)
    if resolved == project or resolved.startswith(project.rstrip("/") + "/"):
        return None
    return (
        f"the working directory '{cwd}' now resolves to '{resolved}', outside the "
        f"project '{project}'; no tool runs there"
    )
