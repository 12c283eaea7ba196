"""Capability errors: raised at reservation, before anything is allocated or compiled."""

from __future__ import annotations


class CapabilityError(RuntimeError):
    """A plan cannot be carried out. Structured fields, plus a readable message.

    code:    machine-readable (no_device_for_node, buffer_not_usable, program_budget, ...)
    tensor:  the tensor involved, by name
    node:    the node involved, by name
    devices: the devices involved, by name
    limit:   the limit that was exceeded, as text ("max_live_programs=255")
    fix:     what the user can do about it
    phase:   the plan it was found in ("decode[tokens=1,kv=256]", "draft decode[...]"), when one plan
    """

    def __init__(self, code: str, message: str, *, tensor: str | None = None, node: str | None = None,
                 devices: tuple[str, ...] = (), limit: str | None = None, fix: str | None = None,
                 phase: str | None = None):
        self.code, self.tensor, self.node, self.devices, self.limit, self.fix = code, tensor, node, devices, limit, fix
        self.phase = phase
        text = f"[{code}] {message}"
        if fix:
            text += f"\n  fix: {fix}"
        super().__init__(text)

    def to_dict(self) -> dict:
        return {"code": self.code, "message": str(self), "tensor": self.tensor, "node": self.node,
                "devices": list(self.devices), "limit": self.limit, "fix": self.fix, "phase": self.phase}


class PluginContractError(CapabilityError):
    """A plugin answered in a way the contract does not allow (a bare bool for a verdict, an exception
    inside supports_op): raised wherever the framework asks, naming the plugin, the device, the node
    and what the contract asks for."""

    def __init__(self, message: str, *, plugin: str, device: str, node: str | None = None, fix: str):
        self.plugin = plugin
        super().__init__("plugin_contract", message, node=node, devices=(device,), fix=fix)


class DeviceSelectionError(ValueError):
    """An unknown backend name, or an alias with no available device."""


class DeviceRunError(RuntimeError):
    """A device failed while compiling or running, or a program returned what its fragment does not
    hold (too few outputs, a wrong shape or dtype, values that are not finite); its own message is kept.
    ``device``, ``plugin``, ``fragment`` and ``node`` name where, when known."""

    def __init__(self, message: str, *, device: str | None = None, plugin: str | None = None,
                 fragment: int | None = None, node: str | None = None):
        self.device, self.plugin, self.fragment, self.node = device, plugin, fragment, node
        super().__init__(message)
