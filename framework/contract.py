"""The plugin contract: everything a backend plugin author needs, in one module.

A backend plugin is a Python distribution with an entry point in the group
``framework.backends`` that names a module (or object) implementing the hooks of
:class:`BackendSpec` with ``@hookimpl``. Its devices subclass :class:`Device`. What the
ops mean (their sources, parameters, semantics and reference kernels) is the op table,
``ops`` here, documented in ``docs/ops.md``.

Shapes are numpy order (outermost axis first; ggml's ``ne`` reversed). A plugin imports
what it needs from this module only: ``__all__`` lists it.

What the framework does centrally, so that no plugin does it again (``core/scheduler/verdicts.py``
and the executor): it refuses, before ``supports_op`` is asked, every node of an unavailable
device, of an op outside the table, of an op outside ``Device.supported_ops``, of an op in
``Device.refused_ops``, and of a weight type outside ``Limits.dtypes``; it turns an answer that
is not a Verdict, or an exception inside ``supports_op`` / ``supports_buffer``, into an error
naming the plugin, the device and the node; it never asks an unavailable device to load,
allocate or compile; and it checks what every program returns (the number of outputs, each
one's shape and dtype, and, for plugins outside the framework's own distribution or with
``--check-values``, that the values are finite).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np
import pluggy

from . import caches, settings
from .core.graph import DType, Fragment, LeafKind, Tensor, ops, reference
from .core.graph.dtypes import block_shape, nbytes, row_bytes
from .core.graph.interpreter import ReferenceProgram
from .core.graph.quants import dequantize
from .core.host import host_memory_limit, release_file_pages
from .core.physical import HOST_CPU, pci_address, pci_ids_at, pci_physical_id

PROJECT = "framework"
ENTRY_POINT_GROUP = "framework.backends"

# The contract's version. A plugin module may declare the version it was written for as
# ``FRAMEWORK_CONTRACT = 1``; registration refuses a version this framework does not implement.
CONTRACT_VERSION = 1
CONTRACT_VERSIONS = (1,)
VERSION_ATTRIBUTE = "FRAMEWORK_CONTRACT"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class DeviceType(str, Enum):
    CPU = "CPU"
    GPU = "GPU"
    NPU = "NPU"
    ACCEL = "ACCEL"


@dataclass(frozen=True)
class Verdict:
    """A device's answer to "can you run this node" or "can you use this buffer".

    ``code`` is machine-readable (``ok``, ``unsupported_op``, ``unsupported_dtype``,
    ``unsupported_shape``, ``unsupported_buffer``, ``refused_by_profile``, ...);
    ``reason`` is one sentence for people.
    """

    ok: bool
    code: str = "ok"
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def yes(cls) -> "Verdict":
        return _YES

    @classmethod
    def no(cls, code: str, reason: str) -> "Verdict":
        return cls(False, code, reason)

    def __str__(self) -> str:
        """How reports print a refusal: "code: reason"."""
        return f"{self.code}: {self.reason}" if self.reason else self.code


_YES = Verdict(True)


@dataclass(frozen=True)
class BufferType:
    """Where a tensor's bytes live. ``host`` buffers are plain numpy arrays any device can read.

    ``alignment`` (optional, default 16): the bytes a buffer of this type starts on. ``max_size``
    (optional, default None: no limit): the most one buffer (or one binding of it) may hold; a device on
    the backend skeleton splits a weight over it into chunks of whole rows and refuses operands over it.
    Two buffer types are the same memory when their names (and ``host``) are: the limits are not
    compared."""

    name: str
    host: bool = False
    alignment: int = field(default=16, compare=False)
    max_size: int | None = field(default=None, compare=False)


HOST_BUFFER = BufferType("host", host=True)


@dataclass(frozen=True)
class Limits:
    """What a device declares up front. ``None`` means "no limit"."""

    memory_bytes: int | None = None
    max_live_programs: int | None = None
    max_chain: int | None = None          # commands (dispatches, runs) one submission may chain
    static_shapes: bool = False           # every program needs fixed shapes
    # Each new step shape costs a compile (a program per shape, as OpenVINO's models): the runtime rounds a
    # step's token rows and logits rows up to a few sizes (runtime/context.py's padded_rows), so that a
    # server's ever-new mixes of prompt and decode rows meet a bounded set of programs.
    padded_rows: bool = False
    dtypes: frozenset[str] | None = None  # weight dtypes accepted (names like "Q4_K"); None: all
    # The most rows a step may hold with every row's results bit for bit those a one-row step gives that row
    # (speculative verification relies on it: docs/speculative.md). Default 0: not declared, and speculative
    # decoding on the device is refused unless asked for by name (--draft-inexact); None: any number of rows.
    exact_rows: int | None = 0
    # A step's input may be an earlier step's output not yet read (a greedy step's token: runtime/greedy.py): the
    # device takes it where it is, with no wait and the same buffers bound, so the runtime queues each greedy step
    # before the step before is read. Default False: greedy steps run one after another.
    queued_inputs: bool = False


class Program(Protocol):
    """A compiled fragment."""

    def run(self, args: list[Any]) -> list[Any]:
        """Run once. ``args`` are device handles in ``fragment.inputs`` order; returns one handle per
        ``fragment.outputs``, in that order, each of its tensor's shape and dtype (the executor checks)."""


