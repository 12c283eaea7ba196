"""Asking a device about a node: the one place where the contract's declared limits are applied
before the device's own answer, so every pass (and every plugin) gets the same rules."""

from __future__ import annotations

from ...contract import Device, Verdict
from ..graph import LeafKind, Tensor


def ask(device: Device, node: Tensor) -> Verdict:
    """The device's verdict on a node, after the limits it declared as data (Limits.dtypes)."""
    allowed = device.limits.dtypes
    if allowed is not None:
        for s in node.src:
            if s.is_leaf and s.kind == LeafKind.WEIGHT and s.dtype.name not in allowed:
                return Verdict.no("unsupported_dtype", f"{device.name} declares weight types "
                                  f"{', '.join(sorted(allowed))}; '{s.name}' is {s.dtype.name}")
    verdict = device.supports_op(node)
    if not isinstance(verdict, Verdict):
        raise TypeError(f"device {device.name}: supports_op({node.name}) returned {verdict!r}; the contract asks "
                        f"for a framework.contract.Verdict (Verdict.yes() or Verdict.no(code, reason))")
    return verdict
