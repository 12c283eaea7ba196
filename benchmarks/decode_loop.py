"""A plain decode loop on the cpu plugin for a profiler to watch (no timing wrappers around the ops, as
cpu_profile.py has): a prompt of --prompt tokens, then decode steps for --seconds, rewound every 32 tokens so
that every step sees the same window, and the mean step time. With --rows N, N sequences with prompts of their
own share one cache and step together (runtime/batch.py, as a server's batched step), --steps steps of N rows:

    py-spy record --nonblocking --rate 500 --threads --format raw -o RAW -- \
        python benchmarks/decode_loop.py -m smollm2 --seconds 12
    python benchmarks/pyspy_share.py RAW MainThread Session.eval mul_mat flash_attn_ext ReferenceProgram.run"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np

from framework.model.default import resolve_model
from framework.model.model import Model
from framework.registry import default_registry
from framework.runtime.session import Session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2", help="a packaged model's name or a GGUF file")
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens before the decode steps (default: 256)")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long to decode (default: 10)")
    ap.add_argument("--threads", type=int, default=2, help="the cpu plugin's threads (default: 2)")
    ap.add_argument("--rows", type=int, default=1, help="sequences stepped together (default: 1)")
    ap.add_argument("--steps", type=int, default=100, help="with --rows: the timed steps (default: 100)")
    ap.add_argument("--backends", default="cpu", help="the device list (default: cpu); openvino's threads: "
                    "FRAMEWORK_OPENVINO_THREADS")
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    model = Model(resolve_model(args.model))
    if args.rows > 1:
        return batched(model, args)
    s = Session(model, default_registry().select(args.backends), n_ctx=args.prompt + 64, n_batch=args.prompt)
    s.eval([100 + i % 1000 for i in range(args.prompt)])
    base, tok, n = s.n_past, 1, 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        if s.n_past >= base + 32:
            s.rewind(base)
        tok = int(np.argmax(s.eval([tok])))
        n += 1
    print(f"{args.model} on {args.backends}, {args.threads} threads, after {args.prompt} tokens: {n} decode steps, "
          f"{(time.perf_counter() - t0) / n * 1e3:.2f} ms a step")


def batched(model: Model, args) -> None:
    """--rows sequences of --prompt tokens each (distinct), then --steps steps of one token each, timed after 3."""
    from framework.runtime.batch import Batch, Part
    ctx = args.prompt + args.steps + 8
    b = Batch(Session(model, default_registry().select(args.backends), n_ctx=ctx * args.rows, n_batch=args.prompt,
                      out_rows=args.rows))
    for seq in range(args.rows):
        b.step([Part(seq, [100 + (seq * 7 + i) % 1000 for i in range(args.prompt)])])
    for _ in range(3):
        b.step([Part(seq, [1]) for seq in range(args.rows)])
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        b.step([Part(seq, [1]) for seq in range(args.rows)])
        times.append(time.perf_counter() - t0)
    # the median too: a device that compiles a program when the cache passes a length (openvino) has one slow step
    print(f"{args.model} on {args.backends}, {args.threads} threads, {args.rows} sequences after {args.prompt} tokens "
          f"each: {args.steps} steps, {sum(times) / args.steps * 1e3:.2f} ms a step (median "
          f"{statistics.median(times) * 1e3:.2f})")


if __name__ == "__main__":
    main()
