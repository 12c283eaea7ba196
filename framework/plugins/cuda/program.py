"""A compiled fragment: its steps (the skeleton's Program, framework/backend/program.py, lowered through
the kernel table TABLE: lowering.py's ops and fused.py's groups) as CuPy kernel functions, launched in
order on the device's stream with no host synchronisation between them (nor after: only reading a result
back waits).

The host values of a run (tokens, positions, masks) are packed into one pinned host array and copied
in one transfer into one small device buffer the program keeps (their arguments point into it), so that
their addresses are the same run after run. A program run a second time in a row with the same buffers
(a decode step) is captured as a CUDA graph, which every later run with those buffers replays after the
one copy of its values: one launch instead of a hundred. The graph writes the outputs into buffers of
the program's own; each run copies them into output buffers of the pool, which the handles hold.
FRAMEWORK_CUDA_GRAPHS=0 launches kernel by kernel every run."""

from __future__ import annotations

import ctypes
import math

import numpy as np

from ...backend import ChunkArg, KernelTable, Program, Ref, RopeArg, StagedTensor
from . import fused
from .kernels import build
from .lowering import DIALECT
from .signatures import TENSOR_KINDS, params

TABLE = KernelTable(DIALECT.ops(), fused.lower_group, fused.plan)


class CudaProgram(Program):
    stage_device_inputs = True      # a greedy step's token, the step before's ARGMAX: copied on the device

    def __init__(self, dev, fragment):
        super().__init__(dev, fragment, TABLE)
        self.tables: list = []            # device copies of the tables (kept alive with the launches)
        self.launches = [self._launch(st) for st in self.steps]
        self.values, self.pinned, self.flip = None, [None, None], 0
        self.last_sig, self.graph, self.graph_sig, self.graph_outs, self.graph_held = None, None, None, {}, None

    def _launch(self, step) -> tuple:
        """(function, (grid, block), the tensor operands in order, the arguments with a None where each
        tensor's pointer and offset go: filled by _launch_all each run)."""
        fn = build(self.dev, step.kernel.options).get_function(step.kernel.kernel)
        fixed, operands = [], iter(step.binds)
        ops_in_order = []
        for kind, name in params(step.kernel.kernel):
            if kind in TENSOR_KINDS:
                ops_in_order.append(next(operands))
                fixed += [None, None]
                continue
            value = step.params[name]
            if kind == "tab":
                buf = self.dev.buffer_with(np.ascontiguousarray(value, np.float64))
                self.tables.append(buf)
                fixed.append(buf)
            elif kind == "u4":
                fixed += [np.uint32(v) for v in value]
            else:
                fixed.append(np.uint32(value) if kind == "u" else np.float32(value))
        return fn, step.grid, ops_in_order, fixed

    # -- running ------------------------------------------------------------------------------------
    def run(self, args):
        dev = self.dev
        a = self.arguments(args)
        with dev.on_device():
            self._stage_values(a)
            slots = self.scratch_buffers()
            # a.wkey stands for the weights (the same while their handles are): their chunks need no ids
            sig = (tuple(map(id, a.bufs)), tuple(a.offs), tuple(map(id, slots)), a.wkey)
            dev.runs += 1
            if not dev.graphs or self.ropes:
                outs = self.output_buffers()
                self._launch_all(a, outs, slots)
            else:
                outs = self._graph_run(sig, a, slots)
            self.last_sig = sig
            return self.results(args, a.bufs, outs, self._index_copy)

    def _index_copy(self, i, r, buf, lease):
        """An index output (ARGMAX's, int32) is also copied to pinned host memory right after this run's work,
        with an event: reading it waits for this run only, not for the steps queued after it (runtime/greedy.py)."""
        if self.out_dtypes[i] is np.float32:
            return None
        import cupy
        n = 4 * math.prod(r.shape)
        host = np.frombuffer(cupy.cuda.alloc_pinned_memory(n), np.int32, n // 4)
        cupy.cuda.runtime.memcpyAsync(host.ctypes.data, buf.data.ptr + 4 * r.off, n,
                                      cupy.cuda.runtime.memcpyDeviceToHost, self.dev.stream.ptr)
        done = self.dev.stream.record()

        def read():
            done.synchronize()
            return host.reshape(r.shape).copy()
        return StagedTensor(buf, r.off, r.shape, np.int32, lease=lease, readback=read)

    def _launch_all(self, a, outs: dict, slots: list) -> None:
        for fn, (grid, block), operands, fixed in self.launches:
            values = list(fixed)
            j = 0
            for b in operands:
                while values[j] is not None:
                    j += 1
                values[j], values[j + 1] = self._where(b, a, outs, slots)
                j += 2
            fn((grid,), (block,), tuple(values))

    def _where(self, b, a, outs, slots):
        if isinstance(b, RopeArg):
            raise ValueError(f"{self.dev.name}: rope tables by position are not read by the CUDA kernels ({self.name})")
        buf, off = self.place(b, a, outs, slots)
        return buf, np.uint32(off)

    def _graph_run(self, sig, a, slots) -> dict:
        """Replay the graph of these buffers, capture it (a second run with the same buffers), or launch."""
        import cupy
        dev = self.dev
        if sig != self.graph_sig and sig == self.last_sig:
            self.graph_outs = {v: (dev.new_buffer(4 * self.val_sizes[v]), None) for v in self.out_vals}
            dev.stream.begin_capture()
            try:
                self._launch_all(a, self.graph_outs, slots)
            finally:
                self.graph = dev.stream.end_capture()
            self.graph_sig, self.graph_held = sig, (a.bufs, slots, a.weights)    # held: their ids stay theirs
            dev.captures += 1
        if sig != self.graph_sig:
            outs = self.output_buffers()
            self._launch_all(a, outs, slots)
            return outs
        self.graph.launch(stream=dev.stream)
        dev.replays += 1
        outs = self.output_buffers()
        for v, (buf, _) in outs.items():     # one asynchronous copy each (a CuPy slice assignment costs more host time)
            cupy.cuda.runtime.memcpyAsync(buf.data.ptr, self.graph_outs[v][0].data.ptr, 4 * self.val_sizes[v],
                                          cupy.cuda.runtime.memcpyDeviceToDevice, dev.stream.ptr)
        return outs

    def _stage_values(self, a) -> None:
        """This run's host values in one pinned array, copied in one transfer into the program's values
        buffer; their arguments point into it (element offsets, each a multiple of 4). An input given as a
        device tensor (DeviceTensor) is copied into its place there on the stream, after the values, so the
        copy follows the earlier work that makes it."""
        if not a.staged:
            return
        import cupy
        offs, total = [], 0
        sizes = [data.nbytes if isinstance(data, np.ndarray) else 4 * math.prod(data.shape) for _, data in a.staged]
        for nbytes in sizes:
            offs.append(total)
            total += -(-nbytes // 16) * 16
        if self.values is None or self.values.size < total:
            self.values = self.dev.new_buffer(total)
            self.pinned = [None, None]
        self.flip ^= 1
        slot = self.pinned[self.flip]
        if slot is None:
            mem = cupy.cuda.alloc_pinned_memory(self.values.size)
            slot = self.pinned[self.flip] = [np.frombuffer(mem, np.uint8, self.values.size), None]
        if slot[1] is not None:
            slot[1].synchronize()            # the copy from this half, two runs ago, is done
        host, on_device = slot[0], []
        for (i, data), off, nbytes in zip(a.staged, offs, sizes):
            if isinstance(data, np.ndarray):
                host[off:off + nbytes] = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            else:
                on_device.append((data, off, nbytes))
            a.bufs[i], a.offs[i] = self.values, off // 4
        self.values.data.copy_from_host_async(ctypes.c_void_p(host.ctypes.data), total, self.dev.stream)
        slot[1] = self.dev.stream.record()
        for h, off, nbytes in on_device:
            cupy.cuda.runtime.memcpyAsync(self.values.data.ptr + off, h.buffer.data.ptr + 4 * h.offset, nbytes,
                                          cupy.cuda.runtime.memcpyDeviceToDevice, self.dev.stream.ptr)


__all__ = ["ChunkArg", "CudaProgram", "Ref"]
