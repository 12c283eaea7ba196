"""The OpenCL side of a program's next run enqueued ahead (the skeleton's framework/backend/ahead.py says
how and when, and why a run ahead that is not taken is safe to release; docs/opencl.md gives the
figures): its gate is a user event the first kernel waits for, its marker an enqueued marker, its host
values written on a second queue behind that marker, and its value outputs copied back to a Stage without
waiting. FRAMEWORK_OPENCL_PREENQUEUE says where it is enqueued (inline, thread or off).
"""

from __future__ import annotations

import numpy as np

from ...backend import strided_copy


class Stage:
    """Pinned host memory (a buffer made with ALLOC_HOST_PTR, mapped once and never used by a kernel) that a
    program's value outputs are copied to at the end of each run that enqueues the next one ahead: a copy
    to pinned memory is a transfer that does not wait for the host, where pageable memory may be copied
    through a staging buffer by the host. Handles of an earlier run than the last read their own buffers."""

    def __init__(self, dev, sizes: dict[int, int]):
        import pyopencl as cl
        self.runs = 0              # runs copied here
        self.buffers, self.arrays, self.events = {}, {}, {}
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR
        for v, n in sizes.items():
            buf = self.buffers[v] = cl.Buffer(dev.context, flags, max(16, 4 * n))
            self.arrays[v], _ = cl.enqueue_map_buffer(dev.values_queue, buf, cl.map_flags.READ | cl.map_flags.WRITE,
                                                      0, (n,), np.float32, is_blocking=True)

    def copy(self, queue, outs: dict) -> int:
        """This run's value outputs copied here without waiting; the run's number, for the handles."""
        import pyopencl as cl
        self.runs += 1
        for v, (buf, _) in outs.items():
            self.events[v] = cl.enqueue_copy(queue, self.arrays[v], buf, is_blocking=False)
        return self.runs

    def values(self, run: int, v: int, offset: int, shape: tuple, strides: tuple | None) -> np.ndarray | None:
        """Value v of run `run` as an output sees it, or None where a later run has copied over it."""
        if run != self.runs:
            return None
        self.events[v].wait()
        flat = self.arrays[v]
        if not int(np.prod(shape)):
            return np.zeros(shape, flat.dtype)
        return strided_copy(flat, offset, shape, strides)


def open_gate(gate) -> None:
    import pyopencl as cl
    gate.set_status(cl.command_execution_status.COMPLETE)


def write_values(values_queue, uploads, marker):
    """The host values of a run taken from ahead, written once the run before (marker) is done, and waited for."""
    def write():
        import pyopencl as cl
        last = None
        for buf, data in uploads:
            last = cl.enqueue_copy(values_queue, buf, data, is_blocking=False, wait_for=[marker])
        if last is not None:
            last.wait()
    return write
