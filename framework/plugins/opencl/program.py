"""A compiled fragment: its launches (lower.py) as kernel objects of their own, enqueued in order on
the device's in-order queue, with no host synchronisation between them (nor after: only reading a
result back waits; enqueue.py says how they are enqueued). The queue is flushed after the first
FLUSH_FIRST kernels, every FLUSH_EVERY after that, FLUSH_LAST kernels before the end and at the end of a
run (a flush submits what is queued, it does not wait, but it costs the host time), so the device starts
while the host is still enqueueing and has little left to run once the host is done (NVIDIA's driver
holds enqueued kernels back until a flush: flushed every 64, the device waited for a decode step's first
64 kernels, 1.4 ms of enqueueing).

Each launch owns its cl.Kernel, so its arguments stay set between runs: a run sets only those whose
buffer or offset changed since the last one (none, step after step of decode). Computed values live
in scratch buffers shared by every program of the device (none outlives its run; a value's buffer is
reused once its last reader has run), except the fragment's outputs, which get buffers of their own
from a pool each run. Host values handed in (tokens, positions, masks) are copied into buffers the
program keeps, without waiting.

A program run twice in a row with the same buffers (decode) enqueues its next run ahead, behind a user
event, which the next run opens once its host values are written (preenqueue.py says how, and why a run
ahead that is not taken is safe to release).

FRAMEWORK_OPENCL_PROFILE=1 (read when the device opens its queue): every launch's device time, from
OpenCL's profiling events, adds up per kernel in ``device.profile`` (the run then waits for them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...contract import contiguous_strides
from .device import ClTensor, ClWeight
from . import preenqueue
from .enqueue import Launches
from .kernels import build
from .lower import ChunkArg, Lowering, Ref
from .signatures import TENSOR_KINDS, params

FLUSH_FIRST = 2          # kernels enqueued before the first flush
FLUSH_EVERY = 8          # kernels between two flushes after it (one costs about 1.3 us on the H200)
FLUSH_LAST = (4, 2)      # kernels before the end at which the queue is flushed too


def flush_points(n: int) -> frozenset[int]:
    """After which of a run's n kernels (counted from 1) the queue is flushed, the last one apart."""
    at = set(range(FLUSH_FIRST, n, FLUSH_EVERY)) | {n - k for k in FLUSH_LAST}
    return frozenset(i for i in at if 0 < i < n)


def _enqueue_job(launches, queue, flush_at, gate):
    """A run ahead's enqueueing, holding neither the program nor the device (the worker outlives neither).
    On the worker, flushed on the run's own cadence: the gate may open while it still enqueues, and the
    device then runs what was flushed."""
    def job():
        launches.enqueue(queue, flush_at, gate)
        queue.flush()
    return job


@dataclass
class Step:
    name: str
    kernel: object
    gsize: tuple
    lsize: tuple | None
    dynamic: list          # (argument position, Ref | ChunkArg | None)
    reads: tuple = ()      # computed values read
    writes: tuple = ()     # the computed values written
    vec4: tuple = ()       # (argument position, parameter) of the tensors read as float4
    arg_reads: tuple = ()  # the program's arguments read
    arg_writes: tuple = () # and written


def _scalar(kind: str, value):
    from pyopencl import cltypes
    if kind == "u":
        return np.uint32(value)
    if kind == "f":
        return np.float32(value)
    return cltypes.make_uint4(*(int(v) for v in value))


