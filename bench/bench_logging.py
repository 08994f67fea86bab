"""CPU per JSON log line: fanfold's chain against the stdlib chain it replaced.

One ``model_call`` line as the runtime writes it at info (14 fields, bound with the
conversation's ids), written to a file in a temporary folder: by
``fanfold.runtime.logging.configure`` (structlog renders and writes the line itself),
and by the chain used before 2026-11-24 (structlog handing each event to stdlib
``logging``: a ``LogRecord``, a ``FileHandler``, a ``ProcessorFormatter``), rebuilt here
for the comparison. Also a line below the level (dropped by the filtering logger).

Run: ``.venv/bin/python bench/bench_logging.py [--lines 20000]``
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from fanfold.runtime.logging import configure

FIELDS: dict[str, Any] = {
    "call": 7,
    "attempt": 1,
    "profile": "default",
    "model": "gpt-4o-mini",
    "endpoint": "https://api.example.com/v1",
    "first_token_s": 0.412,
    "latency_s": 1.873,
    "input_tokens": 1520,
    "cached_tokens": 0,
    "output_tokens": 211,
    "stop_reason": "tool_use",
    "outcome": "replied",
}


def _stdlib_chain(json_file: Path) -> None:
    """The configuration before 2026-11-24 (JSON to a file through stdlib logging)."""
    handler = logging.FileHandler(json_file, encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(processor=structlog.processors.JSONRenderer())
    )
    root = logging.getLogger("fanfold")
    root.handlers[:] = [handler]
    root.propagate = False
    root.setLevel(logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        cache_logger_on_first_use=False,
    )


def _fanfold_chain(json_file: Path) -> None:
    configure(json_file=json_file, console=None)


def per_line(setup: Callable[[Path], None], lines: int, level: str) -> float:
    """Microseconds of process CPU per line."""
    with tempfile.TemporaryDirectory() as folder:
        setup(Path(folder) / "log.jsonl")
        log = structlog.get_logger("fanfold").bind(
            conversation_id="3f2a9c1b7d4e.12", parent_id="3f2a9c1b7d4e", depth=1
        )
        emit = getattr(log, level)
        begin = time.process_time()
        for _ in range(lines):
            emit("model_call", **FIELDS)
        spent = time.process_time() - begin
        logging.getLogger("fanfold").handlers.clear()
        configure(json_file=None, console=None)  # closes fanfold's file
        structlog.reset_defaults()
    return spent / lines * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000)
    args = parser.parse_args()
    for name, setup in (("stdlib chain (before)", _stdlib_chain), ("fanfold", _fanfold_chain)):
        written = per_line(setup, args.lines, "info")
        dropped = per_line(setup, args.lines, "debug")
        print(f"{name:<22} {written:6.1f} us per line written, {dropped:5.2f} us per line dropped")


if __name__ == "__main__":
    main()
