"""msgspec measured against fanfold's hand-written event codec (issue 21). Measurement only.

The events of a real run (a root spawns N sub-agents with the scripted provider, each
does think, think, submit_result; a real SQLite file), read back with ``Store.raw_tree``
and decoded, are encoded and decoded per event by:

- ``fanfold``: ``encode_event_compact`` / ``decode_event``, as the log writes and reads
  them (blob references included);
- ``json-layer``: msgspec as the JSON layer under the codec. Decoding: the stored text
  parsed by ``msgspec.json.decode`` instead of the codec's strict ``json`` parser, then
  the codec's own document decoder. Encoding: the codec writes its text directly, with
  no JSON layer to swap; what msgspec can do there is write a document already built
  as lists (``msgspec.json.encode(doc)``, against ``json.dumps(doc)``), a lower bound
  that leaves out building the document from the attrs value;
- ``parse``: only the parse, the codec's strict ``json`` parser against
  ``msgspec.json.decode``;
- ``struct``: msgspec as a replacement of the codec for the most frequent event types
  (``ModelReplied``, ``ToolFinished``, ``SubAgentFinished``: 86 % of the events of a
  fan-out): array-like, tagged msgspec Structs mirroring them. ``struct-native`` is
  what it would cost if the reducer's events were Structs (encode a Struct, decode to
  one); ``struct-adapter`` keeps the attrs classes and converts to and from Structs
  around msgspec (and the bytes to the ``str`` the log column holds).

CPU time of every variant is taken side by side in one process (rounds interleaved, the
best round kept). With ``--callgrind`` each variant also runs in its own process under
``valgrind --tool=callgrind --instr-atstart=no``, collection switched on
(``callgrind_control -i on``) only around its measured loops: instructions per event,
the same whatever the load.

Run: ``.venv/bin/python -m bench.bench_msgspec [--n 200] [--rounds 7] [--callgrind]``.
msgspec is not a dependency of fanfold: without it the bench says so and stops.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from fanfold.db import codec
from fanfold.db.store import Store
from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.statemachine import (
    CancelReason,
    ChildFailed,
    ChildSucceeded,
    ErrorKind,
    Limits,
    ModelReplied,
    ModelReply,
    SubAgentFinished,
    ToolCall,
    ToolFinished,
    ToolResult,
    Usage,
)
from fanfold.tools.registry import ToolSet

# msgspec is no dependency of fanfold: the bench runs only where it is installed.
HAVE_MSGSPEC = importlib.util.find_spec("msgspec") is not None
if HAVE_MSGSPEC:
    import msgspec

STRUCT_TYPES = ("ModelReplied", "ToolFinished", "SubAgentFinished")
THINK = {"name": "think", "arguments": {"thought": "working"}}


# ------------------------------------------------------------------ the run


def _script(n: int) -> dict[str, Any]:
    return {
        "latency": 0.0,
        "agents": [
            {
                "match": {"path": "root"},
                "replies": [
                    {
                        "tool_calls": [
                            {
                                "name": "spawn_agents",
                                "arguments": {"tasks": [{"task": f"task {i}"} for i in range(n)]},
                            }
                        ]
                    },
                    {"text": "all done"},
                ],
            },
            {
                "match": {"depth": 1},
                "replies": [
                    {"tool_calls": [THINK]},
                    {"tool_calls": [THINK]},
                    {"tool_calls": [{"name": "submit_result", "arguments": {"result": "done"}}]},
                ],
            },
        ],
    }


def make_run(db: Path, n: int) -> str:
    """Run the fan-out into ``db``; the root's id."""

    async def run() -> str:
        limits = Limits(max_tasks_per_call=n, max_concurrent=n, max_rounds=n + 5)
        async with Runtime.open(
            str(db),
            ScriptedProvider(_script(n)),
            ToolSet.default(),
            limits=limits,
            logger=quiet_logger(),
        ) as runtime:
            root = await runtime.start("work", cwd=str(db.parent))
            await runtime.wait(root)
            return root

    return trio.run(run)


