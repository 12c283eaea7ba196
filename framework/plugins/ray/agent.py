"""The node agent: a Ray actor on one node, holding that node's devices, weights, caches and programs.

It loads the node's own framework installation (its registry, its entry points, its drivers), never a
plugin by import, and answers for its devices: what they are, their verdicts, and the work of the fragments
placed on them. Values that leave the node are host arrays in Ray's object store; weights, caches and
programs stay here, under keys the process that placed them chose.
"""

from __future__ import annotations

import hashlib
import os
import socket
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from ... import contract

SELF_PLUGIN = "ray"      # the agent never lists remote devices of its own: no node lends another's devices


def framework_version() -> str:
    try:
        return version(contract.PROJECT)
    except PackageNotFoundError:
        return "unknown (framework is not installed as a distribution)"


def contract_version() -> int:
    return getattr(contract, "CONTRACT_VERSION", 1)


_SHA256: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str) -> str:
    """The file's sha256, computed once per path, size and modification time."""
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SHA256:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _SHA256[key] = h.hexdigest()
    return _SHA256[key]


class NodeAgent:
    def __init__(self, plugins: list[str] | None):
        from importlib.metadata import entry_points

        from ...core.registry import BLOCK_ENV, default_registry
        names = {ep.name for ep in entry_points(group=contract.ENTRY_POINT_GROUP)}
        keep = (set(plugins) if plugins else names) - {SELF_PLUGIN}
        os.environ[BLOCK_ENV] = ",".join(sorted(names - keep))
        self.registry = default_registry()
        self.devices = {d.name: d for d in self.registry.devices()}
        self.values: dict[str, Any] = {}          # weights and caches, by the key the placing process chose
        self.programs: dict[str, Any] = {}
        self.outputs: dict[str, list[tuple[str, str, tuple]]] = {}    # per program: its outputs' names, ops, shapes
        self.files: dict[str, np.ndarray] = {}    # model files found here with the sha256 asked for

    def describe(self) -> dict:
        import ray

        from .wire import describe_device
        return {"framework": framework_version(), "contract": contract_version(), "host": socket.gethostname(),
                "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "devices": [describe_device(d) for d in self.devices.values()],
                "plugin_errors": [f"plugin '{r.name}' ({r.distribution}): {r.error}"
                                  for r in self.registry.plugins.values() if r.error]}

    def verdicts(self, device: str, nodes: list) -> list:
        from ...core.scheduler.verdicts import ask
        return [ask(self.devices[device], n) for n in nodes]

    def weight_nbytes(self, device: str, tensors: list) -> list[int]:
        return [int(self.devices[device].weight_nbytes(t)) for t in tensors]

    def open_file(self, path: str, sha256: str) -> str:
        """'' when this node holds ``path`` with that sha256 (then weights load from it), else why not."""
        if not os.path.isfile(path):
            return f"no file {path} on this node"
        mine = file_sha256(path)
        if mine != sha256:
            return f"{path} on this node has sha256 {mine[:16]}..., the model's is {sha256[:16]}..."
        if path not in self.files:
            self.files[path] = np.memmap(path, dtype=np.uint8, mode="r")
        return ""

    def load(self, device: str, key: str, tensor, source: tuple) -> None:
        """A weight from this node's copy of the file (``("file", path, offset, nbytes)``) or from bytes shipped."""
        if source[0] == "file":
            _, path, offset, n = source
            raw = self.files[path][offset:offset + n]
        else:
            raw = source[1]
        self.values[key] = self.devices[device].load_weight(tensor, raw)

    def alloc(self, device: str, key: str, tensor) -> None:
        self.values[key] = self.devices[device].alloc(tensor)

    def compile(self, device: str, key: str, fragment) -> None:
        self.programs[key] = self.devices[device].compile(fragment)
        self.outputs[key] = [(t.name, t.op, tuple(t.shape)) for t in fragment.outputs]

    def run(self, device: str, key: str, args: list, keep: dict[int, str]):
        """Run a program; outputs at ``keep`` positions (cache writes) stay here under their keys, the others
        leave as host arrays; the last value returned is (seconds this node spent, of which compiling that its
        caches keep for later runs: a first run's numba kernels, kept out of speed figures)."""
        import ray
        clock = contract.caches.Stopwatch()
        dev = self.devices[device]
        ready = [self.values[a[1]] if isinstance(a, tuple) else
                 dev.from_host(ray.get(a) if isinstance(a, ray.ObjectRef) else a) for a in args]
        results = self.programs[key].run(ready)
        dev.synchronize()
        self._check(device, key, results)
        out = []
        for i, r in enumerate(results):
            if i in keep:
                self.values[keep[i]] = r
            else:
                out.append(np.ascontiguousarray(dev.to_host(r)))
        out.append((clock.seconds + clock.filled, clock.filled))
        return tuple(out) if len(out) > 1 else out[0]

    def _check(self, device: str, key: str, results) -> None:
        """This node's device returned what its fragment holds: one result per output, of its shape (the
        driver's executor checks what it reads back; results that stay in the object store are checked here)."""
        expected = self.outputs[key]
        if not isinstance(results, (list, tuple)) or len(results) != len(expected):
            raise RuntimeError(f"device {device} on {socket.gethostname()}: program.run returned "
                               f"{len(results) if isinstance(results, (list, tuple)) else type(results).__name__} "
                               f"outputs; the fragment has {len(expected)} (Program.run returns one handle per "
                               f"fragment.outputs)")
        for (name, op, shape), r in zip(expected, results):
            got = tuple(self.devices[device].handle_shape(r)[0])
            if got != shape:
                raise RuntimeError(f"device {device} on {socket.gethostname()}: node '{name}' ({op}): expected shape "
                                   f"{list(shape)}, got {list(got)}; fix: the kernel for {op} (docs/ops.md)")

    def fetch(self, key: str, device: str) -> np.ndarray:
        return np.asarray(self.devices[device].to_host(self.values[key]))

    def pid(self) -> int:
        return os.getpid()
