"""What an OpenCL device is: its data (platform, vendor, version, memory and work-group limits,
extensions) and its physical id, the one string every plugin that reaches the same chip reports.

The PCI address comes from the driver where it reports one: cl_khr_pci_bus_info (read through the
ICD loader with ctypes: pyopencl has no name for CL_DEVICE_PCI_BUS_INFO_KHR), NVIDIA's
cl_nv_device_attribute_query (bus, slot, domain) or AMD's cl_amd_device_attribute_query (topology).
A CPU device is the host's CPU (PoCL, Intel's and AMD's CPU runtimes run on it).
"""

from __future__ import annotations

import ctypes

from ...contract import HOST_CPU, DeviceType, pci_address, pci_ids_at, pci_physical_id
from .discovery import library

CL_DEVICE_PCI_BUS_INFO_KHR = 0x410F


def device_type(d) -> DeviceType:
    import pyopencl as cl
    if d.type & cl.device_type.GPU:
        return DeviceType.GPU
    if d.type & cl.device_type.CPU:
        return DeviceType.CPU
    return DeviceType.ACCEL


def _khr_pci_address(d) -> str | None:
    try:
        lib, _ = library()
        if lib is None:
            return None
        info = (ctypes.c_uint32 * 4)()
        size = ctypes.c_size_t(0)
        err = lib.clGetDeviceInfo(ctypes.c_void_p(d.int_ptr), ctypes.c_uint32(CL_DEVICE_PCI_BUS_INFO_KHR),
                                  ctypes.c_size_t(ctypes.sizeof(info)), info, ctypes.byref(size))
    except (OSError, AttributeError):
        return None
    return pci_address(*info) if err == 0 and size.value == ctypes.sizeof(info) else None


def pci_address_of(d, ext: frozenset[str]) -> str | None:
    """The device's PCI address as its driver reports it, or None (ext: its extensions)."""
    import pyopencl as cl
    if "cl_khr_pci_bus_info" in ext:
        found = _khr_pci_address(d)
        if found:
            return found
    try:
        if "cl_nv_device_attribute_query" in ext:
            bus, slot = d.get_info(cl.device_info.PCI_BUS_ID_NV), d.get_info(cl.device_info.PCI_SLOT_ID_NV)
            try:
                domain = d.get_info(cl.device_info.PCI_DOMAIN_ID_NV)
            except cl.Error:        # drivers before the domain query: domain 0
                domain = 0
            return pci_address(domain, bus, slot >> 3, slot & 7)
        if "cl_amd_device_attribute_query" in ext:
            top = d.get_info(cl.device_info.TOPOLOGY_AMD)
            return pci_address(0, top.bus, top.device, top.function)
    except (cl.Error, AttributeError):
        return None
    return None


def physical_id(d, data: dict, index: int) -> str:
    """HOST_CPU for a CPU device; a GPU's or accelerator's PCI address (or ids); else a name of its own
    (data: device_data's)."""
    if data["type"] == DeviceType.CPU.value:
        return HOST_CPU
    if data["pci_address"]:
        return pci_physical_id(address=data["pci_address"])
    if "cl_amd_device_attribute_query" in data["extensions"]:
        import pyopencl as cl
        try:
            return pci_physical_id(int(d.vendor_id), int(d.get_info(cl.device_info.PCIE_ID_AMD)))
        except cl.Error:
            pass
    return f"opencl {d.platform.name}/{index}"     # no PCI identity known: this device only


def device_data(p, d) -> dict:
    ext = frozenset(str(d.extensions).split())
    address = pci_address_of(d, ext)
    return {
        "platform": p.name, "platform_vendor": p.vendor, "platform_version": p.version,
        "device": d.name.strip(), "vendor": d.vendor.strip(), "vendor_id": int(d.vendor_id),
        "version": d.version, "driver_version": d.driver_version, "opencl_c_version": d.opencl_c_version,
        "type": device_type(d).value, "compute_units": int(d.max_compute_units),
        "global_mem_bytes": int(d.global_mem_size), "max_alloc_bytes": int(d.max_mem_alloc_size),
        "max_work_group_size": int(d.max_work_group_size),
        "max_work_item_sizes": [int(x) for x in d.max_work_item_sizes],
        "local_mem_bytes": int(d.local_mem_size), "pci_address": address,
        "pci_ids": pci_ids_at(address) if address else None,
        "fp16": "cl_khr_fp16" in ext, "fp64": "cl_khr_fp64" in ext,
        "subgroups": sorted(e for e in ext if "subgroup" in e),
        "integer_dot_product": "cl_khr_integer_dot_product" in ext,
        "extensions": sorted(ext),
    }