class Events:
    """The run's events as stored (text), decoded (attrs), parsed (lists) and as Structs."""

    def __init__(self, db: Path) -> None:
        store = Store.open(str(db), read_only=True)
        try:
            root = store.list_roots()[0].id
            logs = store.raw_tree(root)
        finally:
            store.close()
        self.blobs: dict[str, str] = dict(logs[0].blobs)
        self.texts = [event.payload for log in logs for event in log.events]
        # The snapshot each ended conversation stores (the only other document a
        # fan-out encodes on its write path: one per conversation).
        self.states = [
            codec.decode_state(log.snapshot_json, self.blobs)
            for log in logs
            if log.snapshot_json is not None
        ]
        self.types = [event.type for log in logs for event in log.events]
        self.values = [codec.decode_event(text, self.blobs) for text in self.texts]
        self.docs = [json.loads(text) for text in self.texts]
        self.structs = [
            to_struct(v) if t in STRUCT_TYPES else None
            for t, v in zip(self.types, self.values, strict=True)
        ]
        self.struct_texts = [ENCODER.encode(s) if s is not None else b"" for s in self.structs]
        self.by_type: dict[str, list[int]] = {}
        for i, name in enumerate(self.types):
            self.by_type.setdefault(name, []).append(i)


# ------------------------------------------------------------------ Structs


if HAVE_MSGSPEC:

    class ToolCallS(msgspec.Struct, array_like=True, frozen=True):
        id: str
        name: str
        arguments_json: str = "{}"

    class UsageS(msgspec.Struct, array_like=True, frozen=True):
        input_tokens: int = 0
        output_tokens: int = 0
        cached_input_tokens: int = 0

    class ModelReplyS(msgspec.Struct, array_like=True, frozen=True):
        text: str = ""
        tool_calls: tuple[ToolCallS, ...] = ()
        usage: UsageS = UsageS()
        stop_reason: str = "end_turn"
        stop_details: str = ""

    class ToolResultS(msgspec.Struct, array_like=True, frozen=True):
        tool_call_id: str
        name: str
        content: str
        is_error: bool = False

    class ChildSucceededS(msgspec.Struct, array_like=True, frozen=True, tag="ChildSucceeded"):
        result: str
        tokens: int = 0
        submitted: bool = True
        truncated: bool = False

    class ChildFailedS(msgspec.Struct, array_like=True, frozen=True, tag="ChildFailed"):
        error: str
        kind: ErrorKind
        reason: CancelReason | None = None
        tokens: int = 0

    # Top level: [type name, version, fields...], the version a field like any other.
    class ModelRepliedS(msgspec.Struct, array_like=True, frozen=True, tag="ModelReplied"):
        v: int
        call: int
        reply: ModelReplyS

    class ToolFinishedS(msgspec.Struct, array_like=True, frozen=True, tag="ToolFinished"):
        v: int
        call: int
        result: ToolResultS

    class SubAgentFinishedS(msgspec.Struct, array_like=True, frozen=True, tag="SubAgentFinished"):
        v: int
        child_id: str
        outcome: ChildSucceededS | ChildFailedS

    ENCODER = msgspec.json.Encoder()
    DECODER = msgspec.json.Decoder(ModelRepliedS | ToolFinishedS | SubAgentFinishedS)
    PARSER = msgspec.json.Decoder()
    V = codec.SCHEMA_VERSION

    def to_struct(value: Any) -> Any:
        """An attrs event of ``STRUCT_TYPES`` as its Struct (what an adapter does)."""
        kind = type(value)
        if kind is ModelReplied:
            r = value.reply
            u = r.usage
            return ModelRepliedS(
                V,
                value.call,
                ModelReplyS(
                    r.text,
                    tuple(ToolCallS(c.id, c.name, c.arguments_json) for c in r.tool_calls),
                    UsageS(u.input_tokens, u.output_tokens, u.cached_input_tokens),
                    r.stop_reason,
                    r.stop_details,
                ),
            )
        if kind is ToolFinished:
            t = value.result
            return ToolFinishedS(
                V, value.call, ToolResultS(t.tool_call_id, t.name, t.content, t.is_error)
            )
        o = value.outcome
        if type(o) is ChildSucceeded:
            out: Any = ChildSucceededS(o.result, o.tokens, o.submitted, o.truncated)
        else:
            out = ChildFailedS(o.error, o.kind, o.reason, o.tokens)
        return SubAgentFinishedS(V, value.child_id, out)

    def from_struct(s: Any) -> Any:
        """A Struct back as the reducer's attrs event."""
        kind = type(s)
        if kind is ModelRepliedS:
            r = s.reply
            u = r.usage
            return ModelReplied(
                s.call,
                ModelReply(
                    r.text,
                    tuple(ToolCall(c.id, c.name, c.arguments_json) for c in r.tool_calls),
                    Usage(u.input_tokens, u.output_tokens, u.cached_input_tokens),
                    r.stop_reason,
                    r.stop_details,
                ),
            )
        if kind is ToolFinishedS:
            t = s.result
            return ToolFinished(s.call, ToolResult(t.tool_call_id, t.name, t.content, t.is_error))
        o = s.outcome
        if type(o) is ChildSucceededS:
            out: Any = ChildSucceeded(o.result, o.tokens, o.submitted, o.truncated)
        else:
            out = ChildFailed(o.error, o.kind, o.reason, o.tokens)
        return SubAgentFinished(s.child_id, out)


