"""Planning: which device runs every node, and why; fragments, copies, programs, fallbacks.

The assignment is a sequence of numbered passes (after ggml's scheduler):
  0. a graph output made by a matrix product larger than one tensor of a device may hold (the logits of
     a perplexity window over a large vocabulary) is computed in blocks of token rows, joined on the
     host when it is read back (products.py);
  1. nodes that read or write a pre-allocated tensor (a KV cache, or a tensor another session of the
     process holds: a draft reading its target's cache or borrowing its embedding), directly or through
     views, are pinned to the device whose buffer holds it, when that device accepts them;
  2. memory: the nodes of a layer (or of the input or output part) that the memory fit gave to a
     later device, because the devices before it cannot hold it beside what they keep, go to the
     first device from that one on that accepts them; each keeps the numbers (Placement.memory).
     The fit (memory.py) keeps whole layers in order on each device, one cut between two devices,
     and is made once per session, which places each layer's cache with the layer;
  3. every other computing node goes to the first device in the priority list that accepts it;
  4. smoothing: a short run of nodes between two runs on one other device moves to that device
     when it accepts them all and the move saves bytes of copies (no ping-pong for cheap nodes;
     a run that reads model weights is the work its device was chosen for, and stays; a run moved
     for memory stays where it fits);
  5. zero-cost view ops (VIEW, RESHAPE, PERMUTE, TRANSPOSE) run where the memory they alias is;
  6. the node list is cut into fragments where the device changes; every tensor that crosses a
     device boundary becomes a copy.
A node placed on a device later than the first in the list is a fallback: the plan keeps the
refusal of every device before it (a device whose memory is full refuses with code "memory").
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...contract import BufferType, Device, Verdict
from ..graph import VIEW_OPS, Graph, LeafKind, Tensor
from .errors import CapabilityError
from .fragment import Fragment, cut_submissions, set_program_key, split_fragments
from .memory import Budget, Fit, MemoryMove, memory_budgets, parts_of
from .products import split_large_products
from .verdicts import ask, check_available

SMOOTH_MAX_RUN = 4       # nodes; longer runs are real work and stay where the verdicts put them
MEMORY = "memory"        # the refusal code of a device whose memory cannot hold a node's layer


@dataclass(frozen=True)
class Residence:
    """Where a pre-allocated tensor lives: the device that allocated it and the buffer type."""

    device: str
    buffer: BufferType
    physical_id: str = ""    # of the owning device, to recognise one chip reached through two plugins
    copies: tuple[str, ...] = ()   # other devices holding the same bytes (a weight loaded on two devices)
    owner: str = ""          # the session that holds it, when it is not the one planned ("the target")

    def held_on(self, device: str) -> bool:
        return device == self.device or device in self.copies


@dataclass
class Placement:
    device: str
    reason: str
    refusals: dict[str, Verdict] = field(default_factory=dict)   # device -> its refusal, formatted in reports
    memory: tuple[MemoryMove, ...] = ()     # the devices before it whose memory could not hold it, in numbers
    pinned: bool = False      # pass 1 put it with a pre-allocated tensor it touches: no later pass moves it


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
    budgets: dict[str, Budget] = field(default_factory=dict)   # device -> the memory it may use
    fit: Fit | None = None                  # the memory fit the plan follows
    memory: dict[str, dict[str, int]] = field(default_factory=dict)   # device -> use, set by reservation
    # reservation's findings on this plan, with what they were found against: a session re-checks its kept
    # plans with every new shape (a server meets new prompt lengths all the time), so each is worked out once
    checked: dict[str, tuple] = field(default_factory=dict, repr=False, compare=False)

    @property
    def programs(self) -> dict[tuple[str, str], list[int]]:
        """(device, program key) -> indices of the fragments that share that program."""
        out: dict[tuple[str, str], list[int]] = {}
        for f in self.fragments:
            out.setdefault((f.device, f.program), []).append(f.index)
        return out

    @property
    def fallbacks(self) -> list[tuple[Tensor, Placement]]:
        return [(n, self.placement[id(n)]) for n in self.graph.nodes if self.placement[id(n)].refusals]

    def device_of(self, t: Tensor) -> str:
        return self.placement[id(t)].device

    def per_device(self) -> dict[str, dict]:
        stats = {d.name: {"nodes": 0, "fragments": 0, "programs": 0, "submissions": 0} for d in self.devices}
        for n in self.graph.nodes:
            stats[self.device_of(n)]["nodes"] += 1
        for f in self.fragments:
            stats[f.device]["fragments"] += 1
            stats[f.device]["submissions"] += len(f.submissions)
        for dev, _ in self.programs:
            stats[dev]["programs"] += 1
        return {k: v for k, v in stats.items() if v["nodes"]}

    def to_dict(self) -> dict:
        return {
            "graph": dict(self.graph.meta),
            "devices": [d.name for d in self.devices],
            "emulation": {d.name: d.emulation for d in self.devices if d.emulation},
            "per_device": self.per_device(),
            "nodes": [_node_record(n, self.placement[id(n)]) for n in self.graph.nodes],
            "fragments": [f.to_dict() for f in self.fragments],
            "copies": [vars(c) for c in self.copies],
            "programs": [{"device": d, "program": h, "fragments": idx} for (d, h), idx in self.programs.items()],
            "fallbacks": [{"node": n.name, "op": n.op, "device": p.device, "refusals": _texts(p.refusals)}
                          for n, p in self.fallbacks],
            "memory": self.memory_record(),
            "fit": self.fit.to_dict() if self.fit is not None and self.fit.moves else None,
        }

    def memory_record(self) -> dict[str, dict]:
        """Per device: what it holds in this plan (once reserved) against its budget."""
        out = {}
        for d in self.devices:
            use, b = self.memory.get(d.name), self.budgets.get(d.name)
            if use or b:
                out[d.name] = {**(use or {}), "limit": b.nbytes if b else None, "limit_source": b.source if b else None}
        return out


def _texts(refusals: dict[str, Verdict]) -> dict[str, str]:
    """Refusals as the plan's JSON gives them: device -> "code: reason"."""
    return {d: str(v) for d, v in refusals.items()}


