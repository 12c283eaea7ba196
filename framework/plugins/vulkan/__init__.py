"""The Vulkan backend plugin: real Vulkan compute through wgpu (wgpu-py), forced onto its Vulkan
backend; one device per Vulkan adapter (vulkan:0, vulkan:1, ...). docs/vulkan.md says more."""

from ...contract import hookimpl


@hookimpl
def framework_devices():
    from .device import devices
    return devices()
