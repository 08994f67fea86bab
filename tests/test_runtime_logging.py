"""The runtime's structlog output: one bound ``transition`` line per logged step."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import structlog
from runtime_helpers import open_runtime, reply, script, spawn, submit, think

from fanfold.db import Store
from fanfold.runtime.logging import configure


async def test_every_step_has_one_transition_line_bound_to_its_conversation(
    tmp_path: Path, autojump_clock: object
) -> None:
    log_file = tmp_path / "log.jsonl"
    configure(json_file=log_file, console=None)
    try:
        provider = script(
            1.0,
            root=[reply("", spawn("a", "b")), reply("done")],
            c1=[reply("", think()), reply("", submit("A"))],
            c2=[reply("", submit("B"))],
        )
        async with open_runtime(tmp_path, provider, logger=structlog.get_logger("fanfold")) as rt:
            root = await rt.start("fan out")
            assert (await rt.wait(root)).text == "done"
    finally:
        logging.getLogger("fanfold").handlers.clear()
        structlog.reset_defaults()

    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    transitions = [line for line in lines if line["event"] == "transition"]
    with Store.open(tmp_path / "log.db") as store:
        rows = store.tree(root)
        expected = {
            (row.id, event.seq): (row, type(event.event).__name__)
            for row in rows
            for event in store.events(row.id)
            if event.seq > 0  # creation steps are committed before the actor logs
        }
    logged = {(line["conversation_id"], line["seq"]): line for line in transitions}
    assert len(logged) == len(transitions)  # one line per step
    assert set(logged) == set(expected)
    for key, line in logged.items():
        row, event_type = expected[key]
        assert line["event_type"] == event_type
        assert line["parent_id"] == row.parent_id
        assert line["depth"] == row.depth
        assert {"before", "after", "effects"} <= set(line)
