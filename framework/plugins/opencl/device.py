"""The OpenCL device: one per OpenCL device pyopencl finds (opencl:0, opencl:1, ...; GPUs first, then
accelerators, then CPUs, each kind in platform order); tensors, the KV cache and weights in device
buffers; one in-order command queue."""

from __future__ import annotations

import threading

import numpy as np

from ...backend import AheadDevice, BackendDevice, c_kernels, weight_words
from ...contract import BufferType, DeviceType, Tensor, Verdict, settings
from . import enqueue, kernels, options
from .coverage import COVERED, MAX_HEAD
from .discovery import discover
from .options import DISABLE_OPS_ENV, MAX_ALLOC_ENV, PROFILE_ENV  # noqa: F401 (PROFILE_ENV: for the benchmark)
from .program import ClProgram
from .properties import device_data, device_type, physical_id

KIND_ORDER = {DeviceType.GPU: 0, DeviceType.ACCEL: 1, DeviceType.NPU: 1, DeviceType.CPU: 2}


class OpenCLDevice(AheadDevice, BackendDevice):
    """An OpenCL device, driven through pyopencl: one context, one in-order queue."""

    supported_ops = COVERED
    program_class = ClProgram
    disable_setting = DISABLE_OPS_ENV
    binding_unit = "one allocation"
    ahead_setting, switch_setting = options.PREENQUEUE_ENV, options.SWITCH_ENV

    max_alloc = BackendDevice.max_chunk_bytes    # the largest allocation: the buffer types' max_size

    def __init__(self, index: int, platform=None, cl_device=None, reason: str = ""):
        self.index, self.name = index, f"opencl:{index}"
        self.buffer_type = BufferType(self.name)
        self.weight_buffer_type = BufferType(f"{self.name}:weights")
        self.cl_device = cl_device
        if cl_device is None:
            self.available, self.unavailable_reason = False, reason or "no OpenCL device"
            self.type, self.data = DeviceType.GPU, {}
            self.limits = self.backend_limits(dtypes=frozenset(weight_words.SUPPORTED))
            self.description = "OpenCL through pyopencl (unavailable)"
            return
        self.disabled = settings.read(DISABLE_OPS_ENV)
        self.data = device_data(platform, cl_device)
        self.type = DeviceType(self.data["type"])
        self.is_cpu = self.type == DeviceType.CPU
        self.physical_id = physical_id(cl_device, self.data, index)
        self.max_alloc = settings.read(MAX_ALLOC_ENV) or self.data["max_alloc_bytes"]
        self.max_wg = self.data["max_work_group_size"]
        # exact_rows: measured on PoCL (tests/test_exact_rows.py); a GPU's matrix-vector kernels for a few rows are
        # not yet measured against its one-row steps, so it declares none
        self.limits = self.backend_limits(memory_bytes=self.data["global_mem_bytes"],
                                          dtypes=frozenset(weight_words.SUPPORTED),
                                          exact_rows=kernels.MATVEC_MAX_ROWS if self.is_cpu else 0)
        self.fp64 = self.data["fp64"]
        self.int_dot = self.data["integer_dot_product"]
        self.ptx = None                   # inline PTX found by kernels.ptx() on first use (NVIDIA only)
        soft = (" -- PoCL, OpenCL on the host CPU: its timings are not GPU figures"
                if "portable computing language" in platform.name.lower() else "")
        self.description = (f"{self.data['device']} ({platform.name}, {self.data['version']}), "
                            f"{self.type.value}, OpenCL through pyopencl{soft}; "
                            f"{self.data['global_mem_bytes'] / 2**30:.1f} GiB, allocations up to "
                            f"{self.max_alloc / 2**20:.0f} MiB")
        self._context = self._queue = self._values_queue = None
        self._lock = threading.Lock()
        self.programs: dict = {}          # build options -> cl.Program (kernels.build)
        self.init_backend()
        self._pending: list = []          # events of non-blocking uploads, kept until they complete
        self.enqueued = 0                 # kernels enqueued, all programs together
        self.runs = 0
        self.profile = {} if settings.read(PROFILE_ENV) else None
        self.init_ahead()                 # the run enqueued ahead (the skeleton's ahead.py)

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
        """The queue, for anything but a program's own run: a run enqueued ahead is released first (so
        nothing is queued behind its gate)."""
        self.settle()
        return self.raw_queue

    @property
    def raw_queue(self):
        if self._queue is None:
            self._open()
        return self._queue

    @property
    def values_queue(self):
        """A second in-order queue: host values written for a run enqueued ahead (behind a gate on the first)."""
        if self._values_queue is None:
            import pyopencl as cl
            self._values_queue = cl.CommandQueue(self.context, self.cl_device)
        return self._values_queue

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

    # -- the contract --------------------------------------------------------------------------
    def kernel_verdict(self, node: Tensor) -> Verdict:
        return c_kernels.verdict(self, node, "the OpenCL kernels", MAX_HEAD)

    def zeros(self, nbytes: int):
        import pyopencl as cl
        buf = self.new_buffer(nbytes)
        cl.enqueue_fill_buffer(self.queue, buf, np.uint32(0), 0, buf.size)
        return buf

    def read_buffer(self, buffer, byte_offset: int, count: int, dtype) -> np.ndarray:
        import pyopencl as cl
        flat = np.empty(count, dtype)
        cl.enqueue_copy(self.queue, flat, buffer, src_offset=byte_offset, is_blocking=True)
        return flat

    def synchronize(self) -> None:
        """Wait for the queue: a run returns once its kernels are enqueued, and the executor stops a
        fragment's clock here, so the time reported for this device includes the device's own."""
        pending = self.pending
        if pending is not None:           # the queue ends behind a gate: wait for what is before it
            pending.marker.wait()
        elif self._queue is not None:
            self._queue.finish()

    def report_line(self) -> str:
        """How kernels are enqueued (a fallback is said, never silent), and whether runs are enqueued ahead."""
        where = {"thread": "on a worker thread", "inline": "inline"}.get(self.ahead_mode)
        ahead = (f"runs enqueued ahead behind a user event ({options.PREENQUEUE_ENV}={self.ahead_mode}, "
                 f"{where}): {self.ahead_taken} taken, {self.ahead_released} released"
                 if self.ahead else f"no run enqueued ahead ({options.PREENQUEUE_ENV}=0 or profiling)")
        return f"{self.name}: kernels enqueued by {enqueue.how()}; {ahead}; {self.runs} runs, {self.enqueued} kernels"


def devices() -> list[OpenCLDevice]:
    bad = options.problem()
    if bad is not None:         # named, never taken as something else
        return [OpenCLDevice(0, reason=bad)]
    found = discover()
    if not found.devices:
        return [OpenCLDevice(0, reason=found.reason)]
    ordered = sorted(found.devices, key=lambda pd: KIND_ORDER[device_type(pd[1])])   # stable: platform order kept
    return [OpenCLDevice(i, p, d) for i, (p, d) in enumerate(ordered)]


__all__ = ["OpenCLDevice", "devices"]
