"""Finding OpenCL devices through pyopencl, or saying precisely why there are none.

The reasons, in the order they are checked: pyopencl cannot be imported; it imports but the OpenCL
ICD loader (libOpenCL.so.1) it links against is missing; the loader finds no platform (no ICD file
names a driver, or none of the drivers named loads); the platforms offer no device.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ...contract import settings
from .options import checked_cache_dir

INSTALL_HINT = "pip install 'pyopencl>=2024.1'"
LOADER_HINT = "Debian/Ubuntu: apt-get install ocl-icd-libopencl1"
DRIVER_HINT = ("Debian/Ubuntu: apt-get install pocl-opencl-icd (PoCL, OpenCL on the host CPU), or the GPU vendor's "
               "OpenCL driver (NVIDIA: an ICD file /etc/OpenCL/vendors/nvidia.icd naming libnvidia-opencl.so.1)")
ICD_DIR = "/etc/OpenCL/vendors"


@dataclass
class Discovery:
    """The result: (platform, device) pairs of pyopencl objects, or the reason there are none."""

    devices: list = field(default_factory=list)
    reason: str = ""


def _pocl_cache() -> None:
    """PoCL reads POCL_CACHE_DIR (and POCL_KERNEL_CACHE, 0: no cache) when the loader first opens it:
    before the first platform query."""
    try:
        root = checked_cache_dir()
    except settings.SettingError:
        return                      # the devices say why (options.problem)
    if root is None:
        os.environ.setdefault("POCL_KERNEL_CACHE", "0")
    else:
        os.environ.setdefault("POCL_CACHE_DIR", str(root / "pocl"))


def icd_files() -> list[str]:
    """The ICD files the loader reads (ocl-icd's rules: OCL_ICD_VENDORS, a folder or one file, or the
    default folder)."""
    where = os.environ.get("OCL_ICD_VENDORS") or ICD_DIR
    if os.path.isfile(where):
        return [where]
    return sorted(glob.glob(os.path.join(where, "*.icd")))


def _icd_summary(files: list[str]) -> str:
    named = []
    for f in files:
        try:
            with open(f) as fh:
                named.append(f"{os.path.basename(f)}: {fh.read().strip() or '(empty)'}")
        except OSError as e:
            named.append(f"{os.path.basename(f)}: unreadable ({e.strerror})")
    return "; ".join(named)


@lru_cache(maxsize=1)
def discover() -> Discovery:
    """The devices, found once a process."""
    _pocl_cache()
    try:
        import pyopencl as cl
    except ImportError as e:
        if "libOpenCL" in str(e):
            return Discovery([], f"pyopencl is installed but the OpenCL ICD loader it needs is not ({e}); "
                                 f"{LOADER_HINT}")
        return Discovery([], f"pyopencl is not installed or cannot be imported ({e}); {INSTALL_HINT}")
    except OSError as e:      # the loader library failed to load
        return Discovery([], f"the OpenCL ICD loader could not be loaded ({e}); {LOADER_HINT}")
    files = icd_files()
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:
        platforms = []
        detail = f" ({type(e).__name__}: {e})"
    else:
        detail = ""
    if not platforms:
        if not files:
            return Discovery([], f"no OpenCL platform: the ICD loader found no ICD file in "
                                 f"{os.environ.get('OCL_ICD_VENDORS') or ICD_DIR}{detail}; {DRIVER_HINT}")
        return Discovery([], f"no OpenCL platform: the ICD files name drivers that did not load "
                             f"({_icd_summary(files)}){detail}; {DRIVER_HINT}")
    found, empty = [], []
    for p in platforms:
        try:
            devs = p.get_devices()
        except cl.Error as e:      # a platform with no device raises DEVICE_NOT_FOUND
            empty.append(f"{p.name} ({type(e).__name__}: {e})")
            continue
        found += [(p, d) for d in devs]
        if not devs:
            empty.append(p.name)
    if not found:
        return Discovery([], f"the OpenCL platforms offer no device ({', '.join(empty)}); {DRIVER_HINT}")
    return Discovery(found)


@lru_cache(maxsize=1)
def library() -> tuple:
    """(the OpenCL ICD loader pyopencl loaded, its wheel's or else the system's, as a ctypes library; its
    path), or (None, why not): for the calls pyopencl has no name for (CL_DEVICE_PCI_BUS_INFO_KHR) or
    wraps at a cost (clEnqueueNDRangeKernel, with an event a launch)."""
    import pyopencl
    libs = sorted((Path(pyopencl.__file__).parent / ".libs").glob("libOpenCL*.so*"))   # the wheel's loader
    failed = []
    for name in [str(p) for p in libs] + [n for n in [ctypes.util.find_library("OpenCL")] if n]:
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            failed.append(f"{name}: {e}")
    return None, ("no OpenCL library found beside pyopencl or on the loader path" if not failed else
                  "no OpenCL library could be loaded (" + "; ".join(failed) + ")")
