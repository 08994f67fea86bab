"""What a detached tree is started with: the workflow's input, as plain data.

``fanfold run --detach`` makes a ``TreeSpec`` and enqueues it as the DBOS workflow's
one argument (a dict of strings, numbers and lists: what any DBOS serializer keeps);
the worker that runs the workflow rebuilds it with ``TreeSpec.from_input`` and starts
the tree under ``root_id``. The model, its profile and the tools are the worker's (its
``--script``/``--config``/``--profile``/``--model`` and ``--tools``): a queued task
names what to do, the worker decides what runs it (DESIGN.md, "run --detach").
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from typing import Any

import attrs

from fanfold.statemachine import Limits
from fanfold.statemachine.permissions import parse_rule

SPEC_VERSION = 1
"""The shape of the input: a worker refuses an input of another version."""

ASKING_VERSION = 2
"""The version of an input carrying ask rules or an approval timeout (``run --detach
--ask``): a worker of before reads only 1, so it refuses such a tree with the reason
rather than run it without asking. Version 1 otherwise, as before."""

MAX_ASK_RULES = 100
"""The most ask rules a detached tree may carry."""

LIMIT_FIELDS = ("max_rounds", "max_concurrent", "max_tasks_per_call", "max_depth", "max_tokens")
"""The limits a detached run may set (``fanfold run``'s options)."""

MAX_TIMEOUT = 365 * 86400.0
"""The longest root time limit a detached tree may carry (``run --timeout``'s bound)."""

_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class SpecError(ValueError):
    """A workflow input that is not a tree this worker can start (says what is wrong)."""


@attrs.frozen
class TreeSpec:
    """A tree to start: its id, its task, and what ``fanfold run`` would have set."""

    root_id: str
    task: str
    cwd: str
    system_prompt: str | None = None
    limits: tuple[tuple[str, int], ...] = ()
    context_modes: tuple[str, ...] | None = None
    timeout: float | None = None
    """The root's time limit in seconds (``run --timeout``): None, no limit."""
    ask: tuple[str, ...] = ()
    """Rules whose calls wait for a person's decision (``run --ask``), anywhere in the
    tree: ``Runtime.start(ask=)``."""
    approval_timeout: float | None = None
    """Seconds a call waits for a decision before it is denied (``run
    --approval-timeout``): None, the worker's (its ``[permissions]``), else for ever."""

    def to_input(self) -> dict[str, Any]:
        """The workflow's input (plain data)."""
        asking = bool(self.ask) or self.approval_timeout is not None
        return {
            "version": ASKING_VERSION if asking else SPEC_VERSION,
            "root_id": self.root_id,
            "task": self.task,
            "cwd": self.cwd,
            "system_prompt": self.system_prompt,
            "limits": dict(self.limits),
            "context_modes": list(self.context_modes) if self.context_modes is not None else None,
            # Only when set: an input without it is the one version 1 always was.
            **({"timeout": self.timeout} if self.timeout is not None else {}),
            **({"ask": list(self.ask)} if self.ask else {}),
            **(
                {"approval_timeout": self.approval_timeout}
                if self.approval_timeout is not None
                else {}
            ),
        }

    @classmethod
    def from_input(cls, data: object) -> TreeSpec:
        """Rebuild a spec from a workflow input; SpecError if it is not one.

        The input comes from the queue (anyone who can write to the system database
        can put one there): every field is checked for its type and shape, nothing in
        it is evaluated.
        """
        if not isinstance(data, dict):
            raise SpecError(f"a tree's input is a mapping, not {type(data).__name__}")
        if data.get("version") not in (SPEC_VERSION, ASKING_VERSION):
            raise SpecError(f"input version {data.get('version')!r}; this worker reads 1 and 2")
        root_id, task, cwd = data.get("root_id"), data.get("task"), data.get("cwd")
        if not isinstance(root_id, str) or not _ID.fullmatch(root_id):
            raise SpecError("root_id: 1 to 64 letters, digits, - or _")
        if not isinstance(task, str) or not task.strip():
            raise SpecError("task: a non-empty string")
        if not isinstance(cwd, str) or not cwd:
            raise SpecError("cwd: a path")
        system = data.get("system_prompt")
        if system is not None and not isinstance(system, str):
            raise SpecError("system_prompt: a string or null")
        limits = data.get("limits") or {}
        if not isinstance(limits, dict) or any(
            k not in LIMIT_FIELDS or type(v) is not int or v < 0 for k, v in limits.items()
        ):
            raise SpecError(f"limits: a mapping of {', '.join(LIMIT_FIELDS)} to integers")
        modes = data.get("context_modes")
        if modes is not None and (
            not isinstance(modes, list) or not all(isinstance(m, str) for m in modes)
        ):
            raise SpecError("context_modes: a list of strings or null")
        timeout = data.get("timeout")
        if timeout is not None and (
            type(timeout) not in (int, float)
            or not math.isfinite(timeout)
            or not 0 < timeout <= MAX_TIMEOUT
        ):
            raise SpecError("timeout: a number of seconds > 0 and at most a year, or null")
        ask = _ask_rules(data.get("ask"))
        waited = data.get("approval_timeout")
        if waited is not None and (
            type(waited) not in (int, float)
            or not math.isfinite(waited)
            or not 0 < waited <= MAX_TIMEOUT
        ):
            raise SpecError("approval_timeout: a number of seconds > 0 and at most a year, or null")
        if data["version"] == SPEC_VERSION and (ask or waited is not None):
            # A client of this release writes 2 for these: a 1 carrying them was made
            # by hand, and a worker of before would have ignored them.
            raise SpecError("ask and approval_timeout come with input version 2")
        return cls(
            root_id=root_id,
            task=task,
            cwd=cwd,
            system_prompt=system,
            limits=tuple(sorted(limits.items())),
            context_modes=tuple(modes) if modes is not None else None,
            timeout=float(timeout) if timeout is not None else None,
            ask=ask,
            approval_timeout=float(waited) if waited is not None else None,
        )

    def admitted_cwd(self, allowed: Sequence[str]) -> str:
        """The tree's folder, every symbolic link resolved, if it is an existing folder
        inside one of ``allowed`` (the worker's ``--allow-cwd`` folders, resolved);
        SpecError otherwise. Whoever can write to the queue chooses ``cwd``: a tree's
        bash commands run there and their output lands in the log that writer may
        read, so a worker runs trees only in the folders its own configuration names.
        """
        cwd = self.cwd
        if "\0" in cwd:
            raise SpecError("cwd: a path holds no NUL character")
        if not os.path.isabs(cwd):
            raise SpecError(f"cwd: an absolute path, not {cwd!r}")
        resolved = os.path.realpath(cwd)
        if not os.path.isdir(resolved):
            raise SpecError(f"cwd: {cwd!r} is not a folder on this worker")
        for folder in allowed:
            if os.path.commonpath([resolved, folder]) == folder:
                return resolved
        raise SpecError(
            f"cwd: {cwd!r} is outside the folders this worker runs trees in "
            f"({', '.join(allowed)}; fanfold worker --allow-cwd DIR adds one)"
        )

    def limit_overrides(self) -> dict[str, Any]:
        """The keyword arguments of ``Limits`` this spec sets."""
        overrides: dict[str, Any] = dict(self.limits)
        if self.context_modes is not None:
            overrides["context_modes"] = self.context_modes
        if self.approval_timeout is not None:
            overrides["approval_timeout"] = self.approval_timeout
        return overrides

    def make_limits(self) -> Limits:
        """``Limits`` with this spec's overrides (ValueError if the reducer refuses them)."""
        return Limits(**self.limit_overrides())


def _ask_rules(value: object) -> tuple[str, ...]:
    """The ``ask`` of an input: a list of rules ``parse_rule`` reads (or nothing)."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_ASK_RULES:
        raise SpecError(f"ask: a list of at most {MAX_ASK_RULES} rules")
    for text in value:
        if not isinstance(text, str) or isinstance(parse_rule(text), str):
            raise SpecError(f"ask: {text!r} is not a rule (e.g. 'Bash(git push:*)')")
    return tuple(value)


APP_NAME = "fanfold"
APP_VERSION = "fanfold-tree-2"
"""DBOS's application version of every worker and every enqueued tree: DBOS hands a
queued workflow only to a worker of its version. It names the workflow's contract
(``TreeSpec`` version 1 in DBOS's portable JSON, an admission step then the tree's
step), not fanfold's release, so that workers of two releases share one queue.
("fanfold-tree-1" was pickled inputs and one step: its workflows are not run.)"""
QUEUE = "fanfold.trees"
WORKFLOW = "fanfold.tree"

CHUNK_QUEUE = "fanfold.chunks"
"""The queue of chunks of placed children (``fanfold/runtime/placement.py``): its own,
so that trees waiting for their chunks never hold the slots the chunks need."""
CHUNK_WORKFLOW = "fanfold.chunk"

WAKE_WORKFLOW = "fanfold.wake"
"""A tree let go while it waited for people, taken back (``parking.py``): on the trees'
queue, its id ``wake:ROOT:GENERATION``."""

_CHUNK_ID = re.compile(r"chunk:[A-Za-z0-9_.-]{1,200}:[0-9]{1,9}")


def chunk_input(chunk_id: str) -> dict[str, Any]:
    """The chunk workflow's input (plain data)."""
    return {"version": SPEC_VERSION, "chunk_id": chunk_id}


def chunk_from_input(data: object) -> str:
    """The chunk id of a chunk workflow's input; SpecError if it is not one (the rest
    of a chunk, its children's spawns, is read from fanfold's log, never the queue)."""
    if not isinstance(data, dict) or data.get("version") != SPEC_VERSION:
        raise SpecError("a chunk's input is a mapping of version 1")
    chunk = data.get("chunk_id")
    if not isinstance(chunk, str) or not _CHUNK_ID.fullmatch(chunk):
        raise SpecError("chunk_id: chunk:CHILD:N")
    return chunk


def wake_input(root_id: str, generation: int) -> dict[str, Any]:
    """The wake workflow's input (plain data)."""
    return {"version": SPEC_VERSION, "root_id": root_id, "generation": generation}


def wake_from_input(data: object) -> tuple[str, int]:
    """The tree and generation a wake workflow's input names; SpecError if it is not
    one. (Whether that tree waits, in that generation, is read from the queue's
    database, never taken from the input.)"""
    if not isinstance(data, dict) or data.get("version") != SPEC_VERSION:
        raise SpecError("a wake's input is a mapping of version 1")
    root_id, generation = data.get("root_id"), data.get("generation")
    if not isinstance(root_id, str) or not _ID.fullmatch(root_id):
        raise SpecError("root_id: 1 to 64 letters, digits, - or _")
    if type(generation) is not int or generation < 1:
        raise SpecError("generation: an integer >= 1")
    return root_id, generation