# ------------------------------------------------------------------ variants

_DOCUMENT = codec._decode_document  # the codec's document decoder, after the parse
_WITH_BLOBS = codec._with_blobs


def variants(ev: Events) -> dict[str, Callable[[list[int]], None]]:
    """name -> a loop over the given event indices doing that variant's work once each."""
    texts, values, docs, blobs = ev.texts, ev.values, ev.docs, ev.blobs
    structs, struct_texts = ev.structs, ev.struct_texts
    types = codec.EVENT_TYPES
    compact = codec.encode_event_compact
    decode_event = codec.decode_event
    loads = codec.loads_strict
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    menc, mdec, sdec = ENCODER.encode, PARSER.decode, DECODER.decode

    def enc_fanfold(idx: list[int]) -> None:
        for i in idx:
            compact(values[i], {})

    def enc_stdlib_doc(idx: list[int]) -> None:
        for i in idx:
            dumps(docs[i])

    def enc_msgspec_doc(idx: list[int]) -> None:
        for i in idx:
            menc(docs[i]).decode()

    def enc_struct_native(idx: list[int]) -> None:
        for i in idx:
            menc(structs[i])

    def enc_struct_adapter(idx: list[int]) -> None:
        for i in idx:
            menc(to_struct(values[i])).decode()

    def dec_fanfold(idx: list[int]) -> None:
        for i in idx:
            decode_event(texts[i], blobs)

    def parse_stdlib(idx: list[int]) -> None:
        for i in idx:
            loads(texts[i])

    def parse_msgspec(idx: list[int]) -> None:
        for i in idx:
            mdec(texts[i])

    def dec_json_layer(idx: list[int]) -> None:
        for i in idx:
            _WITH_BLOBS(blobs, _DOCUMENT, mdec(texts[i]), types, "an event")

    def dec_struct_native(idx: list[int]) -> None:
        for i in idx:
            sdec(struct_texts[i])

    def dec_struct_adapter(idx: list[int]) -> None:
        for i in idx:
            from_struct(sdec(struct_texts[i]))

    states = ev.states
    state_docs = [json.loads(codec.encode_state_stored(state, {})) for state in states]

    def snap_fanfold(idx: list[int]) -> None:  # the snapshots, whatever ``idx``
        for state in states:
            codec.clear_memo()  # as at a conversation's end (see ``state_cpu``)
            codec.encode_state_stored(state, {})

    def snap_msgspec_doc(idx: list[int]) -> None:
        for doc in state_docs:
            menc(doc).decode()

    return {
        "snap fanfold": snap_fanfold,
        "snap msgspec(doc)": snap_msgspec_doc,
        "enc fanfold": enc_fanfold,
        "enc json.dumps(doc)": enc_stdlib_doc,
        "enc msgspec(doc)": enc_msgspec_doc,
        "enc struct-native": enc_struct_native,
        "enc struct-adapter": enc_struct_adapter,
        "dec fanfold": dec_fanfold,
        "parse fanfold json": parse_stdlib,
        "parse msgspec": parse_msgspec,
        "dec json-layer": dec_json_layer,
        "dec struct-native": dec_struct_native,
        "dec struct-adapter": dec_struct_adapter,
    }


