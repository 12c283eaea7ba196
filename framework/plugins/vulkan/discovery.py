"""Finding Vulkan adapters through wgpu, or saying precisely why there are none.

wgpu is forced onto its Vulkan backend before the first adapter request; an adapter of any other
backend (OpenGL, Metal, DX12) is never used, even when wgpu offers one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
import tempfile
from typing import NamedTuple

INSTALL_HINT = "pip install 'wgpu>=0.32'"
LOADER_HINT = "Debian/Ubuntu: apt-get install libvulkan1"
DRIVER_HINT = ("Debian/Ubuntu: apt-get install mesa-vulkan-drivers (Mesa's lavapipe, a CPU driver, and Mesa's GPU "
               "drivers), or the GPU vendor's driver; VK_DRIVER_FILES can name a driver's ICD manifest")

_ICD_DIRS = ("/usr/share/vulkan/icd.d", "/usr/local/share/vulkan/icd.d", "/etc/vulkan/icd.d",
             "/usr/share/vulkan/implicit_layer.d/../icd.d")


def loader_names() -> tuple[str, ...]:
    if sys.platform.startswith("win"):
        return ("vulkan-1.dll",)
    if sys.platform == "darwin":
        return ("libvulkan.1.dylib", "libvulkan.dylib", "libMoltenVK.dylib")
    return ("libvulkan.so.1", "libvulkan.so")


def find_loader() -> str | None:
    """The Vulkan loader library that can be opened, or None."""
    names = list(loader_names())
    found = ctypes.util.find_library("vulkan")
    if found:
        names.append(found)
    for name in names:
        try:
            ctypes.CDLL(name)
            return name
        except OSError:
            continue
    return None


def icd_manifests() -> list[str]:
    """Driver (ICD) manifests the Vulkan loader would read, by its own search rules (Linux)."""
    for var in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES"):
        value = os.environ.get(var)
        if value:
            out = []
            for part in value.split(os.pathsep):
                if os.path.isdir(part):
                    out += sorted(glob.glob(os.path.join(part, "*.json")))
                elif os.path.isfile(part):
                    out.append(part)
            return out
    dirs = list(_ICD_DIRS)
    for base in os.environ.get("XDG_DATA_DIRS", "").split(os.pathsep) + [os.environ.get("XDG_DATA_HOME", "")]:
        if base:
            dirs.append(os.path.join(base, "vulkan", "icd.d"))
    out = []
    for d in dirs:
        out += sorted(glob.glob(os.path.join(d, "*.json")))
    return sorted(set(out))


class Discovery(NamedTuple):
    """The result: Vulkan adapters (wgpu GPUAdapter objects) or the reason there are none."""
    adapters: list
    reason: str = ""


_cached: Discovery | None = None


def discover() -> Discovery:
    global _cached
    if _cached is None:
        _cached = _discover()
    return _cached


def _runtime_dir() -> None:
    """Mesa's loader warns on every start when XDG_RUNTIME_DIR is unset (as on servers and in CI);
    give it a private directory of this user's, which is all it asks for."""
    if os.environ.get("XDG_RUNTIME_DIR"):
        return
    path = os.path.join(tempfile.gettempdir(), f"framework-runtime-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.environ["XDG_RUNTIME_DIR"] = path


def _discover() -> Discovery:
    _runtime_dir()
    try:
        import wgpu
        from wgpu.backends.wgpu_native import extras
    except ImportError as e:
        return Discovery([], f"wgpu (wgpu-py) is not installed or cannot be imported ({e}); {INSTALL_HINT}")
    except Exception as e:   # wgpu-native's library failed to load  # noqa: BLE001
        return Discovery([], f"wgpu could not load its native library: {type(e).__name__}: {e}")
    if not sys.platform.startswith(("linux", "win", "darwin")):
        return Discovery([], f"no Vulkan support known for platform {sys.platform}")
    if find_loader() is None:
        return Discovery([], f"the Vulkan loader ({' or '.join(loader_names())}) is not installed; {LOADER_HINT}")
    manifests = icd_manifests() if sys.platform.startswith("linux") else None
    if manifests is not None and not manifests:
        where = ("VK_DRIVER_FILES/VK_ICD_FILENAMES" if os.environ.get("VK_DRIVER_FILES")
                 or os.environ.get("VK_ICD_FILENAMES") else ", ".join(_ICD_DIRS[:3]))
        return Discovery([], f"the Vulkan loader is installed but no Vulkan driver is: no ICD manifest in {where}; "
                             f"{DRIVER_HINT}")
    try:
        extras.set_instance_extras(backends=["Vulkan"])
    except RuntimeError:
        pass   # wgpu's instance exists already (made by someone else): adapters are filtered below
    try:
        adapters = wgpu.gpu.enumerate_adapters_sync()
    except Exception as e:  # noqa: BLE001
        return Discovery([], f"wgpu could not enumerate adapters: {type(e).__name__}: {e}")
    vulkan = [a for a in adapters if str(a.info.get("backend_type", "")).lower() == "vulkan"]
    others = [f"{a.info.get('device', '?')} ({a.info.get('backend_type', '?')})" for a in adapters if a not in vulkan]
    if not vulkan:
        if others:
            return Discovery([], f"wgpu offers only non-Vulkan adapters ({', '.join(others)}); the Vulkan plugin "
                                 f"does not run on them")
        listed = f" (driver manifests: {', '.join(os.path.basename(m) for m in manifests)})" if manifests else ""
        return Discovery([], f"wgpu found no Vulkan adapter: the Vulkan loader is installed, but no driver "
                             f"reported a usable device{listed}; {DRIVER_HINT}")
    return Discovery(vulkan)
