"""The OpenCL device: one per OpenCL device pyopencl finds (opencl:0, opencl:1, ...; GPUs first, then
accelerators, then CPUs, each kind in platform order); tensors, the KV cache and weights in device
buffers; one in-order command queue."""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from ...contract import BufferType, Device, DeviceType, Limits, Tensor, Verdict, settings
from . import layout, options
from .coverage import COVERED, DISABLE_OPS_ENV, disabled_ops, verdict
from .options import MAX_ALLOC_ENV, PROFILE_ENV  # noqa: F401 (PROFILE_ENV: re-exported for the benchmark)
from .properties import device_data, device_type, physical_id

KIND_ORDER = {DeviceType.GPU: 0, DeviceType.ACCEL: 1, DeviceType.NPU: 1, DeviceType.CPU: 2}


class ClTensor:
    """A device handle: elements of a buffer (offset and strides in elements), or host values not yet
    uploaded (``host``: from_host is lazy, so a program copies them straight into a buffer of its own)."""

    __slots__ = ("buffer", "dtype", "host", "lease", "offset", "shape", "strides")

    def __init__(self, buffer, offset: int, shape: tuple, dtype=np.float32, strides: tuple | None = None, host=None,
                 lease=None):
        self.buffer, self.offset, self.shape, self.dtype = buffer, int(offset), tuple(shape), np.dtype(dtype)
        self.strides = strides            # None: contiguous
        self.host = host
        self.lease = lease                # keeps a pooled output buffer out of the pool while a handle lives

    @property
    def contiguous(self) -> bool:
        return self.strides is None or self.strides == contiguous_strides(self.shape)

    def __repr__(self) -> str:
        where = "host" if self.host is not None else f"buffer of {self.buffer.size} bytes at element {self.offset}"
        return f"ClTensor({list(self.shape)}, {self.dtype}, {where})"


@dataclass
class Chunk:
    buffer: object
    row0: int
    rows: int
    moff: int          # word offset of the scale plane in the chunk's buffer


class ClWeight:
    """A weight in its device layout (layout.py), in chunks of whole rows within the largest allocation."""

    def __init__(self, dtype: str, shape: tuple, chunks: list[Chunk]):
        self.dtype, self.shape, self.chunks = dtype, tuple(shape), chunks
        self.nbytes = sum(c.buffer.size for c in chunks)

    # a single-chunk F32 weight is also usable as a plain tensor (a norm's gain)
    @property
    def buffer(self):
        return self.chunks[0].buffer

    offset = 0
    strides = None
    host = None

    def __repr__(self) -> str:
        return f"ClWeight({self.dtype}, {list(self.shape)}, {len(self.chunks)} chunks)"


class _Lease:
    __slots__ = ("__weakref__",)


def contiguous_strides(shape) -> tuple:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


