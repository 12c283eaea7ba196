"""Physical ids: one spelling per chip, whichever plugin reaches it.

Two plugins that reach one chip (a GPU through Vulkan and through OpenCL; the host CPU through numpy,
OpenVINO, lavapipe and PoCL) must report the same ``Device.physical_id``, so that the registry and
reservation can say they are one device. The spellings:

* ``host-cpu``: the CPU this process runs on (a software driver that runs on it is the host CPU too);
* a PCI address, ``dddd:bb:dd.f`` (domain, bus, device, function, as lspci and sysfs spell it), where
  the driver reports it or the chip's vendor and device id identify it among the host's PCI devices;
* ``pci vvvv:dddd`` (vendor and device id) where no address can be found: two chips of one model in
  one host then share this id, and the reports say they may be one device.

The PCI devices of a Linux host are read from sysfs (/sys/bus/pci/devices); elsewhere only the second
and third spellings are possible.
"""

from __future__ import annotations

import os
from functools import cache

HOST_CPU = "host-cpu"
SYSFS_PCI = "/sys/bus/pci/devices"


def pci_address(domain: int, bus: int, device: int, function: int) -> str:
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


@cache
def _sysfs_devices(root: str) -> dict[str, tuple[int, int]]:
    """PCI address -> (vendor id, device id) of every PCI device sysfs lists (empty without sysfs)."""
    out = {}
    try:
        names = os.listdir(root)
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(root, name, "vendor")) as v, open(os.path.join(root, name, "device")) as d:
                out[name] = (int(v.read().strip(), 16), int(d.read().strip(), 16))
        except (OSError, ValueError):
            continue
    return out


def pci_physical_id(vendor_id: int | None = None, device_id: int | None = None, address: str | None = None,
                    sysfs: str = SYSFS_PCI) -> str:
    """The physical id of a PCI device from what a driver reports: its address (where the driver gives
    it: OpenCL's cl_khr_pci_bus_info, NVIDIA's and AMD's attribute queries), or its vendor and device
    id (Vulkan). Both reach one string for one chip wherever the host's sysfs can tie them together."""
    devices = _sysfs_devices(sysfs)
    if address:
        return address.lower()
    if vendor_id is None or device_id is None:
        return ""
    matches = [a for a, ids in devices.items() if ids == (vendor_id, device_id)]
    if len(matches) == 1:
        return matches[0]
    return f"pci {vendor_id:04x}:{device_id:04x}"


def pci_ids_at(address: str, sysfs: str = SYSFS_PCI) -> tuple[int, int] | None:
    """(vendor id, device id) of the PCI device at `address`, from sysfs; None where it is not listed."""
    return _sysfs_devices(sysfs).get(address.lower())


__all__ = ["HOST_CPU", "SYSFS_PCI", "pci_address", "pci_ids_at", "pci_physical_id"]
