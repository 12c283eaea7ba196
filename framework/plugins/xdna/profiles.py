"""Device profiles of AMD Ryzen AI NPUs, as data: what the hardware and its software stack allow.

Sources (see docs/xdna.md for the links):
  * the Linux kernel's documentation of the amdxdna driver (Documentation/accel/amdxdna/amdnpu.rst):
    Phoenix and Hawk Point NPUs are a 4x5 array and "can support 6 concurrent workload contexts";
    Strix Point is 4x8 and supports 16;
  * the amdxdna PCI table (drivers/accel/amdxdna/amdxdna_pci_drv.c): device 0x1502 is npu1
    (Phoenix, Hawk Point); 0x17f0 revision 0x10 npu4 (Strix Point), 0x11 npu5 (Strix Halo), 0x20 npu6
    (Krackan Point);
  * XRT's runlist (src/runtime_src/core/common/api/xrt_kernel.cpp, class runlist_impl): runs are
    submitted as ERT_CMD_CHAIN commands of at most ``submit_size = 24`` runs each. We chain at most
    that many runs per runlist, so one runlist is one chained command and the driver's per-command
    timeout covers a bounded amount of work (failure 5 of the design brief: 42 layers chained into one
    command list timed out). FRAMEWORK_XDNA_MAX_CHAIN lowers it.

The kernels this plugin drives cover one op: MUL_MAT with a packed weight (the matrix products of
every layer); everything else runs on the host, per the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...contract import NPU_REFUSED_OPS, lookup_profile

XRT_RUNLIST_CHAIN = 24
# the ops every NPU profile refuses (the contract's list), with this NPU's own reason: the contract's speaks of
# what Intel's NPU 37xx did with them, which an AMD NPU was never seen doing
_LINEAR_ATTENTION = ("linear attention (Qwen3.5's GatedDeltaNet layers) has no kernel on the AIE array: its kernels "
                     "are the matrix products; it runs on the next device in --backends")
XDNA_REFUSED_OPS = {op: _LINEAR_ATTENTION for op in NPU_REFUSED_OPS}


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    hw_contexts: int                         # concurrent hardware (workload) contexts the NPU supports
    max_chain: int                           # runs one runlist may chain
    ops: frozenset[str]                      # ops the kernels cover
    columns: int                             # AIE columns of the array
    aie: str                                 # AIE generation (mlir-aie device target)
    pci_ids: tuple[tuple[int, int | None], ...]   # (PCI device id, revision or None for any)
    refused_ops: dict[str, str] = field(default_factory=lambda: dict(XDNA_REFUSED_OPS))   # op -> reason


PROFILES: dict[str, Profile] = {
    "xdna": Profile(
        "xdna", "XDNA (npu1: Phoenix, Hawk Point; 4x5 AIE2 array)", hw_contexts=6, max_chain=XRT_RUNLIST_CHAIN,
        ops=frozenset({"MUL_MAT"}), columns=5, aie="aie2 (mlir-aie target npu1)", pci_ids=((0x1502, None),)),
    "xdna2": Profile(
        "xdna2", "XDNA 2 (npu4/5/6: Strix Point, Strix Halo, Krackan Point; 4x8 AIE2P array)", hw_contexts=16,
        max_chain=XRT_RUNLIST_CHAIN, ops=frozenset({"MUL_MAT"}), columns=8, aie="aie2p (mlir-aie target npu2)",
        pci_ids=((0x17F0, 0x10), (0x17F0, 0x11), (0x17F0, 0x20))),
}


def get_profile(name: str) -> Profile:
    return lookup_profile(PROFILES, name, "xdna profile")


def profile_for_pci(device_id: int | None, revision: int | None) -> tuple[Profile, str]:
    """(profile, note) of a PCI device; an id this table does not know gets xdna (the fewer contexts)
    and a note saying so."""
    for p in PROFILES.values():
        for dev, rev in p.pci_ids:
            if device_id == dev and (rev is None or rev == revision):
                return p, ""
    ident = f"{device_id:#06x}" if device_id is not None else "unknown"
    rev = f" revision {revision:#04x}" if revision is not None else ""
    return PROFILES["xdna"], (f"PCI device {ident}{rev} is not in the profile table: using xdna, the smaller one "
                              f"(set FRAMEWORK_XDNA_PROFILE to choose)")
