"""Planning: which device runs every node, and why; fragments, copies, programs, fallbacks.

The assignment is a sequence of numbered passes (after ggml's scheduler):
  1. every node goes to the first device in the priority list whose verdict accepts it;
  2. zero-cost view ops (VIEW, RESHAPE, PERMUTE, TRANSPOSE) run where their source is;
  3. the node list is cut into fragments where the device changes, and every tensor that
     crosses a device boundary becomes a copy.
A node placed on a device later than the first is a fallback, and the plan lists it with
the refusal of every device before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...contract import Device, Verdict
from ..graph import VIEW_OPS, Graph, Tensor
from .errors import CapabilityError
from .fragment import Fragment, split_fragments


@dataclass
class Placement:
    device: str
    reason: str
    refusals: dict[str, str] = field(default_factory=dict)   # device -> "code: reason"


@dataclass
class Copy:
    tensor: str
    src_device: str
    dst_device: str
    nbytes: int
    fragment: int


@dataclass(eq=False)
class Plan:
    graph: Graph
    devices: list[Device]
    placement: dict[int, Placement]
    fragments: list[Fragment]
    copies: list[Copy]

    @property
    def programs(self) -> dict[tuple[str, str], list[int]]:
        """(device, structure hash) -> indices of the fragments that share that program."""
        out: dict[tuple[str, str], list[int]] = {}
        for f in self.fragments:
            out.setdefault((f.device, f.structure), []).append(f.index)
        return out

    @property
    def fallbacks(self) -> list[tuple[Tensor, Placement]]:
        return [(n, self.placement[id(n)]) for n in self.graph.nodes if self.placement[id(n)].refusals]

    def device_of(self, t: Tensor) -> str:
        return self.placement[id(t)].device

    def per_device(self) -> dict[str, dict]:
        stats = {d.name: {"nodes": 0, "fragments": 0, "programs": 0} for d in self.devices}
        for n in self.graph.nodes:
            stats[self.device_of(n)]["nodes"] += 1
        for f in self.fragments:
            stats[f.device]["fragments"] += 1
        for dev, _ in self.programs:
            stats[dev]["programs"] += 1
        return {k: v for k, v in stats.items() if v["nodes"]}

    def to_dict(self) -> dict:
        return {
            "graph": dict(self.graph.meta),
            "devices": [d.name for d in self.devices],
            "nodes": [{"name": n.name, "op": n.op, "shape": list(n.shape), "dtype": n.dtype.name,
                       "device": self.placement[id(n)].device, "reason": self.placement[id(n)].reason,
                       **({"refusals": self.placement[id(n)].refusals} if self.placement[id(n)].refusals else {})}
                      for n in self.graph.nodes],
            "fragments": [{"index": f.index, "device": f.device, "first": f.nodes[0].name, "last": f.nodes[-1].name,
                           "nodes": len(f.nodes), "structure": f.structure, "inputs": [t.name for t in f.inputs],
                           "outputs": [t.name for t in f.outputs]} for f in self.fragments],
            "copies": [vars(c) for c in self.copies],
            "programs": [{"device": d, "structure": h, "fragments": idx} for (d, h), idx in self.programs.items()],
            "fallbacks": [{"node": n.name, "op": n.op, "device": p.device, "refusals": p.refusals}
                          for n, p in self.fallbacks],
        }


def make_plan(graph: Graph, devices: list[Device]) -> Plan:
    placement: dict[int, Placement] = {}
    _pass1_first_accepting(graph, devices, placement)
    _pass2_views_follow_source(graph, placement)
    device_of = {k: p.device for k, p in placement.items()}
    fragments = split_fragments(graph, device_of)
    copies = _copies(fragments, device_of)
    return Plan(graph=graph, devices=list(devices), placement=placement, fragments=fragments, copies=copies)


def _pass1_first_accepting(graph: Graph, devices: list[Device], placement: dict[int, Placement]) -> None:
    """Pass 1: each computing node goes to the first device in the list that accepts it."""
    for n in graph.nodes:
        if n.op in VIEW_OPS:
            continue
        refusals: dict[str, str] = {}
        for i, dev in enumerate(devices):
            verdict: Verdict = dev.supports_op(n)
            if verdict.ok:
                reason = ("first device in the list" if i == 0 else
                          f"fallback: refused by {', '.join(refusals)}")
                placement[id(n)] = Placement(dev.name, reason, refusals)
                break
            refusals[dev.name] = f"{verdict.code}: {verdict.reason}"
        else:
            lines = "; ".join(f"{d} says {r}" for d, r in refusals.items())
            raise CapabilityError(
                "no_device_for_node", f"no device accepts node {n.describe()}: {lines}",
                node=n.name, devices=tuple(refusals), fix="add a device that supports this op to --backends "
                f"(for example cpu at the end of the list)")


def _pass2_views_follow_source(graph: Graph, placement: dict[int, Placement]) -> None:
    """Pass 2: a view costs nothing and must live with the memory it aliases."""
    for n in graph.nodes:
        if n.op not in VIEW_OPS:
            continue
        src = n.src[0]
        if id(src) in placement:
            placement[id(n)] = Placement(placement[id(src)].device, "view of a tensor on this device")
        else:   # a view of a leaf: run it where its first consumer runs (found when that is placed)
            consumer = next(c for c in graph.consumers[id(n)] if id(c) in placement)
            placement[id(n)] = Placement(placement[id(consumer)].device, "view read on this device")


def _copies(fragments: list[Fragment], device_of: dict[int, str]) -> list[Copy]:
    out = []
    for f in fragments:
        for t in f.inputs:
            src_dev = device_of.get(id(t))
            if src_dev is not None and src_dev != f.device:
                out.append(Copy(t.name, src_dev, f.device, t.nbytes, f.index))
    return out
