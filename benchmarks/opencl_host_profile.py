"""Where a decode step's host time goes on opencl:0: both models (random weights, real shapes and types,
as opencl_bench.py makes them), a few decode steps under cProfile, the functions with the most own time
inside ClProgram.run, and per step the time in run, in its kernel enqueues and in its uploads.

  python3 benchmarks/opencl_host_profile.py [--models smollm2,gemma3] [--steps 32]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import vulkan_bench as vb  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--steps", type=int, default=32)
    args = ap.parse_args()
    import pyopencl as cl

    from framework.model.model import Model
    from framework.plugins.opencl.device import devices
    from framework.plugins.opencl.program import ClProgram
    from framework.runtime.session import Session
    dev = devices()[0]
    specs = json.loads((ROOT / "benchmarks" / "vulkan_models.json").read_text())
    rng = np.random.default_rng(0)
    work = Path(tempfile.mkdtemp())
    for name in args.models.split(","):
        model = Model(vb.write_model(name, specs[name], work / f"{name}.gguf", rng))
        s = Session(model, [dev], n_ctx=1024, n_batch=16)
        tok = int(np.argmax(s.eval([int(t) for t in rng.integers(0, model.hp.n_vocab, 16)])))
        for _ in range(4):
            tok = int(np.argmax(s.eval([tok])))
        spent = {"run": 0.0, "enqueue": 0.0, "copy": 0.0, "flush": 0.0}
        real_run, real_enq, real_copy = ClProgram.run, cl.enqueue_nd_range_kernel, cl.enqueue_copy

        def timed(key, fn):
            def wrapper(*a, **k):
                t0 = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    spent[key] += time.perf_counter() - t0
            return wrapper
        ClProgram.run = timed("run", real_run)
        cl.enqueue_nd_range_kernel = timed("enqueue", real_enq)
        cl.enqueue_copy = timed("copy", real_copy)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for _ in range(args.steps):
            tok = int(np.argmax(s.eval([tok])))
        prof.disable()
        wall = time.perf_counter() - t0
        ClProgram.run, cl.enqueue_nd_range_kernel, cl.enqueue_copy = real_run, real_enq, real_copy
        kernels = sum(len(p.steps) for p in vb._programs(s, 1))
        n = args.steps
        print(f"{name}: {kernels} kernels a step; per step (under cProfile): wall {wall / n * 1e3:.2f} ms, in "
              f"ClProgram.run {spent['run'] / n * 1e3:.2f} ms, of which enqueue_nd_range_kernel "
              f"{spent['enqueue'] / n * 1e3:.2f} ms ({spent['enqueue'] / n / kernels * 1e6:.1f} us each), "
              f"enqueue_copy {spent['copy'] / n * 1e3:.2f} ms", flush=True)
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
