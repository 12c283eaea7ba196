"""Running plans: weights and caches on their devices, one program per fragment program key,
copies between devices, and the time each device took.

Every fragment boundary is checked: a program returns one handle per fragment output, each of its
tensor's shape and dtype (always; ``Device.handle_shape`` reads them without a copy; a cache written in
place and given back as the handle the program received is checked the first time, then compared by
identity), and the graph's
outputs (the logits) hold finite values (always). The values of every output are checked to be
finite too for devices of plugins outside this distribution, and for every device with
``check_values`` (``--check-values``). A violation is a DeviceRunError naming the plugin, the device,
the fragment and the node, before the next device reads the value. (A write into a cache is checked
where another device reads it, not at every step: that would read the whole cache every time.) With a
``Verifier`` (``--verify``), each fragment's outputs are also compared with a reference device's on the
same inputs (verify.py)."""

from __future__ import annotations

import operator
import time
from collections import defaultdict
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Callable

import numpy as np

from ...contract import Device
from ..device_buffers import picker
from ..graph import LeafKind, Tensor, ops
from ..graph.dtypes import NUMPY_TYPES
from .errors import DeviceRunError
from .plan import Plan
from .products import join_outputs
from .verdicts import check_available, in_distribution, plugin_of
from .verify import Verifier, compared

WeightBytes = Callable[[Tensor], np.ndarray]
Progress = Callable[[str, int, int], None]     # (tensor name or "compiling <fragment>", bytes done, bytes total)


_INPUT, _CACHE, _VALUE = 0, 1, 2


@dataclass(frozen=True)
class Held:
    """A value on a device: an input of a step given as an earlier run's output (``Executor.run(...,
    wait=False)``), which a fragment on that device reads where it is, with no copy through the host."""
    device: str
    handle: Any
    tensor: Tensor                      # the graph output it holds, named in errors


@dataclass(eq=False)
class _Bound:
    """What a fragment's run does not have to work out again step after step (made once per plan): its
    program, its arguments with the weights' handles in place, the other arguments to fetch, and per output
    what the check wants (shape, dtype) and the cache tensor it writes."""

    device: Device
    program: Any
    args: list                  # the weights' handles at their places, None where an argument is fetched per run
    fetched: list[tuple[int, Tensor, int, int]]         # (place, tensor, id of tensor, _INPUT | _CACHE | _VALUE)
    outputs: list[tuple[Tensor, tuple, Any, int | None, bool]]
    # ... (tensor, shape, numpy dtype or None, id of the cache it writes or None, whether its values are checked)
    in_place: _InPlace | None   # the outputs that write a cache it reads, of the cache's shape and dtype


@dataclass(eq=False)
class _InPlace:
    """A fragment's outputs that write a cache the fragment reads whole, of the cache's own shape and dtype (a
    decode step's k and v rows written into the caches): when the program returns the cache's own handles
    for them, as a device writing in place does, they need no shape check and the caches no update. A
    decode step of a 30-layer model returns 60 such handles, and checking them one by one was most of the
    executor's own host time a step."""

    outputs: Callable                       # results -> those outputs' handles, as a tuple
    args: Callable                          # args -> the caches' handles, as a tuple, in the same order
    ids: tuple[int, ...]                    # id() of those outputs' tensors (the keys of a run's values)
    others: list[tuple[int, tuple]]         # (output index, b.outputs entry) of every other output
    checked: tuple = ()                     # the caches' handles last checked in full


