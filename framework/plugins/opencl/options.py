"""The OpenCL plugin's settings (environment variables), declared once and read through framework.settings,
and where its compiled kernels are cached."""

from __future__ import annotations

from pathlib import Path

from ...backend import fusion
from ...contract import caches, settings

DISABLE_OPS_ENV = "FRAMEWORK_OPENCL_DISABLE_OPS"   # comma-separated ops to refuse (tests of mixed plans)
MAX_ALLOC_ENV = "FRAMEWORK_OPENCL_MAX_ALLOC"       # bytes: a smaller largest allocation (tests of split weights)
PROFILE_ENV = "FRAMEWORK_OPENCL_PROFILE"           # on: device time per kernel in device.profile (program.py)
MATVEC_ENV = "FRAMEWORK_OPENCL_MATVEC"             # tuning / tests: "v=1,tpr=8,r=2,wg=64,x8=1,xl=0,dp4a=0,shfl=0"
MATMUL_ENV = "FRAMEWORK_OPENCL_MATMUL"             # tuning / tests: "bm=32,bn=64,tm=4,tn=4", "reg=1,rtm=2"
UNFUSE_ENV = "FRAMEWORK_OPENCL_UNFUSE"             # decode fusions to turn off (framework/core/graph/fusion.py), or all
PREENQUEUE_ENV = "FRAMEWORK_OPENCL_PREENQUEUE"     # thread / inline / off: how the next run is enqueued ahead
SWITCH_ENV = "FRAMEWORK_OPENCL_ENQUEUE_SWITCH_US"  # the interpreter's switch interval while a worker enqueues
PREENQUEUE_MODES = ("thread", "inline", "off")
# the matrix-vector kernel's settings and the values each may take (kernels.matvec_shape says what they do)
MATVEC_KEYS = {"v": (0, 1), "tpr": (1, 2, 4, 8, 16, 32), "r": tuple(range(1, 9)),
               "wg": (32, 64, 128, 256, 512, 1024), "x8": (0, 1), "xl": (0, 1), "dp4a": (0, 1), "shfl": (0, 1)}
MATMUL_KEYS = ("bm", "bn", "tm", "tn", "reg", "rtm", "rtn", "rwg")
NAMES = (DISABLE_OPS_ENV, MAX_ALLOC_ENV, PROFILE_ENV, MATVEC_ENV, MATMUL_ENV, UNFUSE_ENV, PREENQUEUE_ENV, SWITCH_ENV)


def _matvec(text: str) -> dict[str, int]:
    out = {}
    for item in settings.names(text.replace(" ", "")):
        key, eq, value = item.partition("=")
        allowed = MATVEC_KEYS.get(key)
        if not eq or allowed is None or not value.lstrip("-").isdigit() or int(value) not in allowed:
            known = "; ".join(f"{k}: {'/'.join(map(str, v)) if len(v) < 7 else f'{v[0]}..{v[-1]}'}"
                              for k, v in MATVEC_KEYS.items())
            raise ValueError(f"{item!r} is not a setting of the matrix-vector kernel; settings are key=value, "
                             f"separated by commas ({known})")
        out[key] = int(value)
    return out


def _preenqueue(text: str) -> str:
    """thread, inline or off; a flag's values mean inline (on) and off."""
    value = text.strip().lower()
    if value in PREENQUEUE_MODES:
        return value
    return "inline" if settings.flag(value) else "off"


def declare(ops: frozenset[str]) -> None:
    settings.declare(DISABLE_OPS_ENV, "opencl", f"comma-separated ops among {', '.join(sorted(ops))}", frozenset(),
                     "ops every OpenCL device refuses (to test mixed plans)",
                     settings.op_names(ops, "the OpenCL plugin"))
    settings.declare(MAX_ALLOC_ENV, "opencl", "a whole number of bytes, at least 1", None,
                     "the largest allocation, below the device's own (to test split weights)", settings.whole(1))
    settings.declare(PROFILE_ENV, "opencl", settings.FLAG_ACCEPTS, False,
                     "device time per kernel from profiling events", settings.flag)
    settings.declare(MATVEC_ENV, "opencl", f"KEY=N,... with KEY one of {', '.join(MATVEC_KEYS)}", {},
                     "tuning: overrides the matrix-vector kernel's shape", _matvec)
    settings.declare(MATMUL_ENV, "opencl", f"KEY=N,... with KEY one of {', '.join(MATMUL_KEYS)}", {},
                     "tuning: overrides the tiled and register-tiled products' shapes", settings.tuning(MATMUL_KEYS))
    settings.declare(UNFUSE_ENV, "opencl", f"comma-separated fusions among {', '.join(fusion.FUSIONS)}, or all",
                     frozenset(), "fusions of the decode kernels to turn off (to compare them)",
                     lambda text: fusion.parse_off(text, UNFUSE_ENV))
    settings.declare(PREENQUEUE_ENV, "opencl", f"thread, inline or off ({settings.FLAG_ACCEPTS}: on is inline)",
                     "inline", "a program run again with the same buffers (decode) enqueues its next run behind a "
                     "user event, released when that run comes: on the caller's thread before the run returns "
                     "(inline), on a worker thread of the device while the caller goes on (thread: on the H200 no "
                     "faster); off: every run enqueued when it comes", _preenqueue)
    settings.declare(SWITCH_ENV, "opencl", "a whole number of microseconds, 0 to 5000 (0: Python's own)", 20,
                     "the interpreter's switch interval (sys.setswitchinterval) while a worker thread enqueues a run "
                     "ahead, so it takes the interpreter lock back between its kernels while the caller runs Python",
                     settings.whole(0, 5000))


def problem() -> str | None:
    """Why the plugin's settings cannot be used (None when they all parse)."""
    try:
        for name in (*NAMES, settings.CACHE.name):
            settings.read(name)
    except settings.SettingError as e:
        return f"bad opencl settings: {e}"
    return None


def cache_dir() -> Path | None:
    """Where compiled kernels are kept (pyopencl's binaries and PoCL's own cache): opencl/ under the cache
    root; None when FRAMEWORK_CACHE=off."""
    return settings.cache_dir("opencl")


caches.register("opencl", "OpenCL kernel binaries (pyopencl's and PoCL's)", cache_dir)


def checked_cache_dir() -> Path | None:
    """cache_dir(), checked against its manifest before PoCL or pyopencl may read it: PoCL aborts the process
    on a bad program in its cache, so it is handed only files the manifest vouches for (caches.guard). A
    folder that cannot be written is left to kernels.py, which says so."""
    root = cache_dir()
    if root is not None and caches.unwritable(root) is None:
        caches.guard(root, "OpenCL kernel cache file", "the kernel is built again")
    return root