SNAPSHOTS = {"snap fanfold", "snap msgspec(doc)"}  # per snapshot, not per event
STRUCT_ONLY = {"enc struct-native", "enc struct-adapter", "dec struct-native", "dec struct-adapter"}


def selections(ev: Events) -> dict[str, list[int]]:
    """The rows of the tables: each frequent type, the Struct types together, all."""
    out = {name: ev.by_type[name] for name in sorted(ev.by_type, key=lambda n: -len(ev.by_type[n]))}
    out["3 struct types"] = [i for i, t in enumerate(ev.types) if t in STRUCT_TYPES]
    out["all events"] = list(range(len(ev.types)))
    return out


def check(ev: Events) -> None:
    """Every variant reads back what it wrote (a bench of a wrong codec measures nothing)."""
    for i, value in enumerate(ev.values):
        assert codec.decode_event(codec.encode_event_compact(value, {}), ev.blobs) == value
        doc = PARSER.decode(ev.texts[i])
        assert doc == ev.docs[i]
        assert _WITH_BLOBS(ev.blobs, _DOCUMENT, doc, codec.EVENT_TYPES, "an event") == value
        if ev.structs[i] is not None:
            assert from_struct(DECODER.decode(ev.struct_texts[i])) == value


# ------------------------------------------------------------------ CPU time


def cpu_table(ev: Events, rounds: int) -> dict[tuple[str, str], float]:
    """(variant, selection) -> best ns per event over ``rounds`` interleaved rounds."""
    runs = variants(ev)
    rows = selections(ev)
    best: dict[tuple[str, str], float] = {}
    for _ in range(rounds):
        for row, idx in rows.items():
            for name, loop in runs.items():
                if name in SNAPSHOTS:
                    continue
                if name in STRUCT_ONLY and any(ev.types[i] not in STRUCT_TYPES for i in idx):
                    continue
                reps = max(1, 3000 // len(idx))
                start = time.process_time_ns()
                for _ in range(reps):
                    loop(idx)
                ns = (time.process_time_ns() - start) / (reps * len(idx))
                best[name, row] = min(ns, best.get((name, row), ns))
    return best


def state_cpu(ev: Events, rounds: int) -> tuple[float, float]:
    """Best ns per snapshot: (fanfold's ``encode_state_stored``, memo cleared first as at
    a conversation's end, where its messages were never encoded; ``msgspec.json.encode``
    of the same document parsed into lists, a lower bound for msgspec)."""
    docs = [json.loads(codec.encode_state_stored(state, {})) for state in ev.states]
    menc = ENCODER.encode
    fan = ms = float("inf")
    for _ in range(rounds):
        start = time.process_time_ns()
        for state in ev.states:
            codec.clear_memo()
            codec.encode_state_stored(state, {})
        fan = min(fan, (time.process_time_ns() - start) / len(ev.states))
        start = time.process_time_ns()
        for doc in docs:
            menc(doc).decode()
        ms = min(ms, (time.process_time_ns() - start) / len(docs))
    return fan, ms


# ------------------------------------------------------------------ instructions


def _child(db: Path, name: str, row: str, reps: int, go: Path) -> None:
    """Under callgrind: prepare, warm the variant, say READY, wait for collection to be
    switched on, run ``reps`` passes, say DONE, wait to be stopped."""
    ev = Events(db)
    idx = selections(ev)[row]
    loop = variants(ev)[name]
    loop(idx)  # warm: compiled emitters, memo, msgspec's type info
    print("READY", flush=True)
    while not go.exists():
        time.sleep(0.02)
    for _ in range(reps):
        loop(idx)
    print("DONE", flush=True)
    while go.exists():
        time.sleep(0.02)


def _instructions(db: Path, name: str, row: str, reps: int, work: Path, events: int) -> float:
    go = work / "go"
    go.unlink(missing_ok=True)
    out = work / "cg.out"
    proc = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "bench.bench_msgspec",
            "--child",
            str(db),
            name,
            row,
            str(reps),
            str(go),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("READY"):
            subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], capture_output=True)
            go.touch()
        elif line.startswith("DONE"):
            subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], capture_output=True)
            go.unlink()
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: {err[-500:]}")
    found = re.search(r"I\s+refs:\s+([\d,]+)", err)
    assert found, err[-500:]
    return int(found.group(1).replace(",", "")) / (reps * events)


