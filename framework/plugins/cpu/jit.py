"""numba for the CPU plugin's fast kernels (quantized.py, attention.py, norm.py): one decorator, one cache folder, the
target numba compiles for.

Every kernel is compiled without fast-math (no reassociation, no multiply-add contraction, no approximate
reciprocals), so its float results follow from the order its loops are written in, whatever the CPU."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

import numba

from .vectors import isa_for

SOURCES = ("jit.py", "quantized.py", "vectors.py", "attention.py", "norm.py")


def cache_dir() -> Path:
    """Where compiled kernels are kept: under numba's own place when NUMBA_CACHE_DIR is set, else under
    $FRAMEWORK_CACHE/numba (default ~/.cache/framework/numba, which `make clean-cache` removes). numba
    checks only a kernel's own file for changes, not the intrinsics it inlines from vectors.py, so the
    folder is named by a digest of the plugin's kernel files: an edit of any compiles afresh."""
    root = (Path(os.environ["NUMBA_CACHE_DIR"]) if os.environ.get("NUMBA_CACHE_DIR") else
            Path(os.environ.get("FRAMEWORK_CACHE", Path.home() / ".cache" / "framework")) / "numba")
    here = Path(__file__).resolve().parent
    digest = hashlib.sha1(b"".join((here / f).read_bytes() for f in SOURCES)).hexdigest()
    return root / f"cpu-{digest[:12]}"


@contextlib.contextmanager
def _cache_dir_set():
    """numba fixes a function's cache directory when it is decorated; set ours for our functions only."""
    saved = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(cache_dir())
    try:
        yield
    finally:
        numba.config.CACHE_DIR = saved


def target() -> tuple[str, str]:
    """(the CPU numba compiles for, 'vnni' / 'avx2' / '' the product instructions its kernels use)."""
    from numba.core.registry import cpu_target
    _, cpu, features = cpu_target.target_context.codegen().magic_tuple()
    return cpu, isa_for(features)


def kernel(parallel: bool = False):
    """numba's njit, compiled on first use and cached on disk (a later process loads it in milliseconds)."""
    def wrap(fn):
        with _cache_dir_set():
            return numba.njit(cache=True, fastmath=False, parallel=parallel, nogil=True)(fn)
    return wrap
