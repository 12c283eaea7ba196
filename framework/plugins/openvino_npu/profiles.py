"""Device profiles: the limits and refusals of NPUs, as documented, to apply to a real NPU or to
emulate on a device that is present (every report of an emulated run says so).

Sources: the project's design brief (failures 1 and 2) and OpenVINO's NPU plugin documentation:
  * one level-zero command queue per compiled model and at most 255 live ones per process
    (the 256th compile fails with a misleading "driver is not initialized");
  * static shapes only: every compiled model has fixed input shapes, so prefill runs in fixed
    chunks (padded and masked) and decode attends over a fixed KV length;
  * GATED_DELTA_NET and SSM_CONV (linear attention, Qwen3.5's GatedDeltaNet layers) hung the NPU at
    the first inference on NPU 37xx with one driver and failed to compile with another: refused on
    both, with the reason (framework.contract.NPU_REFUSED_OPS), so the plan routes them to the next
    device (or --strict fails).

On a real NPU the profile is chosen from OpenVINO's DEVICE_ARCHITECTURE property ("3720" for
Meteor Lake, "4000" for Lunar Lake); an architecture this table does not know gets npu37xx, the
strictest, and the device description says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...contract import NPU_REFUSED_OPS, Limits, UnknownProfileError, lookup_profile  # noqa: F401 (re-exported)

NPU_PROGRAM_BUDGET = 255


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    limits: Limits
    refused_ops: dict[str, str] = field(default_factory=dict)     # op -> reason
    architectures: tuple[str, ...] = ()                             # DEVICE_ARCHITECTURE prefixes


PROFILES: dict[str, Profile] = {
    "npu37xx": Profile(
        "npu37xx", "Intel NPU 3720 (Meteor Lake)",
        Limits(max_live_programs=NPU_PROGRAM_BUDGET, static_shapes=True),
        dict(NPU_REFUSED_OPS), ("37",)),
    "npu40xx": Profile(
        "npu40xx", "Intel NPU 4000 (Lunar Lake)",
        # the same driver stack: one command queue per compiled model, 255 per process
        Limits(max_live_programs=NPU_PROGRAM_BUDGET, static_shapes=True),
        dict(NPU_REFUSED_OPS), ("40",)),
}


def get_profile(name: str) -> Profile:
    return lookup_profile(PROFILES, name, "device profile")


def profile_for_architecture(arch: str) -> tuple[Profile, str]:
    """(profile, note): the profile of an NPU architecture, and a note when it was a guess."""
    for p in PROFILES.values():
        if any(arch.startswith(a) for a in p.architectures):
            return p, ""
    return PROFILES["npu37xx"], f"architecture '{arch}' is not in the profile table: using npu37xx, the strictest"
