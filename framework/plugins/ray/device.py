"""A device of another node, as a device of this process: every question and every piece of work goes to
the node's agent (agent.py), which asks the node's own device.

Handles here are references: ``Held`` for what stays on the node (weights, caches), ``Remote`` for a result
in the node's object store. A result read by another node's device is passed on as its reference, so Ray moves
it node to node (``from_device``); only the inputs of a step and the results asked for cross to this process.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...contract import BufferType, caches, Device, DeviceType, Fragment, LeafKind, Tensor, Verdict, ops
from .wire import detach_fragment, detach_node, signature

_keys = itertools.count()


@dataclass(frozen=True)
class Held:
    """A value that stays on the node (a weight, a cache), by its key there; the shape and dtype of the
    tensor it holds."""
    key: str
    shape: tuple = ()
    dtype: np.dtype = np.dtype(np.float32)


@dataclass(frozen=True)
class Remote:
    """A result in the node's object store, of the shape and dtype the node's agent checked it has (against the
    fragment's tensor, before it left the node)."""
    ref: Any
    node: str
    nbytes: int
    shape: tuple = ()
    dtype: np.dtype = np.dtype(np.float32)


@dataclass
class Traffic:
    """What a node's devices moved over the network, and the time the node computed."""
    sent: int = 0              # this process -> the node (step inputs)
    received: int = 0          # the node -> this process (results read here)
    crossed: int = 0           # another node -> this node, object store to object store
    weights_shipped: int = 0   # weights sent once because the node lacks the model file
    weights_from_file: int = 0   # weights the node loaded from its own copy
    node_seconds: float = 0.0
    pending: list = field(default_factory=list)   # (timing reference, fragment) not waited for yet


class RayDevice(Device):
    def __init__(self, node, info: dict):
        self.node, self.remote = node, info["name"]
        self.name = f"ray:{node.name}/{info['name']}"
        self.type = DeviceType(info["type"])
        self.physical_id = f"ray:{node.node_id[:16]}/{info['physical_id']}"
        self.description = f"{info['description']} (node {node.name}, {node.host}, framework {node.version})"
        self.available, self.unavailable_reason = info["available"], info["unavailable_reason"]
        if not self.available:
            self.unavailable_reason = f"on node {node.name}: {self.unavailable_reason}"
        self.limits, self.emulation = info["limits"], info["emulation"]
        self.weights_in_programs = info["weights_in_programs"]
        # the node's memory is not this process's: nothing here can use it in place
        self.buffer_type = self._here(info["buffer_type"])
        self.weight_buffer_type = self._here(info["weight_buffer_type"]) if info["weight_buffer_type"] else None
        self._free = info["free_memory"]
        self.traffic = Traffic()
        self._verdicts: dict[tuple, Verdict] = {}
        self._weight_sizes: dict[tuple, int] = {}
        self._loads: list[tuple[Any, str]] = []

    def _here(self, b: BufferType) -> BufferType:
        return BufferType(f"ray:{self.node.name}/{b.name}", host=False)

    # -- questions, asked at reservation ----------------------------------------------------
    def supports_op(self, node: Tensor) -> Verdict:
        key = signature(node)
        if key not in self._verdicts:
            (self._verdicts[key],) = self.node.call("asking for its verdict on " + node.name, "verdicts",
                                                    self.remote, [detach_node(node)])
        return self._verdicts[key]

    def weight_nbytes(self, tensor: Tensor) -> int:
        key = (tensor.dtype.name, tensor.shape)
        if key not in self._weight_sizes:
            (self._weight_sizes[key],) = self.node.call(f"asking the size of {tensor.name}", "weight_nbytes",
                                                        self.remote, [detach_node(tensor)])
        return self._weight_sizes[key]

    def free_memory(self) -> int | None:
        return self._free

    # -- weights and caches, on the node ------------------------------------------------------
    def load_weight(self, tensor: Tensor, raw: np.ndarray) -> Held:
        key = f"w{next(_keys)}:{tensor.name}"
        origin = self.node.file_origin(raw)
        if origin is not None:
            source = ("file", *origin)
            self.traffic.weights_from_file += 1
        else:
            source = ("bytes", np.ascontiguousarray(raw))
            self.traffic.weights_shipped += raw.nbytes
        self._loads.append((self.node.agent.load.remote(self.remote, key, detach_node(tensor), source), tensor.name))
        return Held(key, tuple(tensor.shape), _numpy_dtype(tensor))

    def alloc(self, tensor: Tensor) -> Held:
        key = f"c{next(_keys)}:{tensor.name}"
        self._loads.append((self.node.agent.alloc.remote(self.remote, key, detach_node(tensor)), tensor.name))
        return Held(key, tuple(tensor.shape), _numpy_dtype(tensor))

    def _loaded(self) -> None:
        """Wait for the weights and caches sent so far; a failure names the tensor."""
        loads, self._loads = self._loads, []
        for ref, name in loads:
            self.node.wait(ref, f"loading {name}")

    # -- values crossing ----------------------------------------------------------------------
    def from_host(self, array: np.ndarray) -> np.ndarray:
        self.traffic.sent += array.nbytes
        return array              # sent with the run that reads it

    def from_device(self, handle: Any, source: Device) -> Any:
        if isinstance(handle, Remote):
            if handle.node != self.node.name:
                self.traffic.crossed += handle.nbytes
            return handle         # the node reads it from the object store where it is
        return None

    def to_host(self, handle: Any) -> np.ndarray:
        if isinstance(handle, Held):
            array = self.node.call(f"reading {handle.key}", "fetch", handle.key, self.remote)
        else:
            array = self.node.wait(handle.ref, "sending a result")
        self.traffic.received += array.nbytes
        return array

    # -- work -----------------------------------------------------------------------------------
    def compile(self, fragment: Fragment) -> RayProgram:
        self._loaded()
        key = f"p{next(_keys)}"
        self.node.call(f"compiling {fragment.describe()}", "compile", self.remote, key,
                       detach_fragment(fragment, self.remote))
        return RayProgram(self, key, fragment)

    def synchronize(self) -> None:
        self._loaded()
        pending, self.traffic.pending = self.traffic.pending, []
        for ref, what in pending:
            seconds, filled = self.node.wait(ref, f"running {what}")
            self.traffic.node_seconds += seconds
            if filled:          # said here, and kept out of this process's speed figures as its own compiles are
                caches.filled_elsewhere(filled, f"compiling the kernels of node {self.node.name}")

    def run_figures(self) -> dict[str, float]:
        t = self.traffic
        return {"network_bytes": t.sent + t.received + t.crossed, "weight_network_bytes": t.weights_shipped,
                "node_seconds": t.node_seconds, "sent": t.sent, "received": t.received, "crossed": t.crossed,
                "weights_from_file": t.weights_from_file}


def _numpy_dtype(t: Tensor) -> np.dtype:
    return np.dtype(np.float32 if t.dtype.name == "F32" else np.int32)


def _writes_cache(t: Tensor) -> bool:
    return ops.writes_source(t.op) and t.storage.is_leaf and t.storage.kind == LeafKind.CACHE


class RayProgram:
    """A fragment compiled on the node; running it sends the arguments' references and the step's inputs."""

    def __init__(self, device: RayDevice, key: str, fragment: Fragment):
        self.device, self.key, self.what = device, key, fragment.describe()
        position = {id(t): i for i, t in enumerate(fragment.inputs)}
        # a cache written here is handed back as the cache itself: it stays on the node
        self.cache_writes = {i: position[id(t.storage)] for i, t in enumerate(fragment.outputs) if _writes_cache(t)}
        self.sizes = [t.nelements * 4 for t in fragment.outputs]    # float32 or int32 on the way out
        self.kinds = [(tuple(t.shape), _numpy_dtype(t)) for t in fragment.outputs]

    def run(self, args: list[Any]) -> list[Any]:
        dev = self.device
        keep = {}
        for i, j in self.cache_writes.items():
            if not isinstance(args[j], Held):
                raise RuntimeError(f"{self.what}: the cache it writes is not held on node {dev.node.name}")
            keep[i] = args[j].key
        wire = [(("held", a.key) if isinstance(a, Held) else a.ref if isinstance(a, Remote) else a) for a in args]
        n_out = len(self.sizes) - len(keep) + 1
        refs = dev.node.agent.run.options(num_returns=n_out).remote(dev.remote, self.key, wire, keep)
        refs = list(refs) if n_out > 1 else [refs]
        dev.traffic.pending.append((refs[-1], self.what))
        out, it = [], iter(refs[:-1])
        for i, size in enumerate(self.sizes):
            shape, dtype = self.kinds[i]
            out.append(Held(keep[i], shape, dtype) if i in keep
                       else Remote(next(it), dev.node.name, size, shape, dtype))
        return out
