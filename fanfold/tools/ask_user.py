"""The ``ask_user`` tool (issue 35): an agent asks a person a question.

The reducer never runs it: a call of it waits for a person's answer
(``ToolExecuting.asking``), which becomes its result (``UserAnswered``). This object
only offers its spec: add it to a tool set (``ToolSet.default(extra=[AskUserTool()])``,
``fanfold run --ask-user``) and an agent definition with a ``tools`` list must name it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from fanfold.statemachine import ToolSpec
from fanfold.statemachine.approvals import ASK_USER_SPEC
from fanfold.tools.tool import ToolOutput


@attrs.frozen
class AskUserTool:
    """Offers ``ask_user``; its calls are answered by a person, never run here."""

    read_only = True

    @property
    def spec(self) -> ToolSpec:
        """The tool's name, description and schema."""
        return ASK_USER_SPEC

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        """Never called by the runtime (the reducer waits for a person instead)."""
        return ToolOutput.error("ask_user is answered by a person, not run")
