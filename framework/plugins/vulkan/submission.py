"""A compiled fragment and its runs, on the skeleton's Program (framework/backend/program.py: the
lowering, the values' places, the arguments bound, the rope rows, the results): host values copied
straight into the program's own buffer, with the rope tables (one upload a run), the bind groups found,
every dispatch recorded into one command encoder and one compute pass, and one submission per run.

Pipelines are made once per device; bind groups once per set of buffers, and reused whole while a
program's buffers stay the same (decode, step after step); parameter blocks once per program.
FRAMEWORK_VULKAN_PROFILE=1 puts each dispatch in a pass of its own between GPU timestamps instead.
"""

from __future__ import annotations

import math
from functools import partial
from itertools import accumulate

import numpy as np

from ...backend import Program, StagedTensor, read_as_ints
from .lowering import TABLE
from .uniforms import ParamBlocks

BG_CACHE = 64             # bind groups kept per step (a program shared by fragments with other weights)
STAGE_MAX = 8 << 20       # bytes of a run's outputs copied for reading back in the run's own submission

try:      # wgpu-native's C functions, as wgpu's own methods call them (see VkProgram._encode)
    from wgpu.backends.wgpu_native import _ffi as _native
except ImportError:       # another wgpu layout: its methods are called instead (the report line says so)
    _native = None
ENCODING = ("pass commands through wgpu-native's C functions" if _native is not None else
            "pass commands through wgpu's methods (wgpu.backends.wgpu_native._ffi is missing: slower encoding)")


