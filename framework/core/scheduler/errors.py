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


class DeviceSelectionError(ValueError):
    """An unknown backend name, or an alias with no available device."""


class DeviceRunError(RuntimeError):
    """A device failed while compiling or running; its own message is kept."""
