"""Finding CUDA GPUs through CuPy, or saying precisely why there are none, and what each one is.

The reasons, in the order they are checked: CuPy cannot be imported; it imports but the CUDA runtime
cannot reach a driver (libcuda.so.1 missing, or older than CuPy's runtime); the driver counts no GPU.
The physical id is the GPU's PCI address, the form the Vulkan and OpenCL plugins report, so that
`framework backends` shows cuda:0, vulkan:0 and opencl:0 of one card as one chip.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...contract import pci_address, pci_physical_id

INSTALL_HINT = "pip install cupy-cuda12x or cupy-cuda13x (the CuPy wheel of the driver's CUDA major version)"
DRIVER_HINT = "install NVIDIA's driver (libcuda.so.1), at least the version CuPy's CUDA runtime needs"


@dataclass
class Discovery:
    """The result: the GPUs' properties (one dict each, by CUDA ordinal), or the reason there are none."""
    gpus: list = field(default_factory=list)
    reason: str = ""


_cached: Discovery | None = None


def discover() -> Discovery:
    global _cached
    if _cached is None:
        _cached = _discover()
    return _cached


def _discover() -> Discovery:
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
