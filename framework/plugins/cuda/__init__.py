"""The CUDA backend plugin: CUDA C kernels compiled by NVRTC through CuPy, on the backend skeleton;
one device per CUDA GPU (cuda:0, cuda:1, ...), decode steps replayed as CUDA graphs. docs/cuda.md
says more."""

from ...contract import hookimpl


@hookimpl
def framework_devices():
    from .device import devices
    return devices()
