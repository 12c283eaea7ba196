"""--verify [DEVICE] and --verify-every N on `framework run`, `check` and `serve` (core/scheduler/verify.py).

    framework run -m smollm2 --backends vulkan:0,cpu --verify          # every fragment against the cpu plugin's
    framework run --backends openvino:CPU --verify reference            # against the graph's reference interpreter
    framework serve --backends gpu,cpu --verify --verify-every 64       # a server: one step in 64 is checked
"""

from __future__ import annotations

import argparse

from ..terminal import select_devices
from .common import positive_int

DEFAULT_REFERENCE = "cpu"


def add_verify_args(p: argparse.ArgumentParser, every: int = 1) -> None:
    from ..core.scheduler.verify import REFERENCE
    g = p.add_argument_group("verification")
    g.add_argument("--verify", nargs="?", const=DEFAULT_REFERENCE, metavar="DEVICE",
                   help=f"compare every fragment's outputs with DEVICE's on the same inputs (default "
                   f"{DEFAULT_REFERENCE}; '{REFERENCE}': the graph's reference interpreter), by NMSE against the op "
                   "table's thresholds; a divergence stops with exit status 3, naming the node, its device and plugin")
    g.add_argument("--verify-every", type=positive_int, default=every, metavar="N",
                   help=f"with --verify, check every N-th step only (default {every})")


def verifier_for(args, model):
    """The Verifier --verify asks for, or None."""
    from ..core.scheduler.verify import Verifier, reference_device
    if args.verify is None:
        return None
    return Verifier(reference_device(args.verify, select_devices), model.weight_bytes, args.verify_every)


def verified_line(verifier) -> str:
    from ..core.scheduler.verify import REFERENCE
    if not verifier.checked and verifier.steps >= 1:
        return (f"verified nothing: every fragment ran on {verifier.reference.name}, the reference itself "
                f"(--verify {REFERENCE} compares with the graph's reference interpreter)")
    steps = "every step" if verifier.every == 1 else f"one step in {verifier.every}"
    share, node = verifier.closest
    return (f"verified: {verifier.checked} fragment runs agree with {verifier.reference.name}'s on the same inputs "
            f"within the op table's thresholds ({steps}, {verifier.steps} steps; the closest, '{node}', at "
            f"{share:.1%} of its threshold)")