class Executor:
    def __init__(self, devices: list[Device], weight_bytes: WeightBytes, residence: dict | None = None,
                 caches: dict | None = None, share_with: "Executor | None" = None, check_values: bool = False,
                 verifier: Verifier | None = None):
        """share_with: another session's executor in this process (a draft's target, a server's other slot): its
        loaded weights and compiled programs are this one's too, so a weight or a program structure both use
        exists once. check_values: every device's outputs are checked to be finite (those of other
        distributions' devices always are). verifier: every fragment's outputs compared with its reference
        device's (--verify; one verifier may serve several executors)."""
        check_available(devices)
        self.devices = {d.name: d for d in devices}
        # devices whose outputs' values are checked: all with check_values, else those of other distributions
        self.value_checked = {d.name for d in devices if check_values or not in_distribution(d)}
        self.weight_bytes = weight_bytes
        self.verifier = verifier
        self.residence = residence if residence is not None else {}
        self.weights: dict[tuple[str, int], Any] = share_with.weights if share_with is not None else {}
        # pre-allocated tensors: id -> (device, handle); shared with another executor for a shared KV cache
        self.caches: dict[int, tuple[str, Any]] = caches if caches is not None else {}
        self._prepared: dict[int, Plan] = {}    # holds the plans too, so an id is never reused
        self._bound: dict[int, list[_Bound]] = {}   # id(plan) -> each fragment's _Bound
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
        self._bound[id(plan)] = [self._bind(f) for f in plan.fragments]
        self._prepared[id(plan)] = plan

    def _bind(self, f) -> _Bound:
        args: list = [None] * len(f.inputs)
        fetched = []
        for i, t in enumerate(f.inputs):
            if t.is_leaf and t.kind == LeafKind.WEIGHT:
                args[i] = self.weights[(f.device, id(t))]
            else:
                kind = _VALUE if not t.is_leaf else _INPUT if t.kind == LeafKind.INPUT else _CACHE
                fetched.append((i, t, id(t), kind))
        checked = f.device in self.value_checked
        outputs = [(t, tuple(t.shape), _numpy_dtype(t), id(t.storage) if ops.writes_source(t.op) else None,
                    checked and not ops.writes_source(t.op) and not t.storage.is_leaf) for t in f.outputs]
        return _Bound(self.devices[f.device], self.programs[(f.device, f.program)], args, fetched, outputs,
                      _in_place(f, outputs))

    def forget(self, plan: Plan) -> None:
        """The plan will not run again (its weights and programs stay: other plans use them)."""
        self._prepared.pop(id(plan), None)
        self._bound.pop(id(plan), None)

    # -- running --------------------------------------------------------------------------
    def run(self, plan: Plan, inputs: dict[int, np.ndarray | Held], wait: bool = True) -> list:
        """Run every fragment in order; return the graph's outputs as numpy arrays. An input may be Held
        on a device. wait=False: the outputs come back as Held handles as soon as the devices have the work
        (no wait, no read-back: ``read`` reads one, and checks it as the outputs are); the devices' seconds
        then count their host time here and the waits in ``read``."""
        self.prepare(plan)
        values: dict[int, tuple[str, Any]] = {}
        hosted: dict[int, np.ndarray] = {}      # host copies already made (by a check), reused by copies
        made_by: dict[int, Any] = {}            # id(tensor) -> the fragment that made it
        caches = self.caches
        verifying = self.verifier is not None and self.verifier.begin_step()
        for f, b in zip(plan.fragments, self._bound[id(plan)]):
            dev_name = f.device
            args = list(b.args)
            copied = False                      # a cache read from another device's handle, through a copy
            for i, t, key, kind in b.fetched:
                if kind == _INPUT:
                    args[i] = self._input(inputs[key], dev_name, b.device)
                    continue
                held = caches[key] if kind == _CACHE else values[key]
                if held[0] == dev_name:
                    args[i] = held[1]
                else:
                    args[i], copied = self._arg(t, dev_name, values, inputs, hosted, made_by), True
            # what the fragment reads, as it is before the run (a cache it writes in place changes)
            read = self._host_args(f, b, args, inputs) if verifying and self.verifier.covers(f) else None
            t0 = time.perf_counter()
            results = self._device_call(dev_name, "running", f.describe(), b.program.run, args)
            t1 = time.perf_counter()
            # the handles' shapes need no values: checked before the wait, while the device works
            self._check_count(f, results)
            ip = None if copied else self._written_in_place(f, b, results, args)
            self._check_shapes(f, b, results, ip)
            t2 = time.perf_counter()
            if wait:
                self._device_call(dev_name, "finishing", f.describe(), b.device.synchronize)
            seconds = (t1 - t0) + (time.perf_counter() - t2)
            for st in (self.stats[dev_name], self.fragment_stats[(id(plan), f.index)]):
                st["seconds"] += seconds
                st["runs"] += 1
            if ip is not None:                  # the caches' own handles came back: the caches are as they were
                values.update(zip(ip.ids, zip(repeat(dev_name), ip.outputs(results))))
                made_by.update(dict.fromkeys(ip.ids, f))
            for (t, _, _, written, checked), h in (zip(b.outputs, results) if ip is None else
                                                   ((entry, results[k]) for k, entry in ip.others)):
                held = values[id(t)] = (dev_name, h)
                made_by[id(t)] = f
                if written is not None:         # the written tensor's latest value is this handle
                    caches[written] = held
                elif checked:                   # a value-checked device's: finite, before another device reads it
                    host = hosted[id(t)] = self._to_host(held)
                    self._check_finite(f, t, host, values)
            if read is not None:                # read back outside the device's time: the check's cost is its own
                made = {id(t): hosted[id(t)] if id(t) in hosted else b.device.to_host(values[id(t)][1])
                        for t in f.outputs if compared(t)}
                self.verifier.check(f, b.device, read, made)
        if not wait:
            return [Held(*values[id(t)], t) for t in plan.graph.outputs]
        outputs = []
        for t in plan.graph.outputs:            # the answer itself is always checked: never NaN logits
            host = hosted[id(t)] if id(t) in hosted else self._to_host(values[id(t)])
            if id(t) not in hosted:
                self._check_finite(made_by[id(t)], t, host, values)
            outputs.append(host)
        return join_outputs(plan.graph, outputs)     # a product computed in blocks of rows, whole again

    def _input(self, value, dev_name: str, device: Device):
        """An input leaf's argument on a fragment's device: host values uploaded, a value Held on this device
        as it is, one Held on another device through the host."""
        if not isinstance(value, Held):
            return device.from_host(value)
        if value.device == dev_name:
            return value.handle
        return device.from_host(self.devices[value.device].to_host(value.handle))

    def read(self, held: Held) -> np.ndarray:
        """The values of an output that run(..., wait=False) gave (waiting for its device), checked finite as
        run checks the outputs it reads; the wait counts as that device's time."""
        t0 = time.perf_counter()
        what = held.tensor.describe                 # named on failure only (a queued step's every read)
        host = self._device_call(held.device, "reading", what, self.devices[held.device].to_host, held.handle)
        self.stats[held.device]["seconds"] += time.perf_counter() - t0
        if host.dtype.kind == "f" and not np.isfinite(host).all():
            raise DeviceRunError(f"{_where(self.devices[held.device])}: node {what()}: {_bad(host)}\n  fix: "
                                 f"--check-values checks every device's outputs where they are made, naming the node",
                                 device=held.device, plugin=plugin_of(self.devices[held.device]),
                                 node=held.tensor.name)
        return host

    def _host_args(self, f, b: _Bound, args: list, inputs: dict[int, np.ndarray]) -> list:
        """Host copies of a fragment's arguments for the verifier (None for the weights, which it loads
        itself); copies, so that the reference's writes into a cache touch only its own."""
        host: list = [None] * len(args)
        for i, t, key, kind in b.fetched:
            value = inputs[key] if kind == _INPUT else b.device.to_host(args[i])
            host[i] = np.array(value, copy=True)
        return host

    def _arg(self, t: Tensor, dev_name: str, values: dict, inputs: dict[int, np.ndarray], hosted: dict,
             made_by: dict) -> Any:
        if t.is_leaf and t.kind == LeafKind.WEIGHT:
            return self.weights[(dev_name, id(t))]
        if t.is_leaf and t.kind == LeafKind.INPUT:
            return self.devices[dev_name].from_host(inputs[id(t)])
        held = self.caches[id(t)] if t.is_leaf else values[id(t)]
        if held[0] == dev_name:
            return held[1]
        host = hosted.get(id(t))
        if host is None:
            taken = self.devices[dev_name].from_device(held[1], self.devices[held[0]])
            if taken is not None:           # passed on between the devices, not through this process
                self.stats[dev_name]["bytes_copied"] += t.nbytes
                return taken
            host = self._to_host(held)
            if held[0] in self.value_checked and id(t) in made_by:   # one the check skipped: a view of a cache
                self._check_finite(made_by[id(t)], t, host, values)
        self.stats[dev_name]["bytes_copied"] += host.nbytes
        t0 = time.perf_counter()
        handle = self.devices[dev_name].from_host(host)
        self.stats[dev_name]["seconds"] += time.perf_counter() - t0
        return handle

    # -- the checks at fragment boundaries ------------------------------------------------------------
    def _check_count(self, f, results) -> None:
        """A program returns one handle per fragment output, in a list."""
        if not isinstance(results, (list, tuple)) or len(results) != len(f.outputs):
            got = f"{len(results)} outputs" if isinstance(results, (list, tuple)) else f"a {type(results).__name__}"
            missing = f.outputs[len(results)] if isinstance(results, (list, tuple)) and len(results) < len(f.outputs) \
                else f.outputs[-1]
            raise self._boundary_error(f, missing, f"program.run returned {got}; the fragment has "
                                       f"{len(f.outputs)} ({', '.join(t.name for t in f.outputs)})",
                                       "Program.run returns a list with one handle per fragment.outputs, in order")

    def _written_in_place(self, f, b: _Bound, results, args) -> _InPlace | None:
        """b.in_place where the program gave back the caches' own handles for those outputs (C loops: no
        Python step an output). Handles not seen before are checked in full once."""
        ip = b.in_place
        if ip is None:
            return None
        got = ip.outputs(results)
        if not all(map(operator.is_, got, ip.args(args))):
            return None
        if got != ip.checked:
            self._check_shapes(f, b, results, None)
            ip.checked = got
        return ip

    def _check_shapes(self, f, b: _Bound, results, ip: _InPlace | None) -> None:
        """What a program returned against what its fragment holds: every shape and dtype (the values of a
        value-checked device's outputs are checked once they are there, in run), but for the caches' own
        handles given back (ip), which are the caches' shape and dtype."""
        handle_shape = b.device.handle_shape
        for (t, want_shape, want, _, _), h in (zip(b.outputs, results) if ip is None else
                                               ((entry, results[k]) for k, entry in ip.others)):
            try:
                shape, dtype = handle_shape(h)
            except Exception as e:
                raise self._boundary_error(f, t, f"handle_shape() of its output raised {type(e).__name__}: {e}",
                                           "give handles .shape and .dtype, or override Device.handle_shape") from e
            if tuple(shape) != want_shape or (want is not None and np.dtype(dtype) != want):
                raise self._boundary_error(f, t, f"expected shape {list(t.shape)} {want or t.dtype.name}, got shape "
                                           f"{list(shape)} {np.dtype(dtype)}",
                                           f"the kernel for {t.op} in {type(b.device).__qualname__}: its result must "
                                           f"have the node's shape and dtype (docs/ops.md says what {t.op} computes)")

    def _check_finite(self, f, t: Tensor, host: np.ndarray, values: dict) -> None:
        if host.dtype.kind != "f" or t.storage.kind == LeafKind.INPUT or np.isfinite(host).all():
            return
        # before blaming this device: did a value it read arrive non-finite? (a device whose values are
        # not checked may have made it)
        for s in f.inputs:
            src = self._source_values(s, f.device, values)
            if src is not None and src[1].dtype.kind == "f" and not np.isfinite(src[1]).all():
                producer, arr = src
                raise DeviceRunError(
                    f"{_where(self.devices[producer])}: node {s.describe()}: {_bad(arr)}; it reached fragment "
                    f"{f.index} on {f.device} that way\n  fix: the kernel (or the weight loading) that made "
                    f"'{s.name}' on {producer}; --check-values checks every device's outputs where they are made",
                    device=producer, plugin=plugin_of(self.devices[producer]), fragment=f.index, node=s.name)
        raise self._boundary_error(f, t, f"{_bad(host)}, from finite inputs",
                                   f"the kernel for {t.op} in {type(self.devices[f.device]).__qualname__} "
                                   f"(its inputs were finite)")

    def _source_values(self, s: Tensor, dev_name: str, values: dict):
        """(device, host values) of a fragment input, for the error path only."""
        try:
            if s.is_leaf and s.kind == LeafKind.WEIGHT:
                return dev_name, self.devices[dev_name].to_host(self.weights[(dev_name, id(s))])
            if s.is_leaf and s.kind == LeafKind.INPUT:      # the caller's (a mask holds -inf by design)
                return None
            held = self.caches.get(id(s)) if s.is_leaf else values.get(id(s))
            if held is None or (s.is_leaf and held[0] == dev_name):   # a cache this fragment may have written
                return None
            return held[0], self._to_host(held)
        except Exception:   # noqa: BLE001 - a handle that cannot come back is not evidence either way
            return None

    def _boundary_error(self, f, t: Tensor, what: str, fix: str) -> DeviceRunError:
        dev = self.devices[f.device]
        return DeviceRunError(f"{_where(dev)}: {f.describe()}: node {t.describe()}: {what}\n  fix: {fix}",
                              device=dev.name, plugin=plugin_of(dev), fragment=f.index, node=t.name)

    def _to_host(self, held: tuple[str, Any]) -> np.ndarray:
        """A value read back from its device; the time counts as that device's (a device's time is its
        runs, its waits and its transfers)."""
        t0 = time.perf_counter()
        host = self.devices[held[0]].to_host(held[1])
        self.stats[held[0]]["seconds"] += time.perf_counter() - t0
        return host

    def _device_call(self, dev_name: str, doing: str, what, fn, *args):
        """Never swallow a device's failure: re-raise it in words, with its message (what: or a function naming it)"""
        try:
            return fn(*args)
        except DeviceRunError:
            raise
        except Exception as e:
            dev = self.devices[dev_name]
            what = what() if callable(what) else what
            raise DeviceRunError(f"device {dev_name} failed while {doing} {what}: {type(e).__name__}: {e} "
                                 f"(plugin {plugin_of(dev)})", device=dev_name, plugin=plugin_of(dev)) from e


