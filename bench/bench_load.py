"""Instructions to rebuild the states of a logged tree (what `show`, resume's outcome
redelivery and `load_state` pay), for weighing a snapshot policy (issue 21).

Loads, with ``Store.load_state`` (fingerprints verified, as the readers do), the root,
the sub-agents, all of them, or none (the process's fixed cost, to subtract):

    valgrind --tool=callgrind python -m bench.bench_load DB root|children|all|none

The tree: ``../shared/bench/instr_workload.py fanout 1000 DIR`` leaves it in DIR/tree.db.
The difference of a mode's count and ``none``'s is what the loads cost; results in
bench/README.md ("The ended conversation's snapshot").
"""

from __future__ import annotations

import sys

from fanfold.db import Store


def main(path: str, mode: str) -> None:
    store = Store.open(path, read_only=True)
    root = store.list_roots(limit=1)[0]
    rows = store.tree(root.id)
    for row in rows:
        wanted = mode == "all" or (mode == "root") == (row.depth == 0)
        if mode != "none" and wanted:
            store.load_state(row.id)
    print(len(rows), "conversations")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