def _node_record(n: Tensor, p: Placement) -> dict:
    rec = {"name": n.name, "op": n.op, "shape": list(n.shape), "dtype": n.dtype.name,
           "src": [s.name for s in n.src], "device": p.device, "reason": p.reason}
    if n.layer is not None:
        rec["layer"] = n.layer
    if p.refusals:
        rec["refusals"] = _texts(p.refusals)
    if p.memory:
        rec["memory"] = [m.to_dict() for m in p.memory]
    return rec


def make_plan(graph: Graph, devices: list[Device], residence: dict[int, Residence] | None = None,
              fit: Fit | None = None) -> Plan:
    """``fit``: the session's memory fit (memory.fit_layers), whose caches ``residence`` places."""
    check_available(devices)
    residence = residence or {}
    graph = split_large_products(graph, devices)
    placement: dict[int, Placement] = {}
    _pass1_pin_preallocated(graph, devices, residence, placement)
    _pass2_memory(graph, devices, fit, placement)
    _pass3_first_accepting(graph, devices, placement)
    _pass4_smooth(graph, devices, placement)
    _pass5_views_follow_memory(graph, devices, placement)
    device_of = {k: p.device for k, p in placement.items()}
    fragments = split_fragments(graph, device_of)
    by_name = {d.name: d for d in devices}
    for f in fragments:
        cut_submissions(f, by_name[f.device].limits.max_chain)
        set_program_key(f, by_name[f.device].weights_in_programs)
    copies = _copies(fragments, device_of)
    budgets = fit.budgets if fit is not None else memory_budgets(devices)
    return Plan(graph=graph, devices=list(devices), placement=placement, fragments=fragments, copies=copies,
                budgets=budgets, fit=fit)


