"""The fingerprint alone, per step of a 200-child fan-out driven by hand (no runtime):
version 6 (``v6``), version 7 (``v7``) or neither (``none``), between WARM and DONE.

    valgrind --tool=callgrind python bench/bench_fingerprint_v7.py v7   # minus ... none

Issue 34 (bench/README.md), whole process minus `none`: v6 65.8 k instructions per step,
v7 205.8 k (h32i's first v7: 220.8 k).
"""

import importlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from db_scenarios import BASH, Driver

from fanfold.db.codec import encode_event_compact
from fanfold.statemachine import ConversationCreated, Limits, ToolCall, UserMessaged

F = importlib.import_module("fanfold.db.fingerprint")
which = sys.argv[1]
n = 200
d = Driver()
d.create(ConversationCreated("r", cwd="/work", task=None, tools=(BASH,)))
d.feed("r", UserMessaged("go"))
tasks = [{"task": f"part {i}"} for i in range(n)]
d.states["r"] = d.states["r"].evolve(limits=Limits(max_concurrent=n, max_tasks_per_call=n))
d.reply("r", "delegating", ToolCall.of("r-spawn", "spawn_agents", {"tasks": tasks}))
children = d.spawn_children("r")
for c in children:
    d.run_child(c, "tool")
    d.deliver_outcome(c)
d.reply("r", "done")
steps = d.steps
payloads = [encode_event_compact(s.event, {}) for s in steps]
F.clear_cache()
print("WARM", flush=True)
t = time.perf_counter()
if which == "v6":
    for s, p in zip(steps, payloads, strict=True):
        F.step_fingerprint_v6(
            s.state, p, [type(e).__name__ for e in s.effects], snapshot=s.snapshot and s.seq > 0
        )
elif which == "v7":
    for s, p in zip(steps, payloads, strict=True):
        F.step_fingerprint(s.state, p, s.effects, s.before, whole=s.seq > 0 and s.before is None)
print("DONE", flush=True)
print(
    which,
    len(steps),
    "steps",
    round((time.perf_counter() - t) / len(steps) * 1e6, 1),
    "us/step",
    file=sys.stderr,
)
