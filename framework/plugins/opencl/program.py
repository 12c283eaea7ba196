"""A compiled fragment: its steps (the skeleton's Program, lowered through lowering.py's kernel table) as
kernel objects of their own, enqueued in order on the device's in-order queue with no host
synchronisation between them (enqueue.py says how). The queue is flushed on a cadence (flush_points):
NVIDIA's driver holds enqueued kernels back until a flush, so the device starts while the host still
enqueues. Each launch owns its cl.Kernel, so its arguments stay set between runs: a run sets only those
whose buffer or offset changed (none, decode step after decode step). A program run twice in a row with
the same buffers enqueues its next run ahead, behind a user event (the skeleton's ahead.py; preenqueue.py
holds the OpenCL side). FRAMEWORK_OPENCL_PROFILE=1 adds up every launch's device time per kernel in
``device.profile``. docs/opencl.md says more, with the figures.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...backend import AheadProgram, KernelTable, Pending, Program
from . import fused, preenqueue
from .enqueue import Launches
from .kernels import build
from .lowering import DIALECT
from .signatures import KERNELS, params

# the kernel table the skeleton's lowering asks: the shared C kernels' ops (lowering.py), the fused groups
TABLE = KernelTable(DIALECT.ops(), fused.lower_group, fused.plan)
FLUSH_FIRST = 2          # kernels enqueued before the first flush
FLUSH_EVERY = 8          # kernels between two flushes after it (one costs about 1.3 us on the H200)
FLUSH_LAST = (4, 2)      # kernels before the end at which the queue is flushed too


def flush_points(n: int) -> frozenset[int]:
    """After which of a run's n kernels (counted from 1) the queue is flushed, the last one apart."""
    at = set(range(FLUSH_FIRST, n, FLUSH_EVERY)) | {n - k for k in FLUSH_LAST}
    return frozenset(i for i in at if 0 < i < n)


@dataclass
class ClStep:
    """A step as enqueued: its own cl.Kernel, whose arguments stay set between runs."""
    name: str
    kernel: object
    gsize: tuple
    lsize: tuple | None
    dynamic: list          # (argument position, operand): the tensors, set per run where their buffers change
    vec4: dict             # argument position -> parameter, of the tensors read as float4


def _scalar(kind: str, value):
    from pyopencl import cltypes
    if kind == "u":
        return np.uint32(value)
    if kind == "f":
        return np.float32(value)
    return cltypes.make_uint4(*(int(v) for v in value))


