"""The share of one thread's samples that pass through named functions, from py-spy's raw output:

    py-spy record --pid PID --duration 15 --rate 200 --threads --format raw -o RAW
    python benchmarks/pyspy_share.py RAW framework-compute Session.reserve_shapes check_memory Batch.step

A sample counts for a function when any frame of its stack is that function (by its qualified name, as py-spy
writes it); the thread is the one whose name contains the second argument."""

from __future__ import annotations

import re
import sys
from collections import Counter


def shares(raw: str, thread: str, functions: list[str]) -> tuple[int, Counter]:
    total, hits = 0, Counter()
    for line in open(raw, encoding="utf-8"):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        frames = stack.split(";")
        if thread not in frames[0]:
            continue
        total += int(n)
        names = {re.sub(r" \(.*", "", f) for f in frames[1:]}
        for fn in functions:
            if fn in names:
                hits[fn] += int(n)
    return total, hits


def main() -> int:
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    total, hits = shares(sys.argv[1], sys.argv[2], sys.argv[3:])
    print(f"{total} samples of the thread {sys.argv[2]!r}")
    for fn in sys.argv[3:]:
        print(f"{fn}: {hits[fn]} samples, {100 * hits[fn] / max(total, 1):.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
