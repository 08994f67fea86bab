"""A stratified random sample of the pure core's logic mutants, drawn as tests/README.md
("Mutation testing") describes, and the score of a finished run.

``python bench/mutation_sample.py draw SEED N < names`` reads mutant names (``mutmut
results --all true``, one ``name: status`` a line) and prints the first N of the
sample: the names sorted, shuffled per file (files in name order, one
``random.Random(SEED)`` for all), interleaved so that every prefix holds each file in
proportion (next: the file with the least (taken + 1) / size, ties by name). The
import-time functions no test can switch on (``IMPORT_TIME``) are left out.

``python bench/mutation_sample.py score SAMPLE [EQUIVALENT] < results`` counts the
statuses of the sample's names in ``mutmut results --all true`` and prints the score
with its 95 % Wilson interval, raw and without the names listed in EQUIVALENT.
"""

from __future__ import annotations

import math
import random
import sys
from collections import Counter

# Functions run while their module is imported (they build TABLE, generate evolve):
# mutmut's trampolines cannot switch their mutants on under a test.
IMPORT_TIME = (
    "table.x__cell__mutmut_",
    "table.x__row__mutmut_",
    "table.x__stale__mutmut_",
    "table.x__written_off__mutmut_",
    "state.x__compile_evolve__mutmut_",
)
# A timeout is an infinite loop; a "segfault" a test process the mutant killed (a
# loop growing a list until memory ran out): both detected.
DETECTED = ("killed", "timeout", "segfault")


def _file(name: str) -> str:
    # fanfold.statemachine.permissions.x_refusal__mutmut_3 -> permissions
    return name.split(".x")[0].rsplit(".", 1)[-1]


def logic_mutants(names: list[str]) -> list[str]:
    """The names without the import-time functions' mutants."""
    return sorted(n for n in names if not any(f".{marker}" in n for marker in IMPORT_TIME))


def draw(names: list[str], seed: int, count: int) -> list[str]:
    """The first ``count`` names of the stratified sample of ``names``."""
    rng = random.Random(seed)
    by_file: dict[str, list[str]] = {}
    for name in sorted(names):
        by_file.setdefault(_file(name), []).append(name)
    for file in sorted(by_file):
        rng.shuffle(by_file[file])
    taken = dict.fromkeys(by_file, 0)
    sample: list[str] = []
    while len(sample) < min(count, len(names)):
        open_files = [f for f in sorted(by_file) if taken[f] < len(by_file[f])]
        file = min(open_files, key=lambda f: ((taken[f] + 1) / len(by_file[f]), f))
        sample.append(by_file[file][taken[file]])
        taken[file] += 1
    return sample


def wilson(hits: int, total: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95 % Wilson score interval of hits / total."""
    if total == 0:
        return (0.0, 1.0)
    p = hits / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return (centre - half, centre + half)


def _statuses(lines: list[str]) -> dict[str, str]:
    result = {}
    for line in lines:
        name, _, status = line.strip().partition(": ")
        if name:
            result[name] = status.strip()
    return result


def main(argv: list[str]) -> int:
    """``draw SEED N`` or ``score SAMPLE [EQUIVALENT]``, reading stdin."""
    if len(argv) >= 3 and argv[0] == "draw":
        names = logic_mutants(list(_statuses(sys.stdin.read().splitlines())))
        print(f"# {len(names)} logic mutants", file=sys.stderr)
        print("\n".join(draw(names, int(argv[1]), int(argv[2]))))
        return 0
    if len(argv) >= 2 and argv[0] == "score":
        statuses = _statuses(sys.stdin.read().splitlines())
        with open(argv[1], encoding="utf-8") as handle:
            sample = [line.strip() for line in handle if line.strip()]
        equivalent: set[str] = set()
        if len(argv) > 2:
            with open(argv[2], encoding="utf-8") as handle:
                equivalent = {line.split()[0] for line in handle if line.strip()}
        counts = Counter(statuses.get(name, "missing") for name in sample)
        # A mutant no selected test reaches ("no tests") is one the suite misses.
        done = [n for n in sample if statuses.get(n) in (*DETECTED, "survived", "no tests")]
        hits = sum(statuses[n] in DETECTED for n in done)
        print(f"sample {len(sample)}: {dict(counts)}")
        low, high = wilson(hits, len(done))
        print(
            f"finished {len(done)}: {hits} detected, "
            f"{hits / max(1, len(done)):.1%} [{low:.1%}, {high:.1%}]"
        )
        rest = [n for n in done if n not in equivalent]
        hits = sum(statuses[n] in DETECTED for n in rest)
        low, high = wilson(hits, len(rest))
        print(
            f"without {len(done) - len(rest)} equivalent: {hits} of {len(rest)}, "
            f"{hits / max(1, len(rest)):.1%} [{low:.1%}, {high:.1%}]"
        )
        by_file = Counter(_file(n) for n in done)
        hit_file = Counter(_file(n) for n in done if statuses[n] in DETECTED)
        print(
            ", ".join(
                f"{f} {hit_file[f]}/{by_file[f]}"
                for f in sorted(by_file, key=lambda f: -by_file[f])
            )
        )
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
