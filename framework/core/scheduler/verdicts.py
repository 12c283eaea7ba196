"""Asking a device about a node or a buffer: the one place where the contract's declared data is
applied before the device's own answer, and where an answer the contract does not allow becomes an
error naming the plugin, the device and the node. Planning, the KV-cache placement, the views and
the conformance suite all ask through here, so they all get the same answer."""

from __future__ import annotations

from ...contract import BufferType, Device, Verdict
from ..graph import LeafKind, Tensor, ops
from .errors import DeviceSelectionError, PluginContractError


def plugin_of(device: Device) -> str:
    """The plugin that provided a device, as the registry recorded it (or its class, for a device made
    in code)."""
    return device.plugin or f"{type(device).__module__}.{type(device).__qualname__} (not registered)"


def in_distribution(device: Device) -> bool:
    """Whether the device comes from this distribution's own plugins (framework.plugins.*)."""
    module = type(device).__module__
    return module == "framework" or module.startswith("framework.")


def ask(device: Device, node: Tensor) -> Verdict:
    """The verdict on a node: availability, the device's refused_ops, the op table, its supported_ops,
    Limits.dtypes, then the device's own supports_op, which must answer with a Verdict."""
    if not device.available:
        return Verdict.no("unavailable", f"{device.name} is unavailable: {device.unavailable_reason}")
    refusal = device.refused_ops.get(node.op)
    if refusal is not None:
        if not isinstance(refusal, Verdict) or refusal.ok:
            raise _contract_error(device, node, f"refused_ops[{node.op!r}] is {refusal!r}",
                                  "map each refused op to Verdict.no(code, reason)")
        return refusal
    if node.op not in ops.OPS:
        return Verdict.no("unsupported_op", f"{node.op} is not an op of the op table (docs/ops.md)")
    if device.supported_ops is not None and node.op not in device.supported_ops:
        return Verdict.no("unsupported_op", f"{device.name} has no kernel for {node.op} (it runs "
                          f"{', '.join(sorted(device.supported_ops))})")
    allowed = device.limits.dtypes
    if allowed is not None:
        for s in node.src:
            if s.is_leaf and s.kind == LeafKind.WEIGHT and s.dtype.name not in allowed:
                return Verdict.no("unsupported_dtype", f"{device.name} declares weight types "
                                  f"{', '.join(sorted(allowed))}; '{s.name}' is {s.dtype.name}")
    try:
        verdict = device.supports_op(node)
    except Exception as e:
        raise _contract_error(device, node, f"supports_op({node.describe()}) raised {type(e).__name__}: {e}",
                              "answer Verdict.no(code, reason) for a node the device cannot run; "
                              "supports_op never raises") from e
    if not isinstance(verdict, Verdict):
        raise _contract_error(device, node, f"supports_op({node.describe()}) returned {verdict!r}",
                              "return a framework.contract.Verdict: Verdict.yes() or Verdict.no(code, reason), "
                              "never a bare bool")
    return verdict


def ask_buffer(device: Device, buft: BufferType, node: Tensor | None = None) -> Verdict:
    """The device's verdict on using a buffer type in place, which must be a Verdict."""
    what = f"supports_buffer({buft.name!r})"
    try:
        verdict = device.supports_buffer(buft)
    except Exception as e:
        raise _contract_error(device, node, f"{what} raised {type(e).__name__}: {e}",
                              "answer Verdict.no('unsupported_buffer', reason); supports_buffer never raises") from e
    if not isinstance(verdict, Verdict):
        raise _contract_error(device, node, f"{what} returned {verdict!r}",
                              "return a framework.contract.Verdict: Verdict.yes() or Verdict.no(code, reason), "
                              "never a bare bool")
    return verdict


def check_available(devices: list[Device]) -> None:
    """The one availability check before anything is planned, loaded or compiled on a device."""
    for d in devices:
        if not d.available:
            raise DeviceSelectionError(f"device '{d.name}' is unavailable: {d.unavailable_reason}")


def _contract_error(device: Device, node: Tensor | None, what: str, fix: str) -> PluginContractError:
    where = f" about node '{node.name}' ({node.op})" if node is not None else ""
    return PluginContractError(f"plugin {plugin_of(device)}, device {device.name}{where}: {what}; the contract "
                               f"(framework/contract.py) does not allow that", plugin=plugin_of(device),
                               device=device.name, node=node.name if node is not None else None,
                               fix=f"in the plugin's device class {type(device).__qualname__}: {fix}")
