"""Finding CUDA GPUs through CuPy, or saying precisely why there are none, and what each one is.

The reasons, in the order they are checked: CuPy cannot be imported; it imports but the CUDA runtime
cannot reach a driver (libcuda.so.1 missing, or older than CuPy's runtime); the driver counts no GPU.
The physical id is the GPU's PCI address, the form the Vulkan and OpenCL plugins report, so that
`framework backends` shows cuda:0, vulkan:0 and opencl:0 of one card as one chip.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ...contract import caches, pci_address, pci_physical_id, settings

INSTALL_HINT = "pip install cupy-cuda12x or cupy-cuda13x (the CuPy wheel of the driver's CUDA major version)"
DRIVER_HINT = "install NVIDIA's driver (libcuda.so.1), at least the version CuPy's CUDA runtime needs"


@dataclass
class Discovery:
    """The result: the GPUs' properties (one dict each, by CUDA ordinal), or the reason there are none."""
    gpus: list = field(default_factory=list)
    reason: str = ""


_cached: Discovery | None = None


def cache_dir():
    """Where CuPy keeps the modules NVRTC compiled: cuda/ under the cache root; None when FRAMEWORK_CACHE=off."""
    return settings.cache_dir("cuda")


caches.register("cuda", "CUDA kernel modules (CuPy's NVRTC cache)", cache_dir)


def _cupy_cache() -> None:
    """CuPy reads CUPY_CACHE_DIR (and CUPY_CACHE_IN_MEMORY, 1: no files) when it first compiles: its
    modules go under the project's cache root, or nowhere on disk with FRAMEWORK_CACHE=off."""
    try:
        root = cache_dir()
    except settings.SettingError:
        return                      # the devices say why (options.problem)
    if root is None:
        os.environ.setdefault("CUPY_CACHE_IN_MEMORY", "1")
    else:
        os.environ.setdefault("CUPY_CACHE_DIR", str(root))


def discover() -> Discovery:
    global _cached
    if _cached is None:
        _cached = _discover()
    return _cached


def _discover() -> Discovery:
    _cupy_cache()
    try:
        import cupy
    except ImportError as e:
        return Discovery([], f"CuPy is not installed or cannot be imported ({e}); {INSTALL_HINT}")
    runtime = cupy.cuda.runtime
    try:
        count = runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001  (CUDARuntimeError, or the loader's own error: named in the reason)
        return Discovery([], f"CuPy {cupy.__version__} imports but CUDA reaches no driver "
                             f"({type(e).__name__}: {e}); {DRIVER_HINT}")
    if count == 0:
        return Discovery([], f"the CUDA driver counts no GPU (CuPy {cupy.__version__}); {DRIVER_HINT}")
    return Discovery([properties(runtime, i) for i in range(count)])


def properties(runtime, index: int) -> dict:
    """What `framework backends` shows of GPU `index`: name, compute capability, memory, PCI bus id."""
    p = runtime.getDeviceProperties(index)
    name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
    address = pci_address(int(p["pciDomainID"]), int(p["pciBusID"]), int(p["pciDeviceID"]), 0)
    return {"device": name, "compute_capability": f"{p['major']}.{p['minor']}",
            "global_mem_bytes": int(p["totalGlobalMem"]), "multiprocessors": int(p["multiProcessorCount"]),
            "shared_mem_per_block": int(p["sharedMemPerBlock"]), "max_threads_per_block": int(p["maxThreadsPerBlock"]),
            "pci_address": address, "physical_id": pci_physical_id(address=address),
            "driver_version": runtime.driverGetVersion(), "runtime_version": runtime.runtimeGetVersion()}
