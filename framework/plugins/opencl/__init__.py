"""The OpenCL backend plugin: OpenCL C kernels through pyopencl; one device per OpenCL device
(opencl:0, opencl:1, ...). docs/opencl.md says more."""

from ...contract import hookimpl


@hookimpl
def framework_devices():
    from .device import devices
    return devices()
