"""Discovering backend plugins (entry points, loaded with pluggy) and choosing devices.

A plugin that fails to import or does not fit the contract is recorded with its
distribution and the reason, by name; it never takes the other plugins down. Refused at
registration: a hook signature that does not match, a ``@hookimpl`` that is no hook of the
contract (with the hook it probably meant), a contract version this framework does not
implement, a hook that raises instead of returning an unavailable device, a device that does
not fit ``framework.contract.Device``, and a device name another plugin already offers.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points

import pluggy

from . import settings
from .contract import (
    CONTRACT_VERSION,
    CONTRACT_VERSIONS,
    ENTRY_POINT_GROUP,
    PROJECT,
    VERSION_ATTRIBUTE,
    BackendSpec,
    Device,
    DeviceType,
)
from .core.scheduler.errors import DeviceSelectionError

HOOKS = tuple(n for n in vars(BackendSpec) if not n.startswith("_"))

DISABLE_ENV = settings.DISABLE_AUTOLOAD.name       # a true flag: load no entry points
BLOCK_ENV = settings.BLOCK_PLUGINS.name             # comma-separated plugin names not to load
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
        self.blocked: set[str] = set()          # plugins kept from loading (FRAMEWORK_BLOCK_PLUGINS or block)

    def load_entry_points(self, block: Iterable[str] | None = None) -> "Registry":
        """Load every plugin of the entry-point group but those FRAMEWORK_BLOCK_PLUGINS names, or, given
        ``block``, those it names instead (a ray node's agent: the plugins its driver asked it to load)."""
        if settings.read(DISABLE_ENV):
            return self
        eps = list(entry_points(group=ENTRY_POINT_GROUP))
        blocked = set(settings.read(BLOCK_ENV) if block is None else block)
        installed = sorted({ep.name for ep in eps})
        unknown = sorted(blocked - set(installed))
        if unknown:
            raise settings.SettingError(f"{BLOCK_ENV}={settings.raw(BLOCK_ENV)!r}: no installed backend plugin is "
                                        f"named {', '.join(repr(u) for u in unknown)}; installed: "
                                        f"{', '.join(installed)}")
        self.blocked = blocked
        for ep in eps:
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
        record.error = _version_problem(plugin)
        if record.error:
            return record
        try:
            self.pm.register(plugin, name=name)
        except Exception as e:   # pluggy's PluginValidationError names the hook and the signature
            record.error = f"does not fit the plugin contract: {e}"
            return record
        record.error = self._unknown_hooks(name)
        if record.error:
            self.pm.unregister(name=name)
            return record
        try:
            impls = [i for i in self.pm.hook.framework_devices.get_hookimpls() if i.plugin_name == name]
            devices = [d for impl in impls for d in (impl.function() or [])]
        except Exception as e:
            record.error = (f"framework_devices() raised {type(e).__name__}: {e}; the contract asks a plugin to return "
                            f"a device it cannot use with available = False and the reason in unavailable_reason, "
                            f"instead of raising")
            self.pm.unregister(name=name)
            return record
        record.error = self._device_problems(devices, record)
        if record.error:
            self.pm.unregister(name=name)
            return record
        for d in devices:
            d.plugin = f"{name} ({distribution})"
        record.devices = devices
        return record

    def _unknown_hooks(self, name: str) -> str | None:
        """pluggy's check_pending, for one plugin, naming the hook it probably meant."""
        unknown = [hook for hook, caller in vars(self.pm.hook).items() if not hook.startswith("_")
                   and not caller.has_spec() and any(i.plugin_name == name for i in caller.get_hookimpls())]
        if not unknown:
            return None
        said = []
        for hook in unknown:
            near = difflib.get_close_matches(hook, HOOKS, n=1, cutoff=0.6)
            said.append(f"'{hook}'" + (f" (did you mean '{near[0]}'?)" if near else ""))
        return (f"implements {', '.join(said)}, which is not a hook of the contract (framework.contract.BackendSpec "
                f"has {', '.join(HOOKS)}); rename it")

    def _device_problems(self, devices: list, record: PluginRecord) -> str | None:
        seen: dict[str, str] = {}
        for d in devices:
            problems = contract_problems(d)
            if problems:
                return f"device {getattr(d, 'name', d)!r} does not fit the contract: {'; '.join(problems)}"
            if d.name in seen:
                return f"offers two devices named '{d.name}'; device names are unique"
            seen[d.name] = d.name
            for other in self.plugins.values():
                if other is not record and any(o.name == d.name for o in other.devices):
                    return (f"offers device '{d.name}', which plugin '{other.name}' ({other.distribution}) already "
                            f"offers; device names are unique over every plugin, so '{record.name}' is not loaded "
                            f"(block one of them with {BLOCK_ENV}={record.name} or ={other.name})")
        return None

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
            if name in self.blocked and name not in by_name and dev is not None:
                # `cpu` names both the alias and the cpu plugin: never substitute another plugin's device
                raise DeviceSelectionError(f"'{name}' names the {name} plugin, which {BLOCK_ENV} blocks; the alias "
                                           f"'{name}' would pick {dev.name} instead. Name that device (--backends "
                                           f"{dev.name}) to use it, or unblock {name}; devices:\n"
                                           f"{self.describe_devices()}")
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
        return [with_profile(d, profile) if profile in d.profiles else d for d in devices]

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


def _version_problem(plugin) -> str | None:
    """A contract version the plugin declares (FRAMEWORK_CONTRACT in its module) that this framework lacks."""
    declared = getattr(plugin, VERSION_ATTRIBUTE, None)
    if declared is None or declared in CONTRACT_VERSIONS:
        return None
    return (f"declares {VERSION_ATTRIBUTE} = {declared!r}, but this framework implements contract version "
            f"{CONTRACT_VERSION} (accepts {', '.join(map(str, CONTRACT_VERSIONS))}); install a framework release "
            f"for that version, or port the plugin (docs/plugin-guide.md)")


def with_profile(device: Device, name: str) -> Device:
    """A device under a profile (Device.with_options), remembering the plugin that offered it."""
    derived = device.with_options(profile=name)
    derived.plugin = derived.plugin or device.plugin
    return derived


def default_registry() -> Registry:
    return Registry().load_entry_points()
