"""Enqueueing a program's kernels: clEnqueueNDRangeKernel called through ctypes with no event, where the
OpenCL library pyopencl loaded is found, else pyopencl's enqueue_nd_range_kernel. pyopencl makes and
wraps an event for every launch, which a decode step of a hundred kernels never waits on; the driver's
calls are the same otherwise (the kernel objects, their arguments and the queue are pyopencl's).
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

from .discovery import library


@lru_cache(maxsize=1)
def _library():
    """(clEnqueueNDRangeKernel, where it was found), or (None, why not)."""
    lib, where = library()
    fn = getattr(lib, "clEnqueueNDRangeKernel", None)
    if fn is None:
        return None, where if lib is None else f"{where} has no clEnqueueNDRangeKernel"
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn, where


def how() -> str:
    """How kernels are enqueued here, in words (for reports)."""
    fn, where = _library()
    return f"clEnqueueNDRangeKernel through ctypes, no event ({where})" if fn else \
        f"pyopencl's enqueue_nd_range_kernel ({where})"


class Launches:
    """A program's kernels, ready to enqueue in order (sizes as the C call takes them)."""

    def __init__(self, steps):
        self.fn, _ = _library()
        self.steps = steps
        if self.fn is not None:
            self.raw = [(ctypes.c_void_p(st.kernel.int_ptr), (ctypes.c_size_t * 1)(*st.gsize),
                         (ctypes.c_size_t * 1)(*st.lsize) if st.lsize else None) for st in steps]

    def enqueue(self, queue, flush_at, gate=None) -> None:
        """Every kernel, the queue flushed after each index in flush_at (a flush submits, it does not wait).
        With a gate (an event), the first kernel waits for it, and the in-order queue holds the rest behind."""
        if self.fn is None:
            import pyopencl as cl
            for i, st in enumerate(self.steps, 1):
                cl.enqueue_nd_range_kernel(queue, st.kernel, st.gsize, st.lsize,
                                           wait_for=[gate] if gate is not None and i == 1 else None)
                if i in flush_at:
                    queue.flush()
            return
        fn, q = self.fn, ctypes.c_void_p(queue.int_ptr)
        waits = (ctypes.c_void_p * 1)(gate.int_ptr) if gate is not None else None
        for i, (k, g, lsz) in enumerate(self.raw, 1):
            rc = fn(q, k, 1, None, g, lsz, 1, waits, None) if i == 1 and waits is not None else \
                fn(q, k, 1, None, g, lsz, 0, None, None)
            if rc:
                self._failed(i - 1, rc)
            if i in flush_at:
                queue.flush()

    def job(self, queue, flush_at, gate):
        """A run ahead's enqueueing, holding neither the program nor the device (the worker outlives neither);
        on the worker, flushed on the run's own cadence (the gate may open while it still enqueues, and the
        device then runs what was flushed)."""
        def job():
            self.enqueue(queue, flush_at, gate)
            queue.flush()
        return job

    def _failed(self, i: int, rc: int):
        from pyopencl import status_code
        names = {v: k for k, v in vars(status_code).items() if isinstance(v, int)}
        st = self.steps[i]
        raise RuntimeError(f"enqueueing {st.name} (global size {st.gsize[0]}, local {st.lsize}) failed: "
                           f"{names.get(rc, 'OpenCL error')} ({rc})")