# ------------------------------------------------------------------ main


def main() -> None:
    if not HAVE_MSGSPEC:
        print("bench_msgspec: msgspec is not installed (pip install msgspec); skipped.")
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        path, name, row, reps, go = sys.argv[2:7]
        _child(Path(path), name, row, int(reps), Path(go))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200, help="sub-agents of the fan-out")
    parser.add_argument("--rounds", type=int, default=7, help="CPU-time rounds (best kept)")
    parser.add_argument("--callgrind", action="store_true", help="also count instructions")
    parser.add_argument("--reps", type=int, default=3, help="passes counted under callgrind")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_msgspec-"))
    try:
        db = work / "tree.db"
        make_run(db, args.n)
        ev = Events(db)
        check(ev)
        counts = Counter(ev.types)
        print(f"fan-out of {args.n}: {len(ev.types)} events, msgspec {msgspec.__version__}")
        for name, count in counts.most_common():
            size = sum(len(ev.texts[i]) for i in ev.by_type[name]) // count
            print(f"  {name:22} {count:5}  {size:4} chars stored on average")
        best = cpu_table(ev, args.rounds)
        rows = list(selections(ev))
        names = [name for name in variants(ev) if name not in SNAPSHOTS]
        print("\nCPU ns per event (best of rounds, one process; ratio to fanfold's codec)")
        print(f"{'variant':22}" + "".join(f"{r[:17]:>19}" for r in rows))
        for name in names:
            ref = "enc fanfold" if name.startswith("enc") else "dec fanfold"
            cells = []
            for r in rows:
                ns = best.get((name, r))
                cells.append(
                    f"{'-':>19}"
                    if ns is None
                    else f"{ns:9.0f} ({ns / best[ref, r]:4.2f}x)".rjust(19)
                )
            print(f"{name:22}" + "".join(cells))
        fan, ms = state_cpu(ev, args.rounds)
        print(
            f"\nsnapshot of an ended conversation ({len(ev.states)}): fanfold {fan:.0f} ns,"
            f" msgspec(doc) {ms:.0f} ns ({ms / fan:.2f}x)"
        )
        if args.callgrind:
            if shutil.which("valgrind") is None:
                print("\nvalgrind is not installed: no instruction counts")
                return
            print("\ninstructions per event (callgrind, each variant its own process)")
            for name in sorted(SNAPSHOTS):
                per_state = _instructions(db, name, "all events", args.reps, work, len(ev.states))
                print(f"  {'per snapshot':15} {name:22} {per_state:10.0f}", flush=True)
            for row in ("3 struct types", "all events"):
                for name in names:
                    if row == "all events" and name in STRUCT_ONLY:
                        continue
                    events = len(selections(ev)[row])
                    per_event = _instructions(db, name, row, args.reps, work, events)
                    print(f"  {row:15} {name:22} {per_event:10.0f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
