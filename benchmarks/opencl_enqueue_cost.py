"""What enqueueing a kernel costs the host on opencl:0, the bound of its decode step (docs/opencl.md).

- the rms_norm kernel of the base build (13 arguments, one work-group) enqueued N times by pyopencl's
  enqueue_nd_range_kernel (an event made each time) and by clEnqueueNDRangeKernel through ctypes with no
  event (framework/plugins/opencl/enqueue.py), the queue flushed every 32; and what a flush adds (one
  kernel and a flush, N times);
- with --by-arguments, how the cost follows a kernel's arguments: kernels of 1 to 60 buffer arguments
  (distinct buffers, one buffer repeated, sub-buffers of one buffer, SVM pointers) and of 1 buffer with
  16 to 60 scalars, and by global size. A decode step's fused kernels take 30 to 60 arguments: whether
  packing them (weights in one buffer with offsets, scalars in one small buffer) would cut the enqueue
  is what this settles;
- with --threads T, T host threads enqueueing at once, each on its own in-order queue of the same
  context (ctypes lets go of the GIL in the call): the host time a kernel over all of them, against one
  thread, says whether the driver's enqueue runs in parallel or behind one lock.

Medians of 5 repeats, the queues finished between them (not timed). Runs on PoCL too (a try of the
script only: those are not GPU figures).

  python3 benchmarks/opencl_enqueue_cost.py [--n 2000] [--by-arguments] [--threads 2]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _median_us(fn, n: int, finish) -> float:
    """Median host microseconds a kernel of fn() (which enqueues n), over 5 repeats."""
    out = []
    for _ in range(5):
        finish()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    finish()
    return statistics.median(out)


def _raw_loop(queue, kernel, n: int, gsize: int = 128, lsize: int = 128, every: int = 8):
    """n enqueues of kernel by the C call with no event, a flush every `every`."""
    from framework.plugins.opencl import enqueue
    fn, _ = enqueue._library()
    kp, qp = ctypes.c_void_p(kernel.int_ptr), ctypes.c_void_p(queue.int_ptr)
    g, lsz = (ctypes.c_size_t * 1)(gsize), (ctypes.c_size_t * 1)(lsize)

    def loop(kernel=kernel):                    # holds the kernel: the C call has only its pointer
        for i in range(1, n + 1):
            rc = fn(qp, kp, 1, None, g, lsz, 0, None, None)
            if rc:
                from pyopencl import status_code
                names = {v: k for k, v in vars(status_code).items() if isinstance(v, int)}
                raise RuntimeError(f"enqueueing {kernel.function_name} (global size {gsize}, local {lsize}) failed on "
                                   f"enqueue {i} of {n}: {names.get(rc, 'OpenCL error')} ({rc})")
            if i % every == 0:
                queue.flush()
    return loop


def _source(buffers: int, scalars: int) -> str:
    """A kernel reading one float of every buffer and every scalar, so none is unused."""
    params = [f"global float* b{i}" for i in range(buffers)] + [f"uint s{i}" for i in range(scalars)]
    terms = [f"b{i}[0]" for i in range(1, buffers)] + [f"(float)s{i}" for i in range(scalars)] + ["1.0f"]
    return f"kernel void k({', '.join(params)}) {{ b0[get_global_id(0)] = {' + '.join(terms)}; }}"


def by_arguments(dev, n: int) -> None:
    import pyopencl as cl
    ctx, q = dev.context, dev.queue
    bufs = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 1 << 16) for _ in range(60)]
    big = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 64 << 20)
    align = max(dev.cl_device.mem_base_addr_align // 8, 1 << 12)

    def kernel(nb, ns, args):
        k = cl.Kernel(cl.Program(ctx, _source(nb, ns)).build(), "k")
        for i, a in enumerate(args):
            k.set_arg(i, a)
        for i in range(ns):
            k.set_arg(nb + i, np.uint32(i))
        return k

    cases = [(f"{nb} buffers, distinct", nb, 0, bufs[:nb]) for nb in (1, 4, 8, 16, 32, 60)]
    cases += [("32 buffers, one buffer repeated", 32, 0, [bufs[0]] * 32),
              ("32 sub-buffers of one buffer", 32, 0, [big.get_sub_region(i * align, align) for i in range(32)])]
    cases += [(f"1 buffer, {ns} scalars", 1, ns, bufs[:1]) for ns in (16, 32, 60)]
    cases += [("8 buffers, 24 scalars", 8, 24, bufs[:8])]
    try:
        svms = [cl.SVM(cl.csvm_empty(ctx, 1 << 14, np.float32)) for _ in range(32)]
        cases += [("32 SVM pointers", 32, 0, svms)]
    except Exception as e:                          # noqa: BLE001 - a driver without SVM says so below
        print(f"SVM pointers: not measured ({type(e).__name__}: {e})")
    for label, nb, ns, args in cases:
        k = kernel(nb, ns, args)
        print(f"  {label:34s} {_median_us(_raw_loop(q, k, n), n, q.finish):7.2f} us a kernel", flush=True)
    k = kernel(1, 0, [big])
    for groups in (1, 132, 1056):
        us = _median_us(_raw_loop(q, k, n, 128 * groups), n, q.finish)
        print(f"  {'1 buffer, ' + str(groups) + ' work-groups':34s} {us:7.2f} us a kernel", flush=True)


def by_threads(dev, n: int, threads: int) -> None:
    import pyopencl as cl
    ctx = dev.context
    queues = [cl.CommandQueue(ctx, dev.cl_device) for _ in range(threads)]
    bufs = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 1 << 16) for _ in range(8)]
    prog = cl.Program(ctx, _source(8, 8)).build()

    def kernel():
        k = cl.Kernel(prog, "k")               # a kernel object each: one is not to be shared by threads
        for i, b in enumerate(bufs):
            k.set_arg(i, b)
        for i in range(8):
            k.set_arg(8 + i, np.uint32(i))
        return k
    loops = [_raw_loop(q, kernel(), n) for q in queues]

    def finish_all():
        for q in queues:
            q.finish()

    def together():
        ts = [threading.Thread(target=loop) for loop in loops]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    one = _median_us(loops[0], n, finish_all)
    all_ = _median_us(together, n * threads, finish_all)
    print(f"  8 buffers, 8 scalars: 1 thread {one:.2f} us a kernel; {threads} threads on {threads} queues "
          f"{all_:.2f} us a kernel over all ({one / all_:.2f}x the one thread's rate)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--by-arguments", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
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

    def by_pyopencl(every=32):
        for i in range(1, args.n + 1):
            cl.enqueue_nd_range_kernel(q, k, (rwg,), (rwg,))
            if i % every == 0:
                q.flush()
    ours = _median_us(lambda: raw.enqueue(q, flush_at), args.n, q.finish)
    theirs = _median_us(by_pyopencl, args.n, q.finish)
    flushed = _median_us(lambda: by_pyopencl(1), args.n, q.finish)
    print(f"{dev.name} ({dev.data['device']}): {enqueue.how()}")
    print(f"enqueue, us a kernel (flushed every 32): pyopencl {theirs:.2f}, ctypes without an event {ours:.2f}; "
          f"a flush after every kernel adds {flushed - theirs:.2f} us")
    if enqueue._library()[0] is None and (args.by_arguments or args.threads):
        raise SystemExit("--by-arguments and --threads need the C call through ctypes (enqueue.how() above)")
    if args.by_arguments:
        print("by arguments (ctypes, no event, flushed every 8):")
        by_arguments(dev, args.n)
    if args.threads:
        print(f"by threads ({args.threads}, each its own in-order queue):")
        by_threads(dev, args.n, args.threads)


if __name__ == "__main__":
    main()