class ClProgram(AheadProgram, Program):
    def __init__(self, dev, fragment):
        super().__init__(dev, fragment, TABLE)
        self.tables: list = []             # buffers of the tables made here (kept alive with the kernels)
        self.cl_steps = [self._step(st) for st in self.steps]
        self.launches, self.flush_at = Launches(self.cl_steps), flush_points(len(self.steps))
        self.arg_bufs: dict[int, object] = {}
        self.bound_sig, self.bound, self.bound_outs = None, None, None
        val_out = self.memory.val_out
        # the kernel arguments that are fragment outputs: rebound alone when only the output buffers change
        self.out_args = [(st.kernel, pos, what.idx) for st in self.cl_steps for pos, what in st.dynamic
                         if getattr(what, "kind", None) == "val" and val_out[what.idx] >= 0]
        self.stage = None
        self.init_ahead()

    # -- building ---------------------------------------------------------------------------
    def _step(self, step) -> ClStep:
        """The step's kernel object, its numbers and tables set once; its tensors' positions for each run."""
        import pyopencl as cl
        launch = step.kernel
        kernel = cl.Kernel(build(self.dev, launch.options), launch.kernel)
        binds = iter(step.binds)
        dynamic, vec4, pos = [], {}, 0
        for kind, name in params(launch.kernel):
            if kind in KERNELS.buffers:
                dynamic.append((pos, next(binds)))
                if name in launch.vec4:
                    vec4[pos] = name
                pos += 2
                continue
            value = step.params[name]
            if kind in ("tab", "ctr"):    # a table, or counters the kernel keeps between runs (this launch's own)
                buf = self.dev.buffer_with(np.ascontiguousarray(value))
                self.tables.append(buf)
                kernel.set_arg(pos, buf)
            else:
                kernel.set_arg(pos, _scalar(kind, value))
            pos += 1
        gsize, lsize = step.grid
        return ClStep(step.name, kernel, (gsize,), (lsize,) if lsize else None, dynamic, vec4)

    # -- running ----------------------------------------------------------------------------
    def _arguments(self, args):
        """The run's arguments (the skeleton's), the host values among them in buffers the program keeps:
        those are returned as (buffer, values) to upload."""
        a = self.arguments(args)
        uploads = []
        for i, data in a.staged:
            buf = self.arg_bufs.get(i)
            if buf is None or buf.size < data.nbytes:
                buf = self.arg_bufs[i] = self.dev.new_buffer(max(16, data.nbytes))
            if data.nbytes:
                uploads.append((buf, data))
            a.bufs[i], a.offs[i] = buf, 0
        return a, uploads

    def run(self, args):
        dev = self.dev
        a, uploads = self._arguments(args)
        slots = self.scratch_buffers()
        chunks = [c.buffer for w in a.weights.values() for c in w.chunks]
        sig = (tuple(map(id, a.bufs)), tuple(a.offs), tuple(map(id, slots)), tuple(map(id, chunks)))
        ahead = self.take_ahead(sig)
        if ahead is not None:
            ahead.start(preenqueue.write_values(dev.values_queue, uploads, ahead.marker))
            outs = ahead.outs
        else:
            queue = dev.queue                   # a run ahead of another program or buffers is released here
            for buf, data in uploads:
                dev.upload(buf, data)
            outs = self.output_buffers()
            self._bind_for(sig, a, outs, slots, chunks)
            if dev.profile is None:
                self.launches.enqueue(queue, self.flush_at)
                queue.flush()
            else:
                self._run_profiled(queue)
            dev.enqueued += len(self.steps)
        return self.finish(args, a, outs, sig)

    def _bind_for(self, sig, a, outs, slots, chunks) -> None:
        """Every kernel argument set where the buffers changed; only the outputs' where only they did."""
        if sig != self.bound_sig:
            self._bind(a, outs, slots)
            self.bound_sig, self.bound = sig, (a.bufs, slots, chunks)
            self.bound_outs = tuple(id(b) for b, _ in outs.values())
        elif tuple(id(b) for b, _ in outs.values()) != self.bound_outs:
            self._bind_outs(outs)

    def _bind_outs(self, outs) -> None:
        for kernel, pos, v in self.out_args:
            kernel.set_arg(pos, outs[v][0])
        self.bound_outs = tuple(id(b) for b, _ in outs.values())

    # -- the next run, enqueued ahead (the skeleton's ahead.py) -------------------------------------------
    def copy_back(self, outs) -> tuple:
        """This run's value outputs copied to pinned host memory without waiting, ahead of the next run."""
        if self.stage is None:
            self.stage = preenqueue.Stage(self.dev, {v: self.val_sizes[v] for v in outs})
        return self.stage, self.stage.copy(self.dev.raw_queue, outs)

    def enqueue_next(self, sig) -> None:
        """The next run's kernels behind a user event, with output buffers of their own (the pool's); on the
        worker, flushed on the run's own cadence (the gate may open while it still enqueues), inline not
        before the end (nothing runs behind the gate before the next run opens it)."""
        import pyopencl as cl
        dev = self.dev
        queue = dev.raw_queue
        marker = cl.enqueue_marker(queue)
        outs = self.output_buffers()
        self._bind_outs(outs)
        gate = cl.UserEvent(dev.context)
        pending = Pending(self, sig, gate, preenqueue.open_gate, marker, outs, self.bound)
        dev.enqueued += len(self.steps)
        self.hand_ahead(pending, self.launches.job(queue, frozenset(), gate),
                        self.launches.job(queue, self.flush_at, gate))

    def _bind(self, a, outs, slots) -> None:
        for st in self.cl_steps:
            for pos, what in st.dynamic:
                buf, off = self.place(what, a, outs, slots)
                if pos in st.vec4 and off % 4:
                    raise ValueError(f"{st.name}: its kernel reads '{st.vec4[pos]}' as float4, so the tensor must "
                                     f"start at a multiple of 4 elements, not at element {off}: hand it a whole "
                                     f"buffer")
                st.kernel.set_arg(pos, buf)
                st.kernel.set_arg(pos + 1, np.uint32(off))

    def _run_profiled(self, queue) -> None:
        import pyopencl as cl
        events = [cl.enqueue_nd_range_kernel(queue, st.kernel, st.gsize, st.lsize) for st in self.cl_steps]
        cl.wait_for_events(events)
        self.profiled((e.profile.end - e.profile.start) * 1e-9 for e in events)
