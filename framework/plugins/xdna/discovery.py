"""Finding AMD NPUs: pyxrt importable, an accel device bound to amdxdna, pyxrt.device(i) opening.

Every device comes back, available or not; an unavailable one says precisely which step failed.
Without an NPU, ``xdna:0`` is listed unavailable with the reasons; ``--device-profile xdna2`` (the
device's ``with_options``) or ``FRAMEWORK_XDNA_HOST_ARM=1`` (or a profile name) turns it into the host
arm, an emulation that says it is one (and why the NPU arm is not used) wherever devices are reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .device import HOST_ARM_ENV, Config, XdnaDevice, host_arm_device, read_config
from .kernels import KERNELS_ENV, KernelSetError, load_kernel_set
from .profiles import get_profile, profile_for_pci
from .xrt import DEFAULT_TIMEOUT_MS, XrtSession, import_pyxrt

SYS_ACCEL = Path("/sys/class/accel")
DEV_ACCEL = Path("/dev/accel")
BAD_SETTINGS = "bad xdna settings"      # the start of the reason of a device whose settings are wrong


@dataclass
class Accel:
    name: str                # accel0
    driver: str              # amdxdna, intel_vpu, ...
    bdf: str                 # PCI address
    device_id: int | None
    revision: int | None


def _hex(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def scan_accel(sysfs: Path = SYS_ACCEL) -> list[Accel]:
    out = []
    if not sysfs.is_dir():
        return out
    for node in sorted(sysfs.glob("accel*"), key=lambda p: (len(p.name), p.name)):
        dev = node / "device"
        driver = dev / "driver"
        out.append(Accel(node.name, driver.resolve().name if driver.exists() else "(no driver)",
                         dev.resolve().name if dev.exists() else "", _hex(dev / "device"), _hex(dev / "revision")))
    return out


def _no_npu_reason(accels: list[Accel], sysfs: Path) -> str:
    if not sysfs.is_dir():
        return f"no /dev/accel device bound to amdxdna ({sysfs} does not exist: no accel devices at all)"
    if not accels:
        return f"no /dev/accel device bound to amdxdna ({sysfs} is empty)"
    seen = ", ".join(f"{a.name} bound to {a.driver}" for a in accels)
    return f"no /dev/accel device bound to amdxdna (found {seen})"


def discover(env: dict | None = None, sysfs: Path = SYS_ACCEL, devroot: Path = DEV_ACCEL,
             pyxrt_loader=import_pyxrt) -> list[XdnaDevice]:
    config = read_config(env)
    if config.problems:
        reason = "; ".join(config.problems)
        return [XdnaDevice(0, available=False, unavailable_reason=f"{BAD_SETTINGS}: {reason}", arm="npu",
                           bad_settings=True)]
    pyxrt, pyxrt_reason = pyxrt_loader()
    accels = [a for a in scan_accel(sysfs) if a.driver == "amdxdna"]
    if not accels:
        reasons = [r for r in (pyxrt_reason, _no_npu_reason(scan_accel(sysfs), sysfs)) if r]
        return [_absent(0, "; ".join(reasons), config)]
    devices = []
    for i, a in enumerate(accels):
        prof, note = profile_for_pci(a.device_id, a.revision)
        if config.profile:
            prof, note = get_profile(config.profile), f"profile {config.profile} set by FRAMEWORK_XDNA_PROFILE"
        reason = pyxrt_reason
        node = devroot / a.name
        if not reason and not node.exists():
            reason = f"{a.name} is bound to amdxdna but {node} does not exist"
        xdev = None
        if not reason:
            try:
                xdev = pyxrt.device(i)
            except Exception as e:  # noqa: BLE001 - XRT raises RuntimeError with the driver's words; any failure is the reason
                reason = f"pyxrt.device({i}) failed: {e}"
        kernel_set = None
        if not reason:
            if not config.kernels:
                reason = (f"no kernel set: set {KERNELS_ENV}=DIR (xclbin and instruction streams of the GEMMs, "
                          f"see docs/xdna.md), or {HOST_ARM_ENV}=1 for the host arm (emulation)")
            else:
                try:
                    kernel_set = load_kernel_set(config.kernels)
                except KernelSetError as e:
                    reason = f"{KERNELS_ENV}: {e}"
        if config.host_arm:
            why = f"NPU {a.bdf} ({prof.name}) not used: " + (reason or f"{HOST_ARM_ENV} is set")
            devices.append(host_arm_device(i, config.host_arm, why=why, config=config))
            continue
        if reason:
            devices.append(XdnaDevice(i, profile=prof, arm="npu", available=False, unavailable_reason=reason,
                                      physical_id=a.bdf, note=note, max_chain=config.max_chain,
                                      requantize=config.requantize))
            continue
        session = XrtSession(pyxrt, xdev, kernel_set, prof, f"xdna:{i}",
                             timeout_ms=config.timeout_ms or DEFAULT_TIMEOUT_MS)
        devices.append(XdnaDevice(i, profile=prof, arm="npu", physical_id=a.bdf, session=session,
                                  kernel_set=kernel_set, max_chain=config.max_chain, requantize=config.requantize,
                                  note=note))
    return devices


def _absent(index: int, reason: str, config: Config) -> XdnaDevice:
    if config.host_arm:
        return host_arm_device(index, config.host_arm, why=f"no NPU: {reason}", config=config)
    # the settings travel with it: --device-profile brings up the host arm from this device (with_options)
    return XdnaDevice(index, profile=config.profile or "xdna2", arm="npu", available=False,
                      unavailable_reason=reason, max_chain=config.max_chain, requantize=config.requantize)
