"""The ``think`` tool: a scratchpad for reasoning, with no effect on the world."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from fanfold.statemachine import ToolSpec
from fanfold.tools.tool import ToolOutput


@attrs.frozen
class ThinkTool:
    """Records a thought and returns ``"ok"``.

    The thought is recorded where every tool call is: in the conversation's event log,
    as this call's arguments. Running the tool changes nothing else.
    """

    read_only = True  # changes nothing (ToolSet.read_only)
    idempotent = True

    @property
    def spec(self) -> ToolSpec:
        """The tool's name, description and schema."""
        return ToolSpec.from_schema(
            "think",
            "Think something through step by step: plan an approach, weigh options, or "
            "check results before acting. The thought is recorded in the conversation; "
            "nothing else happens and no new information is returned.",
            {
                "type": "object",
                "required": ["thought"],
                "additionalProperties": False,
                "properties": {
                    "thought": {"type": "string", "description": "Your reasoning"},
                },
            },
        )

    def answer(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        """Return ``"ok"``: no I/O, so the runtime answers it in-process (``InProcess``)."""
        return _OK

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        """Return ``"ok"``."""
        return self.answer(args, cwd)


_OK = ToolOutput.ok("ok")
