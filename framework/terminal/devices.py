"""Choosing devices for a command: --backends under --device-profile, and -t/--threads applied to
every device whose threads the framework sets."""

from __future__ import annotations

import os
from contextlib import contextmanager

from .output import err

# the openvino plugin's thread setting (INFERENCE_NUM_THREADS), read when its devices are made
OPENVINO_THREADS = "FRAMEWORK_OPENVINO_THREADS"
THREADS_REACH = "the cpu plugin's numba kernels and OpenVINO's CPU device"


def select_devices(spec: str, profile: str | None = None, threads: int | None = None):
    """Resolve --backends, under --device-profile when given, with ``threads`` (-t) for the devices whose
    threads the framework sets; say when two chosen devices are one physical device."""
    from ..registry import default_registry
    with _openvino_threads(threads):
        registry = default_registry()
        devices = registry.select(spec, profile)
    if threads is not None:
        apply_threads(threads)
    for group in registry.same_silicon():
        chosen = [d.name for d in group if d in devices]
        if len(chosen) > 1:
            err.print(f"[yellow]note: {' and '.join(chosen)} are {_reached_as(group, chosen)} on one physical "
                      f"device ({group[0].physical_id})[/yellow]", soft_wrap=True)
    return devices


def _reached_as(group, chosen: list[str]) -> str:
    """How the chosen devices of one chip are reached: several devices of one plugin (two GPUs a driver
    lists twice, or two queues of one) or several plugins."""
    plugins = sorted({d.name.split(":")[0] for d in group if d.name in chosen})
    if len(plugins) == 1:
        return f"devices of the {plugins[0]} plugin"
    return f"reached through {len(plugins)} plugins ({', '.join(plugins)})"


@contextmanager
def _openvino_threads(threads: int | None):
    """The OpenVINO devices read their thread setting when they are made: set it for the making only, so
    the process's environment is left as it was."""
    if threads is None:
        yield
        return
    saved = os.environ.get(OPENVINO_THREADS)
    os.environ[OPENVINO_THREADS] = str(threads)
    try:
        yield
    finally:
        if saved is None:
            del os.environ[OPENVINO_THREADS]
        else:
            os.environ[OPENVINO_THREADS] = saved


def apply_threads(threads: int) -> int:
    """The cpu plugin's kernels take ``threads`` (numba's pool, at most the threads it started with).
    Returns the count applied."""
    import numba
    applied = min(threads, numba.config.NUMBA_NUM_THREADS)
    numba.set_num_threads(applied)
    if applied < threads:
        err.print(f"[yellow]note: -t {threads}: numba started with {applied} threads (NUMBA_NUM_THREADS), so the cpu "
                  f"plugin's kernels take {applied}[/yellow]", soft_wrap=True)
    return applied
