"""What the host machine has: the memory devices that compute in host memory declare as their limit."""

from __future__ import annotations

import functools
import os
from pathlib import Path

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