class ClProgram:
    def __init__(self, dev, fragment):
        self.dev = dev
        self.name = fragment.describe()
        self.inputs, self.outputs = list(fragment.inputs), list(fragment.outputs)
        low = Lowering(dev, fragment)
        self.refs, self.val_sizes, self.written_args = low.refs, low.val_sizes, low.written_args
        self.tables: list = []             # buffers of the tables made here (kept alive with the kernels)
        self.steps = [self._step(launch) for launch in low.launches]
        self.launches, self.flush_at = Launches(self.steps), flush_points(len(self.steps))
        self._allocate()
        self.arg_bufs: dict[int, object] = {}
        self.bound_sig, self.bound, self.bound_outs = None, None, None
        # the kernel arguments that are fragment outputs: rebound alone when only the output buffers change
        self.out_args = [(st.kernel, pos, what.idx) for st in self.steps for pos, what in st.dynamic
                         if isinstance(what, Ref) and what.kind == "val" and self.val_out[what.idx] >= 0]
        self.ahead_ok = (preenqueue.replayable(self.steps, self.written_args) and
                         4 * sum(self.val_sizes[v] for v in range(len(self.val_sizes)) if self.val_out[v] >= 0)
                         <= preenqueue.STAGE_MAX)
        self.last_sig, self.stage = None, None

    # -- building ---------------------------------------------------------------------------
    def _step(self, launch) -> Step:
        import pyopencl as cl
        kernel = cl.Kernel(build(self.dev, launch.options), launch.kernel)
        given = dict(launch.args)
        dynamic, reads, writes, vec4, pos = [], [], [], [], 0
        arg_reads, arg_writes = [], []
        for kind, name in params(launch.kernel):
            if name not in given:
                raise ValueError(f"{launch.name}: kernel {launch.kernel} needs parameter '{name}', not given")
            value = given.pop(name)
            if kind in TENSOR_KINDS or kind == "w":
                dynamic.append((pos, value))
                if name in launch.vec4:
                    vec4.append((pos, name))
                if isinstance(value, Ref) and value.kind == "val":
                    (writes if kind == "out" else reads).append(value.idx)
                elif isinstance(value, Ref) and value.kind == "arg":
                    (arg_writes if kind == "out" else arg_reads).append(value.idx)
                pos += 2
                continue
            if kind in ("tab", "ctr"):    # a table, or counters the kernel keeps between runs (this launch's own)
                buf = self.dev.buffer_with(np.ascontiguousarray(value))
                self.tables.append(buf)
                kernel.set_arg(pos, buf)
            else:
                kernel.set_arg(pos, _scalar(kind, value))
            pos += 1
        if given:
            raise ValueError(f"{launch.name}: kernel {launch.kernel} has no parameter {', '.join(given)}")
        return Step(launch.name, kernel, (launch.gsize,), (launch.lsize,) if launch.lsize else None, dynamic,
                    tuple(reads), tuple(writes), tuple(vec4), tuple(arg_reads), tuple(arg_writes))

    def _allocate(self) -> None:
        """Fragment outputs get buffers of their own each run; the other values share scratch slots, a
        slot reused once the last reader of its value has run."""
        nv = len(self.val_sizes)
        self.val_out = [-1] * nv
        self.n_out = 0
        for t in self.outputs:
            r = self.refs[id(t)]
            if r.kind == "val" and self.val_out[r.idx] < 0:
                self.val_out[r.idx] = self.n_out
                self.n_out += 1
        last = [-1] * nv
        for si, st in enumerate(self.steps):
            for v in (*st.reads, *st.writes):
                last[v] = max(last[v], si)
        dies: dict[int, list[int]] = {}
        for u in range(nv):
            dies.setdefault(last[u], []).append(u)
        self.val_slot = [-1] * nv
        sizes: list[int] = []
        free: list[int] = []
        for si, st in enumerate(self.steps):
            for v in st.writes:
                if self.val_out[v] >= 0 or self.val_slot[v] >= 0:
                    continue
                need = self.val_sizes[v]
                fits = [s for s in free if sizes[s] >= need]
                best = min(fits, key=lambda s: sizes[s]) if fits else (max(free, key=lambda s: sizes[s]) if free
                                                                       else None)
                if best is None:
                    sizes.append(need)
                    best = len(sizes) - 1
                else:
                    free.remove(best)
                    sizes[best] = max(sizes[best], need)
                self.val_slot[v] = best
            for u in dies.get(si, ()):
                if self.val_slot[u] >= 0 and self.val_out[u] < 0:
                    free.append(self.val_slot[u])
        self.slot_bytes = [4 * s for s in sizes]

    # -- running ----------------------------------------------------------------------------
    def _arguments(self, args):
        """(buffer, element offset) of every argument, weights apart, and the host values to upload (buffer,
        array)."""
        dev = self.dev
        bufs, offs, weights, uploads = [None] * len(args), [0] * len(args), {}, []
        for i, h in enumerate(args):
            if isinstance(h, ClWeight):
                weights[i], bufs[i] = h, h.chunks[0].buffer
                continue
            if isinstance(h, np.ndarray):
                h = dev.from_host(h)
            if h.host is None and h.contiguous:
                bufs[i], offs[i] = h.buffer, h.offset
                continue
            data = np.ascontiguousarray(h.host if h.host is not None else dev.to_host(h))
            if i in self.written_args:        # a cache handed over as values: it lives on here from now
                bufs[i] = dev.buffer_with(data)
                continue
            buf = self.arg_bufs.get(i)
            if buf is None or buf.size < data.nbytes:
                buf = self.arg_bufs[i] = dev.new_buffer(max(16, data.nbytes))
            if data.nbytes:
                uploads.append((buf, data))
            bufs[i] = buf
        return bufs, offs, weights, uploads

    def run(self, args):
        dev = self.dev
        bufs, offs, weights, uploads = self._arguments(args)
        slots = [dev.scratch(s, nb) for s, nb in enumerate(self.slot_bytes)]
        chunks = [c.buffer for w in weights.values() for c in w.chunks]
        sig = (tuple(map(id, bufs)), tuple(offs), tuple(map(id, slots)), tuple(map(id, chunks)))
        ahead = dev.pending
        if ahead is not None and ahead.program() is self and ahead.fixed == sig:
            dev.pending = None                  # taken: this run was enqueued ahead, behind its gate
            dev.ahead_taken += 1
            ahead.start(dev.values_queue, uploads)
            outs = ahead.outs
        else:
            queue = dev.queue                   # a run ahead of another program or buffers is released here
            for buf, data in uploads:
                dev.upload(buf, data)
            outs = {v: dev.output_buffer(4 * self.val_sizes[v]) for v in range(len(self.val_sizes))
                    if self.val_out[v] >= 0}
            self._bind_for(sig, bufs, offs, weights, outs, slots, chunks)
            if dev.profile is None:
                self.launches.enqueue(queue, self.flush_at)
                queue.flush()
            else:
                self._run_profiled(queue)
            dev.enqueued += len(self.steps)
        dev.runs += 1
        again = dev.ahead and self.ahead_ok and dev.last_run is self and self.last_sig == sig
        dev.last_run, self.last_sig = self, sig
        if not again:
            return self._results(args, bufs, outs)
        staged = self._copy_back(outs)
        results = self._results(args, bufs, outs, staged)
        self._enqueue_next(sig)
        return results

    def _bind_for(self, sig, bufs, offs, weights, outs, slots, chunks) -> None:
        """Every kernel argument set where the buffers changed; only the outputs' where only they did."""
        if sig != self.bound_sig:
            self._bind(bufs, offs, weights, outs, slots)
            self.bound_sig, self.bound = sig, (bufs, slots, chunks)
        elif tuple(id(b) for b, _ in outs.values()) != self.bound_outs:
            self._bind_outs(outs)
        self.bound_outs = tuple(id(b) for b, _ in outs.values())

    def _bind_outs(self, outs) -> None:
        for kernel, pos, v in self.out_args:
            kernel.set_arg(pos, outs[v][0])
        self.bound_outs = tuple(id(b) for b, _ in outs.values())

    # -- the next run, enqueued ahead (preenqueue.py) -----------------------------------------------
    def _copy_back(self, outs) -> dict:
        """This run's value outputs copied to pinned host memory without waiting, ahead of the next run."""
        if self.stage is None:
            self.stage = preenqueue.Stage(self.dev, {v: self.val_sizes[v] for v in outs})
        return self.stage.copy(self.dev.raw_queue, outs)

    def _enqueue_next(self, sig) -> None:
        """The next run's kernels behind a user event, with output buffers of their own (the pool's)."""
        import pyopencl as cl
        dev = self.dev
        queue = dev.raw_queue
        marker = cl.enqueue_marker(queue)
        outs = {v: dev.output_buffer(4 * self.val_sizes[v]) for v in range(len(self.val_sizes))
                if self.val_out[v] >= 0}
        self._bind_outs(outs)
        gate = cl.UserEvent(dev.context)
        pending = preenqueue.Pending(self, sig, gate, marker, outs, self.bound)
        dev.enqueued += len(self.steps)
        if preenqueue.mode(dev) == "thread":    # the caller goes on; whatever needs it whole waits for the worker
            dev.pending = pending
            dev.worker.submit(pending, _enqueue_job(self.launches, queue, self.flush_at, gate))
            return
        # inline: no flush before the end (nothing runs behind the gate before the next run opens it)
        pending.enqueue_with(_enqueue_job(self.launches, queue, frozenset(), gate))
        if pending.error is not None:
            pending.release()                   # what was enqueued of it replays the run before: harmless; raises
        dev.pending = pending

    def _bind(self, bufs, offs, weights, outs, slots) -> None:
        dummy = self.dev.dummy()
        for st in self.steps:
            for pos, what in st.dynamic:
                if what is None:
                    buf, off = dummy, 0
                elif isinstance(what, ChunkArg):
                    chunk = weights[what.arg].chunks[what.chunk]
                    buf, off = chunk.buffer, chunk.moff
                elif what.kind == "arg":
                    buf, off = bufs[what.idx], offs[what.idx] + what.off
                elif self.val_out[what.idx] >= 0:
                    buf, off = outs[what.idx][0], what.off
                else:
                    buf, off = slots[self.val_slot[what.idx]], what.off
                for p, name in st.vec4:
                    if p == pos and off % 4:
                        raise ValueError(f"{st.name}: its kernel reads '{name}' as float4, so the tensor must start at "
                                         f"a multiple of 4 elements, not at element {off}: hand it a whole buffer")
                st.kernel.set_arg(pos, buf)
                st.kernel.set_arg(pos + 1, np.uint32(off))

    def _run_profiled(self, queue) -> None:
        import pyopencl as cl
        events = [(st.name.split(" ")[0], cl.enqueue_nd_range_kernel(queue, st.kernel, st.gsize, st.lsize))
                  for st in self.steps]
        cl.wait_for_events([e for _, e in events])
        for key, e in events:
            tot = self.dev.profile.setdefault(key, [0.0, 0])
            tot[0] += (e.profile.end - e.profile.start) * 1e-9
            tot[1] += 1

    def _results(self, args, bufs, outs, staged=None) -> list:
        dev = self.dev
        results = []
        for t in self.outputs:
            r = self.refs[id(t)]
            if r.kind == "val":
                buf, lease = outs[r.idx]
                if staged:
                    results.append(preenqueue.StagedTensor(buf, r.off, r.shape, np.float32, r.strides, lease=lease,
                                                           staged=staged[r.idx]))
                else:
                    results.append(ClTensor(buf, r.off, r.shape, np.float32, r.strides, lease=lease))
                continue
            h = args[r.idx]
            if isinstance(h, np.ndarray):
                h = dev.from_host(h)
            if r.idx in self.written_args and (h.host is not None or not h.contiguous):
                h = ClTensor(bufs[r.idx], 0, tuple(self.inputs[r.idx].shape), np.float32)
            contiguous = r.strides is None or r.strides == contiguous_strides(r.shape)
            if r.off == 0 and contiguous and tuple(r.shape) == tuple(h.shape) and h.contiguous:
                results.append(h)
            elif h.host is not None:
                flat = np.ascontiguousarray(h.host).reshape(-1)
                st = r.strides or contiguous_strides(r.shape)
                view = np.lib.stride_tricks.as_strided(flat[r.off:], r.shape, tuple(s * flat.itemsize for s in st))
                results.append(ClTensor(None, 0, r.shape, flat.dtype, host=np.array(view)))
            else:
                results.append(ClTensor(h.buffer, h.offset + r.off, r.shape, h.dtype, r.strides, lease=h.lease))
        return results