def preallocated_sources(n: Tensor, residence: dict[int, Residence]) -> list[Tensor]:
    """Pre-allocated tensors n reads or writes, directly or through views of them (attention reads
    the cache through a VIEW of the SET_ROWS result): cache leaves, and any leaf with a residence."""
    out: list[Tensor] = []
    for s in n.src:
        t = s.storage
        if t.is_leaf and (t.kind == LeafKind.CACHE or id(t) in residence) and all(t is not o for o in out):
            out.append(t)
    return out


def _pass1_pin_preallocated(graph, devices, residence, placement) -> None:
    """Pass 1: a node that touches a pre-allocated tensor runs where that tensor lives (or where a
    copy of it is held)."""
    by_name = {d.name: d for d in devices}
    for n in graph.nodes:
        if n.op in VIEW_OPS:
            continue
        for t in preallocated_sources(n, residence):
            home = residence.get(id(t))
            held = [by_name[d] for d in ((home.device, *home.copies) if home else ()) if d in by_name]
            dev = next((d for d in held if ask(d, n).ok), None)
            if dev is not None:
                whose = f"{home.owner} holds it" if home.owner else "held"
                placement[id(n)] = Placement(dev.name, f"pinned: reads or writes '{t.name}', {whose} on {dev.name}",
                                             pinned=True)
                break


def _pass2_memory(graph: Graph, devices: list[Device], fit: Fit | None, placement: dict[int, Placement]) -> None:
    """Pass 2: a node of a part the fit moved runs on the first device from the part's one on that accepts
    it; the devices before refused it for their memory, those after the part's one that refuse it keep
    their verdicts. A node pass 1 pinned to its cache is already there (the cache went with its layer):
    it only gets the numbers."""
    if fit is None or not fit.moves:
        return
    parts = parts_of(graph)
    for n in graph.nodes:
        moves = fit.moves.get(parts[id(n)])
        if n.op in VIEW_OPS or not moves:
            continue
        full = {m.device: Verdict.no(MEMORY, m.text("it")) for m in moves}
        pinned = placement.get(id(n))
        if pinned is not None:
            if pinned.device not in full:
                placement[id(n)] = replace(pinned, refusals=full, memory=moves)
            continue
        refusals = dict(full)
        for dev in fit.start(parts[id(n)], devices):
            if dev.name in full:
                continue
            verdict = ask(dev, n)
            if verdict.ok:
                placement[id(n)] = Placement(dev.name, f"memory: {moves[-1].text()}", refusals, moves)
                break
            refusals[dev.name] = verdict


def _pass3_first_accepting(graph: Graph, devices: list[Device], placement: dict[int, Placement]) -> None:
    """Pass 3: each remaining computing node goes to the first device in the list that accepts it."""
    for n in graph.nodes:
        if n.op in VIEW_OPS or id(n) in placement:
            continue
        refusals: dict[str, Verdict] = {}
        for i, dev in enumerate(devices):
            verdict = ask(dev, n)
            if verdict.ok:
                reason = "first device in the list" if i == 0 else f"fallback: refused by {', '.join(refusals)}"
                placement[id(n)] = Placement(dev.name, reason, refusals)
                break
            refusals[dev.name] = verdict
        else:
            raise _no_device(n, refusals)


def _no_device(n: Tensor, refusals: dict[str, Verdict]) -> CapabilityError:
    lines = "; ".join(f"{d} says {r}" for d, r in refusals.items())
    return CapabilityError(
        "no_device_for_node", f"no device accepts node {n.describe()}: {lines}", node=n.name,
        devices=tuple(refusals),
        fix="add a device that supports this op to --backends (for example cpu at the end of the list)")


