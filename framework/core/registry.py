"""Discovering backend plugins (entry points, loaded with pluggy) and choosing devices.

A plugin that fails to import or does not fit the contract is recorded with its
distribution and the reason; it never takes the other plugins down.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib.metadata import entry_points

import pluggy

from ..contract import ENTRY_POINT_GROUP, PROJECT, BackendSpec, Device, DeviceType
from .scheduler.errors import DeviceSelectionError

DISABLE_ENV = "FRAMEWORK_DISABLE_PLUGIN_AUTOLOAD"   # "1": load no entry points
BLOCK_ENV = "FRAMEWORK_BLOCK_PLUGINS"               # comma-separated plugin names not to load
ALIASES = {"cpu": DeviceType.CPU, "gpu": DeviceType.GPU, "npu": DeviceType.NPU, "accel": DeviceType.ACCEL}


@dataclass
class PluginRecord:
    name: str
    distribution: str
    error: str | None = None
    devices: list[Device] = field(default_factory=list)


class Registry:
    def __init__(self):
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(BackendSpec)
        self.plugins: dict[str, PluginRecord] = {}

    def load_entry_points(self) -> "Registry":
        if os.environ.get(DISABLE_ENV) == "1":
            return self
        blocked = {b.strip() for b in os.environ.get(BLOCK_ENV, "").split(",") if b.strip()}
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in blocked or ep.name in self.plugins:
                continue
            dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist else "unknown distribution"
            try:
                obj = ep.load()
            except Exception as e:
                self.plugins[ep.name] = PluginRecord(ep.name, dist, f"failed to import {ep.value}: "
                                                     f"{type(e).__name__}: {e}")
                continue
            self.register(obj, ep.name, dist)
        return self

    def register(self, plugin, name: str, distribution: str = "(registered in code)") -> PluginRecord:
        record = PluginRecord(name, distribution)
        self.plugins[name] = record
        try:
            self.pm.register(plugin, name=name)
        except Exception as e:   # pluggy's PluginValidationError names the hook and the signature
            record.error = f"does not fit the plugin contract: {e}"
            return record
        try:
            record.devices = self._devices_of(plugin, name)
        except Exception as e:
            record.error = f"framework_devices() failed: {type(e).__name__}: {e}"
            self.pm.unregister(name=name)
        return record

    def _devices_of(self, plugin, name: str) -> list[Device]:
        impls = [i for i in self.pm.hook.framework_devices.get_hookimpls() if i.plugin_name == name]
        devices = [d for impl in impls for d in (impl.function() or [])]
        for d in devices:
            problems = contract_problems(d)
            if problems:
                raise TypeError(f"device {getattr(d, 'name', d)!r} does not fit the contract: {'; '.join(problems)}")
        return devices

    def same_silicon(self) -> list[list[Device]]:
        """Groups of devices, from different plugins or not, that report one physical id."""
        groups: dict[str, list[Device]] = {}
        for d in self.devices():
            if d.physical_id:
                groups.setdefault(d.physical_id, []).append(d)
        return [g for g in groups.values() if len(g) > 1]

    def devices(self) -> list[Device]:
        return [d for r in self.plugins.values() if not r.error for d in r.devices]

    def describe_devices(self) -> str:
        lines = [f"  {d.describe()}" for d in self.devices()]
        lines += [f"  plugin '{r.name}' ({r.distribution}): {r.error}" for r in self.plugins.values() if r.error]
        return "\n".join(lines) or "  (no plugins found in entry-point group framework.backends)"

    def select(self, spec: str, profile: str | None = None) -> list[Device]:
        """Resolve a --backends list: device names or the aliases cpu, gpu, npu, accel.

        ``profile`` (--device-profile NAME): every device that offers that profile is taken under it first
        (an emulation, as its reports say), so a name or an alias can reach it: ``--backends npu
        --device-profile xdna2`` brings up xdna:0's host arm. One selected device at least must take it."""
        names = [s.strip() for s in spec.split(",") if s.strip()]
        if not names:
            raise DeviceSelectionError(f"--backends is empty; devices:\n{self.describe_devices()}")
        pool = self.devices() if profile is None else self.under_profile(profile)
        by_name = {d.name: d for d in pool}
        chosen: list[Device] = []
        for name in names:
            dev = by_name.get(name) or self._alias(name, pool)
            if dev is None:
                raise DeviceSelectionError(f"unknown backend '{name}'; devices:\n{self.describe_devices()}")
            if not dev.available:
                usable = [p for p in dev.profiles if _derived_available(dev, p)] if profile is None else []
                hint = (f"; --device-profile {' or '.join(usable)} brings up an EMULATION in its place "
                        f"({dev.with_options(profile=usable[0]).emulation})" if usable else "")
                raise DeviceSelectionError(f"device '{dev.name}' is unavailable: {dev.unavailable_reason}{hint}; "
                                           f"devices:\n{self.describe_devices()}")
            if dev not in chosen:
                chosen.append(dev)
        if profile is not None and not any(profile in d.profiles for d in chosen):
            able = [d.name for d in pool if d.available and profile in d.profiles]
            raise DeviceSelectionError(f"--device-profile {profile}: none of the selected devices "
                                       f"({', '.join(d.name for d in chosen)}) offers it; these do: "
                                       f"{', '.join(able) or '(none available)'}")
        return chosen

    def under_profile(self, profile: str) -> list[Device]:
        """Every device, those that offer ``profile`` under it."""
        devices = self.devices()
        if not any(profile in d.profiles for d in devices):
            groups: dict[tuple[str, ...], list[str]] = {}
            for d in devices:
                if d.profiles:
                    groups.setdefault(d.profiles, []).append(d.name)
            offers = [f"{', '.join(names)} ({', '.join(devs)})" for names, devs in groups.items()]
            raise DeviceSelectionError(f"--device-profile {profile}: no plugin offers a profile of that name; "
                                       f"known: {'; '.join(offers) or 'none (no plugin offers device profiles)'}")
        return [d.with_options(profile=profile) if profile in d.profiles else d for d in devices]

    def _alias(self, name: str, pool: list[Device]) -> Device | None:
        kind = ALIASES.get(name.lower())
        if kind is None:
            return None
        of_kind = [d for d in pool if d.type == kind]
        available = [d for d in of_kind if d.available]
        if available:
            return available[0]
        why = "; ".join(f"{d.name}: {d.unavailable_reason}" for d in of_kind) or "no plugin provides one"
        raise DeviceSelectionError(f"alias '{name}' matches no available {kind.value} device ({why})"
                                   f"{self._emulation_hint(name, kind)}; devices:\n{self.describe_devices()}")

    def _emulation_hint(self, alias: str, kind: DeviceType) -> str:
        """How to ask for an emulation of the missing kind of device with --device-profile, where one exists."""
        ways, others = [], []
        for d in self.devices():
            usable = [p for p in d.profiles if _derived_available(d, p)]
            if not usable:
                continue
            under = d.with_options(profile=usable[0])
            profiles = " or ".join(usable)
            if under.type == kind:
                ways.append(f"--backends {alias} --device-profile {profiles} ({under.name} as {under.emulation})")
            elif kind == DeviceType.NPU:
                others.append(f"--backends {d.name} --device-profile {profiles} (the NPU's limits on {d.name})")
        if not ways + others:
            return ""
        return ". To emulate one (labelled EMULATION in every report): " + "; or ".join(ways + others)


def _derived_available(device: Device, profile: str) -> bool:
    try:
        return device.with_options(profile=profile).available
    except ValueError:
        return False


REQUIRED_METHODS = ("supports_op", "compile")


def contract_problems(d) -> list[str]:
    """What keeps a device object from fitting framework.contract.Device (empty when it fits)."""
    if not isinstance(d, Device):
        return [f"{type(d).__name__} is not a subclass of framework.contract.Device"]
    problems = [f"{m}() is not implemented" for m in REQUIRED_METHODS
                if getattr(type(d), m) is getattr(Device, m)]
    if not d.name or not isinstance(d.name, str):
        problems.append("it has no name")
    if not isinstance(d.type, DeviceType):
        problems.append(f"its type {d.type!r} is not a DeviceType")
    if not d.available and not d.unavailable_reason:
        problems.append("it is unavailable but gives no unavailable_reason")
    return problems


def default_registry() -> Registry:
    return Registry().load_entry_points()
