"""The CPU backend plugin (numpy), registered through the `framework.backends` entry point."""

from ...contract import hookimpl


@hookimpl
def framework_devices():
    from .device import CpuDevice
    return [CpuDevice()]
