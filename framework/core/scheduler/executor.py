"""Running plans: weights and caches on their devices, one program per fragment program key,
copies between devices, and the time each device took."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Callable

import numpy as np

from ...contract import Device
from ..graph import LeafKind, Tensor, ops
from .errors import DeviceRunError
from .plan import Plan

WeightBytes = Callable[[Tensor], np.ndarray]
Progress = Callable[[str, int, int], None]     # (tensor name or "compiling <fragment>", bytes done, bytes total)


class Executor:
    def __init__(self, devices: list[Device], weight_bytes: WeightBytes, residence: dict | None = None,
                 caches: dict | None = None, share_with: "Executor | None" = None):
        """share_with: another session's executor in this process (a draft's target, a server's other slot): its
        loaded weights and compiled programs are this one's too, so a weight or a program structure both use
        exists once."""
        self.devices = {d.name: d for d in devices}
        self.weight_bytes = weight_bytes
        self.residence = residence if residence is not None else {}
        self.weights: dict[tuple[str, int], Any] = share_with.weights if share_with is not None else {}
        # pre-allocated tensors: id -> (device, handle); shared with another executor for a shared KV cache
        self.caches: dict[int, tuple[str, Any]] = caches if caches is not None else {}
        self._prepared: dict[int, Plan] = {}    # holds the plans too, so an id is never reused
        self.programs: dict[tuple[str, str], Any] = share_with.programs if share_with is not None else {}
        self.stats = defaultdict(lambda: {"seconds": 0.0, "runs": 0, "bytes_copied": 0, "compiles": 0})
        # (id(plan), fragment index) -> seconds and runs of that fragment (the view of a run shows them)
        self.fragment_stats = defaultdict(lambda: {"seconds": 0.0, "runs": 0})

    # -- preparation ----------------------------------------------------------------------
    def programs_per_device(self) -> dict[str, int]:
        """Compiled programs this executor holds, per device."""
        out: dict[str, int] = {}
        for dev, _ in self.programs:
            out[dev] = out.get(dev, 0) + 1
        return out

    def prepare(self, plan: Plan, progress: Progress | None = None) -> None:
        """Load every weight the plan reads onto its device, allocate caches, compile programs.
        Once per plan: every step calls it, and a decode step must not re-walk the plan's inputs."""
        if self._prepared.get(id(plan)) is plan:
            return
        todo = [(f.device, t) for f in plan.fragments for t in f.inputs
                if t.is_leaf and t.kind == LeafKind.WEIGHT and (f.device, id(t)) not in self.weights]
        todo = list({(d, id(t)): (d, t) for d, t in todo}.values())
        total, done = sum(t.nbytes for _, t in todo), 0
        for dev_name, t in todo:
            self.weights[(dev_name, id(t))] = self._device_call(dev_name, "loading weight", t.name,
                                                                self.devices[dev_name].load_weight,
                                                                t, self.weight_bytes(t))
            done += t.nbytes
            if progress:
                progress(t.name, done, total)
        for f in plan.fragments:
            for t in f.inputs:
                if t.is_leaf and t.kind == LeafKind.CACHE and id(t) not in self.caches:
                    home = self.residence.get(id(t))
                    dev_name = home.device if home else f.device
                    self.caches[id(t)] = (dev_name, self.devices[dev_name].alloc(t))
            key = (f.device, f.program)
            if key not in self.programs:
                if progress:                # a compile can take seconds (OpenVINO's): say what is happening
                    progress(f"compiling {f.describe()}", done, total)
                self.programs[key] = self._device_call(f.device, "compiling", f.describe(),
                                                       self.devices[f.device].compile, f)
                self.stats[f.device]["compiles"] += 1
        self._prepared[id(plan)] = plan

    def forget(self, plan: Plan) -> None:
        """The plan will not run again (its weights and programs stay: other plans use them)."""
        self._prepared.pop(id(plan), None)

    # -- running --------------------------------------------------------------------------
    def run(self, plan: Plan, inputs: dict[int, np.ndarray]) -> list[np.ndarray]:
        """Run every fragment in order; return the graph's outputs as numpy arrays."""
        self.prepare(plan)
        values: dict[int, tuple[str, Any]] = {}
        for f in plan.fragments:
            args = [self._arg(t, f.device, values, inputs) for t in f.inputs]
            t0 = time.perf_counter()
            results = self._device_call(f.device, "running", f.describe(), self.programs[(f.device, f.program)].run,
                                        args)
            self._device_call(f.device, "finishing", f.describe(), self.devices[f.device].synchronize)
            seconds = time.perf_counter() - t0
            for st in (self.stats[f.device], self.fragment_stats[(id(plan), f.index)]):
                st["seconds"] += seconds
                st["runs"] += 1
            for t, h in zip(f.outputs, results):
                values[id(t)] = (f.device, h)
                if ops.writes_source(t.op):     # the written tensor's latest value is this handle
                    self.caches[id(t.storage)] = (f.device, h)
        return [self._to_host(values[id(t)]) for t in plan.graph.outputs]

    def _arg(self, t: Tensor, dev_name: str, values: dict, inputs: dict[int, np.ndarray]) -> Any:
        if t.is_leaf and t.kind == LeafKind.WEIGHT:
            return self.weights[(dev_name, id(t))]
        if t.is_leaf and t.kind == LeafKind.INPUT:
            return self.devices[dev_name].from_host(inputs[id(t)])
        held = self.caches[id(t)] if t.is_leaf else values[id(t)]
        if held[0] == dev_name:
            return held[1]
        taken = self.devices[dev_name].from_device(held[1], self.devices[held[0]])
        if taken is not None:           # passed on between the devices, not through this process
            self.stats[dev_name]["bytes_copied"] += t.nbytes
            return taken
        host = self._to_host(held)
        self.stats[dev_name]["bytes_copied"] += host.nbytes
        t0 = time.perf_counter()
        handle = self.devices[dev_name].from_host(host)
        self.stats[dev_name]["seconds"] += time.perf_counter() - t0
        return handle

    def _to_host(self, held: tuple[str, Any]) -> np.ndarray:
        """A value read back from its device; the time counts as that device's (a device's time is its
        runs, its waits and its transfers)."""
        t0 = time.perf_counter()
        host = self.devices[held[0]].to_host(held[1])
        self.stats[held[0]]["seconds"] += time.perf_counter() - t0
        return host

    def _device_call(self, dev_name: str, doing: str, what: str, fn, *args):
        """Never swallow a device's failure: re-raise it in words, keeping its own message."""
        try:
            return fn(*args)
        except DeviceRunError:
            raise
        except Exception as e:
            raise DeviceRunError(f"device {dev_name} failed while {doing} {what}: {type(e).__name__}: {e}") from e

