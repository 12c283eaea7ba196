"""A program's next run enqueued ahead, behind a gate: right after a run's kernels, when the same program ran
twice in a row with the same buffers (decode, step after step), its outputs are copied back without
waiting, a marker is enqueued, and then the next run's kernels, the first one waiting for a user event
(the in-order queue holds the rest behind it). When that run comes with the same buffers, its host values
(tokens, positions, masks, cache rows) are written on a queue of their own once the marker says the run
before no longer reads them, and the gate is opened: no kernel is enqueued while the device waits. Enqueueing
costs the host 10-24 us a kernel on NVIDIA (docs/opencl.md); ahead of time it runs while the device
computes the run before.

Anything else that comes first (another program, other buffers, a read, an upload, closing, the device
collected) opens the gate as it is: the run ahead then replays the last run with that run's own host
values (its value buffers hold them: only this program's runs write them). A replay writes what that run
wrote: every cache row it writes was written with the same value by the run, from inputs the run had, and
rows it does not write are not touched. That holds where no kernel reads a written argument before the
first kernel that writes it (``replayable``; a cache write is an overwrite, SET_ROWS or CPY), which is
checked when the program is built. Its outputs go to buffers of its own (the pool's), returned when it is
released. So the queue is never left behind an unset event, and a released run changes nothing a
later run or read sees.

FRAMEWORK_OPENCL_PREENQUEUE=0 turns this off (every run enqueued when it comes); profiling
(FRAMEWORK_OPENCL_PROFILE) does too.
"""

from __future__ import annotations

import weakref

import numpy as np

from ...contract import DeviceTensor, contiguous_strides, settings
from .options import PREENQUEUE_ENV

STAGE_MAX = 8 << 20       # bytes of a run's value outputs copied back ahead of the next run (a decode step's logits)


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

    def copy(self, queue, outs: dict) -> dict:
        """This run's value outputs copied here without waiting: {value: (stage, run, value)} for the handles."""
        import pyopencl as cl
        self.runs += 1
        for v, (buf, _) in outs.items():
            self.events[v] = cl.enqueue_copy(queue, self.arrays[v], buf, is_blocking=False)
        return {v: (self, self.runs, v) for v in outs}


class StagedTensor(DeviceTensor):
    """An output whose values its run also copied to pinned host memory (Stage): ``staged`` is (stage, run,
    value). The device reads it back from there while no later run has copied over it."""

    __slots__ = ("staged",)

    def __init__(self, *a, staged=None, **k):
        super().__init__(*a, **k)
        self.staged = staged

    def values(self) -> np.ndarray | None:
        stage, run, v = self.staged
        if run != stage.runs:
            return None
        stage.events[v].wait()
        flat = stage.arrays[v]
        shape, strides = self.shape, self.strides or contiguous_strides(self.shape)
        if not int(np.prod(shape)):
            return np.zeros(shape, self.dtype)
        view = np.lib.stride_tricks.as_strided(flat[self.offset:], shape, tuple(s * flat.itemsize for s in strides))
        return np.array(view, copy=True)


class Pending:
    """A run enqueued ahead: its kernels wait for ``gate``; ``marker`` completes when the run before has."""

    def __init__(self, program, fixed: tuple, gate, marker, outs: dict, keep: tuple):
        # the program weakly: the device's finalizer holds this, and must not keep the device alive through it
        self.program = weakref.ref(program)
        self.fixed, self.gate, self.marker, self.outs = fixed, gate, marker, outs
        self.keep = keep          # the buffers its kernels were bound to, alive until it has run

    def start(self, values_queue, uploads) -> None:
        """Its host values written (after the run before has read its own), then the gate opened."""
        import pyopencl as cl
        try:
            last = None
            for buf, data in uploads:
                last = cl.enqueue_copy(values_queue, buf, data, is_blocking=False, wait_for=[self.marker])
            if last is not None:
                last.wait()
        finally:             # never left closed, even when a write failed
            self.release()

    def release(self) -> None:
        """Open the gate (once): with the values in place it runs as asked, else it replays the run before."""
        gate, self.gate = self.gate, None
        if gate is not None:
            import pyopencl as cl
            gate.set_status(cl.command_execution_status.COMPLETE)


def enabled(dev) -> bool:
    return dev.profile is None and bool(settings.read(PREENQUEUE_ENV))


def replayable(steps, written_args) -> bool:
    """Whether a replay of a run writes what the run wrote: no kernel reads a written argument before the first
    kernel that writes it (kernels that write a cache write its rows whole, then may read them)."""
    written: set[int] = set()
    for st in steps:
        written |= {i for i in st.arg_writes if i in written_args}
        if any(i in written_args and i not in written for i in st.arg_reads):
            return False
    return True


def release_held(held: list) -> None:
    """The device's run ahead, released (the device closing or collected)."""
    pending, held[0] = held[0], None
    if pending is not None:
        pending.release()
