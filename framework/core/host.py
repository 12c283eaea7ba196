"""What the host machine has: the memory devices that compute in host memory declare as their limit; and a
weight's file pages given back once a plugin holds its own copy."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

MARGIN_FRACTION = 0.10          # left for the interpreter, the libraries and everything else running
MARGIN_MIN = 512 << 20


def _cgroup_limit() -> int | None:
    """The memory limit of this process's cgroup (v2, then v1), if it sets one."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:      # "max", or v1's huge number: no limit
            return int(text)
    return None


@functools.lru_cache(maxsize=1)
def host_memory() -> tuple[int, str]:
    """(bytes, where that figure comes from): physical memory, or the cgroup's limit when lower."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        where = "physical memory"
    except (ValueError, OSError, AttributeError):      # no sysconf names on this platform
        total, where = 0, ""
    limit = _cgroup_limit()
    if limit is not None and (not total or limit < total):
        total, where = limit, "the cgroup's memory limit"
    return total, where


def host_memory_limit() -> int | None:
    """What a device computing in host memory may plan to use: the host's memory less a margin
    (10%, at least 512 MiB). None where the host's memory cannot be read."""
    total, _ = host_memory()
    if not total:
        return None
    return max(0, total - max(int(total * MARGIN_FRACTION), MARGIN_MIN))


def release_file_pages(raw: np.ndarray) -> None:
    """Drop from this process's resident memory the pages of the model file a weight was copied from, for a plugin
    that holds its own copy (OpenVINO's repacked weights, every compiled model its own again; the cpu plugin's
    interleaved ones): the file's pages would only add the file's size to the peak (docs/openvino.md, "Memory").
    Only for bytes of a read-only file mapping (an ``np.memmap`` of the GGUF file): there MADV_DONTNEED forgets
    pages that are read again from the file if touched; on any other memory it would zero them, so anything else
    is left alone."""
    import mmap
    base = raw
    while isinstance(base, np.ndarray):
        base = base.base
    # a read-only mapping is a file's (an anonymous or copy-on-write one is writable, and would lose its bytes)
    if not isinstance(base, mmap.mmap) or not hasattr(base, "madvise") or raw.size == 0 or \
            not memoryview(base).readonly:
        return
    start = raw.ctypes.data - np.frombuffer(base, dtype=np.uint8, count=1).ctypes.data
    page = mmap.PAGESIZE
    lo, hi = -(-start // page) * page, (start + raw.nbytes) // page * page
    if hi > lo:
        base.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