class OpenCLDevice(Device):
    """An OpenCL device, driven through pyopencl: one context, one in-order queue."""

    supported_ops = COVERED

    @property
    def refused_ops(self) -> dict[str, Verdict]:
        return {op: Verdict.no("refused_by_profile", f"{op} is disabled on {self.name} by {DISABLE_OPS_ENV}")
                for op in self.disabled}

    def __init__(self, index: int, platform=None, cl_device=None, reason: str = ""):
        self.index = index
        self.name = f"opencl:{index}"
        self.buffer_type = BufferType(f"opencl:{index}")
        self.weight_buffer_type = BufferType(f"opencl:{index}:weights")
        self.disabled = disabled_ops() if cl_device is not None else frozenset()
        self.limits = Limits(dtypes=frozenset(layout.SUPPORTED))
        self.cl_device = cl_device
        if cl_device is None:
            self.available, self.unavailable_reason = False, reason or "no OpenCL device"
            self.type = DeviceType.GPU
            self.description = "OpenCL through pyopencl (unavailable)"
            self.data = {}
            return
        self.data = device_data(platform, cl_device)
        self.type = device_type(cl_device)
        self.is_cpu = self.type == DeviceType.CPU
        self.physical_id = physical_id(cl_device, index)
        self.max_alloc = settings.read(MAX_ALLOC_ENV) or self.data["max_alloc_bytes"]
        self.max_wg = self.data["max_work_group_size"]
        self.limits = Limits(memory_bytes=self.data["global_mem_bytes"], dtypes=frozenset(layout.SUPPORTED))
        self.fp64 = self.data["fp64"]
        self.int_dot = self.data["integer_dot_product"]
        self.ptx = None                   # inline PTX found by kernels.ptx() on first use (NVIDIA only)
        soft = (" -- PoCL, OpenCL on the host CPU: its timings are not GPU figures"
                if "portable computing language" in platform.name.lower() else "")
        self.description = (f"{self.data['device']} ({platform.name}, {self.data['version']}), "
                            f"{self.type.value}, OpenCL through pyopencl{soft}; "
                            f"{self.data['global_mem_bytes'] / 2**30:.1f} GiB, allocations up to "
                            f"{self.max_alloc / 2**20:.0f} MiB")
        self._context = self._queue = None
        self._lock = threading.Lock()
        self.programs: dict = {}          # build options -> cl.Program (kernels.build)
        self._scratch: list = []
        self._pool: dict[int, list] = {}
        self._pending: list = []          # events of non-blocking uploads, kept until they complete
        self._dummy = None
        self.enqueued = 0                 # kernels enqueued, all programs together
        self.runs = 0
        self.profile = {} if settings.read(PROFILE_ENV) else None

    # -- the context and the queue, made on first use -----------------------------------------
    def _open(self):
        with self._lock:
            if self._context is None:
                import pyopencl as cl
                self._context = cl.Context([self.cl_device])
                props = cl.command_queue_properties.PROFILING_ENABLE if self.profile is not None else 0
                self._queue = cl.CommandQueue(self._context, self.cl_device, properties=props)     # in order
        return self._context

    @property
    def context(self):
        return self._context or self._open()

    @property
    def queue(self):
        if self._queue is None:
            self._open()
        return self._queue

    # -- buffers ----------------------------------------------------------------------------------
    def new_buffer(self, nbytes: int):
        import pyopencl as cl
        return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, max(16, -(-int(nbytes) // 16) * 16))

    def buffer_with(self, array: np.ndarray):
        import pyopencl as cl
        array = np.ascontiguousarray(array)
        if not array.nbytes:
            return self.new_buffer(16)
        return cl.Buffer(self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=array)

    def upload(self, buffer, array: np.ndarray) -> None:
        """Copy host values into a buffer without waiting: the copy's event (which keeps `array` alive)
        is held until it has completed."""
        import pyopencl as cl
        done = cl.command_execution_status.COMPLETE
        self._pending = [e for e in self._pending if e.command_execution_status != done]
        self._pending.append(cl.enqueue_copy(self.queue, buffer, np.ascontiguousarray(array), is_blocking=False))

    def dummy(self):
        if self._dummy is None:
            self._dummy = self.new_buffer(16)
        return self._dummy

    def scratch(self, i: int, nbytes: int):
        """Scratch buffer i, at least nbytes: internal values of a program run, shared by all programs
        (the queue runs them in order and no internal value outlives its run)."""
        while len(self._scratch) <= i:
            self._scratch.append(None)
        buf = self._scratch[i]
        if buf is None or buf.size < nbytes:
            buf = self._scratch[i] = self.new_buffer(max(nbytes, 256))
        return buf

    def output_buffer(self, nbytes: int):
        """(buffer, lease) for a program's output: the buffer returns to a pool once the lease, held by
        every handle of the buffer, is gone (later commands on the in-order queue see every earlier
        use of it through)."""
        size = max(256, -(-int(nbytes) // 256) * 256)
        free = self._pool.setdefault(size, [])
        buf = free.pop() if free else self.new_buffer(size)
        lease = _Lease()
        weakref.finalize(lease, free.append, buf)
        return buf, lease

    # -- the contract --------------------------------------------------------------------------
    def supports_op(self, node: Tensor) -> Verdict:
        return verdict(self, node)

    def chunk_plan(self, dtype: str, shape: tuple) -> list[tuple[int, int]]:
        return layout.chunk_rows(dtype, shape, self.max_alloc)

    def weight_nbytes(self, tensor: Tensor) -> int:
        return layout.packed_nbytes(tensor.dtype.name, tensor.shape, self.max_alloc)

    def load_weight(self, tensor: Tensor, raw: np.ndarray) -> ClWeight:
        dtype = tensor.dtype.name
        if dtype not in layout.SUPPORTED:
            raise ValueError(f"{self.name} keeps no {dtype} weights ({tensor.describe()}); supported: "
                             f"{', '.join(sorted(layout.SUPPORTED))}")
        raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
        rb = layout.row_bytes(dtype, tensor.shape[-1])
        chunks = []
        for row0, rows in self.chunk_plan(dtype, tensor.shape):
            words, moff = layout.pack(dtype, raw[row0 * rb:(row0 + rows) * rb])
            chunks.append(Chunk(self.buffer_with(words), row0, rows, moff))
        return ClWeight(dtype, tensor.shape, chunks)

    def alloc(self, tensor: Tensor) -> ClTensor:
        import pyopencl as cl
        dt = np.float32 if tensor.dtype.name == "F32" else np.int32
        buf = self.new_buffer(tensor.nelements * 4)
        cl.enqueue_fill_buffer(self.queue, buf, np.uint32(0), 0, buf.size)
        return ClTensor(buf, 0, tensor.shape, dt)

    def from_host(self, array: np.ndarray) -> ClTensor:
        array = np.asarray(array)
        if array.dtype not in (np.float32, np.int32):
            array = array.astype(np.int32 if np.issubdtype(array.dtype, np.integer) else np.float32)
        return ClTensor(None, 0, array.shape, array.dtype, host=array)

    def to_host(self, handle) -> np.ndarray:
        import pyopencl as cl
        if isinstance(handle, np.ndarray):
            return handle
        if isinstance(handle, ClWeight):
            raise TypeError(f"{self.name}: weights are not read back ({handle})")
        if handle.host is not None:
            return np.asarray(handle.host)
        shape, strides = handle.shape, handle.strides or contiguous_strides(handle.shape)
        if math.prod(shape) == 0:
            return np.zeros(shape, handle.dtype)
        span = 1 + sum((d - 1) * s for d, s in zip(shape, strides))
        flat = np.empty(span, handle.dtype)
        cl.enqueue_copy(self.queue, flat, handle.buffer, src_offset=handle.offset * 4, is_blocking=True)
        if handle.strides is None:
            return flat.reshape(shape)
        return np.array(np.lib.stride_tricks.as_strided(flat, shape, tuple(s * 4 for s in strides)), copy=True)

    def synchronize(self) -> None:
        """Wait for the queue: a run returns once its kernels are enqueued, and the executor stops a
        fragment's clock here, so the time reported for this device includes the device's own."""
        if self._queue is not None:
            self._queue.finish()

    def compile(self, fragment):
        from .program import ClProgram
        return ClProgram(self, fragment)

    def describe(self) -> str:
        state = "available" if self.available else f"unavailable: {self.unavailable_reason}"
        what = f", {self.description}" if self.available else ""
        return f"{self.name} ({self.type.value}, {state}{what})"


def devices() -> list[OpenCLDevice]:
    from .discovery import discover
    bad = options.problem()
    if bad is not None:         # named, never taken as something else
        return [OpenCLDevice(0, reason=bad)]
    found = discover()
    if not found.devices:
        return [OpenCLDevice(0, reason=found.reason)]
    ordered = sorted(found.devices, key=lambda pd: KIND_ORDER[device_type(pd[1])])   # stable: platform order kept
    return [OpenCLDevice(i, p, d) for i, (p, d) in enumerate(ordered)]


__all__ = ["ClTensor", "ClWeight", "OpenCLDevice", "devices"]
