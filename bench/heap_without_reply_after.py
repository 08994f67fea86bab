"""The heap per waiting child when the provider has no ``reply_after`` (an HTTP
provider's path: a worker task per call in flight): ``bench.sections.memory`` with the
scripted provider wrapped to hide it. From the checkout:
``python -m bench.heap_without_reply_after`` (two runs of N = 1000)."""

from __future__ import annotations

from typing import Any

import bench.sections as sections
from fanfold.providers.base import CallContext
from fanfold.statemachine import ModelReply, ModelRequest


class OnlyComplete:
    """A provider with ``complete`` only: its calls wait in worker tasks."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply:
        reply: ModelReply = await self._inner.complete(request, context)
        return reply


def main() -> None:
    scripted = getattr(sections, "fanout_script")  # noqa: B009 (imported there)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return OnlyComplete(scripted(*args, **kwargs))

    setattr(sections, "fanout_script", wrapped)  # noqa: B010 (the name memory() reads)
    for _ in range(2):
        result = sections.memory(1000)
        print(f"heap per waiting child, no reply_after: {result['heap_bytes_per_child']:.0f} B")


if __name__ == "__main__":
    main()
