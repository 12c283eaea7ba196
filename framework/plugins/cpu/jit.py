"""numba for the CPU plugin's fast kernels (quantized.py, attention.py, norm.py): one decorator, one cache folder, the
target numba compiles for.

Every kernel is compiled without fast-math (no reassociation, no multiply-add contraction, no approximate
reciprocals), so its float results follow from the order its loops are written in, whatever the CPU."""

from __future__ import annotations

import contextlib
import hashlib
import os
import types
from pathlib import Path

import numba
import numba.core.event

from ...contract import caches, settings
from .vectors import isa_for

SOURCES = ("jit.py", "quantized.py", "vectors.py", "attention.py", "norm.py")


def cache_dir() -> Path | None:
    """Where compiled kernels are kept: under numba's own place when NUMBA_CACHE_DIR is set, else numba/
    under the cache root (FRAMEWORK_CACHE; `framework cache clear` removes it); None when FRAMEWORK_CACHE=off
    (the kernels are compiled in every process, nothing is written). numba checks only a kernel's own file
    for changes, not the intrinsics it inlines from vectors.py, so the folder is named by a digest of the
    plugin's kernel files: an edit of any compiles afresh."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        root = Path(os.environ["NUMBA_CACHE_DIR"])
    else:
        root = settings.cache_dir("numba")
        if root is None:
            return None
    here = Path(__file__).resolve().parent
    digest = hashlib.sha1(b"".join((here / f).read_bytes() for f in SOURCES)).hexdigest()
    return root / f"cpu-{digest[:12]}"


# (a NUMBA_CACHE_DIR of the user's own is numba's to manage, not listed or cleared here)
caches.register("numba", "the cpu plugin's compiled numba kernels", lambda: settings.cache_dir("numba"))


@contextlib.contextmanager
def _cache_dir_set(folder: Path):
    """numba fixes a function's cache directory when it is decorated; set ours for our functions only."""
    saved = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(folder)
    try:
        yield
    finally:
        numba.config.CACHE_DIR = saved


def target() -> tuple[str, str]:
    """(the CPU numba compiles for, 'vnni' / 'avx2' / '' the product instructions its kernels use)."""
    from numba.core.registry import cpu_target
    _, cpu, features = cpu_target.target_context.codegen().magic_tuple()
    return cpu, isa_for(features)


def _checked(folder: Path) -> Path:
    """numba loads its cache files (pickles) without checking them, and a bad one fails every later run:
    the folder is checked against its manifest before the first kernel may load from it, and what numba
    writes is recorded when the process ends (caches.guard)."""
    caches.guard(folder, "numba kernel cache file", "the kernel is compiled again")
    return folder


class _CompileSaid(numba.core.event.Listener):
    """numba compiles a kernel on its first call where its cache has none (a first run waits for all of
    them): said once on stderr, and its time left out of every tokens-per-second figure (caches.filling)."""

    def __init__(self):
        self._fills: list = []

    def on_start(self, event) -> None:
        fill = caches.filling("compiling the cpu kernels", cached=cache_dir() is not None)
        fill.__enter__()
        self._fills.append(fill)

    def on_end(self, event) -> None:
        if self._fills:
            self._fills.pop().__exit__(None, None, None)


numba.core.event.register("numba:compile", _CompileSaid())


def _twin(fn, suffix: str):
    """fn under another name: numba's cache files a function by its name and keys it by its code and
    signature, not by its options, so a threaded and a one-thread build of one function would share an
    entry, and a later process would load whichever was compiled first for both (a decode step's head on
    one thread: twice its time)."""
    twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + suffix, fn.__defaults__, fn.__closure__)
    twin.__qualname__, twin.__doc__ = fn.__qualname__ + suffix, fn.__doc__
    return twin


def kernel(parallel: bool = False):
    """numba's njit, compiled on first use and cached on disk (a later process loads it in milliseconds),
    or not cached at all with FRAMEWORK_CACHE=off. The threaded build of a function is cached apart from
    its one-thread build (_twin)."""
    def wrap(fn):
        fn = _twin(fn, "_threads") if parallel else fn
        folder = cache_dir()
        if folder is None:
            return numba.njit(cache=False, fastmath=False, parallel=parallel, nogil=True)(fn)
        with _cache_dir_set(_checked(folder)):
            return numba.njit(cache=True, fastmath=False, parallel=parallel, nogil=True)(fn)
    return wrap