_NO_REFUSALS: Mapping[str, Verdict] = MappingProxyType({})


class Device:
    """Base class of every device. Subclasses set the class data and override the methods
    marked *required*; every other member is optional and its default is written here.
    """

    # -- identity (required) ---------------------------------------------------------------
    name: str = ""                       # unique, "plugin:index" style, e.g. "cpu", "vulkan:0"
    type: DeviceType = DeviceType.CPU
    physical_id: str = ""                # two plugins, one chip: the same id. HOST_CPU for the host's CPU (a
                                         # software driver on it too), pci_physical_id(...) for a PCI device
    description: str = ""
    plugin: str = ""                     # set by the registry: "entry point (distribution version)"

    # -- availability (optional; default: available) ----------------------------------------
    # An absent driver or chip is a device with available = False and the reason, never an exception
    # from the constructor. The framework checks availability itself: an unavailable device is refused
    # by --backends, answers every node "unavailable", and is never asked to load, allocate or compile.
    available: bool = True
    unavailable_reason: str = ""

    # -- capabilities (optional; data the framework applies before supports_op) ---------------
    limits: Limits = Limits()
    supported_ops: frozenset[str] | None = None   # ops it has kernels for (ops.names(...)); None: all of the table
    refused_ops: Mapping[str, Verdict] = _NO_REFUSALS   # op -> the Verdict.no a profile or setting refuses it with
    buffer_type: BufferType = HOST_BUFFER   # where this device allocates the pre-allocated tensors it owns
    weight_buffer_type: BufferType | None = None   # where it keeps weights, if not buffer_type (a repacked layout)
    emulation: str | None = None            # set when limits of absent hardware are emulated: reports say so
    weights_in_programs: bool = False       # True: compile() folds the fragment's weights into the program
                                            # (as constants), so only fragments with the same weights share one

    def supports_op(self, node: Tensor) -> Verdict:
        """*Required.* Whether this device can compute ``node`` (its dtypes, shapes, parameters), once the
        declared data above has accepted it. A Verdict, never a bool; never raises."""
        raise NotImplementedError

    def supports_buffer(self, buft: BufferType) -> Verdict:
        """Whether this device can read and write tensors held in ``buft`` in place.
        Default: its own buffer types, and host buffers when the device's own buffer is host memory."""
        if buft in (self.buffer_type, self.weight_buffer_type) or (buft.host and self.buffer_type.host):
            return Verdict.yes()
        return Verdict.no("unsupported_buffer", f"{self.name} cannot access buffers of type '{buft.name}'")

    def weight_nbytes(self, tensor: Tensor) -> int:
        """Bytes ``load_weight`` will hold for this weight (used by the memory check at reservation).
        Default: float32 values, as the default ``load_weight`` makes."""
        return tensor.nelements * 4

    # -- memory (optional) --------------------------------------------------------------------
    def free_memory(self) -> int | None:
        """Bytes of device memory free now, where the driver reports it (ggml's ``get_memory``). Planning
        uses the smaller of this and ``limits.memory_bytes`` (and of a ``--device-memory`` cap): layers that
        do not fit go to the next device in --backends. Asked once per session. Default: None, not reported
        (only ``limits.memory_bytes`` counts)."""
        return None

    def load_weight(self, tensor: Tensor, raw: np.ndarray) -> Any:
        """Turn a weight's file bytes (uint8, as stored in GGUF) into a device handle.
        Default: dequantize to a float32 numpy array."""
        return dequantize(raw, tensor.dtype, tensor.shape)

    def alloc(self, tensor: Tensor) -> Any:
        """A zero-filled handle for a pre-allocated tensor (a KV cache). Default: numpy zeros."""
        return np.zeros(tensor.shape, dtype=np.float32 if tensor.dtype.name == "F32" else np.int32)

    def from_host(self, array: np.ndarray) -> Any:
        """A device handle holding ``array``'s values. Default: the array itself."""
        return array

    def to_host(self, handle: Any) -> np.ndarray:
        """A numpy array holding the handle's values. Default: ``np.asarray(handle)``."""
        return np.asarray(handle)

    def from_device(self, handle: Any, source: "Device") -> Any:
        """A handle of this device for a value ``source`` holds, taken without reading it back to this process
        (devices of two machines: from one node's object store to the other's). The executor asks before it
        copies a value between two devices. Default: None (the value goes through host memory)."""
        return None

    def handle_shape(self, handle: Any) -> tuple[tuple[int, ...], np.dtype]:
        """The shape and numpy dtype of a handle a program returned, without copying its values (the
        executor checks them against the fragment's tensors). Default: ``handle.shape`` and ``handle.dtype``."""
        return tuple(handle.shape), np.dtype(handle.dtype)

    # -- work (required) ------------------------------------------------------------------------
    def compile(self, fragment: Fragment) -> Program:
        """*Required.* Compile a fragment into a program. Called once per distinct ``fragment.program``
        key: by default the structure hash, so the program must not capture the fragment's weights
        (they are arguments of ``run``). A device that sets ``weights_in_programs`` may fold them in."""
        raise NotImplementedError

    def programs_nbytes(self, fragments: list[Fragment]) -> int:
        """Memory the compiled programs of these fragments (one each of distinct ``fragment.program``) hold
        beyond the weights, caches and activations reservation counts already: a program that keeps its own
        copy of the weights, as OpenVINO's compiled models do. Reservation adds it to the device's use in the
        memory check (pass 5), so that many step shapes' programs are refused there, not killed later.
        Default 0."""
        return 0

    def live_programs(self) -> int:
        """Compiled programs alive on this device's hardware now, in this process, whoever holds them.
        Default 0. Reservation counts the ones other sessions hold against ``limits.max_live_programs``:
        a budget such as an NPU driver's is per process, so a draft model's session and its target's
        share it."""
        return 0

    # -- device profiles (optional; default: none) ---------------------------------------------
    profiles: tuple[str, ...] = ()          # names of the hardware whose limits with_options(profile=...) applies

    def with_options(self, *, profile: str | None = None) -> "Device":
        """This device under a profile from ``profiles``: an EMULATION of that hardware (set ``emulation``),
        unless the device is that hardware; a plugin may return another device of its own (a host arm
        standing in for an absent NPU). ``--device-profile NAME`` calls it. Default: no profiles."""
        raise ValueError(f"{self.name} offers no device profiles")

    def synchronize(self) -> None:
        """Wait until the work submitted so far has finished. The executor calls it before it stops a
        fragment's clock, so that the time reported for a device includes the time until its results are
        ready. Default: nothing to wait for (``Program.run`` returns when its results are ready)."""

    # -- reports (optional) -----------------------------------------------------------------------
    def run_figures(self) -> dict[str, float]:
        """What the device measured itself since it was made, shown under its row of the run summary:
        ``network_bytes`` (values it moved over a network), ``weight_network_bytes`` (weights sent over one),
        ``node_seconds`` (time its own machine computed, where that is not the time seen here). Default: {}."""
        return {}

    def report_line(self) -> str | None:
        """One line for the summary after a run that compiled on this device (what was compiled, loaded
        from a cache, converted). Default: None, nothing to add."""
        return None

    def describe(self) -> str:
        state = "available" if self.available else f"unavailable: {self.unavailable_reason}"
        return f"{self.name} ({self.type.value}, {state})"


