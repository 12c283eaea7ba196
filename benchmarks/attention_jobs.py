"""How the cpu plugin's decode attention splits its work, measured in a model's real steps: `attention.by_key_jobs`'
choice (as few runs of a query's heads as give every thread a job, each key's and value's row read once for all
the heads of a run, value rows prefetched for several queries), the same without the prefetch, a query a job
with all its heads whatever the threads, and a head a job over the threads (the earlier way). The four take turns
on one batch of N sequences (each its own prompt of P tokens, as a server's batched step), a few steps each, so
the host's drift falls on all alike; the same bits every way (tests/test_cpu_quantized.py).

    python benchmarks/attention_jobs.py --model smollm2 --rows 1,8 --prompt 64,300

Prints, for each case, the median step and the median of the step's attention calls (their wall time, summed).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba

from framework.model.default import resolve_model
from framework.model.model import Model
from framework.plugins.cpu import attention
from framework.registry import default_registry
from framework.runtime.batch import Batch, Part
from framework.runtime.session import Session

CHOICE, PLAIN = attention.by_key_jobs, attention.flash_attn_ext


def heads(t, h, work):
    """A head a job, no prefetch: the earlier way (the build by_key_jobs picks for the work)."""
    return CHOICE(t, h, work)[0], h, False


def no_prefetch(t, h, work):
    build, parts, _ = CHOICE(t, h, work)
    return build, parts, False


def whole_queries(t, h, work):
    """A query a job with all its heads."""
    return CHOICE(t, h, work)[0], 1, t > 1


WAYS = {"the choice": CHOICE, "no prefetch": no_prefetch, "a query a job": whole_queries, "a head a job": heads}


def timed_attention(spent: list):
    def run(*args, **kw):
        t0 = time.perf_counter()
        out = PLAIN(*args, **kw)
        spent[0] += time.perf_counter() - t0
        return out
    return run


def case(model: Model, rows: int, prompt: int, turns: int, steps: int) -> dict:
    cells = (prompt + (turns + 1) * steps * len(WAYS) + 8) * rows
    b = Batch(Session(model, default_registry().select("cpu"), n_ctx=cells, n_batch=prompt, out_rows=rows))
    for seq in range(rows):
        b.step([Part(seq, [100 + (seq * 7 + i) % 1000 for i in range(prompt)])])
    spent = [0.0]
    attention.flash_attn_ext = timed_attention(spent)
    got = {name: ([], []) for name in WAYS}
    try:
        for turn in range(-1, turns):              # turn -1 warms every way up, unrecorded
            for name in (list(WAYS) if turn % 2 == 0 else list(WAYS)[::-1]):
                attention.by_key_jobs = WAYS[name]
                for _ in range(steps):
                    spent[0] = 0.0
                    t0 = time.perf_counter()
                    b.step([Part(seq, [1]) for seq in range(rows)])
                    if turn >= 0:
                        got[name][0].append(time.perf_counter() - t0)
                        got[name][1].append(spent[0])
    finally:
        attention.by_key_jobs, attention.flash_attn_ext = CHOICE, PLAIN
    return {name: (statistics.median(a) * 1e3, statistics.median(s) * 1e3) for name, (a, s) in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="a packaged model's name or a GGUF file (default: smollm2)")
    ap.add_argument("--rows", default="1,8", help="sequences stepped together, comma-separated (default: 1,8)")
    ap.add_argument("--prompt", default="64,300", help="prompt tokens of each sequence (default: 64,300)")
    ap.add_argument("--threads", type=int, default=2, help="the cpu plugin's threads (default: 2)")
    ap.add_argument("--turns", type=int, default=12, help="turns of the four ways (default: 12)")
    ap.add_argument("--steps", type=int, default=4, help="steps a way takes each turn (default: 4)")
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    model = Model(resolve_model(args.model))
    print(f"{args.model}, cpu, {args.threads} threads; medians of {args.turns} x {args.steps} steps a way, in turns")
    for rows in (int(r) for r in args.rows.split(",")):
        for prompt in (int(p) for p in args.prompt.split(",")):
            got = case(model, rows, prompt, args.turns, args.steps)
            base = got["a head a job"]
            for name, (step, att) in got.items():
                print(f"  {rows} sequence(s) after {prompt} tokens, {name}: step {step:.2f} ms "
                      f"({step / base[0]:.2f}x), attention {att:.2f} ms ({att / base[1]:.2f}x)")


if __name__ == "__main__":
    main()
