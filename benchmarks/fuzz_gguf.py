"""Hostile GGUF files at scale: mutants of SmolLM2's GGUF (tests/gguf_mutants.py makes them) opened the way
`framework info` opens a file, in-process, under a time and a memory limit per file, and the counts by
outcome; then the mutants that load, through `framework run -m FILE -n 1 hi` in-process, with the real
tensor data. tests/test_hostile_files.py runs the same at a few hundred.

    .venv/bin/python benchmarks/fuzz_gguf.py                       # 10,000 mutants, 300 through the CLI
    .venv/bin/python benchmarks/fuzz_gguf.py -n 2000 --cli 100 --seed 7

Outcomes (info path): accepted, named (a ModelFileError naming the file), unnamed (one that does not),
raw (any other exception), hang (past --seconds), memory (past --memory-gib). CLI path: ran (the intact
file's text), ran_other (other text), named (one `error:` line, exit 2), unnamed, raw, hang, memory.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import gguf_mutants as G  # noqa: E402

from framework.model.default import model_path  # noqa: E402

BAD = ("raw", "hang", "memory", "unnamed")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--mutants", type=int, default=10_000)
    p.add_argument("--cli", type=int, default=300, help="accepted mutants to run through the CLI (0: none)")
    p.add_argument("--seed", type=int, default=20261201)
    p.add_argument("--seconds", type=float, default=6.0, help="time limit per file")
    p.add_argument("--memory-gib", type=float, default=4.0, help="memory limit per file, beyond what is mapped")
    p.add_argument("--examples", type=int, default=3, help="examples printed per outcome")
    args = p.parse_args()
    os.environ["FRAMEWORK_CACHE"] = "off"               # every mutant parsed afresh, nothing written
    os.environ.setdefault("FRAMEWORK_BLOCK_PLUGINS", "openvino,vulkan,xdna")     # `run` uses --backends cpu
    layout = G.scan(model_path("smollm2"))
    mutator = G.Mutator(layout, args.seed)
    memory = int(args.memory_gib * 2**30)
    tally, accepted = G.Tally(), []
    work = Path(tempfile.mkdtemp(prefix="fuzz-gguf-"))
    t0 = time.perf_counter()
    with G.memoized_tokenizers():
        for i in range(args.mutants):
            mutant = mutator.make()
            path = mutant.write(work / "m.gguf")
            outcome = G.open_like_info(path, args.seconds, memory)
            tally.add(mutant, outcome)
            if outcome.kind == "accepted" and len(accepted) < args.cli:
                accepted.append(mutant)
            if (i + 1) % 500 == 0:
                print(f"  {i + 1} mutants, {time.perf_counter() - t0:.0f} s: {dict(tally.counts)}", flush=True)
    info_seconds = time.perf_counter() - t0
    _report(f"info path: {args.mutants} mutants (seed {args.seed}), {info_seconds:.0f} s, "
            f"{args.seconds:g} s and {args.memory_gib:g} GiB a file", tally, args.examples)

    if accepted:
        intact = work / "intact.gguf"
        G.Mutant("intact", "", layout.header(), layout.path.stat().st_size).write(intact, layout, real_body=True)
        expected = G.run_cli(intact, 300, 8 << 30)
        if expected.kind != "ran":
            print(f"the intact file does not run: {expected}")
            return 1
        cli, t1 = G.Tally(), time.perf_counter()
        for i, mutant in enumerate(accepted):
            path = mutant.write(work / "m.gguf", layout, real_body=True)
            cli.add(mutant, G.run_cli(path, 300, 8 << 30, expected.message))
            if (i + 1) % 25 == 0:
                print(f"  {i + 1} through the CLI, {time.perf_counter() - t1:.0f} s: {dict(cli.counts)}", flush=True)
        _report(f"CLI path: {len(accepted)} accepted mutants through `framework run -m FILE -n 1 hi` (intact "
                f"prints {expected.message!r}), {time.perf_counter() - t1:.0f} s", cli, args.examples)
        tally.counts.update({f"cli:{k}": v for k, v in cli.counts.items()})
    for f in work.iterdir():
        f.unlink()
    work.rmdir()
    return 1 if any(tally.counts[k] or tally.counts[f"cli:{k}"] for k in BAD) else 0


def _report(title: str, tally: G.Tally, n_examples: int) -> None:
    print(f"\n{title}")
    for kind, n in sorted(tally.counts.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:<10} {n:>6}")
    print("  by mutation:")
    for kind, counts in sorted(tally.by_kind.items()):
        print(f"    {kind:<17} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for kind in ("raw", "hang", "memory", "unnamed", "ran_other", "named"):
        for mkind, detail, message in tally.examples.get(kind, [])[:n_examples]:
            print(f"  e.g. {kind}: [{mkind}] {detail}: {message[:300]}")


if __name__ == "__main__":
    sys.exit(main())