def _in_place(f, outputs: list) -> _InPlace | None:
    """The outputs of f that write a cache f reads as an argument of its own, of that cache's shape and dtype
    (_InPlace), or None where there are none."""
    arg_of = {id(t): i for i, t in enumerate(f.inputs) if t.is_leaf and t.kind == LeafKind.CACHE}
    pairs = [(k, arg_of[written]) for k, (t, shape, _, written, _) in enumerate(outputs)
             if written is not None and written in arg_of and shape == tuple(f.inputs[arg_of[written]].shape)
             and t.dtype == f.inputs[arg_of[written]].dtype]
    if not pairs:
        return None
    taken = {k for k, _ in pairs}
    return _InPlace(picker([k for k, _ in pairs]), picker([i for _, i in pairs]),
                    tuple(id(outputs[k][0]) for k, _ in pairs),
                    [(k, entry) for k, entry in enumerate(outputs) if k not in taken])


def _where(dev: Device) -> str:
    return f"device {dev.name} (plugin {plugin_of(dev)})"


def _bad(a: np.ndarray) -> str:
    bad = ~np.isfinite(a)
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    return f"{int(bad.sum())} of {a.size} values are not finite (the first, {float(a[first])}, at {list(first)})"


def _numpy_dtype(t: Tensor) -> np.dtype | None:
    """The numpy dtype a handle of t must have; None where the device chooses (views of weights, whose
    handles hold what load_weight made)."""
    s = t.storage
    if s.is_leaf and s.kind == LeafKind.WEIGHT:
        return None
    name = NUMPY_TYPES.get(t.dtype)
    return np.dtype(name) if name else None

