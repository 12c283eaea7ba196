"""``--verify``: every fragment's outputs checked against a reference device's on the same inputs.

OpenVINO NPUW's accuracy check, generalised to every plugin: after a fragment runs on its device, the
executor hands the verifier the values the fragment read (host copies, taken before the run) and the
values it made; the verifier runs the same fragment on the reference device (the cpu plugin's by
default, or the graph's reference interpreter, ``reference``) and compares each output by ggml's
normalised mean squared error against the op table's thresholds (``ops.nmse_threshold``, the numbers the
conformance suite uses). A fragment of one op is held to that op's threshold; an output of a longer
fragment to the sum of the thresholds along the longest chain of ops inside the fragment that leads to
it, since every op of the chain may add the error its threshold tolerates (a matrix product's rounding
carries into the additions after it, and a whole model in one fragment chains some 150 products).

Because both sides read the same inputs, an error does not build up from fragment to fragment: the
first output over its threshold names the kernel at fault. Fragments on the reference device itself are
not checked. ``every`` samples: only every N-th step (one ``Executor.run``) is checked, for a server.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ...contract import Device, DeviceType
from ..graph import LeafKind, Tensor, ops
from ..graph.fragment import Fragment
from ..graph.interpreter import ReferenceProgram
from .errors import DeviceRunError
from .verdicts import plugin_of

REFERENCE = "reference"         # --verify's name for the graph's reference interpreter


class ReferenceDevice(Device):
    """The graph's reference interpreter as a device: weights dequantized to float32, every op on the
    core's numpy kernels (core/graph/reference.py), nothing else. Used only as --verify's reference."""

    name = REFERENCE
    type = DeviceType.CPU
    physical_id = "host-cpu"
    description = "the graph's reference interpreter (numpy, float32 weights)"

    def compile(self, fragment: Fragment) -> ReferenceProgram:
        return ReferenceProgram(fragment.nodes, fragment.inputs, fragment.outputs)


def reference_device(name: str, select: Callable[[str], list[Device]]) -> Device:
    """--verify's reference: the graph's interpreter for ``reference``, else the one device ``select`` (the
    registry's selection of a --backends list) finds for ``name``."""
    if name == REFERENCE:
        return ReferenceDevice()
    try:
        found = select(name)
    except ValueError as e:     # a prompt after a bare --verify is read as its device
        raise ValueError(f"--verify {name}: {e}\n(--verify takes an optional device: write the prompt before "
                         f"it, or --verify=DEVICE)") from e
    if len(found) != 1:
        raise ValueError(f"--verify {name} names {len(found)} devices ({', '.join(d.name for d in found)}); name "
                         f"one device, or '{REFERENCE}' for the graph's reference interpreter")
    return found[0]


class Verifier:
    def __init__(self, reference: Device, weight_bytes: Callable[[Tensor], np.ndarray], every: int = 1):
        """reference: the device whose results count as right; weight_bytes: the model's file bytes of a
        weight (what the executor loads devices from); every: check every N-th step only."""
        if every < 1:
            raise ValueError(f"--verify-every must be a positive number of steps, got {every}")
        self.reference, self.weight_bytes, self.every = reference, weight_bytes, every
        self.steps = 0                  # steps begun; step k (from 0) is checked when k % every == 0
        self.checked = 0                # fragments compared so far (the run's summary says it)
        self.closest = (0.0, "")        # the largest NMSE over its threshold seen, and the node's name
        self._weights: dict[int, object] = {}
        self._programs: dict[str, object] = {}
        self._thresholds: dict[str, list[tuple[float, int]]] = {}      # per program: per output

    def begin_step(self) -> bool:
        """A step starts: whether its fragments are to be checked."""
        due = self.steps % self.every == 0
        self.steps += 1
        return due

    def covers(self, f: Fragment) -> bool:
        """Whether a fragment is compared: every one not already on the reference device."""
        return f.device != self.reference.name

    def check(self, f: Fragment, device: Device, inputs: list, outputs: dict[int, np.ndarray]) -> None:
        """Run ``f`` on the reference with ``inputs`` (host arrays, None for weights) and compare every
        output in ``outputs`` (id of tensor -> host values made on ``device``); raise a DeviceRunError
        naming the first output over its threshold."""
        ref = self.reference
        try:
            results = self._run(f, inputs)
        except Exception as e:          # the reference's own failure is not the checked device's
            raise DeviceRunError(f"--verify's reference device {ref.name} (plugin {plugin_of(ref)}) failed running "
                                 f"{f.describe()}: {type(e).__name__}: {e}\n  fix: verify against another device "
                                 f"(--verify {REFERENCE}: the graph's reference interpreter)", device=ref.name,
                                 plugin=plugin_of(ref), fragment=f.index) from e
        self.checked += 1
        for t, h, (limit, chain) in zip(f.outputs, results, self._limits(f)):
            if id(t) not in outputs:
                continue
            err = ops.nmse(outputs[id(t)], ref.to_host(h))
            if not err <= limit:
                raise _diverged(f, device, t, err, limit, chain, ref.name)
            self.closest = max(self.closest, (err / limit if limit else 0.0, t.name))

    def _run(self, f: Fragment, inputs: list) -> list:
        ref = self.reference
        args = [self._weight(t) if t.is_leaf and t.kind == LeafKind.WEIGHT else ref.from_host(a)
                for t, a in zip(f.inputs, inputs)]
        program = self._programs.get(f.program)
        if program is None:
            program = self._programs[f.program] = ref.compile(f)
        results = program.run(args)
        ref.synchronize()
        return results

    def _weight(self, t: Tensor):
        handle = self._weights.get(id(t))
        if handle is None:
            handle = self._weights[id(t)] = self.reference.load_weight(t, self.weight_bytes(t))
        return handle

    def _limits(self, f: Fragment) -> list[tuple[float, int]]:
        """Per output of ``f``: (threshold, ops on its chain), the thresholds summed along the longest chain
        of ops inside ``f`` that ends at it (the nodes come in an order where sources go first)."""
        limits = self._thresholds.get(f.program)
        if limits is None:
            chains: dict[int, tuple[float, int]] = {}
            for n in f.nodes:
                before = max((chains[id(s)] for s in n.src if id(s) in chains), default=(0.0, 0))
                own = (0.0, 0) if ops.is_view(n.op) else (ops.nmse_threshold(n.op), 1)
                chains[id(n)] = (before[0] + own[0], before[1] + own[1])
            limits = self._thresholds[f.program] = [chains[id(t)] for t in f.outputs]
        return limits


def compared(t: Tensor) -> bool:
    """Whether an output's values are compared: float values the fragment computes (not a cache written in
    place, whose rows the reading fragment's outputs show, nor a view of a weight)."""
    return not ops.writes_source(t.op) and not (t.storage.is_leaf and t.storage.kind == LeafKind.WEIGHT)


def _diverged(f: Fragment, device: Device, t: Tensor, err: float, limit: float, chain: int,
              reference: str) -> DeviceRunError:
    plugin = plugin_of(device)
    ops_in = sorted({n.op for n in f.nodes if not ops.is_view(n.op)})
    return DeviceRunError(
        f"device {device.name} (plugin {plugin}): {f.describe()}: node {t.describe()}: its values differ from "
        f"{reference}'s on the same inputs: NMSE {err:.3e}, over the threshold {limit:.1e} (the op table's, summed "
        f"over the chain of {chain} op{'s' if chain > 1 else ''} in the fragment that makes it; --verify)\n"
        f"  fix: a kernel of {type(device).__qualname__} among the fragment's ops ({', '.join(ops_in)}) is wrong: "
        f"`framework conformance --device {device.name}` finds which; until it is mended, leave {device.name} "
        f"out of --backends", device=device.name, plugin=plugin, fragment=f.index, node=t.name)
