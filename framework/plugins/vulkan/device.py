"""The Vulkan device: one per Vulkan adapter wgpu reports; tensors and weights in device buffers."""

from __future__ import annotations

import threading

import numpy as np

from ...backend import BackendDevice, weight_words
from ...contract import (HOST_CPU, BufferType, DeviceType, Tensor, Verdict, host_memory_limit,
                         pci_physical_id, settings)
from . import options
from .fusion import fusions_off
from .kernel_shapes import MATVEC_MAX_ROWS
from .options import DISABLE_OPS_ENV, F16_ENV, PROFILE_ENV, SUBGROUPS_ENV
from .steps import source
from .submission import ENCODING, VkProgram, wait_for_queue
from .verdicts import OPS, verdict

options.declare(OPS)

ADAPTER_TYPES = {"DiscreteGPU": DeviceType.GPU, "IntegratedGPU": DeviceType.GPU, "VirtualGPU": DeviceType.GPU,
                 "CPU": DeviceType.CPU}
# the adapter's limits the device reports in its data (as max_buffer_size, ...), the workgroup size's after the third
LIMITS = ("max-buffer-size", "max-storage-buffer-binding-size", "max-storage-buffers-per-shader-stage",
          "max-compute-invocations-per-workgroup", "max-compute-workgroup-storage-size",
          "max-compute-workgroups-per-dimension")
# the data's entries taken from the adapter's info as they are
INFO = {"adapter": "device", "vendor": "vendor", "driver": "description", "adapter_type": "adapter_type",
        "backend": "backend_type", "vendor_id": "vendor_id", "device_id": "device_id"}