class UnknownProfileError(ValueError):
    """A device profile name that a plugin's profile table does not hold."""


def lookup_profile(profiles: dict[str, Any], name: str, what: str = "device profile") -> Any:
    """``profiles[name]``, or an error that lists every known name (never a guess)."""
    try:
        return profiles[name]
    except KeyError:
        raise UnknownProfileError(f"unknown {what} '{name}'; known: {', '.join(profiles)}") from None


# Ops documented to fail on NPUs (the design brief's failure 2): an NPU plugin or profile refuses them with
# this reason, so the plan sends them to the next device in --backends, or --strict fails naming them.
_LINEAR_ATTENTION = ("linear attention (Qwen3.5's GatedDeltaNet layers) hangs the NPU at the first inference on "
                     "NPU 37xx with one driver and fails to compile with another; never sent to an NPU")
NPU_REFUSED_OPS: dict[str, str] = {"GATED_DELTA_NET": _LINEAR_ATTENTION, "SSM_CONV": _LINEAR_ATTENTION}


class BackendSpec:
    """Hook specifications. A plugin implements some of them with ``@hookimpl``; a ``@hookimpl`` whose
    name is not one of them is refused at registration (with the name it probably meant)."""

    @hookspec
    def framework_devices(self) -> list[Device]:
        """Return the devices this plugin provides, available or not.

        An unavailable device is still returned, with ``available = False`` and the reason, so
        that ``framework backends`` can say why it cannot be used; the hook never raises for a
        missing driver or chip. Device names are unique over every plugin.

        The caller collects the lists of every plugin.
        """


__all__ = ["PROJECT", "ENTRY_POINT_GROUP", "CONTRACT_VERSION", "CONTRACT_VERSIONS", "VERSION_ATTRIBUTE", "hookspec",
           "hookimpl", "DeviceType", "Verdict", "BufferType", "HOST_BUFFER", "Limits", "Program", "Device",
           "UnknownProfileError", "lookup_profile", "BackendSpec", "NPU_REFUSED_OPS",
           # physical ids, spelled once: the host's CPU, a PCI device
           "HOST_CPU", "pci_address", "pci_ids_at", "pci_physical_id",
           # the graph a device receives, the op table and its reference kernels, GGUF's sizes and decoder
           "DType", "Fragment", "LeafKind", "Tensor", "ops", "reference", "ReferenceProgram", "block_shape", "nbytes",
           "row_bytes", "dequantize",
           # settings read from the environment, on-disk caches, the host's memory (docs/plugin-guide.md)
           "settings", "caches", "host_memory_limit", "release_file_pages"]
# A plugin whose tensors live in device memory builds on framework.backend, the skeleton that holds the
# kit such plugins share (buffer pools, handles, the weights' word layout, fusion, the shared verdict rules).
