"""A Python function as a tool, offline: a scripted root delegates to a sub-agent that
looks an issue up with ``lookup_issue`` (an ordinary typed function) and greps the
repository, then hands its finding back.

Run from the repository's root::

    python examples/python_tool/tools_example.py /tmp/tools.db
    fanfold show ID --db /tmp/tools.db
    fanfold replay ID --db /tmp/tools.db --verify --tree   # needs none of this code
"""

from __future__ import annotations

import enum
import sys
from pathlib import Path

import trio

import fanfold
from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.tools.registry import ToolSet

HERE = Path(__file__).parent


class State(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


ISSUES = {
    23: ("Open the tool world", State.OPEN),
    7: ("Crash on empty task", State.CLOSED),
}


@fanfold.tool(read_only=True, idempotent=True)
def lookup_issue(number: int, state: State | None = None) -> str:
    """Look an issue up in the (pretend) tracker.

    Args:
        number: The issue's number.
        state: Only if it is in this state.
    """
    title, actual = ISSUES[number]  # a KeyError is an error result the model sees
    if state is not None and state is not actual:
        return f"issue {number} is {actual.value}, not {state.value}"
    return f"#{number} {title} ({actual.value})"


async def main(database: str) -> str:
    provider = ScriptedProvider.from_file(HERE / "script.json")
    tools = ToolSet.default(extra=[lookup_issue])
    async with Runtime.open(database, provider, tools, logger=quiet_logger()) as runtime:
        root = await runtime.start("What is issue 23 about?", cwd=HERE.parent.parent)
        result = await runtime.wait(root)
    print(root)
    print(result.text)
    return root


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "tools.db")