def _pass4_smooth(graph: Graph, devices: list[Device], placement: dict[int, Placement]) -> None:
    """Pass 4: move short runs into the device on both sides of them when that saves copies."""
    by_name = {d.name: d for d in devices}
    compute = [n for n in graph.nodes if n.op not in VIEW_OPS]
    runs: list[list[Tensor]] = []
    for n in compute:
        if runs and placement[id(runs[-1][-1])].device == placement[id(n)].device:
            runs[-1].append(n)
        else:
            runs.append([n])
    for i in range(1, len(runs) - 1):
        run, before, after = runs[i], runs[i - 1], runs[i + 1]
        here, there = placement[id(run[0])].device, placement[id(before[-1])].device
        if len(run) > SMOOTH_MAX_RUN or placement[id(after[0])].device != there:
            continue
        if any(placement[id(n)].pinned or placement[id(n)].memory for n in run):
            continue
        if any(s.is_leaf and s.kind == LeafKind.WEIGHT for n in run for s in n.src):
            continue    # matrix products with model weights are real work, not a cheap hop
        target = by_name[there]
        if not all(ask(target, n).ok for n in run):
            continue
        saved = _boundary_bytes(graph, run, placement)
        if saved <= 0:
            continue
        for n in run:
            old = placement[id(n)]
            placement[id(n)] = Placement(there, f"smoothed: moved from {here} to {there}, saving {saved} bytes "
                                         f"of copies", old.refusals)


def _boundary_bytes(graph: Graph, run: list[Tensor], placement: dict[int, Placement]) -> int:
    """Bytes that cross into and out of a run from nodes on other devices."""
    inside = {id(n) for n in run}
    dev = placement[id(run[0])].device
    total = 0
    for n in run:
        total += sum(s.nbytes for s in n.src if not s.is_leaf and id(s) not in inside
                     and id(s) in placement and placement[id(s)].device != dev)
        total += n.nbytes if any(id(c) not in inside for c in graph.consumers.get(id(n), ())) else 0
    return total


def _pass5_views_follow_memory(graph: Graph, devices: list[Device], placement: dict[int, Placement]) -> None:
    """Pass 5: a view costs nothing and lives with the memory it aliases, when that device accepts it.
    A view the device of its memory refuses runs where it is read (the aliased tensor is copied there),
    and the refusal is kept in the plan like any other."""
    by_name = {d.name: d for d in devices}
    refused: dict[int, dict[str, Verdict]] = {}
    for n in graph.nodes:               # views of computed tensors (and views of those), in order
        if n.op in VIEW_OPS and id(n.src[0]) in placement:
            home = placement[id(n.src[0])].device
            verdict = ask(by_name[home], n)
            if verdict.ok:
                placement[id(n)] = Placement(home, "view of a tensor on this device")
            else:
                refused[id(n)] = {home: verdict}
    for n in reversed(graph.nodes):     # views of leaves, and refused views, run where they are first read;
        if n.op in VIEW_OPS and id(n) not in placement:     # every consumer comes later, so it is placed
            consumers = graph.consumers.get(id(n), ())
            first = placement[id(consumers[0])].device if consumers else devices[0].name
            refusals = dict(refused.get(id(n), {}))
            for dev in [by_name[first]] + [d for d in devices if d.name != first]:
                if dev.name in refusals:
                    continue
                verdict = ask(dev, n)
                if verdict.ok:
                    if refusals:
                        reason = f"fallback: refused by {', '.join(refusals)}"
                    else:
                        reason = "view read on this device" if consumers else "view of a leaf wanted as an output"
                    placement[id(n)] = Placement(dev.name, reason, refusals)
                    break
                refusals[dev.name] = verdict
            else:
                raise _no_device(n, refusals)


def _copies(fragments: list[Fragment], device_of: dict[int, str]) -> list[Copy]:
    out = []
    for f in fragments:
        for t in f.inputs:
            src_dev = device_of.get(id(t))
            if src_dev is not None and src_dev != f.device:
                out.append(Copy(t.name, src_dev, f.device, t.nbytes, f.index))
    return out
