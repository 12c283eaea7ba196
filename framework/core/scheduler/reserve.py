"""Reservation: plan every graph shape a run will use and check the plans, before anything is
allocated or compiled. Either a Reservation comes back or a CapabilityError is raised.

Checks, in order:
  1. every pre-allocated tensor is usable in place by every device that reads or writes it;
  2. with strict, no node runs on a device later than the first in the list;
  3. the programs all phases need, with those other sessions of the process hold on the same device,
     fit each device's live-program budget;
  4. commands per submission fit each device's chain limit (plans cut submissions to fit);
  5. weights, caches and activations fit each device's memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...contract import Device
from ..graph import VIEW_OPS, Graph, LeafKind, Tensor, ops
from .errors import CapabilityError
from .fallbacks import count, group_fallbacks
from .plan import Plan, Residence, make_plan


@dataclass
class Reservation:
    plans: dict[str, Plan]                 # phase name -> plan
    programs: dict[str, int]               # device -> distinct programs over all phases
    memory: dict[str, dict[str, int]]      # device -> {"weights", "caches", "activations", "total"}

    def summary(self) -> list[str]:
        lines = []
        for phase, plan in self.plans.items():
            for dev, use in plan.per_device().items():
                lines.append(f"{phase:>16}  {dev}: {count(use['nodes'], 'node')}, "
                             f"{count(use['fragments'], 'fragment')}, {count(use['submissions'], 'submission')}, "
                             f"{count(use['programs'], 'program')}")
            if plan.copies:
                lines.append(f"{'':>16}  {count(len(plan.copies), 'copy', 'copies')}, "
                             f"{sum(c.nbytes for c in plan.copies) / 2**20:.1f} MiB")
            lines += [f"{'':>16}  {g.line()}" for g in group_fallbacks([plan])]
        for dev, n in self.programs.items():
            mem = self.memory.get(dev, {})
            lines.append(f"{dev}: {count(n, 'program')} over all phases, memory {mem.get('total', 0) / 2**20:.1f} MiB "
                         f"(weights {mem.get('weights', 0) / 2**20:.1f}, caches {mem.get('caches', 0) / 2**20:.1f}, "
                         f"activations {mem.get('activations', 0) / 2**20:.1f})")
        return lines


def reserve(phases: dict[str, Graph | Plan], devices: list[Device], residence: dict[int, Residence] | None = None,
            strict: bool = False, held: dict[str, int] | None = None) -> Reservation:
    """Plan (or re-check, for phases given as plans) every phase, then check the plans together.
    ``held``: programs the caller already holds per device (counted in the plans, not again among
    the device's live programs)."""
    residence = residence or {}
    by_name = {d.name: d for d in devices}
    plans = {}
    for phase, graph in phases.items():
        plan = graph if isinstance(graph, Plan) else make_plan(graph, devices, residence)
        check_preallocated(plan, residence, by_name)
        if strict:
            check_strict(plan, phase)
        plans[phase] = plan
    programs = check_program_budget(plans, by_name, held or {})
    memory = check_memory(plans, by_name, residence)
    return Reservation(plans=plans, programs=programs, memory=memory)


def _preallocated(t: Tensor) -> Tensor | None:
    s = t.storage
    return s if s.is_leaf and s.kind == LeafKind.CACHE else None


def check_preallocated(plan: Plan, residence: dict[int, Residence], by_name: dict[str, Device]) -> None:
    """1. A device that reads or writes a pre-allocated tensor must use that tensor's buffer in place."""
    for n in plan.graph.nodes:
        if n.op in VIEW_OPS:
            continue
        dev = by_name[plan.device_of(n)]
        for s in n.src:
            t = _preallocated(s)
            home = residence.get(id(t)) if t is not None else None
            if home is None or home.device == dev.name:
                continue
            verdict = dev.supports_buffer(home.buffer)
            if verdict.ok:
                continue
            same = (f"; {home.device} and {dev.name} are the same physical device ({dev.physical_id}) reached "
                    f"through two plugins" if home.physical_id and home.physical_id == dev.physical_id else "")
            raise CapabilityError(
                "buffer_not_usable",
                f"pre-allocated tensor '{t.name}' is held in buffer '{home.buffer.name}' on device {home.device}, "
                f"but node '{n.name}' ({n.op}) that reads or writes it is placed on {dev.name}, which cannot use "
                f"that buffer ({verdict.code}: {verdict.reason}){same}",
                tensor=t.name, node=n.name, devices=(home.device, dev.name), limit=f"buffer={home.buffer.name}",
                fix=f"place the graph that uses '{t.name}' on {home.device} (list it first in --backends), or keep "
                    f"'{t.name}' in a buffer both {home.device} and {dev.name} can use")


def check_strict(plan: Plan, phase: str) -> None:
    """2. --strict: every node on the first device of the list."""
    fallbacks = plan.fallbacks
    if not fallbacks:
        return
    first = plan.devices[0].name
    def operands(n: Tensor) -> str:
        return ", ".join(f"{list(s.shape)} {s.dtype.name}" for s in n.src)

    lines = [f"{n.name} ({n.op} {list(n.shape)} {n.dtype.name} of {operands(n)}) -> {p.device}; "
             + "; ".join(f"{d}: {r}" for d, r in p.refusals.items()) for n, p in fallbacks]
    raise CapabilityError(
        "strict_fallback", f"--strict: {len(fallbacks)} nodes of the {phase} graph would not run on {first}:\n    "
        + "\n    ".join(lines), node=fallbacks[0][0].name, devices=tuple(d.name for d in plan.devices),
        fix=f"drop --strict to let them fall back, or use a device that supports them instead of {first}")


def check_program_budget(plans: dict[str, Plan], by_name: dict[str, Device],
                         held: dict[str, int] | None = None) -> dict[str, int]:
    """3. Distinct programs per device over every phase, plus those other sessions hold on it, against
    its live-program budget."""
    needed: dict[str, set[str]] = {}
    per_phase: dict[str, dict[str, int]] = {}
    for phase, plan in plans.items():
        for dev, key in plan.programs:
            needed.setdefault(dev, set()).add(key)
            per_phase.setdefault(dev, {}).setdefault(phase, 0)
            per_phase[dev][phase] += 1
    for dev, structures in needed.items():
        budget = by_name[dev].limits.max_live_programs
        if budget is None:
            continue
        others = max(0, by_name[dev].live_programs() - (held or {}).get(dev, 0))
        if len(structures) + others <= budget:
            continue
        detail = ", ".join(f"{ph}: {n}" for ph, n in per_phase[dev].items())
        emu = f" (EMULATION of {by_name[dev].emulation})" if by_name[dev].emulation else ""
        live = (f", and other sessions of this process already hold {others} live programs on it"
                if others else "")
        raise CapabilityError(
            "program_budget", f"device {dev}{emu} allows {budget} live compiled programs, but the plans need "
            f"{len(structures)} distinct programs ({detail}){live}", devices=(dev,),
            limit=f"max_live_programs={budget}",
            fix=(f"close the other sessions on {dev} first (their programs are freed with them), or give this "
                 f"one another device" if others and len(structures) <= budget else
                 f"at most {budget} fit: let {dev} take whole fragments (remove what splits them, e.g. an op it "
                 f"refuses between layers), or put another device before it in --backends"))
    return {dev: len(s) for dev, s in needed.items()}


def check_memory(plans: dict[str, Plan], by_name: dict[str, Device],
                 residence: dict[int, Residence]) -> dict[str, dict[str, int]]:
    """5. Weights each device loads, caches it holds, its largest fragment's activations."""
    weights: dict[str, dict[int, tuple[Tensor, int]]] = {}
    activations: dict[str, tuple[int, str]] = {}        # device -> (bytes, the fragment that needs them)
    for phase, plan in plans.items():
        for f in plan.fragments:
            dev = by_name[f.device]
            for t in f.inputs:
                if t.is_leaf and t.kind == LeafKind.WEIGHT:
                    weights.setdefault(f.device, {})[id(t)] = (t, dev.weight_nbytes(t))
            live = sum(n.nbytes for n in f.nodes if ops.makes_memory(n.op))
            if live > activations.get(f.device, (0, ""))[0]:
                activations[f.device] = (live, f"{phase} fragment {f.index}")
    caches: dict[str, list[Tensor]] = {}
    seen: set[int] = set()
    for plan in plans.values():
        for t in plan.graph.leaves:
            home = residence.get(id(t))
            if home and id(t) not in seen:
                seen.add(id(t))
                caches.setdefault(home.device, []).append(t)
    out = {}
    for name in set(weights) | set(caches) | set(activations):
        use = {"weights": sum(b for _, b in weights.get(name, {}).values()),
               "caches": sum(t.nbytes for t in caches.get(name, ())), "activations": activations.get(name, (0, ""))[0]}
        use["total"] = sum(use.values())
        out[name] = use
        limit = by_name[name].limits.memory_bytes
        if limit is not None and use["total"] > limit:
            raise _out_of_memory(name, limit, use, list(weights.get(name, {}).values()), caches.get(name, []),
                                 activations.get(name, (0, ""))[1])
    return out


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _out_of_memory(device: str, limit: int, use: dict[str, int], weights: list[tuple[Tensor, int]],
                   caches: list[Tensor], biggest_fragment: str) -> CapabilityError:
    """The error names what drives the need (the largest weights, the caches and their rows, the
    fragment with the most activations) and a fix that would make the plans fit."""
    largest = sorted(weights, key=lambda tb: -tb[1])[:3]
    parts = [f"weights {_mib(use['weights'])}" + (f" (largest: {', '.join(f'{t.name} {_mib(b)}' for t, b in largest)})"
                                                   if largest else "")]
    rows = max((t.shape[0] for t in caches), default=0)
    if caches:
        parts.append(f"caches {_mib(use['caches'])} ({len(caches)} tensors of {rows} rows, e.g. {caches[0].name})")
    parts.append(f"activations {_mib(use['activations'])}" + (f" ({biggest_fragment})" if biggest_fragment else ""))
    over = use["total"] - limit
    room = limit - use["weights"] - use["activations"]       # what the caches may take
    if caches and use["caches"] >= over and room > 0:
        fit = int(rows * room / use["caches"])
        ctx = fit - fit % 256 if fit >= 256 else fit          # a multiple of the KV padding where it can be
        fix = (f"lower --ctx: the caches take {use['caches'] / rows / 1024:.1f} KiB per row of context, and at most "
               f"{fit} rows fit beside the weights and activations (--ctx {ctx})")
    elif use["activations"] >= over and use["activations"] > 0:
        fix = (f"lower --batch: the largest fragment's activations ({_mib(use['activations'])}) must shrink by "
               f"{_mib(over)}, and they grow with the prefill chunk")
    else:
        fix = (f"the weights alone need {_mib(use['weights'])} of {device}'s {_mib(limit)}: use a device with at least "
               f"{_mib(use['total'])}, or list another device before {device} in --backends for part of the model "
               f"(a device takes every node it accepts)")
    return CapabilityError(
        "out_of_memory", f"device {device} has {_mib(limit)}, the plans need {_mib(use['total'])}: "
        + "; ".join(parts), devices=(device,), limit=f"memory_bytes={limit}", fix=fix)