class VulkanDevice(BackendDevice):
    """A Vulkan adapter, driven through wgpu's compute API."""

    weights_in_programs = False
    supported_ops = OPS
    program_class = VkProgram
    disable_setting = DISABLE_OPS_ENV
    binding_unit = "one storage binding"
    even_chunks = True          # the kernels read each chunk's scale plane in word pairs (two f16 scales)

    max_binding = BackendDevice.max_chunk_bytes    # the most one storage binding holds: the buffer types' max_size

    def __init__(self, index: int, adapter=None, reason: str = ""):
        self.index = index
        self.name = f"vulkan:{index}"
        self.adapter = adapter
        self.buffer_type = BufferType(f"vulkan:{index}")
        self.weight_buffer_type = BufferType(f"vulkan:{index}:weights")
        self.disabled = settings.read(DISABLE_OPS_ENV) if adapter is not None else frozenset()
        if adapter is None:
            self.available, self.unavailable_reason = False, reason or "no Vulkan adapter"
            self.type = DeviceType.GPU
            self.description = "Vulkan through wgpu (unavailable)"
            self.data = {}
            self.limits = self.backend_limits(dtypes=frozenset(weight_words.SUPPORTED))
            return
        info = dict(adapter.info)
        alim = dict(adapter.limits)
        feats = set(adapter.features)
        self.type = ADAPTER_TYPES.get(str(info.get("adapter_type")), DeviceType.GPU)
        # a CPU adapter (lavapipe) runs on the host's CPU; a GPU is known by its PCI ids (wgpu reports no bus)
        self.physical_id = (HOST_CPU if self.type == DeviceType.CPU else
                            pci_physical_id(int(info.get("vendor_id", 0)), int(info.get("device_id", 0))))
        # a software (CPU) adapter runs barrier-free register-tiled kernels far better than cooperative ones
        self.cpu_adapter = self.type == DeviceType.CPU
        self.f16 = "shader-f16" in feats and settings.read(F16_ENV)
        # subgroup shuffles reduce the matrix-vector kernel's sums where a team fits in the smallest subgroup
        self.subgroups = "subgroup" in feats and settings.read(SUBGROUPS_ENV)
        # wgpu 0.32 reports the API's bounds (4..128), not the GPU's; NVIDIA's subgroups are always 32 wide
        self.subgroup_min = 32 if info.get("vendor_id") == 0x10DE else int(
            info.get("subgroup_min_size", info.get("stackgroup_min_size")) or 0)
        self.max_binding = int(min(alim.get("max-storage-buffer-binding-size", 1 << 27),
                                   alim.get("max-buffer-size", 1 << 28)))
        self.data = {key: info.get(name, None if key.endswith("_id") else "") for key, name in INFO.items()}
        self.data |= {name.replace("-", "_"): alim.get(name) for name in LIMITS[:3]}
        self.data["max_compute_workgroup_size"] = tuple(alim.get(f"max-compute-workgroup-size-{a}") for a in "xyz")
        self.data |= {name.replace("-", "_"): alim.get(name) for name in LIMITS[3:]}
        self.data |= {
            "shader_f16": "shader-f16" in feats, "f16_in_use": self.f16,
            "subgroups": "subgroup" in feats, "subgroups_in_use": self.subgroups,
            "subgroup_size": (info.get("subgroup_min_size", info.get("stackgroup_min_size")),
                              info.get("subgroup_max_size", info.get("stackgroup_max_size"))),
        }
        kind = {"CPU": "a CPU (software) Vulkan adapter",
                "DiscreteGPU": "a discrete GPU", "IntegratedGPU": "an integrated GPU"}.get(
            str(info.get("adapter_type")), f"a {info.get('adapter_type')} adapter")
        soft = (" -- Mesa's lavapipe, which runs Vulkan on the host CPU: its timings are not GPU figures"
                if "llvmpipe" in str(info.get("device", "")).lower() else "")
        self.description = (f"{info.get('device', '?')} ({info.get('description', '')}), {kind}, Vulkan through wgpu"
                            f"{soft}; storage bindings up to {self.max_binding / 2**20:.0f} MiB, "
                            f"f16 {'on' if self.f16 else 'off'}")
        # a CPU adapter (lavapipe) computes in host memory; wgpu reports no GPU's memory size
        # exact_rows: measured on lavapipe (tests/test_exact_rows.py); a GPU's matrix-vector kernels for a few rows
        # are not yet measured against its one-row steps, so it declares none
        self.limits = self.backend_limits(dtypes=frozenset(weight_words.SUPPORTED),
                                          memory_bytes=host_memory_limit() if self.cpu_adapter else None,
                                          exact_rows=MATVEC_MAX_ROWS if self.cpu_adapter else 0)
        self._gpu = None
        self._lock = threading.Lock()
        self._pipelines: dict = {}
        self.init_backend()
        self.uploads = 0
        self.submits = 0
        self.compiled: list[tuple[int, int]] = []     # per program compiled: (rows of x, dispatches a run)
        # FRAMEWORK_VULKAN_PROFILE=1: GPU time per kernel (one pass per dispatch, timestamps around each)
        self.timestamps = "timestamp-query" in feats
        self.profile = {} if settings.read(PROFILE_ENV) and self.timestamps else None
        self.pass_times: list[float] | None = None     # a list: each run's GPU time, one pass timed whole
        self.last_stage = None         # the read-back copies of the last run submitted (submission.Stage), if any

    # -- the wgpu device, made on first use ----------------------------------------------------
    @property
    def gpu(self):
        if self._gpu is None:
            with self._lock:
                if self._gpu is None:
                    feats = ["shader-f16"] if self.f16 else []
                    if self.timestamps:
                        feats.append("timestamp-query")
                    if "subgroup" in self.adapter.features:
                        feats.append("subgroup")
                    alim = dict(self.adapter.limits)
                    want = {k: alim[k] for k in ("max-storage-buffer-binding-size", "max-buffer-size",
                                                 "max-storage-buffers-per-shader-stage",
                                                 "max-compute-workgroup-storage-size",
                                                 "max-compute-invocations-per-workgroup",
                                                 "max-compute-workgroup-size-x") if k in alim}
                    self._gpu = self.adapter.request_device_sync(required_features=feats, required_limits=want,
                                                                 label=self.name)
        return self._gpu

    # -- buffers ----------------------------------------------------------------------------------
    def new_buffer(self, nbytes: int, usage=None):
        import wgpu
        if usage is None:
            usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        return self.gpu.create_buffer(size=max(16, -(-int(nbytes) // 16) * 16), usage=usage)

    def buffer_with(self, array: np.ndarray):
        array = np.ascontiguousarray(array)
        buf = self.new_buffer(array.nbytes)
        if array.nbytes:
            self.gpu.queue.write_buffer(buf, 0, _padded(array))
        self.uploads += array.nbytes
        return buf

    # -- pipelines, made once and cached ------------------------------------------------------
    def pipeline(self, key: tuple, rw: tuple[bool, ...]):
        """(pipeline, bind group layout) for the kernel `key` names (steps.source); `rw`: per storage binding,
        written or only read."""
        hit = self._pipelines.get(key)
        if hit is not None:
            return hit
        import wgpu
        module = self.gpu.create_shader_module(code=source(key), label=str(key[0]))
        entries = [{"binding": 0, "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {"type": wgpu.BufferBindingType.uniform}}]
        for i, w in enumerate(rw):
            entries.append({"binding": i + 1, "visibility": wgpu.ShaderStage.COMPUTE,
                            "buffer": {"type": wgpu.BufferBindingType.storage if w
                                       else wgpu.BufferBindingType.read_only_storage}})
        bgl = self.gpu.create_bind_group_layout(entries=entries)
        layout = self.gpu.create_pipeline_layout(bind_group_layouts=[bgl])
        pipe = self.gpu.create_compute_pipeline(layout=layout, compute={"module": module, "entry_point": "main"},
                                                label=str(key))
        self._pipelines[key] = (pipe, bgl)
        return pipe, bgl

    # -- the contract --------------------------------------------------------------------------
    def kernel_verdict(self, node: Tensor) -> Verdict:
        return verdict(self, node)

    def read_buffer(self, buffer, byte_offset: int, count: int, dtype) -> np.ndarray:
        data = self.gpu.queue.read_buffer(buffer, byte_offset, count * 4)
        return np.frombuffer(data, dtype=dtype, count=count)

    def synchronize(self) -> None:
        """Wait for the queue: a run returns once its commands are submitted, and the executor stops its
        clock here, so the time reported for this device includes the GPU's own."""
        # where the last run copied its outputs for reading back, mapping that copy waits, and the read-back
        # then needs no submission of its own; else wgpu-native's device poll waits for the queue (and where
        # wgpu's _ffi module is missing, reading 16 bytes back waits for every command submitted before it:
        # wgpu-py 0.32's queue.on_submitted_work_done_sync() fails in its own bindings, a cffi callback type
        # mismatch)
        if self.last_stage is not None:
            self.last_stage.wait()
        elif self._gpu is not None and not wait_for_queue(self._gpu):
            self._gpu.queue.read_buffer(self.dummy(), 0, 16)

    def compile(self, fragment):
        program = super().compile(fragment)
        rows = max((n.src[1].nelements // n.src[1].shape[-1] for n in fragment.nodes if n.op == "MUL_MAT"), default=0)
        self.compiled.append((rows, len(program.steps)))
        return program

    def compile_summary(self) -> str:
        """The report line: programs, pipelines, and each program's dispatches a run (a decode step's is
        the figure fusion lowers), with the fusions off (FRAMEWORK_VULKAN_UNFUSE)."""
        runs = ", ".join(f"{d} ({r} row{'s' * (r != 1)} of x)" for r, d in self.compiled)
        off = sorted(fusions_off())
        return (f"{self.name}: {len(self.compiled)} programs, {len(self._pipelines)} pipelines; dispatches a run: "
                f"{runs or 'none'}; fusions off: {', '.join(off) if off else 'none'}; {ENCODING}"
                + ("" if not self.cpu_adapter else " (a CPU adapter fuses no decode kernels)"))


def _padded(array: np.ndarray) -> np.ndarray:
    b = array.reshape(-1).view(np.uint8)
    if b.size % 4:
        b = np.concatenate([b, np.zeros(4 - b.size % 4, np.uint8)])
    return b


def devices() -> list[VulkanDevice]:
    from .discovery import discover
    bad = options.problem()
    if bad is not None:
        return [VulkanDevice(0, None, bad)]
    found = discover()
    if not found.adapters:
        return [VulkanDevice(0, None, found.reason)]
    return [VulkanDevice(i, a) for i, a in enumerate(found.adapters)]


__all__ = ["VulkanDevice", "devices"]
