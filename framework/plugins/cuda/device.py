"""The CUDA device: one per GPU CuPy finds (cuda:0, cuda:1, ...); tensors, the KV cache and weights
(kept quantized) in device memory; every copy and kernel on one non-blocking stream of its own, so
that a decode step can be captured as a CUDA graph (program.py)."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from ...backend import BackendDevice
from ...contract import BufferType, DeviceType, Tensor, Verdict, settings
from . import options
from .coverage import COVERED, WEIGHT_TYPES, disabled_ops, verdict
from .program import CudaProgram

PINNED_READ_FROM = 1 << 16   # bytes from which a read goes through pinned memory


class CudaDevice(BackendDevice):
    """A CUDA GPU, driven through CuPy: one stream, modules compiled by NVRTC."""

    supported_ops = COVERED
    program_class = CudaProgram
    disable_setting = options.DISABLE_OPS_ENV
    type = DeviceType.GPU
    tf32 = True                 # prefill's tiled products on tensor cores where the GPU has them (FRAMEWORK_CUDA_TF32)
    x8 = "rows"                 # which matrix-vector products take x in 8 bits (FRAMEWORK_CUDA_X8)

    def __init__(self, index: int, props: dict | None = None, reason: str = ""):
        self.index, self.name = index, f"cuda:{index}"
        self.buffer_type = BufferType(self.name, max_size=options.MAX_BUFFER)
        self.weight_buffer_type = BufferType(f"{self.name}:weights", max_size=options.MAX_BUFFER)
        self.limits = self.backend_limits(dtypes=frozenset(WEIGHT_TYPES))
        self.data = props or {}
        if props is None:
            self.available, self.unavailable_reason = False, reason or "no CUDA GPU"
            self.description = "CUDA through CuPy (unavailable)"
            return
        self.disabled = disabled_ops()
        self.physical_id = props["physical_id"]
        self.max_chunk_bytes = settings.read(options.MAX_ALLOC_ENV) or options.MAX_BUFFER
        self.limits = self.backend_limits(memory_bytes=props["global_mem_bytes"], dtypes=frozenset(WEIGHT_TYPES))
        self.description = (f"{props['device']}, compute capability {props['compute_capability']}, "
                            f"{props['global_mem_bytes'] / 2**30:.1f} GiB, PCI {props['pci_address']}; CUDA through "
                            f"CuPy (driver {props['driver_version']}, runtime {props['runtime_version']})")
        self.graphs = settings.read(options.GRAPHS_ENV)
        self.tf32, self.x8 = settings.read(options.TF32_ENV), settings.read(options.X8_ENV)
        self.modules: dict = {}         # build options -> cupy.RawModule (kernels.build)
        self.runs = self.replays = self.captures = 0
        self._stream = None
        self.init_backend()

    @property
    def cupy_device(self):
        import cupy
        return cupy.cuda.Device(self.index)

    @property
    def stream(self):
        """The device's stream (non-blocking: no implicit ordering with the legacy default stream, which
        graph capture forbids), made on first use."""
        if self._stream is None:
            import cupy
            with self.cupy_device:
                self._stream = cupy.cuda.Stream(non_blocking=True)
        return self._stream

    @contextmanager
    def on_device(self):
        """A context in which CuPy works on this GPU and stream (its operations are ordered on it)."""
        with self.cupy_device, self.stream:
            yield

    # -- buffers: CuPy arrays of bytes -------------------------------------------------------------
    def new_buffer(self, nbytes: int):
        import cupy
        with self.on_device():
            return cupy.empty(max(16, -(-int(nbytes) // 16) * 16), np.uint8)

    def zeros(self, nbytes: int):
        import cupy
        with self.on_device():
            return cupy.zeros(max(16, -(-int(nbytes) // 16) * 16), np.uint8)

    def buffer_with(self, array: np.ndarray):
        import cupy
        flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        if not flat.nbytes:
            return self.new_buffer(16)
        with self.on_device():
            return cupy.asarray(flat)

    def read_buffer(self, buffer, byte_offset: int, count: int, dtype) -> np.ndarray:
        """count values from the buffer; a large read (logits) lands in pinned host memory from CuPy's pool,
        which the copy fills directly (pageable memory is staged by the driver through its own pinned
        buffers)."""
        import cupy
        dtype = np.dtype(dtype)
        n = count * dtype.itemsize
        src = buffer[byte_offset:byte_offset + n]
        with self.on_device():
            if n < PINNED_READ_FROM:
                return src.get(stream=self.stream).view(dtype)
            host = np.frombuffer(cupy.cuda.alloc_pinned_memory(n), np.uint8, n)
            src.get(stream=self.stream, out=host)           # blocking: returns once the copy is done
        return host.view(dtype)

    def synchronize(self) -> None:
        """Wait for the stream: a run returns once its work is queued, and the executor stops a fragment's
        clock here, so the time reported for this device includes the device's own."""
        if self._stream is not None:
            self._stream.synchronize()

    # -- the contract ----------------------------------------------------------------------------
    def kernel_verdict(self, node: Tensor) -> Verdict:
        return verdict(self, node)

    def report_line(self) -> str:
        how = "decode steps captured as CUDA graphs" if self.graphs else f"no CUDA graphs ({options.GRAPHS_ENV}=0)"
        return (f"{self.name}: {how}; {self.runs} runs, {self.captures} captured, {self.replays} replayed; "
                f"{len(self.modules)} modules compiled")


def devices() -> list[CudaDevice]:
    from .discovery import discover
    bad = options.problem()
    if bad is not None:         # named, never taken as something else
        return [CudaDevice(0, reason=bad)]
    found = discover()
    if not found.gpus:
        return [CudaDevice(0, reason=found.reason)]
    return [CudaDevice(i, p) for i, p in enumerate(found.gpus)]


__all__ = ["CudaDevice", "devices"]