class VkProgram(Program):
    def __init__(self, dev, fragment):
        super().__init__(dev, fragment, TABLE)
        self.params = ParamBlocks(dev, self.steps)
        self.bg_cache: list[dict] = [{} for _ in self.steps]
        self.host_buf, self.host_key, self.host_at = None, None, []     # the host values' buffer (_upload)
        self.last_sig, self.last_cmds = None, None
        self.timer = None          # (query set, resolve buffer) of device.pass_times
        self.stage = None          # Stage: the read-back copies of the value outputs
        self.ready = None          # (cmds, command buffer) encoded for the next run
        self.repeated = None       # the last run's cmds: the same again means the next is likely the same too
        # the value outputs read back through the run's own copies: (output, value, byte offset, bytes)
        self.staged = [(i, r.idx, 4 * r.off, 4 * r.size) for i, r in enumerate(self.out_refs)
                       if r.kind == "val" and r.contiguous and self.memory.val_out[r.idx] >= 0]
        if sum(p[3] for p in self.staged) > STAGE_MAX:
            self.staged = []

    # -- running ----------------------------------------------------------------------------
    def run(self, args):
        dev = self.dev
        queue = dev.gpu.queue
        a = self.arguments(args)
        tables = self.rope_tables(args, a.host_vals)
        rope_offs = self._upload(a.staged, tables, a.bufs, a.offs) if a.staged or tables else ()
        self.params.update(queue, a.offs, a.weights, a.wkey, rope_offs)
        out_of_val = self.output_buffers()
        cmds = self._commands(a, out_of_val, self.scratch_buffers())
        if dev.profile is not None:
            self._run_profiled(dev.gpu.create_command_encoder(), cmds)
            return self.results(args, a.bufs, out_of_val)
        timed = dev.pass_times is not None
        stage = self._stage_for(out_of_val)
        if stage is not None:
            stage.release()                    # unmapped before the submission that writes it again
        ready, self.ready = self.ready, None
        # the command buffer encoded after the last run, while the GPU worked, where this run's is the same
        cb = ready[1] if ready is not None and ready[0] is cmds and not timed else self._encode(cmds, stage, timed)
        queue.submit([cb])
        dev.submits += 1
        if stage is not None:
            stage.runs += 1
        dev.last_stage = stage
        if timed:
            t0, t1 = np.frombuffer(queue.read_buffer(self.timer[1], 0, 16), dtype=np.uint64)
            dev.pass_times.append((int(t1) - int(t0)) * 1e-9)
        elif cmds is self.repeated:            # run after run with the same buffers (decode): the next one now
            self.ready = (cmds, self._encode(cmds, stage, False))
        self.repeated = cmds
        return self.results(args, a.bufs, out_of_val, self._staged_handle(stage))

    def _staged_handle(self, stage):
        """The handles of the outputs this run copies for reading back (StagedTensor)."""
        if stage is None:
            return None

        def wrap(i, r, buf, lease):
            if i not in stage.at:
                return None
            read = partial(stage.values, stage.runs, stage.at[i], r.shape)
            ints = self.out_dtypes[i] is not np.float32       # an index (ARGMAX): the same words read as ints
            return StagedTensor(buf, r.off, r.shape, self.out_dtypes[i], None if r.contiguous else r.strides,
                                lease=lease, readback=partial(read_as_ints, read) if ints else read)
        return wrap

    def _encode(self, cmds, stage, timed: bool):
        """One command buffer: every dispatch in one compute pass, then the copies of the outputs read back.
        The pass's commands go straight to wgpu-native where wgpu's own module is there to call (what
        wgpu's methods call, without their per-call error capture;
        errors still surface at finish and submit)."""
        encoder = self.dev.gpu.create_command_encoder()
        cpass = encoder.begin_compute_pass(**self._pass_timer() if timed else {})
        last_pipe = None
        if _native is not None:
            lib, null = _native.lib, _native.ffi.NULL
            raw = cpass._internal
            set_pipeline, set_bind_group = lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup
            dispatch = lib.wgpuComputePassEncoderDispatchWorkgroups
            for pipe, bg, (gx, gy, gz), _ in cmds:
                if pipe is not last_pipe:
                    set_pipeline(raw, pipe._internal)
                    last_pipe = pipe
                set_bind_group(raw, 0, bg._internal, 0, null)
                dispatch(raw, gx, gy, gz)
        else:
            set_pipeline, set_bind_group, dispatch = cpass.set_pipeline, cpass.set_bind_group, cpass.dispatch_workgroups
            for pipe, bg, (gx, gy, gz), _ in cmds:
                if pipe is not last_pipe:
                    set_pipeline(pipe)
                    last_pipe = pipe
                set_bind_group(0, bg)
                dispatch(gx, gy, gz)
        cpass.end()
        if timed:
            encoder.resolve_query_set(self.timer[0], 0, 2, self.timer[1], 0)
        if stage is not None:
            for src, src_off, at, nbytes in stage.copies:
                encoder.copy_buffer_to_buffer(src, src_off, stage.buffer, at, nbytes)
        return encoder.finish()

    def _stage_for(self, out_of_val: dict):
        """The read-back buffer of this run's value outputs (contiguous float rows, STAGE_MAX bytes in
        all), made again when their buffers change; None where there are none."""
        if not self.staged:
            return None
        places = [(i, out_of_val[v][0], off, nbytes) for i, v, off, nbytes in self.staged]
        key = tuple((i, id(b), o, n) for i, b, o, n in places)
        if self.stage is None or self.stage.key != key:
            if self.stage is not None:
                self.stage.release()
            self.stage = Stage(self.dev, key, places)
        return self.stage

    def _pass_timer(self) -> dict:
        """device.pass_times set (a list): GPU timestamps around the run's one pass, its GPU time appended
        there after the run (a read-back a run: for measuring only)."""
        import wgpu
        if self.timer is None:
            self.timer = (self.dev.gpu.create_query_set(type=wgpu.QueryType.timestamp, count=2),
                          self.dev.new_buffer(16, wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC))
        return {"timestamp_writes": {"query_set": self.timer[0], "beginning_of_pass_write_index": 0,
                                     "end_of_pass_write_index": 1}}

    def _upload(self, staged, tables, bufs, offs) -> list[int]:
        """This run's host values (tokens, positions, cache rows, masks: 4-byte elements) and rope tables in
        one buffer, each at a 16-byte aligned place: one upload per run, and the places (the parameter blocks'
        offsets) the same from run to run while the sizes are. Returns each table's offset there, in (cos,
        sin) pairs."""
        arrays = [data for _, data in staged] + list(tables)
        key = (tuple(i for i, _ in staged), tuple(a.nbytes for a in arrays))
        if key != self.host_key:
            self.host_at = list(accumulate((max(16, -(-a.nbytes // 16) * 16) for a in arrays), initial=0))
            total = self.host_at.pop()
            self.host_block = np.empty(total, np.uint8)     # written whole every run: write_buffer copies it
            if self.host_buf is None or self.host_buf.size < total:
                self.host_buf = self.dev.new_buffer(total)
            self.host_key = key
        block = self.host_block
        for at, data in zip(self.host_at, arrays):
            block[at:at + data.nbytes] = data.reshape(-1).view(np.uint8)
        for (i, _), at in zip(staged, self.host_at):
            bufs[i], offs[i] = self.host_buf, at // 4
        self.dev.gpu.queue.write_buffer(self.host_buf, 0, block)
        return [at // 8 for at in self.host_at[len(staged):]]

    def _commands(self, a, out_of_val, slot_bufs) -> list:
        """(pipeline, bind group, workgroups, buffers) of every step; the same as last run's (no lookups)
        when every buffer is the same (decode, step after step)."""
        dev = self.dev
        # the buffers themselves (compared by identity), and the weights, whose chunks are theirs for good
        sig = (tuple(a.bufs), tuple(v[0] for v in out_of_val.values()), tuple(slot_bufs), a.wkey, self.host_buf)
        if sig == self.last_sig:
            return self.last_cmds
        tables = (self.host_buf, None)     # the rope tables lie in the host values' buffer (_upload)
        cmds = []
        for si, st in enumerate(self.steps):
            buffers = tuple(self.place(b, a, out_of_val, slot_bufs, tables)[0] for b in st.binds)
            key = tuple(id(b) for b in buffers)
            cache = self.bg_cache[si]
            hit = cache.get(key)
            if hit is None:
                entries = [self.params.entry(si)]
                entries += [{"binding": j + 1, "resource": {"buffer": b, "offset": 0, "size": b.size}}
                            for j, b in enumerate(buffers)]
                if len(cache) >= BG_CACHE:
                    cache.clear()
                hit = cache[key] = (dev.gpu.create_bind_group(layout=st.kernel.bgl, entries=entries), buffers)
            cmds.append((st.kernel.pipe, hit[0], st.grid, hit[1]))   # [3] keeps the buffers (their ids) alive
        self.last_sig, self.last_cmds = sig, cmds
        return cmds

    def _run_profiled(self, encoder, cmds):
        """FRAMEWORK_VULKAN_PROFILE=1: one pass per dispatch, with GPU timestamps around it; the GPU time
        of every kernel (by step name's first word) adds up in device.profile. Slower than a real run."""
        import wgpu
        dev = self.dev
        gpu = dev.gpu
        n = len(cmds)
        qs = gpu.create_query_set(type=wgpu.QueryType.timestamp, count=2 * n)
        for i, (pipe, bg, groups, _) in enumerate(cmds):
            cp = encoder.begin_compute_pass(timestamp_writes={"query_set": qs, "beginning_of_pass_write_index": 2 * i,
                                                              "end_of_pass_write_index": 2 * i + 1})
            cp.set_pipeline(pipe)
            cp.set_bind_group(0, bg)
            cp.dispatch_workgroups(*groups)
            cp.end()
        res = dev.new_buffer(16 * n, wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        encoder.resolve_query_set(qs, 0, 2 * n, res, 0)
        gpu.queue.submit([encoder.finish()])
        dev.submits += 1
        dev.last_stage = None
        ticks = np.frombuffer(gpu.queue.read_buffer(res, 0, 16 * n), dtype=np.uint64).reshape(n, 2)
        self.profiled((int(t1) - int(t0)) * 1e-9 for t0, t1 in ticks)


class Stage:
    """A program's read-back buffer: its value outputs copied there at the end of each run, in the run's own
    submission, so that reading them back (the logits) takes no submission of its own, and the device's
    synchronize waits by mapping it. Handles of an earlier run than the last read their own buffers."""

    def __init__(self, dev, key: tuple, places: list):
        import wgpu
        self.key, self.copies, self.at, total = key, [], {}, 0
        for i, buf, off, nbytes in places:
            self.at[i] = total
            self.copies.append((buf, off, total, nbytes))
            total += -(-nbytes // 256) * 256
        self.buffer = dev.new_buffer(total, wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        self.native = NativeMap(dev.gpu, self.buffer, total) if _native is not None else None
        self.runs = 0           # runs submitted that copy into it
        self.mapped = False

    def release(self) -> None:
        if self.mapped:
            if self.native is not None:
                self.native.unmap()
            else:
                self.buffer.unmap()
            self.mapped = False

    def wait(self) -> None:
        """Until the last run's copies are done (and every submission before them)."""
        if not self.mapped:
            if self.native is not None:
                self.native.map()
            else:
                import wgpu
                self.buffer.map_sync(wgpu.MapMode.READ)
            self.mapped = True

    def values(self, run: int, at: int, shape: tuple) -> np.ndarray | None:
        """A contiguous float output of run `run` copied at `at`, or None where a later run has copied over it
        (or it is empty)."""
        n = math.prod(shape)
        if run != self.runs or not n:
            return None
        self.wait()
        if self.native is not None:
            data = self.native.view[at:at + 4 * n]
        else:
            data = self.buffer.read_mapped(at, 4 * n, copy=False)      # a view of the mapping: copied at once
        return np.frombuffer(data, dtype=np.float32, count=n).reshape(shape).copy()


class NativeMap:
    """Maps a read-back buffer through wgpu-native's C functions, what wgpu's GPUBuffer.map_sync calls, without
    what map_sync adds around them: an empty submission before each map (for buffers written by
    queue.write_buffer, wgpu-native issue 305; this one is written by the run's own copies) and the hand-over
    of the map's callback through wgpu's poll thread. Here the device is polled, waiting, on this thread,
    which runs the callback."""

    def __init__(self, gpu, buffer, nbytes: int):
        lib, ffi = _native.lib, _native.ffi
        self.lib, self.null = lib, ffi.NULL
        self.device, self.buffer, self.nbytes = gpu._internal, buffer._internal, nbytes
        self.keep = buffer              # the buffer object outlives its mapping
        status: list = []
        self.status = status

        @ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
        def mapped(code, message, _a, _b):
            text = "" if message.data == ffi.NULL else ffi.string(message.data, message.length).decode(errors="replace")
            status.append((int(code), text))

        self.callback = mapped
        self.info = ffi.new("WGPUBufferMapCallbackInfo *")
        self.info.mode = lib.WGPUCallbackMode_AllowProcessEvents
        self.info.callback = mapped
        self.ffi = ffi
        self.view = None

    def map(self) -> None:
        lib, status = self.lib, self.status
        status.clear()
        lib.wgpuBufferMapAsync(self.buffer, lib.WGPUMapMode_Read, 0, self.nbytes, self.info[0])
        for _ in range(100):            # a poll that waits returns with the queue empty: the callback has run
            if status:
                break
            lib.wgpuDevicePoll(self.device, True, self.null)
        if not status or status[0][0] != lib.WGPUMapAsyncStatus_Success:
            said = f"status {status[0][0]}: {status[0][1]}" if status else "no answer after 100 waiting polls"
            raise RuntimeError(f"vulkan: could not map the {self.nbytes}-byte read-back buffer of a run's outputs "
                               f"(wgpuBufferMapAsync, {said}); the device may be lost: wgpu's log says why")
        ptr = lib.wgpuBufferGetMappedRange(self.buffer, 0, self.nbytes)
        self.view = memoryview(self.ffi.buffer(ptr, self.nbytes))

    def unmap(self) -> None:
        if self.view is not None:
            self.view.release()
            self.view = None
        self.lib.wgpuBufferUnmap(self.buffer)


def wait_for_queue(gpu) -> bool:
    """Wait, on this thread, until every submission so far has finished (wgpu-native's device poll); False
    where wgpu's _ffi module is missing (the caller waits another way)."""
    if _native is None:
        return False
    _native.lib.wgpuDevicePoll(gpu._internal, True, _native.ffi.NULL)
    return True
