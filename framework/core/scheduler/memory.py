"""Device memory in planning: each device's budget, and the memory fit of the model's layers.

Budgets. A device may use the smallest of what it declares (``Limits.memory_bytes``), what its plugin
reports free (``Device.free_memory()``, optional, asked once) and a cap given for planning
(``--device-memory DEVICE=SIZE``).

The fit (``fit_layers``) decides which device runs each part of the model when a device cannot hold all
that its verdicts accept. The parts, in graph order: the input (the nodes before the first layer: the token
embeddings), each repeated block (a layer: the nodes the graph builder marked with its index in
``Tensor.layer``, with the layer's KV cache), and the output (the nodes after the last layer). Each device
of the priority list in turn keeps the layers from where the device before it stopped, in order and whole,
as many as its budget holds (then the output, when it has room for it too), and leaves the rest to the next
device: one cut between two devices, as llama.cpp's --n-gpu-layers offloads whole layers. The input joins
the first device with room for it beside the layers it keeps; where it does not fit, it goes on to the next
device, as llama.cpp keeps its input layer on the host: an embedding table is large and a step reads a
handful of its rows, so it does not take the place of layers, at the cost of a second cut (the embeddings
of the step's tokens copied once). The last device takes what is left; reservation's memory check
(reserve.check_memory) names what no device can hold.

A part's cost on a device is what reservation counts: the weights its nodes read (``Device.weight_nbytes``,
each once), the caches it holds, and its nodes' outputs in the largest phase. Where the check takes the
largest fragment's outputs, the fit adds those of all the device's nodes, so what the fit keeps passes the
check. A session makes the fit once, over the step shapes with the most activations (a full prefill chunk
over the whole context, and a decode step), so that every phase splits alike and the caches it places
serve them all; the planner's pass 2 (plan.py) then puts every node of a moved part where the fit says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from ...contract import Device
from ..graph import Graph, LeafKind, Tensor, ops
from .verdicts import ask

INPUT, OUTPUT = "input", "output"
Part = int | str            # a layer's index, INPUT or OUTPUT


@dataclass(frozen=True)
class Budget:
    """The memory a device may use in planning, and where that figure comes from."""

    nbytes: int
    source: str             # "declared" (Limits.memory_bytes), "reported free", "capped" (--device-memory)

    def text(self) -> str:
        return f"{mib(self.nbytes)} ({self.source})"


def memory_budgets(devices: Sequence[Device], caps: dict[str, int] | None = None) -> dict[str, Budget]:
    """Per device with any limit: the smallest of its declared memory, its reported free memory and the cap."""
    caps = caps or {}
    out = {}
    for d in devices:
        known = [(n, source) for n, source in ((d.limits.memory_bytes, "declared"), (d.free_memory(), "reported free"),
                                               (caps.get(d.name), "capped")) if n is not None]
        if known:
            out[d.name] = Budget(*min(known, key=lambda k: k[0]))
    return out


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def parts_of(graph: Graph) -> dict[int, Part]:
    """id(node) -> the part it belongs to: its layer, or the input before the first layer, or the output."""
    out: dict[int, Part] = {}
    seen_layer = False
    for n in graph.nodes:
        if n.layer is not None:
            out[id(n)], seen_layer = n.layer, True
        else:
            out[id(n)] = OUTPUT if seen_layer else INPUT
    return out


def _order(part: Part) -> tuple[int, int]:
    return (0, 0) if part == INPUT else (2, 0) if part == OUTPUT else (1, int(part))


def describe(parts: Sequence[Part]) -> str:
    """'input, layers 0-11, output': layers in ranges."""
    words, run = [], []

    def flush():
        if run:
            words.append(f"layer {run[0]}" if len(run) == 1 else f"layers {run[0]}-{run[-1]}")
            run.clear()

    for p in sorted(parts, key=_order):
        if isinstance(p, int) and (not run or p == run[-1] + 1):
            run.append(p)
            continue
        flush()
        if isinstance(p, int):
            run.append(p)
        else:
            words.append(p)
    flush()
    return ", ".join(words)


@dataclass(frozen=True)
class MemoryMove:
    """Why a part of the model is not on a device earlier in the list: that device's memory, in numbers."""

    device: str             # the device that could not hold it
    limit: int              # its budget, bytes
    source: str             # where the budget comes from (Budget.source)
    kept: str               # the parts it keeps, in words ("input, layers 0-11"; "" for none)
    held: int               # bytes it holds with them
    part: str               # the part it could not take too, in words ("layer 12")
    needed: int             # bytes it would hold with that part

    def text(self, subject: str = "") -> str:
        """'vulkan:0 has 60.0 MiB (capped) and keeps layers 0-14 (58.4 MiB); with layer 15 it would need
        62.3 MiB'; with a subject ("it", where the device is named beside), that word instead."""
        kept = f"keeps {self.kept} ({mib(self.held)})" if self.kept else "keeps no layer"
        return (f"{subject or self.device} has {mib(self.limit)} ({self.source}) and {kept}; with {self.part} it "
                f"would need {mib(self.needed)}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Fit:
    """Which device runs each part, and why a part left the devices before it."""

    devices: list[str]                                  # the priority list
    budgets: dict[str, Budget]
    owner: dict[Part, str] = field(default_factory=dict)             # empty: every part on the first device
    moves: dict[Part, tuple[MemoryMove, ...]] = field(default_factory=dict)   # moved parts only
    estimate: dict[str, int] = field(default_factory=dict)           # device -> bytes by the fit's count

    def start(self, part: Part | None, devices: Sequence[Device]) -> list[Device]:
        """``devices`` from the one the fit gave ``part`` to, then the ones before it (a node that no
        later device accepts goes back to an earlier one, as without a fit)."""
        name = self.owner.get(INPUT if part is None else part)
        i = next((k for k, d in enumerate(devices) if d.name == name), 0)
        return [*devices[i:], *devices[:i]]

    def kept(self) -> dict[str, list[Part]]:
        out: dict[str, list[Part]] = {}
        for part, dev in sorted(self.owner.items(), key=lambda kv: _order(kv[0])):
            out.setdefault(dev, []).append(part)
        return out

    def device_moves(self) -> dict[str, list[MemoryMove]]:
        out: dict[str, list[MemoryMove]] = {}
        for moves in self.moves.values():
            for m in moves:
                if m not in out.setdefault(m.device, []):
                    out[m.device].append(m)
        return out

    def lines(self) -> list[str]:
        """One line per device of a fit that moved something: what it keeps, against its budget, and
        what did not fit."""
        if not self.moves:
            return []
        kept, stops = self.kept(), self.device_moves()
        out = []
        for name in self.devices:
            b = self.budgets.get(name)
            limit = f" of {mib(b.nbytes)}, {b.source}" if b else ""
            why = "; ".join(f"with {m.part} it would need {mib(m.needed)}" for m in stops.get(name, ()))
            out.append(f"memory fit: {name} keeps {describe(kept.get(name, [])) or 'no layer'} "
                       f"({mib(self.estimate.get(name, 0))}{limit})" + (f"; {why}" if why else ""))
        return out

    def to_dict(self) -> dict:
        return {"budgets": {d: asdict(b) for d, b in self.budgets.items()},
                "kept": {d: describe(p) for d, p in self.kept().items()},
                "moves": {d: [m.to_dict() for m in ms] for d, ms in self.device_moves().items()}}


def fit_needed(devices: Sequence[Device], budgets: dict[str, Budget]) -> bool:
    """Only a device with a budget and a device after it can make a fit move anything."""
    return any(d.name in budgets for d in devices[:-1])


def fit_layers(graphs: Sequence[Graph], devices: Sequence[Device], budgets: dict[str, Budget],
               kv_device: str | None = None) -> Fit:
    """The fit of these graphs' parts to the devices' budgets (see the module's docstring). ``kv_device``:
    every cache is held there, whatever part it belongs to."""
    fit = Fit([d.name for d in devices], dict(budgets))
    if not fit_needed(devices, budgets) or not graphs:
        return fit
    costs = _Costs(graphs, devices, kv_device)
    pending = [p for p in costs.order if p == INPUT]        # the input, until a device has room for it
    order = [p for p in costs.order if p != INPUT]
    nxt = 0
    for i, dev in enumerate(devices):
        tally = costs.base(i, fit.owner)
        budget, last = budgets.get(dev.name), i == len(devices) - 1

        def fits(part: Part) -> bool:
            return last or budget is None or costs.total_with(tally, part, i) <= budget.nbytes

        kept: list[Part] = []
        while nxt < len(order) and fits(order[nxt]):      # the most whole layers first, in order
            costs.add(tally, order[nxt], i)
            kept.append(order[nxt])
            nxt += 1
        for part in [p for p in pending if fits(p)]:      # then the input, when it fits beside them
            costs.add(tally, part, i)
            kept.append(part)
            pending.remove(part)
        fit.owner.update({p: dev.name for p in kept})
        fit.estimate[dev.name] = tally.total
        left = pending + order[nxt:]
        if budget is None or not left:
            continue
        stops = {p: MemoryMove(dev.name, budget.nbytes, budget.source, describe(kept), tally.total, describe([p]),
                               costs.total_with(tally, p, i)) for p in pending + order[nxt:nxt + 1]}
        for part in left:
            move = stops.get(part) or stops[order[nxt]]
            fit.moves[part] = (*fit.moves.get(part, ()), move)
    return fit


@dataclass
class _Tally:
    """What one device holds by the fit's count."""

    weights: dict[int, int] = field(default_factory=dict)
    caches: dict[int, int] = field(default_factory=dict)
    activations: list[int] = field(default_factory=list)     # per graph

    @property
    def total(self) -> int:
        return sum(self.weights.values()) + sum(self.caches.values()) + max(self.activations, default=0)


class _Costs:
    """The graphs' parts and what each brings to a device, with every verdict asked once."""

    def __init__(self, graphs: Sequence[Graph], devices: Sequence[Device], kv_device: str | None):
        self.graphs, self.devices = list(graphs), list(devices)
        names = [d.name for d in devices]
        self.kv = names.index(kv_device) if kv_device in names else None
        self.nodes: dict[Part, list[list[Tensor]]] = {}
        for g, graph in enumerate(self.graphs):
            parts = parts_of(graph)
            for n in graph.nodes:
                self.nodes.setdefault(parts[id(n)], [[] for _ in self.graphs])[g].append(n)
        self.order = sorted(self.nodes, key=_order)
        self.first_touch = self._first_touch()
        self._ok: dict[tuple[int, int], bool] = {}

    def _first_touch(self) -> dict[int, int]:
        """id(cache) -> id(the first node that reads or writes it): the cache is held where that node runs
        (the session places a layer's cache with its SET_ROWS)."""
        out: dict[int, int] = {}
        for graph in self.graphs:
            for n in graph.nodes:
                for s in n.src:
                    t = s.storage
                    if t.is_leaf and t.kind == LeafKind.CACHE:
                        out.setdefault(id(t), id(n))
        return out

    def accepts(self, i: int, n: Tensor) -> bool:
        key = (i, id(n))
        if key not in self._ok:
            self._ok[key] = ask(self.devices[i], n).ok
        return self._ok[key]

    def lands(self, n: Tensor, owner: int) -> int | None:
        """The device a node of a part owned by devices[owner] runs on: with its cache on the KV device,
        else the first from the owner on (then the ones before) that accepts it."""
        if self.kv is not None and any(s.storage.kind == LeafKind.CACHE for s in n.src) and self.accepts(self.kv, n):
            return self.kv
        k = len(self.devices)
        return next((j % k for j in range(owner, owner + k) if self.accepts(j % k, n)), None)

    def _contribution(self, part: Part, owner: int, here: int) -> _Tally:
        dev, out = self.devices[here], _Tally(activations=[0] * len(self.graphs))
        for g, nodes in enumerate(self.nodes.get(part, ())):
            for n in nodes:
                if self.lands(n, owner) != here:
                    continue
                for s in n.src:
                    t = s.storage
                    if t.is_leaf and t.kind == LeafKind.WEIGHT:
                        out.weights.setdefault(id(t), dev.weight_nbytes(t))
                    elif t.is_leaf and t.kind == LeafKind.CACHE and self.kv is None \
                            and self.first_touch.get(id(t)) == id(n):
                        out.caches[id(t)] = t.nbytes
                if ops.makes_memory(n.op):
                    out.activations[g] += n.nbytes
        return out

    @staticmethod
    def _merge(into: _Tally, more: _Tally) -> None:
        into.weights.update(more.weights)
        into.caches.update(more.caches)
        into.activations = [a + b for a, b in zip(into.activations, more.activations)]

    def base(self, here: int, owner: dict[Part, str]) -> _Tally:
        """What a device holds before it keeps any part: nodes of parts given to earlier devices that those
        refuse and it accepts, and every cache when it is the KV device."""
        tally = _Tally(activations=[0] * len(self.graphs))
        names = [d.name for d in self.devices]
        for part, dev in owner.items():
            self._merge(tally, self._contribution(part, names.index(dev), here))
        if self.kv == here:
            for graph in self.graphs:
                tally.caches.update({id(t): t.nbytes for t in graph.leaves if t.kind == LeafKind.CACHE})
        return tally

    def total_with(self, tally: _Tally, part: Part, here: int) -> int:
        trial = _Tally(dict(tally.weights), dict(tally.caches), list(tally.activations))
        self._merge(trial, self._contribution(part, here, here))
        return trial.total

    def add(self, tally: _Tally, part: Part, here: int) -> None:
        self._merge(tally, self._contribution(part, here, here))
