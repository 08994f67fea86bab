"""CPU per child outcome at a parent with N children: the reducer and the fingerprint.

A root spawns N sub-agents in one ``spawn_agents`` call (all running at once, no
deadlines) and receives their N outcomes one by one. For each outcome this measures
the process CPU time of ``transition`` and of the state fingerprint that the log
stores with the step, in the version written now (3: children hashed item by item)
and in version 2 (the whole state's encoding, children included, on every step).
Nothing here is I/O: it is what a parent's bookkeeping costs per step as N grows.

Run: ``.venv/bin/python bench/bench_fanin.py [--n 100,1000,10000]``
"""

from __future__ import annotations

import argparse
import gc
import time

import fanfold.statemachine as sm
from fanfold.db.fingerprint import clear_cache, fingerprint, fingerprint_v2


def waiting_root(n: int) -> sm.Conversation:
    """A root waiting on n running children."""
    limits = sm.Limits(max_concurrent=n, max_tasks_per_call=n, child_timeout=None)
    created = sm.ConversationCreated(
        conversation_id="root", cwd="/work", system_prompt="", limits=limits, tools=()
    )
    state, _ = sm.start(created)
    state, _ = sm.transition(state, sm.UserMessaged("go"))
    assert isinstance(state.phase, sm.LlmRequesting)
    tasks = [{"task": f"task {i}"} for i in range(n)]
    call = sm.ToolCall.of("s", "spawn_agents", {"tasks": tasks})
    reply = sm.ModelReply("", (call,), sm.Usage())
    state, _ = sm.transition(state, sm.ModelReplied(state.phase.call, reply))
    assert isinstance(state.phase, sm.AwaitingSubAgents)
    return state


def measure(n: int) -> dict[str, float]:
    """Microseconds of CPU per outcome: reducer, fingerprint v3, fingerprint v2."""
    state = waiting_root(n)
    outcomes = [sm.SubAgentFinished(f"root.{i + 1}", sm.ChildSucceeded("ok")) for i in range(n)]
    states = []
    gc.collect()
    begin = time.process_time()
    for event in outcomes[:-1]:  # the last one ends the wait: a different step
        state, _ = sm.transition(state, event)
        states.append(state)
    reducer = time.process_time() - begin
    results = {"reducer": reducer}
    for name, function in (("fingerprint v3", fingerprint), ("fingerprint v2", fingerprint_v2)):
        clear_cache()
        # v2 at N = 10000 takes minutes: every 10th state is enough for its mean.
        sample = states if name.endswith("v3") or n < 10_000 else states[::10]
        begin = time.process_time()
        for s in sample:
            function(s)
        results[name] = (time.process_time() - begin) * len(states) / len(sample)
    return {k: v / len(states) * 1e6 for k, v in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="100,1000,10000", help="children (comma-separated)")
    args = parser.parse_args()
    print(f"{'N':>6}  {'reducer':>10}  {'fingerprint v3':>15}  {'fingerprint v2':>15}")
    for n in (int(x) for x in args.n.split(",")):
        r = measure(n)
        print(
            f"{n:>6}  {r['reducer']:>7.1f} us  {r['fingerprint v3']:>12.1f} us"
            f"  {r['fingerprint v2']:>12.1f} us"
        )


if __name__ == "__main__":
    main()
