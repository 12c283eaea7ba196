"""What enqueueing a kernel costs the host on opencl:0: the rms_norm kernel of the base build (13 arguments,
one work-group) enqueued N times by pyopencl's enqueue_nd_range_kernel (an event made each time) and by
clEnqueueNDRangeKernel through ctypes with no event (framework/plugins/opencl/enqueue.py), the queue
flushed every 32; and what a flush adds (one kernel and a flush, N times). Medians of 5 repeats, the
queue finished between them (not timed).

  python3 benchmarks/opencl_enqueue_cost.py [--n 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    import pyopencl as cl

    from framework.plugins.opencl import enqueue, kernels
    from framework.plugins.opencl.device import devices
    dev = devices()[0]
    if not dev.available:
        raise SystemExit(f"opencl:0 unavailable: {dev.unavailable_reason}")
    prog = kernels.build(dev, kernels.base_options(dev))
    k = cl.Kernel(prog, "rms_norm")
    buf = dev.new_buffer(4 * 1024)
    for i, v in enumerate([buf, np.uint32(0), buf, np.uint32(0), buf, np.uint32(0), buf, np.uint32(0),
                           np.uint32(128), np.float32(1e-6), np.uint32(0), np.uint32(128), np.uint32(0)]):
        k.set_arg(i, v)
    q, rwg = dev.queue, kernels.RWG

    class St:
        kernel, gsize, lsize, name = k, (rwg,), (rwg,), "rms_norm"
    raw = enqueue.Launches([St] * args.n)
    flush_at = frozenset(range(32, args.n, 32))

    def timed(fn) -> float:
        out = []
        for _ in range(5):
            q.finish()
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) / args.n * 1e6)
        q.finish()
        return statistics.median(out)

    def by_pyopencl(every=32):
        for i in range(1, args.n + 1):
            cl.enqueue_nd_range_kernel(q, k, (rwg,), (rwg,))
            if i % every == 0:
                q.flush()
    ours = timed(lambda: raw.enqueue(q, flush_at))
    theirs = timed(by_pyopencl)
    flushed = timed(lambda: by_pyopencl(1))
    print(f"{dev.name} ({dev.data['device']}): {enqueue.how()}")
    print(f"enqueue, us a kernel (flushed every 32): pyopencl {theirs:.2f}, ctypes without an event {ours:.2f}; "
          f"a flush after every kernel adds {flushed - theirs:.2f} us")


if __name__ == "__main__":
    main()
